"""A model whose folder was deleted from disk since (a base model's under the models root, a run's export or exported
checkpoint under the data directory): the chat's model picker, the arena's and /v1/models offered it as any other, and
a conversation, a battle or a completion with it was queued for the serve worker, which failed on the missing folder.
The pickers now list it as gone (the launch form's precedent), /v1/models leaves it out, and each request naming it
is refused in the launch's words (``basemodels.selectors.model_dir_gone``, ``gone_model_words``) before anything is
saved or sent."""
import html
import json
import shutil

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.factories import write_model_dir
from webapp.chat import arena, openai_api, selectors, services
from webapp.chat.models import ApiGeneration, Battle, Conversation, Message
from webapp.chat.tokens import project_token_create
from webapp.core.bidi import isolated
from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus


@pytest.fixture
def data_root(settings, tmp_path):
    root = settings.DATA_ROOT = tmp_path / "data"
    root.mkdir()
    return root


@pytest.fixture
def sent(monkeypatch):
    """Every task sent to a worker, from the chat's services and from /v1 alike."""
    calls = []

    def send_task(name, args, queue, **options):
        calls.append(name)

    monkeypatch.setattr(services.celery_app, "send_task", send_task)
    monkeypatch.setattr(openai_api.celery_app, "send_task", send_task)
    return calls


@pytest.fixture
def models(team, models_root, data_root):
    """Base models "kept" and "lost", and a run "tuned" with its export and its exported checkpoint 5, all on disk."""
    from tests.webapp.factories import make_base_model

    kept = make_base_model(team.project, name="kept", path=str(write_model_dir(models_root / "kept")))
    lost = make_base_model(team.project, name="lost", path=str(write_model_dir(models_root / "lost")))
    output = data_root / "runs" / "tuned"
    run = Run.objects.create(project=team.project, name="tuned", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(output)}, created_by=team.owner)
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=10,
                            path=str(write_model_dir(output / "export")))
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=5,
                            path=str(write_model_dir(output / "export-step-5")))
    return kept, lost, run


def lost_words(lost) -> str:
    return f"base model {isolated('lost')} ({lost.public_id}) is gone from disk: its folder was deleted since"


def test_the_chat_and_arena_pickers_list_a_model_whose_folder_is_gone_as_gone(team, client_for, models):
    kept, lost, run = models
    shutil.rmtree(lost.path)
    shutil.rmtree(run.output_dir / "export-step-5")
    client = client_for(team.teammate)
    for page_name in ("chat:list", "chat:arena"):
        page = client.get(reverse(page_name, args=[team.project.slug])).content.decode()
        assert f'>Base model: {isolated("lost")} (its folder is gone)</option>' in page, page_name
        assert f'>Run: {isolated("tuned")}, checkpoint 5 (its folder is gone)</option>' in page, page_name
        assert f'>Base model: {isolated("kept")}</option>' in page and f'>Run: {isolated("tuned")}</option>' in page
    gone = {choice.ref: choice.refused for choice in selectors.model_choices(project=team.project) if choice.gone}
    assert set(gone) == {lost.public_id, f"{run.public_id}:step-5"}
    assert gone[f"{run.public_id}:step-5"] == (
        f"checkpoint 5 of run {isolated('tuned')} ({run.public_id}), exported as a starting model, is gone from "
        "disk: its folder was deleted since; choose another model")


def test_a_conversation_with_a_gone_model_is_refused_naming_the_model_and_nothing_is_saved(
        team, client_for, models, sent, django_capture_on_commit_callbacks):
    _kept, lost, _run = models
    shutil.rmtree(lost.path)
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(team.teammate).post(reverse("chat:list", args=[team.project.slug]), {
            "model": lost.public_id, "system_prompt": "", "temperature": 0.5, "top_p": 0.9, "top_k": 40,
            "max_tokens": 64})
    assert response.status_code == 400
    page = response.content.decode()
    assert html.escape(lost_words(lost)) in page and "register it again" in page
    assert not Conversation.objects.exists() and sent == []


