"""Quantized serving copies: where each model's copy lives, which directory the chat serves, and the
copies people ask for on demand (of an exported checkpoint, of a registered base model).

Design note. The engine writes a copy into a new directory and renames it into place whole
(``jaxengine.quantize.export_quantized``), ``quantization.json`` inside it; so a directory with that file
is a complete copy, and ``served_model`` — the one place that decides what a model ref serves — takes
the copy when the file is there and the unquantized model otherwise. A run's final model gets its first
copy when the run succeeds (``worker.tasks.serve.quantize_run``, no row: the run page reads the
directory, and the reason file it leaves when it fails); making it again from the run page (after a
failure, or in another scheme) goes through a row like any copy asked for. A copy asked for by hand
has a ``ServingCopy`` row: it says "being written" while a serve worker writes
it, keeps a second click from queueing a second writer, and keeps the reason when it failed — the model
then serves unquantized as before. A copy "being written" for over ``TEMPER_SERVING_COPY_STALE_SECONDS``
with no task behind it (its message lost, its worker stopped) would say so for ever: the pages that show it
fail it with that reason (``serving_copies_give_up_stale``; an automatic copy gets a failed row), so that it
can be made again. Checkpoint copies live inside the checkpoint's export, as a run's do inside ``export/``; a
base model's under ``DATA_ROOT/serving-copies/<bm_…>/``, since a registered model's directory is the user's
and may be read-only.
"""
from __future__ import annotations

import ast
import functools
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from jaxengine.data import formats
from webapp.activity.models import Verb
from webapp.activity.services import activity_record
from webapp.basemodels.models import BaseModel
from webapp.celery import app as celery_app
from webapp.core import file_stamps
from webapp.core.bidi import isolated
from webapp.datasets.models import DatasetVersion, VersionStatus
from webapp.projects.models import Project
from webapp.runs.models import (REWARD_TASK, SERVING_COPY_SCHEMES, Artifact, ArtifactKind, Run, RunStatus,
                                ServingCopy, ServingCopyStatus)
from webapp.webhooks import services as webhooks
from webapp.workers.deliveries import LostWorker

logger = logging.getLogger(__name__)

QUANTIZED_SUBDIR = "quantized"  # a run's or a checkpoint's copy inside its export
QUANTIZATION_FILE = "quantization.json"  # jaxengine.quantize.QUANTIZATION_FILE (the engine is not imported here)
BASE_MODEL_COPIES = "serving-copies"  # under DATA_ROOT, one directory per base model
MAKE_COPY_TASK = "worker.tasks.serve.make_serving_copy"
AUTOMATIC_COPY_TASK = "worker.tasks.serve.quantize_run"  # a succeeded run's first copy (args: its directory)
MAKE_COPY_QUEUE = "serve"  # the queue of the automatic copy (quantize_run): serve workers hold the engine
EVAL_LIMIT = 64  # eval rows a copy is scored on, as for a run's copy
# A base model's copy is measured on a dataset version chosen in its form ("Measure on"), uploaded in the web app: a
# problem in it is told with the launch's words (the version's Column mapping), not a job spec's data.columns.
MEASURED_ON = formats.DataSource(entry=formats.Entry.LAUNCH, key="the version to measure on")


# Where copies are, and what is served ----------------------------------------------------------------


def export_copy_dir(export_dir: str | Path) -> Path:
    """The copy of a run's export or an exported checkpoint: inside it."""
    return Path(export_dir) / QUANTIZED_SUBDIR


def base_model_copy_dir(base_model: BaseModel) -> Path:
    return Path(settings.DATA_ROOT) / BASE_MODEL_COPIES / base_model.public_id


