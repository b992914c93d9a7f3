"""Worker heartbeats: service, selectors and the Workers page."""
from datetime import timedelta

import pytest
from django.utils import timezone

from webapp.workers import selectors
from webapp.workers.models import Worker
from webapp.workers.services import worker_heartbeat_record, worker_mark_stopped

pytestmark = pytest.mark.usefixtures("only_this_tests_workers")


def record(name="train@gpu1", **overrides):
    fields = {
        "name": name,
        "host": "gpu1",
        "pid": 4242,
        "queues": ["train"],
        "devices": {"platform": "gpu", "count": 8, "kinds": ["NVIDIA H200"], "memory_bytes": 150 * 2**30},
        "current_jobs": ["worker.tasks.train.run ('run_abc',)"],
        "started_at": timezone.now(),
    }
    return worker_heartbeat_record(**{**fields, **overrides})


def test_heartbeat_creates_then_refreshes_one_row(db):
    first = record()
    second = record(current_jobs=[])
    assert Worker.objects.count() == 1
    assert second.last_seen >= first.last_seen
    assert Worker.objects.get().current_jobs == []


def test_states_alive_stale_stopped(db):
    now = timezone.now()
    record("alive@a")
    record("stale@b")
    Worker.objects.filter(name="stale@b").update(last_seen=now - timedelta(seconds=61))
    record("stopped@c", pid=7)
    worker_mark_stopped(name="stopped@c", pid=7)
    states = {worker.name: worker.state for worker in selectors.worker_list(now=now)}
    assert states == {"alive@a": "alive", "stale@b": "stale", "stopped@c": "stopped"}
    assert selectors.workers_alive_count(now=now) == 1


def test_workers_silent_for_a_day_are_forgotten(db):
    now = timezone.now()
    record("old@gone")
    Worker.objects.filter(name="old@gone").update(last_seen=now - timedelta(days=1, seconds=1))
    record("new@here")
    assert [worker.name for worker in selectors.worker_list(now=now)] == ["new@here"]


def test_a_restarted_worker_is_alive_again_and_old_shutdown_does_not_stop_it(db):
    record("default@a", pid=1)
    worker_mark_stopped(name="default@a", pid=1)
    record("default@a", pid=2)
    worker_mark_stopped(name="default@a", pid=1)
    assert selectors.worker_list()[0].state == "alive"


class TestWorkersPage:
    url = "/workers/"

    def test_it_works(self, team, client_for):
        record()
        record("default@old", queues=["default"], devices={})
        Worker.objects.filter(name="default@old").update(last_seen=timezone.now() - timedelta(minutes=5))
        response = client_for(team.viewer).get(self.url)
        assert response.status_code == 200
        content = response.content.decode()
        assert "train@gpu1" in content and "8 × gpu" in content and "NVIDIA H200" in content
        assert "150.0\xa0GB per device" in content
        assert "run_abc" in content
        assert '<tr class="worker-stale">' in content and "probing" in content

    def test_it_lists_the_queues_a_worker_shares_not_its_own_direct_queue(self, team, client_for):
        """Every worker also consumes ``<name>.dq2`` (worker_direct, for multi-host placement); listed as a
        queue it read as one more queue to send work to."""
        record("default@vm", queues=["default", "default@vm.dq2"], devices={})
        content = client_for(team.viewer).get(self.url).content.decode()
        assert "<td><code>default</code> </td>" in content and "dq2" not in content
        assert Worker.objects.get(name="default@vm").queues == ["default", "default@vm.dq2"]  # placement still sees it

    def test_it_says_just_now_under_a_minute_and_how_long_ago_after(self, team, client_for):
        record("default@fresh", devices={})
        record("default@quiet", devices={})
        Worker.objects.filter(name="default@quiet").update(last_seen=timezone.now() - timedelta(minutes=5, seconds=3))
        content = client_for(team.viewer).get(self.url).content.decode()
        assert content.count(">just now</td>") == 1
        assert ">5\xa0minutes ago</td>" in content
        assert "0\xa0minutes" not in content

    def test_it_requires_access(self, client, db):
        response = client.get(self.url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")

    @pytest.mark.parametrize("method", ["post", "delete"])
    def test_it_rejects_writes(self, team, client_for, method):
        assert getattr(client_for(team.owner), method)(self.url).status_code == 405
