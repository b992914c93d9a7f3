"""Login, logout and password change."""
import os
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.core import signing
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm, PasswordChangeForm
from django.db import connection
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from webapp.accounts.models import AttemptCount, Preferences
from webapp.accounts.selectors import preferences_for
from webapp.accounts.throttle import (DEVICE_COOKIE, MAX_FAILURES, ThrottledAuthenticationForm, ThrottledLogin,
                                     ThrottledPasswordChangeForm)
from webapp.api.models import ApiToken
from webapp.api.services import token_authenticate, token_create
from webapp.chat.models import ProjectToken
from webapp.chat.tokens import project_token_authenticate, project_token_create

from tests.live import ROOT, database_url_for_workers
from tests.webapp.factories import PASSWORD


class TestLogin:
    url = "/accounts/login/"

    def test_it_works(self, team, client):
        assert client.get(self.url).status_code == 200
        response = client.post(self.url, {"username": "alpha-owner", "password": PASSWORD, "next": "/p/alpha/"})
        assert response.status_code == 302
        assert response["Location"] == "/p/alpha/"
        assert client.get("/p/alpha/").status_code == 200

    @pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/", "/\\evil.example/",
                                        "\\\\evil.example", "javascript:alert(1)", "http:evil.example",
                                        " https://evil.example/", "https:/evil.example"])
    def test_it_rejects_a_next_address_of_another_site(self, team, client, target):
        # A link to Temper's login page that sends the person on to another site once signed in (a look-alike
        # asking for the password again) goes to the projects page instead.
        page = client.get(self.url, {"next": target})
        assert page.status_code == 200
        response = client.post(self.url, {"username": "alpha-owner", "password": PASSWORD, "next": target})
        assert (response.status_code, response["Location"]) == (302, settings.LOGIN_REDIRECT_URL)

    def test_it_rejects_wrong_password(self, team, client):
        response = client.post(self.url, {"username": "alpha-owner", "password": "wrong"})
        assert response.status_code == 200
        assert b"correct username and password" in response.content
        assert client.get("/").status_code == 302


class TestLogout:
    url = "/accounts/logout/"

    def test_it_works(self, team, client_for):
        client = client_for(team.owner)
        response = client.post(self.url)
        assert response.status_code == 302
        assert client.get("/").status_code == 302

    @pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/", "/\\evil.example/"])
    def test_it_rejects_a_next_address_of_another_site(self, team, client_for, target):
        response = client_for(team.owner).post(self.url, {"next": target})
        assert (response.status_code, response["Location"]) == (302, reverse("accounts:login"))

    def test_it_rejects_get(self, team, client_for):
        client = client_for(team.owner)
        assert client.get(self.url).status_code == 405
        assert client.get("/").status_code == 200


