"""Reads of runs for pages and endpoints: the runs table, metric series (downsampled on the
server for long runs), samples, the log, lineage, and what the compare page shows."""
from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.db.models import Count, F, FloatField, IntegerField, Max, Min, Q, QuerySet, prefetch_related_objects
from django.db.models.expressions import Combinable
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.http import Http404
from django.utils import timezone
from django.utils.text import capfirst
from django.db.models.functions import Cast

from jaxengine.evaluate import answers_match
from jaxengine.memory import ModelFacts, byte_size, estimate_disk, estimate_memory, stored_bytes_per_parameter
from jaxengine.rewards import REWARDS
from jaxengine.spec import TASK_ONLY_KEYS, TASK_SECTIONS, SpecError, best_metric_for, parse_spec
from jaxengine.words import counted
from webapp.basemodels.models import BaseModel
from webapp.basemodels.selectors import FOLDER_GONE, demo_model, gone_model_words, model_dir_gone, named_model
from webapp.core.bidi import isolated
from webapp.core.disk_free import free_and_total
from webapp.core.disk_usage import folder_usage
from webapp.core.keyset import KeysetPage, keyset_page
from webapp.core.model_refs import spec_ref
from webapp.core.warnings import ActionWarning
from webapp.datasets.models import DatasetVersion, VersionStatus
from webapp.datasets.selectors import dataset_about
from webapp.projects.models import Membership, Project, Role
from webapp.runs import channels
from webapp.runs.downsampling import SeriesBuckets, bucket_width
from webapp.runs.models import (ACTIVE_STATUSES, Artifact, ArtifactKind, CheckpointExport, CheckpointExportStatus,
                                LogLevel, MetricPoint, Pipeline, PipelineStatus, ProjectMetricName, Run, RunLogLine,
                                RunStatus, RunTag, Sample, ServingCopy, ServingCopyStatus, fold_tag)
from webapp.runs.placement import DEFAULT_POOL, pool_queue, run_pool
from webapp.runs.services import (EXTERNAL_TASK, checkpoint_delete_refusal, checkpoint_steps, final_model_step,
                                  recorded_saving_checkpoints, retry_refusal, reward_run_ids, run_output_dir)
from webapp.runs.serving_copies import (checkpoint_serving_copies, copy_figures, export_copy_dir, final_model_copyable,
                                       final_serving_copy, run_export_dir)
from webapp.runs.specform import tasks
from webapp.workers.selectors import pool_offers

# Series longer than this are reduced to min/max pairs over at most MAX_POINTS / 2 step buckets
# (``webapp.runs.downsampling``): each bucket keeps its lowest and highest value, so spikes stay
# visible at any zoom-out.
MAX_POINTS = 2000
# The compare page overlays up to ten runs per chart: fewer points per trace draw the same picture.
COMPARE_MAX_POINTS = 1000
# The most points per metric the API's metrics read takes (``max_points``): a series is read into memory whole, so
# a larger ask is refused (a 400 naming the range) rather than served, or cut short without a word.
METRICS_MAX_POINTS = 1_000_000


def final_value(name: str, key: str = "last") -> Cast:
    """A run's ``final_metrics[name][key]`` as a number for the database to order by (NULL where the
    run has not logged ``name``)."""
    return Cast(KeyTextTransform(key, KeyTransform(name, "final_metrics")), FloatField())


@dataclass(frozen=True)
class SortOrder:
    """An order of the runs table: ``value`` (a column, or a final metric), ``descending`` or not.
    Runs without a value (a metric they have not logged) come last either way; ties go newest id first."""

    value: Combinable
    descending: bool = False


# Which way a metric is better, by the words of its name (eval/, a group's /<value> and rewards/ aside): losses lower,
# rewards (every registered reward function's too: eval/<reward>, rewards/<reward>), accuracies, exact match and
# preference margins higher; any other (a KL, a learning rate, a grad norm) neither.
LOWER_IS_BETTER = frozenset({"loss", "perplexity"})
HIGHER_IS_BETTER = frozenset({"reward", "accuracy", "accuracies", "exact_match", "margin", "margins", *REWARDS})


def metric_higher_is_better(name: str) -> bool | None:
    """True where a higher value of metric ``name`` is better, False where a lower one is, None where neither:
    what the runs table's sorts go by (best first) and what the compare page's final table marks best."""
    parts = set(re.split(r"[/ ]", name))  # a shared chart's label too: "preference accuracy", "reward margin"
    if parts & LOWER_IS_BETTER:
        return False
    if parts & HIGHER_IS_BETTER:
        return True
    return None


def _best_first(name: str) -> SortOrder:
    return SortOrder(final_value(name), descending=bool(metric_higher_is_better(name)))


SORTS = {
    "newest": SortOrder(F("created_at"), descending=True), "oldest": SortOrder(F("created_at")),
    "name": SortOrder(F("name")), "-name": SortOrder(F("name"), descending=True), "status": SortOrder(F("status")),
    "task": SortOrder(F("task")), "steps": SortOrder(F("current_step"), descending=True),
    "loss": _best_first("loss"), "eval_loss": _best_first("eval/loss"), "reward": _best_first("reward"),
    "duration": SortOrder(F("train_seconds"), descending=True),
}
# Every task a run can have: the engine's, and runs logged from elsewhere.
RUN_TASKS = (*tasks(), EXTERNAL_TASK)
# What the Runs page's sort select says for each key of SORTS (the keys stay the query's values).
SORT_LABELS = {
    "newest": "newest first", "oldest": "oldest first", "name": "name A–Z", "-name": "name Z–A",
    "status": "by status", "task": "by task", "steps": "most steps first", "loss": "lowest loss first",
    "eval_loss": "lowest eval loss first", "reward": "highest reward first", "duration": "longest first",
}
# The table also sorts by any final metric: ``metric:<name>`` lowest first, ``-metric:<name>`` highest first (a run
# is read by whichever metric its task logs, eval/exact_match, accuracy, a reward's own, not only loss and reward).
METRIC_SORT = "metric:"


def sort_metric(sort: str) -> str:
    """The final metric a ``metric:<name>`` or ``-metric:<name>`` sort orders by, or "" for another sort."""
    return sort.removeprefix("-").removeprefix(METRIC_SORT) if sort.removeprefix("-").startswith(METRIC_SORT) else ""


def sort_order(sort: str) -> SortOrder:
    """The order of a sort key of ``SORTS``, or of a final metric's sort (``sort_metric``)."""
    name = sort_metric(sort)
    return SortOrder(final_value(name), descending=sort.startswith("-")) if name else SORTS[sort]


def metric_sorts(names: list[str]) -> list[tuple[str, str]]:
    """The sort select's options for the final metrics ``names``: each lowest first and highest first."""
    return [(f"{sign}{METRIC_SORT}{name}", f"{name}: {label}")
            for name in names for sign, label in (("", "lowest first"), ("-", "highest first"))]


@dataclass(frozen=True, kw_only=True)
class RunFilters:
    """The runs table's query: free-text ``search`` (a part of the name, id, a tag or the notes), ``status``, ``task``, ``tag``,
    archived runs shown or not, and a ``sort`` key of ``SORTS``; ``ignored`` says which values of the
    query were not understood and left out."""

    search: str = ""
    status: str = ""
    task: str = ""
    tag: str = ""
    archived: bool = False
    sort: str = "newest"
    ignored: tuple[str, ...] = ()
    # The query parameters ``from_query`` reads (the REST API refuses others).
    QUERY = ("q", "status", "task", "tag", "archived", "sort")

    @classmethod
    def from_query(cls, query: Any) -> RunFilters:
        """The page's filters. A status or task it cannot match (an old bookmark, an address typed by hand)
        would match nothing and read as "no such runs"; it is left out, with a note in ``ignored``."""
        values, ignored = {}, []
        for name, allowed, what in (("status", RunStatus.values, "a run status"), ("task", RUN_TASKS, "a run task"),
                                    ("sort", tuple(SORTS), "a sort order")):
            value = query.get(name, "")
            if value and value not in allowed and not (name == "sort" and sort_metric(value)):
                also = f", or {METRIC_SORT}<final metric> (-{METRIC_SORT}… highest first)" if name == "sort" else ""
                ignored.append(f"{name}={value!r}: not {what}; use one of {', '.join(allowed)}{also}")
                value = ""
            values[name] = value
        return cls(search=query.get("q", "").strip(), status=values["status"], task=values["task"],
                   tag=query.get("tag", "").strip(), archived=query.get("archived") == "1",
                   sort=values["sort"] or "newest", ignored=tuple(ignored))

    @property
    def metric(self) -> str:
        """The final metric the runs are sorted by, "" when the sort is another."""
        return sort_metric(self.sort)

    @classmethod
    def from_api_query(cls, query: Any) -> RunFilters:
        """``from_query`` for a script: the Runs page's menus send only values it can match, but a
        value typed into a query (``status=completed``, ``archived=true``) would match nothing, or be
        read as another, and look like an empty project; it is a ``ValidationError`` naming the
        parameter and the values it takes. Empty means "any", as on the page."""
        errors: dict[str, str] = {}
        for name, allowed, what in (("status", RunStatus.values, "a run status"), ("task", RUN_TASKS, "a run task")):
            value = query.get(name, "")
            if value and value not in allowed:
                errors[name] = f"{value!r} is not {what}; use one of {', '.join(allowed)}"
        archived = query.get("archived", "")
        if archived not in ("", "0", "1"):
            errors["archived"] = (f"{archived!r} is not a value of archived; use 1 (archived runs only) or 0 "
                                  "(the others, as when left out)")
        sort = query.get("sort")
        if sort is not None and sort not in SORTS and not sort_metric(sort):
            errors["sort"] = (f"{sort!r} is not one of {', '.join(SORTS)}, or {METRIC_SORT}<final metric> (lowest first; "
                              f"-{METRIC_SORT}<final metric> highest first)")
        if errors:
            raise ValidationError(errors)
        return cls.from_query(query)


# What no list of runs shows, left unread by run_list (see there).
LIST_DEFERRED_FIELDS = ("series_cache",)


def run_list(*, project: Project, filters: RunFilters = RunFilters()) -> QuerySet[Run]:
    """The project's runs matching ``filters``, with what the table shows joined in."""
    runs = Run.objects.filter(project=project, archived=filters.archived)
    if filters.search:
        # A run is found by any part of its name or of its id ("far6" finds run_far6r7yp…, as its page's
        # address shows it), of a tag or of its notes, case aside.
        runs = runs.filter(Q(name__icontains=filters.search) | Q(public_id__icontains=filters.search)
                           | Q(notes__icontains=filters.search)
                           | Q(pk__in=_with_a_tag_holding(project=project, text=filters.search)))
    if filters.status:
        runs = runs.filter(status=filters.status)
    if filters.task:
        runs = runs.filter(task=filters.task)
    if filters.tag:
        runs = _tagged(runs, project=project, tag=filters.tag)
    order = sort_order(filters.sort)
    sort_value = F("sort_value").desc(nulls_last=True) if order.descending else F("sort_value").asc(nulls_last=True)
    # A run's series_cache (its downsampled buckets and series, about a megabyte for a finished run of ten
    # metrics) is for its own page and the compare page: read for each row, it made the table seconds slow.
    return (runs.select_related("base_model", "source_run", "created_by").prefetch_related("dataset_versions__dataset")
            .defer(*LIST_DEFERRED_FIELDS, *(f"source_run__{field}" for field in LIST_DEFERRED_FIELDS))
            .annotate(sort_value=order.value).order_by(sort_value, "-id"))


def run_page(*, project: Project, filters: RunFilters, after: tuple[Any, int] | None, limit: int) -> KeysetPage[Run]:
    """The ``limit`` runs of ``run_list`` that follow the run whose sort key is ``after`` (from the
    first when None). Keyset paging, not offsets: the key is the run's value of the sort's column
    and its id (``run_list``'s tie-break), so a run launched or archived while a client reads page
    after page moves no run of the pages still to come onto one already read, or off all of them."""
    runs = run_list(project=project, filters=filters)
    if after is not None:
        value, last_id = after
        if value is None:  # among the runs without a value, which come last
            runs = runs.filter(sort_value__isnull=True, id__lt=last_id)
        else:
            beyond = "sort_value__lt" if sort_order(filters.sort).descending else "sort_value__gt"
            runs = runs.filter(Q(**{beyond: value}) | Q(sort_value=value, id__lt=last_id) | Q(sort_value__isnull=True))
    return keyset_page(runs, limit=limit, key=lambda run: (
        run.sort_value.isoformat() if hasattr(run.sort_value, "isoformat") else run.sort_value, run.pk))


