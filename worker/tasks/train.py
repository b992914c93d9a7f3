"""``train`` queues: run one attempt of a training run (``train_run``), or one host's process of a
multi-host run's attempt (``train_host``). Thin: claim the attempt, hand the engine a reporter,
record the outcome (``webapp.runs.reporting`` and ``worker.multihost`` hold the logic). The engine is told the run was
launched in the web app (``Entry.LAUNCH``), so that a problem in its data names the launch form's dataset versions and
their Column mapping, not a job spec's data.columns, which a user of the web never wrote."""
from __future__ import annotations

import logging
import threading

from billiard.exceptions import WorkerLostError
from celery import signals
from django.conf import settings

from jaxengine.data.formats import Entry
from jaxengine.spec import parse_spec
from webapp.basemodels.inspection import check_registered_model_dir
from webapp.celery import app
from webapp.runs import pipelines, placement, reporting, selectors, services
from webapp.runs.models import Run, RunStatus
from worker.forking import database_round
from worker.multihost import HostLiveness

logger = logging.getLogger(__name__)


@signals.worker_init.connect
def _fresh_process_per_train_task(sender=None, **_) -> None:
    """A worker of a train queue runs each task in a fresh pool process, whatever its command line says.

    A process that joined a multi-host job's jax.distributed group cannot leave it: a later run in it
    failed ("the spec asks for 1 processes, this job has 2") and a later host refused to join. The
    shipped scripts pass ``--max-tasks-per-child 1``; a worker started by hand without it reused the
    process. Set here, before the pool is made (``worker_init``), it holds for the prefork pool; the
    solo and thread pools run tasks in the worker's own process, which no setting renews."""
    pool = placement.pool_of_queues(list(sender.app.amqp.queues.consume_from))
    if not pool:
        return
    from celery.concurrency import get_implementation
    from celery.concurrency.prefork import TaskPool as PreforkPool

    if not issubclass(get_implementation(sender.pool_cls), PreforkPool):
        logger.warning("train worker %s (host pool %s) runs its tasks in its own process, not a fresh one per task: "
                       "after a multi-host job it cannot run another; start it with --pool prefork",
                       sender.hostname, pool)
        return
    if sender.max_tasks_per_child != 1:
        logger.info("train worker %s: one task per pool process (max tasks per child %s -> 1)",
                    sender.hostname, sender.max_tasks_per_child)
        sender.max_tasks_per_child = 1


@app.task(name="worker.tasks.train.train_run", bind=True, acks_late=True)
def train_run(self, run_pk: int, attempt: int) -> None:
    """Train attempt ``attempt`` of run ``run_pk``; a stale message (a later attempt exists, or the
    run was cancelled) is dropped. Engine errors fail the run and are not retried."""
    run = reporting.run_start(run_pk=run_pk, attempt=attempt, worker_name=self.request.hostname or "worker")
    if run is None:
        return
    from jaxengine.job import run_job  # imports jax: only ever in the worker, and only when training

    reporter = reporting.RunReporter(run=run)
    reporter.start()
    try:
        check_model_dir(run)
        summary = run_job(parse_spec(run.resolved_spec), should_stop=reporter.should_stop,
                          on_progress=reporter.on_progress, on_evaluation=reporter.on_evaluation,
                          on_log=reporter.log_engine_line, progress_bar=False, entry=Entry.LAUNCH,
                          provenance=selectors.run_provenance(run=run))
    except Exception as error:
        logger.exception("run %s failed", run.public_id)
        try:
            reporter.close()
        finally:
            reporting.run_fail(run=run, error=error)
            pipelines.pipeline_advance(run=run)
        return
    _report_finished(run, reporter, summary)


def check_model_dir(run: Run) -> None:
    """``ModelDirError`` (registration's words) when the directory the run starts from may not be read by its
    project: a base model registered before its directory lay in another project's folder, or linked into one since,
    was launched (or resumed) from its stored path, and trained on that project's weights."""
    model_path = run.resolved_spec.get("model")
    if isinstance(model_path, str) and model_path:
        check_registered_model_dir(model_path, models_root=settings.MODELS_ROOT, project_slug=run.project.slug)


