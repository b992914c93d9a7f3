"""The workers judge the model directory they are handed by the models root's project rule before they read it, with
the asking project's slug (``inspection.check_registered_model_dir``): the web refuses a model whose directory lies
now in another project's folder, but a message queued before, a run resumed from its stored spec or a link swapped
between the web's check and the load would still have read that project's weights."""
import shutil

import pytest

from tests.webapp.factories import make_base_model, make_ready_version, make_team, write_model_dir
from webapp.basemodels.services import basemodel_register
from webapp.chat import channels
from webapp.runs import services
from webapp.runs.models import Run, RunStatus, ServingCopy, ServingCopyStatus
from worker.tasks import serve, train


@pytest.fixture
def models_root(settings, tmp_path):
    root = settings.MODELS_ROOT = tmp_path / "models"
    root.mkdir()
    return root.resolve()


def secret(models_root):
    """The other team's private model (written once its project exists: a project is not made over a folder)."""
    model_dir = models_root / "projects" / "alpha-elsewhere" / "secret-ft"
    if not model_dir.exists():
        write_model_dir(model_dir)
    return model_dir


def missing_words(models_root, path) -> str:
    """Registration's refusal of ``path`` for project alpha (``inspection._missing``)."""
    return (f"{path} does not exist; copy the model under {models_root / 'shared'} (every project's) or "
            f"{models_root / 'projects' / 'alpha'} (this project's alone) first")


def swap_for_a_link_into_the_other_folder(model_dir, models_root) -> None:
    shutil.rmtree(model_dir)
    model_dir.symlink_to(secret(models_root))


def test_the_serve_worker_refuses_a_path_into_another_projects_folder_before_loading_it(redis_db, models_root):
    request = {"id": "borrowed", "model_key": "bm_borrowed@x", "model_path": str(secret(models_root)),
               "project_slug": "alpha", "messages": [{"role": "user", "content": "Hello"}]}
    result = serve.generate(request)
    assert result["error"].startswith(missing_words(models_root, secret(models_root)))
    assert "register it again" in result["error"]
    events = channels.stored_events(redis_db, "borrowed")
    assert [event["type"] for event in events] == ["error"]  # never said it was loading it
    assert "bm_borrowed@x" not in serve._servers
    assert serve.prepare("bm_borrowed@x", str(secret(models_root)), "alpha")["error"].startswith(
        missing_words(models_root, secret(models_root)))
    assert "bm_borrowed@x" not in serve._servers
    # The other team's own request for it is not refused by the rule.
    assert "does not exist" not in serve.generate({**request, "id": "own", "project_slug": "alpha-elsewhere"}).get(
        "error", "")


def test_a_chat_answer_queued_before_the_project_was_named_is_judged_by_its_conversations_project(redis_db, models_root,
                                                                                                db):
    """A chat answer queued before ``project_slug`` was sent is served with its conversation's project
    (``serve._with_asking_project``): the folder rule judges it as it would the web's request now, so the other team's
    model is refused for alpha's conversation, not read for want of a slug to judge it by."""
    from webapp.chat.models import Conversation, Message, MessageStatus, Role

    team = make_team()
    conversation = Conversation.objects.create(project=team.project, user=team.teammate, model_ref="bm_borrowed",
                                               model_label="Base model: borrowed")
    answer = Message.objects.create(conversation=conversation, role=Role.ASSISTANT, status=MessageStatus.STREAMING)
    result = serve.generate({"id": answer.public_id, "message": answer.public_id, "model_key": "bm_borrowed@y",
                             "model_path": str(secret(models_root)), "messages": [{"role": "user", "content": "Hi"}]})
    assert result["error"].startswith(missing_words(models_root, secret(models_root)))
    answer.refresh_from_db()
    assert answer.status == MessageStatus.FAILED and answer.error == result["error"]
    assert "bm_borrowed@y" not in serve._servers


def test_a_request_without_the_asking_project_is_refused(redis_db, models_root):
    result = serve.generate({"id": "unnamed", "model_key": "k", "model_path": str(secret(models_root)),
                             "messages": [{"role": "user", "content": "Hello"}]})
    assert "project_slug" in result["error"] and "k" not in serve._servers


def test_a_serving_copy_of_a_model_swapped_into_another_projects_folder_is_refused(db, models_root):
    team = make_team()
    model_dir = write_model_dir(models_root / "shared" / "base")
    base_model = basemodel_register(project=team.project, name="base", path="shared/base", user=team.owner)
    copy = ServingCopy.objects.create(project=team.project, base_model=base_model)
    swap_for_a_link_into_the_other_folder(model_dir, models_root)
    result = serve.make_serving_copy(copy.pk)
    copy.refresh_from_db()
    assert copy.status == ServingCopyStatus.FAILED
    assert copy.error_message.startswith(missing_words(models_root, model_dir)) and result["error"]


def test_a_run_whose_base_model_was_swapped_into_another_projects_folder_fails_before_training(
        transactional_db, settings, redis_url, models_root, monkeypatch):
    settings.REDIS_URL = redis_url  # the run's reporter publishes to a real Redis
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team()
    model_dir = write_model_dir(models_root / "shared" / "base")
    base = make_base_model(team.project, path=str(model_dir))
    version = make_ready_version(team.project, name="chats", rows=[{"prompt": "a b", "completion": " c"}] * 2)
    run = services.run_create(project=team.project, spec={
        "task": "sft", "model": base.public_id, "data": {"train": version.public_id, "max_seq_len": 32},
        "train": {"max_steps": 1, "batch_size": 2}}, user=team.owner)
    assert run.status == RunStatus.QUEUED
    swap_for_a_link_into_the_other_folder(model_dir, models_root)

    train.train_run(run.pk, run.attempt)

    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.FAILED
    # Registration's words, the path named as the project knows it (reporting.in_project_terms).
    assert run.error_message.startswith("ModelDirError: " + missing_words(models_root, model_dir).replace(
        str(model_dir), "base model tiny")), run.error_message


def test_a_run_whose_base_models_folder_was_deleted_once_queued_fails_in_the_web_apps_terms(
        transactional_db, settings, redis_url, models_root, monkeypatch):
    """The web refuses a model whose folder is gone before it queues a run (``services.gone_model``); one deleted
    while the run waited in the queue failed in the train worker with the command line's advice ("give a Hugging
    Face-format model directory ... or the preset demo-tiny"), the model named by its path in quotes. A web launch's
    job (``Entry.LAUNCH``) names the base model and what to do on the run's page."""
    settings.REDIS_URL = redis_url
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team()
    model_dir = write_model_dir(models_root / "shared" / "mine")
    base = make_base_model(team.project, name="mine", path=str(model_dir))
    version = make_ready_version(team.project, name="chats", rows=[{"prompt": "a b", "completion": " c"}] * 2)
    run = services.run_create(project=team.project, spec={
        "task": "sft", "model": base.public_id, "data": {"train": version.public_id, "max_seq_len": 32},
        "train": {"max_steps": 1, "batch_size": 2}}, user=team.owner)
    shutil.rmtree(model_dir)

    train.train_run(run.pk, run.attempt)

    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.FAILED
    assert run.error_message == (
        "JobError: model: base model mine: no such directory; its folder was deleted or moved since the run was "
        "queued. Put the model's files back in it, or duplicate the run on its page and choose another starting "
        "model"), run.error_message
