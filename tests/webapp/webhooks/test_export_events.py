"""The export events, end to end against a real HTTP server: a run's checkpoint export and a serving copy ending send
``export.ready`` or ``export.failed``, a review campaign's export ending sends ``review.exported``; each once per end
(a redelivered report of the same end sends nothing more), only to the hooks subscribed to it; and the Webhooks page
offers them, grouped."""
from __future__ import annotations

import pytest
from django.utils.html import escape

from tests.webapp.factories import make_base_model
from tests.webapp.review.conftest import answer, campaign, carol, preference_version  # noqa: F401
from tests.webapp.webhooks.conftest import SITE, hook
from tests.webapp.webhooks.test_webhooks import spec
from webapp.review import services as review_services
from webapp.review.models import ExportStatus, Item
from webapp.runs import serving_copies
from webapp.runs import services as run_services
from webapp.runs.models import CheckpointExport, Run, RunStatus, ServingCopy
from webapp.webhooks.models import EVENT_GROUPS, Webhook
from worker.tasks.datasets import validate_dataset_version


@pytest.fixture
def finished_run(team, sent):
    run = run_services.run_create(project=team.project, spec=spec(team.project), user=team.owner, name="<b>first</b>")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    run.refresh_from_db()
    return run


@pytest.fixture
def export_hooks(team, receiver):
    """A hook for each end, one for review exports only, and another project's: only the first two hear exports."""
    hook(team.project, receiver, "/ready", ["export.ready"])
    hook(team.project, receiver, "/failed", ["export.failed"])
    hook(team.project, receiver, "/review", ["review.exported"])
    hook(team.outsider_project, receiver, "/elsewhere", ["export.ready", "export.failed", "review.exported"])


def sent_objects(receiver) -> list[tuple[str, str, dict]]:
    return [(received.path, received.json["event"], received.json["object"]) for received in receiver.requests]


def test_a_checkpoint_export_ending_sends_export_ready_or_failed_once(
        team, finished_run, receiver, export_hooks, tmp_path, django_capture_on_commit_callbacks):
    run = finished_run
    for step in (3, 6):
        CheckpointExport.objects.create(run=run, step=step)  # as checkpoint_export_request leaves them
    (tmp_path / "export-step-3").mkdir()
    (tmp_path / "export-step-3" / "config.json").write_text("{}")
    with django_capture_on_commit_callbacks(execute=True):
        run_services.checkpoint_export_finish(run=run, step=3, export_dir=tmp_path / "export-step-3")
    with django_capture_on_commit_callbacks(execute=True):  # the worker's message delivered again: no second end
        run_services.checkpoint_export_finish(run=run, step=3, export_dir=tmp_path / "export-step-3")
    with django_capture_on_commit_callbacks(execute=True):
        run_services.checkpoint_export_finish(run=run, step=6, error=MemoryError("out of host memory"))

    (ready_path, ready_event, ready), (failed_path, failed_event, failed) = sent_objects(receiver)
    assert (ready_path, ready_event, failed_path, failed_event) == ("/ready", "export.ready", "/failed",
                                                                  "export.failed")
    assert ready == {"type": "checkpoint_export", "id": f"{run.public_id}@3", "name": "<b>first</b> checkpoint 3",
                     "status": "exported", "run": run.public_id, "step": 3, "model": f"{run.public_id}@3",
                     "url": f"{SITE}/p/alpha/runs/{run.public_id}/", "error": ""}
    assert (failed["id"], failed["status"], failed["step"], failed["model"]) == (
        f"{run.public_id}@6", "failed", 6, None)
    assert failed["error"] == "MemoryError: out of host memory"


def test_a_serving_copy_written_or_failed_sends_export_ready_or_failed_once(
        team, finished_run, receiver, export_hooks, django_capture_on_commit_callbacks):
    run, base_model = finished_run, make_base_model(team.project, name="tiny-base", path="/models/tiny-base")
    of_checkpoint = ServingCopy.objects.create(project=team.project, run=run, step=3, scheme="int8")
    of_base_model = ServingCopy.objects.create(project=team.project, base_model=base_model, scheme="int4")
    for copy_pk, error in ((of_checkpoint.pk, None), (of_base_model.pk, MemoryError("the host ran out of memory")),
                           (of_base_model.pk, MemoryError("the host ran out of memory"))):  # the last: redelivered
        with django_capture_on_commit_callbacks(execute=True):
            serving_copies.serving_copy_finish(copy_pk=copy_pk, error=error)

    (ready_path, ready_event, ready), (failed_path, failed_event, failed) = sent_objects(receiver)
    assert (ready_path, ready_event, failed_path, failed_event) == ("/ready", "export.ready", "/failed",
                                                                  "export.failed")
    assert ready == {"type": "serving_copy", "id": f"{run.public_id}@3", "name": "<b>first</b> checkpoint 3 (int8)",
                     "status": "ready", "scheme": "int8", "run": run.public_id, "step": 3, "base_model": None,
                     "url": f"{SITE}/p/alpha/runs/{run.public_id}/", "error": ""}
    assert failed == {"type": "serving_copy", "id": base_model.public_id, "name": "tiny-base (int4)",
                      "status": "failed", "scheme": "int4", "run": None, "step": None,
                      "base_model": base_model.public_id, "url": f"{SITE}/p/alpha/models/{base_model.public_id}/",
                      "error": "MemoryError: the host ran out of memory"}


