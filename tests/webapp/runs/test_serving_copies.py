"""Serving copies made on demand, of an exported checkpoint (on the run page) and of a base model (on its
page): who may ask, one writer at a time, the states the pages show, the reason of a failure, and the copy
the chat and the API then serve. The engine's side is tests/jaxengine/test_quantize.py; a real serve
worker writing one is tests/integration/test_serve.py."""
from __future__ import annotations

import html
import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from tests.webapp.factories import make_base_model, make_ready_version
from webapp.chat import selectors as chat_selectors
from webapp.chat.tokens import project_token_create
from webapp.core.bidi import isolated
from webapp.runs import serving_copies, services
from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus, ServingCopy, ServingCopyStatus
from webapp.runs.serving_copies import MAKE_COPY_QUEUE, MAKE_COPY_TASK

from .test_services import sft_spec


@pytest.fixture(autouse=True)
def data_root(settings, tmp_path):
    settings.DATA_ROOT = tmp_path
    return tmp_path


@pytest.fixture
def catalog(catalog, data_root):
    """The runs tests' catalog, its base model's directory there: a copy of a model whose files are gone is
    refused."""
    directory = data_root / "models" / "tiny"
    directory.mkdir(parents=True)
    catalog.base_model.path = str(directory)
    catalog.base_model.save(update_fields=["path"])
    return catalog


def write_copy(directory, *, scheme="int8", **figures):
    """What the engine leaves once a copy is whole (jaxengine.quantize.export_quantized)."""
    directory.mkdir(parents=True, exist_ok=True)
    description = {"format": "temper-quantized", "version": 1, "scheme": scheme, "bits": 8 if scheme == "int8" else 4,
                   "group_size": None if scheme == "int8" else 64, "modules": ["model.layers.0.self_attn.q_proj"],
                   "model_bytes": 600 * 2**20, "bfloat16_bytes": 1000 * 2**20, "ratio_to_bfloat16": 0.6, **figures}
    (directory / "quantization.json").write_text(json.dumps(description))


@pytest.fixture
def checkpoint_run(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    """A succeeded run with checkpoint 3 exported and checkpoint 6 not."""
    with django_capture_on_commit_callbacks(execute=True):
        run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="first")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    run.refresh_from_db()
    for step in (3, 6):
        (run.output_dir / "checkpoints" / str(step)).mkdir(parents=True)
    export = run.output_dir / "export-step-3"
    export.mkdir()
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=3, path=str(export))
    return run


def copy_url(run):
    return f"/p/alpha/runs/{run.public_id}/checkpoints/serving-copy/"


def base_url(model, suffix=""):
    return f"/p/alpha/models/{model.public_id}/{suffix}"


def copy_tasks(sent_tasks):
    return [call for call in sent_tasks.calls if call[0] == MAKE_COPY_TASK]


# A checkpoint's copy ---------------------------------------------------------------------------------


def test_a_member_makes_a_checkpoints_copy_once_while_it_is_written(team, client_for, checkpoint_run, sent_tasks,
                                                                      django_capture_on_commit_callbacks):
    client = client_for(team.teammate)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(copy_url(checkpoint_run), {"step": "3", "scheme": "int4"})
    assert response.status_code == 302 and response["Location"] == f"/p/alpha/runs/{checkpoint_run.public_id}/"
    copy = ServingCopy.objects.get(run=checkpoint_run, step=3)
    assert (copy.scheme, copy.status, copy.requested_by) == ("int4", ServingCopyStatus.WRITING, team.teammate)
    assert copy_tasks(sent_tasks) == [(MAKE_COPY_TASK, [copy.pk], MAKE_COPY_QUEUE)] and MAKE_COPY_QUEUE == "serve"
    # A second click while it is written (a new sending, not the same one sent again) queues nothing more.
    with django_capture_on_commit_callbacks(execute=True):
        client.post(copy_url(checkpoint_run), {"step": "3", "scheme": "int8"})
    assert len(copy_tasks(sent_tasks)) == 1 and ServingCopy.objects.get(pk=copy.pk).scheme == "int4"
    page = client.get(f"/p/alpha/runs/{checkpoint_run.public_id}/", follow=True).content.decode()
    assert "already being written" in page
    partial = client.get(f"/p/alpha/runs/{checkpoint_run.public_id}/checkpoints/").content.decode()
    assert 'data-copy-state="writing"' in partial and "int4 serving copy being written" in partial
    assert "Make it again" not in partial and "Make serving copy" not in partial  # no second writer offered


