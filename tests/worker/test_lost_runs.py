"""A train worker's main process settles the death of the pool process training a run (killed -9, out of
memory) at once, from Celery's ``task_failure`` with ``WorkerLostError``, instead of leaving the run
"running" until the reapers find its heartbeat silent for ``TEMPER_RUN_LOST_SECONDS``."""
from __future__ import annotations

import os
import tempfile
import threading
import types
import uuid

from billiard.exceptions import WorkerLostError
from celery import signals
from django.utils import timezone

import pytest

from tests.webapp.factories import make_team
from webapp.celery import app as celery_app
from webapp.core.templatetags.temper import when
from webapp.runs.models import Run, RunStatus
from worker.tasks import train

KILLED = "Worker exited prematurely: signal 9 (SIGKILL) Job: 0."


@pytest.fixture
def sent(transactional_db, monkeypatch) -> list:
    """What is sent and published, as the main process would (its rounds close their connection: no test
    transaction can wrap them)."""
    sent = []
    monkeypatch.setattr(celery_app, "send_task", lambda name, args=None, queue=None, **kwargs:
                        sent.append((name, args, queue)))
    monkeypatch.setattr("webapp.runs.reporting.publish_event", lambda public_id, event: sent.append((public_id, event)))
    return sent


def running_run(*, worker_name: str = "train@a", attempt: int = 1) -> Run:
    team = make_team()
    # An output folder no one made: the run saved no checkpoint (a shared path like /tmp/x would hold whatever
    # another run left there).
    output_dir = os.path.join(tempfile.gettempdir(), f"temper-lost-run-{uuid.uuid4().hex}")
    return Run.objects.create(project=team.project, name="r", task="sft", spec={}, resolved_spec={"output_dir": output_dir},
                              status=RunStatus.RUNNING, attempt=attempt, worker_name=worker_name, current_step=12,
                              started_at=timezone.now(), last_heartbeat=timezone.now())


def test_a_dead_training_process_requeues_its_run_with_the_reason(sent):
    run = running_run()
    requeued = train.settle_run_crash(run_pk=run.pk, attempt=1, worker_name="train@a", reason=KILLED)
    assert requeued is not None and requeued.pk == run.pk
    run.refresh_from_db()
    # Its open pages load themselves again (showing the reason), and the next attempt is queued.
    assert sent == [(run.public_id, {"type": "status", "status": "queued", "message": "", "notice": run.notice}),
                    ("worker.tasks.train.train_run", [run.pk, 2], "train")]
    assert run.status == RunStatus.QUEUED and run.attempt == 2 and run.worker_name == "" and run.error_message == ""
    assert run.notice == (f"attempt 1 was lost at step 12 on worker train@a, last heard from at "
                                 f"{when(run.last_heartbeat)} (its training process died: {KILLED}); re-queued to "
                                 "start over from step 0, as it had saved no checkpoint")
    assert run.log_lines.last().message == run.notice


def test_a_crash_of_an_attempt_that_moved_on_changes_nothing(sent):
    run = running_run(attempt=3)
    assert train.settle_run_crash(run_pk=run.pk, attempt=2, worker_name="train@a", reason=KILLED) is None
    assert train.settle_run_crash(run_pk=run.pk, attempt=3, worker_name="train@b", reason=KILLED) is None
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)  # it recorded its end, then died
    assert train.settle_run_crash(run_pk=run.pk, attempt=3, worker_name="train@a", reason=KILLED) is None
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.attempt == 3


def test_a_dead_process_whose_run_was_being_cancelled_is_cancelled(sent):
    run = running_run()
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    run.refresh_from_db()
    assert train.settle_run_crash(run_pk=run.pk, attempt=1, worker_name="train@a", reason=KILLED) is None
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and "after a cancel request" in run.error_message


def test_the_main_process_settles_a_lost_train_run_process(monkeypatch):
    """Celery sends task_failure from the worker's main process: a train_run whose pool process died is
    settled with the task's own arguments and the worker's name; an engine error is not."""
    settled, done = [], threading.Event()
    monkeypatch.setattr(train, "settle_run_crash", lambda **kwargs: (settled.append(kwargs), done.set()))

    class Task:  # what Celery passes as the sender: the task, its request on the stack
        def __init__(self, name):
            self.name, self.request = name, types.SimpleNamespace(hostname="train@a")

    sender = Task(train.train_run.name)
    signals.task_failure.send(sender=sender, exception=ValueError("an engine error"), args=[7, 2])
    signals.task_failure.send(sender=Task(train.export_checkpoint.name), exception=WorkerLostError(KILLED), args=[7, 2])
    signals.task_failure.send(sender=sender, exception=WorkerLostError(KILLED), args=[7, 2])
    assert done.wait(5)
    assert settled == [dict(run_pk=7, attempt=2, worker_name="train@a", reason=KILLED)]
