"""Placement of multi-host runs: N free workers of the run's pool reserved together and sent one task
each, or none reserved and the run waits with its reason, until it times out and fails. Host pools
of single-host runs are their queues."""
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.webapp.runs.conftest import sft_spec
from webapp.runs import placement, reporting, services
from webapp.runs.models import Run, RunStatus
from webapp.workers.models import Worker

HOST_TASK = "worker.tasks.train.train_host"


def make_worker(name: str, *, pool: str = "tpu", port: int = 8476, seen_ago: int = 1, jobs=(), **fields) -> Worker:
    now = timezone.now()
    queue = "train" if pool == "default" else f"train-{pool}"
    return Worker.objects.create(name=name, host=name.split("@")[-1], pid=1, queues=[queue], pool=pool,
                                 address=f"10.0.0.{len(name)}", coordinator_port=port, current_jobs=list(jobs),
                                 started_at=now, last_seen=now - timedelta(seconds=seen_ago), **fields)


def launch(team, catalog, capture, *, hosts=2, pool="tpu") -> Run:
    with capture(execute=True):
        return services.run_create(project=team.project, spec=sft_spec(catalog, hosts=hosts, pool=pool),
                                   user=team.teammate)


def host_calls(sent_tasks) -> list[tuple[list, str]]:
    return [(args, queue.name) for name, args, queue in sent_tasks.calls if name == HOST_TASK]


def test_it_reserves_n_free_workers_and_sends_each_its_process(team, catalog, sent_tasks,
                                                               django_capture_on_commit_callbacks):
    first, second = make_worker("train-tpu@host-a"), make_worker("train-tpu@host-b", port=9000)
    run = launch(team, catalog, django_capture_on_commit_callbacks)
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.hosts == 2 and run.waiting_reason == ""
    coordinator = f"{first.address}:8476"
    assert host_calls(sent_tasks) == [
        ([run.pk, 1, 0, 2, coordinator], "train-tpu@host-a.dq2"),
        ([run.pk, 1, 1, 2, coordinator], "train-tpu@host-b.dq2"),
    ]
    assert run.placement == {"attempt": 1, "pool": "tpu", "coordinator": coordinator, "hosts": [
        {"process": 0, "worker": first.name, "address": first.address},
        {"process": 1, "worker": second.name, "address": second.address}]}
    assert set(Worker.objects.values_list("reserved_run", "reserved_attempt")) == {(run.pk, 1)}
    assert "placed on 2 workers of pool tpu" in run.log_lines.last().message
    assert services.TRAIN_TASK not in sent_tasks.names  # never on the pool's queue
    assert not placement.run_place(run=run)  # placed once per attempt


