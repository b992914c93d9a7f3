"""Unregistering a base model: who may, what still needing it refuses it, the user's directory that stays,
the serving copy that goes, and what runs and conversations started from it say afterwards."""
import json
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.test import Client

from tests.webapp.factories import form_token, make_base_model, write_model_dir
from tests.webapp.runs.conftest import catalog, sent_tasks, sft_spec  # noqa: F401 (fixtures)
from webapp.api.services import token_create
from webapp.basemodels import services
from webapp.basemodels.models import BaseModel
from webapp.chat import selectors as chat_selectors, services as chat_services
from webapp.core.bidi import isolated
from webapp.review.models import Campaign, CampaignStatus
from webapp.runs import services as run_services
from webapp.runs.models import Run, RunStatus, ServingCopy, ServingCopyStatus
from webapp.runs.serving_copies import base_model_copy_dir


def url(base_model, suffix=""):
    return f"/p/alpha/models/{base_model.public_id}/{suffix}"


@pytest.fixture
def registered(team, settings, tmp_path):
    """A base model the teammate registered from a real directory, with a serving copy written."""
    settings.MODELS_ROOT = tmp_path / "models"
    write_model_dir(settings.MODELS_ROOT / "mine")
    base_model = services.basemodel_register(project=team.project, name="mine", path="mine", user=team.teammate)
    copy = base_model_copy_dir(base_model)
    copy.mkdir(parents=True)
    (copy / "quantization.json").write_text("{}")
    ServingCopy.objects.create(project=team.project, base_model=base_model, status=ServingCopyStatus.READY)
    return base_model


def unregister_from_page(client, base_model, capture):
    page = client.get(url(base_model)).content.decode()
    with capture(execute=True):
        return client.post(url(base_model, "delete/"),
                           {"submission_token": form_token(page, after=url(base_model, "delete/"))})


def test_unregistering_keeps_the_users_directory_and_removes_the_serving_copy(
        team, registered, client_for, sent_tasks, django_capture_on_commit_callbacks):  # noqa: F811
    directory, copy = Path(registered.path), base_model_copy_dir(registered)
    spec = {"task": "sft", "model": registered.public_id, "data": {"train": "dv_gone"}}
    run = Run.objects.create(project=team.project, name="trained", task="sft", spec=spec, resolved_spec=spec,
                             base_model=registered,
                             status=RunStatus.SUCCEEDED, created_by=team.teammate)
    model = chat_selectors.model_choice(project=team.project, ref=registered.public_id)
    conversation = chat_services.conversation_create(project=team.project, user=team.teammate, model=model)
    client = client_for(team.teammate)
    response = unregister_from_page(client, registered, django_capture_on_commit_callbacks)
    assert response.status_code == 302 and response["Location"] == "/p/alpha/models/"
    assert (f"Unregistered the base model {isolated('mine')}; its directory {registered.path} is left as it was."
            in client.get("/p/alpha/models/").content.decode())
    assert not BaseModel.objects.exists() and not ServingCopy.objects.exists()
    assert (directory / "config.json").is_file() and sorted(directory.iterdir())  # the user's files, untouched
    assert not copy.exists() and copy.parent == Path(settings.DATA_ROOT) / "serving-copies"
    run.refresh_from_db()
    assert ("model", registered.public_id) in run.deleted_references()
    assert "is no longer available in this project" in client.get(
        f"/p/alpha/chat/{conversation.public_id}/").content.decode()
    assert client.get(url(registered)).status_code == 404


def test_who_may_unregister_a_base_model(team, registered, client_for):
    """An owner any; a member those they registered; a viewer none; an outsider gets 404."""
    owners = make_base_model(team.project, name="owners", path="/models/owners")
    teammate = client_for(team.teammate)
    assert 'id="delete-confirm"' not in teammate.get(url(owners)).content.decode()
    assert teammate.post(url(owners, "delete/")).status_code == 403
    assert 'id="delete-confirm"' in teammate.get(url(registered)).content.decode()
    assert client_for(team.viewer).post(url(registered, "delete/")).status_code == 403
    assert 'id="delete-confirm"' not in client_for(team.viewer).get(url(registered)).content.decode()
    assert client_for(team.outsider).post(url(registered, "delete/")).status_code == 404
    assert 'id="delete-confirm"' in client_for(team.owner).get(url(owners)).content.decode()
    assert BaseModel.objects.count() == 2