class TestPasswordChange:
    url = "/accounts/password/"

    def test_it_works(self, team, client_for):
        client = client_for(team.owner)
        assert client.get(self.url).status_code == 200
        response = client.post(
            self.url,
            {"old_password": PASSWORD, "new_password1": "a-new-long-phrase", "new_password2": "a-new-long-phrase"},
        )
        assert response.status_code == 302
        assert response["Location"] == "/accounts/password/done/"
        user = get_user_model().objects.get(username="alpha-owner")
        assert user.check_password("a-new-long-phrase")

    def test_it_ends_the_other_sessions_and_revokes_the_api_tokens(self, team, client_for):
        # A password changed because it leaked: a session or a token the other holder made with it kept working.
        here, elsewhere = client_for(team.owner), client_for(team.owner)
        rest_token, rest_secret = token_create(user=team.owner, name="laptop")
        project_token, project_secret = project_token_create(user=team.owner, project=team.project, name="notebook")
        teammates, _secret = token_create(user=team.teammate, name="ci")
        page = here.get(self.url).content.decode()
        assert "signs you out everywhere else" in page
        assert 'name="revoke_tokens"' in page and "checked" in page.split('name="revoke_tokens"')[1].split(">")[0]
        response = here.post(self.url, {"old_password": PASSWORD, "new_password1": "a-new-long-phrase",
                                        "new_password2": "a-new-long-phrase", "revoke_tokens": "on"}, follow=True)
        assert b"Your other sessions were signed out, and your 2 API tokens revoked." in response.content
        assert here.get("/p/alpha/").status_code == 200
        assert elsewhere.get("/p/alpha/").status_code == 302
        assert token_authenticate(f"Bearer {rest_secret}") is None
        assert project_token_authenticate(f"Bearer {project_secret}") is None
        assert Client().get("/api/v1/projects/alpha/datasets/", HTTP_AUTHORIZATION=f"Bearer {rest_secret}").status_code == 401
        assert ApiToken.objects.filter(user=team.owner).count() == ProjectToken.objects.filter(user=team.owner).count() == 0
        assert ApiToken.objects.filter(pk=teammates.pk).exists()

    def test_it_keeps_the_api_tokens_when_unticked(self, team, client_for):
        _token, secret = token_create(user=team.owner, name="laptop")
        response = client_for(team.owner).post(self.url, {"old_password": PASSWORD, "new_password1": "a-new-long-phrase",
                                                          "new_password2": "a-new-long-phrase"}, follow=True)
        assert b"Your other sessions were signed out." in response.content
        assert token_authenticate(f"Bearer {secret}") == team.owner

    def test_an_administrators_reset_ends_the_sessions_and_revokes_the_api_tokens(self, team, client_for):
        admin = get_user_model().objects.create_superuser("root", password=PASSWORD)
        signed_in = client_for(team.owner)
        _token, rest_secret = token_create(user=team.owner, name="laptop")
        _token, project_secret = project_token_create(user=team.owner, project=team.project, name="notebook")
        response = client_for(admin).post(f"/admin/auth/user/{team.owner.pk}/password/", {
            "password1": "a-new-long-phrase", "password2": "a-new-long-phrase", "usable_password": "true"},
            follow=True)
        assert response.redirect_chain[0][1] == 302
        assert b"Their other sessions were signed out and their API tokens revoked" in response.content
        assert get_user_model().objects.get(pk=team.owner.pk).check_password("a-new-long-phrase")
        assert signed_in.get("/p/alpha/").status_code == 302
        assert token_authenticate(f"Bearer {rest_secret}") is None
        assert project_token_authenticate(f"Bearer {project_secret}") is None

    def test_it_requires_access(self, client, db):
        response = client.get(self.url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")

    def test_it_rejects_wrong_old_password(self, team, client_for):
        response = client_for(team.owner).post(
            self.url, {"old_password": "nope", "new_password1": "a-new-long-phrase", "new_password2": "a-new-long-phrase"}
        )
        assert response.status_code == 200
        assert b"old password was entered incorrectly" in response.content
        assert get_user_model().objects.get(username="alpha-owner").check_password(PASSWORD)


class TestReviewShortcuts:
    """A reviewer's own setting: the reviewing page's single-key shortcuts on or off (WCAG 2.1.4)."""

    url = "/accounts/review-shortcuts/"

    def test_it_works(self, team, client_for):
        client = client_for(team.teammate)
        response = client.post(self.url, {"review_shortcuts": "off", "next": "/p/alpha/review/"})
        assert (response.status_code, response["Location"]) == (302, "/p/alpha/review/")
        assert not preferences_for(user=team.teammate).review_shortcuts
        assert preferences_for(user=team.owner).review_shortcuts, "one person's setting only"
        client.post(self.url, {"review_shortcuts": "on", "next": "/p/alpha/review/"})
        assert preferences_for(user=team.teammate).review_shortcuts
        assert Preferences.objects.filter(user=team.teammate).count() == 1

    def test_it_requires_access(self, client, db):
        response = client.post(self.url, {"review_shortcuts": "off"})
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
        assert not Preferences.objects.exists()

    def test_it_rejects_get(self, team, client_for):
        assert client_for(team.teammate).get(self.url).status_code == 405

    def test_it_rejects_a_value_other_than_on_or_off(self, team, client_for):
        client = client_for(team.teammate)
        response = client.post(self.url, {"review_shortcuts": "sometimes", "next": "/p/alpha/"}, follow=True)
        assert response.redirect_chain == [("/p/alpha/", 302)]
        assert "review_shortcuts must be on or off, not &#x27;sometimes&#x27;" in response.content.decode()
        assert not Preferences.objects.exists()

    def test_it_rejects_a_next_page_on_another_site(self, team, client_for):
        response = client_for(team.teammate).post(self.url, {"review_shortcuts": "off", "next": "https://evil.example/"})
        assert response["Location"] == "/"
        assert not preferences_for(user=team.teammate).review_shortcuts


class TestLoginThrottle:
    """A guesser cannot try a password list against one account: after ``MAX_FAILURES`` wrong passwords
    from one address, that account's logins from that address are refused for a while, right password
    or not; another address, and the same address for another account, are not held up."""

    @pytest.mark.parametrize("url", ["/accounts/login/", "/admin/login/"])
    def test_it_refuses_after_too_many_wrong_passwords(self, team, client, url):
        admin = get_user_model().objects.create_superuser("root", password=PASSWORD)
        get_user_model().objects.create_superuser("root-two", password=PASSWORD)
        for _attempt in range(MAX_FAILURES):
            response = client.post(url, {"username": admin.username, "password": "guess"})
            assert response.status_code == 200 and b"correct username and password" in response.content
        response = client.post(url, {"username": "ROOT", "password": PASSWORD})
        assert response.status_code == 200
        assert b"Too many failed logins" in response.content
        assert client.get("/admin/").status_code == 302
        assert Client(REMOTE_ADDR="10.0.0.9").post(url, {"username": "root", "password": PASSWORD}).status_code == 302
        assert client.post(url, {"username": "root-two", "password": PASSWORD}).status_code == 302

    def test_an_empty_password_forgives_nothing(self, team, client):
        for _attempt in range(MAX_FAILURES - 1):
            client.post("/accounts/login/", {"username": "alpha-owner", "password": "guess"})
        response = client.post("/accounts/login/", {"username": "alpha-owner", "password": ""})
        assert b"This field is required" in response.content
        client.post("/accounts/login/", {"username": "alpha-owner", "password": "guess"})
        response = client.post("/accounts/login/", {"username": "alpha-owner", "password": PASSWORD})
        assert b"Too many failed logins" in response.content

    def test_a_right_password_forgives_the_earlier_failures(self, team, client):
        for _attempt in range(MAX_FAILURES - 1):
            client.post("/accounts/login/", {"username": "alpha-owner", "password": "guess"})
        assert client.post("/accounts/login/", {"username": "alpha-owner", "password": PASSWORD}).status_code == 302
        client.post("/accounts/logout/")
        for _attempt in range(MAX_FAILURES - 1):
            client.post("/accounts/login/", {"username": "alpha-owner", "password": "guess"})
        assert client.post("/accounts/login/", {"username": "alpha-owner", "password": PASSWORD}).status_code == 302

    def test_a_count_past_its_window_is_forgotten(self, team, client):
        for _attempt in range(MAX_FAILURES):
            client.post("/accounts/login/", {"username": "alpha-owner", "password": "guess"})
        AttemptCount.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
        client.post("/accounts/login/", {"username": "alpha-teammate", "password": "guess"})
        # The teammate's two (this address's, every address's): the owner's past counts were deleted.
        assert AttemptCount.objects.count() == 2
        assert client.post("/accounts/login/", {"username": "alpha-owner", "password": PASSWORD}).status_code == 302


class TestLoginThrottleIsNoLockOutLever:
    """Behind a proxy that does not pass the client's address on, every client has the same address: ten wrong
    guesses by anyone locked the account's owner out for 15 minutes. A browser the account signed in with before
    is counted on its own; browsers it never used are held, every address together, to the account's limit."""

    url = "/accounts/login/"

    def signed_in_before(self, username):
        browser = Client()
        assert browser.post(self.url, {"username": username, "password": PASSWORD}).status_code == 302
        assert browser.cookies[DEVICE_COOKIE]["httponly"]
        browser.post("/accounts/logout/")
        return browser

    def test_a_browser_that_signed_in_before_is_not_locked_out_by_strangers(self, team):
        owners = self.signed_in_before("alpha-owner")
        stranger = Client()  # the same address, as behind such a proxy
        for _attempt in range(MAX_FAILURES + 5):
            stranger.post(self.url, {"username": "alpha-owner", "password": "guess"})
        assert b"Too many failed logins" in stranger.post(self.url, {"username": "alpha-owner",
                                                                      "password": PASSWORD}).content
        response = owners.post(self.url, {"username": "alpha-owner", "password": PASSWORD})
        assert response.status_code == 302

    def test_a_browser_that_signed_in_before_is_still_held_to_its_own_guesses(self, team):
        owners = self.signed_in_before("alpha-owner")
        for _attempt in range(MAX_FAILURES):
            owners.post(self.url, {"username": "alpha-owner", "password": "guess"})
        response = owners.post(self.url, {"username": "alpha-owner", "password": PASSWORD})
        assert b"Too many failed logins for this account from this browser" in response.content

    def test_another_accounts_or_a_forged_cookie_counts_as_none(self, team):
        teammates = self.signed_in_before("alpha-teammate")
        forged = Client()
        forged.cookies[DEVICE_COOKIE] = signing.dumps({"user": "alpha-owner", "device": "mine"}, key="not-the-secret",
                                                      salt="webapp.accounts.throttle.device")
        for guesser in (teammates, forged):
            for _attempt in range(MAX_FAILURES):
                guesser.post(self.url, {"username": "alpha-owner", "password": "guess"})
            response = guesser.post(self.url, {"username": "alpha-owner", "password": PASSWORD})
            assert b"Too many failed logins for this account from your address" in response.content
            AttemptCount.objects.all().delete()

    def test_guesses_from_many_addresses_are_held_to_the_accounts_limit(self, team, settings):
        settings.TEMPER_LOGIN_ACCOUNT_MAX_FAILURES = 12
        owners = self.signed_in_before("alpha-owner")
        for address in range(4):
            for _attempt in range(3):
                Client(REMOTE_ADDR=f"10.0.0.{address}").post(self.url, {"username": "alpha-owner", "password": "guess"})
        response = Client(REMOTE_ADDR="10.0.1.1").post(self.url, {"username": "alpha-owner", "password": PASSWORD})
        assert b"from browsers it has not signed in with" in response.content
        assert owners.post(self.url, {"username": "alpha-owner", "password": PASSWORD}).status_code == 302
        assert Client(REMOTE_ADDR="10.0.1.1").post(self.url, {"username": "alpha-teammate",
                                                              "password": PASSWORD}).status_code == 302

    def test_a_right_password_takes_its_own_attempt_off_the_accounts_count(self, team, settings):
        settings.TEMPER_LOGIN_ACCOUNT_MAX_FAILURES = 3
        for address in range(5):
            client = Client(REMOTE_ADDR=f"10.0.0.{address}")
            assert client.post(self.url, {"username": "alpha-owner", "password": PASSWORD}).status_code == 302


class _Burst:
    """Holds every password check of a burst of parallel attempts until each attempt of the burst has
    either reached its check or been refused, so that all of them are decided while no failure has yet
    been counted: the order in which a real burst of parallel requests could run."""

    def __init__(self, size: int):
        self.size, self.decided, self.checks = size, 0, 0
        self.condition = threading.Condition()

    def decide(self) -> None:
        with self.condition:
            self.decided += 1
            self.condition.notify_all()

    def hold_check(self) -> None:
        with self.condition:
            self.checks += 1
            self.decided += 1
            self.condition.notify_all()
            # Not a timing assert: the count of checks below is what the test reads, whenever they end.
            self.condition.wait_for(lambda: self.decided >= self.size, timeout=60)

    def run(self, attempt) -> list:
        errors = []

        def one():
            try:
                form = attempt()
                if not form.is_valid():
                    errors.append(form.errors.as_data())
                    if any(error.code == "throttled" for field in form.errors.as_data().values() for error in field):
                        self.decide()
            finally:
                connection.close()

        threads = [threading.Thread(target=one) for _ in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return errors


@pytest.mark.django_db(transaction=True)
class TestThrottlesCountParallelAttempts:
    """A burst of parallel wrong passwords, on real threads against the database, gets no more
    than ``MAX_FAILURES`` of them checked: each attempt is counted before its password is checked."""

    burst = 3 * MAX_FAILURES

    def test_at_most_max_failures_logins_are_checked(self):
        get_user_model().objects.create_user("root", password=PASSWORD)
        burst = _Burst(self.burst)

        class HeldCheck(AuthenticationForm):
            def clean(self):
                burst.hold_check()
                return super().clean()

        class Form(ThrottledLogin, HeldCheck):
            pass

        request = RequestFactory().post("/accounts/login/")
        errors = burst.run(lambda: Form(request, data={"username": "root", "password": "guess"}))
        assert len(errors) == self.burst
        assert burst.checks == MAX_FAILURES
        assert Form(request, data={"username": "root", "password": PASSWORD}).errors["__all__"][0].startswith(
            "Too many failed logins")

    def test_at_most_max_failures_current_passwords_are_checked(self):
        user = get_user_model().objects.create_user("root", password=PASSWORD)
        burst = _Burst(self.burst)

        class HeldCheck(PasswordChangeForm):
            def clean_old_password(self):
                burst.hold_check()
                return super().clean_old_password()

        class HeldForm(ThrottledPasswordChangeForm, HeldCheck):
            pass

        data = {"old_password": "guess", "new_password1": "a-new-long-phrase", "new_password2": "a-new-long-phrase"}
        errors = burst.run(lambda: HeldForm(user, data=data))
        assert len(errors) == self.burst
        assert burst.checks == MAX_FAILURES


@pytest.mark.django_db(transaction=True)
class TestThrottlesCountAcrossProcesses:
    """Several web processes answer sign-ins (uvicorn ``--workers``, several containers): the wrong passwords
    one of them checked count in every other, so a guesser gets ``MAX_FAILURES`` in all, not that many per
    process. The guesses here are sent in a process of their own, on the same database."""

    GUESSES = """
import django
django.setup()
from django.test import RequestFactory
from webapp.accounts.throttle import MAX_FAILURES, ThrottledAuthenticationForm
request = RequestFactory().post("/accounts/login/")
for _attempt in range(MAX_FAILURES):
    form = ThrottledAuthenticationForm(request, data={"username": "root", "password": "guess"})
    assert form.errors["__all__"][0].startswith("Please enter a correct username and password"), form.errors
"""

    def test_wrong_passwords_checked_by_another_process_count_here(self):
        get_user_model().objects.create_user("root", password=PASSWORD)
        environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "webapp.settings",
                       "DATABASE_URL": database_url_for_workers(), "TEMPER_DATA": str(settings.DATA_ROOT),
                       "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-c", self.GUESSES], env=environment, cwd=ROOT, check=True)
        form = ThrottledAuthenticationForm(RequestFactory().post("/accounts/login/"),
                                           data={"username": "root", "password": PASSWORD})
        assert form.errors["__all__"][0].startswith("Too many failed logins")


