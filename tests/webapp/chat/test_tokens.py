"""Project tokens of the OpenAI-compatible API: who may have one, the apitoken command, what a token
reaches (its project's models only), and that it stops working when its user leaves the project."""
import io

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from tests.webapp.factories import make_base_model
from webapp.chat.tokens import project_token_authenticate, project_token_create
from webapp.projects.models import Membership, Role


def bearer(secret):
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def test_the_command_prints_a_token_that_lists_the_projects_models(team):
    mine = make_base_model(team.project, name="tiny", path="/models/tiny")
    make_base_model(team.outsider_project, name="theirs", path="/models/theirs")
    out = io.StringIO()
    call_command("apitoken", user=team.teammate.username, project=team.project.slug, stdout=out)
    secret = out.getvalue().strip()
    assert secret.startswith("tpk_")
    response = Client().get("/v1/models", **bearer(secret))
    assert response.status_code == 200
    assert [model["id"] for model in response.json()["data"]] == [mine.public_id]


def test_it_requires_a_members_token(team):
    with pytest.raises(PermissionError, match="alpha-viewer is a viewer of alpha; only its members and owners may "
                                              "chat: make them a member on the Members page"):
        project_token_create(user=team.viewer, project=team.project, name="x")
    with pytest.raises(PermissionError, match="is not in project alpha; only its members and owners may chat"):
        project_token_create(user=team.outsider, project=team.project, name="x")
    with pytest.raises(CommandError, match="no user named"):
        call_command("apitoken", user="nobody", project=team.project.slug)
    assert Client().get("/v1/models").status_code == 401
    assert Client().get("/v1/models", **bearer("tpk_guess")).status_code == 401


def test_a_refused_token_is_told_where_project_tokens_are_made(team):
    """The README sends users to the Chat page for these tokens; a REST token (tmp_…) is refused here."""
    from webapp.api.services import token_create

    _token, rest_secret = token_create(user=team.teammate, name="rest")
    response = Client().get("/v1/models", **bearer(rest_secret))
    assert response.status_code == 401
    message = response.json()["error"]["message"]
    assert "Chat page under 'API tokens for this project'" in message and "REST API token (tmp_…), for the REST API" in message
    # A script holding that token can make one with it (the REST API's chat-tokens/), and is told how.
    assert "or with this token: POST /api/v1/projects/<slug>/chat-tokens/ (GET /api/v1/projects/ lists the slugs)" in message


def test_a_token_stops_working_when_its_user_is_no_longer_a_member(team):
    _token, secret = project_token_create(user=team.teammate, project=team.project, name="x")
    assert project_token_authenticate(f"Bearer {secret}") is not None
    Membership.objects.filter(project=team.project, user=team.teammate).update(role=Role.VIEWER)
    assert project_token_authenticate(f"Bearer {secret}") is None
    assert Client().get("/v1/models", **bearer(secret)).status_code == 403  # the role, named (test_openai_api)
    Membership.objects.filter(project=team.project, user=team.teammate).delete()
    response = Client().get("/v1/models", **bearer(secret))
    assert response.status_code == 403 and "is no longer a member of alpha" in response.json()["error"]["message"]


def test_authenticating_reads_one_row_and_writes_the_last_use_once_a_minute(team, django_assert_num_queries):
    """Every ``/v1`` request authenticates: the token, its user, project and the user's role now come in
    one query, and the last use (shown to the minute on the Chat page) is written when it is a minute old."""
    from datetime import timedelta

    from django.utils import timezone

    from webapp.chat.models import ProjectToken

    token, secret = project_token_create(user=team.teammate, project=team.project, name="x")
    with django_assert_num_queries(2):  # the read, and the first use written
        assert project_token_authenticate(f"Bearer {secret}").pk == token.pk
    first_use = ProjectToken.objects.get(pk=token.pk).last_used_at
    assert first_use is not None
    with django_assert_num_queries(1):
        assert project_token_authenticate(f"Bearer {secret}").pk == token.pk
    assert ProjectToken.objects.get(pk=token.pk).last_used_at == first_use
    ProjectToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now() - timedelta(minutes=2))
    with django_assert_num_queries(2):
        project_token_authenticate(f"Bearer {secret}")
    assert ProjectToken.objects.get(pk=token.pk).last_used_at > first_use


def test_it_rejects_a_model_of_another_project_and_a_bad_body(team):
    theirs = make_base_model(team.outsider_project, name="theirs", path="/models/theirs")
    _token, secret = project_token_create(user=team.teammate, project=team.project, name="x")
    client = Client()
    response = client.post("/v1/chat/completions", {"model": theirs.public_id, "messages": [
        {"role": "user", "content": "hi"}]}, content_type="application/json", **bearer(secret))
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    response = client.post("/v1/chat/completions", {"model": theirs.public_id, "messages": [],
                                                    "temperature": 9}, content_type="application/json",
                           **bearer(secret))
    assert response.status_code == 400 and response.json()["error"]["message"].startswith("temperature: ")