def project_tags(*, project: Project) -> list[str]:
    """Every tag used in the project, sorted (from its ``RunTag`` rows: not every run's list)."""
    return sorted(RunTag.objects.filter(project=project).values_list("tag", flat=True).distinct())


def project_metric_names(*, project: Project) -> list[str]:
    """Every final metric a run of the project logged, sorted: what the runs table can sort by. Read from the
    project's ``ProjectMetricName`` rows, which the writers of ``final_metrics`` keep, not from every run."""
    return sorted(ProjectMetricName.objects.filter(project=project).values_list("name", flat=True))


def table_tasks(*, project: Project, tasks: list[str]) -> list[str]:
    """The runs table's task filter: the engine's ``tasks``, and ``external`` once the project logs such
    runs (they were listed but could not be picked out)."""
    external = Run.objects.filter(project=project, task=EXTERNAL_TASK).exists()
    return [*tasks, EXTERNAL_TASK] if external else list(tasks)


def _with_a_tag_holding(*, project: Project, text: str) -> QuerySet[RunTag]:
    # The ids of the project's runs with a tag holding ``text``, case aside, as a subquery of the run list: the
    # RunTag rows' folded text, not the JSON text of the tags (there a comma or a quote matched every tagged run, and
    # SQLite keeps "café" as "caf\u00e9"), nor each tagged run's list read here.
    return RunTag.objects.filter(project=project, tag_folded__contains=fold_tag(text)).values("run_id")


def _tagged(runs: QuerySet[Run], *, project: Project, tag: str) -> QuerySet[Run]:
    # The runs with the whole of ``tag``, case aside (a project holds one spelling of each tag: "Baseline" typed into
    # an address finds the runs tagged "baseline"), as a subquery on RunTag's (project, tag_folded) index: a LIKE over
    # the JSON text of every run's tags read each run's list, and matched "sweep-1" for "sweep-10".
    return runs.filter(pk__in=RunTag.objects.filter(project=project, tag_folded=fold_tag(tag)).values("run_id"))


def sweep_runs(*, project: Project, tag: str) -> list[Run]:
    """The runs of ``project``'s sweep ``tag`` (``services.sweep_create``), archived too, in the order
    they were queued."""
    return list(_tagged(Run.objects.filter(project=project), project=project, tag=tag)
                .order_by("id").select_related("base_model", "created_by"))


def runs_by_ids(*, project: Project, public_ids: list[str], series_cache: bool = True) -> list[Run]:
    """Runs of ``project`` in the order of ``public_ids`` (unknown ids are skipped). ``series_cache=False`` leaves
    each run's ``series_cache`` unread (the compare page's: ``runs_metric_series`` reads what it draws of it)."""
    runs = (Run.objects.filter(project=project, public_id__in=public_ids)
            .select_related("base_model", "created_by").prefetch_related("dataset_versions"))
    found = {run.public_id: run for run in (runs if series_cache else runs.defer("series_cache"))}
    return [found[public_id] for public_id in dict.fromkeys(public_ids) if public_id in found]


@dataclass(frozen=True)
class StartingModel:
    """A model a launch may start from, as ``model_choices`` lists it: ``ref`` as a spec's ``model`` names it
    (``bm_…``, ``run_…``, ``run_…@step``), its option ``label`` (names bidi-isolated) and whether its folder was
    deleted from disk since (``gone``, said in the label: the launch refuses it, ``services.gone_model``)."""

    ref: str
    label: str
    gone: bool = False


def model_choices(*, project: Project, current: Any = None) -> list[StartingModel]:
    """Starting models for a launch: registered base models, then succeeded runs' exported models, then checkpoints;
    not archived runs' (put away), except ``current``, the model the form already holds (a duplicate of a run that
    started from one). One whose folder was deleted since is still listed (a duplicate of a run may hold it), marked
    as the chat's pickers mark it; whether it is gone is the answer ``model_dir_gone`` keeps for listings, not a look
    at every model's folder on each load."""
    choices = [_starting_model(model.public_id, isolated(model.name), model.path, notes=("base model",))
               for model in BaseModel.objects.filter(project=project).order_by("name")]
    current_run = current.partition("@")[0] if isinstance(current, str) else None
    offered = Q(run__archived=False) | Q(run__public_id=current_run)
    # Only the columns the labels show and the folder: a run's whole row holds its series_cache (about a megabyte for
    # a finished run), and read for every exported model and checkpoint it made the launch form take seconds.
    exported = (Artifact.objects.filter(offered, run__project=project, run__status=RunStatus.SUCCEEDED,
                                        kind=ArtifactKind.MODEL).order_by("-run__created_at")
                .values_list("run__public_id", "run__name", "run__task", "path"))
    # The task tells a reward model (it scores, and writes no text worth reading) from a policy.
    choices += [_starting_model(run_id, f"{isolated(name)} — {task} model exported by {run_id}", path)
                for run_id, name, task, path in exported]
    checkpoints = (Artifact.objects.filter(offered, run__project=project, kind=ArtifactKind.CHECKPOINT)
                   .order_by("-run__created_at", "step").values_list("run__public_id", "run__name", "step", "path"))
    choices += [_starting_model(f"{run_id}@{step}", f"{isolated(name)} — checkpoint {step}", path)
                for run_id, name, step, path in checkpoints]
    return choices


def only_starting_model(choices: list[StartingModel]) -> str | None:
    """The reference of the one model among ``choices`` whose folder is still there, which a launch form can choose
    for its user; None when there are none or several (the user chooses)."""
    usable = [choice.ref for choice in choices if not choice.gone]
    return usable[0] if len(usable) == 1 else None


def _starting_model(ref: str, label: str, path: str, *, notes: tuple[str, ...] = ()) -> StartingModel:
    # ``notes`` in brackets after the label (a base model's "base model"), the folder's being gone among them, as the
    # chat's pickers say theirs (chat.selectors._choice).
    gone = model_dir_gone(path, listing=True)
    said = [*notes, FOLDER_GONE] if gone else list(notes)
    return StartingModel(ref=ref, label=f"{label} ({', '.join(said)})" if said else label, gone=gone)


def model_positions(*, project: Project, references: Iterable[str]) -> dict[str, int]:
    """The most tokens each of ``references`` (``model_choices``' ids: ``bm_…``, ``run_…``, ``run_…@step``) may train
    on: the positions its directory's config.json gives it, by the rule the launch refuses a longer ``data.max_seq_len``
    by (``jaxengine.models.config.read_position_limit``). Left out: models whose config.json states none."""
    from jaxengine.models.config import read_position_limit

    wanted = set(references)
    paths = dict(BaseModel.objects.filter(project=project, public_id__in=wanted).values_list("public_id", "path"))
    run_ids = {reference.partition("@")[0] for reference in wanted if reference.startswith("run_")}
    for run_id, kind, step, path in (Artifact.objects.filter(run__project=project, run__public_id__in=run_ids,
                                                             kind__in=(ArtifactKind.MODEL, ArtifactKind.CHECKPOINT))
                                     .values_list("run__public_id", "kind", "step", "path")):
        paths[run_id if kind == ArtifactKind.MODEL else f"{run_id}@{step}"] = path
    limits = {reference: read_position_limit(path) for reference, path in paths.items() if reference in wanted}
    return {reference: limit.positions for reference, limit in limits.items() if limit is not None}


def offered_as_starting_model(*, run: Run) -> bool:
    """Whether the launch form offers ``run``'s final model to start from (``model_choices``): succeeded, not
    archived, its model exported, and its export folder there (``model_dir_gone``: the launch refuses it otherwise).
    A reward model scores text and writes none: no policy to go on from."""
    if run.status != RunStatus.SUCCEEDED or run.archived or run.task == "reward":
        return False
    path = Artifact.objects.filter(run=run, kind=ArtifactKind.MODEL).values_list("path", flat=True).first()
    return path is not None and not model_dir_gone(path)


def final_export_gone(*, run: Run, advise: bool) -> str:
    """What the run page says of a succeeded run whose exported model's folder was deleted since (``model_dir_gone``),
    "" while it is there or the run exported none: what no longer takes it, and whether it can be exported again,
    from the checkpoint of its step while the run's folder keeps it (``services.final_model_step``). ``advise``: for
    a role whose page offers the acts it names (export that checkpoint, Retry, unless greyed for what the run trains
    on: ``services.retry_refusal``, whose words the page shows beside it); a viewer is told only what is gone."""
    final = Artifact.objects.filter(run=run, kind=ArtifactKind.MODEL).values_list("step", "path").first()
    if run.status != RunStatus.SUCCEEDED or final is None or not model_dir_gone(final[1]):
        return ""
    step = final[0]
    uses = ("runs no longer start from it and the chat does not serve it" if run.generates_text
            else "no run can be scored by it")
    said = f"{capfirst(gone_model_words(run=named_model(run.name, run.public_id)))}, so {uses}."
    if run.task == EXTERNAL_TASK:  # trained elsewhere: Temper has no checkpoint of it to export
        return said
    if step in checkpoint_steps(run):
        advice = (f"Export its checkpoint {step} under Checkpoints (the same weights) to start runs from "
                  f"{run.public_id}@{step}.")
        return f"{said} {advice}" if advise else said
    lost = ("the run's folder, with the checkpoints it was exported from, is gone too" if not run.output_dir.is_dir()
            else f"the run's folder keeps no checkpoint of step {step} any more")
    said = f"{said} It cannot be exported again: {lost}."
    return f"{said} Retry trains its spec again as a new run." if advise and not retry_refusal(run) else said


def starts_from_the_demo_model(*, project: Project, model: str | None) -> bool:
    """Whether a launch form's ``?model=`` is the project's demo model, or a run's model (or checkpoint) trained from
    it: the form then starts from the demo preset of its task (``presets.demo_preset_name``), the learning rate a model
    that small learns at, as the run it goes on from did."""
    demo = demo_model(project=project)
    if demo is None or not model:
        return False
    reference = spec_ref(model)
    if reference == demo.public_id:
        return True
    run_id = reference.partition("@")[0] if isinstance(reference, str) else ""
    return run_id.startswith("run_") and Run.objects.filter(project=project, public_id=run_id, base_model=demo).exists()


def launch_task(*, run: Run) -> str:
    """The task the launch form opens on from ``run``'s *Launch a run from it* (its page's, its checkpoints' and
    final model's): the run's own, under that task's preset, so that a DPO run's checkpoint goes on with DPO; sft for
    a run trained elsewhere (``external``, no task of Temper's). A reward run offers none: its model scores text and
    is no policy to go on from (``offered_as_starting_model``). The form can still switch the task."""
    return run.task if run.task in tasks() else "sft"


def reward_model_choices(*, project: Project) -> list[tuple[str, str]]:
    """Reward models a PPO run can be scored by (``ppo.reward_model``): succeeded ``task: reward``
    runs of the project with an exported model, newest first; not archived runs' (put away, as in
    ``model_choices``: the launch form keeps a spec's own choice selectable). One whose export folder was deleted
    since is marked as ``model_choices`` marks a starting model (the launch refuses it: ``services.gone_model``)."""
    exported = (Artifact.objects.filter(run__project=project, run__task="reward", run__status=RunStatus.SUCCEEDED,
                                        run__archived=False, kind=ArtifactKind.MODEL)
                .order_by("-run__created_at").values_list("run__public_id", "run__name", "path"))
    choices = [_starting_model(run_id, f"{isolated(name)} — reward model of {run_id}", path)
               for run_id, name, path in exported]
    return [(choice.ref, choice.label) for choice in choices]


def pool_choices(*, current: Any = None) -> list[dict[str, Any]]:
    """The host pools a launch can pick (``name``, ``workers``, ``devices_per_worker``, ``summary``): those
    live train workers announce, with what they offer, and the default pool and ``current`` (a duplicated
    run's) even when no worker of theirs is up."""
    offers = pool_offers()
    names = sorted({DEFAULT_POOL, *offers, *([current] if isinstance(current, str) and current else [])})
    return [{"name": name, "workers": offers[name].workers if name in offers else 0,
             "devices_per_worker": offers[name].devices_per_worker if name in offers else None,
             "summary": offers[name].summary if name in offers else "no live workers"} for name in names]


def dataset_choices(*, project: Project, kinds: tuple[str, ...]) -> list[tuple[str, str]]:
    """Ready dataset versions of ``kinds`` in the project, newest version of each dataset first (option
    labels, names bidi-isolated)."""
    versions = (DatasetVersion.objects.filter(dataset__project=project, dataset__kind__in=kinds,
                                              status=VersionStatus.READY)
                .select_related("dataset").order_by("dataset__name", "-number"))
    return [(version.public_id, f"{isolated(version.dataset.name)} v{version.number} ({version.dataset.kind}, "
                                f"{counted(version.row_count, 'row', grouped=True)})")
            for version in versions]


