"""Deleting one training checkpoint of a run to free its disk, keeping the run: from the run page and the REST API,
who may, what refuses it (and changes nothing), what its confirmation says it changes, the row lock that orders it
with a second deletion or a resume, and the trash folder that no listing, the web's or the engine's, takes for a
checkpoint."""
import html
import json
import shutil
import threading
import time

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.http import Http404
from django.template.defaultfilters import filesizeformat
from django.test import Client

from tests.webapp.factories import du_bytes, form_token
from tests.webapp.runs.conftest import sft_spec
from webapp.api.services import token_create
from webapp.core.bidi import isolated
from webapp.runs import services
from webapp.runs.models import (CheckpointExport, CheckpointExportStatus, MetricPoint, Run, RunLogLine, RunStatus,
                                ServingCopy, ServingCopyStatus)

NAME = "sft <i>one</i>"


def url(run, suffix=""):
    return f"/p/alpha/runs/{run.public_id}/{suffix}"


def write_checkpoint(run, step, *, size=1024):
    shard = run.output_dir / "checkpoints" / str(step) / "state" / "shard"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b"\0" * size)


def ended_run(team, catalog, *, user=None, status=RunStatus.FAILED, steps=(100, 200, 300)):
    """A run of ``user`` (the teammate) that ended with ``status``, its checkpoints of ``steps`` in its folder."""
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=user or team.teammate, name=NAME)
    Run.objects.filter(pk=run.pk).update(status=status, current_step=steps[-1] + 20)
    for step in steps:
        write_checkpoint(run, step)
    run.refresh_from_db()
    return run


def trash_folders(run):
    return sorted(path.name for path in run.output_dir.iterdir() if path.name.startswith(services.CHECKPOINT_TRASH_PREFIX))


def delete_from_page(client, run, step, capture):
    page = client.get(url(run)).content.decode()
    with capture(execute=True):
        return client.post(url(run, "checkpoints/delete/"), {
            "step": step, "submission_token": form_token(page, after=f'id="checkpoint-{step}-delete"')})


def item(page, step):
    return page.split(f'<li data-step="{step}"')[1].split("</li>")[0]


def test_a_checkpoint_deleted_from_the_run_page_frees_its_folder_and_leaves_the_list(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    run = ended_run(team, catalog)
    MetricPoint.objects.create(run=run, step=250, name="loss", value=1.5, wall_time=1.0)
    client = client_for(team.teammate)
    page = client.get(url(run)).content.decode()
    # The disk the folder takes, as du and the Storage page count it (its file holds 1.0 KB).
    freed = filesizeformat(du_bytes(run.output_dir / "checkpoints" / "200"))
    assert 'id="checkpoint-200-delete"' in item(page, 200) and f"freeing {freed}" in item(page, 200)
    response = delete_from_page(client, run, 200, django_capture_on_commit_callbacks)
    assert response.status_code == 302 and response["Location"] == url(run)  # no fragment: the message takes the focus
    page = client.get(url(run)).content.decode()
    assert f"Deleted checkpoint 200 of {html.escape(isolated(NAME))}: {freed} freed." in page
    assert '<li data-step="200"' not in page and '<li data-step="100"' in page and '<li data-step="300"' in page
    assert services.checkpoint_steps(run) == [100, 300]
    assert not (run.output_dir / "checkpoints" / "200").exists() and trash_folders(run) == []
    # The run and its curves stay; its log says who deleted which.
    assert Run.objects.filter(pk=run.pk).exists() and MetricPoint.objects.filter(run=run).count() == 1
    assert RunLogLine.objects.filter(run=run, message=f"checkpoint 200 deleted by {team.teammate.get_username()} "
                                                      f"({freed} freed)").exists()
    # Sent again (a second tab, a double click past the page's guard): nothing left to delete, said so.
    page = client.get(url(run)).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url(run, "checkpoints/delete/"), {
            "step": 200, "submission_token": form_token(page, after='id="checkpoint-100-delete"')})
    assert "Nothing to delete: it is gone already" in client.get(response["Location"]).content.decode()
    assert services.checkpoint_steps(run) == [100, 300]


