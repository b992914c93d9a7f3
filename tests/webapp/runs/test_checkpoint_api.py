"""The REST API's checkpoints of a run: ``GET runs/<id>/checkpoints/`` lists them as the run page's Checkpoints does
(on real folders: disk as du counts it, export, score, serving copy, what a deletion would change), and ``POST
runs/<id>/checkpoints/<step>/export/`` exports one as a starting model as the page's *Export as a starting model*
does: queued on the train queue, its refusals, its Idempotency-Key, who may; and ``POST
runs/<id>/checkpoints/<step>/serving-copy/`` makes an exported one's serving copy as the page's button beside it."""
import json

from django.test import Client
from pydantic import TypeAdapter

from tests.webapp.factories import du_bytes
from tests.webapp.runs.test_checkpoint_deletion import item, url
from tests.webapp.runs.test_checkpoint_prune import scored_run
from webapp.api import schemas
from webapp.api.openapi import build_document
from webapp.api.services import token_create
from webapp.runs import selectors, serving_copies, services
from webapp.runs.models import (Artifact, ArtifactKind, CheckpointExport, Run, RunStatus, ServingCopy,
                                ServingCopyStatus)

PATHS = "/api/v1/projects/{slug}/runs/{run_id}/"


def api_call(user, method, path, body=None, *, headers=None, capture=None):
    """``method path`` under the project's API with a new token of ``user``: its status and JSON answer (None for
    none), its Idempotent-Replayed header; queued tasks sent at commit when ``capture`` is given."""
    _token, secret = token_create(user=user, name="script")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    send = getattr(client, method.lower())

    def answer():
        return send(f"/api/v1/projects/alpha/{path}", json.dumps(body) if body is not None else "",
                    content_type="application/json", headers=headers or {})

    if capture is None:
        response = answer()
    else:
        with capture(execute=True):
            response = answer()
    return response.status_code, json.loads(response.content or b"null"), response.get("Idempotent-Replayed")