def newest_ready_version(*, project: Project, kinds: tuple[str, ...], other_than: str | None = None) -> str | None:
    """The id of the project's most recently uploaded ready version of ``kinds``, preferring one other than
    ``other_than`` (evaluation data apart from the training data) when there is one; None when there is none.
    What an example (the New pipeline page's) fills in: the data the team is working with now, not the
    first dataset by name."""
    versions = (DatasetVersion.objects.filter(dataset__project=project, dataset__kind__in=kinds,
                                              status=VersionStatus.READY)
                .order_by("-created_at", "-pk").values_list("public_id", flat=True))
    ids = list(versions[:2])
    preferred = [version for version in ids if version != other_than]
    return (preferred or ids or [None])[0]


# What a comparison is read for, first in its table of final metrics (a run logs dozens of metrics, and
# eval/loss sat off the table's right edge behind the eval/ ones before it by name).
HEADLINE_METRICS = ("loss", "eval/loss", "reward", "eval/exact_match", "eval/accuracy", "eval/reward",
                    "rewards/accuracies", "eval/rewards/accuracies", "rewards/margins", "eval/rewards/margins")


def final_order(names: Iterable[str]) -> list[str]:
    """``names`` with the ``HEADLINE_METRICS`` first, in that order, then the rest as charts order them."""
    names = list(names)
    headline = [name for name in HEADLINE_METRICS if name in names]
    return headline + [name for name in chart_order(names) if name not in headline]


# What each kind of run is read for, drawn first (after loss) among dozens of charts: an RL run's reward and
# KL to its reference, a preference run's accuracy and margin (DPO's implicit reward, a reward model's).
LEADING_CHARTS = ("loss", "reward", "kl", "objective/kl", "rewards/accuracies", "rewards/margins", "accuracy", "margin")


def chart_order(names: Iterable[str]) -> list[str]:
    """Metric names in the order the run and compare pages draw them: the training metrics, then the
    eval/ ones, each with the ``LEADING_CHARTS`` first, in that order, and the rest by name."""
    def key(name: str) -> tuple:
        metric = name.removeprefix("eval/")
        leading = LEADING_CHARTS.index(metric) if metric in LEADING_CHARTS else len(LEADING_CHARTS)
        return name.startswith("eval/"), leading, name

    return sorted(names, key=key)


# One quantity that two kinds of run log under names of their own, by the chart both are drawn on when
# compared: a reward model's (the bradley_terry loss) and a DPO run's (its implicit reward: beta times the
# policy's log-ratio, to the reference where the loss has one) share of preference pairs whose chosen answer
# scores above the rejected one, and mean chosen-minus-rejected score, each in its own run's reward. Both
# losses are -log sigmoid of that margin, so the two are the same Bradley-Terry quantities; rewards/chosen
# and rewards/rejected already share their names. Nothing else the kinds log means the same.
SHARED_METRICS = {"preference accuracy": {"reward": "accuracy", "dpo": "rewards/accuracies"},
                  "reward margin": {"reward": "margin", "dpo": "rewards/margins"}}


def shared_charts(*, runs: list[Run], series: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """``{run id: {metric: chart}}``: the ``SHARED_METRICS`` (and their eval/ values) that the compared
    ``runs`` log under more than one name (``series``: each run's, by id), each drawn on one chart named
    for the quantity (eval/ ones "eval/<quantity>"). Runs of one kind keep their own names' charts."""
    shared: dict[str, dict[str, str]] = {}
    for quantity, by_task in SHARED_METRICS.items():
        for prefix in ("", "eval/"):
            logged = {run.public_id: prefix + by_task[run.task] for run in runs if run.task in by_task
                      and prefix + by_task[run.task] in series.get(run.public_id, {})}
            if len(set(logged.values())) > 1:
                for run_id, name in logged.items():
                    shared.setdefault(run_id, {})[name] = prefix + quantity
    return shared


# The unit of metrics whose names do not say it (memory/host_peak_gib and tokens_per_second do), by name prefix:
# the run and compare pages' charts title their y axes with it (static/plot_axis.js, from the pages' "metric-units"
# JSON, so that a metric first logged after the page loaded gets it too) and the final-metrics table its column.
METRIC_UNITS_BY_PREFIX = {"time/": "seconds"}


def metric_unit(name: str) -> str:
    """``name``'s unit when its name does not say it (``METRIC_UNITS_BY_PREFIX``), else ""."""
    return next((unit for prefix, unit in METRIC_UNITS_BY_PREFIX.items() if name.startswith(prefix)), "")


def final_table(*, runs: list[Run], names: Iterable[str], shared: dict[str, dict[str, str]]) -> dict[str, list]:
    """The compare page's final-metrics table: ``columns`` (``{"label", "unit", "metrics", "higher_is_better"}``) and
    ``rows`` (``{"run", "values"}``: each column's summary from the run's ``final_metrics``, a copy with ``best``
    where the column has a better way (``metric_higher_is_better``), None where it has none). A column per
    metric of ``names`` that a run has a final value of, in ``final_order``, except that a quantity the runs log
    under names of their own (``shared``, from ``shared_charts``) is one column, where its first name comes,
    labelled as its chart is, its ``metrics`` the names it holds in the runs' order (one, for most columns)."""
    columns: dict[str, dict[str, Any]] = {}  # by label, in the order they come
    for name in final_order(name for name in names if any(name in run.final_metrics for run in runs)):
        for run in runs:
            if name in run.final_metrics:
                label = shared.get(run.public_id, {}).get(name, name)
                columns.setdefault(label, {"label": label, "by_run": {}})["by_run"][run.public_id] = name
    rows = [{"run": run, "values": [dict(run.final_metrics[column["by_run"][run.public_id]])
                                    if run.public_id in column["by_run"] else None for column in columns.values()]}
            for run in runs]
    for index, column in enumerate(columns.values()):
        column["higher_is_better"] = metric_higher_is_better(column["label"])
        _mark_best([row["values"][index] for row in rows], higher_is_better=column["higher_is_better"])
    # A column's names in the runs' order, as its chart's title gives them.
    return {"columns": [{"label": column["label"], "unit": metric_unit(column["label"]),
                         "higher_is_better": column["higher_is_better"],
                         "metrics": list(dict.fromkeys(column["by_run"][run.public_id] for run in runs
                                                       if run.public_id in column["by_run"]))}
                        for column in columns.values()],
            "rows": rows}


def _mark_best(values: list[dict[str, Any] | None], *, higher_is_better: bool | None) -> None:
    """``best`` True on the values whose last is the column's best (ties all), where there are two to compare and
    the metric has a better way."""
    lasts = [value["last"] for value in values if value is not None and value.get("last") is not None]
    if higher_is_better is None or len(lasts) < 2:
        return
    best = max(lasts) if higher_is_better else min(lasts)
    for value in values:
        if value is not None:
            value["best"] = value.get("last") == best


def _series(rows, *, downsampled: bool, start_time: float | None) -> dict[str, dict[str, list]]:
    series: dict[str, dict[str, list]] = {}
    if start_time is None:
        start_time = min((row[4] for row in rows), default=0.0)
    for name, step, value, tokens, wall_time in rows:
        entry = series.setdefault(name, {"step": [], "value": [], "tokens": [], "time": []})
        entry["step"].append(step)
        entry["value"].append(value)
        entry["tokens"].append(tokens)
        entry["time"].append(round(wall_time - start_time, 3))
    for entry in series.values():
        entry["downsampled"] = downsampled
    return series


def _bucketed(where: Q, width: int, offset: int) -> QuerySet[MetricPoint]:
    return MetricPoint.objects.filter(where).annotate(bucket=Cast((F("step") - offset - 1) / width, IntegerField()))


def _grouped_buckets(points: dict[int, Q], *, widths: dict[int, int], offset: int = 0) -> dict[int, SeriesBuckets]:
    """The points of each run that ``points`` selects (``{run pk: condition}``) reduced by the database to
    buckets of the run's width (``widths``) after ``offset``, by run pk (a run without points: no buckets;
    ``through_id``: the highest point id among them), with the points of each bucket's extremes (the low's
    earliest step and the high's latest on a tie, as ``SeriesBuckets.add`` keeps), in one query for every run
    and every number of points (``_buckets_with_extremes``)."""
    by_run = {run_pk: SeriesBuckets(width=run_width) for run_pk, run_width in widths.items()}
    found: dict[tuple[int, str, int], list] = {}
    for (run_pk, name, index, first_step, last_step, low, high, tokens, wall_time, last_id,
         step, value, point_tokens, point_wall_time) in _buckets_with_extremes(points, widths=widths, offset=offset):
        bucket = found.get((run_pk, name, index))
        if bucket is None:
            bucket = found[run_pk, name, index] = [first_step, last_step, low, high, tokens, wall_time,
                                                   None, None, 0, 0.0, 0, 0.0]
            by_run[run_pk].through_id = max(by_run[run_pk].through_id, last_id)
        if value == low and (bucket[6] is None or step < bucket[6]):
            bucket[6], bucket[8], bucket[9] = step, point_tokens, point_wall_time
        if value == high and (bucket[7] is None or step > bucket[7]):
            bucket[7], bucket[10], bucket[11] = step, point_tokens, point_wall_time
    for (run_pk, name, index), bucket in found.items():
        by_run[run_pk].add_bucket(name, by_run[run_pk].width, index, bucket)
    return by_run


def _buckets_with_extremes(points: dict[int, Q], *, widths: dict[int, int], offset: int) -> list[tuple]:
    """``(run pk, name, bucket, first step, last step, low, high, tokens, wall time, last id, step, value,
    tokens, wall time)`` rows: each bucket (grouped by the database) with each of its points whose value is
    its low or its high, a row per such point. One query, a UNION ALL of a part per run: the run's buckets
    joined to its points of the same name and bucket, within the bucket's steps, that hold one of its two
    values, so every point is read about once more. SQLite reads each bucket's points as a range of the
    (run, name, step) index; PostgreSQL merges the two sides on (name, bucket): joined on the name and the
    step range alone, it merged on the name and tried every bucket of the metric for each point (a minute for
    two runs of 100,000 points). Queries for the extremes' points by their values, a few hundred values each,
    had made the count of queries follow the points."""
    parts, params = [], []
    for run_pk, where in points.items():
        buckets_sql, buckets_params = (
            _bucketed(where, widths[run_pk], offset).values("run", "name", "bucket")
            .annotate(low=Min("value"), high=Max("value"), first_step=Min("step"), last_step=Max("step"),
                      tokens=Min("tokens"), wall_time=Min("wall_time"), last_id=Max("id"))
            .values_list("run", "name", "bucket", "first_step", "last_step", "low", "high", "tokens", "wall_time",
                         "last_id").order_by().query.sql_with_params())
        points_sql, points_params = (_bucketed(where, widths[run_pk], offset).order_by()
                                     .values_list("name", "bucket", "step", "value", "tokens", "wall_time")
                                     .query.sql_with_params())
        parts.append(
            'SELECT b."run", b."name", b."bucket", b."first_step", b."last_step", b."low", b."high", b."tokens", '
            'b."wall_time", b."last_id", p."step", p."value", p."tokens", p."wall_time" '
            f"FROM ({buckets_sql}) b JOIN ({points_sql}) p ON p.\"name\" = b.\"name\" AND p.\"bucket\" = b.\"bucket\" "
            'AND p."step" >= b."first_step" AND p."step" <= b."last_step" AND (p."value" = b."low" OR p."value" = b."high")')
        params += [*buckets_params, *points_params]
    if not parts:
        return []
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        return cursor.fetchall()


def series_buckets(*, run: Run, reuse_stored: bool = True) -> SeriesBuckets:
    """Every metric of ``run`` in buckets fit for ``MAX_POINTS`` (see ``webapp.runs.downsampling``).

    A running run's train worker keeps its buckets in ``series_cache["buckets"]`` (and a finished
    run keeps its last ones): then only the points stored since are reduced here — those after the
    buckets' ``through_id``, which the run's index finds without reading its other points — else
    every point. ``reuse_stored=False`` is for the worker itself, after a resume changed the points."""
    return _runs_series_buckets([run], last_steps=_last_steps([run]), reuse_stored=reuse_stored)[run.pk]


def _last_steps(runs: list[Run]) -> dict[int, int | None]:
    """Each run's last step, by pk: its ``current_step`` (which saves a scan of its points), else its
    points' last step (one grouped query for every such run; None for a run without points)."""
    last_steps: dict[int, int | None] = {run.pk: run.current_step or None for run in runs}
    unknown = [run_pk for run_pk, last_step in last_steps.items() if last_step is None]
    if unknown:
        last_steps.update(MetricPoint.objects.filter(run__in=unknown).values("run").annotate(last=Max("step"))
                          .values_list("run", "last"))
    return last_steps


def _runs_series_buckets(runs: list[Run], *, last_steps: dict[int, int | None],
                         reuse_stored: bool = True) -> dict[int, SeriesBuckets]:
    """``series_buckets`` of each of ``runs``, by pk, their points reduced together (``last_steps``: as
    ``_last_steps`` reads them)."""
    if not runs:
        return {}
    stored: dict[int, SeriesBuckets] = {}
    widths: dict[int, int] = {}
    points: dict[int, Q] = {}
    for run in runs:
        data = (run.series_cache or {}).get("buckets") if reuse_stored else None
        last_step = last_steps[run.pk] or 0
        # An older layout's, drawn as then, is not read: the points answer exactly.
        if SeriesBuckets.in_layout(data):
            buckets = stored[run.pk] = SeriesBuckets.from_json(data)
            buckets.fit(max(last_step, buckets.through_step), MAX_POINTS)
            widths[run.pk] = buckets.width
            points[run.pk] = (Q(run_id=run.pk, id__gt=buckets.through_id) if buckets.through_id
                              else Q(run_id=run.pk, step__gt=buckets.through_step))
        else:
            widths[run.pk] = bucket_width(last_step, MAX_POINTS)
            points[run.pk] = Q(run_id=run.pk)
    reduced = _grouped_buckets(points, widths=widths)
    for run in runs:
        buckets = stored.get(run.pk)
        if buckets is None:  # every point reduced
            reduced[run.pk].through_step = max(reduced[run.pk].through_step, last_steps[run.pk] or 0)
            continue
        tail = reduced[run.pk]
        for name, by_index in tail.buckets.items():
            for index, bucket in by_index.items():
                buckets.add_bucket(name, buckets.width, index, bucket)
        buckets.through_id = max(buckets.through_id, tail.through_id)
        reduced[run.pk] = buckets
    return reduced


def last_value(*, final_metrics: dict[str, dict[str, float]], name: str) -> float | None:
    """The latest value of metric ``name`` in a run's ``final_metrics`` (None before its first point)."""
    return (final_metrics or {}).get(name, {}).get("last")


def run_metric_names(*, run: Run) -> list[str]:
    """Every metric ``run`` has logged a point of, sorted: its ``final_metrics``' names (each metric's last finite
    point; one only ever logged not finite has no point), read from the run rather than from its points."""
    return sorted(run.final_metrics or {})


NOT_FINITE_WORDS = {"nan": "NaN", "inf": "infinity", "-inf": "minus infinity"}


def latest_not_finite(*, run: Run, name: str) -> tuple[str, int] | None:
    """When the latest value ``run`` logged of metric ``name`` was NaN or infinite (so not stored, and not
    its ``final_metrics`` "last", which is the last finite one): that value in words and its step."""
    entry = (run.not_finite_metrics or {}).get(name)
    finite = (run.final_metrics or {}).get(name)
    if entry is None or (finite is not None and finite.get("step", -1) >= entry["step"]):
        return None
    return NOT_FINITE_WORDS.get(entry["value"], entry["value"]), entry["step"]


def metrics_not_finite_now(*, run: Run) -> list[dict[str, Any]]:
    """The metrics whose latest logged value was NaN or infinite, by name, each with that value in words and
    its step: what the charts cannot draw (they end at the last finite point)."""
    latest = {name: latest_not_finite(run=run, name=name) for name in sorted(run.not_finite_metrics or {})}
    return [{"name": name, "value": value, "step": step} for name, found in latest.items() if found is not None
            for value, step in [found]]


def no_learning_signal(*, run: Run) -> dict[str, Any]:
    """The training steps of ``run`` that could not train: every group's rewards equal
    (``frac_reward_zero_std`` 1, so every advantage was 0) or nothing in the loss (``grad_norm`` 0, as when
    every completion was masked as truncated). ``ranges``: [first, last] runs of consecutive such steps (the
    run page shades them); ``count`` of them, of ``steps`` training steps logged (every step logs grad_norm),
    ``through`` the last (-1 before any). Read from every stored point: the drawn series may be downsampled."""
    points = MetricPoint.objects.filter(run=run)
    logged = points.filter(name="grad_norm").aggregate(steps=Count("id"), through=Max("step"))
    flat = set(points.filter(Q(name="grad_norm", value=0.0) | Q(name="frac_reward_zero_std", value__gte=1.0))
               .values_list("step", flat=True))
    ranges: list[list[int]] = []
    for step in sorted(flat):
        if ranges and ranges[-1][1] == step - 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])
    return {"ranges": ranges, "count": len(flat), "steps": logged["steps"],
            "through": -1 if logged["through"] is None else logged["through"]}


