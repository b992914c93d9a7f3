"""``manage.py resttoken``: a REST API token for a machine set up without a browser (QA: only the API tokens
page made one, while /v1's project tokens had ``manage.py apitoken``)."""
import io

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from tests.webapp.factories import make_team
from webapp.api.models import ApiToken


@pytest.fixture
def team(db):
    return make_team()


def test_it_prints_a_token_the_rest_api_takes_as_that_user(team):
    out = io.StringIO()
    call_command("resttoken", user=team.viewer.username, name="ci runner", stdout=out)
    secret = out.getvalue().strip()
    assert secret.startswith("tmp_")
    assert ApiToken.objects.get(user=team.viewer).name == "ci runner"  # listed on the API tokens page by it
    reads = Client().get(f"/api/v1/projects/{team.project.slug}/runs/", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert reads.status_code == 200
    # A viewer's token writes nothing, as the viewer's pages do not.
    writes = Client().post(f"/api/v1/projects/{team.project.slug}/runs/", data="{}", content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert writes.status_code == 403


@pytest.mark.parametrize(("options", "problem"), [
    ({"user": "nobody"}, "--user: no user named 'nobody'"),
    ({"name": "   "}, "--name: name the token after where it is used"),
    ({"name": "x" * 101}, "--name: "),
])
def test_a_refusal_names_the_option_and_makes_no_token(team, options, problem):
    with pytest.raises(CommandError) as refused:
        call_command("resttoken", **{"user": team.owner.username, **options})
    assert str(refused.value).startswith(problem)
    assert not ApiToken.objects.exists()


def test_a_deactivated_user_gets_no_token(team):
    team.teammate.is_active = False
    team.teammate.save()
    with pytest.raises(CommandError, match="is deactivated; its tokens would be refused"):
        call_command("resttoken", user=team.teammate.username)
    assert not ApiToken.objects.exists()
