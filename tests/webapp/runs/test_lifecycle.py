"""A run's life beside the jobs that use its files: a resume waits for exports and serving copies of the run,
keeps the final model that other runs used, and those jobs wait for a resumed run in turn."""
from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from tests.webapp.runs.conftest import sft_spec, with_checkpoint
from webapp.runs import serving_copies, services
from webapp.runs.models import (Artifact, ArtifactKind, CheckpointExport, CheckpointExportStatus, Run, RunStatus,
                                ServingCopy, ServingCopyStatus)


@pytest.fixture
def finished_run(team, catalog, sent_tasks, monkeypatch, settings) -> Run:
    """A succeeded run of 10 steps with checkpoints 5 and 10, its final model exported."""
    settings.TEMPER_SERVE_QUANTIZE = "none"  # no automatic copy being written: each test makes the one it needs
    monkeypatch.setattr(services, "_clear_cancel_flag", lambda public_id: None)
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="first")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=10)
    run.refresh_from_db()
    for step in (5, 10):
        with_checkpoint(run, step)
    (run.output_dir / "export").mkdir()
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(run.output_dir / "export"))
    return run


def test_a_resume_waits_for_a_checkpoint_export_of_the_run(team, finished_run):
    services.checkpoint_export_request(run=finished_run, step=5, user=team.teammate)
    with pytest.raises(ValidationError, match=f"run {finished_run.public_id} cannot be resumed yet: checkpoint 5 is "
                                              "being exported. Resume it once that is done"):
        services.run_resume(run=finished_run, user=team.teammate, max_steps=20)
    assert Run.objects.get(pk=finished_run.pk).status == RunStatus.SUCCEEDED
    CheckpointExport.objects.filter(run=finished_run, step=5).update(status=CheckpointExportStatus.EXPORTED)
    assert services.run_resume(run=finished_run, user=team.teammate, max_steps=20).status == RunStatus.QUEUED


def test_a_resume_waits_for_the_serving_copy_of_the_final_model(team, finished_run):
    serving_copies.serving_copy_request(project=team.project, user=team.teammate, run=finished_run, final=True)
    with pytest.raises(ValidationError, match="the serving copy of its final model is being written"):
        services.run_resume(run=finished_run, user=team.teammate, max_steps=20)
    ServingCopy.objects.filter(run=finished_run).update(status=ServingCopyStatus.READY)
    assert services.run_resume(run=finished_run, user=team.teammate, max_steps=20).status == RunStatus.QUEUED


def test_a_resume_waits_for_the_automatic_serving_copy(team, finished_run, settings):
    settings.TEMPER_SERVE_QUANTIZE = "int8"  # written when the run succeeded: no row, nothing on disk yet
    with pytest.raises(ValidationError, match="the serving copy of its final model is being written"):
        services.run_resume(run=finished_run, user=team.teammate, max_steps=20)


def test_exports_and_copies_wait_for_a_resumed_run(team, finished_run):
    stale = Run.objects.get(pk=finished_run.pk)  # a page opened before the resume: it still says succeeded
    services.run_resume(run=finished_run, user=team.teammate, max_steps=20)
    with pytest.raises(ValidationError, match="is queued; export checkpoints of finished runs"):
        services.checkpoint_export_request(run=stale, step=5, user=team.teammate)
    with pytest.raises(ValidationError, match="has no final model to copy"):
        serving_copies.serving_copy_request(project=team.project, user=team.teammate, run=stale, final=True)
    assert not CheckpointExport.objects.exists() and not ServingCopy.objects.exists()


def test_a_resume_keeps_the_final_model_that_other_runs_started_from(team, catalog, finished_run):
    (finished_run.output_dir / "export-step-5").mkdir(parents=True)  # a launch from it is refused once it is gone
    from_checkpoint_step = Artifact.objects.create(run=finished_run, kind=ArtifactKind.CHECKPOINT, step=5,
                                                   path=str(finished_run.output_dir / "export-step-5"))
    services.run_create(project=team.project, spec=sft_spec(catalog, model=f"{finished_run.public_id}@5"),
                        user=team.teammate, name="from its checkpoint")
    # A checkpoint's export is not what the resume writes again.
    assert services.final_model_dependants(finished_run) == []
    assert from_checkpoint_step.path.endswith("export-step-5")
    derived = services.run_create(project=team.project, spec=sft_spec(catalog, model=finished_run.public_id),
                                  user=team.teammate, name="from its model")
    Run.objects.filter(pk=derived.pk).update(status=RunStatus.SUCCEEDED)
    with pytest.raises(ValidationError) as refused:
        services.run_resume(run=finished_run, user=team.teammate, max_steps=20)
    assert refused.value.messages == [
        f"run {finished_run.public_id} cannot be resumed: runs \u2068from its model\u2069 ({derived.public_id}) use "
        f"its final model, which a resume would replace with other weights at its end. Train on from it as a new run "
        f"instead: launch one with model {finished_run.public_id}"]
    assert services.rerun_refusals(finished_run)["resume"] == refused.value.messages[0]  # greyed on its page
    finished_run.refresh_from_db()
    assert finished_run.status == RunStatus.SUCCEEDED and finished_run.attempt == 1


def test_an_active_run_is_not_archived_until_it_is_cancelled(team, catalog, finished_run):
    queued = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="queued")
    with pytest.raises(ValidationError) as refused:
        services.run_set_archived(runs=[queued], archived=True)
    assert refused.value.message_dict == {"runs": [
        f"run \u2068queued\u2069 ({queued.public_id}) is queued: cancel it first, then archive it. Nothing was archived"]}
    Run.objects.filter(pk=queued.pk).update(status=RunStatus.RUNNING)
    with pytest.raises(ValidationError, match="are queued or running: cancel them first, or untick them"):
        services.run_set_archived(runs=[finished_run, queued, Run.objects.create(
            project=team.project, name="other", task="sft", spec={}, resolved_spec={})], archived=True)
    assert not Run.objects.filter(archived=True).exists()  # all or nothing
    services.run_cancel(run=queued, user=team.teammate)  # asks the worker to stop: it still runs
    with pytest.raises(ValidationError, match="is running: cancel it first"):
        services.run_set_archived(runs=[queued], archived=True)
    Run.objects.filter(pk=queued.pk).update(status=RunStatus.CANCELLED)
    assert services.run_set_archived(runs=[queued, finished_run], archived=True) == 2
    assert services.run_set_archived(runs=[queued], archived=False) == 1  # restoring is always possible


def test_retries_are_numbered_instead_of_stacking_their_suffix(team, catalog, sent_tasks):
    """A retry of a retry was named "x (retry) (retry)", and two retries of one run had the same name."""
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="lr sweep")
    first = services.run_retry(run=run, user=team.teammate)
    assert first.name == "lr sweep (retry)"
    assert services.run_retry(run=first, user=team.teammate).name == "lr sweep (retry 2)"
    assert services.run_retry(run=run, user=team.teammate).name == "lr sweep (retry 3)"  # the next name not taken
    ninth = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate,
                                name="lr sweep (retry 9)")
    assert services.run_retry(run=ninth, user=team.teammate).name == "lr sweep (retry 10)"
    # A name at the limit is cut before the suffix, never the suffix.
    long = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate,
                               name="a" * services.RUN_NAME_MAX)
    retried = services.run_retry(run=long, user=team.teammate)
    assert retried.name == "a" * (services.RUN_NAME_MAX - len(" (retry)")) + " (retry)"
    assert services.run_retry(run=retried, user=team.teammate).name == (
        "a" * (services.RUN_NAME_MAX - len(" (retry 2)")) + " (retry 2)")