def last_point_id(*, run: Run) -> int:
    """The id of the run's newest stored point (0 when none): what stored buckets cover."""
    return MetricPoint.objects.filter(run=run).aggregate(last=Max("id"))["last"] or 0


# Before every step: points may be logged at step 0 (an external run's first evaluation, say).
BEFORE_FIRST_STEP = -1


# A catch-up's ``after_steps`` holds this many different steps at most (its metrics share a few: those
# logged every step, those at each evaluation); past that, each listed metric's points come after the
# smallest step, so that a made-up address cannot build a WHERE deeper than the database parses.
AFTER_STEPS_MAX_STEPS = 32


def metric_series(*, run: Run, names: list[str] | None = None, after_step: int = BEFORE_FIRST_STEP,
                  after_steps: dict[str, int] | None = None, max_points: int = MAX_POINTS) -> dict[str, dict[str, list]]:
    """``{name: {"step": [...], "value": [...], "tokens": [...], "time": [...], "downsampled": bool}}``.

    ``time`` is seconds since the run's first point. Longer series come back as min/max pairs per
    power-of-two step bucket, at most about ``max_points`` points per metric: a whole run's from
    ``runs_metric_series``, a part of a run (``names``, ``after_step``) from one grouped query. The
    run's ``current_step`` bounds the steps, which saves a scan of the points to find their extent.
    ``after_steps`` ({name: step}, a run page's catch-up): those metrics' points after their own step, so
    that a metric logged rarely does not bring back every other metric's points since its last one; the
    metrics it leaves out come after ``after_step``."""
    after_steps = after_steps or {}
    if after_step < 0 and not names and not after_steps:
        return runs_metric_series(runs=[run], max_points=max_points)[run.pk]
    lowest = min([after_step, *after_steps.values()])
    if len(set(after_steps.values())) > AFTER_STEPS_MAX_STEPS:
        after_step, after_steps = lowest, {}
    where = Q(step__gt=after_step)
    if after_steps:
        where &= ~Q(name__in=list(after_steps))
        for step in set(after_steps.values()):
            where |= Q(name__in=[name for name, after in after_steps.items() if after == step], step__gt=step)
    where &= Q(run_id=run.pk)
    if names:
        where &= Q(name__in=names)
    points = MetricPoint.objects.filter(where)
    last_step = run.current_step or points.aggregate(last=Max("step"))["last"]
    if last_step is None:
        return {}
    # Times count from the run's first point: these rows' first is that point only when they are every point of the
    # run (no names picked out, none left before a step).
    whole = lowest < 0 and not after_steps and not names
    span = last_step - max(lowest, 0)  # step 0 shares the first bucket with step 1 (see _grouped_buckets)
    if span <= max_points:
        # Sorted here: an ORDER BY name, step had the database take the (run, name, step) index, through every
        # point of the run, rather than the (run, step) range of the new ones.
        rows = sorted(points.values_list("name", "step", "value", "tokens", "wall_time"), key=lambda row: row[:2])
        start_time = None if not rows or whole else _start_time(run)
        return _series(rows, downsampled=False, start_time=start_time)
    buckets = _grouped_buckets({run.pk: where}, widths={run.pk: bucket_width(span, max_points)},
                               offset=max(lowest, 0))[run.pk]
    start_time = buckets.start_time() if not buckets.buckets or whole else _start_time(run)
    drawn = list(buckets.points())
    return _series(drawn + _last_points({run.pk: where}, {run.pk: run}, {run.pk: drawn})[run.pk], downsampled=True,
                   start_time=start_time)


def _start_time(run: Run) -> float | None:
    """The smallest wall time of ``run``'s points, which its series' times count from: the first entry of the
    run in the (run, wall_time) index, read only by a poll that finds new points (a read of a whole run finds
    it among its own rows)."""
    return MetricPoint.objects.filter(run=run).aggregate(start=Min("wall_time"))["start"]


def series_start_time(*, run: Run) -> float | None:
    """The wall time ``metric_series``' times count from (None before the run's first point): the run page counts
    the time of the points that come live from it (their events carry wall times)."""
    return _start_time(run)


def runs_metric_series(*, runs: list[Run], max_points: int = MAX_POINTS) -> dict[int, dict[str, dict[str, list]]]:
    """Each run's whole ``metric_series``, by pk, read together, in as many queries for sixteen runs as
    for two (the compare page's): a finished run's from its ``series_cache`` at ``max_points``; the
    points of runs whose steps fit ``max_points`` in one query; the others from ``series_buckets`` (the
    worker's stored buckets plus the points since), reduced together, coarsened to ``max_points``."""
    series = _stored_series(runs, max_points=max_points)
    to_read = [run for run in runs if run.pk not in series]
    read_series_caches(to_read)
    last_steps = _last_steps(to_read)
    whole = [run for run in to_read if last_steps[run.pk] is not None and last_steps[run.pk] <= max_points]
    bucketed = [run for run in to_read if last_steps[run.pk] is not None and last_steps[run.pk] > max_points]
    series.update({run.pk: {} for run in to_read if last_steps[run.pk] is None})
    rows_by_run: dict[int, list[tuple]] = {run.pk: [] for run in whole}
    if whole:
        for run_pk, *row in (MetricPoint.objects.filter(run__in=whole).order_by("run", "name", "step")
                             .values_list("run", "name", "step", "value", "tokens", "wall_time")):
            rows_by_run[run_pk].append(row)
    series.update({run_pk: _series(rows, downsampled=False, start_time=None) for run_pk, rows in rows_by_run.items()})
    if max_points <= MAX_POINTS:
        by_run = _runs_series_buckets(bucketed, last_steps=last_steps)
        for run in bucketed:
            width = max(bucket_width(last_steps[run.pk], max_points), by_run[run.pk].width)
            by_run[run.pk] = by_run[run.pk].coarsened(width)
    elif bucketed:
        by_run = _grouped_buckets({run.pk: Q(run_id=run.pk) for run in bucketed},
                                  widths={run.pk: bucket_width(last_steps[run.pk], max_points) for run in bucketed})
    if bucketed:
        drawn = {run.pk: list(by_run[run.pk].points()) for run in bucketed}
        lasts = _last_points({run.pk: Q(run_id=run.pk) for run in bucketed}, {run.pk: run for run in bucketed}, drawn)
        for run in bucketed:
            series[run.pk] = _series(drawn[run.pk] + lasts[run.pk], downsampled=True,
                                     start_time=by_run[run.pk].start_time())
    return series


def _last_points(where: dict[int, Q], runs: dict[int, Run], drawn: dict[int, list[tuple]]) -> dict[int, list[tuple]]:
    """For each run (pk), the last point of each metric its ``drawn`` rows ((name, step, value, tokens, wall_time), in
    step order by name) end before, as a row: a downsampled series keeps each bucket's two extremes, so its line
    stopped up to a bucket short of the run's last step, at that bucket's low or high rather than the value last
    logged, which a chart's end and its hover are read for. The points ``where`` selects at the step each metric's
    ``final_metrics`` entry names, in one query for every run (none where no drawn line ends early)."""
    ends: dict[int, dict[str, int]] = {}
    for pk, rows in drawn.items():
        for name, step, *_ in rows:
            ends.setdefault(pk, {})[name] = step  # rows come in step order: the last is the line's end
    wanted: dict[int, dict[str, int]] = {
        pk: {name: last["step"] for name, last in (runs[pk].final_metrics or {}).items()
             if isinstance(last, dict) and isinstance(last.get("step"), int) and name in ends.get(pk, {})
             and last["step"] > ends[pk][name]}
        for pk in drawn}
    lasts: dict[int, list[tuple]] = {pk: [] for pk in drawn}
    condition = Q(pk__in=[])
    for pk, steps in wanted.items():
        if steps:
            condition |= where[pk] & Q(name__in=list(steps), step__in=set(steps.values()))
    if not any(wanted.values()):
        return lasts
    for pk, name, step, value, tokens, wall_time in (MetricPoint.objects.filter(condition).order_by("run", "name")
                                                     .values_list("run", "name", "step", "value", "tokens", "wall_time")):
        if wanted[pk].get(name) == step:
            lasts[pk].append((name, step, value, tokens, wall_time))
    return lasts