def test_the_confirmation_says_what_deleting_changes(team, catalog, client_for, sent_tasks, monkeypatch):
    """The newest checkpoint is what Resume restores, the best by eval what the trainer keeps: the confirmation says
    so before the person confirms, and that an export keeps its weights."""
    monkeypatch.setattr("webapp.runs.reporting.publish_event", lambda public_id, event: None)
    run = ended_run(team, catalog)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="eval/loss", value=value, wall_time=step)
                                     for step, value in ((100, 2.0), (200, 1.25), (300, 1.5))])
    export = run.output_dir / "export-step-100"
    export.mkdir()
    (export / "config.json").write_text("{}")
    services.checkpoint_export_request(run=run, step=100, user=team.teammate)
    services.checkpoint_export_finish(run=run, step=100, export_dir=export)
    page = html.unescape(client_for(team.owner).get(url(run, "checkpoints/")).content.decode())
    assert f"Its export stays: runs, the chat and downloads go on using {run.public_id}@100." in item(page, 100)
    assert "It is the run's best checkpoint by eval/loss (1.25)." in item(page, 200)
    assert "It is not exported: its weights can no longer be exported" in item(page, 200)
    assert ("It is the run's newest checkpoint: Resume would go on from checkpoint 200 instead, training the steps "
            "after 200 again and replacing their curves.") in item(page, 300)
    assert "newest" not in item(page, 200) and "best" not in item(page, 300).replace("badge", "")

    only = ended_run(team, catalog, status=RunStatus.SUCCEEDED, steps=(50,))
    page = html.unescape(client_for(team.owner).get(url(only, "checkpoints/")).content.decode())
    assert ("It is the run's only checkpoint: Train further would train the run again from step 0, replacing its "
            "curves.") in item(page, 50)


def test_the_only_checkpoint_of_a_run_that_recorded_saving_says_resume_would_then_be_refused_and_it_is(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """A run whose record says it saved checkpoints (its engine's summary) and that has one left: deleting it leaves
    Resume refused, as for checkpoints lost from disk (``lost_checkpoints_refusal``), and the confirmation says so
    rather than promising a resume from step 0."""
    run = ended_run(team, catalog, status=RunStatus.CANCELLED, steps=(50,))
    Run.objects.filter(pk=run.pk).update(summary={"status": RunStatus.CANCELLED})
    run.refresh_from_db()
    page = html.unescape(client_for(team.owner).get(url(run, "checkpoints/")).content.decode())
    assert ("It is the run's only checkpoint: Resume would then be refused, as the run could only train again from "
            "step 0 while its step history goes on; Duplicate it to train its spec again.") in item(page, 50)
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_delete(run=run, step=50, user=team.teammate)
    with pytest.raises(ValidationError, match="it would train again from step 0"):
        services.run_resume(run=run, user=team.teammate)


def test_a_resume_after_the_newest_is_deleted_goes_on_from_the_one_before(team, catalog, sent_tasks,
                                                                          django_capture_on_commit_callbacks):
    run = ended_run(team, catalog, status=RunStatus.CANCELLED)
    on_disk = du_bytes(run.output_dir / "checkpoints" / "300")
    with django_capture_on_commit_callbacks(execute=True):
        deleted = services.checkpoint_delete(run=run, step=300, user=team.teammate)
    assert (deleted.step, deleted.bytes_freed) == (300, on_disk)
    services.run_resume(run=run, user=team.teammate)
    assert run.log_lines.order_by("-id").first().message.endswith("; continuing from checkpoint 200")


def refused(run, step, capture):
    """The service's refusal of deleting ``step``, having checked that nothing changed."""
    before = (services.checkpoint_steps(run), run.log_lines.count(), list(run.checkpoint_exports.values_list()))
    with pytest.raises(ValidationError) as error, capture(execute=True):
        services.checkpoint_delete(run=run, step=step, user=run.created_by)
    assert (services.checkpoint_steps(run), run.log_lines.count(), list(run.checkpoint_exports.values_list())) == before
    assert trash_folders(run) == []
    return error.value.message_dict["step"][0]


@pytest.mark.parametrize("status, cancel_requested, doing", [
    (RunStatus.QUEUED, False, "is queued"), (RunStatus.RUNNING, False, "is running"),
    (RunStatus.RUNNING, True, "is stopping")])
def test_a_checkpoint_of_a_run_that_has_not_ended_is_not_deleted(team, catalog, client_for, sent_tasks,
                                                                django_capture_on_commit_callbacks, status,
                                                                cancel_requested, doing):
    run = ended_run(team, catalog)
    Run.objects.filter(pk=run.pk).update(status=status, cancel_requested=cancel_requested)
    run.refresh_from_db()
    why = (f"run {run.public_id} {doing}: its engine restores, saves and rotates out checkpoints itself while it runs. "
           "Delete the checkpoint once the run has ended (cancel it first if it should not go on)")
    assert refused(run, 200, django_capture_on_commit_callbacks) == why
    client = client_for(team.teammate)
    page = client.get(url(run)).content.decode()
    assert "checkpoint-200-delete" not in page  # not offered, as the run's own Delete is not
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url(run, "checkpoints/delete/"), {"step": 200})
    assert f"Nothing was deleted: {why}." in client.get(response["Location"]).content.decode()
    assert services.checkpoint_steps(run) == [100, 200, 300]


