"""Every change of a run's status tells its open pages, on the run's Redis channel (``reporting.publish_status``):
a page left open on a run the reaper failed, a teammate cancelled or a placement gave up on showed it running
(or queued) until its stream ended ten minutes later. Read from a real Redis, as the run page's stream reads it."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from tests.webapp.runs.test_placement import launch, make_worker
from webapp.runs import channels, placement, reporting, services
from webapp.runs.models import Run, RunStatus

END = {"type": "end-of-test"}


class Channel:
    """The events published on one run's channel from ``listen`` on, read up to a marker the test publishes last."""

    def __init__(self, url: str):
        self.client = redis.Redis.from_url(url)
        self.pubsub = self.client.pubsub()

    def listen(self, run: Run) -> None:
        self.pubsub.subscribe(channels.events_channel(run.public_id))
        while (message := self.pubsub.get_message(timeout=10)) is None or message["type"] != "subscribe":
            assert message is not None, "Redis did not confirm the subscription"

    def statuses(self, run: Run) -> list[dict]:
        self.client.publish(channels.events_channel(run.public_id), json.dumps(END))
        events = []
        while True:
            message = self.pubsub.get_message(timeout=10)
            assert message is not None, "the test's own last event never came"
            if message["type"] != "message":
                continue
            event = json.loads(message["data"])
            if event == END:
                return [event for event in events if event["type"] == "status"]
            events.append(event)


@pytest.fixture
def channel(redis_url, settings):
    settings.REDIS_URL = redis_url
    listener = Channel(redis_url)
    yield listener
    listener.pubsub.close()
    listener.client.close()


def status_of(run: Run) -> dict:
    run.refresh_from_db()
    return {"type": "status", "status": run.status, "message": run.error_message, "notice": run.notice}


@pytest.fixture
def multi_host_run(team, catalog, sent_tasks, django_capture_on_commit_callbacks) -> Run:
    make_worker("train-tpu@a"), make_worker("train-tpu@b")
    return launch(team, catalog, django_capture_on_commit_callbacks)


def test_a_lost_multi_host_run_tells_its_pages_it_failed(multi_host_run, channel, monkeypatch,
                                                         django_capture_on_commit_callbacks):
    run = multi_host_run
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, current_step=7,
                                         last_heartbeat=timezone.now() - timedelta(seconds=600))
    monkeypatch.setattr(placement, "silent_hosts", lambda run: [1])
    channel.listen(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.runs_reap_lost() == []
    assert channel.statuses(run) == [status_of(run)]
    assert run.status == RunStatus.FAILED and run.error_message.startswith("host 1 (worker train-tpu@b) lost at step 7")


@pytest.mark.parametrize("hosts", [1, 2])
def test_a_lost_run_whose_cancel_was_asked_tells_its_pages_it_is_cancelled(
        hosts, team, catalog, sent_tasks, channel, django_capture_on_commit_callbacks):
    make_worker("train-tpu@a"), make_worker("train-tpu@b")
    run = launch(team, catalog, django_capture_on_commit_callbacks, hosts=hosts)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, cancel_requested=True, worker_name="train-tpu@a",
                                         last_heartbeat=timezone.now() - timedelta(seconds=600))
    run.refresh_from_db()
    channel.listen(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.run_attempt_lost(run=run, why="its training process died") is None
    assert channel.statuses(run) == [status_of(run)]
    assert run.status == RunStatus.CANCELLED


def test_a_queued_run_cancelled_tells_its_pages(multi_host_run, channel, django_capture_on_commit_callbacks):
    run = multi_host_run
    channel.listen(run)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_cancel(run=run, user=None)
    assert channel.statuses(run) == [status_of(run)]
    assert run.status == RunStatus.CANCELLED


def test_a_resumed_run_tells_its_pages_it_is_queued(multi_host_run, channel, monkeypatch,
                                                    django_capture_on_commit_callbacks):
    monkeypatch.setattr(services, "_clear_cancel_flag", lambda public_id: None)
    run = multi_host_run
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)
    run.refresh_from_db()
    channel.listen(run)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_resume(run=run, user=None)
    assert channel.statuses(run) == [status_of(run)]
    assert run.status == RunStatus.QUEUED and run.attempt == 2


def test_a_placement_that_gives_up_tells_its_pages_the_run_failed(team, catalog, sent_tasks, settings, channel,
                                                                  django_capture_on_commit_callbacks):
    settings.TEMPER_PLACEMENT_TIMEOUT_SECONDS = 60
    make_worker("train-tpu@a", seen_ago=-61)  # one of the two workers the run waits for
    run = launch(team, catalog, django_capture_on_commit_callbacks)
    channel.listen(run)
    with django_capture_on_commit_callbacks(execute=True):
        placement.runs_place_waiting(now=timezone.now() + timedelta(seconds=61))
    assert channel.statuses(run) == [status_of(run)]
    assert run.status == RunStatus.FAILED


def test_an_attempt_placed_again_tells_its_pages(multi_host_run, settings, channel,
                                                 django_capture_on_commit_callbacks):
    settings.TEMPER_HOST_START_SECONDS = 30
    run = multi_host_run
    assert reporting.host_start(run_pk=run.pk, attempt=1, process_id=1, worker_name="train-tpu@b")
    channel.listen(run)
    with django_capture_on_commit_callbacks(execute=True):
        placement.runs_replace_unstarted(now=timezone.now() + timedelta(seconds=31))
    assert channel.statuses(run) == [status_of(run)]
    assert run.status == RunStatus.QUEUED and run.attempt == 2


def test_an_external_run_closed_tells_its_pages(team, channel, django_capture_on_commit_callbacks):
    run = services.run_create_external(project=team.project, name="elsewhere", config={}, user=team.owner)
    channel.listen(run)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_finish_external(run=run, status=RunStatus.SUCCEEDED)
    assert channel.statuses(run) == [status_of(run)]
    assert run.status == RunStatus.SUCCEEDED