def copy_description(copy_dir: str | Path) -> dict[str, Any] | None:
    """A copy's ``quantization.json`` (its per-module list left out), or None while there is no whole copy.

    The chat's model picker asks this of every model of the project on every request, so the parsed file
    is kept (``_description_at``) under its path and its stamp (``webapp.core.file_stamps``: inode, times, size,
    itself taken at most every few seconds): a copy made again is a new file renamed into place (another inode and
    modification time), read once its stamp is taken again; an unchanged one costs no read, no parse of its
    per-module list and, within those seconds, no ``stat``."""
    (file_stamp,) = file_stamps.stamp(copy_dir, (QUANTIZATION_FILE,))
    if file_stamp is None:  # no copy (yet), or unreadable now
        return None
    try:
        description = _description_at(str(Path(copy_dir) / QUANTIZATION_FILE), file_stamp)
    except OSError:  # gone since its stamp was taken: not kept, so asked again next time
        return None
    return dict(description) if description is not None else None


DESCRIPTIONS_KEPT = 512  # parsed quantization.json files (a few KiB each once their module list is left out)


@functools.lru_cache(maxsize=DESCRIPTIONS_KEPT)
def _description_at(path: str, _stamp: tuple) -> dict[str, Any] | None:
    """The parsed file at ``path`` as it was when it had that stamp (the key
    only: a rewritten file has another); None for one that is not a JSON object. Callers get a copy."""
    try:
        description = json.loads(Path(path).read_text())
    except ValueError:
        return None
    if not isinstance(description, dict):
        return None
    description.pop("modules", None)
    return description


@dataclass(frozen=True)
class Served:
    """The directory served for a model, and ``scheme`` (int8, int4) when it is a quantized copy, else ""."""

    path: str
    scheme: str = ""


def served_model(source_dir: str | Path, copy_dir: str | Path) -> Served:
    """What the chat, the arena, review generation and the API serve for a model: its copy once whole,
    else the unquantized model."""
    description = copy_description(copy_dir)
    if description is None:
        return Served(str(source_dir))
    return Served(str(copy_dir), str(description.get("scheme", "")))


def export_summary(description: dict[str, Any]) -> str:
    """One line of a serving copy's figures (its ``quantization.json``)."""
    parts = [f"{description.get('scheme', '?')} copy {description.get('model_bytes', 0) / 2**20:.1f} MiB "
             f"({description.get('ratio_to_bfloat16', 0):.0%} of bfloat16)"]
    if "perplexity_quantized" in description:
        parts.append(f"perplexity {description['perplexity_reference']:.4g} → {description['perplexity_quantized']:.4g} "
                     f"({description['perplexity_increase']:+.1%})")
    if "greedy_agreement" in description:
        parts.append(f"greedy agreement {description['greedy_agreement']:.0%}")
    return ", ".join(parts)


def copy_figures(copy_dir: str | Path) -> dict[str, Any] | None:
    """A copy's figures with ``path`` and a one-line ``summary``; None while there is no whole copy."""
    description = copy_description(copy_dir)
    if description is None:
        return None
    return {**description, "path": str(copy_dir), "summary": export_summary(description)}


RUN_HAS_NO_EVAL = "not measured: the run has no evaluation data"


def copy_facts(figures: dict[str, Any], *, unmeasured: str = RUN_HAS_NO_EVAL) -> list[tuple[str, str]]:
    """(label, text) lines of a copy's figures, for a page; ``unmeasured`` says why there is no quality figure."""
    mib = 2**20
    scheme = str(figures.get("scheme", "?"))
    if figures.get("group_size"):
        scheme += f", scales per group of {figures['group_size']}"
    facts = [("Scheme", scheme)]
    if "model_bytes" in figures and "bfloat16_bytes" in figures:
        facts.append(("Memory", f"{figures['model_bytes'] / mib:.1f} MiB, {figures.get('ratio_to_bfloat16', 0):.0%} of "
                                f"the bfloat16 model's {figures['bfloat16_bytes'] / mib:.1f} MiB"))
    if "perplexity_quantized" in figures:
        facts.append(("Perplexity", f"{figures['perplexity_quantized']:.4g} against {figures['perplexity_reference']:.4g} "
                                    f"unquantized ({figures['perplexity_increase']:+.1%}), on "
                                    f"{figures.get('eval_sequences', '?')} evaluation rows"))
    if "greedy_agreement" in figures:
        facts.append(("Greedy agreement", f"{figures['greedy_agreement']:.0%} of greedy tokens the same as the "
                                          f"unquantized model's, on {figures.get('eval_prompts', '?')} prompts"))
    if "perplexity_quantized" not in figures and "greedy_agreement" not in figures:
        facts.append(("Quality", unmeasured))
    facts.append(("Directory", figures["path"]))
    return facts


