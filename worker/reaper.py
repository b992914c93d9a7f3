"""Lost-run detection in every worker's main process.

A run's heartbeat stops when the process training it dies (SIGKILL, out of memory, host lost). On
``worker_ready`` a daemon thread here calls ``webapp.runs.services.runs_reap_lost`` at once and then
every ``TEMPER_REAPER_SECONDS``: runs silent for over ``TEMPER_RUN_LOST_SECONDS``, or for two of their
heartbeats while their worker's own heartbeat is gone too, are re-queued to resume from their last
checkpoint (a pool process that dies under a living worker is settled at once by that worker:
``worker.tasks.train._pool_process_died``), and runs queued for that long whose message Redis no longer
holds (a restart without persistence) are sent again, multi-host attempts that did not start on
every host in time are placed again and multi-host runs waiting for their pool's workers are placed
when enough are free (``webapp.runs.placement``), pipelines whose export
stage's message was lost are failed with that reason (``webapp.runs.pipelines``), and so are
checkpoint exports whose message was lost (``services.checkpoint_exports_fail_lost``), which can then
be asked for again, review campaign generations whose serve worker died are settled (deleted when they were
being deleted, released, or said so and queued again: ``webapp.review.services.generations_settle_lost``, before
the next step, which would hand the message to a live worker first), and the messages that a worker killed
outright held are queued again at once instead of after Celery's hour-long visibility timeout
(``webapp.workers.deliveries``), what each works on saying so; a dataset version whose check killed two workers in turn is failed with that reason
(``webapp.datasets.services.versions_fail_abandoned``), and a review export that wrote it is told, and so are a
review campaign's item load and export (``webapp.review.services.review_work_fail_abandoned``) and an
evaluation's scoring (``webapp.evals.services.evaluations_fail_abandoned``). Webhook deliveries
overdue by ten minutes have their task sent again (``webapp.webhooks.services.deliveries_resend_overdue``). Every worker (default,
train, serve) runs it, so a lost run is found while any worker is up; the conditional update in the service makes concurrent reapers safe.
The thread lives in the main process, which a forked pool child's death does not take down; each
round is a ``worker.forking.database_round`` (no pool child is forked while it uses the database).
"""
from __future__ import annotations

import logging
import threading

from celery import signals
from django.conf import settings

from webapp.runs.pipelines import pipelines_fail_lost_exports
from webapp.runs.placement import runs_place_waiting, runs_replace_unstarted
from webapp.datasets.services import versions_fail_abandoned
from webapp.evals.services import evaluations_fail_abandoned
from webapp.review.services import export_settle, generations_settle_lost, review_work_fail_abandoned
from webapp.runs.services import checkpoint_exports_fail_lost, runs_reap_lost, runs_requeue_lost_messages
from webapp.webhooks.services import deliveries_resend_overdue
from webapp.workers.deliveries import deliveries_restore_orphaned
from worker.forking import database_round

logger = logging.getLogger(__name__)


class Reaper:
    def __init__(self, *, interval_seconds: float) -> None:
        self.interval_seconds = interval_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="temper-run-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def reap_once(self) -> None:
        """One round of checks, as a database round (no pool child forks meanwhile: ``worker.forking``)."""
        try:
            with database_round():
                for run in runs_reap_lost():
                    logger.warning("run %s was lost; re-queued as attempt %s", run.public_id, run.attempt)
                for run in runs_requeue_lost_messages():
                    logger.warning("run %s: its queue message was lost; sent again", run.public_id)
                for run in runs_replace_unstarted():
                    logger.warning("run %s: its attempt did not start on every host; placed again", run.public_id)
                for run in runs_place_waiting():
                    logger.info("run %s placed on %s hosts", run.public_id, run.hosts)
                for pipeline in pipelines_fail_lost_exports():
                    logger.warning("pipeline %s failed: its export message was lost", pipeline.public_id)
                for export in checkpoint_exports_fail_lost():
                    logger.warning("run %s: the export of checkpoint %s was lost", export.run.public_id, export.step)
                generations_settle_lost()  # logs each one
                for version in versions_fail_abandoned():  # logs each one
                    export_settle(version_id=version.pk)  # as the check's own task does after it
                review_work_fail_abandoned()  # logs each one
                evaluations_fail_abandoned()  # logs each one
                deliveries_restore_orphaned()  # logs each one
                deliveries_resend_overdue()  # logs each one
        except Exception:  # a failed check must never take the worker down; the next one retries
            logger.exception("lost-run check failed; retrying in %s s", self.interval_seconds)

    def _run(self) -> None:
        while True:
            self.reap_once()
            if self._stop.wait(self.interval_seconds):
                return


_reaper: Reaper | None = None


@signals.worker_ready.connect
def _start_reaper(sender, **kwargs) -> None:
    global _reaper
    if settings.TEMPER_REAPER_SECONDS <= 0:
        return
    _reaper = Reaper(interval_seconds=settings.TEMPER_REAPER_SECONDS)
    _reaper.start()


@signals.worker_shutdown.connect
def _stop_reaper(sender, **kwargs) -> None:
    if _reaper is not None:
        _reaper.stop()