def _report_finished(run, reporter, summary) -> None:
    """Record a run whose engine returned: its last points, its outcome, its serving copy (unless a
    pipeline's export stage writes it, in the scheme it names) and the next stage of its pipeline."""
    try:
        reporter.close()
    except RuntimeError as error:
        reporting.run_fail(run=run, error=error)
    else:
        finished = reporting.run_finish(run=run, summary=summary)
        if (finished.status == RunStatus.SUCCEEDED and settings.TEMPER_SERVE_QUANTIZE != "none"
                and finished.generates_text and not pipelines.exports_after(finished)):
            app.send_task("worker.tasks.serve.quantize_run", args=[str(finished.output_dir)], queue="serve")
    pipelines.pipeline_advance(run=run)


@app.task(name="worker.tasks.train.train_host", bind=True, acks_late=True)
def train_host(self, run_pk: int, attempt: int, process_id: int, num_processes: int, coordinator_address: str) -> None:
    """Process ``process_id`` of ``num_processes`` of a multi-host run (``webapp.runs.placement`` sent
    it to this worker): join the job's jax.distributed group and run the same engine entry point.
    Process 0 reports; a lost peer, or an attempt that ended or was placed again meanwhile, ends this
    process (``worker.multihost``); an engine error that a lost peer explains is recorded as that
    host's loss."""
    worker_name = self.request.hostname or "worker"
    run = reporting.host_start(run_pk=run_pk, attempt=attempt, process_id=process_id, worker_name=worker_name)
    if run is None:
        placement.host_release(worker_name=worker_name, run_pk=run_pk, attempt=attempt)
        return
    from jaxengine import distributed
    from jaxengine.job import run_job  # imports jax: only ever in the worker, and only when training

    liveness = HostLiveness(run=run, process_id=process_id, num_processes=num_processes, worker_name=worker_name)
    liveness.start()
    reporter = reporting.RunReporter(run=run) if process_id == 0 else None
    if reporter is not None:
        reporter.start()
    try:
        check_model_dir(run)
        distributed.initialize(distributed.ProcessGroup(
            coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id))
        summary = run_job(parse_spec(run.resolved_spec), progress_bar=False,
                          should_stop=reporter.should_stop if reporter else None,
                          on_progress=reporter.on_progress if reporter else None,
                          on_evaluation=reporter.on_evaluation if reporter else None,
                          on_log=reporter.log_engine_line if reporter else None, entry=Entry.LAUNCH,
                          provenance=selectors.run_provenance(run=run))
    except Exception as error:
        logger.exception("run %s: host %s failed", run.public_id, process_id)
        lost = liveness.wait_for_lost_peers()
        try:
            if reporter is not None:
                reporter.close()
        finally:
            if lost:
                reporting.run_fail_hosts_lost(run=run, lost=lost)
            else:
                reporting.run_fail(run=run, error=error)
            liveness.stop(finished=False)  # after the verdict: the peers then stop without overruling it
            pipelines.pipeline_advance(run=run)
        return
    finally:
        placement.host_release(worker_name=worker_name, run_pk=run.pk, attempt=attempt)
    liveness.stop(finished=True)
    distributed.shutdown()
    if reporter is not None:  # process 0 reports for the job
        _report_finished(run, reporter, summary)


@app.task(name="worker.tasks.train.export_checkpoint", acks_late=True)
def export_checkpoint(run_pk: int, step: int) -> None:
    """Export checkpoint ``step`` of run ``run_pk`` as a Hugging Face model that runs can start from.

    The engine's own ``export_run`` always writes ``<run>/export`` (the final model's place), so
    this composes the same engine calls with a directory per checkpoint, ``export-step-<step>``."""
    from jaxengine.job import build_job_model, export_trained
    from jaxengine.trainer import restore_trained_model

    run = services.checkpoint_export_pending(run_pk=run_pk, step=step)
    if run is None:
        return
    spec = parse_spec(run.resolved_spec)
    export_dir = run.output_dir / f"export-step-{step}"
    try:
        check_model_dir(run)
        job_model = build_job_model(spec)
        trained, _meta = restore_trained_model(job_model.model, trainable=job_model.trainable, optim=spec.optim,
                                               checkpoint_dir=run.output_dir / "checkpoints", step=step)
        # The provenance as it is now: a run trained before provenance.json was written has none on disk.
        export_trained(trained, spec, job_model, export_dir, step=step, provenance=selectors.run_provenance(run=run))
    except Exception as error:
        logger.exception("run %s: export of checkpoint %s failed", run.public_id, step)
        services.checkpoint_export_finish(run=run, step=step, error=error)
        return
    services.checkpoint_export_finish(run=run, step=step, export_dir=export_dir)