# Copies asked for ------------------------------------------------------------------------------------


# Written in the run directory by worker.tasks.serve.quantize_run when a run's automatic copy fails (removed
# when a copy is written), so that the run page can say why there is none.
SERVING_COPY_ERROR_FILE = "serving-copy-error.txt"


def run_export_dir(run: Run) -> Path:
    """A succeeded run's merged final model, whose copy is ``export/quantized/``."""
    return run.output_dir / "export"


def source_dir(copy: ServingCopy) -> Path:
    """The merged model a copy is made from: the run's final export, the checkpoint's export, or the base
    model's directory."""
    if copy.base_model_id is not None:
        return Path(copy.base_model.path)
    if copy.step is None:
        return run_export_dir(copy.run)
    artifact = Artifact.objects.get(run=copy.run, kind=ArtifactKind.CHECKPOINT, step=copy.step)
    return Path(artifact.path)


def copy_dir(copy: ServingCopy) -> Path:
    return base_model_copy_dir(copy.base_model) if copy.base_model_id is not None else export_copy_dir(source_dir(copy))


def _refuse_scheme(scheme: str) -> None:
    if scheme not in SERVING_COPY_SCHEMES:
        raise ValidationError({"scheme": f"{scheme!r} is not one of {', '.join(SERVING_COPY_SCHEMES)}"})


def _checkpoint_artifact(run: Run, step: int) -> Artifact:
    if run.task == REWARD_TASK:
        raise ValidationError({"step": f"run {run.public_id} is a reward model: it scores text and writes none, so it "
                                       "is not served"})
    artifact = Artifact.objects.filter(run=run, kind=ArtifactKind.CHECKPOINT, step=step).first()
    if artifact is None:
        raise ValidationError({"step": f"checkpoint {step} of {run.public_id} is not exported; export it as a starting "
                                       "model first, then make its serving copy"})
    return artifact


def final_model_copyable(run: Run) -> bool:
    """Whether a run has a final model the chat serves, so a serving copy of it: succeeded, trained here,
    writing text, its merged ``export/`` there."""
    from webapp.runs.services import EXTERNAL_TASK

    return (run.status == RunStatus.SUCCEEDED and run.task != EXTERNAL_TASK and run.generates_text
            and run_export_dir(run).is_dir())


def missing_model_files(base_model: BaseModel) -> str | None:
    """Why a copy of ``base_model`` cannot be made when its directory is gone (moved or deleted outside Temper,
    which registered it and never owned it), or lies now in another project's folder
    (``basemodels.selectors.base_model_refusal``), naming the path and what to do; None while it is there."""
    from webapp.basemodels.selectors import base_model_refusal  # basemodels.services imports this module

    if refusal := base_model_refusal(base_model=base_model):
        return refusal
    if Path(base_model.path).is_dir():
        return None
    return (f"the files of base model {isolated(base_model.name)} are missing: {base_model.path} is not there any more "
            "(moved or deleted outside Temper); put the model back at that path, or unregister it and register the "
            "model where it is now")


def missing_export_files(*, run: Run, step: int | None, directory: Path) -> str | None:
    """Why a copy of a run's exported model (its final ``export/``, or checkpoint ``step``'s export) cannot be made
    when ``directory`` is gone (moved or deleted outside Temper), naming the path and what to do; None while it is
    there. A checkpoint is exported once (``checkpoint_export_request`` refuses one already exported), so putting the
    files back, or serving another export, is what is left to the person."""
    if directory.is_dir():
        return None
    what = "final model" if step is None else f"checkpoint {step}"
    return (f"the export of {what} of run {run.public_id} is missing: {directory} is not there any more (moved or "
            "deleted outside Temper); put the export back at that path, or make the copy of another exported "
            "checkpoint of the run")