class TestPasswordChangeThrottle:
    """A stolen session cannot guess the account's password on the password change page: after
    ``MAX_FAILURES`` wrong current passwords the change is refused for a while, right password or not;
    another account is not held up, and the admin site's password change leads to the same form."""

    url = "/accounts/password/"

    @staticmethod
    def change(client, old_password):
        return client.post(TestPasswordChangeThrottle.url, {"old_password": old_password,
                                                            "new_password1": "a-new-long-phrase",
                                                            "new_password2": "a-new-long-phrase"})

    def test_it_refuses_after_too_many_wrong_current_passwords(self, team, client_for):
        client = client_for(team.owner)
        for _attempt in range(MAX_FAILURES):
            response = self.change(client, "guess")
            assert response.status_code == 200 and b"old password was entered incorrectly" in response.content
        response = self.change(client, PASSWORD)
        assert response.status_code == 200
        assert b"Too many wrong current passwords for this account: wait 15 minutes" in response.content
        assert get_user_model().objects.get(username="alpha-owner").check_password(PASSWORD)
        assert self.change(client_for(team.teammate), PASSWORD).status_code == 302

    def test_a_right_password_forgives_the_earlier_failures(self, team, client_for):
        client = client_for(team.owner)
        for _attempt in range(MAX_FAILURES - 1):
            self.change(client, "guess")
        assert self.change(client, PASSWORD).status_code == 302
        for _attempt in range(MAX_FAILURES - 1):
            self.change(client, "guess")
        assert self.change(client, "a-new-long-phrase").status_code == 302

    def test_the_admin_sites_password_change_leads_to_the_throttled_form(self, team, client_for):
        admin = get_user_model().objects.create_superuser("root", password=PASSWORD)
        response = client_for(admin).get("/admin/password_change/")
        assert response.status_code == 302 and response["Location"] == self.url
