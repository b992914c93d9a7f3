"""Shared template pieces: filters, error pages and the templates' own comments."""
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.template.base import Lexer, TokenType
from django.test import Client
from django.utils import timezone

from webapp.runs.models import Run, RunStatus

from webapp.core.templatetags.temper import count_short, time_ago, when


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, "—"), (584, "584"), (1234, "1.23K"), (1_235_814_400, "1.24B"), (70_553_706_496, "70.6B"), (2 * 10**12, "2T")],
)
def test_count_short(value, expected):
    assert count_short(value) == expected


@pytest.mark.parametrize(
    ("age", "expected"),
    [(timedelta(0), "just now"), (timedelta(seconds=59), "just now"), (timedelta(seconds=-5), "just now"),
     (timedelta(seconds=60), "1\xa0minute ago"), (timedelta(hours=2, minutes=3), "2\xa0hours, 3\xa0minutes ago")],
)
def test_time_ago(age, expected):
    now = timezone.now()
    assert time_ago(now - age, now=now) == expected


def test_when_names_the_site_time_zone(settings):
    moment = datetime(2026, 12, 5, 14, 5, 59, tzinfo=UTC)
    assert when(moment) == "2026-12-05 14:05 UTC"
    assert when(None) == ""
    settings.TIME_ZONE = "Europe/Paris"
    assert when(moment) == "2026-12-05 15:05 CET"


def test_404_page_names_no_project(team, client_for):
    response = client_for(team.outsider).get("/p/alpha/")
    assert response.status_code == 404
    content = response.content.decode()
    assert "belongs to a project you are not a member of" in content
    assert "Project alpha" not in content


def test_an_address_no_api_endpoint_answers_gets_json_in_that_api_s_shape(team, client):
    """A mistyped endpoint (runs/<id>/metric/, /v1/chat/completion) answered with the HTML 'Not found'
    page, which a script reading the API's JSON errors cannot read."""
    response = client.get("/api/v1/projects/alpha/run/")
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "no API endpoint at /api/v1/projects/alpha/run/; "
                                         "the endpoints are listed in /api/v1/openapi.json"}
    response = client.post("/v1/chat/completion", {}, content_type="application/json")
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json() == {"error": {
        "message": "no endpoint at /v1/chat/completion; the OpenAI-compatible API answers GET /v1/models, "
                   "POST /v1/chat/completions and POST /v1/completions",
        "type": "invalid_request_error", "param": None, "code": "not_found"}}
    assert "<h1>Not found</h1>" in client.get("/p/nowhere/oops/").content.decode()  # pages keep the page


@pytest.mark.parametrize(("path", "body"), [
    ("/v1", {"error": {"message": "no endpoint at /v1; the OpenAI-compatible API answers GET /v1/models, "
                                  "POST /v1/chat/completions and POST /v1/completions",
                       "type": "invalid_request_error", "param": None, "code": "not_found"}}),
    ("/api", {"detail": "no API endpoint at /api; the endpoints are listed in /api/v1/openapi.json"}),
], ids=["openai", "rest"])
def test_an_api_s_own_address_without_a_slash_gets_json_too(team, client, path, body):
    """QA: GET /v1 (a client's base URL asked as it is) got the HTML 'Not found' page: only addresses
    below /v1/ were taken for the API's."""
    response = client.get(path)
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json() == body
    assert client.get("/v1x").content.decode().count("<h1>Not found</h1>") == 1  # a page that only starts alike


SERVER_ERROR = "the server failed on this request; the error has been logged: try again, and tell an administrator if it goes on"


@pytest.mark.parametrize(("path", "failing", "body"), [
    ("/api/v1/projects/alpha/base-models/", "webapp.basemodels.selectors.basemodel_list", {"detail": SERVER_ERROR}),
    ("/v1/models", "webapp.chat.selectors.model_choices",
     {"error": {"message": SERVER_ERROR, "type": "server_error", "param": None, "code": None}}),
], ids=["rest", "openai"])
def test_a_server_error_under_an_api_is_json_in_that_api_s_shape(team, monkeypatch, path, failing, body):
    """QA: a request that failed on the server ("stop": [] at /v1/chat/completions) was answered with the HTML
    'Something went wrong' page, which a client reading the API's JSON errors cannot read (the openai client
    showed the page's markup as the error's message)."""
    from webapp.api.services import token_create
    from webapp.chat.tokens import project_token_create

    def fail(**_arguments):
        raise RuntimeError("a fault on the server")

    monkeypatch.setattr(failing, fail)
    secret = (token_create(user=team.teammate, name="t") if path.startswith("/api")
              else project_token_create(user=team.teammate, project=team.project, name="t"))[1]
    response = Client(raise_request_exception=False).get(path, HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 500 and response["Content-Type"] == "application/json"
    assert response.json() == body
    assert "a fault on the server" not in response.content.decode()  # what failed is for the log, not the client


def test_403_page_says_which_role_is_needed(team, client_for):
    response = client_for(team.viewer).post("/p/alpha/members/", {"username": "x", "role": "member"})
    assert response.status_code == 403
    assert "this needs the owner role in alpha" in response.content.decode()


def test_a_form_without_its_csrf_token_gets_temper_403_page_saying_what_to_do(team):
    from django.test import Client

    from webapp.datasets.models import Dataset

    client = Client(enforce_csrf_checks=True)
    client.force_login(team.teammate)
    response = client.post("/p/alpha/datasets/new/", {"name": "sneaky", "kind": "sft"})
    assert response.status_code == 403
    content = response.content.decode()
    assert "security token is missing or out of date (CSRF cookie not set)" in content
    assert "reload the page and submit it again" in content
    assert "Back to your projects" in content and "Log out" in content  # Temper's layout, not Django's bare page
    assert not Dataset.objects.filter(name="sneaky").exists()


TEMPLATES = Path(__file__).resolve().parents[3] / "templates"


def test_every_template_comment_closes_on_its_own_line():
    """Django's {# #} comment is one line long: one that went on to the next was page text, and the run page
    showed its note on #run-summary above the run's name."""
    unclosed = [f"{path.relative_to(TEMPLATES)}:{token.lineno}"
                for path in sorted(TEMPLATES.rglob("*.html"))
                for token in Lexer(path.read_text(encoding="utf-8")).tokenize()
                if token.token_type == TokenType.TEXT and "{#" in token.contents]
    assert unclosed == []


def test_the_run_page_shows_no_template_comment(team, client_for):
    run = Run.objects.create(project=team.project, name="first-sft", task="sft", status=RunStatus.QUEUED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": "/nowhere"}, created_by=team.owner)
    page = client_for(team.viewer).get(f"/p/alpha/runs/{run.public_id}/").content.decode()
    assert "first-sft" in page and "{#" not in page and "#}" not in page