def test_a_checkpoint_being_exported_or_copied_for_serving_is_not_deleted(team, catalog, client_for, sent_tasks,
                                                                         django_capture_on_commit_callbacks):
    run = ended_run(team, catalog)
    services.checkpoint_export_request(run=run, step=200, user=team.teammate)
    exporting = (f"checkpoint 200 of run {run.public_id} is being exported: the train worker is reading it. Delete it "
                 "once the export is done (its page lists it then); the exported model stays")
    assert refused(run, 200, django_capture_on_commit_callbacks) == exporting
    page = client_for(team.teammate).get(url(run, "checkpoints/")).content.decode()
    assert 'id="checkpoint-200-delete"' not in page and "checkpoint-delete-refused" in item(page, 200)
    assert html.escape(exporting[0].upper() + exporting[1:], quote=True) in item(page, 200)
    assert 'id="checkpoint-100-delete"' in item(page, 100)

    CheckpointExport.objects.filter(run=run, step=200).update(status=CheckpointExportStatus.EXPORTED)
    ServingCopy.objects.create(project=team.project, run=run, step=200, status=ServingCopyStatus.WRITING)
    assert refused(run, 200, django_capture_on_commit_callbacks) == (
        f"a serving copy of checkpoint 200 of run {run.public_id} is being written. Delete the checkpoint once the "
        "copy is ready or has failed")