def test_it_requires_the_member_role_and_the_project(team, client_for, checkpoint_run, sent_tasks):
    assert client_for(team.viewer).post(copy_url(checkpoint_run), {"step": "3"}).status_code == 403
    assert client_for(team.outsider).post(copy_url(checkpoint_run), {"step": "3"}).status_code == 404
    assert client_for(team.teammate).get(copy_url(checkpoint_run)).status_code == 405
    assert not ServingCopy.objects.exists() and not copy_tasks(sent_tasks)
    partial = client_for(team.viewer).get(f"/p/alpha/runs/{checkpoint_run.public_id}/checkpoints/").content.decode()
    assert "Make serving copy" not in partial  # viewers see the state, without the form


@pytest.mark.parametrize("fields, message", [
    ({"step": "6"}, "checkpoint 6 of run_"),  # not exported
    ({"step": "x"}, "choose a checkpoint step"),
    ({"step": "3", "scheme": "int3"}, "int3&#x27; is not one of int8, int4"),
])
def test_it_rejects_a_checkpoint_that_cannot_be_copied(team, client_for, checkpoint_run, sent_tasks, fields, message):
    page = client_for(team.teammate).post(copy_url(checkpoint_run), fields, follow=True).content.decode()
    assert message in page
    assert not ServingCopy.objects.exists() and not copy_tasks(sent_tasks)