# The x of a point: what the compare page draws a series by (its #x-axis), step, tokens or time.
X_KEYS = ("step", "tokens", "time")


def series_with_shared_x(series: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[dict[str, list]]]:
    """One run's ``metric_series`` as the compare page sends it, each distinct x sent once: ``({name: {"value": [...],
    "x": index, "downsampled": bool}}, [{"step": [...], "tokens": [...], "time": [...]}, ...])``, a series' x at
    ``index`` of the list, which holds them in the order their first series comes in ``series``.

    The metrics a run logs at every step share their steps, tokens and times (those of its evaluations share theirs):
    three quarters of the page's chart data at eight runs were those lists again and again (1.9 MB). The same lists
    are sent, only once, so every point is drawn where it was."""
    shared: dict[str, dict[str, Any]] = {}
    xs: list[dict[str, list]] = []
    for name, entry in series.items():
        x = {axis: entry[axis] for axis in X_KEYS}
        # A run has a few distinct x: comparing lists (which stops at the first difference) beats hashing them.
        index = next((index for index, sent in enumerate(xs) if sent == x), None)
        if index is None:
            index = len(xs)
            xs.append(x)
        shared[name] = {"value": entry["value"], "x": index, "downsampled": entry["downsampled"]}
    return shared, xs


def series_cache_current(*, run: Run) -> bool:
    """Whether the run's cached series were drawn in the current bucket layout (``series_cache_for`` of
    this code): a run finished before it keeps series drawn at each bucket's smallest tokens and time."""
    cached = run.series_cache or {}
    return "series" in cached and SeriesBuckets.in_layout(cached.get("buckets"))


# series_cache_current as the database reads it, for runs whose series_cache was left unread.
_SERIES_CACHE_CURRENT = Q(series_cache__has_key="series", series_cache__buckets__layout=SeriesBuckets.LAYOUT)


def _series_cache_unread(run: Run) -> bool:
    return "series_cache" in run.get_deferred_fields()


def finished_runs_with_old_series_cache(*, runs: list[Run]) -> list[Run]:
    """Those finished ``runs`` whose series cache is not ``series_cache_current``; one query for runs whose
    cache was left unread (``runs_by_ids(series_cache=False)``), which reads no cache whole."""
    finished = [run for run in runs if run.is_finished]
    unread = [run.pk for run in finished if _series_cache_unread(run)]
    current = set(Run.objects.filter(_SERIES_CACHE_CURRENT, pk__in=unread).values_list("pk", flat=True)) if unread else set()
    return [run for run in finished
            if not (run.pk in current if _series_cache_unread(run) else series_cache_current(run=run))]


def _stored_series(runs: list[Run], *, max_points: int) -> dict[int, dict[str, dict[str, list]]]:
    """The series that finished ``runs`` keep at ``max_points`` in a current cache, by pk. Of a run whose cache was
    left unread only its series are read (one query for all): its buckets, three times their size in JSON, would be
    decoded for nothing."""
    stored, unread = {}, []
    for run in runs:
        if not run.is_finished:
            continue
        if _series_cache_unread(run):
            unread.append(run.pk)
        elif (run.series_cache or {}).get("max_points") == max_points and series_cache_current(run=run):
            stored[run.pk] = run.series_cache["series"]
    if unread:
        stored.update(Run.objects.filter(_SERIES_CACHE_CURRENT, pk__in=unread, series_cache__max_points=max_points)
                      .values_list("pk", KeyTransform("series", "series_cache")))
    return stored


def read_series_caches(runs: list[Run]) -> None:
    """Reads the ``series_cache`` of those ``runs`` that left it unread, in one query."""
    unread = [run for run in runs if _series_cache_unread(run)]
    if unread:
        caches = dict(Run.objects.filter(pk__in=[run.pk for run in unread]).values_list("pk", "series_cache"))
        for run in unread:
            run.series_cache = caches[run.pk]


def series_cache_for(run: Run) -> dict[str, Any]:
    """The value of ``Run.series_cache`` for a run that has just finished (see ``metric_series``):
    its buckets, and its series at the compare page's resolution."""
    buckets = series_buckets(run=run)
    return {"buckets": buckets.to_json(), "max_points": COMPARE_MAX_POINTS,
            "series": metric_series(run=run, max_points=COMPARE_MAX_POINTS)}


# Sample kinds the samples browser filters by: GRPO/PPO rollouts (``extra.kind``) and the
# generations logged at evaluations (everything else).
SAMPLE_KINDS = ("rollout", "eval")
SAMPLE_ORDERS = {"position": ("position",), "reward": ("-reward", "position"), "-reward": ("reward", "position")}


def _of_kind(samples: QuerySet[Sample], kind: str | None) -> QuerySet[Sample]:
    if kind == "rollout":
        return samples.filter(extra__kind="rollout")
    if kind == "eval":
        # A sample without a kind has none to compare: it is a generation too (SQL's NULL != 'rollout').
        return samples.filter(~Q(extra__has_key="kind") | ~Q(extra__kind="rollout"))
    return samples


def sample_steps(*, run: Run, kind: str | None = None) -> list[int]:
    """The steps that have samples (of ``kind``, one of ``SAMPLE_KINDS``; any when None)."""
    samples = _of_kind(Sample.objects.filter(run=run), kind)
    return list(samples.values_list("step", flat=True).distinct().order_by("step"))


def samples_scored(*, run: Run) -> bool:
    """Whether any sample of ``run`` has a reward (GRPO and PPO score theirs): the samples browser offers
    its kind, reward range and reward order only then."""
    return Sample.objects.filter(run=run, reward__isnull=False).exists()


def sample_list(*, run: Run, step: int | None = None, kind: str | None = None, min_reward: float | None = None,
                max_reward: float | None = None, order: str = "position") -> QuerySet[Sample]:
    """Samples of ``run`` at ``step`` (all steps when None), of ``kind`` (any when None), optionally
    within a reward range, by position or by reward (``order``: a key of ``SAMPLE_ORDERS``)."""
    samples = _of_kind(Sample.objects.filter(run=run), kind)
    if step is not None:
        samples = samples.filter(step=step)
    if min_reward is not None:
        samples = samples.filter(reward__gte=min_reward)
    if max_reward is not None:
        samples = samples.filter(reward__lte=max_reward)
    return samples.order_by("step", *SAMPLE_ORDERS.get(order, SAMPLE_ORDERS["position"]))


def sample_page(*, run: Run, step: int | None, after: tuple[int, int] | None, limit: int) -> KeysetPage[Sample]:
    """The ``limit`` samples of ``run`` (at ``step``, or every step) that follow the sample at (step, position)
    ``after``, in the order of ``sample_list``: keyset paging on the unique (run, step, position)."""
    samples = sample_list(run=run, step=step)
    if after is not None:
        after_step, after_position = after
        samples = samples.filter(Q(step__gt=after_step) | Q(step=after_step, position__gt=after_position))
    return keyset_page(samples, limit=limit, key=lambda sample: (sample.step, sample.position))


def log_tail(*, run: Run, after_id: int = 0, limit: int = 200, newest: bool = True) -> list[RunLogLine]:
    """The newest ``limit`` log lines after ``after_id`` (``newest=False``: the first ``limit``, to read a log
    through a page at a time), oldest first."""
    lines = RunLogLine.objects.filter(run=run, id__gt=after_id).order_by("-id" if newest else "id")[:limit]
    return list(reversed(lines)) if newest else list(lines)


def log_has_lines_after(*, run: Run, after_id: int) -> bool:
    return RunLogLine.objects.filter(run=run, id__gt=after_id).exists()


def checkpoint_list(*, run: Run, deletions: bool = False) -> list[dict[str, Any]]:
    """The checkpoints in the run's directory and those exported, oldest first, each with its export
    (``artifact``) once it is done, the state of the last export asked for (``export``: exporting, exported
    or failed) and, once exported, its serving copy's state (``serving_copy``, ``serving_copies.copy_state``;
    None for a model that writes no text). An exported one stays when a resume of the run deleted its
    training checkpoint (``train.keep_last``), or someone did: runs, the chat and its serving copy still use the
    export. The checkpoint of a succeeded run's final step is its final model (``final``), exported when the run
    succeeded: it is shown as that, not offered for export a second time (``services.final_model_step``).
    ``deletions`` (for those who may delete the run): each training checkpoint of a run that has ended gets its
    ``deletion``, why its Delete is refused (``refusal``) or what deleting it changes (``notes``,
    ``checkpoint_delete_notes``)."""
    exported = {artifact.step: artifact for artifact in run.artifacts.filter(kind=ArtifactKind.CHECKPOINT)}
    exports = {export.step: export for export in run.checkpoint_exports.all()}
    copies = checkpoint_serving_copies(run=run, artifacts=exported) if run.generates_text else {}
    saved = checkpoint_steps(run)
    steps = sorted({*saved, *exported})
    scores = checkpoint_scores(run=run, steps=steps)
    final_step = final_model_step(run)
    facts = {step: _directory_facts(run.output_dir / "checkpoints" / str(step)) for step in saved}
    listed = [{"step": step, "artifact": exported.get(step), "export": exports.get(step),
               "serving_copy": copies.get(step), "score": scores.get(step), "final": step == final_step,
               # The training checkpoint's own (weights and optimizer state), which a resume may rotate out.
               "size_bytes": facts[step][0] if step in facts else None,
               "saved_at": facts[step][1] if step in facts else None}
              for step in steps]
    if deletions and not run.is_active:  # an active run's are not offered, as the run's own Delete is not
        for checkpoint in listed:
            if checkpoint["step"] in facts:
                refusal = checkpoint_delete_refusal(run, checkpoint["step"])
                checkpoint["deletion"] = {"refusal": refusal, "notes": [] if refusal else checkpoint_delete_notes(
                    run=run, checkpoint=checkpoint, saved=saved)}
    return listed


def checkpoint_delete_notes(*, run: Run, checkpoint: dict[str, Any], saved: list[int]) -> list[str]:
    """What deleting the training checkpoint of ``checkpoint`` (an entry of ``checkpoint_list``) changes, said in its
    confirmation before it is sent: that its weights go for good where no export keeps them, that Resume (or Train
    further) then goes on from an earlier checkpoint or from step 0 where it is the newest of ``saved`` (the engine
    restores the newest; the steps after are trained again and their curves replaced) or, the only one of a run that
    recorded saving checkpoints, that they are refused (``lost_checkpoints_refusal``), and that it is the run's best
    by its ranking metric."""
    step, notes = checkpoint["step"], []
    if checkpoint["artifact"] is not None:
        notes.append(f"Its export stays: runs, the chat and downloads go on using {run.public_id}@{step}.")
    elif checkpoint["final"]:
        notes.append(f"Its weights stay as the run's final model, exported when it succeeded ({run.public_id}).")
    else:
        notes.append("It is not exported: its weights can no longer be exported, chatted with or started from.")
    if step == saved[-1] and run.task != EXTERNAL_TASK:
        action = "Train further" if run.status == RunStatus.SUCCEEDED else "Resume"
        earlier = saved[-2] if len(saved) > 1 else None
        notes.append(_newest_checkpoint_note(run, action, earlier))
    if (score := checkpoint["score"]) and score["best"]:
        notes.append(f"It is the run's best checkpoint by {score['metric']} ({score['shown']}).")
    return notes


@dataclass(frozen=True)
class CheckpointPrunePlan:
    """What pruning a run's training checkpoints (``services.checkpoints_prune``) would do: the steps that go, oldest
    first, each with the disk it frees (0 where not measured), and the steps kept with why (``{step: [reasons]}``)."""

    deleted: dict[int, int]
    kept: dict[int, list[str]]

    @property
    def bytes_freed(self) -> int:
        return sum(self.deleted.values())


def checkpoint_prune_plan(*, run: Run, keep: Iterable[int] = (), measure: bool = True,
                          sizes: dict[int, int] | None = None, in_use: set[int] | None = None,
                          evaluations: list[tuple[int, float]] | None = None) -> CheckpointPrunePlan:
    """Which training checkpoints of ``run`` pruning deletes and which it keeps, and why: the newest (what Resume and
    Train further restore), the best by the run's ranking metric (``checkpoint_scores``), the pinned steps of ``keep``,
    and those ``checkpoint_delete_refusal`` refuses now (being exported, a serving copy being written). ``in_use``
    (``checkpoints_in_use``) and ``evaluations`` (``ranking_evaluations``) are read for this run unless the caller
    read them for many runs at once. Each step that goes is measured as its deletion counts it (``folder_bytes``)
    unless ``sizes`` has it or ``measure`` is False. ``ValidationError`` (``keep``) naming a pinned step the run's
    folder holds no checkpoint of."""
    saved = checkpoint_steps(run)
    pinned = sorted(set(keep))
    if missing := [step for step in pinned if step not in saved]:
        raise ValidationError({"keep": f"run {run.public_id} has no checkpoint {', '.join(map(str, missing))} in its "
                                       f"folder to keep; it has {', '.join(map(str, saved)) or 'none'}. Pin steps "
                                       "among those"})
    scores = checkpoint_scores(run=run, steps=saved, evaluations=evaluations)
    kept = checkpoint_keep_reasons(run=run, saved=saved, scores=scores, pinned=pinned)
    in_use = checkpoints_in_use(runs=[run]).get(run.pk, set()) if in_use is None else in_use
    for step in saved:
        # Its words from checkpoint_delete_refusal, which the deletion itself checks again.
        if step not in kept and step in in_use and (refusal := checkpoint_delete_refusal(run, step)):
            kept[step] = [refusal]
    going = {step: _checkpoint_bytes(run, step, sizes or {}, measure) for step in saved if step not in kept}
    return CheckpointPrunePlan(deleted=going, kept=dict(sorted(kept.items())))


