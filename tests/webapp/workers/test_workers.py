"""Worker heartbeats: service, selectors and the Workers page."""
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.webapp.factories import make_base_model
from webapp.chat.models import Conversation, Message, MessageStatus, Role
from webapp.runs.models import Run, ServingCopy
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
        "current_jobs": ["worker.tasks.train.train_run [1, 1]"],
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


def test_how_long_a_worker_may_be_silent_is_a_setting(db, settings, team, client_for):
    """TEMPER_WORKER_STALE_AFTER (60 s by default): a worker silent for 90 s is lost under the default, alive under
    120 s, for its state, the live count, the deliveries it holds, the pools offered and the Workers page alike."""
    from webapp.workers import deliveries

    now = timezone.now()
    record("train@quiet", current_jobs=[], pool="default", deliveries=["tag-held"])
    Worker.objects.filter(name="train@quiet").update(last_seen=now - timedelta(seconds=90))
    quiet = Worker.objects.get(name="train@quiet")
    assert quiet.state_at(now) == "stale" and selectors.workers_alive_count(now=now) == 0
    assert deliveries.live_worker_deliveries(now=now) == set() and selectors.pool_offers(now=now) == {}

    settings.TEMPER_WORKER_STALE_AFTER = 120
    assert quiet.state_at(now) == "alive" and selectors.workers_alive_count(now=now) == 1
    assert deliveries.live_worker_deliveries(now=now) == {"tag-held"} and selectors.pool_offers(now=now)["default"].workers == 1
    assert "one silent for more than 120 s is flagged stale" in client_for(team.viewer).get("/workers/").content.decode()


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
        assert "training a run deleted since<br>" in content
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


class TestWorkersPageJobs:
    """The current job column names what a job works on as the other pages do, never by its database keys
    (it showed "worker.tasks.train.train_run [12, 1]"), and only to members of the job's project."""

    url = "/workers/"

    def test_it_names_a_training_run_linked_to_its_page(self, team, client_for):
        run = Run.objects.create(project=team.project, name="llama sft", task="sft", spec={}, resolved_spec={})
        record(current_jobs=[f"worker.tasks.train.train_run [{run.pk}, 2]"])
        content = client_for(team.viewer).get(self.url).content.decode()
        assert f'training <a href="/p/alpha/runs/{run.public_id}/">llama sft</a> (attempt 2)<br>' in content
        assert f"[{run.pk}, 2]" not in content and "worker.tasks" not in content

    def test_it_names_nothing_of_a_project_the_viewer_is_not_in(self, team, client_for):
        run = Run.objects.create(project=team.project, name="secret plan", task="sft", spec={}, resolved_spec={})
        record(current_jobs=[f"worker.tasks.train.train_host [{run.pk}, 1, 0, 2, '10.0.0.1:4321']"])
        content = client_for(team.outsider).get(self.url).content.decode()
        assert "training a run of another project (host 1 of 2)<br>" in content
        assert "secret plan" not in content and run.public_id not in content

    def test_it_names_serving_copies_and_chat_answers(self, team, client_for):
        base_model = make_base_model(team.project, name="tiny")
        copy = ServingCopy.objects.create(project=team.project, base_model=base_model, scheme="int4")
        conversation = Conversation.objects.create(project=team.project, user=team.owner, title="private title",
                                                   model_ref=base_model.public_id, model_label="Base model: tiny")
        answer = Message.objects.create(conversation=conversation, role=Role.ASSISTANT, status=MessageStatus.STREAMING)
        request = {"id": answer.public_id, "message": answer.public_id, "model_key": "k" * 300, "model_path": "/m"}
        # As the heartbeat lists them: "task.name argsrepr", cut at 200 characters.
        record("serve@gpu1", queues=["serve"], current_jobs=[
            f"worker.tasks.serve.make_serving_copy [{copy.pk}]", f"worker.tasks.serve.generate {[request]!r}"[:200]])
        content = client_for(team.teammate).get(self.url).content.decode()
        assert (f'writing the int4 serving copy of <a href="/p/alpha/models/{base_model.public_id}/">tiny</a><br>'
                in content)
        assert f"answering \u2068alpha-owner\u2069&#x27;s chat conversation {conversation.public_id}<br>" in content
        assert "private title" not in content
        content = client_for(team.outsider).get(self.url).content.decode()
        assert "writing the int4 serving copy of a base model of another project<br>" in content
        assert "answering a chat message of another project<br>" in content
        assert "tiny" not in content and conversation.public_id not in content

    def test_it_words_a_job_it_cannot_look_up(self, team, client_for):
        record(current_jobs=["worker.tasks.train.train_run [99999, 1]", "worker.tasks.train.export_checkpoint [1, 2",
                             "celery.chord_unlock []"])
        content = client_for(team.viewer).get(self.url).content.decode()
        assert "training a run deleted since<br>export checkpoint<br>chord unlock<br>" in content