def test_a_turn_of_a_conversation_whose_model_folder_went_since_is_refused_before_it_is_sent(
        team, client_for, models, sent, django_capture_on_commit_callbacks):
    _kept, _lost, run = models
    client = client_for(team.teammate)
    response = client.post(reverse("chat:list", args=[team.project.slug]), {
        "model": run.public_id, "system_prompt": "", "temperature": 0.5, "top_p": 0.9, "top_k": 40, "max_tokens": 64})
    assert response.status_code == 302
    conversation = Conversation.objects.get()
    shutil.rmtree(run.output_dir / "export")
    gone = f"the model run {isolated('tuned')} ({run.public_id}) exported is gone from disk"
    page = client.get(reverse("chat:detail", args=[team.project.slug, conversation.public_id])).content.decode()
    assert html.escape(f"The{gone[3:]}") in page and 'id="chat-form"' not in page  # said in place of the form
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("chat:send", args=[team.project.slug, conversation.public_id]),
                               {"content": "hi"})
    assert response.status_code == 409 and response.json()["error"].startswith(gone)
    assert not Message.objects.exists() and sent == []


def test_the_arena_draws_no_gone_model_and_compare_mode_refuses_one_saving_nothing(team, client_for, models, sent):
    kept, lost, run = models
    shutil.rmtree(lost.path)
    shutil.rmtree(run.output_dir / "export-step-5")
    choices = selectors.model_choices(project=team.project)
    for _ in range(6):
        battle = arena.battle_create(project=team.project, user=team.teammate, prompt="Name a colour.", choices=choices)
        assert {battle.side_a.model_ref, battle.side_b.model_ref} == {kept.public_id, run.public_id}
    Battle.objects.all().delete()
    Conversation.objects.all().delete()
    sent.clear()
    response = client_for(team.teammate).post(reverse("chat:arena", args=[team.project.slug]), {
        "prompt": "Name a colour.", "model_a": kept.public_id, "model_b": lost.public_id})
    assert response.status_code == 400 and html.escape(lost_words(lost)) in response.content.decode()
    assert not Battle.objects.exists() and not Conversation.objects.exists() and sent == []


@pytest.fixture
def api_headers(team):
    _token, secret = project_token_create(user=team.teammate, project=team.project, name="x")
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def test_v1_leaves_a_gone_model_out_and_refuses_a_request_naming_it_as_an_unknown_model(
        team, models, sent, api_headers):
    kept, lost, run = models
    shutil.rmtree(lost.path)
    shutil.rmtree(run.output_dir / "export")
    listed = [entry["id"] for entry in Client().get("/v1/models", **api_headers).json()["data"]]
    assert listed == [kept.public_id, f"{run.public_id}:step-5"]
    run_words = f"the model run {isolated('tuned')} ({run.public_id}) exported is gone from disk"
    for ref, words in ((lost.public_id, lost_words(lost)), (run.public_id, run_words)):
        retrieved = Client().get(f"/v1/models/{ref}", **api_headers)
        assert retrieved.status_code == 404 and retrieved.json()["error"]["message"].startswith(words)
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"prompt": "hi"}), ("/v1/completions", {"prompt": [1, 2]})):
            response = Client().post(path, json.dumps({"model": ref, **body}), content_type="application/json",
                                     **api_headers)
            assert response.status_code == 404, (path, response.content)
            error = response.json()["error"]
            assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "model_not_found",
                                                                      "model")
            assert error["message"].startswith(words) and "GET /v1/models lists" in error["message"]
    unknown = Client().post("/v1/completions", json.dumps({"model": "bm_nothing", "prompt": "hi"}),
                            content_type="application/json", **api_headers).json()["error"]
    assert (unknown["code"], unknown["param"]) == ("model_not_found", "model")
    assert sent == [] and not ApiGeneration.objects.exists()