def test_what_still_needs_a_base_model_refuses_its_unregistering(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):  # noqa: F811
    base_model = catalog.base_model
    run = run_services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="busy")
    ServingCopy.objects.create(project=team.project, base_model=base_model, status=ServingCopyStatus.WRITING)
    Campaign.objects.create(project=team.project, name="judge", status=CampaignStatus.GENERATING,
                            generation={"model_a": {"ref": base_model.public_id}, "model_b": {"ref": "run_x"}})
    client = client_for(team.owner)
    response = unregister_from_page(client, base_model, django_capture_on_commit_callbacks)
    assert response["Location"] == url(base_model)
    page = client.get(url(base_model)).content.decode()
    assert (f"Nothing was deleted: run \u2068busy\u2069 ({run.public_id}) is queued from it; cancel it or wait for it to "
            "finish; a serving copy of it is being written; wait until it is ready; review campaign \u2068judge\u2069 is "
            "generating answers with it; wait until it is ready.") in page
    assert BaseModel.objects.filter(pk=base_model.pk).exists()


def test_the_api_unregisters_a_base_model(team, registered, catalog, sent_tasks,  # noqa: F811
                                          django_capture_on_commit_callbacks):
    busy = catalog.base_model
    run = run_services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="busy")

    def call(user, method, model):
        _token, secret = token_create(user=user, name="script")
        with django_capture_on_commit_callbacks(execute=True):
            response = getattr(Client(HTTP_AUTHORIZATION=f"Bearer {secret}"), method)(
                f"/api/v1/projects/alpha/base-models/{model.public_id}/")
        return response.status_code, json.loads(response.content or b"null")

    assert call(team.viewer, "delete", registered)[0] == 403
    assert call(team.teammate, "delete", busy)[0] == 403  # not theirs
    assert call(team.owner, "delete", busy) == (
        400, {"errors": {"delete": [f"run \u2068busy\u2069 ({run.public_id}) is queued from it; cancel it or wait for it to "
                                    "finish"]}})
    assert call(team.teammate, "delete", registered) == (204, None)
    assert call(team.teammate, "get", registered)[0] == 404
    assert Path(registered.path).is_dir() and not base_model_copy_dir(registered).exists()


def test_a_base_model_answering_in_a_chat_is_unregistered_only_once_the_answer_ends_and_the_workers_are_told(
        team, registered, redis_server, settings, django_capture_on_commit_callbacks):
    """Unregistering a base model while a chat answer was being written with it went at once, and the serve
    worker kept its weights (and went on answering) until they were evicted. It now waits for the answer, naming
    the conversation; once it goes, the serve workers are told (``channels.deleted_models``) and drop it."""
    from webapp.chat import channels
    from webapp.runs.channels import redis_client

    settings.REDIS_URL = redis_server.url
    client = redis_client()
    client.flushdb()
    model = chat_selectors.model_choice(project=team.project, ref=registered.public_id)
    conversation = chat_services.conversation_create(project=team.project, user=team.teammate, model=model)
    with django_capture_on_commit_callbacks(execute=False):
        answer = chat_services.message_send(conversation=conversation, model=model, content="Hello")
    with pytest.raises(ValidationError) as refused:
        services.basemodel_unregister(base_model=registered)
    assert refused.value.messages == [
        f"{isolated('alpha-teammate')}'s chat conversation {conversation.public_id} is being answered by its model; "
        "wait for the answer to finish (its author can stop it)"]
    assert channels.deleted_models(client) == set()
    chat_services.message_stop(message=answer)  # its author stops it; the worker ends it
    chat_services.message_finish(message_id=answer.public_id, text="Hi", finish_reason="cancelled")
    with django_capture_on_commit_callbacks(execute=True):
        services.basemodel_unregister(base_model=registered)
    assert not BaseModel.objects.exists()
    assert channels.deleted_models(client) == {registered.public_id}
