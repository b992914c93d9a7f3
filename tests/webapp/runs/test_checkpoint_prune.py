"""Pruning a run's training checkpoints in one action, keeping the newest (what Resume restores), the best by the
run's ranking metric and the pinned steps: the service on real folders (bytes against du), the run page's *Delete
the others…*, the Storage page's project-wide prune (active runs skipped), the REST API, who may, and a resume
through orbax after it."""
import html
import json

import pytest
from django.core.exceptions import ValidationError
from django.template.defaultfilters import filesizeformat
from django.test import Client

from tests.webapp.factories import du_bytes, form_token
from tests.webapp.runs.test_checkpoint_deletion import NAME, ended_run, trash_folders, url
from webapp.api.openapi import build_document
from webapp.api.services import token_create
from webapp.core.bidi import isolated
from webapp.runs import services
from webapp.runs.models import MetricPoint, ProjectCheckpointPrune, Run, RunLogLine, RunStatus
from worker.tasks.storage import prune_project_checkpoints

STEPS = (100, 200, 300, 400, 500)


def evaluated(run, losses):
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="eval/loss", value=value, wall_time=step)
                                     for step, value in losses.items()])


def scored_run(team, catalog, *, user=None, status=RunStatus.CANCELLED):
    """An ended run with checkpoints 100…500, its best by eval/loss at 200."""
    run = ended_run(team, catalog, user=user, status=status, steps=STEPS)
    evaluated(run, {100: 2.0, 200: 1.0, 300: 1.5, 400: 1.25, 500: 1.75})
    return run


def checkpoint_folders(run, *steps):
    return [run.output_dir / "checkpoints" / str(step) for step in steps]


