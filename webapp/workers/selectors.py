"""Reads of worker heartbeats for the Workers page, ``/metrics`` and the host pools a launch can use.

The jobs a heartbeat lists are Celery's ``task.name argsrepr`` strings (``worker.heartbeat.current_jobs``):
database keys. ``current_jobs_shown`` words each as the rest of the pages do ("training" and the run's name,
linked to its page); the Workers page is open to every logged-in user, so the thing a job works on is named
only to members of its project, and to anyone else in neutral words ("a run of another project").
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePath
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from webapp.core.bidi import isolated
from webapp.core.model_refs import checkpoint_of
from webapp.workers.models import FORGET_AFTER, Worker, stale_after


def worker_list(*, now: datetime | None = None, viewer: AbstractBaseUser | None = None) -> list[Worker]:
    """The workers heard from within ``FORGET_AFTER``, by name, each with ``state``
    set (alive / stale / stopped) as of ``now``; with a ``viewer``, each with ``jobs_shown`` too
    (``current_jobs_shown``: its running jobs as that person may see them)."""
    now = now or timezone.now()
    workers = list(Worker.objects.filter(last_seen__gte=now - FORGET_AFTER).select_related("reserved_run").order_by("name"))
    projects = _member_project_ids(viewer) if viewer is not None else set()
    for worker in workers:
        worker.state = worker.state_at(now)
        if viewer is not None:
            worker.jobs_shown = current_jobs_shown(jobs=worker.current_jobs, projects=projects)
    return workers


@dataclass(frozen=True, kw_only=True)
class JobShown:
    """A running job in words: what it does (``doing``), to what (``name``, linked by ``url``: empty where the
    viewer is not a member of its project, ``doing`` then says what in neutral words) and ``after`` that."""

    doing: str
    name: str = ""
    url: str = ""
    after: str = ""


def current_jobs_shown(*, jobs: list[str], projects: set[int]) -> list[JobShown]:
    """Each of a heartbeat's ``jobs`` (``task.name argsrepr``) as a person who is a member of ``projects`` (their
    ids) may see it: named and linked within those projects, in neutral words elsewhere."""
    return [_job_shown(job, projects=projects) for job in jobs]


def _member_project_ids(user: AbstractBaseUser) -> set[int]:
    from webapp.projects.models import Membership

    if not user.is_authenticated:
        return set()
    return set(Membership.objects.filter(user=user).values_list("project_id", flat=True))


# A generation's request is a dict whose repr (cut at 200 characters) begins with its id.
_GENERATION_ID = re.compile(r"""^[\[(]\{'id': '([^'\\]+)'""")


def _job_shown(job: str, *, projects: set[int]) -> JobShown:
    task, _space, arguments = job.partition(" ")
    if task == "worker.tasks.serve.generate":
        found = _GENERATION_ID.match(arguments)
        return _generation_shown(found.group(1) if found else "", projects=projects)
    unread = JobShown(doing=task.rpartition(".")[2].replace("_", " "))  # "export checkpoint"
    describe = _DESCRIBE.get(task)
    try:
        parsed = ast.literal_eval(arguments)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # cut short, or not ours
        return unread
    if describe is None or not isinstance(parsed, (list, tuple)):
        return unread
    try:
        return describe(*parsed, projects=projects)
    except (TypeError, ValueError, OverflowError):  # arguments of another shape: an older or newer worker
        return unread


def _named(doing: str, *, project_id: int | None, projects: set[int], name: str, url: str, what: str,
           after: str = "") -> JobShown:
    """``doing`` + ``name`` (linked) for a member of the project, ``doing`` + ``what`` "of another project" for anyone
    else; ``what`` "deleted since" where the thing is gone (``project_id`` None)."""
    if project_id is None:
        return JobShown(doing=f"{doing} {what} deleted since", after=after)
    if project_id not in projects:
        return JobShown(doing=f"{doing} {what} of another project", after=after)
    return JobShown(doing=doing, name=name, url=url, after=after)


def _run_job(doing: str, run_pk: Any, *, projects: set[int], after: str = "") -> JobShown:
    from webapp.runs.models import Run

    run = Run.objects.filter(pk=int(run_pk)).select_related("project").first()
    return _run_named(doing, run, projects=projects, after=after)


def _run_named(doing: str, run, *, projects: set[int], after: str = "") -> JobShown:
    if run is None:
        return _named(doing, project_id=None, projects=projects, name="", url="", what="a run", after=after)
    return _named(doing, project_id=run.project_id, projects=projects, name=run.name, what="a run", after=after,
                  url=reverse("runs:detail", args=[run.project.slug, run.public_id]))


def _train_run(run_pk: Any, attempt: Any, *, projects: set[int]) -> JobShown:
    return _run_job("training", run_pk, projects=projects,
                    after=f" (attempt {int(attempt)})" if int(attempt) > 1 else "")


def _train_host(run_pk: Any, attempt: Any, process_id: Any, num_processes: Any, coordinator_address: Any = None, *,
                projects: set[int]) -> JobShown:
    return _run_job("training", run_pk, projects=projects,
                    after=f" (host {int(process_id) + 1} of {int(num_processes)})")


def _export_checkpoint(run_pk: Any, step: Any, *, projects: set[int]) -> JobShown:
    return _run_job(f"exporting checkpoint {int(step)} of", run_pk, projects=projects)


def _quantize_run(run_dir: Any, *, projects: set[int]) -> JobShown:
    from webapp.runs.models import Run

    # A run's directory is DATA_ROOT/runs/<its public id> (runs.services.run_output_dir).
    run = Run.objects.filter(public_id=PurePath(str(run_dir)).name).select_related("project").first()
    return _run_named("writing the serving copy of", run, projects=projects)


def _make_serving_copy(copy_pk: Any, *, projects: set[int]) -> JobShown:
    from webapp.runs.models import ServingCopy

    copy = (ServingCopy.objects.filter(pk=int(copy_pk)).select_related("project", "run", "base_model").first())
    if copy is None:
        return _named("writing", project_id=None, projects=projects, name="", url="", what="a serving copy")
    step = f" checkpoint {copy.step} of" if copy.step is not None else ""
    doing = f"writing the {copy.scheme} serving copy of{step}"
    if copy.base_model is not None:
        return _named(doing, project_id=copy.project_id, projects=projects, name=copy.base_model.name,
                      what="a base model",
                      url=reverse("basemodels:detail", args=[copy.project.slug, copy.base_model.public_id]))
    return _named(doing, project_id=copy.project_id, projects=projects, name=copy.run.name, what="a run",
                  url=reverse("runs:detail", args=[copy.project.slug, copy.run.public_id]))


def _export_stage(pipeline_pk: Any, stage: Any, *, projects: set[int]) -> JobShown:
    from webapp.runs.models import Pipeline

    pipeline = Pipeline.objects.filter(pk=int(pipeline_pk)).select_related("project").first()
    doing, after = "writing the serving copy of pipeline", f" (stage {int(stage) + 1})"
    if pipeline is None:
        return _named(doing, project_id=None, projects=projects, name="", url="", what="a pipeline", after=after)
    return _named(doing, project_id=pipeline.project_id, projects=projects, name=pipeline.name, what="a pipeline",
                  after=after, url=reverse("runs:pipeline", args=[pipeline.project.slug, pipeline.public_id]))


def _version_job(doing: str, version_pk: Any, *, projects: set[int]) -> JobShown:
    from webapp.datasets.models import DatasetVersion

    version = DatasetVersion.objects.filter(pk=int(version_pk)).select_related("dataset__project").first()
    if version is None:
        return _named(doing, project_id=None, projects=projects, name="", url="", what="a dataset version")
    dataset = version.dataset
    return _named(doing, project_id=dataset.project_id, projects=projects, name=f"{dataset.name} v{version.number}",
                  what="a dataset version",
                  url=reverse("datasets:version", args=[dataset.project.slug, dataset.public_id, version.number]))


def _validate_dataset_version(version_pk: Any, *, projects: set[int]) -> JobShown:
    return _version_job("validating", version_pk, projects=projects)


def _compute_token_statistics(version_pk: Any, base_model_pk: Any, *, projects: set[int]) -> JobShown:
    return _version_job("counting the tokens of", version_pk, projects=projects)


def _campaign_job(doing: str, campaign_pk: Any, *, projects: set[int]) -> JobShown:
    from webapp.review.models import Campaign

    campaign = Campaign.objects.filter(pk=int(campaign_pk)).select_related("project").first()
    if campaign is None:
        return _named(doing, project_id=None, projects=projects, name="", url="", what="a review campaign")
    return _named(doing, project_id=campaign.project_id, projects=projects, name=campaign.name,
                  what="a review campaign",
                  url=reverse("review:detail", args=[campaign.project.slug, campaign.public_id]))


def _load_campaign_items(campaign_pk: Any, attempt: Any = None, *, projects: set[int]) -> JobShown:
    return _campaign_job("loading the items of review campaign", campaign_pk, projects=projects)


def _generate_campaign_answers(campaign_pk: Any, *, projects: set[int]) -> JobShown:
    return _campaign_job("generating the answers of review campaign", campaign_pk, projects=projects)


def _write_export(export_pk: Any, *, projects: set[int]) -> JobShown:
    from webapp.review.models import Export

    export = Export.objects.filter(pk=int(export_pk)).first()
    return _campaign_job("exporting the reviews of review campaign", export.campaign_id if export else 0,
                         projects=projects)


def _prepare(model_key: Any, model_path: Any = None, project_slug: Any = None, *, projects: set[int]) -> JobShown:
    from webapp.basemodels.models import BaseModel
    from webapp.runs.models import Run

    # The chat's cache key: "<ref>@<path>[#scheme]", ref a base model's id, a run's, or "<run id>:step-<N>".
    ref = str(model_key).partition("@")[0]
    doing = "loading for the chat"
    if ref.startswith("run_"):
        run_id, step = checkpoint_of(ref) or (ref, "")
        run = Run.objects.filter(public_id=run_id).select_related("project").first()
        return _run_named(f"loading checkpoint {step} of" if step else "loading", run, projects=projects,
                          after=" for the chat")
    base_model = BaseModel.objects.filter(public_id=ref).select_related("project").first()
    if base_model is None:
        return _named(doing, project_id=None, projects=projects, name="", url="", what="a model")
    return _named("loading", project_id=base_model.project_id, projects=projects, name=base_model.name,
                  what="a base model", after=" for the chat",
                  url=reverse("basemodels:detail", args=[base_model.project.slug, base_model.public_id]))


def _generation_shown(generation_id: str, *, projects: set[int]) -> JobShown:
    """A chat, arena or ``/v1`` answer, named as a model's deletion names one it waits for (``chat.selectors.
    answers_being_written``): by its author and the conversation's id, the title being private to the author."""
    from webapp.chat.models import ApiGeneration, Battle, Message

    message = (Message.objects.filter(public_id=generation_id).select_related("conversation__user").first()
               if generation_id else None)
    if message is not None:
        conversation = message.conversation
        if conversation.project_id not in projects:
            return JobShown(doing="answering a chat message of another project")
        if conversation.in_arena:
            battle = Battle.objects.filter(Q(side_a=conversation) | Q(side_b=conversation)).first()
            return JobShown(doing=f"answering {isolated(conversation.user.get_username())}'s arena battle "
                                  f"{battle.public_id if battle else conversation.public_id}")
        return JobShown(doing=f"answering {isolated(conversation.user.get_username())}'s chat conversation "
                              f"{conversation.public_id}")
    # A /v1 completion of several prompts queues one generation a prompt, "<id>-<n>".
    completion = (ApiGeneration.objects.filter(public_id__in={generation_id, generation_id.rpartition("-")[0]})
                  .select_related("user").first())
    if completion is None:
        return JobShown(doing="answering a chat message or /v1 completion")
    if completion.project_id not in projects:
        return JobShown(doing="answering a /v1 completion of another project")
    author = isolated(completion.user.get_username())
    return JobShown(doing=f"answering {author}'s /v1 completion {completion.public_id}")


_DESCRIBE: dict[str, Callable[..., JobShown]] = {
    "worker.tasks.train.train_run": _train_run,
    "worker.tasks.train.train_host": _train_host,
    "worker.tasks.train.export_checkpoint": _export_checkpoint,
    "worker.tasks.train.export_stage": _export_stage,
    "worker.tasks.serve.quantize_run": _quantize_run,
    "worker.tasks.serve.make_serving_copy": _make_serving_copy,
    "worker.tasks.serve.prepare": _prepare,
    "worker.tasks.datasets.validate_dataset_version": _validate_dataset_version,
    "worker.tasks.datasets.compute_token_statistics": _compute_token_statistics,
    "worker.tasks.review.load_campaign_items": _load_campaign_items,
    "worker.tasks.review.generate_campaign_answers": _generate_campaign_answers,
    "worker.tasks.review.write_export": _write_export,
}


def queue_unserved(queue: str, *, now: datetime | None = None) -> bool:
    """Whether no live worker (a heartbeat within ``stale_after()``, not stopped) consumes ``queue``, so that its
    tasks wait for one. False where workers send no heartbeats (``TEMPER_HEARTBEAT_SECONDS=0``): nothing tells."""
    if settings.TEMPER_HEARTBEAT_SECONDS <= 0:
        return False
    now = now or timezone.now()
    alive = Worker.objects.filter(stopped_at__isnull=True, last_seen__gte=now - stale_after())
    return not any(queue in worker.queues for worker in alive.only("queues"))


def workers_alive(*, now: datetime | None = None):
    """The workers that have sent a heartbeat within ``stale_after()`` and not stopped, by name."""
    now = now or timezone.now()
    return Worker.objects.filter(stopped_at__isnull=True, last_seen__gte=now - stale_after()).order_by("name")


def workers_alive_count(*, now: datetime | None = None) -> int:
    """How many workers have sent a heartbeat within ``stale_after()`` and not stopped."""
    return workers_alive(now=now).count()


@dataclass(frozen=True, kw_only=True)
class PoolOffer:
    """What the live train workers of one host pool offer a job, as their heartbeats say."""

    name: str
    workers: int
    # The devices each worker has, when every probed worker of the pool reports the same count
    # (None while they probe, or when they differ: then only the job's start can check a layout).
    devices_per_worker: int | None
    platform: str
    kinds: tuple[str, ...]

    def devices_for(self, hosts: int) -> int | None:
        """The devices a job of ``hosts`` processes on this pool gets (each host one worker's)."""
        return None if self.devices_per_worker is None else hosts * self.devices_per_worker

    @property
    def summary(self) -> str:
        """``2 workers × 8 gpu devices (NVIDIA H200)``, in words."""
        workers = f"{self.workers} worker{'s' if self.workers != 1 else ''}"
        if self.devices_per_worker is None:
            return f"{workers}, devices not known yet"
        device = f"{self.devices_per_worker} {self.platform} device{'s' if self.devices_per_worker != 1 else ''}"
        return f"{workers} × {device}" + (f" ({', '.join(self.kinds)})" if self.kinds else "")


def pool_offers(*, now: datetime | None = None) -> dict[str, PoolOffer]:
    """The host pools of the train workers alive at ``now`` (heartbeat within ``stale_after()``), by name."""
    now = now or timezone.now()
    by_pool: dict[str, list[Worker]] = {}
    for worker in Worker.objects.filter(stopped_at__isnull=True, last_seen__gte=now - stale_after()).exclude(pool=""):
        by_pool.setdefault(worker.pool, []).append(worker)
    offers = {}
    for name, workers in sorted(by_pool.items()):
        probed = [worker.devices for worker in workers if isinstance(worker.devices.get("count"), int)]
        counts = {devices["count"] for devices in probed}
        offers[name] = PoolOffer(
            name=name, workers=len(workers),
            devices_per_worker=counts.pop() if len(counts) == 1 and len(probed) == len(workers) else None,
            platform="/".join(sorted({str(devices.get("platform", "?")) for devices in probed})),
            kinds=tuple(sorted({kind for devices in probed for kind in devices.get("kinds", [])})))
    return offers