def checkpoints_in_use(*, runs: Iterable[Run]) -> dict[int, set[int]]:
    """``{run pk: steps}`` of the checkpoints of ``runs`` that ``checkpoint_delete_refusal`` refuses to delete while
    their run has ended: being exported, or a serving copy of them being written. Two queries for any number of runs
    (the Storage page weighs every run's prune)."""
    ids = [run.pk for run in runs]
    in_use: dict[int, set[int]] = {}
    exporting = CheckpointExport.objects.filter(run__in=ids, status=CheckpointExportStatus.EXPORTING)
    writing = ServingCopy.objects.filter(run__in=ids, status=ServingCopyStatus.WRITING, step__isnull=False)
    for run_id, step in [*exporting.values_list("run_id", "step"), *writing.values_list("run_id", "step")]:
        in_use.setdefault(run_id, set()).add(step)
    return in_use


def kept_in_words(kept: dict[int, list[str]]) -> str:
    """``{step: [reasons]}`` of a prune as one clause: "step 200 (pinned), step 300 (the newest: …)"."""
    return ", ".join(f"step {step} ({'; '.join(reasons)})" for step, reasons in kept.items())


def _checkpoint_bytes(run: Run, step: int, sizes: dict[int, int], measure: bool) -> int:
    if step in sizes:
        return sizes[step]
    return folder_bytes(run.output_dir / "checkpoints" / str(step)) if measure else 0


def checkpoint_keep_reasons(*, run: Run, saved: list[int], scores: dict[int, dict[str, Any]],
                            pinned: list[int]) -> dict[int, list[str]]:
    """The steps of ``saved`` (oldest first) that pruning keeps whatever else happens, each with why."""
    kept: dict[int, list[str]] = {}
    if saved:
        action = "Train further" if run.status == RunStatus.SUCCEEDED else "Resume"
        kept[saved[-1]] = ["the newest" if run.task == EXTERNAL_TASK else f"the newest: {action} goes on from it"]
    for step, score in scores.items():
        if score["best"]:
            kept.setdefault(step, []).append(f"the best by {score['metric']} ({score['shown']})")
    for step in pinned:
        kept.setdefault(step, []).append("pinned")
    return kept


def _newest_checkpoint_note(run: Run, action: str, earlier: int | None) -> str:
    if earlier is not None:
        return (f"It is the run's newest checkpoint: {action} would go on from checkpoint {earlier} instead, training "
                f"the steps after {earlier} again and replacing their curves.")
    if run.current_step > 0 and recorded_saving_checkpoints(run):
        # As lost_checkpoints_refusal judges a run whose saved checkpoints are all gone.
        return (f"It is the run's only checkpoint: {action} would then be refused, as the run could only train again "
                "from step 0 while its step history goes on; Duplicate it to train its spec again.")
    return f"It is the run's only checkpoint: {action} would train the run again from step 0, replacing its curves."


def _directory_facts(directory: str | os.PathLike) -> tuple[int, datetime | None]:
    """The disk ``directory`` takes (``folder_bytes``: as its deletion's message and the Storage page count it) and
    when the newest of its files was written (None for none), links not followed: what they point to is not the
    run's."""
    newest = None
    for folder, _subfolders, files in os.walk(directory):
        for name in files:
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):  # a file removed meanwhile (a checkpoint the run rotated out)
                status = os.lstat(path)
                if stat.S_ISREG(status.st_mode):
                    newest = max(newest or 0.0, status.st_mtime)
    total = folder_bytes(directory)
    return total, (datetime.fromtimestamp(newest, tz=dt_timezone.utc) if newest is not None else None)


def ranking_metric(run: Run) -> tuple[str, bool] | None:
    """The metric ``run``'s checkpoints are ranked by and whether higher is better (``best_metric_for``); None for a
    run with none (external runs, or a spec this engine no longer reads)."""
    try:
        return best_metric_for(parse_spec(run.resolved_spec or run.spec))
    except (SpecError, IndexError):  # unreadable spec; an RL spec naming no reward
        return None


def ranking_evaluations(*, runs: Iterable[Run]) -> dict[int, list[tuple[int, float]]]:
    """``{run pk: [(step, value)]}``, oldest first, of each run's ranking metric (``ranking_metric``): one query for
    any number of runs, for ``checkpoint_scores``'s ``evaluations``."""
    metrics = {run.pk: ranking[0] for run in runs if (ranking := ranking_metric(run)) is not None}
    evaluations: dict[int, list[tuple[int, float]]] = {run_id: [] for run_id in metrics}
    points = (MetricPoint.objects.filter(run__in=list(metrics), name__in=set(metrics.values()))
              .order_by("run_id", "step").values_list("run_id", "name", "step", "value"))
    for run_id, name, step, value in points:
        if metrics[run_id] == name:
            evaluations[run_id].append((step, value))
    return evaluations


def checkpoint_scores(*, run: Run, steps: list[int],
                      evaluations: list[tuple[int, float]] | None = None) -> dict[int, dict[str, Any]]:
    """What ranks each checkpoint, to choose one by: ``{step: {"metric", "value", "shown", "at", "best"}}``, the run's
    ranking metric (``jaxengine.spec.best_metric_for``: eval loss, or RL's first eval metric) as last evaluated
    at or before the step (``at``; evaluations and saves need not fall on the same steps), ``best`` on the one the
    trainer keeps as best (the lowest loss, the highest score, of those evaluated at their own step). Steps
    evaluated before none are left out, as are runs with no ranking metric (external runs, or a spec this engine
    no longer reads). ``evaluations``: the run's ``(step, value)`` of its ranking metric, oldest first, where the
    caller read them for many runs at once (``ranking_evaluations``)."""
    if not steps or (ranking := ranking_metric(run)) is None:
        return {}
    metric, higher_is_better = ranking
    if evaluations is None:
        evaluations = list(MetricPoint.objects.filter(run=run, name=metric, step__lte=steps[-1])
                           .order_by("step").values_list("step", "value"))
    evaluated_steps = [at for at, _value in evaluations]
    scores: dict[int, dict[str, Any]] = {}
    for step in steps:
        last = bisect.bisect_right(evaluated_steps, step) - 1
        if last >= 0 and math.isfinite(evaluations[last][1]):
            at, value = evaluations[last]
            scores[step] = {"metric": metric, "value": value, "shown": f"{value:.4g}", "at": at, "best": False}
    evaluated_there = [step for step in scores if scores[step]["at"] == step]  # as the trainer ranks them
    if evaluated_there:
        best = (max if higher_is_better else min)(evaluated_there, key=lambda step: scores[step]["value"])
        scores[best]["best"] = True
    return scores


def checkpoint_states(*, run: Run) -> dict[str, str]:
    """``{step: state}`` of every checkpoint: ``exported``, ``exporting``, ``failed`` or ``""`` (never
    asked for). The run page compares it with what it shows, to know when to load its checkpoints again."""
    # Not from checkpoint_list: the page asks at each catch-up, and that list reads scores, serving copies and
    # each checkpoint's files.
    exported = set(run.artifacts.filter(kind=ArtifactKind.CHECKPOINT).values_list("step", flat=True))
    asked = dict(run.checkpoint_exports.values_list("step", "status"))
    return {str(step): "exported" if step in exported else asked.get(step, "")
            for step in sorted({*checkpoint_steps(run), *exported})}


def checkpoint_launch_state(*, run: Run, step: int) -> tuple[str, str]:
    """What a checkpoint's *Launch a run from it* finds at ``step``, from a page that showed it not exported:
    ``("model", ref)`` when it is a model already (exported since, by a teammate or another page; or the final model),
    to open the launch form with; ``("exporting", "")`` while an export of it runs, to wait for; else ``("", "")``."""
    if run.artifacts.filter(kind=ArtifactKind.CHECKPOINT, step=step).exists():
        return "model", f"{run.public_id}@{step}"
    if step == final_model_step(run):
        return "model", run.public_id
    if run.checkpoint_exports.filter(step=step, status=CheckpointExportStatus.EXPORTING).exists():
        return "exporting", ""
    return "", ""


def launch_warnings(*, run: Run) -> list[str]:
    """What its launch logged as warnings about the run's spec (``services.plan_warnings``), an
    ``ActionWarning`` where one says where to do what it advises: the run started all the same, and the page it
    opens on says them again."""
    return [ActionWarning(message, **action) if action else message for message, action in
            run.log_lines.filter(level=LogLevel.WARNING).order_by("pk").values_list("message", "action")]


def unserved_pool_note(*, run: Run) -> str:
    """Why a queued single-host run has not started when no live train worker serves its pool, else "".
    Its message waits in the pool's queue, where nothing says so; a multi-host run is placed by the web
    and says why it waits itself (``waiting_reason``)."""
    if run.status != RunStatus.QUEUED or run.hosts > 1:
        return ""
    pool = run_pool(run)
    if pool in pool_offers():
        return ""
    queue = pool_queue(pool)
    return (f"No live train worker serves pool {pool}: the run waits in queue {queue} and starts when a worker "
            f"of that queue does (celery -A worker.celery worker -Q {queue}).")


def run_devices(*, run: Run) -> dict[str, Any]:
    """The devices that train (or trained) ``run``, as its worker's heartbeat reports them. A multi-host
    run's worker is host 0's: ``count`` is then every host's devices (the job's mesh spans them all, and
    placement gives it hosts × each worker's count) and ``per_host`` that worker's."""
    from webapp.workers.models import Worker

    worker = Worker.objects.filter(name=run.worker_name).first() if run.worker_name else None
    devices = dict(worker.devices) if worker is not None else {}
    if run.hosts > 1 and devices.get("count"):
        devices.update(per_host=devices["count"], count=devices["count"] * run.hosts)
    return devices


def serving_copy_figures(run: Run) -> dict[str, Any] | None:
    """The figures of the run's serving copy (``export/quantized/quantization.json``, its per-module list
    left out) with ``path`` and a one-line ``summary``; None while there is none or it cannot be read."""
    return copy_figures(export_copy_dir(run_export_dir(run)))


def serving_copy(*, run: Run) -> dict[str, Any] | None:
    """What the run page says of a succeeded run's quantized serving copy (``serving_copies.final_serving_copy``):
    ``state`` ``ready`` (with its figures: memory against bfloat16, perplexity against the unquantized
    model, greedy agreement), ``failed`` (with the worker's ``message``), ``writing``, or ``none`` while
    nothing writes copies (``TEMPER_SERVE_QUANTIZE=none``) and none was made (the card offers to make it).
    None for a run without a merged export (not succeeded, external) and a reward run (it writes no text)."""
    if not final_model_copyable(run):
        return None
    return final_serving_copy(run=run, automatic_scheme=settings.TEMPER_SERVE_QUANTIZE)


def lineage(*, run: Run) -> dict[str, Any]:
    """Where the run came from and what used it: base model, source run (chained), dataset
    versions with their use (``train``, ``eval``), its artifacts and the runs that started from its export."""
    return {
        "base_model": run.base_model,
        "source_run": run.source_run,
        "datasets": run.datasets_by_use(),
        # (use, id, {"name", "number"} as recorded at launch, or None: a model, or data deleted before it was recorded).
        "deleted": [(use, ref, _recorded_name(run, use, ref)) for use, ref in run.deleted_references()],
        "artifacts": list(run.artifacts.all()),
        # Their names and ids only: a sweep started from this run would otherwise read each one's series_cache.
        "derived_runs": list(run.derived_runs.order_by("created_at").only("public_id", "name", "source_run")),
    }


def serving_copy_being_written(*, run: Run) -> bool:
    """Whether a serve worker is writing a serving copy of ``run``'s model (into its directory): one asked for
    (a row), or the copy written when the run succeeded, which has no row but its page says so."""
    return ((serving_copy(run=run) or {}).get("state") == "writing"
            or run.serving_copies.filter(status=ServingCopyStatus.WRITING).exists())