def test_a_serving_copy_the_pages_give_up_on_sends_export_failed_once(
        team, finished_run, receiver, export_hooks, monkeypatch, settings, tmp_path,
        django_capture_on_commit_callbacks):
    """A copy whose writer was lost is failed by the page that shows it (so is a run's automatic copy, which then gets
    its row): that end was silent, where the worker's report of a failure sent ``export.failed``."""
    from datetime import timedelta

    from django.utils import timezone

    settings.DATA_ROOT = tmp_path
    run = finished_run
    monkeypatch.setattr(run_services, "held_task_messages", lambda **kwargs: set())  # Redis holds no such task
    copy = ServingCopy.objects.create(project=team.project, run=run, step=3, scheme="int8")
    ServingCopy.objects.filter(pk=copy.pk).update(updated_at=timezone.now() - timedelta(hours=2))
    for _page_load in range(2):  # the second: the page shown again, the copy failed already
        with django_capture_on_commit_callbacks(execute=True):
            serving_copies.serving_copies_give_up_stale(copies=[ServingCopy.objects.get(pk=copy.pk)])
    (run.output_dir / "export").mkdir(parents=True)
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(hours=1))
    run.refresh_from_db()
    for _page_load in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            state = serving_copies.final_serving_copy(run=run, automatic_scheme="int8")
    assert state["state"] == "failed"

    (stale_path, stale_event, stale), (automatic_path, automatic_event, automatic) = sent_objects(receiver)
    assert (stale_path, stale_event, automatic_path, automatic_event) == ("/failed", "export.failed", "/failed",
                                                                          "export.failed")
    assert (stale["id"], stale["status"], stale["step"]) == (f"{run.public_id}@3", "failed", 3)
    assert stale["error"].startswith("the worker never finished writing this copy: 120 minutes after")
    assert (automatic["id"], automatic["name"], automatic["status"]) == (
        run.public_id, "<b>first</b> final model (int8)", "failed")
    assert automatic["error"].startswith("the worker never finished writing this copy: 60 minutes after")


def test_the_slack_line_of_an_export_names_it_escaped_with_its_error(
        team, finished_run, receiver, sent, django_capture_on_commit_callbacks):
    hook(team.project, receiver, "/slack", ["export.failed"], format="slack")
    copy = ServingCopy.objects.create(project=team.project, run=finished_run, step=None, scheme="int8")
    with django_capture_on_commit_callbacks(execute=True):
        serving_copies.serving_copy_finish(copy_pk=copy.pk, error="the <engine> gave up")
    assert receiver.requests[0].json == {"text": (
        f"[alpha] Serving copy <{SITE}/p/alpha/runs/{finished_run.public_id}/|&lt;b&gt;first&lt;/b&gt; final model "
        "(int8)> failed: the &lt;engine&gt; gave up")}


def reviewed(campaign, team, carol, labels: dict[int, str]):  # noqa: F811 (the review tests' fixtures)
    items = {item.sequence: item for item in Item.objects.filter(campaign=campaign)}
    for sequence, label in labels.items():
        for reviewer in (team.teammate, carol):
            answer(items[sequence], reviewer, label)


def test_a_review_export_that_became_a_ready_dataset_version_sends_review_exported_once(
        team, campaign, carol, receiver, export_hooks, sent, django_capture_on_commit_callbacks):  # noqa: F811
    reviewed(campaign, team, carol, {1: "a"})
    with django_capture_on_commit_callbacks(execute=True):
        export = review_services.export_create(campaign=campaign, user=team.owner,
                                               options=review_services.ExportOptions(dataset_name="prefs reviewed"))
    with django_capture_on_commit_callbacks(execute=True):
        export = review_services.export_write(export_id=export.pk)
    assert export.status == ExportStatus.VALIDATING and receiver.requests == []  # not ended: its version is checked
    for _check in range(2):  # the second: the check's message delivered again
        with django_capture_on_commit_callbacks(execute=True):
            validate_dataset_version(export.version.pk)  # the worker's task: the check, then the export settled

    (path, event, sent_object), = sent_objects(receiver)
    version = export.version
    assert (path, event) == ("/review", "review.exported")
    assert sent_object == {"type": "review_export", "id": campaign.public_id, "name": "pass 1", "status": "done",
                           "dataset": "prefs reviewed",
                           "dataset_version": {"id": version.public_id, "name": "prefs reviewed v1"},
                           "url": f"{SITE}/p/alpha/review/{campaign.public_id}/", "error": ""}