def missing_source_files(copy: ServingCopy) -> str | None:
    """``missing_model_files`` or ``missing_export_files`` for the model ``copy`` is made from."""
    if copy.base_model_id is not None:
        return missing_model_files(copy.base_model)
    return missing_export_files(run=copy.run, step=copy.step, directory=source_dir(copy))


def _eval_version_checked(project: Project, eval_version: DatasetVersion | None) -> DatasetVersion | None:
    if eval_version is None:
        return None
    if eval_version.dataset.project_id != project.pk:
        raise ValidationError({"eval_version": "choose a dataset version of this project"})
    if eval_version.status != VersionStatus.READY:
        raise ValidationError({"eval_version": f"{eval_version.dataset.name} v{eval_version.number} is "
                                               f"{eval_version.status}; choose a ready version to measure on"})
    return eval_version


def _message_lost(copy: ServingCopy) -> bool:
    """Whether a copy shown as being written has no writer any more: asked for over
    ``TEMPER_RUN_LOST_SECONDS`` ago and its message in Redis neither waiting nor delivered (the task
    acknowledges it late, so a message stays there while a worker writes). A serve worker killed
    mid-copy, or a Redis that lost its queue, would otherwise leave the copy "being written" for ever."""
    from webapp.runs.services import held_task_messages

    if copy.updated_at > timezone.now() - timedelta(seconds=settings.TEMPER_RUN_LOST_SECONDS):
        return False
    held = held_task_messages(task=MAKE_COPY_TASK, queues=(MAKE_COPY_QUEUE,), checking="serving copies")
    return held is not None and (copy.pk,) not in held


@transaction.atomic
def serving_copy_request(*, project: Project, user: AbstractBaseUser | None, scheme: str = "int8",
                         run: Run | None = None, step: int | None = None, final: bool = False,
                         base_model: BaseModel | None = None,
                         eval_version: DatasetVersion | None = None) -> tuple[ServingCopy, bool]:
    """Ask a serve worker for the serving copy of checkpoint ``step`` of ``run`` or, with ``final``, of the
    run's final model (both scored on the run's eval set), or of ``base_model`` (scored on ``eval_version``, a
    ready dataset version of the project, when given; else memory only). Returns (the copy, whether this
    request queued it): while a copy is being written, asking again queues nothing and returns it. A ready
    or failed copy is made again (another scheme, another eval set): the old copy serves until the new one
    is whole. A run's row is locked and read again: a resume, which writes its final model again, and a copy
    of that model never overlap (``services.run_resume`` waits for the copy)."""
    _refuse_scheme(scheme)
    if (base_model is None) == (run is None):
        raise ValueError("give a run's checkpoint or a base model")
    if run is not None:
        run = Run.objects.select_for_update(of=("self",)).get(pk=run.pk)
    if run is not None and final:
        if run.project_id != project.pk or step is not None:
            raise ValidationError({"run": "choose a run of this project"})
        if not final_model_copyable(run):
            raise ValidationError({"run": f"run {run.public_id} has no final model to copy: only a succeeded run "
                                          "trained here, whose model writes text, has one"})
        source = {"run": run, "step": None}
        eval_version = None  # the run's own eval set scores it
    elif run is not None:
        if run.project_id != project.pk or step is None:
            raise ValidationError({"step": "choose an exported checkpoint of a run of this project"})
        artifact = _checkpoint_artifact(run, step)
        if missing := missing_export_files(run=run, step=step, directory=Path(artifact.path)):
            raise ValidationError({"step": missing})
        source = {"run": run, "step": step}
        eval_version = None  # the run's own eval set scores it
    else:
        if base_model.project_id != project.pk:
            raise ValidationError({"base_model": "choose a base model of this project"})
        if missing := missing_model_files(base_model):
            raise ValidationError({"base_model": missing})
        source = {"base_model": base_model}
        eval_version = _eval_version_checked(project, eval_version)
    requested_by = user if user is not None and user.is_authenticated else None
    copy, created = ServingCopy.objects.select_for_update(of=("self",)).get_or_create(
        **source, defaults={"project": project, "scheme": scheme, "eval_version": eval_version,
                            "requested_by": requested_by})
    if not created:
        if copy.status == ServingCopyStatus.WRITING and not _message_lost(copy):
            return copy, False
        copy.scheme, copy.eval_version, copy.requested_by = scheme, eval_version, requested_by
        copy.status, copy.error_message, copy.notice = ServingCopyStatus.WRITING, "", ""
        copy.save(update_fields=["scheme", "eval_version", "requested_by", "status", "error_message", "notice",
                                 "updated_at"])
    activity_record(project=project, actor=user, verb=Verb.SERVING_COPY_REQUESTED, target=run or base_model,
                    details={"scheme": scheme, **({"step": step} if step is not None else {})})
    copy_pk = copy.pk
    transaction.on_commit(lambda: celery_app.send_task(MAKE_COPY_TASK, args=[copy_pk], queue=MAKE_COPY_QUEUE))
    return copy, True