def test_who_may_delete_a_checkpoint(team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """Those who may delete the run: an owner any run's, a member their own runs'; a viewer none; an outsider 404."""
    owners = ended_run(team, catalog, user=team.owner)
    teammate = client_for(team.teammate)
    assert "checkpoint-200-delete" not in teammate.get(url(owners)).content.decode()
    assert teammate.post(url(owners, "checkpoints/delete/"), {"step": 200}).status_code == 403
    assert "checkpoint-200-delete" not in client_for(team.viewer).get(url(owners)).content.decode()
    assert client_for(team.viewer).post(url(owners, "checkpoints/delete/"), {"step": 200}).status_code == 403
    assert client_for(team.outsider).post(url(owners, "checkpoints/delete/"), {"step": 200}).status_code == 404
    assert services.checkpoint_steps(owners) == [100, 200, 300]
    response = delete_from_page(client_for(team.owner), owners, 200, django_capture_on_commit_callbacks)
    assert response.status_code == 302 and services.checkpoint_steps(owners) == [100, 300]


def test_the_rest_api_deletes_a_checkpoint(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    run = ended_run(team, catalog)

    def call(user, step):
        _token, secret = token_create(user=user, name="script")
        with django_capture_on_commit_callbacks(execute=True):
            response = Client(HTTP_AUTHORIZATION=f"Bearer {secret}").delete(
                f"/api/v1/projects/alpha/runs/{run.public_id}/checkpoints/{step}/")
        return response.status_code, json.loads(response.content or b"null")

    assert call(team.viewer, 200)[0] == 403
    assert call(team.outsider, 200)[0] == 404
    assert call(team.teammate, 200) == (204, None)
    assert services.checkpoint_steps(run) == [100, 300] and trash_folders(run) == []
    assert call(team.teammate, 200) == (404, {"detail": f"run {run.public_id} has no checkpoint 200 in its folder "
                                                        "(deleted already, or rotated out by the run); it has 100, 300"})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED)
    status, body = call(team.teammate, 300)
    assert status == 409 and body["detail"].startswith(f"run {run.public_id} is queued: its engine restores")
    assert services.checkpoint_steps(run) == [100, 300]


@pytest.mark.parametrize("meanwhile", ["a second deletion", "a resume"])
def test_what_is_sent_while_a_checkpoint_is_deleted_waits_for_it(transactional_db, team, catalog, sent_tasks,
                                                                 monkeypatch, meanwhile):
    """The deletion holds the run's row from its checks to its rename: a second deletion of the step sent meanwhile
    finds it gone (not a folder half renamed), a resume continues from the checkpoint before it."""
    from webapp.runs import selectors

    run = ended_run(team, catalog, status=RunStatus.CANCELLED)
    inside, release = threading.Event(), threading.Event()
    measure = selectors.folder_bytes

    def measured_slowly(directory):
        if not inside.is_set():
            inside.set()
            release.wait(timeout=30)
        return measure(directory)

    monkeypatch.setattr(selectors, "folder_bytes", measured_slowly)
    outcomes = {}

    def act(name, action):
        try:
            outcomes[name] = action()
        except Exception as error:  # noqa: BLE001  (compared below)
            outcomes[name] = error
        finally:
            connection.close()

    first = threading.Thread(target=act, args=("first", lambda: services.checkpoint_delete(
        run=run, step=300, user=team.teammate)))
    second_action = (lambda: services.checkpoint_delete(run=run, step=300, user=team.teammate)) \
        if meanwhile == "a second deletion" else (lambda: services.run_resume(run=run, user=team.teammate))
    second = threading.Thread(target=act, args=("second", second_action))
    first.start()
    assert inside.wait(timeout=30)
    second.start()
    time.sleep(0.5)
    assert second.is_alive(), "the second went ahead while the first held the run"
    release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert isinstance(outcomes["first"], services.CheckpointDeleted), outcomes
    assert services.checkpoint_steps(run) == [100, 200]
    if meanwhile == "a second deletion":
        assert isinstance(outcomes["second"], Http404) and "has no checkpoint 300" in str(outcomes["second"])
    else:
        assert isinstance(outcomes["second"], Run) and outcomes["second"].status == RunStatus.QUEUED
        assert run.log_lines.order_by("-id").first().message.endswith("; continuing from checkpoint 200")


def test_no_listing_takes_the_trash_of_an_interrupted_deletion_for_a_checkpoint(
        team, catalog, sent_tasks, client_for, django_capture_on_commit_callbacks):
    """A deletion renames the step folder to a trash name, then removes it once committed. Stopped in between (the
    web process killed), the trash stays: the engine's listing (orbax's, which resumes and exports restore from), the
    run page's and the state endpoint's leave it out, even were it inside checkpoints/; the next deletion removes it."""
    import jax.numpy as jnp

    from jaxengine.trainer import Checkpoints

    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name=NAME)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, current_step=3)
    checkpoints = Checkpoints(run.output_dir / "checkpoints", keep_last=5)
    try:
        for step in (1, 2, 3):
            checkpoints.save(step, [jnp.full((4,), float(step))], {"step": step})
    finally:
        checkpoints.close()
    services.checkpoint_delete(run=run, step=3, user=team.teammate)  # committed; its removal on commit never ran
    trash = run.output_dir / trash_folders(run)[0]
    assert trash.name.startswith(".deleting-checkpoint-3-") and (trash / "state").is_dir()
    # The same name inside checkpoints/: orbax reads a name ending in _<digits> as a step; this one has none.
    shutil.copytree(trash, run.output_dir / "checkpoints" / trash.name)
    reopened = Checkpoints(run.output_dir / "checkpoints", keep_last=5)
    try:
        assert reopened.steps() == [1, 2]
        leaves, meta = reopened.restore(2, [jnp.zeros((4,))])
        assert meta["step"] == 2 and float(leaves[0][0]) == 2.0
    finally:
        reopened.close()
    assert services.checkpoint_steps(run) == [1, 2]
    client = client_for(team.teammate)
    page = client.get(url(run, "checkpoints/")).content.decode()
    assert page.count('<li data-step="') == 2 and "deleting" not in page
    assert list(client.get(url(run, "state.json")).json()["checkpoints"]) == ["1", "2"]
    shutil.rmtree(run.output_dir / "checkpoints" / trash.name)
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_delete(run=run, step=1, user=team.teammate)
    assert trash_folders(run) == [] and services.checkpoint_steps(run) == [2]
