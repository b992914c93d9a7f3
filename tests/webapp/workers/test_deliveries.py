"""A message held by a worker killed outright goes back to its queue once its worker's heartbeat is stale,
not an hour later. A private Redis server; the 'worker' is a real kombu consumer (the transport Celery's
worker consumes with) in a subprocess that takes the message without acknowledging it and is killed."""
from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone as dt_timezone

import pytest
import redis
from django.utils import timezone

from tests.live import ROOT, _use_broker, start_redis
from webapp.workers import deliveries
from webapp.workers.models import Worker

TASK = "worker.tasks.datasets.validate_dataset_version"
HOLD_AND_HANG = """
import sys, time
from kombu import Connection, Consumer, Queue

url, queue = sys.argv[1:3]
with Connection(url) as connection:
    channel = connection.channel()

    def hold(body, message):  # never acknowledged: its worker dies holding it
        print(message.delivery_tag, flush=True)

    with Consumer(channel, queues=[Queue(queue)], callbacks=[hold], accept=["json"]):
        connection.drain_events(timeout=20)
        time.sleep(600)
"""


@pytest.fixture
def broker(settings):
    """A Redis of this test's own (the reaper looks at every delivery Redis holds) as the broker."""
    from webapp.celery import app as celery_app

    server = start_redis()
    previous = celery_app.conf.broker_url
    _use_broker(celery_app, server.url)
    settings.REDIS_URL = server.url
    settings.TEMPER_HEARTBEAT_SECONDS = 10
    settings.TEMPER_RUN_LOST_SECONDS = 60
    try:
        yield redis.Redis.from_url(server.url)
    finally:
        _use_broker(celery_app, previous)
        server.stop()