def test_a_token_sent_that_is_not_one_is_told_so(team):
    """QA: a client whose token was revoked got 401 "send 'Authorization: Bearer <token>' with a project token",
    as if it had sent none, and so did one that sent its REST API token (tmp_…). Each is now told what it sent."""
    from webapp.api.services import token_create
    from webapp.chat.tokens import project_token_revoke

    token, secret = project_token_create(user=team.teammate, project=team.project, name="laptop")
    project_token_revoke(user=team.teammate, project=team.project, token_id=token.pk)
    refused = Client().get("/v1/models", **bearer(secret))
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert refused.json()["error"]["message"] == (
        "the token sent is not a valid project token (revoked, or mistyped); make a new one on the project's Chat page "
        "under 'API tokens for this project' (or with a REST API token: POST /api/v1/projects/<slug>/chat-tokens/) and "
        "send it as 'Authorization: Bearer <token>'")
    _rest, rest_secret = token_create(user=team.teammate, name="rest")
    told = Client().post("/v1/chat/completions", {}, content_type="application/json", **bearer(rest_secret))
    assert told.status_code == 401 and told.json()["error"]["message"].startswith("this is a REST API token (tmp_…)")
    nothing = Client().get("/v1/models").json()["error"]["message"]
    assert nothing.startswith("send 'Authorization: Bearer <token>' with a project token (tpk_…)")


def test_revoking_a_token_says_so_where_the_tokens_are(team, client_for):
    """QA: Revoke, at the foot of the Chat page, answered with the page's top and no word: nothing seemed to have
    happened. The page now says the token was revoked (or that it was already), in its messages, which take the
    focus (forms.js)."""
    from django.urls import reverse

    token, _secret = project_token_create(user=team.teammate, project=team.project, name="laptop <b>")
    client = client_for(team.teammate)
    revoke = reverse("chat:token_revoke", args=[team.project.slug, token.pk])
    response = client.post(revoke)
    assert response.status_code == 302 and response["Location"] == reverse("chat:list", args=[team.project.slug])
    page = client.get(response["Location"]).content.decode()
    assert "Token ⁨laptop &lt;b&gt;⁩ revoked: programs using it are refused from now on." in page
    client.post(revoke)
    page = client.get(reverse("chat:list", args=[team.project.slug])).content.decode()
    assert "That token is not among yours in this project (revoked already?); nothing was revoked." in page


def test_a_member_creates_and_revokes_a_token_in_the_ui(team, client_for):
    from django.urls import reverse

    from webapp.chat.models import ProjectToken

    client = client_for(team.teammate)
    response = client.post(reverse("chat:token_create", args=[team.project.slug]), {"name": "notebook"})
    secret = response.content.decode().split('<code id="new-token">')[1].split("</code>")[0]
    assert project_token_authenticate(f"Bearer {secret}").name == "notebook"
    token = ProjectToken.objects.get(user=team.teammate)
    page = client.get(reverse("chat:list", args=[team.project.slug])).content.decode()
    assert secret not in page  # shown once
    # Revoking cannot be undone: the button sits behind a summary that says so.
    confirm = page.split('<details class="confirm">')[1].split("</details>")[0]
    assert "cannot be undone" in confirm and "Revoke <bdi>notebook</bdi>" in confirm
    assert f'action="{reverse("chat:token_revoke", args=[team.project.slug, token.pk])}"' in confirm
    assert client_for(team.owner).post(reverse("chat:token_revoke", args=[team.project.slug, token.pk])).status_code == 302
    assert ProjectToken.objects.filter(pk=token.pk).exists()  # only its owner revokes it
    client.post(reverse("chat:token_revoke", args=[team.project.slug, token.pk]))
    assert project_token_authenticate(f"Bearer {secret}") is None
    assert client_for(team.viewer).post(reverse("chat:token_create", args=[team.project.slug])).status_code == 403
    assert client_for(team.outsider).post(reverse("chat:token_create", args=[team.project.slug])).status_code == 404


def test_the_page_a_new_token_is_shown_on_still_starts_conversations(team, client_for):
    """That page is the chat list answered at chat/tokens/, and its New conversation form had no action:
    pressing Start there made one more token named 'token' and no conversation."""
    import re

    from django.urls import reverse

    from tests.webapp.factories import form_token
    from webapp.chat.models import Conversation, ProjectToken

    model = make_base_model(team.project)
    client = client_for(team.teammate)
    page = client.post(reverse("chat:token_create", args=[team.project.slug]), {"name": "notebook"}).content.decode()
    form = page[page.index('id="new-conversation"') - 200:]
    form = form[form.index("<form"):form.index("</form>")]
    action = re.search(r'action="([^"]*)"', form)
    assert action, "a form without an action posts to chat/tokens/, the URL the page was answered at"
    client.post(action.group(1), {"model": model.public_id, "system_prompt": "", "temperature": "0.7", "top_p": "1",
                                  "top_k": "0", "max_tokens": "64", "submission_token": form_token(form)})
    assert Conversation.objects.filter(user=team.teammate).count() == 1
    assert ProjectToken.objects.filter(user=team.teammate).count() == 1


