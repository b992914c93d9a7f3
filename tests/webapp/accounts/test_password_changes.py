"""Every way a password is set revokes the account's API tokens (``accounts.signals``), not only the pages that
remembered to: ``manage.py changepassword``, ``manage.py temper_setup`` with a new TEMPER_ADMIN_PASSWORD, a
``set_password`` in the shell. A password changed because it leaked leaves no token made with it working. The
person's own change keeps them when they untick the box (``tests/webapp/accounts/test_views.py``); a login that
rehashes the password with a newer hasher changes nothing and keeps them."""
import getpass
from io import StringIO

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from webapp.api.models import ApiToken
from webapp.api.services import token_authenticate, token_create
from webapp.chat.models import ProjectToken
from webapp.chat.tokens import project_token_authenticate, project_token_create

from tests.webapp.factories import PASSWORD


def tokens_of(team):
    """A REST and a project token of the owner, and a REST token of the teammate: the secrets."""
    _token, rest = token_create(user=team.owner, name="laptop")
    _token, project = project_token_create(user=team.owner, project=team.project, name="notebook")
    _token, teammates = token_create(user=team.teammate, name="ci")
    return rest, project, teammates


def assert_the_owners_tokens_revoked(team, rest, project, teammates):
    assert token_authenticate(f"Bearer {rest}") is None
    assert project_token_authenticate(f"Bearer {project}") is None
    assert not ApiToken.objects.filter(user=team.owner).exists()
    assert not ProjectToken.objects.filter(user=team.owner).exists()
    assert token_authenticate(f"Bearer {teammates}") == team.teammate  # someone else's password did not change


def test_manage_py_changepassword_revokes_the_tokens(team, monkeypatch):
    rest, project, teammates = tokens_of(team)
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": "a-new-long-phrase")  # what the person types, twice
    call_command("changepassword", team.owner.get_username(), stdout=StringIO())
    assert get_user_model().objects.get(pk=team.owner.pk).check_password("a-new-long-phrase")
    assert_the_owners_tokens_revoked(team, rest, project, teammates)


def test_temper_setup_setting_a_new_admin_password_revokes_the_tokens(team, monkeypatch, settings, tmp_path):
    settings.MODELS_ROOT = tmp_path / "models"
    monkeypatch.setenv("TEMPER_ADMIN_USER", team.owner.get_username())
    monkeypatch.setenv("TEMPER_ADMIN_PASSWORD", PASSWORD)
    rest, project, teammates = tokens_of(team)
    call_command("temper_setup", "--no-demo-model", stdout=StringIO())  # the same password: nothing is set
    assert token_authenticate(f"Bearer {rest}") == team.owner
    monkeypatch.setenv("TEMPER_ADMIN_PASSWORD", "a-new-long-phrase")
    call_command("temper_setup", "--no-demo-model", stdout=StringIO())
    assert get_user_model().objects.get(pk=team.owner.pk).check_password("a-new-long-phrase")
    assert_the_owners_tokens_revoked(team, rest, project, teammates)


def test_a_password_set_in_the_shell_revokes_the_tokens(team):
    rest, project, teammates = tokens_of(team)
    user = get_user_model().objects.get(pk=team.owner.pk)
    user.set_password("a-new-long-phrase")
    user.save()
    assert_the_owners_tokens_revoked(team, rest, project, teammates)


def test_other_changes_to_the_account_keep_the_tokens(team):
    rest, _project, _teammates = tokens_of(team)
    user = get_user_model().objects.get(pk=team.owner.pk)
    user.first_name = "Ada"
    user.save()
    assert token_authenticate(f"Bearer {rest}") == team.owner


def test_a_login_that_rehashes_the_password_keeps_the_tokens(team, settings):
    # A newer hasher listed first: the next right password is stored again with it (Django's check_password), the
    # same password, which no leak is the reason for.
    rest, project, _teammates = tokens_of(team)
    old_hash = get_user_model().objects.get(pk=team.owner.pk).password
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher",
                                 "django.contrib.auth.hashers.MD5PasswordHasher"]
    assert Client().login(username=team.owner.get_username(), password=PASSWORD)
    assert old_hash.startswith("md5$")
    assert get_user_model().objects.get(pk=team.owner.pk).password.startswith("pbkdf2_sha256$")
    assert token_authenticate(f"Bearer {rest}") == team.owner
    assert project_token_authenticate(f"Bearer {project}").user == team.owner


def test_an_administrator_turning_password_sign_in_off_revokes_the_tokens(team, client_for):
    # No password is set (Django stores an unusable one), so the signal does not see it: the admin's form does.
    admin = get_user_model().objects.create_superuser("root", password=PASSWORD)
    rest, project, teammates = tokens_of(team)
    response = client_for(admin).post(f"/admin/auth/user/{team.owner.pk}/password/",
                                      {"usable_password": "false", "unset-password": ""})
    assert response["Location"] == f"/admin/auth/user/{team.owner.pk}/change/"
    assert not get_user_model().objects.get(pk=team.owner.pk).has_usable_password()
    assert_the_owners_tokens_revoked(team, rest, project, teammates)