def deliver_to_a_worker_that_dies(broker_url: str, queue: str) -> str:
    """The delivery tag that a consumer took ``queue``'s first message under before SIGKILL."""
    consumer = subprocess.Popen([sys.executable, "-c", HOLD_AND_HANG, broker_url, queue], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
    try:
        tag = consumer.stdout.readline().strip()
    finally:
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(timeout=10)
    assert tag, "the consumer took no message"
    return tag


def worker_row(*, holding: list[str], last_seen) -> Worker:
    return Worker.objects.create(name=f"w{uuid.uuid4().hex[:6]}@host", host="host", pid=1, queues=["default"],
                                 deliveries=holding, started_at=last_seen - timedelta(hours=1), last_seen=last_seen)


@pytest.mark.django_db
def test_a_message_whose_worker_died_holding_it_is_queued_again_once(broker):
    from webapp.celery import app as celery_app

    queue = f"q-{uuid.uuid4().hex[:8]}"
    url = broker.connection_pool.connection_kwargs
    broker_url = f"redis://{url['host']}:{url['port']}/0"
    celery_app.send_task(TASK, args=[41], queue=queue)
    tag = deliver_to_a_worker_that_dies(broker_url, queue)

    broker.hset(deliveries.KOMBU_UNACKED_KEY, "not-celery", b"\x80 pickled?")  # skipped, not fatal
    [held] = deliveries.unacked_deliveries(broker)
    broker.hdel(deliveries.KOMBU_UNACKED_KEY, "not-celery")
    assert (held.tag, held.task, held.arguments, held.redelivered) == (tag, TASK, "[41]", False)
    assert broker.llen(queue) == 0
    now = timezone.now()
    assert abs(held.delivered_at - now.timestamp()) < 30

    # Delivered under TEMPER_RUN_LOST_SECONDS ago (its worker may not have reported it yet): kept.
    assert deliveries.deliveries_restore_orphaned(now=now + timedelta(seconds=50)) == []
    later = now + timedelta(seconds=90)
    # A live worker holds it (running, or reserved): kept, however old.
    holder = worker_row(holding=[tag], last_seen=later - timedelta(seconds=5))
    assert deliveries.deliveries_restore_orphaned(now=later) == []
    # With heartbeats off nobody reports what they hold: nothing is judged.
    holder.delete()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(deliveries.settings, "TEMPER_HEARTBEAT_SECONDS", 0)
        assert deliveries.deliveries_restore_orphaned(now=later) == []
    assert broker.hlen(deliveries.KOMBU_UNACKED_KEY) == 1

    # Its worker's heartbeat went stale (the row says it held it): queued again, at the consuming end.
    worker_row(holding=[tag], last_seen=later - timedelta(seconds=61))
    [restored] = deliveries.deliveries_restore_orphaned(now=later)
    assert restored.tag == tag
    assert broker.hlen(deliveries.KOMBU_UNACKED_KEY) == 0 and broker.zcard(deliveries.KOMBU_UNACKED_INDEX_KEY) == 0
    assert broker.llen(queue) == 1

    # Its next worker dies holding it too: left to Celery's visibility timeout, not queued a third time.
    again = deliver_to_a_worker_that_dies(broker_url, queue)
    [held_again] = deliveries.unacked_deliveries(broker)
    assert held_again.tag == again and held_again.arguments == "[41]" and held_again.redelivered
    assert deliveries.deliveries_restore_orphaned(now=timezone.now() + timedelta(hours=1)) == []
    assert broker.hlen(deliveries.KOMBU_UNACKED_KEY) == 1 and broker.llen(queue) == 0


def test_orphans_are_old_unheld_undirected_first_deliveries():
    def delivery(tag, *, at=0.0, exchange="default", redelivered=False):
        return deliveries.Delivery(tag=tag, task=TASK, arguments="[1]", exchange=exchange, delivered_at=at,
                                   redelivered=redelivered)

    candidates = [delivery("old"), delivery("held"), delivery("young", at=100.0),
                  delivery("direct", exchange=deliveries.DIRECT_EXCHANGE), delivery("again", redelivered=True)]
    assert [d.tag for d in deliveries.orphans(candidates, held={"held"}, delivered_before=50.0)] == ["old"]


@pytest.mark.django_db
def test_task_deliveries_tells_a_live_workers_messages_from_a_dead_ones(broker):
    """What ``review.services.generations_settle_lost`` reads: by their arguments, the messages of one task that a
    live worker holds and those whose worker is gone; other tasks' messages are not among them."""
    from webapp.celery import app as celery_app

    queue = f"q-{uuid.uuid4().hex[:8]}"
    url = broker.connection_pool.connection_kwargs
    broker_url = f"redis://{url['host']}:{url['port']}/0"
    tags = {}
    for arguments in ([7], [8]):
        celery_app.send_task(TASK, args=arguments, queue=queue)
        tags[arguments[0]] = deliver_to_a_worker_that_dies(broker_url, queue)
    celery_app.send_task("worker.tasks.review.write_export", args=[9], queue=queue)
    deliver_to_a_worker_that_dies(broker_url, queue)
    now = timezone.now()
    worker_row(holding=[tags[7]], last_seen=now - timedelta(seconds=5))
    worker_row(holding=[tags[8]], last_seen=now - timedelta(seconds=61))  # stale: presumed dead

    found = deliveries.task_deliveries(task=TASK, now=now)
    assert found.live == {(7,)} and set(found.orphaned) == {(8,)} and found.orphaned[(8,)].tag == tags[8]
    with pytest.MonkeyPatch.context() as patch:  # nobody reports what they hold: nothing is told
        patch.setattr(deliveries.settings, "TEMPER_HEARTBEAT_SECONDS", 0)
        assert deliveries.task_deliveries(task=TASK, now=now) is None


@pytest.mark.django_db
def test_a_message_whose_workers_died_twice_counts_as_lost(broker):
    """A message whose worker died after it had been delivered once before is left to Celery's visibility timeout
    (an hour): the checks that fail work whose message Redis holds nowhere counted it as held meanwhile, so a
    checkpoint export that killed two workers (out of memory) said "exporting" for an hour, and again after each
    redelivery. It counts as lost once no live worker holds it for TEMPER_RUN_LOST_SECONDS, as a first loss would
    be queued again then; held by a live worker, it counts as held."""
    from webapp.celery import app as celery_app
    from webapp.runs import services
    from webapp.runs.models import CheckpointExport, Run, RunStatus
    from tests.webapp.factories import make_team

    team = make_team()
    run = Run.objects.create(project=team.project, name="big", task="sft", status=RunStatus.SUCCEEDED,
                             spec={}, resolved_spec={"output_dir": "/runs/big"})
    CheckpointExport.objects.create(run=run, step=5, status="exporting")
    url = broker.connection_pool.connection_kwargs
    broker_url = f"redis://{url['host']}:{url['port']}/0"
    queue = services.EXPORT_CHECKPOINT_QUEUE
    celery_app.send_task(services.EXPORT_CHECKPOINT_TASK, args=[run.pk, 5], queue=queue)
    deliver_to_a_worker_that_dies(broker_url, queue)
    assert len(deliveries.deliveries_restore_orphaned(now=timezone.now() + timedelta(seconds=90))) == 1
    again = deliver_to_a_worker_that_dies(broker_url, queue)  # its next worker dies holding it too
    later = timezone.now() + timedelta(seconds=90)
    CheckpointExport.objects.filter(run=run).update(updated_at=later - timedelta(seconds=80))
    checking = dict(task=services.EXPORT_CHECKPOINT_TASK, queues=(queue,), checking="exports")

    holder = worker_row(holding=[again], last_seen=later - timedelta(seconds=5))
    assert services.held_task_messages(**checking, now=later) == {(run.pk, 5)}
    holder.delete()
    assert services.held_task_messages(**checking, now=timezone.now()) == {(run.pk, 5)}  # delivered just now
    assert services.held_task_messages(**checking, now=later) == set()

    [failed] = services.checkpoint_exports_fail_lost(now=later)
    assert failed.status == "failed" and failed.error_message.startswith("the export was lost: its worker stopped")
    assert broker.hlen(deliveries.KOMBU_UNACKED_KEY) == 1, "left to Celery, whose redelivery finds it failed"


@pytest.mark.django_db
def test_a_dataset_version_whose_check_killed_two_workers_fails_with_the_reason(broker, client_for):
    """A file whose check kills its worker (out of memory) said "Checking the file…" for ever: its message, restored
    once, went back to Celery's visibility timeout after killing the next worker too, and then killed one an hour;
    "queue the check again" killed another. It fails, saying why and what to do, and keeps nothing."""
    from tests.webapp.factories import make_ready_version, make_team
    from webapp.celery import app as celery_app
    from webapp.datasets import services
    from webapp.datasets.models import DatasetVersion, VersionStatus

    team = make_team()
    version = make_ready_version(team.project, name="huge", user=team.owner)
    DatasetVersion.objects.filter(pk=version.pk).update(status=VersionStatus.VALIDATING)
    url = broker.connection_pool.connection_kwargs
    broker_url = f"redis://{url['host']}:{url['port']}/0"
    queue = f"q-{uuid.uuid4().hex[:8]}"
    celery_app.send_task(services.VALIDATE_TASK, args=[version.pk], queue=queue)
    deliver_to_a_worker_that_dies(broker_url, queue)
    later = timezone.now() + timedelta(seconds=90)
    assert services.versions_fail_abandoned(now=later) == [], "lost once: queued again, and checked again"
    assert len(deliveries.deliveries_restore_orphaned(now=later)) == 1
    again = deliver_to_a_worker_that_dies(broker_url, queue)  # the file kills its next worker too
    later = timezone.now() + timedelta(seconds=90)
    holder = worker_row(holding=[again], last_seen=later - timedelta(seconds=5))
    assert services.versions_fail_abandoned(now=later) == [], "a live worker holds it"
    holder.delete()

    [failed] = services.versions_fail_abandoned(now=later)
    assert failed.pk == version.pk and failed.status == VersionStatus.FAILED and failed.error_count == 1
    [problem] = failed.errors
    assert problem["code"] == "worker_lost" and problem["message"] == (
        "checking this file stopped two workers in turn (killed, out of memory, or their host lost); it is not "
        "checked again: ask an administrator for workers with more memory and upload it again, or upload fewer rows "
        "(not the file split in parts: a run trains on one version)")
    assert not version.absolute_path.exists()
    page = client_for(team.owner).get(f"/p/{team.project.slug}/datasets/{version.dataset.public_id}/v/1/")
    assert "Checking the file" not in page.content.decode() and "checking this file stopped two workers" in (
        page.content.decode())
    assert services.versions_fail_abandoned(now=later) == []  # failed once


def killed_twice(broker, task: str, arguments: list) -> None:
    """``task``'s message taken by a worker that dies, queued again (``deliveries_restore_orphaned``) and taken by
    another that dies too."""
    from webapp.celery import app as celery_app

    url = broker.connection_pool.connection_kwargs
    broker_url = f"redis://{url['host']}:{url['port']}/0"
    queue = f"q-{uuid.uuid4().hex[:8]}"
    celery_app.send_task(task, args=arguments, queue=queue)
    deliver_to_a_worker_that_dies(broker_url, queue)
    assert len(deliveries.deliveries_restore_orphaned(now=timezone.now() + timedelta(seconds=90))) == 1
    deliver_to_a_worker_that_dies(broker_url, queue)


@pytest.mark.django_db
def test_review_work_that_killed_two_workers_fails_with_the_reason(broker, client_for):
    """An export being written held its campaign (deletion refused: "is being written; wait until it is done")
    and a load said "Loading items" for an hour, and again after each redelivery, once their work had killed two
    workers in turn (out of memory). Both fail with the reason; the campaign can then be deleted."""
    from tests.webapp.factories import make_ready_version, make_team
    from webapp.review import selectors, services
    from webapp.review.models import Campaign, CampaignStatus, Export, ExportStatus

    team = make_team()
    version = make_ready_version(team.project, name="prefs", kind="preference", user=team.owner,
                                 rows=[{"prompt": "p", "chosen": "a", "rejected": "b"}])
    loading = Campaign.objects.create(project=team.project, name="big load", source_version=version,
                                      status=CampaignStatus.LOADING, load_attempt=1, created_by=team.owner)
    ready = Campaign.objects.create(project=team.project, name="big export", status=CampaignStatus.READY,
                                    created_by=team.owner)
    export = Export.objects.create(campaign=ready, dataset_name="out", status=ExportStatus.WRITING)
    killed_twice(broker, services.LOAD_TASK, [loading.pk, 1])
    killed_twice(broker, services.EXPORT_TASK, [export.pk])
    later = timezone.now() + timedelta(seconds=90)
    assert services.review_work_fail_abandoned(now=timezone.now()) == []  # delivered just now

    assert len(services.review_work_fail_abandoned(now=later)) == 2
    loading.refresh_from_db()
    export.refresh_from_db()
    assert loading.status == CampaignStatus.FAILED and loading.load_error == (
        "loading its items stopped two workers in turn (killed, out of memory, or their host lost); they are not "
        "loaded again: delete this campaign and make it from a smaller dataset version, or ask for workers with "
        "more memory")
    assert export.status == ExportStatus.FAILED and export.error == (
        "writing this export stopped two workers in turn (killed, out of memory, or their host lost); it is not "
        "written again: export again once the workers have more memory")
    assert selectors.campaign_readers(campaign=ready) == [] and selectors.campaign_readers(campaign=loading) == []
    page = client_for(team.owner).get(f"/p/{team.project.slug}/review/{loading.public_id}/").content.decode()
    assert "loading its items stopped two workers in turn" in page and 'id="delete-confirm"' in page
    assert services.review_work_fail_abandoned(now=later) == []  # failed once


def lost_once(broker, task: str, arguments: list) -> str:
    """``task``'s message taken by a worker that dies holding it (its own queue, so that it is the one taken); the
    delivery tag."""
    from webapp.celery import app as celery_app

    url = broker.connection_pool.connection_kwargs
    queue = f"q-{uuid.uuid4().hex[:8]}"
    celery_app.send_task(task, args=arguments, queue=queue)
    return deliver_to_a_worker_that_dies(f"redis://{url['host']}:{url['port']}/0", queue)


@pytest.mark.django_db
def test_work_whose_worker_was_lost_once_says_so_as_it_starts_over(broker, client_for):
    """A dataset's check or token count, a review campaign's item load or export, a checkpoint export, a pipeline's
    export stage and a serving copy whose worker died holding them were queued again without a word, their pages
    saying "checking", "loading", "exporting", "being written" for twice as long as the work takes (runs and
    generations said it). Each says which worker was lost, when it was last heard from, and that the work starts
    over; its outcome then replaces that. Work that ended before its message was restored is left alone."""
    from django.template.loader import render_to_string
    from django.test import Client

    from tests.webapp.factories import make_base_model, make_ready_version, make_team
    from webapp.api.services import token_create
    from webapp.core.bidi import isolated
    from webapp.core.templatetags.temper import when
    from webapp.datasets import services as dataset_services
    from webapp.datasets.models import DatasetVersion, VersionStatus
    from webapp.review import services as review_services
    from webapp.review.models import Campaign, CampaignStatus, Export, ExportStatus
    from webapp.runs import pipelines, serving_copies
    from webapp.runs import services as run_services
    from webapp.runs.models import (CheckpointExport, Pipeline, PipelineStatus, Run, RunStatus, ServingCopy,
                                    ServingCopyStatus)

    team = make_team()
    checking = make_ready_version(team.project, name="huge", user=team.owner)
    settled = make_ready_version(team.project, name="small", user=team.owner)  # its check ended meanwhile
    DatasetVersion.objects.filter(pk=checking.pk).update(status=VersionStatus.VALIDATING, row_count=None)
    base_model = make_base_model(team.project)
    counting = make_ready_version(team.project, name="counted", user=team.owner)
    DatasetVersion.objects.filter(pk=counting.pk).update(
        token_statistics={"status": "computing", "base_model": base_model.name})
    prefs = make_ready_version(team.project, name="prefs", kind="preference", user=team.owner,
                               rows=[{"prompt": "p", "chosen": "a", "rejected": "b"}])
    loading = Campaign.objects.create(project=team.project, name="big load", source_version=prefs,
                                      source_label=str(prefs), status=CampaignStatus.LOADING, load_attempt=1,
                                      created_by=team.owner)
    ready = Campaign.objects.create(project=team.project, name="big export", status=CampaignStatus.READY,
                                    created_by=team.owner)
    export = Export.objects.create(campaign=ready, dataset_name="out", status=ExportStatus.WRITING)
    run = Run.objects.create(project=team.project, name="big", task="sft", status=RunStatus.SUCCEEDED, spec={},
                             resolved_spec={}, created_by=team.owner)
    Run.objects.filter(pk=run.pk).update(resolved_spec={"output_dir": str(run_services.run_output_dir(run.public_id))})
    run.refresh_from_db()
    (run.output_dir / "checkpoints" / "5").mkdir(parents=True)
    CheckpointExport.objects.create(run=run, step=5, status="exporting")
    pipeline = Pipeline.objects.create(project=team.project, name="sft-serve", created_by=team.owner,
                                       status=PipelineStatus.RUNNING, current_stage=1, result_run=run,
                                       stages=[{"name": "sft", "spec": {"task": "sft"}},
                                               {"name": "serve", "export": {"quantize": "int8"}}])
    copy = ServingCopy.objects.create(project=team.project, base_model=base_model, status=ServingCopyStatus.WRITING)
    copy_written_at = copy.updated_at

    held = [lost_once(broker, dataset_services.VALIDATE_TASK, [checking.pk]),
            lost_once(broker, dataset_services.VALIDATE_TASK, [settled.pk]),
            lost_once(broker, dataset_services.TOKEN_STATISTICS_TASK, [counting.pk, base_model.pk]),
            lost_once(broker, review_services.LOAD_TASK, [loading.pk, 1]),
            lost_once(broker, review_services.EXPORT_TASK, [export.pk]),
            lost_once(broker, run_services.EXPORT_CHECKPOINT_TASK, [run.pk, 5]),
            lost_once(broker, pipelines.EXPORT_STAGE_TASK, [pipeline.pk, 1]),
            lost_once(broker, serving_copies.MAKE_COPY_TASK, [copy.pk])]
    lost_unheard = lost_once(broker, serving_copies.AUTOMATIC_COPY_TASK, [str(run.output_dir)])
    later = timezone.now() + timedelta(seconds=90)
    dead = worker_row(holding=held, last_seen=later - timedelta(seconds=61))  # it died before its last beat listed the last
    restored = deliveries.deliveries_restore_orphaned(now=later)
    assert {delivery.tag for delivery in restored} == {*held, lost_unheard}

    lost = f"({dead.name}, last heard from at {when(dead.last_seen)}) was lost: killed, out of memory, or its host lost"
    checking.refresh_from_db()
    # A notice, not a problem of the file: a REST client that reads any error as failure would misread it.
    assert checking.status == VersionStatus.VALIDATING and checking.error_count == 0 and checking.errors == []
    assert checking.notice == (
        f"the worker checking this file {lost}; the check was queued again and starts over on the next free worker")
    project = f"/p/{team.project.slug}"
    page = client_for(team.owner).get(f"{project}/datasets/{checking.dataset.public_id}/v/1/").content.decode()
    assert "Checking the file" in page and f"The worker checking this file ({dead.name}" in page
    secret = token_create(user=team.owner, name="reader")[1]
    answer = Client(HTTP_AUTHORIZATION=f"Bearer {secret}").get(
        f"/api/v1/projects/{team.project.slug}/datasets/{checking.dataset.public_id}/versions/1/").json()
    assert answer["status"] == "validating" and answer["errors"] == [] and answer["notice"] == checking.notice
    dataset_services.dataset_version_validate(version_id=checking.pk)  # the check's outcome clears the notice
    checking.refresh_from_db()
    assert checking.status == VersionStatus.READY and checking.notice == ""
    settled.refresh_from_db()
    assert settled.status == VersionStatus.READY and settled.errors == []
    counting.refresh_from_db()
    assert counting.token_statistics["status"] == "computing" and counting.token_statistics["note"] == (
        f"the worker counting these tokens {lost}; the count was queued again and starts over on the next free worker")
    page = client_for(team.owner).get(f"{project}/datasets/{counting.dataset.public_id}/v/1/").content.decode()
    assert "Counting tokens with the" in page and f"The worker counting these tokens ({dead.name}" in page

    loading.refresh_from_db()
    export.refresh_from_db()
    # Notices, not errors: a load or an export starting over has not failed, and its outcome's error is its own.
    assert loading.status == CampaignStatus.LOADING and loading.load_error == "" and loading.notice == (
        f"the worker loading its items {lost}; the load was queued again and starts over on the next free worker")
    assert export.status == ExportStatus.WRITING and export.error == "" and export.notice == (
        f"the worker writing this export {lost}; the export was queued again and starts over on the next free worker")
    page = client_for(team.owner).get(f"{project}/review/{loading.public_id}/").content.decode()
    assert "Loading items from" in page and f"The worker loading its items ({dead.name}" in page
    page = client_for(team.owner).get(f"{project}/review/{ready.public_id}/").content.decode()
    assert "writing <bdi>out</bdi>…" in page and f"The worker writing this export ({dead.name}" in page

    exporting = CheckpointExport.objects.get(run=run, step=5)
    assert exporting.status == "exporting" and exporting.error_message == "" and exporting.notice == (
        f"the worker exporting checkpoint 5 {lost}; the export was queued again and starts over on the next free "
        "worker")
    page = client_for(team.owner).get(f"{project}/runs/{run.public_id}/").content.decode()
    assert "exporting…" in page and f"The worker exporting checkpoint 5 ({dead.name}" in page
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.RUNNING and pipeline.message == (
        f"the worker writing the serving copy of stage 2 (serve) {lost}; the stage was queued again and starts over "
        "on the next free worker")
    page = client_for(team.owner).get(f"{project}/pipelines/{pipeline.public_id}/").content.decode()
    assert pipeline.message in page
    copy.refresh_from_db()
    assert copy.status == ServingCopyStatus.WRITING and copy.updated_at == copy_written_at and copy.error_message == ""
    assert copy.notice == (
        f"the worker writing this copy {lost}; the copy was queued again and starts over on the next free worker")
    card = render_to_string("serving/_copy_state.html", {
        "copy": serving_copies.copy_state(copy, serving_copies.base_model_copy_dir(base_model)), "of": "the model"})
    assert "being written" in card and f"The worker writing this copy ({dead.name}" in card
    delivered = [delivery for delivery in restored if delivery.tag == lost_unheard][0].delivered_at
    taken = when(datetime.fromtimestamp(delivered, tz=dt_timezone.utc))
    assert list(run.log_lines.values_list("level", "message")) == [
        ("warning", exporting.notice),
        ("warning", f"{pipeline.message} (pipeline {isolated('sft-serve')})"),
        ("warning", f"the worker writing the serving copy of its final model (which took it at {taken} and was not "
                    "heard from since) was lost: killed, out of memory, or its host lost; the copy was queued again "
                    "and starts over on the next free worker")]

    # The work's outcome replaces the note.
    assert dataset_services.dataset_version_validate(version_id=checking.pk).status == VersionStatus.READY
    checking.refresh_from_db()
    assert checking.errors == [] and checking.error_count == 0
    assert review_services.campaign_load_items(campaign_id=loading.pk, attempt=1).status == CampaignStatus.READY
    loading.refresh_from_db()
    assert loading.load_error == "" and loading.notice == ""
    # An outcome that is a failure is the error alone, shown as one, and the note of the lost worker is gone.
    export = review_services.export_write(export_id=export.pk)  # no complete item: nothing to write
    assert export.status == ExportStatus.FAILED and export.error.startswith("no pair was left to write")
    assert Export.objects.get(pk=export.pk).notice == ""
    page = client_for(team.owner).get(f"{project}/review/{ready.public_id}/").content.decode()
    assert "no pair was left to write" in page and "The worker writing this export" not in page
    exported = run_services.checkpoint_export_finish(run=run, step=5, failure="the disk is full")
    assert (exported.status, exported.error_message, exported.notice) == ("failed", "the disk is full", "")
    page = client_for(team.owner).get(f"{project}/runs/{run.public_id}/").content.decode()
    assert "export failed" in page and "The worker exporting checkpoint 5" not in page
    copy = serving_copies.serving_copy_finish(copy_pk=copy.pk, error="out of memory")
    assert (copy.status, copy.error_message, copy.notice) == (ServingCopyStatus.FAILED, "out of memory", "")