def test_pruning_keeps_the_newest_the_best_and_the_pinned_and_frees_what_du_counts(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    run = scored_run(team, catalog)
    each = {step: du_bytes(folder) for step, folder in zip((300, 400), checkpoint_folders(run, 300, 400))}
    together = du_bytes(*checkpoint_folders(run, 300, 400))
    with django_capture_on_commit_callbacks(execute=True):
        pruned = services.checkpoints_prune(run=run, user=team.teammate, keep=[100])
    assert [(deleted.step, deleted.bytes_freed) for deleted in pruned.deleted] == list(each.items())
    assert pruned.bytes_freed == together
    assert pruned.kept == {100: ["pinned"], 200: ["the best by eval/loss (1)"],
                           500: ["the newest: Resume goes on from it"]}
    assert services.checkpoint_steps(run) == [100, 200, 500] and trash_folders(run) == []
    assert not any(folder.exists() for folder in checkpoint_folders(run, 300, 400))
    # One log line per step, as deleting it alone writes.
    assert sorted(RunLogLine.objects.filter(run=run, message__startswith="checkpoint ").values_list(
        "message", flat=True)) == [f"checkpoint {step} deleted by {team.teammate.get_username()} "
                                   f"({filesizeformat(each[step])} freed)" for step in (300, 400)]
    # Again with the same pin: nothing left to go.
    assert services.checkpoints_prune(run=run, user=team.teammate, keep=[100]).deleted == []


def test_a_succeeded_run_keeps_its_newest_for_train_further_and_one_being_exported(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    run = scored_run(team, catalog, status=RunStatus.SUCCEEDED)
    export = run.output_dir / "export-step-300"
    export.mkdir()
    (export / "config.json").write_text("{}")
    services.checkpoint_export_request(run=run, step=300, user=team.teammate)
    services.checkpoint_export_finish(run=run, step=300, export_dir=export)
    services.checkpoint_export_request(run=run, step=400, user=team.teammate)  # still exporting
    with django_capture_on_commit_callbacks(execute=True):
        pruned = services.checkpoints_prune(run=run, user=team.teammate)
    assert [deleted.step for deleted in pruned.deleted] == [100, 300]
    assert pruned.kept[500] == ["the newest: Train further goes on from it"]
    assert pruned.kept[400][0].startswith(f"checkpoint 400 of run {run.public_id} is being exported")
    assert (export / "config.json").exists()  # the export is a folder of its own: untouched
    assert run.artifacts.filter(step=300).exists()


@pytest.mark.parametrize("status", [RunStatus.QUEUED, RunStatus.RUNNING])
def test_pruning_an_active_run_is_refused_and_changes_nothing(team, catalog, sent_tasks, status,
                                                             django_capture_on_commit_callbacks):
    run = scored_run(team, catalog)
    Run.objects.filter(pk=run.pk).update(status=status)
    with pytest.raises(ValidationError) as error, django_capture_on_commit_callbacks(execute=True):
        services.checkpoints_prune(run=run, user=team.teammate)
    assert error.value.message_dict["run"][0].startswith(f"run {run.public_id} is {status}: its engine restores")
    assert services.checkpoint_steps(run) == list(STEPS) and trash_folders(run) == []


def test_a_pinned_step_not_in_the_folder_is_refused_by_name(team, catalog, sent_tasks,
                                                            django_capture_on_commit_callbacks):
    run = scored_run(team, catalog)
    with pytest.raises(ValidationError) as error, django_capture_on_commit_callbacks(execute=True):
        services.checkpoints_prune(run=run, user=team.teammate, keep=[300, 250])
    assert error.value.message_dict["keep"] == [
        f"run {run.public_id} has no checkpoint 250 in its folder to keep; it has 100, 200, 300, 400, 500. Pin steps "
        "among those"]
    assert services.checkpoint_steps(run) == list(STEPS)


def prune_form(page):
    return page.split('id="checkpoints-prune"')[1].split("</details>")[0]


def test_the_run_page_says_what_goes_and_what_stays_and_deletes_the_others(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    run = scored_run(team, catalog)
    client = client_for(team.teammate)
    page = html.unescape(client.get(url(run)).content.decode())
    form = prune_form(page)
    freed = filesizeformat(du_bytes(*checkpoint_folders(run, 100, 300, 400)))
    assert f"Deletes the training checkpoints of steps 100, 300, 400 from the server for good, freeing {freed}." in form
    assert "step 200: the best by eval/loss (1)" in form and "step 500: the newest: Resume goes on from it" in form
    assert "Delete 3 checkpoints" in form
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url(run, "checkpoints/prune/"), {
            "submission_token": form_token(page, after='id="checkpoints-prune"')})
    assert response.status_code == 302 and response["Location"] == url(run)  # no fragment: the message takes the focus
    page = html.unescape(client.get(response["Location"]).content.decode())
    assert (f"Deleted 3 checkpoints of {isolated(NAME)} (steps 100, 300, 400): {freed} freed. Kept: step 200 (the best by "
            "eval/loss (1)), step 500 (the newest: Resume goes on from it).") in page
    assert services.checkpoint_steps(run) == [200, 500] and trash_folders(run) == []
    assert 'id="checkpoints-prune"' not in page  # nothing would go now: hidden


def test_who_may_prune_a_runs_checkpoints(team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """Those who may delete the run: an owner any run's, a member their own runs'; a viewer none; an outsider 404."""
    owners = scored_run(team, catalog, user=team.owner)
    for user, status in ((team.teammate, 403), (team.viewer, 403), (team.outsider, 404)):
        client = client_for(user)
        if status == 403:
            assert 'id="checkpoints-prune"' not in client.get(url(owners)).content.decode()
        with django_capture_on_commit_callbacks(execute=True):
            assert client.post(url(owners, "checkpoints/prune/")).status_code == status
    assert services.checkpoint_steps(owners) == list(STEPS)
    Run.objects.filter(pk=owners.pk).update(status=RunStatus.RUNNING)
    assert 'id="checkpoints-prune"' not in client_for(team.owner).get(url(owners)).content.decode()


def test_the_rest_api_prunes_and_answers_what_went_and_what_stayed(team, catalog, sent_tasks,
                                                                   django_capture_on_commit_callbacks):
    run = scored_run(team, catalog)
    freed = {step: du_bytes(folder) for step, folder in zip((100, 300), checkpoint_folders(run, 100, 300))}

    def call(user, body=None):
        _token, secret = token_create(user=user, name="script")
        with django_capture_on_commit_callbacks(execute=True):
            response = Client(HTTP_AUTHORIZATION=f"Bearer {secret}").post(
                f"/api/v1/projects/alpha/runs/{run.public_id}/checkpoints/prune/",
                json.dumps(body) if body is not None else "", content_type="application/json")
        return response.status_code, json.loads(response.content or b"null")

    assert call(team.viewer)[0] == 403
    assert call(team.outsider)[0] == 404
    assert call(team.teammate, {"keep": [250]}) == (400, {"errors": {"keep": [
        f"run {run.public_id} has no checkpoint 250 in its folder to keep; it has 100, 200, 300, 400, 500. Pin steps "
        "among those"]}})
    assert call(team.teammate, {"keep": ["400"]})[0] == 400  # a step is a number
    assert services.checkpoint_steps(run) == list(STEPS)
    assert call(team.teammate, {"keep": [400]}) == (200, {
        "deleted": [{"step": 100, "bytes": freed[100]}, {"step": 300, "bytes": freed[300]}],
        "kept": [{"step": 200, "reasons": ["the best by eval/loss (1)"]}, {"step": 400, "reasons": ["pinned"]},
                 {"step": 500, "reasons": ["the newest: Resume goes on from it"]}],
        "bytes_freed": freed[100] + freed[300]})
    assert services.checkpoint_steps(run) == [200, 400, 500]
    unpinned = du_bytes(*checkpoint_folders(run, 400))
    assert call(team.teammate)[1]["deleted"] == [{"step": 400, "bytes": unpinned}]  # no longer pinned: it goes
    Run.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED)
    status, body = call(team.teammate)
    assert status == 409 and body["detail"].startswith(f"run {run.public_id} is queued: its engine restores")
    described = build_document()["paths"]["/api/v1/projects/{slug}/runs/{run_id}/checkpoints/prune/"]["post"]
    assert described["requestBody"]["required"] is False and {"200", "400", "409"} <= set(described["responses"])


def test_a_resume_after_pruning_goes_on_from_the_newest_kept(team, catalog, sent_tasks,
                                                            django_capture_on_commit_callbacks):
    """Through orbax, as the engine restores: the steps left are listed and the newest restored."""
    import jax.numpy as jnp

    from jaxengine.trainer import Checkpoints
    from tests.webapp.runs.conftest import sft_spec

    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name=NAME)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED, current_step=4)
    checkpoints = Checkpoints(run.output_dir / "checkpoints", keep_last=5)
    try:
        for step in (1, 2, 3, 4):
            checkpoints.save(step, [jnp.full((4,), float(step))], {"step": step})
    finally:
        checkpoints.close()
    evaluated(run, {1: 2.0, 2: 1.0, 3: 1.5, 4: 1.75})
    run.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        pruned = services.checkpoints_prune(run=run, user=team.teammate)
    assert [deleted.step for deleted in pruned.deleted] == [1, 3]
    reopened = Checkpoints(run.output_dir / "checkpoints", keep_last=5)
    try:
        assert reopened.steps() == [2, 4]
        leaves, meta = reopened.restore(4, [jnp.zeros((4,))])
        assert meta["step"] == 4 and float(leaves[0][0]) == 4.0
    finally:
        reopened.close()
    services.run_resume(run=run, user=team.teammate)
    assert run.log_lines.order_by("-id").first().message.endswith("; continuing from checkpoint 4")