def may_delete_run(*, membership: Membership, run: Run) -> bool:
    """An owner may delete any run; a member one they launched (or opened, for an external run); a viewer none."""
    return membership.can(Role.OWNER) or (membership.can(Role.MEMBER) and run.created_by_id == membership.user_id)


def ensure_may_delete_run(*, membership: Membership, run: Run) -> None:
    """``PermissionDenied`` saying who may, unless ``membership`` may delete ``run`` (pages and API)."""
    if not may_delete_run(membership=membership, run=run):
        raise PermissionDenied("only an owner, or the member who launched it, may delete a run")


def may_cancel_pipeline(*, membership: Membership) -> bool:
    """Whoever may cancel a pipeline's runs (a member or an owner) may cancel the pipeline."""
    return membership.can(Role.MEMBER)


def ensure_may_cancel_pipeline(*, membership: Membership) -> None:
    """``PermissionDenied`` saying who may, unless ``membership`` may cancel a pipeline (pages and API)."""
    if not may_cancel_pipeline(membership=membership):
        raise PermissionDenied("only a member or an owner of the project may cancel a pipeline")


def run_disk_bytes(*, run: Run) -> int:
    """The disk the run's directory takes on the server — checkpoints, exported models, serving copies, logs —
    which deleting it frees: as ``du`` and the Storage page count it (``webapp.core.disk_usage``: blocks, links not
    followed, what they point to not being the run's)."""
    return folder_bytes(run_output_dir(run.public_id))


def folder_bytes(directory: str | os.PathLike) -> int:
    """The disk the files under ``directory`` take, as ``run_disk_bytes`` counts it: what deleting it frees."""
    return folder_usage(directory).bytes


def run_readers(*, run: Run) -> list[str]:
    """What still needs ``run`` or its files (the work a deletion would break), one sentence each: the run
    itself while queued or running, runs queued or training from its model or scored by it (a reward model), a
    running pipeline it is a stage of or whose stages name it, its serving copies and checkpoint exports being
    written, review campaigns generating with its model (or cancelled, while the serve worker still answers with
    it), evaluations of its model queued or running, chat and arena answers being written with it."""
    from webapp.chat.selectors import answers_being_written  # the chat is built on runs
    from webapp.evals.selectors import model_evaluation_readers
    from webapp.review.selectors import generation_readers

    readers = []
    if run.is_active:
        readers.append(f"it is {run.status}; cancel it and wait for it to stop")
    for derived in Run.objects.filter(source_run=run, status__in=ACTIVE_STATUSES).order_by("created_at"):
        readers.append(f"run {isolated(derived.name)} ({derived.public_id}) is {derived.status} from its model; "
                       "cancel it or wait for it to finish")
    active = Run.objects.filter(project=run.project_id, status__in=ACTIVE_STATUSES).exclude(pk=run.pk)
    for scored in active.order_by("created_at"):
        if run.public_id in reward_run_ids(scored.spec):
            readers.append(f"run {isolated(scored.name)} ({scored.public_id}) is {scored.status}, scored by its "
                           "model; cancel it or wait for it to finish")
    if run.pipeline_id is not None and run.pipeline.status == PipelineStatus.RUNNING:
        readers.append(f"pipeline {isolated(run.pipeline.name)} is running with it as a stage; cancel the pipeline or "
                       "wait for it to finish")
    # A later stage may name it (a starting model, a reward model) and be launched once the stage before ends.
    running = Pipeline.objects.filter(project=run.project_id, status=PipelineStatus.RUNNING).exclude(
        pk=run.pipeline_id)
    for pipeline in running.order_by("created_at"):
        if run.public_id in json.dumps(pipeline.stages):
            readers.append(f"pipeline {isolated(pipeline.name)} is running, and its stages name it; cancel it or wait "
                           "for it to finish")
    if serving_copy_being_written(run=run):
        readers.append("a serving copy of its model is being written; wait until it is ready")
    if run.checkpoint_exports.filter(status=CheckpointExportStatus.EXPORTING).exists():
        readers.append("a checkpoint of it is being exported; wait until it is done")
    readers.extend(generation_readers(project_id=run.project_id, model_id=run.public_id, model="its model"))
    readers.extend(model_evaluation_readers(project_id=run.project_id, model_id=run.public_id, model="its model"))
    readers.extend(answers_being_written(project_id=run.project_id, ref=run.public_id))
    return readers


def flatten_spec(spec: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"learning_rate": 1e-4}}`` → ``{"optim.learning_rate": 1e-4}``."""
    flat: dict[str, Any] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_spec(value, f"{name}."))
        else:
            flat[name] = value
    return flat


# The ids a written spec holds for a base model, a run (``@N``: its exported checkpoint N) or a dataset version.
SPEC_REFERENCE = re.compile(r"(bm|run|dv)_[0-9A-Za-z]+(@[0-9]+)?")


@dataclass(frozen=True)
class SpecReference:
    """A spec value that is an id, with the name of what it points at (``"chats v2"``)."""

    name: str
    ref: str

    def __str__(self) -> str:
        return f"{self.name} ({self.ref})"


def reference_names(*, project_id: int, values: Iterable[Any]) -> dict[str, SpecReference]:
    """The ids among ``values`` of things of the project, each named; three queries whatever the count."""
    references = {value for value in values if isinstance(value, str) and SPEC_REFERENCE.fullmatch(value)}
    ids = {reference.partition("@")[0] for reference in references}
    names = dict(BaseModel.objects.filter(project_id=project_id, public_id__in=ids).values_list("public_id", "name"))
    names.update(Run.objects.filter(project_id=project_id, public_id__in=ids).values_list("public_id", "name"))
    names.update((version.public_id, f"{version.dataset.name} v{version.number}") for version in DatasetVersion.objects
                 .filter(dataset__project_id=project_id, public_id__in=ids).select_related("dataset"))
    found = {}
    for reference in references:
        public_id, at, step = reference.partition("@")
        if public_id in names:
            found[reference] = SpecReference(name=names[public_id] + (f", checkpoint {step}" if at else ""), ref=reference)
    return found


def _recorded_name(run: Run, use: str, ref: str) -> dict[str, Any] | None:
    """The name and number a deleted data version ``ref`` of ``run``'s spec had at launch (``use``: its data key, or
    "model"); None for a model, or data deleted before names were recorded."""
    return run.recorded_dataset_name(ref) if use != "model" else None


def _deleted_name(run: Run, use: str, ref: str) -> str:
    """How a deleted model or data version of ``run``'s spec is named: data as its launch recorded it."""
    recorded = _recorded_name(run, use, ref)
    return f"{recorded['name']} v{recorded['number']} (deleted since)" if recorded else "deleted since"


def config_diff(*, runs: list[Run]) -> list[dict[str, Any]]:
    """One row per spec key across ``runs``: its values (None where absent; a model, run or dataset
    version id as a ``SpecReference`` with its name) and whether they differ."""
    flat = [flatten_spec(run.spec) for run in runs]
    keys = sorted(set().union(*flat)) if flat else []
    named = reference_names(project_id=runs[0].project_id, values=[value for entry in flat for value in entry.values()]
                            ) if runs else {}
    # What a run's spec names and is gone reads as such, as on its page's lineage (not as a bare id).
    gone = [{("model" if use == "model" else f"data.{use}", ref): SpecReference(name=_deleted_name(run, use, ref), ref=ref)
             for use, ref in run.deleted_references()} for run in runs]
    rows = []
    for key in keys:
        values = [entry.get(key) for entry in flat]
        # Lists, mappings and booleans as the spec writes them (JSON's true, not Python's True).
        rendered = [json.dumps(value) if isinstance(value, (list, dict, bool)) else
                    named.get(value) or gone[index].get((key, value), value)
                    if isinstance(value, str) else value for index, value in enumerate(values)]
        rows.append({"key": key, "values": rendered, "differs": len({json.dumps(v, sort_keys=True) for v in values}) > 1})
    return rows


def _key_applies(key: str, *, task: str) -> bool:
    """Whether a flat spec ``key`` is one a ``task`` run reads: not another task's section's, nor a common
    section's key for other tasks only (``TASK_ONLY_KEYS``)."""
    section = key.partition(".")[0]
    if section not in TASK_SECTIONS.get(task, ()) and any(section in sections for sections in TASK_SECTIONS.values()):
        return False
    return task in TASK_ONLY_KEYS.get(key, (task,))


def hyperparameter_axes(*, runs: list[Run], diff: list[dict[str, Any]], metric_names: list[str]) -> dict[str, Any] | None:
    """What the compare page's parallel-coordinates chart draws, for three runs or more whose configs
    differ (a sweep, say): an axis per key of single values that differs among the runs it applies to
    (``_key_applies``: runs of different kinds have sections of their own; numbers as numbers, anything
    else, a model's name say, as a category), and the runs' last value of each final metric (None where
    a run has none), for the chart to color by and end on. None when there is nothing to draw."""
    if len(runs) < 3:
        return None
    flat = [flatten_spec(run.spec) for run in runs]  # the diff writes lists out as JSON text
    axes = []
    for row in diff:
        if not row["differs"] or any(isinstance(entry.get(row["key"]), (list, dict)) for entry in flat):
            continue
        values = [value.name if isinstance(value, SpecReference) else value for value in row["values"]]
        # Runs of different kinds each have keys of their own, "—" in the others: a key is an axis only where
        # the runs it applies to differ in it (not a loss type every DPO run shares, nor the one reward run's
        # coefficient), else the chart of a DPO, a reward and an SFT run was a wall of "—" axes.
        applies = [_key_applies(row["key"], task=run.task) for run in runs]
        if len({json.dumps(value) for value, used in zip(values, applies) if used}) < 2:
            continue
        numeric = all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values)
        axes.append({"key": row["key"], "numeric": numeric,
                     "values": values if numeric else ["—" if value is None else str(value) for value in values]})
    metrics = {name: [(run.final_metrics.get(name) or {}).get("last") for run in runs] for name in metric_names}
    metrics = {name: values for name, values in metrics.items() if any(value is not None for value in values)}
    if not axes or not metrics:
        return None
    return {"runs": [run.name for run in runs], "axes": axes, "metrics": metrics}


def generations_across_steps(*, run: Run, limit: int = 5) -> dict[str, Any]:
    """One run's generations for the same eval prompts at its last ``limit`` evaluated steps:
    rows are prompts, columns steps (how the answers changed as it trained)."""
    steps = sample_steps(run=run, kind="eval")[-limit:]
    prompts: dict[str, Any] = {}
    cells: dict[tuple[int, str], Sample] = {}
    for sample in _of_kind(Sample.objects.filter(run=run, step__in=steps), "eval").order_by("position", "step"):
        key = json.dumps(sample.prompt, sort_keys=True)
        prompts.setdefault(key, sample.prompt)
        cells[(sample.step, key)] = sample
    return {"steps": steps, "rows": [{"prompt": prompt, "cells": [cells.get((step, key)) for step in steps]}
                                     for key, prompt in prompts.items()]}


def nearest_step(steps: list[int], asked: int | None) -> int | None:
    """Of ``steps`` (ascending), ``asked`` or the nearest to it (the earlier of two as near); the last when nothing
    is asked; None when there are none. A chart's click, or an address, may name any step."""
    if not steps:
        return None
    if asked is None:
        return steps[-1]
    return min(steps, key=lambda candidate: (abs(candidate - asked), candidate))


def eval_sample_steps(*, runs: list[Run]) -> dict[int, list[int]]:
    """Each run's steps with generations for the eval prompts (rollouts left out), ascending, by pk: one query."""
    steps: dict[int, list[int]] = {run.pk: [] for run in runs}
    rows = _of_kind(Sample.objects.filter(run__in=runs), "eval").order_by("run", "step").values_list("run", "step")
    for run_pk, step in rows.distinct():
        steps[run_pk].append(step)
    return steps


# The metric a run logs when its evaluation scores exact match (jaxengine.job.make_sample_hook, for the eval rows
# with an answer): its generations are marked matching or not by the same rule (evaluate.answers_match).
EXACT_MATCH_METRIC = "eval/exact_match"