def _live_tasks(task: str, *, acknowledged_late: bool) -> set[tuple] | None:
    """The arguments of every ``task`` waiting or being done: those of its messages Redis holds in the serve
    queue or as delivered (where a task acknowledged late stays while it runs) and of the jobs that live
    workers' heartbeats list as running. None when that cannot be told: Redis cannot be asked, a task
    acknowledged early is running while heartbeats are off, or a heartbeat's job is cut too short to read."""
    from webapp.runs.services import held_task_messages
    from webapp.workers.models import Worker, stale_after

    if not acknowledged_late and settings.TEMPER_HEARTBEAT_SECONDS == 0:
        return None
    held = held_task_messages(task=task, queues=(MAKE_COPY_QUEUE,), checking="serving copies being written")
    if held is None:
        return None
    live = set(held)
    workers = Worker.objects.filter(stopped_at__isnull=True, last_seen__gte=timezone.now() - stale_after())
    for jobs in workers.values_list("current_jobs", flat=True):
        for job in jobs:  # "task.name argsrepr" (worker.heartbeat.current_jobs), at most 200 characters
            name, _space, arguments = job.partition(" ")
            if name != task:
                continue
            try:
                live.add(tuple(ast.literal_eval(arguments)))
            except (ValueError, SyntaxError, TypeError):
                return None
    return live