def prunable(page, run):
    """The Storage page's *Pruning frees* cell of ``run``."""
    row = page.split(f'<tr data-run="{run.public_id}">')[1].split("</tr>")[0]
    return row.split('<td class="num prunable">')[1].split("</td>")[0]


def test_the_storage_page_prunes_every_ended_run_and_skips_the_active_ones(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    ended = scored_run(team, catalog)
    running = ended_run(team, catalog, steps=(100, 200))
    Run.objects.filter(pk=running.pk).update(status=RunStatus.RUNNING)
    single = ended_run(team, catalog, steps=(100,))
    going = du_bytes(*checkpoint_folders(ended, 100, 300, 400))
    owner = client_for(team.owner)
    page = html.unescape(owner.get("/p/alpha/storage/").content.decode())
    assert f'data-bytes="{going}"' in prunable(page, ended) and "(3)" in prunable(page, ended)
    assert ">active<" in prunable(page, running) and prunable(page, single) == "—"
    form = page.split('id="storage-prune"')[1].split("</details>")[0]
    assert "Deletes 3 training checkpoints of 1 run from the server for good, freeing " in form
    assert f'data-bytes="{going}"' in form
    assert f"Skipped, still active: <bdi>{NAME}</bdi> ({running.public_id})." in form
    # Owners only: a member sees no form and is refused; an outsider finds no project.
    member = client_for(team.teammate)
    assert 'id="storage-prune"' not in member.get("/p/alpha/storage/").content.decode()
    assert member.post("/p/alpha/storage/prune/").status_code == 403
    assert client_for(team.outsider).post("/p/alpha/storage/prune/").status_code == 404
    assert services.checkpoint_steps(ended) == list(STEPS)
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.post("/p/alpha/storage/prune/", {
            "submission_token": form_token(page, after='id="storage-prune"')})
    assert response.status_code == 302 and response["Location"] == "/p/alpha/storage/"
    # Queued on the default queue (hundreds of runs take seconds: bench/RESULTS.md); the worker runs it.
    prune = ProjectCheckpointPrune.objects.get(project=team.project)
    assert sent_tasks.calls == [(services.PRUNE_PROJECT_TASK, [team.project.pk, team.owner.pk, prune.pk], "default")]
    page = html.unescape(owner.get(response["Location"]).content.decode())
    assert "Pruning the checkpoints of this project's ended runs in the background" in page
    assert "Pruning…</strong> waiting for a worker" in page
    assert f"Skipped, still active: {isolated(NAME)} ({running.public_id}). Prune them once they have ended." in page
    assert services.checkpoint_steps(ended) == list(STEPS)
    with django_capture_on_commit_callbacks(execute=True):
        prune_project_checkpoints(*sent_tasks.calls[0][1])
    assert services.checkpoint_steps(ended) == [200, 500] and trash_folders(ended) == []
    page = html.unescape(owner.get("/p/alpha/storage/").content.decode())
    assert services.checkpoint_steps(running) == [100, 200] and services.checkpoint_steps(single) == [100]
    assert 'id="storage-prune"' not in page  # nothing left to prune


def test_the_storage_api_says_what_pruning_would_free(team, catalog, sent_tasks):
    run = scored_run(team, catalog)
    _token, secret = token_create(user=team.viewer, name="script")
    answer = Client(HTTP_AUTHORIZATION=f"Bearer {secret}").get("/api/v1/projects/alpha/storage/").json()
    row = next(row for row in answer["runs"] if row["id"] == run.public_id)
    assert row["prunable_bytes"] == du_bytes(*checkpoint_folders(run, 100, 300, 400))


def test_the_project_wide_prune_says_which_active_runs_it_skipped(team, catalog, sent_tasks,
                                                                  django_capture_on_commit_callbacks):
    ended = scored_run(team, catalog)
    stopping = ended_run(team, catalog, steps=(100, 200))
    Run.objects.filter(pk=stopping.pk).update(status=RunStatus.RUNNING, cancel_requested=True)
    with django_capture_on_commit_callbacks(execute=True):
        result = services.project_checkpoints_prune(project=team.project, user=team.owner)
    assert [(run.pk, [deleted.step for deleted in pruned.deleted]) for run, pruned in result.pruned] == [
        (ended.pk, [100, 300, 400])]
    assert [(run.pk, why.split(":")[0]) for run, why in result.skipped] == [
        (stopping.pk, f"run {stopping.public_id} is stopping")]
    assert result.checkpoints == 3 and result.bytes_freed > 0
    assert services.checkpoint_steps(stopping) == [100, 200]


def prune_state(client) -> str:
    """The Storage page's prune partial as static/serving_copy.js asks for it again, unescaped."""
    response = client.get("/p/alpha/storage/prune/state/")
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def test_the_storage_page_follows_the_prune_says_what_it_freed_and_refuses_a_second_meanwhile(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """The project-wide prune ran out of sight: the page said nothing of it while it ran or after. Its row says
    "Pruning… N of M runs" while the task goes, then what it freed, when, asked by whom, and the runs it left with
    why; a second prune asked for meanwhile (from a page opened before) is refused saying so, nothing queued."""
    ended = scored_run(team, catalog)
    other = ended_run(team, catalog, steps=(100, 200))
    running = ended_run(team, catalog, steps=(100, 200))
    Run.objects.filter(pk=running.pk).update(status=RunStatus.RUNNING)
    going = du_bytes(*checkpoint_folders(ended, 100, 300, 400), *checkpoint_folders(other, 100))
    owner = client_for(team.owner)
    first_tab, second_tab = (owner.get("/p/alpha/storage/").content.decode() for _ in range(2))
    assert 'id="storage-prune-state"' in first_tab and "Pruning…" not in first_tab
    with django_capture_on_commit_callbacks(execute=True):
        owner.post("/p/alpha/storage/prune/", {"submission_token": form_token(first_tab, after='id="storage-prune"')})
    with django_capture_on_commit_callbacks(execute=True):
        refused = owner.post("/p/alpha/storage/prune/", {
            "submission_token": form_token(second_tab, after='id="storage-prune"')}, follow=True)
    assert len(sent_tasks.calls) == 1 and ProjectCheckpointPrune.objects.count() == 1
    said = html.unescape(refused.content.decode())
    assert (f"The checkpoints of this project's ended runs are being pruned already (asked by "
            f"{team.owner.username} ") in said
    assert "waiting for a worker): wait for it to finish, then prune again if need be." in said
    assert 'id="storage-prune"' not in said, "no prune form while one is queued"
    prune = ProjectCheckpointPrune.objects.get()

    # Where the task is after its first run, as it writes it: the page says how far it has gone.
    services._prune_recorded(prune, runs_total=3, runs_done=1)
    for client in (owner, client_for(team.viewer)):
        state = prune_state(client)
        assert "data-in-progress" in state and "Pruning…</strong> 1 of 3 runs" in state
        assert f"asked by <bdi>{team.owner.username}</bdi>" in state
    assert client_for(team.outsider).get("/p/alpha/storage/prune/state/").status_code == 404

    with django_capture_on_commit_callbacks(execute=True):
        prune_project_checkpoints(*sent_tasks.calls[0][1])
    prune.refresh_from_db()
    assert (prune.runs_total, prune.runs_done, prune.checkpoints_deleted, prune.bytes_freed) == (3, 3, 4, going)
    assert prune.finished_at is not None
    assert [(failure["run"], failure["why"].split(":")[0]) for failure in prune.failures] == [
        (running.public_id, f"run {running.public_id} is running")]
    page = owner.get("/p/alpha/storage/").content.decode()
    state = page.split('id="storage-prune-state"')[1].split("</div>")[0]
    assert "data-in-progress" not in state
    assert f'data-bytes="{going}"' in state and "4 checkpoints deleted over 3 runs weighed, finished " in state
    assert f"asked by <bdi>{team.owner.username}</bdi>" in state
    # The run's name is escaped where the page says why it was left.
    assert f"Left <bdi>{html.escape(NAME)}</bdi> ({running.public_id}): run {running.public_id} is running" in state


def test_a_prune_whose_worker_was_lost_no_longer_refuses_the_next(team, catalog, client_for, sent_tasks,
                                                                  django_capture_on_commit_callbacks):
    scored_run(team, catalog)
    stalled = ProjectCheckpointPrune.objects.create(project=team.project, requested_by=team.owner, runs_total=4,
                                                    runs_done=1)
    owner = client_for(team.owner)
    assert "Pruning…</strong> 1 of 4 runs" in prune_state(owner)
    ProjectCheckpointPrune.objects.filter(pk=stalled.pk).update(
        updated_at=stalled.updated_at - services.PRUNE_STALLED_AFTER)
    assert "stopped after 1 of 4 runs without finishing" in prune_state(owner)
    ProjectCheckpointPrune.objects.filter(pk=stalled.pk).update(runs_total=None)  # no worker ever took it
    assert "was never started: no worker of the <code>default</code> queue took it" in prune_state(owner)
    page = owner.get("/p/alpha/storage/").content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        owner.post("/p/alpha/storage/prune/", {"submission_token": form_token(page, after='id="storage-prune"')})
    assert len(sent_tasks.calls) == 1 and ProjectCheckpointPrune.objects.count() == 2


def test_a_lost_prune_of_one_run_says_run_not_runs(team, catalog, client_for, sent_tasks):
    stalled = ProjectCheckpointPrune.objects.create(project=team.project, requested_by=team.owner, runs_total=1)
    ProjectCheckpointPrune.objects.filter(pk=stalled.pk).update(
        updated_at=stalled.updated_at - services.PRUNE_STALLED_AFTER)
    assert "stopped after 0 of 1 run without finishing" in prune_state(client_for(team.owner))