def as_documented(template, method, status, answer):
    """``answer`` validated strictly, no key left over, against the schema the OpenAPI document gives it."""
    schema = build_document()["paths"][PATHS + template][method]["responses"][str(status)]
    name = schema["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    TypeAdapter(getattr(schemas, name)).validate_json(json.dumps(answer))
    return answer


def exported(run, step):
    """Checkpoint ``step`` exported as the train queue's worker records it, into a real folder."""
    folder = run.output_dir / f"export-step-{step}"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    services.checkpoint_export_request(run=run, step=step, user=None)
    services.checkpoint_export_finish(run=run, step=step, export_dir=folder)


def test_the_api_lists_checkpoints_with_the_facts_the_run_page_shows(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    run = scored_run(team, catalog)  # checkpoints 100…500 of the teammate's, the best by eval/loss at 200
    exported(run, 300)
    services.checkpoint_export_request(run=run, step=400, user=team.teammate)  # still exporting
    services.checkpoint_export_request(run=run, step=100, user=team.teammate)
    services.checkpoint_export_finish(run=run, step=100, failure="the worker ran out of memory")
    path = f"runs/{run.public_id}/checkpoints/"
    status, answer, _replayed = api_call(team.teammate, "GET", path)
    assert status == 200
    listed = {checkpoint["step"]: checkpoint for checkpoint in as_documented("checkpoints/", "get", 200,
                                                                             answer)["checkpoints"]}
    assert list(listed) == [100, 200, 300, 400, 500]
    page = {checkpoint["step"]: checkpoint for checkpoint in selectors.checkpoint_list(run=run, deletions=True)}
    for step, checkpoint in listed.items():
        folder = run.output_dir / "checkpoints" / str(step)
        assert checkpoint["size_bytes"] == du_bytes(folder)
        assert checkpoint["saved_at"] == page[step]["saved_at"].isoformat()
        assert checkpoint["final"] is False
        # What deleting it would change, word for word as the page's confirmation says it.
        assert checkpoint["deletion"] == page[step]["deletion"]
        for note in checkpoint["deletion"]["notes"]:
            assert note.replace("'", "&#x27;") in item(client_for(team.teammate).get(url(run)).content.decode(), step)
    assert listed[300]["model"] == f"{run.public_id}@300"
    assert listed[300]["download_url"].endswith(f"/runs/{run.public_id}/artifacts/checkpoint/?step=300")
    assert listed[300]["export"] == {"status": "exported", "error_message": "", "notice": ""}
    assert listed[300]["serving_copy"] == {"state": "none", "scheme": "", "served": "", "message": ""}
    assert listed[300]["deletion"]["notes"][0] == (f"Its export stays: runs, the chat and downloads go on using "
                                                   f"{run.public_id}@300.")
    assert listed[400]["export"]["status"] == "exporting" and listed[400]["model"] is None
    assert listed[400]["deletion"]["refusal"].startswith(f"checkpoint 400 of run {run.public_id} is being exported")
    assert listed[100]["export"] == {"status": "failed", "error_message": "the worker ran out of memory", "notice": ""}
    assert listed[200]["export"] is None and listed[200]["serving_copy"] is None and listed[200]["download_url"] is None
    assert listed[200]["score"] == {"metric": "eval/loss", "value": 1.0, "at": 200, "best": True}
    assert listed[500]["score"] == {"metric": "eval/loss", "value": 1.75, "at": 500, "best": False}
    # A viewer reads the same list, without what deleting would do (they may not); an outsider nothing.
    status, seen, _replayed = api_call(team.viewer, "GET", path)
    assert status == 200 and [checkpoint["deletion"] for checkpoint in seen["checkpoints"]] == [None] * 5
    assert [{**checkpoint, "deletion": None} for checkpoint in answer["checkpoints"]] == seen["checkpoints"]
    assert api_call(team.outsider, "GET", path)[0] == 404
    # The training checkpoint of the export deleted: still listed, as its export, with no folder to measure.
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_delete(run=run, step=300, user=team.teammate)
    gone = api_call(team.teammate, "GET", path)[1]["checkpoints"][2]
    assert (gone["step"], gone["size_bytes"], gone["saved_at"], gone["deletion"], gone["model"]) == (
        300, None, None, None, f"{run.public_id}@300")


def test_the_final_model_is_listed_as_the_run_it_is_started_from(team, catalog, sent_tasks):
    run = scored_run(team, catalog, status=RunStatus.SUCCEEDED)
    final = run.output_dir / "export"
    final.mkdir()
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=500, path=str(final), size_bytes=0)
    status, answer, _replayed = api_call(team.teammate, "GET", f"runs/{run.public_id}/checkpoints/")
    last = answer["checkpoints"][-1]
    assert status == 200 and (last["step"], last["final"], last["model"], last["export"]) == (
        500, True, run.public_id, None)
    status, refused, _replayed = api_call(team.teammate, "POST", f"runs/{run.public_id}/checkpoints/500/export/")
    assert (status, refused) == (409, {"detail": f"checkpoint 500 of {run.public_id} is the run's final model, "
                                                 f"exported when it succeeded: start runs from {run.public_id}"})


def test_the_api_exports_a_checkpoint_on_the_train_queue_once(team, catalog, sent_tasks,
                                                              django_capture_on_commit_callbacks):
    run = scored_run(team, catalog)
    path = f"runs/{run.public_id}/checkpoints/300/export/"
    key = {"Idempotency-Key": "export-300"}
    status, answer, replayed = api_call(team.teammate, "POST", path, headers=key,
                                        capture=django_capture_on_commit_callbacks)
    assert (status, replayed) == (202, None)
    assert as_documented("checkpoints/{step}/export/", "post", 202, answer) == {
        "step": 300, "model": f"{run.public_id}@300",
        "export": {"status": "exporting", "error_message": "", "notice": ""}}
    assert sent_tasks.calls == [(services.EXPORT_CHECKPOINT_TASK, [run.pk, 300], services.EXPORT_CHECKPOINT_QUEUE)]
    assert CheckpointExport.objects.get(run=run, step=300).requested_by == team.teammate
    # Sent again with its key (a retry after a lost answer): the export as it stands, nothing queued again.
    assert api_call(team.teammate, "POST", path, headers=key, capture=django_capture_on_commit_callbacks) == (
        202, answer, "true")
    # Without it, refused as the page refuses a second export while the first runs.
    status, refused, _replayed = api_call(team.teammate, "POST", path, capture=django_capture_on_commit_callbacks)
    assert (status, refused) == (409, {"detail": f"checkpoint 300 of {run.public_id} is being exported; it is listed "
                                                 "on the run's page once it is done"})
    as_documented("checkpoints/{step}/export/", "post", 409, refused)
    assert len(sent_tasks.calls) == 1
    # Exported: refused; failed: asked for again.
    services.checkpoint_export_finish(run=run, step=300, export_dir=run.output_dir / "export-step-300")
    assert api_call(team.teammate, "POST", path)[1] == {
        "detail": f"checkpoint 300 of {run.public_id} is already exported"}
    services.checkpoint_export_request(run=run, step=200, user=team.teammate)
    services.checkpoint_export_finish(run=run, step=200, failure="killed")
    status, again, _replayed = api_call(team.teammate, "POST", f"runs/{run.public_id}/checkpoints/200/export/",
                                        capture=django_capture_on_commit_callbacks)
    assert (status, again["export"]) == (202, {"status": "exporting", "error_message": "", "notice": ""})
    assert sent_tasks.calls[-1] == (services.EXPORT_CHECKPOINT_TASK, [run.pk, 200], services.EXPORT_CHECKPOINT_QUEUE)


def test_an_export_the_run_cannot_give_is_refused_saying_why(team, catalog, sent_tasks,
                                                            django_capture_on_commit_callbacks):
    run = scored_run(team, catalog)
    status, unknown, _replayed = api_call(team.teammate, "POST", f"runs/{run.public_id}/checkpoints/250/export/")
    assert (status, unknown) == (404, {"detail": f"run {run.public_id} has no checkpoint 250; it has 100, 200, 300, "
                                                 "400, 500"})
    status, body_refused, _replayed = api_call(team.teammate, "POST", f"runs/{run.public_id}/checkpoints/300/export/",
                                               {"step": 400})
    assert status == 400 and list(body_refused["errors"]) == ["step"]
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    status, refused, _replayed = api_call(team.teammate, "POST", f"runs/{run.public_id}/checkpoints/300/export/",
                                          capture=django_capture_on_commit_callbacks)
    assert (status, refused) == (409, {"detail": f"run {run.public_id} is running; export checkpoints of finished "
                                                 "runs"})
    assert sent_tasks.calls == [] and not CheckpointExport.objects.filter(run=run).exists()


def test_exporting_a_step_exported_whose_training_checkpoint_was_deleted_answers_as_exported(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    """Its export is there (listed, served, downloaded): asked again it was a 404, "no checkpoint 300", as if the
    step were unknown; it answers as for any exported step, a 409 saying so, nothing queued. A step neither in
    the folder nor exported stays a 404 naming those there are, exported ones included."""
    run = scored_run(team, catalog)
    exported(run, 300)
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_delete(run=run, step=300, user=team.teammate)
    assert 300 not in services.checkpoint_steps(run)
    sent_before = len(sent_tasks.calls)
    status, refused, _replayed = api_call(team.teammate, "POST", f"runs/{run.public_id}/checkpoints/300/export/",
                                          capture=django_capture_on_commit_callbacks)
    assert (status, refused) == (409, {"detail": f"checkpoint 300 of {run.public_id} is already exported"})
    as_documented("checkpoints/{step}/export/", "post", 409, refused)
    status, unknown, _replayed = api_call(team.teammate, "POST", f"runs/{run.public_id}/checkpoints/250/export/")
    assert (status, unknown) == (404, {"detail": f"run {run.public_id} has no checkpoint 250; it has 100, 200, 300, "
                                                 "400, 500"})
    assert len(sent_tasks.calls) == sent_before


def test_who_may_export_through_the_api(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    """As the page: a member exports a teammate's run's checkpoint (not only who may delete it); a viewer 403, an
    outsider 404, nothing queued."""
    owners = scored_run(team, catalog, user=team.owner)
    path = f"runs/{owners.public_id}/checkpoints/300/export/"
    assert api_call(team.viewer, "POST", path, capture=django_capture_on_commit_callbacks)[0] == 403
    assert api_call(team.outsider, "POST", path, capture=django_capture_on_commit_callbacks)[0] == 404
    assert api_call(team.outsider, "POST", f"runs/{owners.public_id}/checkpoints/250/export/")[0] == 404
    assert sent_tasks.calls == [] and not CheckpointExport.objects.exists()
    assert api_call(team.teammate, "POST", path, capture=django_capture_on_commit_callbacks)[0] == 202
    assert len(sent_tasks.calls) == 1


def test_the_api_makes_an_exported_checkpoints_serving_copy_once(team, catalog, sent_tasks,
                                                                django_capture_on_commit_callbacks):
    run = scored_run(team, catalog)
    exported(run, 300)
    path = f"runs/{run.public_id}/checkpoints/300/serving-copy/"
    key = {"Idempotency-Key": "copy-300"}
    assert api_call(team.viewer, "POST", path, capture=django_capture_on_commit_callbacks)[0] == 403
    assert api_call(team.outsider, "POST", path, capture=django_capture_on_commit_callbacks)[0] == 404
    status, refused, _replayed = api_call(team.teammate, "POST", path, {"scheme": "int3"})
    assert status == 400 and list(refused["errors"]) == ["scheme"] and "int8" in refused["errors"]["scheme"][0]
    assert sent_tasks.calls == [] and not ServingCopy.objects.exists()
    status, answer, replayed = api_call(team.teammate, "POST", path, {"scheme": "int4"}, headers=key,
                                        capture=django_capture_on_commit_callbacks)
    assert (status, replayed) == (202, None)
    assert as_documented("checkpoints/{step}/serving-copy/", "post", 202, answer) == {
        "step": 300, "queued": True, "serving_copy": {"state": "writing", "scheme": "int4", "served": "", "message": ""}}
    copy = ServingCopy.objects.get(run=run, step=300)
    assert (copy.status, copy.scheme, copy.requested_by) == (ServingCopyStatus.WRITING, "int4", team.teammate)
    assert sent_tasks.calls == [(serving_copies.MAKE_COPY_TASK, [copy.pk], serving_copies.MAKE_COPY_QUEUE)]
    # A repeat with its key, and a second asking while it is written: nothing more queued.
    assert api_call(team.teammate, "POST", path, {"scheme": "int4"}, headers=key,
                    capture=django_capture_on_commit_callbacks) == (202, answer, "true")
    status, again, _replayed = api_call(team.teammate, "POST", path, capture=django_capture_on_commit_callbacks)
    assert (status, again["queued"], again["serving_copy"]["state"]) == (202, False, "writing")
    assert len(sent_tasks.calls) == 1
    listed = api_call(team.viewer, "GET", f"runs/{run.public_id}/checkpoints/")[1]["checkpoints"][2]
    assert listed["serving_copy"] == answer["serving_copy"]


def test_a_serving_copy_the_checkpoint_cannot_have_is_refused_saying_why(team, catalog, sent_tasks,
                                                                        django_capture_on_commit_callbacks):
    run = scored_run(team, catalog)
    status, refused, _replayed = api_call(team.teammate, "POST", f"runs/{run.public_id}/checkpoints/300/serving-copy/",
                                          capture=django_capture_on_commit_callbacks)
    assert (status, refused) == (409, {"detail": f"checkpoint 300 of {run.public_id} is not exported; export it as a "
                                                 "starting model first, then make its serving copy"})
    as_documented("checkpoints/{step}/serving-copy/", "post", 409, refused)
    status, unknown, _replayed = api_call(team.teammate, "POST", f"runs/{run.public_id}/checkpoints/250/serving-copy/")
    assert (status, unknown) == (404, {"detail": f"run {run.public_id} has no checkpoint 250; it has 100, 200, 300, "
                                                 "400, 500"})
    assert sent_tasks.calls == [] and not ServingCopy.objects.exists()