def _stale_reason(since: datetime) -> str:
    minutes = int((timezone.now() - since).total_seconds() // 60)
    return (f"the worker never finished writing this copy: {minutes} minutes after it was asked for, no serve worker "
            "holds its task (its message was lost, or its worker stopped); make it again")


def _stale_cutoff() -> datetime:
    return timezone.now() - timedelta(seconds=settings.TEMPER_SERVING_COPY_STALE_SECONDS)


def serving_copies_give_up_stale(*, copies: list[ServingCopy]) -> None:
    """Fail each of ``copies`` shown as being written for over ``TEMPER_SERVING_COPY_STALE_SECONDS`` whose
    task is neither waiting nor running (``_live_tasks``), with the reason, so that its page offers to make
    it again; the rows are updated in place. Only a copy still as it was read is failed (a worker that
    records it meanwhile wins), and nothing is decided while Redis cannot be asked. Redis is asked only
    when some copy is that old."""
    cutoff = _stale_cutoff()
    stale = [copy for copy in copies if copy.status == ServingCopyStatus.WRITING and copy.updated_at < cutoff]
    if not stale:
        return
    live = _live_tasks(MAKE_COPY_TASK, acknowledged_late=True)
    if live is None:
        return
    for copy in stale:
        if (copy.pk,) in live:
            continue
        reason = _stale_reason(copy.updated_at)
        with transaction.atomic():
            still = ServingCopy.objects.select_for_update(of=("self",)).filter(
                pk=copy.pk, status=ServingCopyStatus.WRITING, updated_at=copy.updated_at).first()
            if still is None:  # recorded meanwhile, or asked for again
                continue
            _copy_end(still, status=ServingCopyStatus.FAILED, error_message=reason)
        logger.warning("serving copy %s given up: %s", copy.pk, reason)
        copy.status, copy.error_message, copy.notice, copy.updated_at = (still.status, still.error_message,
                                                                         still.notice, still.updated_at)


def _automatic_copy_given_up(run: Run, scheme: str) -> ServingCopy | None:
    """The failed row that stands for a succeeded run's automatic copy (``quantize_run``, which has no row;
    its message is acknowledged when done, so Redis holds it while it runs) when the run finished over
    ``TEMPER_SERVING_COPY_STALE_SECONDS`` ago without a copy or a reason file and no worker holds that task;
    else None (still being written, or not to be told). Once the row is there, the copy is made again like
    any other."""
    if run.finished_at is None or run.finished_at >= _stale_cutoff():
        return None
    live = _live_tasks(AUTOMATIC_COPY_TASK, acknowledged_late=True)
    if live is None or (str(run.output_dir),) in live:
        return None
    reason = _stale_reason(run.finished_at)
    with transaction.atomic():  # the row stands for the copy that was being written, and ends as the others do
        copy, created = ServingCopy.objects.get_or_create(
            run=run, step=None, defaults={"project_id": run.project_id, "scheme": scheme,
                                          "status": ServingCopyStatus.WRITING})
        if created:
            _copy_end(copy, status=ServingCopyStatus.FAILED, error_message=reason)
    if created:
        logger.warning("automatic serving copy of %s given up: %s", run.public_id, reason)
    return copy


def request_message(copy: ServingCopy, queued: bool, *, of: str, meanwhile: str, again: bool = False
                    ) -> tuple[int, str]:
    """(message level, text) a page shows after asking for ``copy`` of ``of`` (``serving_copy_request``'s
    answer); ``meanwhile``: what the chat serves until the copy is whole."""
    if queued:
        return messages.SUCCESS, (f"Making the {copy.scheme} serving copy of {of}{' again' if again else ''}; the chat "
                                  f"serves it once it is written, and {meanwhile} until then.")
    return messages.INFO, f"The {copy.scheme} serving copy of {of} is already being written."


def serving_copy_pending(*, copy_pk: int) -> ServingCopy | None:
    """The copy a worker is to write, or None (the message is dropped) when it is not waiting for one: it
    ended already (a message delivered twice) or its model is gone."""
    copy = ServingCopy.objects.select_related("run", "base_model", "eval_version__dataset").filter(pk=copy_pk).first()
    if copy is None or copy.status != ServingCopyStatus.WRITING:
        logger.info("serving copy %s is not waiting to be written; message dropped", copy_pk)
        return None
    return copy


def serving_copy_requeued(arguments: tuple, *, lost: LostWorker) -> bool:
    """Say on a copy being written that its worker was lost and the copy was queued again
    (``workers.deliveries.FIRST_LOSS_NOTES``), in its ``notice``, which its card shows beside "being written" and
    the copy's outcome clears; not in ``error_message``, which holds a failure only. Whether it was said (not for a
    copy ended meanwhile).
    ``updated_at`` is kept: a copy's silence is counted from it (``serving_copies_give_up_stale``)."""
    (copy_pk,) = arguments
    return ServingCopy.objects.filter(pk=copy_pk, status=ServingCopyStatus.WRITING).update(
        notice=lost.note(doing="writing this copy", work="the copy")) > 0


def automatic_copy_requeued(arguments: tuple, *, lost: LostWorker) -> bool:
    """Say in a succeeded run's log that the worker writing its first serving copy (``quantize_run``, which has no
    row) was lost and the copy was queued again (``workers.deliveries.FIRST_LOSS_NOTES``). Whether it was said (not
    for a run deleted meanwhile)."""
    from webapp.runs.services import log_line

    (run_dir,) = arguments
    run = _run_of_directory(run_dir)
    if run is None:
        return False
    log_line(run, lost.note(doing="writing the serving copy of its final model", work="the copy"), level="warning")
    return True


def _run_of_directory(run_dir: Any) -> Run | None:
    # A run's directory is DATA_ROOT/runs/<its public id> (runs.services.run_output_dir).
    return Run.objects.select_related("project").filter(public_id=Path(str(run_dir)).name).first()


def automatic_copy_ended(*, run_dir: str, scheme: str, error: str = "") -> None:
    """Tell the project's ``export.ready``/``export.failed`` webhooks that the copy a run's success queued
    (``quantize_run``) was written or failed (``error``: the engine's words, said as the run page says them), as
    ``_copy_end`` tells them of a copy asked for by hand: the same payload, of a row that stands for the copy and is
    not saved, since the run page reads this copy from its directory. Nothing for a run deleted meanwhile, nor once
    its final model's copy has a row (given up by a page, or asked for again): that row's end is the one told."""
    run = _run_of_directory(run_dir)
    if run is None or ServingCopy.objects.filter(run=run, step__isnull=True).exists():
        return
    if error:
        from webapp.runs.reporting import in_project_terms  # reporting builds on the services this module's users do

        error = in_project_terms(run, error)[:4000]
    webhooks.serving_copy_ended(copy=ServingCopy(
        project_id=run.project_id, run=run, step=None, scheme=scheme, error_message=error,
        status=ServingCopyStatus.FAILED if error else ServingCopyStatus.READY))


@transaction.atomic
def serving_copy_finish(*, copy_pk: int, error: BaseException | str | None = None) -> ServingCopy:
    """Record that the copy is written (its figures are in its ``quantization.json``) or why it is not: an
    exception the engine raised (shown with its type, the file of the version measured on named as the version, as
    ``reporting.in_project_terms`` names a run's), or a reason already in words. Its project's
    ``export.ready``/``export.failed`` webhooks are told (``_copy_end``)."""
    copy = ServingCopy.objects.select_for_update(of=("self",)).select_related("eval_version__dataset").get(pk=copy_pk)
    if error is None:
        return _copy_end(copy, status=ServingCopyStatus.READY)
    reason = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    if copy.eval_version is not None:
        reason = reason.replace(str(copy.eval_version.absolute_path), str(copy.eval_version))
    if copy.run_id is not None:  # scored on the run's own eval set: its version by name
        from webapp.runs.reporting import in_project_terms  # reporting builds on the services this module's users do

        reason = in_project_terms(copy.run, reason)
    return _copy_end(copy, status=ServingCopyStatus.FAILED, error_message=reason[:4000])


def _copy_end(copy: ServingCopy, *, status: str, error_message: str = "") -> ServingCopy:
    """The one way a serving copy's row ends, whoever tells (its worker, ``serving_copy_finish``; a page giving up on
    it, ``serving_copies_give_up_stale``; an automatic copy given up, ``_automatic_copy_given_up``): its outcome saved
    and, when that changed its status, its project's ``export.ready``/``export.failed`` webhooks told, so that no way
    of ending is silent. The caller holds the row locked (or has just made it); the same end reported again (a
    redelivered message) is not a second end."""
    was = copy.status
    copy.status, copy.error_message, copy.notice = status, error_message, ""
    copy.save(update_fields=["status", "error_message", "notice", "updated_at"])
    if copy.status != was:
        webhooks.serving_copy_ended(copy=copy)
    return copy


def copy_state(copy: ServingCopy | None, directory: Path, *, unmeasured: str = RUN_HAS_NO_EVAL) -> dict[str, Any]:
    """What a page says of a copy: ``state`` ``writing`` (with its ``scheme``), ``ready`` (its ``facts``),
    ``failed`` (its ``message``) or ``none``; ``served`` is the scheme of the whole copy that serves now
    ("" for none), since a copy made again serves the old one until the new one is whole."""
    figures = copy_figures(directory)
    served = str(figures.get("scheme", "")) if figures else ""
    if copy is not None and copy.status == ServingCopyStatus.WRITING:
        # The notice of a worker lost on it once (``serving_copy_requeued``).
        return {"state": "writing", "scheme": copy.scheme, "served": served, "copy": copy, "note": copy.notice}
    if copy is not None and copy.status == ServingCopyStatus.FAILED:
        return {"state": "failed", "message": copy.error_message, "scheme": copy.scheme, "served": served,
                "copy": copy}
    if figures is not None:
        return {"state": "ready", "facts": copy_facts(figures, unmeasured=unmeasured), "served": served,
                "copy": copy, **figures}
    return {"state": "none", "served": "", "copy": copy}


BASE_MODEL_UNMEASURED = ("not measured: perplexity and greedy agreement need eval prompts, which a base model does "
                         "not have; make the copy again with a ready dataset version of the project to measure on")


def base_model_serving_copy(*, base_model: BaseModel) -> dict[str, Any]:
    copy = ServingCopy.objects.filter(base_model=base_model).select_related("eval_version__dataset").first()
    serving_copies_give_up_stale(copies=[copy] if copy is not None else [])
    return copy_state(copy, base_model_copy_dir(base_model), unmeasured=BASE_MODEL_UNMEASURED)


def final_serving_copy(*, run: Run, automatic_scheme: str) -> dict[str, Any]:
    """The state of a succeeded run's final-model copy (``copy_state``'s, with ``automatic`` True while the
    copy shown is the one written when the run succeeded, and there is no row): a copy made again has a row
    and reads like any other; before that, the automatic copy is ``ready`` once whole, ``failed`` when its
    reason file is there, else ``writing`` (``automatic_scheme``, ``TEMPER_SERVE_QUANTIZE``) until it is
    given up (``_automatic_copy_given_up``) — or ``none`` when nothing writes one
    (``TEMPER_SERVE_QUANTIZE=none``), which the card offers to make."""
    copy = ServingCopy.objects.filter(run=run, step__isnull=True).first()
    serving_copies_give_up_stale(copies=[copy] if copy is not None else [])
    state = copy_state(copy, export_copy_dir(run_export_dir(run)))
    if copy is not None or state["state"] != "none":
        return {**state, "automatic": copy is None}
    try:
        message = (run.output_dir / SERVING_COPY_ERROR_FILE).read_text()[:2000]
    except OSError:
        message = None
    if message is not None:  # the serve worker wrote the engine's words: the run's files as the project names them
        from webapp.runs.reporting import in_project_terms  # reporting builds on the services this module's users do

        message = in_project_terms(run, message)
    if message is not None:
        return {"state": "failed", "message": message, "scheme": automatic_scheme, "served": "", "copy": None,
                "automatic": True}
    if automatic_scheme == "none":
        return {**state, "automatic": False}
    if (given_up := _automatic_copy_given_up(run, automatic_scheme)) is not None:
        return {**copy_state(given_up, export_copy_dir(run_export_dir(run))), "automatic": False}
    return {"state": "writing", "scheme": automatic_scheme, "served": "", "copy": None, "automatic": True}


def checkpoint_serving_copies(*, run: Run, artifacts: dict[int, Artifact]) -> dict[int, dict[str, Any]]:
    """``{step: copy state}`` of the run's exported checkpoints (``artifacts`` by step)."""
    copies = {copy.step: copy for copy in ServingCopy.objects.filter(run=run)}
    serving_copies_give_up_stale(copies=[copies[step] for step in artifacts if step in copies])
    return {step: copy_state(copies.get(step), export_copy_dir(artifact.path)) for step, artifact in artifacts.items()}


def eval_version_choices(*, project: Project) -> list[DatasetVersion]:
    """Ready dataset versions of the project a base model's copy can be measured on, newest first."""
    return list(DatasetVersion.objects.select_related("dataset")
                .filter(dataset__project=project, status=VersionStatus.READY)
                .order_by("dataset__name", "-number"))