@app.task(name="worker.tasks.train.export_stage", acks_late=True)
def export_stage(pipeline_pk: int, stage: int) -> None:
    """A pipeline's export stage: quantize its result run's export into the serving copy
    ``export/quantized/`` (``jaxengine.quantize.quantize_run_export``) and record the outcome."""
    start = pipelines.export_stage_start(pipeline_pk=pipeline_pk, stage=stage)
    if start is None:
        return
    run, export = start
    from jaxengine.quantize import quantize_run_export  # imports jax

    try:
        description = quantize_run_export(run.output_dir, scheme_name=export["quantize"],
                                          group_size=export.get("group_size"), entry=Entry.LAUNCH)
    except Exception as error:
        logger.exception("pipeline %s: export stage %s failed", pipeline_pk, stage)
        pipelines.export_stage_finish(pipeline_pk=pipeline_pk, stage=stage, error=error)
        return
    pipelines.export_stage_finish(pipeline_pk=pipeline_pk, stage=stage, description=description)


@signals.task_failure.connect
def _pool_process_died(sender=None, exception=None, args=None, **_) -> None:
    """The worker's main process, when the pool process of a ``train_run`` or a ``train_host`` died
    (``WorkerLostError``: killed, out of memory, or aborted by the collectives library when a peer vanished):
    settle the loss in a thread, so that the worker's own loop is not held (for a host, for the peers' expiry
    time: ``worker.multihost``). A run's page then says at once what its silent heartbeat would have told
    the reapers only after ``TEMPER_RUN_LOST_SECONDS``."""
    name = getattr(sender, "name", None)
    if name not in (train_run.name, train_host.name) or not isinstance(exception, WorkerLostError):
        return
    worker_name = getattr(sender.request, "hostname", None) or "worker"
    if name == train_run.name:
        run_pk, attempt = args[:2]
        target, kwargs = settle_run_crash, dict(run_pk=run_pk, attempt=attempt, worker_name=worker_name,
                                                reason=str(exception))
    else:
        run_pk, attempt, process_id, num_processes = args[:4]
        target, kwargs = settle_host_crash, dict(run_pk=run_pk, attempt=attempt, process_id=process_id,
                                                 num_processes=num_processes, worker_name=worker_name)
    threading.Thread(target=target, name="temper-process-crash", daemon=True, kwargs=kwargs).start()


def settle_run_crash(*, run_pk: int, attempt: int, worker_name: str, reason: str) -> Run | None:
    """``services.run_attempt_lost`` for attempt ``attempt`` of run ``run_pk``, whose process on ``worker_name``
    died (``reason``, Celery's words), unless the run has moved on (finished, another attempt, another
    worker); returns the run re-queued, if it was. Runs in the worker's main process: ``database_round``."""
    try:
        with database_round():
            run = Run.objects.filter(pk=run_pk, attempt=attempt, status=RunStatus.RUNNING,
                                     worker_name=worker_name[:255]).first()
            if run is None:
                return None
            return services.run_attempt_lost(run=run, why=f"its training process died: {reason.strip()}")
    except Exception:  # the reapers find the run by its silence instead
        logger.exception("run %s: settling the crash of attempt %s failed", run_pk, attempt)
        return None


def settle_host_crash(*, run_pk: int, attempt: int, process_id: int, num_processes: int, worker_name: str) -> list[int]:
    """``HostLiveness.settle_after_crash`` for process ``process_id`` of attempt ``attempt`` of run
    ``run_pk``, unless the run has moved on to another attempt; returns the peers recorded as lost.

    It runs in the worker's main process just as billiard forks the dead process's replacement, so it
    uses the database only in ``database_round``s (``worker.forking``)."""
    try:
        with database_round():
            run = Run.objects.filter(pk=run_pk, attempt=attempt).first()
        if run is None:
            return []
        liveness = HostLiveness(run=run, process_id=process_id, num_processes=num_processes, worker_name=worker_name)
        return liveness.settle_after_crash()
    except Exception:
        logger.exception("run %s: settling host %s's crash failed", run_pk, process_id)
        return []