def test_without_enough_free_workers_it_waits_with_the_reason_and_reserves_nothing(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    make_worker("train-tpu@host-a")
    make_worker("train-tpu@busy", jobs=["worker.tasks.train.train_run (3, 1)"])
    make_worker("train-tpu@stale", seen_ago=120)
    make_worker("train-gpu@other", pool="gpu")
    make_worker("train-tpu@stopped", stopped_at=timezone.now())
    run = launch(team, catalog, django_capture_on_commit_callbacks)
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.waiting_reason == "waiting for 2 workers of pool tpu: 1 free"
    assert host_calls(sent_tasks) == [] and run.placement == {}
    assert not Worker.objects.filter(reserved_run__isnull=False).exists()  # never a partial reservation

    make_worker("train-tpu@host-c")  # a second worker comes up: the reaper's next round places it
    with django_capture_on_commit_callbacks(execute=True):
        placed = placement.runs_place_waiting()
    assert [placed_run.pk for placed_run in placed] == [run.pk]
    assert [queue for _, queue in host_calls(sent_tasks)] == ["train-tpu@host-a.dq2", "train-tpu@host-c.dq2"]


def test_a_worker_reserved_for_another_active_run_is_not_free(team, catalog, sent_tasks,
                                                             django_capture_on_commit_callbacks):
    for name in ("a", "b", "c"):
        make_worker(f"train-tpu@{name}")
    first = launch(team, catalog, django_capture_on_commit_callbacks)
    second = launch(team, catalog, django_capture_on_commit_callbacks)
    second.refresh_from_db()
    assert second.waiting_reason == "waiting for 2 workers of pool tpu: 1 free"
    assert Worker.objects.filter(reserved_run=first).count() == 2 and not Worker.objects.filter(reserved_run=second)

    # The first run ends: its reservations lapse with its attempt, even before its tasks give them back.
    Run.objects.filter(pk=first.pk).update(status=RunStatus.FAILED)
    with django_capture_on_commit_callbacks(execute=True):
        assert [run.pk for run in placement.runs_place_waiting()] == [second.pk]
    assert Worker.objects.filter(reserved_run=second).count() == 2


def test_a_reservation_lost_to_a_concurrent_placement_rolls_back_every_worker(team, catalog, sent_tasks,
                                                                             django_capture_on_commit_callbacks):
    make_worker("train-tpu@a"), make_worker("train-tpu@b")
    run = launch(team, catalog, django_capture_on_commit_callbacks, hosts=3)
    make_worker("train-tpu@c")
    rival = Run.objects.create(project=team.project, name="rival", task="sft", spec={}, resolved_spec={},
                               status=RunStatus.RUNNING)
    chosen = placement.free_workers(pool="tpu", for_run=run, now=timezone.now())
    # Between reading and reserving, another placement takes the last of the three.
    Worker.objects.filter(name="train-tpu@c").update(reserved_run=rival, reserved_attempt=1)
    assert not placement._reserve(chosen, run=run, now=timezone.now())
    assert not Worker.objects.filter(reserved_run=run).exists()


def test_a_run_that_waits_too_long_fails_with_its_reason(team, catalog, sent_tasks, settings,
                                                         django_capture_on_commit_callbacks):
    settings.TEMPER_PLACEMENT_TIMEOUT_SECONDS = 60
    make_worker("train-tpu@a", seen_ago=-61)  # still beating at the time of the check below
    run = launch(team, catalog, django_capture_on_commit_callbacks)
    later = timezone.now() + timedelta(seconds=61)
    with django_capture_on_commit_callbacks(execute=True):
        assert placement.runs_place_waiting(now=later) == []
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.finished_at == later
    assert run.error_message.startswith("waiting for 2 workers of pool tpu: 1 free after 60 s")
    assert host_calls(sent_tasks) == [] and not Worker.objects.filter(reserved_run=run).exists()


def test_a_resumed_run_is_placed_again_as_its_new_attempt(team, catalog, sent_tasks, monkeypatch,
                                                          django_capture_on_commit_callbacks):
    monkeypatch.setattr(services, "_clear_cancel_flag", lambda public_id: None)
    make_worker("train-tpu@a"), make_worker("train-tpu@b")
    run = launch(team, catalog, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)
    sent_tasks.calls.clear()
    run.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        services.run_resume(run=run, user=None)
    run.refresh_from_db()
    assert run.attempt == 2 and run.placement["attempt"] == 2
    assert [args[:3] for args, _ in host_calls(sent_tasks)] == [[run.pk, 2, 0], [run.pk, 2, 1]]


def test_a_lost_host_fails_the_attempt_once_naming_it(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    make_worker("train-tpu@a"), make_worker("train-tpu@b")
    run = launch(team, catalog, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, current_step=40)
    run.refresh_from_db()
    failed = reporting.run_fail_hosts_lost(run=run, lost=[1])
    assert failed.status == RunStatus.FAILED
    assert failed.error_message.startswith("host 1 (worker train-tpu@b) lost at step 40; the other hosts were stopped")
    assert reporting.run_fail_hosts_lost(run=run, lost=[0]) is None  # the first verdict stands
    run.refresh_from_db()
    assert "host 1" in run.error_message


def test_a_silent_multi_host_run_is_failed_by_the_reaper_not_requeued(team, catalog, sent_tasks, monkeypatch,
                                                                       django_capture_on_commit_callbacks):
    make_worker("train-tpu@a"), make_worker("train-tpu@b")
    run = launch(team, catalog, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, current_step=7,
                                         last_heartbeat=timezone.now() - timedelta(seconds=600))
    monkeypatch.setattr(placement, "silent_hosts", lambda run: [0, 1])
    assert services.runs_reap_lost() == []
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.attempt == 1
    assert run.error_message.startswith("host 0 (worker train-tpu@a) and host 1 (worker train-tpu@b) lost at step 7")


def test_a_single_host_run_goes_to_its_pools_queue(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    run = launch(team, catalog, django_capture_on_commit_callbacks, hosts=1, pool="gpu")
    assert sent_tasks.calls == [(services.TRAIN_TASK, [run.pk, 1], "train-gpu")]


@pytest.mark.parametrize("queues, pool", [(["train"], "default"), (["train-tpu-v5e"], "tpu-v5e"),
                                          (["default", "serve"], ""), (["serve", "train-gpu"], "gpu")])
def test_a_workers_pool_comes_from_its_queue(queues, pool):
    assert placement.pool_of_queues(queues) == pool
    if pool:
        assert placement.pool_queue(pool) in queues


def test_the_run_page_shows_why_it_waits_and_then_its_hosts(team, catalog, sent_tasks, client_for,
                                                           django_capture_on_commit_callbacks):
    from django.urls import reverse

    make_worker("train-tpu@a")
    run = launch(team, catalog, django_capture_on_commit_callbacks)
    page_url = reverse("runs:detail", args=[team.project.slug, run.public_id])
    page = client_for(team.viewer).get(page_url).content.decode()
    assert '<p class="card run-message" id="waiting-reason">waiting for 2 workers of pool tpu: 1 free</p>' in page
    make_worker("train-tpu@b")
    with django_capture_on_commit_callbacks(execute=True):
        placement.runs_place_waiting()
    page = client_for(team.viewer).get(page_url).content.decode()
    assert 'id="waiting-reason"' not in page
    assert "2 of pool tpu" in page and "0: train-tpu@a" in page and "1: train-tpu@b" in page
    assert client_for(team.outsider).get(page_url).status_code == 404


def test_the_workers_page_shows_each_pool_workers_state(team, catalog, sent_tasks, client_for,
                                                       django_capture_on_commit_callbacks):
    make_worker("train-tpu@a"), make_worker("train-tpu@b")
    make_worker("train-tpu@c", jobs=["worker.tasks.train.train_run (9, 1)"])
    make_worker("train-tpu@d")
    launch(team, catalog, django_capture_on_commit_callbacks)  # takes a and b
    page = client_for(team.viewer).get("/workers/").content.decode()
    states = {name: page.split(f"<strong>train-tpu@{name}</strong>")[1].split("</tr>")[0] for name in "abcd"}
    assert "reserved" in states["a"] and "reserved" in states["b"]
    assert "busy" in states["c"] and "free" in states["d"] and "10.0.0.11:8476" in states["d"]