def side_by_side(*, runs: list[Run], steps: dict[int, int | None] | None = None) -> dict[str, Any]:
    """Generations for the same eval prompts across runs: rows are prompts (in the first run's
    order), columns are runs at their chosen step (``steps``, by pk: that step, or the nearest the run evaluated;
    default: each run's last evaluated step), each column with every step it could show (``steps``).
    Rollouts are not generations for the eval prompts, so they are left out. The generations of a run that
    scores exact match carry ``matches_answer`` (True or False; None where it is not scored)."""
    # Two queries whatever the number of runs (the compare page takes up to MAX_COMPARE): each run's evaluated
    # steps in one, then the samples of every (run, step) chosen in another.
    asked = steps or {}
    evaluated = eval_sample_steps(runs=runs)
    chosen_steps = {run.pk: nearest_step(evaluated[run.pk], asked.get(run.pk)) for run in runs}
    columns = [{"run": run, "step": chosen_steps[run.pk], "steps": evaluated[run.pk]} for run in runs]
    chosen = [Q(run=run.pk, step=chosen_steps[run.pk]) for run in runs if chosen_steps[run.pk] is not None]
    samples_by_run: dict[int, list[Sample]] = {run.pk: [] for run in runs}
    if chosen:
        for sample in _of_kind(Sample.objects.filter(_any_of(chosen)), "eval").order_by("position"):
            samples_by_run[sample.run_id].append(sample)
    for run in runs:
        _mark_exact_matches(run, samples_by_run[run.pk])
    prompts: dict[str, Any] = {}
    texts: dict[tuple[int, str], Sample] = {}
    for run in runs:  # rows in the first run's order of prompts, as before
        for sample in samples_by_run[run.pk]:
            key = json.dumps(sample.prompt, sort_keys=True)
            prompts.setdefault(key, sample.prompt)
            texts[(run.pk, key)] = sample
    rows = []
    for key, prompt in prompts.items():
        cells = [texts.get((column["run"].pk, key)) for column in columns]
        # What the prompt should get, beside what each run wrote: the same eval data gives every run the same one.
        reference = next((text for text in map(_reference_of, filter(None, cells)) if text), "")
        rows.append({"prompt": prompt, "cells": cells, "reference": reference})
    return {"columns": columns, "rows": rows, "has_reference": any(row["reference"] for row in rows)}


def _mark_exact_matches(run: Run, samples: list[Sample]) -> None:
    scored = [sample for sample in samples if sample.answer] if EXACT_MATCH_METRIC in run.final_metrics else []
    matches = answers_match([sample.text for sample in scored], [{"answer": sample.answer} for sample in scored])
    for sample in samples:
        sample.matches_answer = None
    for sample, match in zip(scored, matches, strict=True):
        sample.matches_answer = match


def _reference_of(sample: Sample) -> str:
    return sample_reference(sample)[1]


def sample_reference(sample: Sample) -> tuple[str, str]:
    """A generation's reference and what it is: the prompt's ``answer`` (an eval row with an answer, of any
    task), an SFT row's ``completion``, or a preference pair's ``chosen answer``; ("", "") without one."""
    for kind, text in (("answer", sample.answer), ("completion", sample.extra.get("completion")),
                       ("chosen answer", sample.extra.get("chosen"))):
        if text:
            return kind, text
    return "", ""


def run_datasets_prefetched(*, run: Run) -> Run:
    """``run`` with its dataset versions and their datasets read in two queries: the run page reads them in its
    history, its data card and its deleted references, which otherwise cost a query each and one a version."""
    prefetch_related_objects([run], "dataset_versions__dataset")
    return run


def _any_of(conditions: list[Q]) -> Q:
    combined = conditions[0]
    for condition in conditions[1:]:
        combined |= condition
    return combined


def pipeline_list(*, project: Project) -> QuerySet[Pipeline]:
    return (Pipeline.objects.filter(project=project).select_related("result_run")
            .defer(*(f"result_run__{field}" for field in LIST_DEFERRED_FIELDS)).order_by("-created_at", "-id"))


def pipeline_page(*, project: Project, after: tuple[str, int] | None, limit: int) -> KeysetPage[Pipeline]:
    """The ``limit`` pipelines of ``pipeline_list`` (newest first) that follow the one whose (creation time as
    ISO text, id) is ``after`` (``webapp.core.keyset``)."""
    pipelines = pipeline_list(project=project)
    if after is not None:
        created_at, last_id = after
        pipelines = pipelines.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=last_id))
    return keyset_page(pipelines, limit=limit, key=lambda pipeline: (pipeline.created_at.isoformat(), pipeline.pk))


def pipeline_get(*, project: Project, public_id: str) -> Pipeline:
    """Pipeline ``public_id`` of ``project``; 404 when it belongs elsewhere."""
    pipeline = Pipeline.objects.filter(project=project, public_id=public_id).select_related("result_run").first()
    if pipeline is None:
        raise Http404("no such pipeline in this project")
    return pipeline



def run_starting(*, run: Run) -> bool:
    """Whether a worker took the run's current attempt and has reported no step of it yet: it is loading the model
    and compiling. A resumed attempt starts at its checkpoint's step, not 0, so the step alone does not say it: the
    current step's points are this attempt's once they were logged after its start (``wall_time``, by the clock of
    the worker that set ``started_at``: both come from process 0). An external run is never starting: Temper loads
    nothing for it, and its points carry its own times."""
    if run.status != RunStatus.RUNNING or run.started_at is None or run.task == "external":
        return False
    if run.current_step == 0:
        return True
    return not MetricPoint.objects.filter(run=run, step=run.current_step,
                                          wall_time__gte=run.started_at.timestamp()).exists()


def run_evaluating(*, run: Run) -> dict[str, Any] | None:
    """The evaluation an active run is in now, as its page says it on load (``step`` and ``text``, as
    static/runs.js words the live ``evaluating`` event): the latest one its worker kept in Redis, unless
    that step's progress is recorded already; None when Redis is away."""
    if not run.is_active:
        return None
    client = channels.redis_client()
    try:
        kept = client.get(channels.evaluating_key(run.public_id))
    except redis.RedisError:
        return None
    finally:
        client.close()
    if kept is None:
        return None
    event = json.loads(kept)
    if event["step"] <= run.current_step:
        return None
    detail = "generating samples" if event["generating"] else f"{event['batches_done']}/{event['batches']} batches"
    return {"step": event["step"], "text": f"evaluating step {event['step']} ({detail})"}


@dataclass(frozen=True, kw_only=True)
class MemoryCheck:
    """``jaxengine.memory``'s estimate of a run's memory per device, as the launch form and the run page say
    it (``summary``), and ``warning`` when it exceeds the smallest device of its pool's live train workers."""

    summary: str
    warning: str = ""


def reward_base_model(*, project: Project, spec: dict[str, Any]) -> BaseModel | None:
    """The base model of the reward run a written ``task: ppo`` spec scores with (``ppo.reward_model:
    run_…`` of ``project``), whose facts are the reward model's; None for any other spec."""
    reference = (spec.get("ppo") or {}).get("reward_model") if spec.get("task") == "ppo" else None
    if not isinstance(reference, str) or not reference:
        return None
    run = Run.objects.filter(project=project, public_id=reference, task="reward").select_related("base_model").first()
    return run.base_model if run is not None else None


def memory_check(*, job: Any, base_model: BaseModel | None, pool: str,
                 reward_base_model: BaseModel | None = None) -> MemoryCheck | None:
    """The memory ``job`` (a parsed ``JobSpec``) needs a device when it trains from ``base_model`` (whose
    registration read its facts), against the devices the live train workers of ``pool`` registered; None
    when the model's config lacks a fact the estimate reads. ``reward_base_model``: that of PPO's reward
    run (``reward_base_model``), whose model the run also holds."""
    from webapp.workers.models import Worker, stale_after

    if base_model is None:
        return None
    facts = ModelFacts.from_config(parameter_count=base_model.parameter_count, config=base_model.config or {})
    if facts is None:
        return None
    alive = Worker.objects.filter(stopped_at__isnull=True, last_seen__gte=timezone.now() - stale_after(), pool=pool)
    probed = [worker.devices for worker in alive if isinstance(worker.devices.get("memory_bytes"), int)
              and isinstance(worker.devices.get("count"), int)]
    smallest = min(probed, key=lambda devices: devices["memory_bytes"], default=None)
    count = smallest["count"] * job.hosts if smallest is not None else 1
    reward_facts = (ModelFacts.from_config(parameter_count=reward_base_model.parameter_count,
                                           config=reward_base_model.config or {})
                    if reward_base_model is not None else None)
    estimate = estimate_memory(facts=facts, spec=job, devices=count, reward_model=reward_facts)
    summary = estimate.summary()
    if smallest is None:
        return MemoryCheck(summary=f"{summary}; no live train worker of pool {pool} has said its devices' memory")
    memory = smallest["memory_bytes"]
    device = f"{byte_size(memory)} of each {', '.join(smallest.get('kinds') or []) or 'device'} of pool {pool}"
    if estimate.total <= memory:
        return MemoryCheck(summary=f"{summary}: fits the {device}")
    return MemoryCheck(summary=f"{summary}: more than the {device}", warning=(
        f"memory: the run needs {summary}, more than the {device}; lower train.batch_size (and raise "
        "train.grad_accum to keep the batch), set train.remat, lower data.max_seq_len, or use peft.method lora "
        "or qlora"))


def disk_warning(*, job: Any, base_model: BaseModel | None, output_dir: str) -> str | None:
    """The plan warning of a run whose checkpoints and export (``jaxengine.memory.estimate_disk``, from the facts
    ``base_model``'s registration read) need more than the free space of the disk holding its ``output_dir`` now;
    None when they fit or the model's config lacks a fact. A warning, not a refusal: space may be freed before the run
    writes its first checkpoint, and other runs may fill it meanwhile."""
    if base_model is None:
        return None
    facts = ModelFacts.from_config(parameter_count=base_model.parameter_count, config=base_model.config or {})
    if facts is None:
        return None
    estimate = estimate_disk(facts=facts, spec=job,
                             stored_bytes_per_parameter=stored_bytes_per_parameter(base_model.config or {}))
    free, _total = free_and_total(output_dir)
    if estimate.total <= free:
        return None
    return (f"disk: the run writes {estimate.summary()} at its fullest, more than the {byte_size(free)} free on the "
            "server's disk now: it would fail mid-checkpoint once the disk fills. Free space (the project's Storage "
            "page shows what its runs take), lower train.keep_last, or use peft.method lora or qlora (its checkpoints "
            "hold the adapters only)")


def run_memory_check(*, run: Run) -> MemoryCheck | None:
    """``memory_check`` of a launched run, by its resolved spec (None for one the schema no longer reads)."""
    try:
        job = parse_spec(run.resolved_spec)
    except SpecError:
        return None
    return memory_check(job=job, base_model=run.base_model, pool=run_pool(run),
                        reward_base_model=reward_base_model(project=run.project, spec=run.spec or {}))


def _about_at_launch(run: Run, public_id: str, *, now: dict[str, str]) -> dict[str, str]:
    """The source, licence and description of dataset version ``public_id``'s dataset as ``run``'s launch recorded
    them (``services._save_planned``); ``now`` (the dataset's today, or {} when it is gone) for a run launched before
    they were recorded."""
    recorded = (run.dataset_names or {}).get(public_id)
    if isinstance(recorded, dict) and "licence" in recorded:
        return {key: str(recorded.get(key) or "") for key in ("source", "licence", "description")}
    return now


def run_provenance(*, run: Run) -> dict[str, Any]:
    """What the engine cannot know of ``run`` for its exports' model cards (``jaxengine.model_card``): project, run name
    and id, author, Temper version, its base model's and the run it started from's name and id (where they still
    exist; the base model is the root of a chain of runs), and its dataset versions with their use, name, number and
    rows (a version deleted since by the name its launch recorded, its rows unknown), the source, licence and
    description their datasets had at launch (``_about_at_launch``), and the run's notes where it has some (as they are
    when the worker starts the run or exports a checkpoint)."""
    from jaxengine import __version__ as temper_version

    datasets = [{"use": use or "data", "name": version.dataset.name, "version": version.number,
                 "id": version.public_id, "rows": version.row_count,
                 **_about_at_launch(run, version.public_id, now=dataset_about(dataset=version.dataset))}
                for use, version in run.datasets_by_use()]
    for use, ref in run.deleted_references():
        if use != "model":
            recorded = _recorded_name(run, use, ref) or {}
            datasets.append({"use": use, "name": recorded.get("name", ref), "version": recorded.get("number"),
                             "id": ref, "rows": None, **_about_at_launch(run, ref, now={})})
    provenance = {"project": run.project.name, "run_name": run.name, "run_id": run.public_id,
                  "author": run.created_by.get_username() if run.created_by else "", "temper_version": temper_version,
                  "datasets": datasets}
    if run.base_model is not None:
        provenance["base_model"] = {"name": run.base_model.name, "id": run.base_model.public_id}
    if run.source_run is not None:
        provenance["source_run"] = {"name": run.source_run.name, "id": run.source_run.public_id}
    if run.notes.strip():
        provenance["notes"] = run.notes  # the card quotes their start (``model_card.notes_excerpt``)
    return provenance
