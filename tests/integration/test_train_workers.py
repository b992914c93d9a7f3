"""A train worker runs each task in a fresh pool process even when started without
``--max-tasks-per-child 1`` (``worker.tasks.train._fresh_process_per_train_task``).

Why: a process that took part in a multi-host job stays in its jax.distributed group, so a second
job in it fails; the shipped scripts pass the option, but a worker started by hand reused its child.
The workers here are real Celery prefork workers started without the option; a train task that ends
at once (its run does not exist: the message is stale) is enough to see the child replaced.
"""
from __future__ import annotations

import psutil
import pytest
from celery.utils.nodenames import host_format

from tests.live import start_worker, wait_for
from webapp.celery import app

pytestmark = pytest.mark.integration

PREFORK = ("--pool", "prefork", "--concurrency", "1")


def pool_children(worker) -> set[int]:
    return {child.pid for child in psutil.Process(worker.process.pid).children()}


def max_tasks_per_child(name: str):
    stats = app.control.inspect(destination=[name], timeout=5).stats() or {}
    return stats[name]["pool"]["max-tasks-per-child"]


@pytest.mark.parametrize("queue", ["train", "train-fresh"])
def test_a_worker_of_any_train_queue_runs_one_task_per_pool_process(queue, celery_workers, transactional_db,
                                                                    tmp_path):
    name = f"test-one-task-{queue}"
    worker = start_worker(queue, redis_url=celery_workers.redis_url, log_dir=tmp_path, name=name,
                          pool_args=PREFORK)
    try:
        assert max_tasks_per_child(host_format(f"{name}@%h")) == 1
    finally:
        worker.stop()


def test_a_train_worker_replaces_its_pool_process_after_each_task(celery_workers, transactional_db, tmp_path):
    # A queue of its own: the suite's train worker also consumes "train", and could take these tasks.
    queue, name = "train-fresh", "test-fresh"
    worker = start_worker(queue, redis_url=celery_workers.redis_url, log_dir=tmp_path, name=name,
                          pool_args=PREFORK)
    try:
        for number in (1, 2):
            before = wait_for(lambda: pool_children(worker), what="the worker's pool process")
            app.send_task("worker.tasks.train.train_run", args=[0, 1], queue=queue)
            wait_for(lambda: worker.log().count("succeeded in") == number, timeout=90, what=f"train task {number} to end")
            wait_for(lambda: pool_children(worker) and not pool_children(worker) & before, timeout=30,
                     what=f"a fresh pool process after task {number}: {worker.log()[-3000:]}")
    finally:
        worker.stop()


def test_a_default_worker_keeps_its_pool_process(celery_workers, transactional_db, tmp_path):
    """Only train workers are changed: a default-queue worker's child runs task after task."""
    name = "test-fresh-default"
    worker = start_worker("default", redis_url=celery_workers.redis_url, log_dir=tmp_path, name=name,
                          pool_args=PREFORK)
    try:
        assert max_tasks_per_child(host_format(f"{name}@%h")) == "N/A"
    finally:
        worker.stop()


def test_a_train_worker_of_the_solo_pool_starts_and_says_what_it_risks(celery_workers, transactional_db, tmp_path):
    """No setting renews the process of the solo pool (tasks run in the worker's own): it says so."""
    worker = start_worker("train", redis_url=celery_workers.redis_url, log_dir=tmp_path, name="test-fresh-solo",
                          pool_args=("--pool", "solo"))
    try:
        assert "after a multi-host job it cannot run another; start it with --pool prefork" in worker.log()
    finally:
        worker.stop()