def test_a_messages_text_parts_are_joined_and_other_parts_refused_naming_them(team):
    from webapp.chat.openai_api import ChatBody

    body = ChatBody.model_validate({"model": "bm_x", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]})
    assert body.messages[0].content == "first\nsecond"
    _token, secret = project_token_create(user=team.teammate, project=team.project, name="x")
    response = Client().post("/v1/chat/completions", {"model": "bm_x", "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {}}]}]}, content_type="application/json", **bearer(secret))
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(
        "messages[0].content: part 0 is of type 'input_audio': these models read text only")


def test_a_token_name_with_a_nul_is_refused(team, client_for):
    """The name went to the database as sent (PostgreSQL refuses NUL in text: a 500 there)."""
    from webapp.chat.models import ProjectToken

    response = client_for(team.teammate).post("/p/alpha/chat/tokens/", {"name": "ci\x00"}, follow=True)
    assert "NUL character (\\x00) at position 3" in response.content.decode()
    assert not ProjectToken.objects.exists()
    response = client_for(team.teammate).post("/accounts/tokens/", {"name": "ci\x00"})
    assert response.status_code == 400 and "NUL character (\\x00) at position 3" in response.content.decode()


def test_a_token_name_past_100_characters_is_refused_not_cut(team):
    """Both token pages cut a long name at 100 characters without a word."""
    from django.core.exceptions import ValidationError

    from webapp.api.services import token_create

    for create in (lambda name: project_token_create(user=team.teammate, project=team.project, name=name),
                   lambda name: token_create(user=team.teammate, name=name)):
        with pytest.raises(ValidationError, match="101 characters; at most 100"):
            create("n" * 101)
        token, _secret = create("n" * 100)
        assert token.name == "n" * 100


def test_the_command_refuses_a_bad_name_naming_the_option(team):
    """A name past 100 characters ended the command in a ValidationError traceback."""
    from webapp.chat.models import ProjectToken

    for name, why in (("n" * 101, "--name: 101 characters; at most 100"), ("ci\x00", "--name: .*NUL character")):
        with pytest.raises(CommandError, match=why):
            call_command("apitoken", user=team.teammate.username, project=team.project.slug, name=name)
    assert not ProjectToken.objects.exists()


@pytest.mark.parametrize("leave", ["removed", "made a viewer"])
def test_leaving_or_becoming_a_viewer_revokes_the_users_tokens_for_that_project_only(team, leave):
    """QA: a member removed from a project (or made a viewer) and later added back (or promoted) found their
    old tpk_ tokens working again. Their tokens for the project are now revoked when they go, as GitHub
    revokes a removed collaborator's access; their tokens for other projects stay."""
    from webapp.chat.models import ProjectToken
    from webapp.projects.services import membership_add, membership_remove, membership_set_role

    _token, secret = project_token_create(user=team.teammate, project=team.project, name="notebook")
    membership_add(project=team.outsider_project, user=team.teammate, role=Role.MEMBER)
    elsewhere, _secret = project_token_create(user=team.teammate, project=team.outsider_project, name="elsewhere")
    membership = Membership.objects.get(project=team.project, user=team.teammate)
    if leave == "removed":
        membership_remove(membership=membership)
        membership_add(project=team.project, user=team.teammate, role=Role.MEMBER)
    else:
        membership_set_role(membership=membership, role=Role.VIEWER)
        membership_set_role(membership=membership, role=Role.MEMBER)
    assert project_token_authenticate(f"Bearer {secret}") is None
    assert Client().get("/v1/models", **bearer(secret)).status_code == 401
    assert list(ProjectToken.objects.filter(user=team.teammate)) == [elsewhere]


def test_a_personal_rest_token_stops_reaching_a_project_its_user_was_removed_from(team):
    """A REST token (tmp_…) belongs to its user, not to a project: it is not revoked when they leave one,
    and needs not be, since every REST request checks the user's membership now."""
    from webapp.api.services import token_create
    from webapp.projects.services import membership_remove

    _token, secret = token_create(user=team.teammate, name="laptop")
    url = f"/api/v1/projects/{team.project.slug}/runs/"
    assert Client().get(url, **bearer(secret)).status_code == 200
    membership_remove(membership=Membership.objects.get(project=team.project, user=team.teammate))
    assert Client().get(url, **bearer(secret)).status_code == 404
    assert Client().get(f"/api/v1/projects/{team.outsider_project.slug}/runs/", **bearer(secret)).status_code == 404


def test_an_expired_project_token_is_refused_saying_when_and_where_to_make_another(team, client_for):
    """secqa: a project token worked until revoked; now it ends after the time chosen when it was made (90 days
    unless chosen otherwise), and past it /v1/ answers 401, as for a revoked token, saying why."""
    from datetime import UTC, datetime, timedelta

    from django.urls import reverse
    from django.utils import timezone

    from webapp.chat.models import ProjectToken

    _token, ended = project_token_create(user=team.teammate, project=team.project, name="old",
                                         expires_at=datetime(2026, 1, 2, 3, 4, tzinfo=UTC))
    response = Client().get("/v1/models", **bearer(ended))
    assert response.status_code == 401 and response["WWW-Authenticate"] == 'Bearer realm="temper"'
    assert response.json()["error"] == {
        "message": "this token expired at 2026-01-02 03:04 UTC; make a new one on the Chat page of alpha, under "
                   "'API tokens for this project', or with a REST API token: POST /api/v1/projects/alpha/chat-tokens/",
        "type": "authentication_error", "param": None, "code": "invalid_api_key"}
    assert project_token_authenticate(f"Bearer {ended}") is None

    client = client_for(team.teammate)
    page = client.get(reverse("chat:list", args=[team.project.slug])).content.decode()
    assert '<select name="expires" aria-label="Expires after">' in page
    client.post(reverse("chat:token_create", args=[team.project.slug]), {"name": "month", "expires": "30"})
    month = ProjectToken.objects.get(name="month")
    assert abs(month.expires_at - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    client.post(reverse("chat:token_create", args=[team.project.slug]), {"name": "bad", "expires": "forever"})
    assert not ProjectToken.objects.filter(name="bad").exists()



def test_a_new_token_comes_with_commands_that_use_it(team, client_for):
    """The page said which endpoints there are and how to send the token; the address, a model's id and a
    request's body were for the README to tell. A new token is shown with two commands to copy: one lists
    the project's models, the other asks the newest run's model a question."""
    import html
    import json
    import shlex

    from django.urls import reverse

    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    make_base_model(team.project, name="tiny", path="/models/tiny")
    run = Run.objects.create(project=team.project, name="tuned", task="sft", status=RunStatus.SUCCEEDED,
                             spec={}, resolved_spec={})
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=f"/runs/{run.public_id}/export")
    page = client_for(team.teammate).post(reverse("chat:token_create", args=[team.project.slug]),
                                          {"name": "notebook"}).content.decode()
    secret = page.split('<code id="new-token">')[1].split("</code>")[0]
    example = html.unescape(page.split('<pre id="token-example">')[1].split("</pre>")[0])
    listing, question = (shlex.split(command) for command in example.replace("\\\n", " ").strip().split("\n"))
    assert listing == ["curl", "http://testserver/v1/models", "-H", f"Authorization: Bearer {secret}"]
    assert question[:2] == ["curl", "http://testserver/v1/chat/completions"]
    assert f"Authorization: Bearer {secret}" in question and "Content-Type: application/json" in question
    body = json.loads(question[question.index("-d") + 1])
    assert body == {"model": run.public_id, "messages": [{"role": "user", "content": "Hello"}]}
    models = Client().get("/v1/models", **bearer(secret)).json()["data"]
    assert run.public_id in [model["id"] for model in models]
    assert 'id="token-example"' not in client_for(team.teammate).get(
        reverse("chat:list", args=[team.project.slug])).content.decode()


def test_the_command_says_which_token_the_rest_api_takes_and_which_projects_there_are(team):
    """Audit: a script writer who looked for a token with `manage.py apitoken --help` (the command's obvious name) got
    a project token for /v1/, which the REST API refuses; its help did not name resttoken. A slug mistyped was told
    only that no project has it."""
    from django.core.management import load_command_class

    command = load_command_class("webapp.chat", "apitoken")
    assert "the REST API (/api/v1/) takes a personal token instead: python manage.py resttoken" in command.help
    with pytest.raises(CommandError) as refused:
        call_command("apitoken", user=team.teammate.username, project="alhpa")
    assert str(refused.value) == ("--project: no project with slug 'alhpa'; alpha-teammate's projects: alpha "
                                  "(Project alpha)")
    with pytest.raises(CommandError) as refused:
        call_command("apitoken", user=team.outsider.username, project="alhpa")
    assert str(refused.value) == ("--project: no project with slug 'alhpa'; alpha-outsider's projects: "
                                  "alpha-elsewhere (Elsewhere)")
