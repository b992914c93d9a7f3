"""The run page's event stream under a WSGI server (Django's test client, like runserver and
pytest-django's live server): messages arrive one by one as they are published, with no warning
(Django used to collect the async stream to its end first, warning that it must consume it)."""
import json
import time
import warnings

import pytest
import redis
from django.test import override_settings

from tests.webapp.runs.conftest import sft_spec
from webapp.runs import channels, services
from webapp.runs.models import Run, RunStatus


@pytest.fixture
def run(team, catalog, sent_tasks):
    return services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate)


def _events(client, run):
    return client.get(f"/p/alpha/runs/{run.public_id}/events/")


def test_a_finished_run_streams_its_hello_without_a_warning(team, run, client_for):
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        response = _events(client_for(team.viewer), run)
        body = b"".join(response).decode()
        response.close()
    assert response["Content-Type"] == "text/event-stream"
    assert body == 'retry: 2000\n\ndata: {"type": "hello", "status": "succeeded"}\n\n'
    assert [str(warning.message) for warning in caught] == []


def test_a_running_run_streams_each_event_as_it_is_published(team, run, client_for, redis_url):
    publisher = redis.Redis.from_url(redis_url)
    channel = channels.events_channel(run.public_id)
    with override_settings(REDIS_URL=redis_url), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        response = _events(client_for(team.teammate), run)
        messages = iter(response)
        # Both arrive before anything is published: the stream is not collected to its end first.
        assert next(messages) == b"retry: 2000\n\n"
        assert json.loads(next(messages).decode().removeprefix("data: ")) == {"type": "hello", "status": "queued"}
        # The page catches up on the hello: by then the relay listens, so an event published after
        # the catch-up cannot fall between it and the subscription (CI lost one there).
        assert publisher.pubsub_numsub(channel)[0][1] == 1
        publisher.publish(channel, json.dumps({"type": "progress", "step": 1}))
        assert json.loads(next(messages).decode().removeprefix("data: ")) == {"type": "progress", "step": 1}
        publisher.publish(channel, json.dumps({"type": "status", "status": "succeeded"}))
        assert json.loads(next(messages).decode().removeprefix("data: "))["status"] == "succeeded"
        assert list(messages) == []  # the terminal event ends the stream
        response.close()
    assert [str(warning.message) for warning in caught] == []


def test_closing_a_stream_early_unsubscribes_it(team, run, client_for, redis_url):
    publisher = redis.Redis.from_url(redis_url)
    channel = channels.events_channel(run.public_id)
    with override_settings(REDIS_URL=redis_url):
        response = _events(client_for(team.teammate), run)
        messages = iter(response)
        next(messages), next(messages)
        deadline = time.monotonic() + 10
        while publisher.pubsub_numsub(channel)[0][1] == 0:
            assert time.monotonic() < deadline, "the stream never subscribed to the run's channel"
            time.sleep(0.01)
        response.close()  # what the WSGI server does when the browser goes away
        while publisher.pubsub_numsub(channel)[0][1] != 0:
            assert time.monotonic() < deadline, "the closed stream is still subscribed"
            time.sleep(0.01)


def test_a_finished_runs_stream_stays_open_while_a_checkpoint_is_exported(team, run, client_for, redis_url,
                                                                          django_capture_on_commit_callbacks):
    """A finished run's stream used to end after its hello, so the page never heard of an export it had
    asked for; it now lasts until the event of the last export still running."""
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    run.refresh_from_db()
    (run.output_dir / "checkpoints" / "4").mkdir(parents=True)
    services.checkpoint_export_request(run=run, step=4, user=team.teammate)
    publisher = redis.Redis.from_url(redis_url)
    channel = channels.events_channel(run.public_id)
    with override_settings(REDIS_URL=redis_url):
        response = _events(client_for(team.viewer), run)
        messages = iter(response)
        assert next(messages) == b"retry: 2000\n\n"
        assert json.loads(next(messages).decode().removeprefix("data: "))["status"] == "succeeded"
        assert publisher.pubsub_numsub(channel)[0][1] == 1  # subscribed before the hello
        with django_capture_on_commit_callbacks(execute=True):  # the worker's commit publishes the event
            services.checkpoint_export_finish(run=run, step=4, error=RuntimeError("out of memory"))
        assert json.loads(next(messages).decode().removeprefix("data: ")) == {
            "type": "checkpoint", "step": 4, "status": "failed", "exporting": []}
        assert list(messages) == []  # no export left: the stream ends
        response.close()


# Committed: under the test client (WSGI) the stream's check runs on a thread of its own, with its own connection.
@pytest.mark.django_db(transaction=True)
def test_a_member_removed_while_watching_gets_none_of_the_events_after(team, run, client_for, redis_url, monkeypatch):
    """An open stream went on relaying a run's events to someone removed from its project, until the stream's
    own end (10 minutes); it now asks again every ACCESS_RECHECK_SECONDS (here: at every event) and ends."""
    from webapp.core import sse
    from webapp.projects import services as project_services

    monkeypatch.setattr(sse, "ACCESS_RECHECK_SECONDS", 0.0)
    publisher = redis.Redis.from_url(redis_url)
    channel = channels.events_channel(run.public_id)
    with override_settings(REDIS_URL=redis_url):
        response = _events(client_for(team.viewer), run)
        messages = iter(response)
        next(messages), next(messages)  # retry, hello: subscribed
        publisher.publish(channel, json.dumps({"type": "progress", "step": 1}))
        assert json.loads(next(messages).decode().removeprefix("data: ")) == {"type": "progress", "step": 1}
        project_services.membership_remove(membership=team.project.memberships.get(user=team.viewer))
        publisher.publish(channel, json.dumps({"type": "progress", "step": 2}))
        publisher.publish(channel, json.dumps({"type": "status", "status": "succeeded"}))  # would end it anyway
        assert list(messages) == []  # ended at step 2, which it did not send
        response.close()