def test_the_checkpoint_shows_its_copys_figures_or_the_reason_it_failed(team, client_for, checkpoint_run,
                                                                        django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        copy, queued = serving_copies.serving_copy_request(project=team.project, user=team.teammate,
                                                           run=checkpoint_run, step=3)
    assert queued
    serving_copies.serving_copy_finish(copy_pk=copy.pk, error=RuntimeError("<b>out of memory</b>"))
    partial = client_for(team.teammate).get(f"/p/alpha/runs/{checkpoint_run.public_id}/checkpoints/").content.decode()
    assert 'data-copy-state="failed"' in partial and "RuntimeError: &lt;b&gt;out of memory&lt;/b&gt;" in partial
    assert "serve the checkpoint unquantized" in partial and "Make it again" in partial
    # Asked again after a failure, it is queued again; the worker's copy then shows its figures.
    with django_capture_on_commit_callbacks(execute=True):
        _copy, queued = serving_copies.serving_copy_request(project=team.project, user=team.teammate,
                                                            run=checkpoint_run, step=3)
    assert queued and ServingCopy.objects.get(pk=copy.pk).error_message == ""
    write_copy(checkpoint_run.output_dir / "export-step-3" / "quantized", perplexity_reference=4.0,
               perplexity_quantized=4.04, perplexity_increase=0.01, eval_sequences=20, greedy_agreement=0.97,
               eval_prompts=20)
    serving_copies.serving_copy_finish(copy_pk=copy.pk)
    partial = client_for(team.teammate).get(f"/p/alpha/runs/{checkpoint_run.public_id}/checkpoints/").content.decode()
    assert 'data-copy-state="ready"' in partial and "60% of the bfloat16 model&#x27;s 1000.0 MiB" in partial
    assert "4.04 against 4 unquantized (+1.0%), on 20 evaluation rows" in partial and "97% of greedy tokens" in partial


def test_a_copy_whose_message_was_lost_can_be_asked_for_again(team, checkpoint_run, sent_tasks, monkeypatch,
                                                               django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        copy, _ = serving_copies.serving_copy_request(project=team.project, user=None, run=checkpoint_run, step=3)
    held = {(copy.pk,)}
    monkeypatch.setattr(services, "held_task_messages", lambda **kwargs: held)
    ServingCopy.objects.filter(pk=copy.pk).update(updated_at=copy.updated_at - timedelta(minutes=10))
    with django_capture_on_commit_callbacks(execute=True):
        _, queued = serving_copies.serving_copy_request(project=team.project, user=None, run=checkpoint_run, step=3)
    assert not queued  # its message is still in Redis: a worker has it, however long it takes
    held.clear()  # the worker was killed, or Redis lost it
    with django_capture_on_commit_callbacks(execute=True):
        _, queued = serving_copies.serving_copy_request(project=team.project, user=None, run=checkpoint_run, step=3)
    assert queued and len(copy_tasks(sent_tasks)) == 2


STALE = "the worker never finished writing this copy"


def test_a_copy_written_too_long_with_no_task_behind_it_fails_and_is_made_again(
        team, client_for, checkpoint_run, sent_tasks, monkeypatch, settings, django_capture_on_commit_callbacks):
    """A copy whose message was lost said "being written" for ever, without a button, until someone asked again."""
    settings.TEMPER_SERVING_COPY_STALE_SECONDS = 1800
    with django_capture_on_commit_callbacks(execute=True):
        copy, _ = serving_copies.serving_copy_request(project=team.project, user=None, run=checkpoint_run, step=3)
    checkpoints = f"/p/alpha/runs/{checkpoint_run.public_id}/checkpoints/"
    client = client_for(team.teammate)

    def redis_not_asked(**kwargs):
        raise AssertionError("Redis asked about a copy written for less than TEMPER_SERVING_COPY_STALE_SECONDS")

    monkeypatch.setattr(services, "held_task_messages", redis_not_asked)
    ServingCopy.objects.filter(pk=copy.pk).update(updated_at=copy.updated_at - timedelta(seconds=1790))
    assert 'data-copy-state="writing"' in client.get(checkpoints).content.decode()
    ServingCopy.objects.filter(pk=copy.pk).update(updated_at=copy.updated_at - timedelta(minutes=40))
    held = {(copy.pk,)}
    monkeypatch.setattr(services, "held_task_messages", lambda **kwargs: held)
    assert 'data-copy-state="writing"' in client.get(checkpoints).content.decode()  # a worker has it, however long
    monkeypatch.setattr(services, "held_task_messages", lambda **kwargs: None)  # Redis down: nothing is decided
    assert 'data-copy-state="writing"' in client.get(checkpoints).content.decode()
    held.clear()  # the message was lost, or its worker killed
    monkeypatch.setattr(services, "held_task_messages", lambda **kwargs: held)
    partial = client.get(checkpoints).content.decode()
    assert 'data-copy-state="failed"' in partial and "Make it again" in partial
    assert (f"{STALE}: 40 minutes after it was asked for, no serve worker holds its task (its message was lost, or its "
            "worker stopped); make it again") in partial
    assert ServingCopy.objects.get(pk=copy.pk).status == ServingCopyStatus.FAILED
    with django_capture_on_commit_callbacks(execute=True):
        client.post(copy_url(checkpoint_run), {"step": "3", "scheme": "int8"})
    assert ServingCopy.objects.get(pk=copy.pk).status == ServingCopyStatus.WRITING and len(copy_tasks(sent_tasks)) == 2
    assert 'data-copy-state="writing"' in client.get(checkpoints).content.decode()


def test_a_base_models_stale_copy_fails_too_unless_a_worker_is_writing_it(team, client_for, catalog, sent_tasks,
                                                                          monkeypatch, django_capture_on_commit_callbacks):
    from django.utils import timezone

    from webapp.workers.models import Worker

    with django_capture_on_commit_callbacks(execute=True):
        copy, _ = serving_copies.serving_copy_request(project=team.project, user=None, base_model=catalog.base_model)
    ServingCopy.objects.filter(pk=copy.pk).update(updated_at=copy.updated_at - timedelta(hours=2))
    monkeypatch.setattr(services, "held_task_messages", lambda **kwargs: set())
    now = timezone.now()
    worker = Worker.objects.create(name="serve@gpu-1", host="gpu-1", pid=1, queues=["serve"], started_at=now,
                                   last_seen=now, current_jobs=[f"{MAKE_COPY_TASK} [{copy.pk}]"])
    assert serving_copies.base_model_serving_copy(base_model=catalog.base_model)["state"] == "writing"
    Worker.objects.filter(pk=worker.pk).update(last_seen=now - timedelta(minutes=5))  # that worker is gone
    state = serving_copies.base_model_serving_copy(base_model=catalog.base_model)
    assert state["state"] == "failed" and state["message"].startswith(f"{STALE}: 120 minutes after")
    page = client_for(team.teammate).get(base_url(catalog.base_model)).content.decode()
    assert STALE in page and "Make it again" in page


def test_a_runs_automatic_copy_never_written_fails_unless_a_worker_is_writing_it(
        team, client_for, checkpoint_run, sent_tasks, monkeypatch, settings, django_capture_on_commit_callbacks):
    """The copy written when a run succeeds (quantize_run: no row) said "being written" for ever once its
    message was lost or its worker killed, and the card offered nothing. Its message is acknowledged when
    done, so Redis holds it while it waits and while it runs; a heartbeat listing it counts too."""
    from django.utils import timezone

    from webapp.workers.models import Worker

    settings.TEMPER_SERVE_QUANTIZE = "int8"
    run = checkpoint_run
    (run.output_dir / "export").mkdir()
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(minutes=45))
    run.refresh_from_db()
    held = {(str(run.output_dir),)}  # waiting in the serve queue behind other work
    monkeypatch.setattr(services, "held_task_messages", lambda **kwargs: held)
    page_url = f"/p/alpha/runs/{run.public_id}/serving-copy/"
    client = client_for(team.teammate)
    assert 'data-state="writing"' in client.get(page_url).content.decode()
    held.clear()
    now = timezone.now()
    worker = Worker.objects.create(name="serve@gpu-1", host="gpu-1", pid=1, queues=["serve"], started_at=now,
                                   last_seen=now, current_jobs=[f"{MAKE_COPY_TASK} [7]",
                                                                f"{serving_copies.AUTOMATIC_COPY_TASK} "
                                                                f"[{str(run.output_dir)!r}]"])
    assert 'data-state="writing"' in client.get(page_url).content.decode()  # being written, however long
    Worker.objects.filter(pk=worker.pk).update(current_jobs=[])
    settings.TEMPER_HEARTBEAT_SECONDS = 0  # Redis alone tells: the message is neither waiting nor delivered
    partial = client.get(page_url).content.decode()
    assert 'data-state="failed"' in partial and f"{STALE}: 45 minutes after it was asked for" in partial
    assert "Make it again" in partial
    copy = ServingCopy.objects.get(run=run, step__isnull=True)
    assert (copy.status, copy.scheme) == (ServingCopyStatus.FAILED, "int8")
    with django_capture_on_commit_callbacks(execute=True):
        client.post(page_url, {"scheme": "int8"})
    assert ServingCopy.objects.get(pk=copy.pk).status == ServingCopyStatus.WRITING
    assert copy_tasks(sent_tasks) == [(MAKE_COPY_TASK, [copy.pk], MAKE_COPY_QUEUE)]


def test_a_copy_ended_or_gone_is_not_written_again_by_a_late_message(team, checkpoint_run,
                                                                      django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        copy, _ = serving_copies.serving_copy_request(project=team.project, user=None, run=checkpoint_run, step=3)
    assert serving_copies.serving_copy_pending(copy_pk=copy.pk) == copy
    serving_copies.serving_copy_finish(copy_pk=copy.pk)
    assert serving_copies.serving_copy_pending(copy_pk=copy.pk) is None
    assert serving_copies.serving_copy_pending(copy_pk=copy.pk + 100) is None


def test_a_reward_runs_checkpoint_gets_no_copy(team, checkpoint_run):
    Run.objects.filter(pk=checkpoint_run.pk).update(task="reward")
    checkpoint_run.refresh_from_db()
    with pytest.raises(ValidationError, match="reward model"):
        serving_copies.serving_copy_request(project=team.project, user=None, run=checkpoint_run, step=3)


# A run's final model, made again ---------------------------------------------------------------------


def final_url(run):
    return f"/p/alpha/runs/{run.public_id}/serving-copy/"


@pytest.fixture
def final_run(checkpoint_run, settings):
    """The succeeded run with its merged export, whose automatic int8 copy failed."""
    settings.TEMPER_SERVE_QUANTIZE = "int8"
    (checkpoint_run.output_dir / "export").mkdir()
    (checkpoint_run.output_dir / serving_copies.SERVING_COPY_ERROR_FILE).write_text("RuntimeError: out of memory")
    return checkpoint_run


def test_a_member_makes_a_failed_final_copy_again_once_while_it_is_written(team, client_for, final_run, sent_tasks,
                                                                           django_capture_on_commit_callbacks):
    page = client_for(team.teammate).get(f"/p/alpha/runs/{final_run.public_id}/").content.decode()
    assert "int8 serving copy failed" in page and "RuntimeError: out of memory" in page
    assert f'action="{final_url(final_run)}"' in page and "Make it again" in page
    assert f"jaxengine export --run {final_run.output_dir} --quantize int8" in page  # the CLI, as secondary text
    client = client_for(team.teammate)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(final_url(final_run), {"scheme": "int4"})
    assert response.status_code == 302 and response["Location"] == f"/p/alpha/runs/{final_run.public_id}/"
    copy = ServingCopy.objects.get(run=final_run, step__isnull=True)
    assert (copy.scheme, copy.status, copy.requested_by) == ("int4", ServingCopyStatus.WRITING, team.teammate)
    assert copy_tasks(sent_tasks) == [(MAKE_COPY_TASK, [copy.pk], MAKE_COPY_QUEUE)]
    assert serving_copies.source_dir(copy) == final_run.output_dir / "export"
    assert serving_copies.copy_dir(copy) == final_run.output_dir / "export" / "quantized"
    # A second click while it is written queues nothing more.
    with django_capture_on_commit_callbacks(execute=True):
        client.post(final_url(final_run), {"scheme": "int8"})
    assert len(copy_tasks(sent_tasks)) == 1 and ServingCopy.objects.get(pk=copy.pk).scheme == "int4"
    assert "already being written" in client.get(f"/p/alpha/runs/{final_run.public_id}/", follow=True).content.decode()
    partial = client.get(final_url(final_run)).content.decode()  # what static/serving_copy.js asks for again
    assert 'data-copy-state="writing"' in partial and "int4 serving copy being written" in partial
    assert "Make it again" not in partial and "jaxengine export" not in partial
    # The checkpoint's copy is another row: the final model's does not stand in its way.
    with django_capture_on_commit_callbacks(execute=True):
        _, queued = serving_copies.serving_copy_request(project=team.project, user=None, run=final_run, step=3)
    assert queued and len(copy_tasks(sent_tasks)) == 2


def test_making_the_final_copy_again_requires_the_member_role_and_the_project(team, client_for, final_run,
                                                                              sent_tasks):
    assert client_for(team.viewer).post(final_url(final_run), {"scheme": "int4"}).status_code == 403
    assert client_for(team.outsider).post(final_url(final_run), {"scheme": "int4"}).status_code == 404
    assert client_for(team.outsider).get(final_url(final_run)).status_code == 404
    assert not ServingCopy.objects.exists() and not copy_tasks(sent_tasks)
    page = client_for(team.viewer).get(f"/p/alpha/runs/{final_run.public_id}/").content.decode()
    assert "serving copy failed" in page and "Make it again" not in page  # viewers see the state, without the form
    assert "Make it again" not in client_for(team.viewer).get(final_url(final_run)).content.decode()


@pytest.mark.parametrize("change, message", [
    ({"status": RunStatus.FAILED}, "has no final model to copy"),
    ({"task": "reward"}, "has no final model to copy"),
])
def test_a_run_without_a_final_model_gets_no_copy(team, client_for, final_run, sent_tasks, change, message):
    Run.objects.filter(pk=final_run.pk).update(**change)
    page = client_for(team.teammate).post(final_url(final_run), {"scheme": "int8"}, follow=True).content.decode()
    assert message in page and not ServingCopy.objects.exists() and not copy_tasks(sent_tasks)


def test_it_rejects_an_unknown_scheme_for_the_final_copy(team, client_for, final_run, sent_tasks):
    page = client_for(team.teammate).post(final_url(final_run), {"scheme": "int3"}, follow=True).content.decode()
    assert "int3&#x27; is not one of int8, int4" in page and not ServingCopy.objects.exists()


def test_a_ready_final_copy_is_switched_to_int4_and_serves_the_int8_one_until_then(team, client_for, final_run,
                                                                                   django_capture_on_commit_callbacks):
    (final_run.output_dir / serving_copies.SERVING_COPY_ERROR_FILE).unlink()
    Artifact.objects.create(run=final_run, kind=ArtifactKind.MODEL, path=str(final_run.output_dir / "export"))
    write_copy(final_run.output_dir / "export" / "quantized", scheme="int8")
    page = client_for(team.teammate).get(f"/p/alpha/runs/{final_run.public_id}/").content.decode()
    assert 'data-copy-state="ready"' in page and f'action="{final_url(final_run)}"' in page  # to switch scheme
    assert "jaxengine export" not in page
    with django_capture_on_commit_callbacks(execute=True):
        copy, queued = serving_copies.serving_copy_request(project=team.project, user=team.teammate, run=final_run,
                                                           final=True, scheme="int4")
    assert queued
    state = serving_copies.final_serving_copy(run=final_run, automatic_scheme="int8")
    assert (state["state"], state["scheme"], state["served"], state["automatic"]) == ("writing", "int4", "int8", False)
    chosen = chat_selectors.model_choice(project=team.project, ref=final_run.public_id)
    assert chosen.quantization == "int8"  # the old copy serves until the new one is whole
    # The new copy fails: the reason is told, the int8 copy still serves, and it can be made again.
    serving_copies.serving_copy_finish(copy_pk=copy.pk, error=ValueError("int4 <needs> 64"))
    partial = client_for(team.teammate).get(final_url(final_run)).content.decode()
    assert "int4 serving copy failed" in partial and "ValueError: int4 &lt;needs&gt; 64" in partial
    assert "serve the earlier int8 copy" in partial and "Make it again" in partial
    # Made again, written whole: the int4 copy is what the chat serves.
    with django_capture_on_commit_callbacks(execute=True):
        serving_copies.serving_copy_request(project=team.project, user=None, run=final_run, final=True, scheme="int4")
    write_copy(final_run.output_dir / "export" / "quantized", scheme="int4")
    serving_copies.serving_copy_finish(copy_pk=copy.pk)
    assert chat_selectors.model_choice(project=team.project, ref=final_run.public_id).quantization == "int4"
    partial = client_for(team.viewer).get(final_url(final_run)).content.decode()
    assert 'data-copy-state="ready"' in partial and "int4 serving copy" in partial


# A base model's copy ---------------------------------------------------------------------------------


def test_a_base_model_page_offers_a_copy_and_says_what_it_can_measure(team, client_for, catalog):
    page = client_for(team.teammate).get(base_url(catalog.base_model)).content.decode()
    assert "serve this model unquantized" in page and "need eval prompts" in page
    assert f'action="{base_url(catalog.base_model, "serving-copy/")}"' in page and "Make serving copy" in page
    # The project's ready dataset versions to measure on.
    assert f'value="{catalog.sft.public_id}"' in page and f'value="{catalog.prompts.public_id}"' in page
    assert f'data-follow-url="{base_url(catalog.base_model, "serving-copy/")}"' in page
    viewer_page = client_for(team.viewer).get(base_url(catalog.base_model)).content.decode()
    assert "Make serving copy" not in viewer_page and "serve this model unquantized" in viewer_page


def test_a_member_makes_a_base_models_copy_measured_on_a_dataset_version(team, client_for, catalog, sent_tasks,
                                                                         django_capture_on_commit_callbacks):
    client = client_for(team.teammate)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(base_url(catalog.base_model, "serving-copy/"),
                               {"scheme": "int8", "eval_version": catalog.prompts.public_id})
    assert response.status_code == 302 and response["Location"] == base_url(catalog.base_model)
    copy = ServingCopy.objects.get(base_model=catalog.base_model)
    assert copy.eval_version == catalog.prompts and copy.project == team.project and copy.scheme == "int8"
    assert copy_tasks(sent_tasks) == [(MAKE_COPY_TASK, [copy.pk], "serve")]
    with django_capture_on_commit_callbacks(execute=True):
        client.post(base_url(catalog.base_model, "serving-copy/"), {"scheme": "int4"})
    assert len(copy_tasks(sent_tasks)) == 1  # being written: nothing more queued
    card = client_for(team.viewer).get(base_url(catalog.base_model, "serving-copy/")).content.decode()
    assert 'data-copy-state="writing"' in card and "perplexity and greedy agreement" in card
    assert "Make" not in card


def test_a_base_models_copy_requires_the_member_role_and_the_project(team, client_for, catalog, sent_tasks):
    url = base_url(catalog.base_model, "serving-copy/")
    assert client_for(team.viewer).post(url, {"scheme": "int8"}).status_code == 403
    assert client_for(team.outsider).post(url, {"scheme": "int8"}).status_code == 404
    assert client_for(team.outsider).get(url).status_code == 404
    assert client_for(team.viewer).get(url).status_code == 200
    assert not ServingCopy.objects.exists() and not copy_tasks(sent_tasks)


def test_a_base_model_whose_directory_was_deleted_gets_no_copy_and_the_page_says_what_to_do(
        team, client_for, catalog, sent_tasks):
    """QA: a base model's directory deleted behind Temper's back: asking for its serving copy queued a task that
    failed with a bare "No such file or directory". The request is refused, naming the path and what to do."""
    directory = Path(catalog.base_model.path)
    directory.rmdir()
    page = client_for(team.teammate).post(base_url(catalog.base_model, "serving-copy/"), {"scheme": "int8"},
                                          follow=True).content.decode()
    assert (f"the files of base model {isolated('tiny')} are missing: {directory} is not there any more (moved or "
            "deleted outside Temper); put the model back at that path, or unregister it and register the model where "
            "it is now") in html.unescape(page)
    assert not ServingCopy.objects.exists() and not copy_tasks(sent_tasks)


def test_it_rejects_a_dataset_version_of_another_project_or_not_ready(team, client_for, catalog, sent_tasks):
    theirs = make_ready_version(team.outsider_project, name="theirs", kind="sft")
    url = base_url(catalog.base_model, "serving-copy/")
    page = client_for(team.teammate).post(url, {"eval_version": theirs.public_id}, follow=True).content.decode()
    assert "choose a ready dataset version of this project" in page
    catalog.sft.status = "failed"
    catalog.sft.save()
    page = client_for(team.teammate).post(url, {"eval_version": catalog.sft.public_id}, follow=True).content.decode()
    assert "choose a ready version to measure on" in page
    assert not ServingCopy.objects.exists() and not copy_tasks(sent_tasks)


def test_a_base_models_copy_without_eval_data_says_its_quality_was_not_measured(team, client_for, catalog, sent_tasks,
                                                                                 django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        copy, _ = serving_copies.serving_copy_request(project=team.project, user=None, base_model=catalog.base_model)
    write_copy(serving_copies.base_model_copy_dir(catalog.base_model))
    serving_copies.serving_copy_finish(copy_pk=copy.pk)
    card = client_for(team.viewer).get(base_url(catalog.base_model, "serving-copy/")).content.decode()
    assert 'data-copy-state="ready"' in card and "600.0 MiB, 60% of the bfloat16" in card
    assert "perplexity and greedy agreement need eval prompts" in card


# What is served --------------------------------------------------------------------------------------


def test_the_chat_and_the_api_serve_a_copy_once_it_is_whole_and_say_which(team, client_for, catalog, checkpoint_run,
                                                                            tmp_path):
    base_model = make_base_model(team.project, name="other", path=str(tmp_path / "other-model"))
    checkpoint_ref = f"{checkpoint_run.public_id}:step-3"

    def served(ref):
        return chat_selectors.model_choice(project=team.project, ref=ref)

    before = served(base_model.public_id)
    assert before.path == base_model.path and before.quantization == ""
    assert served(checkpoint_ref).path == str(checkpoint_run.output_dir / "export-step-3")
    # Being written: the staging directory and a copy without its quantization.json are not served.
    copy_dir = serving_copies.base_model_copy_dir(base_model)
    (copy_dir / "model.safetensors").parent.mkdir(parents=True)
    (copy_dir / "model.safetensors").write_bytes(b"half")
    assert served(base_model.public_id).path == base_model.path
    write_copy(copy_dir)
    write_copy(checkpoint_run.output_dir / "export-step-3" / "quantized", scheme="int4")
    after = served(base_model.public_id)
    assert after.path == str(copy_dir) and after.quantization == "int8" and after.cache_key != before.cache_key
    assert "int8 serving copy" in after.option_label and after.label == "Base model: other"
    checkpoint = served(checkpoint_ref)
    assert checkpoint.path == str(checkpoint_run.output_dir / "export-step-3" / "quantized")
    assert checkpoint.quantization == "int4"
    # Made again in another scheme at the same path: another cache key, so the serve worker loads it anew.
    write_copy(copy_dir, scheme="int4")
    assert served(base_model.public_id).cache_key != after.cache_key
    page = client_for(team.teammate).get("/p/alpha/chat/").content.decode()
    assert "int4 serving copy" in page
    _token, secret = project_token_create(user=team.teammate, project=team.project, name="t")
    listed = client_for(team.teammate).get("/v1/models", headers={"Authorization": f"Bearer {secret}"}).json()
    quantization = {entry["id"]: entry["quantization"] for entry in listed["data"]}
    assert quantization[base_model.public_id] == "int4" and quantization[checkpoint_ref] == "int4"
    assert quantization[catalog.base_model.public_id] is None


def test_a_copys_description_is_read_once_until_the_copy_is_made_again(team, catalog, monkeypatch):
    """The chat's model picker (``model_choices``, on every chat and API request) read and parsed each copy's
    quantization.json every time; it is kept while the file is the same, and a copy made again is seen at once."""
    copy_dir = serving_copies.base_model_copy_dir(catalog.base_model)
    write_copy(copy_dir, ratio_to_bfloat16=0.6)
    reads = []
    read_text = Path.read_text

    def counted(path, *args, **kwargs):
        if path.name == serving_copies.QUANTIZATION_FILE:
            reads.append(path)
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)

    def served():
        return chat_selectors.model_choice(project=team.project, ref=catalog.base_model.public_id)

    assert served().quantization == served().quantization == "int8" and len(reads) == 1
    assert serving_copies.copy_figures(copy_dir)["ratio_to_bfloat16"] == 0.6 and len(reads) == 1
    # Made again as the engine makes it: a new directory renamed into place (a file of the same size here).
    staging = copy_dir.with_name("staging")
    write_copy(staging, ratio_to_bfloat16=0.7)
    assert (staging / "quantization.json").stat().st_size == (copy_dir / "quantization.json").stat().st_size
    copy_dir.rename(copy_dir.with_name("aside"))
    staging.rename(copy_dir)
    assert serving_copies.copy_figures(copy_dir)["ratio_to_bfloat16"] == 0.7 and len(reads) == 2
    # Rewritten in place (another scheme): seen at once too; a copy taken away is no longer served.
    write_copy(copy_dir, scheme="int4")
    assert served().quantization == "int4" and len(reads) == 3
    (copy_dir / "quantization.json").unlink()
    assert served().quantization == "" and served().path == catalog.base_model.path


def test_a_checkpoint_whose_export_was_deleted_gets_no_copy_and_the_page_says_what_to_do(
        team, client_for, checkpoint_run, sent_tasks):
    """QA: a checkpoint's export directory deleted behind Temper's back: asking for its serving copy queued a task
    that failed with the engine's bare "no such directory". The request is refused, naming the path and what to do,
    as for a base model whose directory is gone."""
    export = checkpoint_run.output_dir / "export-step-3"
    export.rmdir()
    page = client_for(team.teammate).post(copy_url(checkpoint_run), {"step": "3", "scheme": "int8"},
                                          follow=True).content.decode()
    assert (f"the export of checkpoint 3 of run {checkpoint_run.public_id} is missing: {export} is not there any more "
            "(moved or deleted outside Temper); put the export back at that path, or make the copy of another "
            "exported checkpoint of the run") in html.unescape(page)
    assert not ServingCopy.objects.exists() and not copy_tasks(sent_tasks)