def test_the_slack_line_of_a_review_export_done_names_the_dataset_version_it_made(
        team, campaign, carol, receiver, sent, django_capture_on_commit_callbacks):  # noqa: F811
    """The JSON named the version made; the Slack line said only "done", so a chat reader had to open the page."""
    hook(team.project, receiver, "/slack", ["review.exported"], format="slack")
    reviewed(campaign, team, carol, {1: "a"})
    with django_capture_on_commit_callbacks(execute=True):
        export = review_services.export_create(campaign=campaign, user=team.owner,
                                               options=review_services.ExportOptions(dataset_name="<i>prefs</i>"))
    with django_capture_on_commit_callbacks(execute=True):
        export = review_services.export_write(export_id=export.pk)
    with django_capture_on_commit_callbacks(execute=True):
        validate_dataset_version(export.version.pk)
    assert receiver.requests[0].json == {"text": (
        f"[alpha] Export of review campaign <{SITE}/p/alpha/review/{campaign.public_id}/|pass 1> done: dataset version "
        "&lt;i&gt;prefs&lt;/i&gt; v1")}


def test_a_review_export_that_could_not_be_written_sends_review_exported_failed_once(
        team, campaign, carol, receiver, export_hooks, sent, django_capture_on_commit_callbacks):  # noqa: F811
    reviewed(campaign, team, carol, {1: "tie"})  # dropped: no pair is left to write
    export = review_services.export_create(campaign=campaign, user=team.owner,
                                           options=review_services.ExportOptions(dataset_name="prefs reviewed"))
    for _attempt in range(2):  # the second: the worker's message delivered again
        with django_capture_on_commit_callbacks(execute=True):
            written = review_services.export_write(export_id=export.pk)
    assert written.status == ExportStatus.FAILED and written.counts["tie"] == 1  # its figures kept with the failure

    (path, event, sent_object), = sent_objects(receiver)
    assert (path, event, sent_object["status"], sent_object["dataset_version"]) == (
        "/review", "review.exported", "failed", None)
    assert sent_object["error"].startswith("no pair was left to write")


def test_the_page_offers_the_events_grouped_each_with_its_line_and_saves_them(team, client_for):
    owner = client_for(team.owner)
    page = owner.get("/p/alpha/webhooks/").content.decode()
    heads = [page.index(f"<label>{group}</label>") for group in EVENT_GROUPS]
    assert heads == sorted(heads)
    for head, next_head, events in zip(heads, [*heads[1:], len(page)], EVENT_GROUPS.values()):
        for event, line in events.items():  # under its group's head, with its line
            assert head < page.index(f'value="{event}"') < next_head and escape(line) in page
    added = owner.post("/p/alpha/webhooks/", {"url": "https://example.org/hook", "format": "json", "active": "on",
                                              "events": ["review.exported", "export.failed", "export.ready"]})
    assert added.status_code == 302
    assert Webhook.objects.get().events == ["export.ready", "export.failed", "review.exported"]


def test_a_runs_automatic_serving_copy_sends_export_ready_or_failed_as_one_asked_for_does(
        team, finished_run, receiver, export_hooks, settings, tmp_path, django_capture_on_commit_callbacks):
    """QA: the copy written when a run succeeds (``quantize_run``, which has no row) ended silently, where the same
    copy made again from the run page sent ``export.ready`` or ``export.failed``."""
    import shutil

    from jaxengine.spec import dump_spec, parse_spec
    from tests.factories import build_tiny_model_dir
    from worker.tasks import serve

    run = finished_run
    settings.TEMPER_SERVE_QUANTIZE = "int8"
    run.output_dir.mkdir(parents=True)
    with django_capture_on_commit_callbacks(execute=True):  # no spec.yaml in the run's directory: it fails
        failure = serve.quantize_run(str(run.output_dir))
    shutil.copytree(build_tiny_model_dir(tmp_path / "tiny"), run.output_dir / "export")
    rows = tmp_path / "eval.jsonl"
    rows.write_text('{"prompt": "Hello there", "completion": " general"}\n')
    spec = parse_spec({"task": "sft", "model": str(tmp_path / "tiny"), "output_dir": str(run.output_dir),
                       "data": {"train": str(rows), "eval": str(rows)}, "train": {"max_steps": 1}})
    (run.output_dir / "spec.yaml").write_text(dump_spec(spec))
    with django_capture_on_commit_callbacks(execute=True):
        written = serve.quantize_run(str(run.output_dir))
    assert "error" not in written, written

    (failed_path, failed_event, failed), (ready_path, ready_event, ready) = sent_objects(receiver)
    assert (failed_path, failed_event, ready_path, ready_event) == ("/failed", "export.failed", "/ready",
                                                                  "export.ready")
    final_model = {"type": "serving_copy", "id": run.public_id, "name": "<b>first</b> final model (int8)",
                   "scheme": "int8", "run": run.public_id, "step": None, "base_model": None,
                   "url": f"{SITE}/p/alpha/runs/{run.public_id}/"}
    assert ready == {**final_model, "status": "ready", "error": ""}
    assert failed == {**final_model, "status": "failed", "error": failed["error"]}
    assert failed["error"] == failure["error"] and "spec.yaml: no such file" in failed["error"]
    assert not ServingCopy.objects.exists()  # the page still reads the automatic copy from its directory
