"""Reads of datasets and versions for pages, including the preview of a version's rows.

Preview cells are plain data (type, text, whether to fold) rendered by templates with
autoescaping on: dataset text is untrusted and is never marked safe.
"""
from __future__ import annotations

import bisect
import functools
import json
from dataclasses import dataclass
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

import numpy as np
from django.db.models import Count, IntegerField, JSONField, OuterRef, Q, QuerySet, Subquery
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.urls import reverse

from jaxengine.data import formats
from jaxengine.spec import TASK_DATASET_KINDS
from jaxengine.words import counted
from webapp.core.keyset import KeysetPage, keyset_page
from webapp.core.warnings import ActionWarning
from webapp.core.name_case import name_key
from webapp.core.numbers import whole_number
from webapp.datasets import search
from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus
from webapp.datasets.splitting import HeldOutSize, first_row_columns
from webapp.core.bidi import isolated
from webapp.projects.models import Membership, Project, Role

PREVIEW_PAGE_SIZE = 20
# Texts longer than this are folded in the preview, showing the first FOLD_HEAD characters.
FOLD_AT = 280
FOLD_HEAD = 160
# An unfolded text shows at most this many characters: a row may hold megabytes (a whole book in one
# line), and the page would carry every byte of it; the download has the rest.
PREVIEW_TEXT_MAX = 10_000
# Preview pages are read by scanning the file; past this many rows a page would be slow to serve.
PREVIEW_MAX_ROW = 100_000
# A launch warns of the training data's exact duplicates from this share of its rows on: a few repeats are
# common and harmless, many weight those rows over the rest (a file concatenated twice, say).
DUPLICATE_WARNING_SHARE = 0.01
# The tasks that learn from both sides of preference rows.
PREFERENCE_TASKS = ("dpo", "reward")


def dataset_list(*, project: Project) -> QuerySet[Dataset]:
    """The project's datasets by name, with their version count and latest version's number,
    status, row count and problems (``latest_number``, ``latest_status``, ``latest_rows``,
    ``latest_errors``, ``latest_error_count``), and the number of their latest ready version
    (``ready_number``: a failed new version leaves the one before usable) in one query."""
    latest = DatasetVersion.objects.filter(dataset=OuterRef("pk")).order_by("-number")
    latest_ready = latest.filter(status=VersionStatus.READY)
    return (
        Dataset.objects.filter(project=project)
        .annotate(
            version_count=Count("versions"),
            latest_number=Subquery(latest.values("number")[:1], output_field=IntegerField()),
            latest_status=Subquery(latest.values("status")[:1]),
            latest_rows=Subquery(latest.values("row_count")[:1]),
            latest_errors=Subquery(latest.values("errors")[:1], output_field=JSONField()),
            latest_error_count=Subquery(latest.values("error_count")[:1], output_field=IntegerField()),
            ready_number=Subquery(latest_ready.values("number")[:1], output_field=IntegerField()),
        )
        .order_by("name", "id")
    )


def dataset_page(*, project: Project, after: tuple[str, int] | None, limit: int) -> KeysetPage[Dataset]:
    """The ``limit`` datasets of ``dataset_list`` (by name) that follow the one whose (name, id) is ``after``
    (``webapp.core.keyset``)."""
    datasets = dataset_list(project=project)
    if after is not None:
        name, last_id = after
        datasets = datasets.filter(Q(name__gt=name) | Q(name=name, id__gt=last_id))
    return keyset_page(datasets, limit=limit, key=lambda dataset: (dataset.name, dataset.pk))


def dataset_named(*, project: Project, name: str) -> Dataset | None:
    """The dataset of ``project`` whose name is ``name`` but for letter case (``name_key``, as its unique
    constraint compares them), or None."""
    return Dataset.objects.filter(project=project, name_key=name_key(name)).first()


def dataset_get(*, project: Project, public_id: str) -> Dataset:
    """The dataset ``public_id`` of ``project``; 404 when it belongs elsewhere."""
    dataset = Dataset.objects.filter(project=project, public_id=public_id).select_related("created_by").first()
    if dataset is None:
        raise Http404("no such dataset in this project")
    return dataset


def dataset_about(*, dataset: Dataset) -> dict[str, str]:
    """What "About this dataset" says of ``dataset``: its ``source``, ``licence`` and ``description`` ("" where not
    given), as a run's launch records them for its model card (``runs.selectors.run_provenance``)."""
    return {"source": dataset.source, "licence": dataset.licence, "description": dataset.description}


def dataset_source_link(*, dataset: Dataset) -> str | None:
    """The dataset's source as a page links it: an http(s) address; None for anything else, shown as text."""
    from jaxengine.model_card import is_web_address

    return dataset.source if is_web_address(dataset.source) else None


def version_list(*, dataset: Dataset) -> QuerySet[DatasetVersion]:
    return dataset.versions.select_related("created_by").order_by("-number")


def version_get(*, dataset: Dataset, number: int) -> DatasetVersion:
    """Version ``number`` of ``dataset``; 404 when there is none."""
    version = dataset.versions.filter(number=number).select_related("created_by", "dataset").first()
    if version is None:
        raise Http404(f"{isolated(dataset.name)} has no version {number}")
    return version


def version_get_by_id(*, project: Project, public_id: str) -> DatasetVersion:
    """The version ``public_id`` (dv_…, as a run's spec names it) of a dataset of ``project``; 404 when it belongs
    elsewhere."""
    version = (DatasetVersion.objects.filter(dataset__project=project, public_id=public_id)
               .select_related("created_by", "dataset").first())
    if version is None:
        raise Http404("no such dataset version in this project")
    return version


def tasks_training_on(kind: str) -> list[str]:
    """The run tasks whose training data is a dataset of ``kind`` (the engine's ``TASK_DATASET_KINDS``), in
    the spec's order: what a version page offers to launch on it."""
    return [task for task, task_kind in TASK_DATASET_KINDS.items() if task_kind == kind]


def may_delete_version(*, membership: Membership, version: DatasetVersion) -> bool:
    """An owner may delete any version; a member only one they uploaded themselves (a mistaken upload);
    a viewer none."""
    return membership.can(Role.OWNER) or (membership.can(Role.MEMBER) and version.created_by_id == membership.user_id)


def may_delete_dataset(*, membership: Membership, dataset: Dataset, versions: list[DatasetVersion]) -> bool:
    """An owner may delete any dataset; a member one they made whose every version they uploaded."""
    return membership.can(Role.OWNER) or (
        membership.can(Role.MEMBER) and dataset.created_by_id == membership.user_id
        and all(may_delete_version(membership=membership, version=version) for version in versions))


def ensure_may_delete_version(*, membership: Membership, version: DatasetVersion) -> None:
    """``PermissionDenied`` saying who may, unless ``membership`` may delete ``version`` (pages and API)."""
    if not may_delete_version(membership=membership, version=version):
        raise PermissionDenied("only an owner, or the member who uploaded it, may delete a dataset version")


def ensure_may_delete_dataset(*, membership: Membership, dataset: Dataset, versions: list[DatasetVersion]) -> None:
    """``PermissionDenied`` saying who may, unless ``membership`` may delete ``dataset`` (pages and API)."""
    if not may_delete_dataset(membership=membership, dataset=dataset, versions=versions):
        raise PermissionDenied("only an owner, or the member who made it and uploaded each of its versions, may "
                               "delete a dataset")


def version_readers(*, versions: list[DatasetVersion]) -> list[str]:
    """What still reads one of ``versions`` (the work a deletion would break), one sentence each: runs
    queued or training on it, review campaigns loading their items from it or generating answers to its
    prompts, running pipelines whose stages name it, serving copies being written against it, evaluations
    queued or running on it, and versions being written from it (``services.dataset_version_split`` and
    ``services.dataset_version_derive``: from it, or without the rows it holds)."""
    # Imported here: these apps' models import this one's.
    from webapp.evals.selectors import version_evaluation_readers
    from webapp.review.models import Campaign, CampaignStatus
    from webapp.runs.models import ACTIVE_STATUSES, Pipeline, PipelineStatus, Run, ServingCopy, ServingCopyStatus

    if not versions:
        return []
    by_pk = {version.pk: version for version in versions}
    public_ids = {version.public_id: version for version in versions}
    readers = []
    for run in Run.objects.filter(dataset_versions__in=versions, status__in=ACTIVE_STATUSES).distinct():
        readers.append(f"run {isolated(run.name)} ({run.public_id}) is {run.status} with it; cancel it or wait for it "
                       "to finish")
    for campaign in Campaign.objects.filter(source_version__in=versions, status=CampaignStatus.LOADING):
        readers.append(f"review campaign {isolated(campaign.name)} is loading its items from "
                       f"{isolated(str(by_pk[campaign.source_version_id]))}; wait until it is ready")
    project = versions[0].dataset.project_id
    for campaign in Campaign.objects.filter(project=project, status=CampaignStatus.GENERATING):
        version = public_ids.get(((campaign.generation or {}).get("prompts") or {}).get("version"))
        if version is not None:
            readers.append(f"review campaign {isolated(campaign.name)} is generating answers to the prompts of "
                           f"{isolated(str(version))}; wait until it is ready")
    for pipeline in Pipeline.objects.filter(project=project, status=PipelineStatus.RUNNING):
        named = [version for public_id, version in public_ids.items() if public_id in json.dumps(pipeline.stages)]
        if named:
            readers.append(f"pipeline {isolated(pipeline.name)} is running, and its stages name "
                           f"{isolated(str(named[0]))}; cancel it or wait for it to finish")
    for copy in ServingCopy.objects.filter(eval_version__in=versions, status=ServingCopyStatus.WRITING):
        readers.append("a serving copy is being written that measures itself on "
                       f"{isolated(str(by_pk[copy.eval_version_id]))}; wait until it is ready")
    readers.extend(version_evaluation_readers(versions=versions))
    derived = DatasetVersion.objects.filter(Q(derivation__source__in=list(public_ids))
                                            | Q(derivation__against__in=list(public_ids)),
                                            status=VersionStatus.UPLOADED)
    for version in derived.select_related("dataset").order_by("pk"):
        record = version.derivation
        if record.get("source") in public_ids:
            doing = "split" if record["kind"] == "split" else "derived"
            readers.append(f"{isolated(str(version))} is being {doing} from "
                           f"{isolated(str(public_ids[record['source']]))}; wait until it is ready")
        else:
            readers.append(f"{isolated(str(version))} is being written without the rows it shares with "
                           f"{isolated(str(public_ids[record['against']]))}; wait until it is ready")
    return readers


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One value of a preview row: ``type`` is text, chat or json."""

    type: str
    text: str = ""  # at most PREVIEW_TEXT_MAX characters of it
    head: str = ""
    folded: bool = False
    length: int = 0  # of the whole text
    turns: tuple[tuple[str, Cell], ...] = ()

    @property
    def cut(self) -> bool:
        """Whether the text is longer than what the preview shows of it."""
        return self.length > len(self.text)


@dataclass(frozen=True, kw_only=True)
class PreviewPage:
    columns: tuple[str, ...]
    rows: tuple[tuple[int, tuple[Cell, ...]], ...]
    page: int
    page_count: int
    rows_previewed: int  # the first rows of the version, at most PREVIEW_MAX_ROW, that its pages go through
    search: str = ""  # the text the rows were searched for ("" for every row)
    match_count: int = 0  # rows among rows_previewed that hold it


def _text_cell(text: str, *, cell_type: str = "text") -> Cell:
    folded = len(text) > FOLD_AT
    return Cell(type=cell_type, text=text[:PREVIEW_TEXT_MAX], head=text[:FOLD_HEAD] if folded else text, folded=folded,
                length=len(text))


def _cell(value: Any) -> Cell:
    if isinstance(value, str):
        return _text_cell(value)
    if isinstance(value, list) and all(isinstance(turn, dict) and "role" in turn for turn in value):
        return Cell(type="chat", turns=tuple((str(turn["role"]), _text_cell(str(turn.get("content", "")))) for turn in value))
    if value is None:
        return Cell(type="json", text="")
    return _text_cell(json.dumps(value, ensure_ascii=False, default=str), cell_type="json")


def _preview_columns(kind: formats.DatasetKind, examples: list[dict[str, Any]]) -> tuple[str, ...]:
    if kind is formats.DatasetKind.SFT and any("messages" in example for example in examples):
        if any("prompt" in example for example in examples):
            return ("prompt", "completion", "messages")
        return ("messages",)
    if kind is formats.DatasetKind.SFT:
        return ("prompt", "completion")
    columns = list(formats.KIND_FIELDS[kind])
    for example in examples:
        columns.extend(key for key in example if key not in columns)
    return tuple(columns)


def _preview_rows(kind: formats.DatasetKind, found: list[tuple[int, dict[str, Any]]]
                  ) -> tuple[tuple[str, ...], tuple[tuple[int, tuple[Cell, ...]], ...]]:
    """The columns of numbered examples ``found`` and their rows as cells, as a preview table shows them."""
    columns = _preview_columns(kind, [example for _, example in found])
    return columns, tuple((number, tuple(_cell(example.get(column)) for column in columns)) for number, example in found)


def version_preview(*, version: DatasetVersion, page: int, page_size: int = PREVIEW_PAGE_SIZE) -> PreviewPage:
    """Page ``page`` (1-based, clamped to the pages there are) of a ready version's rows, after the
    column mapping, as cells ready to render."""
    rows_shown = min(version.row_count or 0, PREVIEW_MAX_ROW)
    page_count = max(1, -(-rows_shown // page_size))
    page = min(max(page, 1), page_count)
    kind = formats.DatasetKind(version.dataset.kind)
    mapping = formats.ColumnMapping(kind=kind, columns=version.column_mapping)
    found = formats.read_page(
        version.absolute_path, fmt=formats.FileFormat(version.format), mapping=mapping,
        offset=(page - 1) * page_size, limit=page_size,
    )
    columns, rows = _preview_rows(kind, found)
    return PreviewPage(columns=columns, rows=rows, page=page, page_count=page_count, rows_previewed=rows_shown)


def version_search(*, version: DatasetVersion, text: str, page: int, page_size: int = PREVIEW_PAGE_SIZE) -> PreviewPage:
    """Page ``page`` of the rows (among the first ``PREVIEW_MAX_ROW``) that hold ``text`` in any value
    after the column mapping, a chat's turns included, in any letter case (``str.casefold``: "STRASSE"
    finds "Straße"), in one Unicode form (``name_key``: an "é" typed as "e" and its accent finds a stored "é").
    Read from the version's search index (``webapp.datasets.search``, built by its first search), where only the
    page's rows are decoded; a version the index cannot hold exactly is read from its file, as a first search
    reads it to build the index."""
    needle = name_key(text)
    kind = formats.DatasetKind(version.dataset.kind)
    rows_shown = min(version.row_count or 0, PREVIEW_MAX_ROW)
    index = search.search_index(version, rows=rows_shown)
    # Every match is counted but only the page asked for is kept, and the last page's while reading (rows
    # may be large, and "a" matches them all): a page past the last comes back as the last, as in the preview.
    page = max(page, 1)
    match_count, kept, last_page = 0, [], []
    if index is not None:
        found: Iterable[tuple[int, Any]] = index.matching_rows(needle)
    else:
        found = ((number, example) for number, example in search.version_examples(version, rows=rows_shown)
                 if needle in search.searchable_text(example))
    for number, row in found:
        if match_count % page_size == 0:
            last_page = []
        last_page.append((number, row))
        if (page - 1) * page_size <= match_count < page * page_size:
            kept.append((number, row))
        match_count += 1
    page_count = max(1, -(-match_count // page_size))
    if page > page_count:
        page, kept = page_count, last_page
    if index is not None:  # the rows held the places of their examples in the index
        kept = list(zip([number for number, _ in kept], index.examples([offset for _, offset in kept])))
    columns, rows = _preview_rows(kind, kept)
    return PreviewPage(columns=columns, rows=rows, page=page, page_count=page_count, rows_previewed=rows_shown,
                       search=text, match_count=match_count)


SHOWN_PLACES = 5


@dataclass(frozen=True, kw_only=True)
class ProblemGroup:
    """One problem as a failed version's page lists it: the stored errors that say the same thing of the
    same field (rows with a column named differently, each missing the same field) are one entry with the
    places where they are, in the order they were found."""

    code: str
    field: str | None
    message: str
    lines: tuple[int | None, ...]
    rows: tuple[int | None, ...]

    @property
    def many(self) -> bool:
        return len(self.lines) > 1

    @property
    def line_list(self) -> str:
        return _places(self.lines)

    @property
    def row_list(self) -> str:
        return _places(self.rows)


def _places(numbers: tuple[int | None, ...]) -> str:
    shown = ", ".join("—" if number is None else str(number) for number in numbers[:SHOWN_PLACES])
    more = len(numbers) - SHOWN_PLACES
    return f"{shown} and {more} more" if more > 0 else shown


def problem_groups(*, version: DatasetVersion) -> list[ProblemGroup]:
    """The stored errors of ``version`` (the first ``DEFAULT_MAX_ERRORS``), alike ones together."""
    grouped: dict[tuple[str, str | None, str], list[dict[str, Any]]] = {}
    for error in version.errors:
        grouped.setdefault((error.get("code", ""), error.get("field"), error.get("message", "")), []).append(error)
    return [ProblemGroup(code=code, field=field, message=message,
                         lines=tuple(error.get("line") for error in errors), rows=tuple(error.get("row") for error in errors))
            for (code, field, message), errors in grouped.items()]


# In a version's statistics while a count of what its validation did not count is queued (``services.late_count_request``:
# its turn splits, or its rows read with their prompt once): when it was queued, in seconds since the epoch; gone once
# they are counted, and never shown (``shown_statistics``).
TURN_SPLITS_QUEUED = "turn_splits_queued_at"
PROMPT_READ_ONCE_QUEUED = "prompt_read_once_queued_at"
COUNT_QUEUED_MARKERS = frozenset({TURN_SPLITS_QUEUED, PROMPT_READ_ONCE_QUEUED})


def shown_statistics(statistics: dict[str, Any] | None) -> dict[str, Any]:
    """A version's statistics without the bookkeeping of a count under way (the REST API's ``statistics``)."""
    return {key: value for key, value in (statistics or {}).items() if key not in COUNT_QUEUED_MARKERS}


def histograms(statistics: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-field histograms of a statistics dict, as plotly needs them: one entry per field with
    ``field``, ``summary`` (count/min/max/mean/percentiles) and bar ``x`` (bin starts), ``width``, ``y``."""
    charts = []
    # By name, as the engine writes them: PostgreSQL's jsonb does not keep the stored order.
    for name, summary in sorted((statistics.get("fields") or {}).items()):
        histogram = summary.get("histogram")
        if not histogram:
            continue
        edges = histogram["edges"]
        charts.append({
            "field": name,
            "unit": statistics.get("unit", "characters") if not name.endswith(".turns") else "turns",
            "summary": {key: summary[key] for key in ("count", "min", "max", "mean", "p50", "p90", "p99")},
            "x": edges[:-1],
            "width": edges[1] - edges[0],
            "y": histogram["counts"],
        })
    return charts


def token_template_variables(token_statistics: dict[str, Any]) -> list[tuple[str, str]] | None:
    """The template variables a token count rendered its chats with (the model's own, ``services.
    token_statistics_compute``), each as ``(name, value as JSON)``; None for counts made before they were kept."""
    variables = token_statistics.get("template_kwargs")
    if not isinstance(variables, dict):
        return None
    return [(name, json.dumps(value, ensure_ascii=False)) for name, value in sorted(variables.items())]


def token_split_note(token_statistics: dict[str, Any]) -> str | None:
    """What a token count says of conversations the model's template has an sft run train one assistant turn per
    example (``services.token_statistics_compute``'s ``split_by_turn``): that it counted them as those examples, so
    its figures are of examples, not rows; None where it split none, or for counts made before it did."""
    split = token_statistics.get("split_by_turn")
    if not isinstance(split, dict) or not split.get("rows"):
        return None
    rows, examples = split["rows"], split.get("examples", 0)
    return (f"This model's chat template renders earlier assistant turns otherwise than the latest (Qwen3's drops "
            f"their reasoning), so an sft run trains a conversation of several assistant turns one turn per example, "
            f"each with the conversation before it; counted so here: {counted(rows, 'conversation', grouped=True)} as "
            f"{'its' if rows == 1 else 'their'} {examples:,} examples. These figures count examples, not rows (with data.loss_on: all a run "
            "trains each conversation whole).")


def statistics_notes(statistics: dict[str, Any]) -> list[str]:
    """What a ready version's validation counted besides lengths, one sentence each for its page: exact duplicate
    rows, rows read in another tool's layout (ShareGPT's, Alpaca's: ``formats.read_layout``), preference rows read
    with their prompt once (UltraFeedback's layout, ``formats.read_prompt_once``),
    preference chats with no assistant turn, preference rows whose chosen is their rejected, chats of a
    shape some chat templates refuse (``formats.CHAT_SHAPES``) and sft conversations of several assistant turns,
    which some templates train one turn per example (``formats.TurnSplits``). Nothing for versions validated
    before they were counted."""
    notes = []
    if (duplicates := statistics.get("duplicates")) is not None:
        count = duplicates.get("count") or 0
        repeats = ", ".join(f"row {row} = row {first}" for row, first in duplicates.get("rows") or [])
        notes.append(f"{count:,} row{'s' if count != 1 else ''} repeat{'s' if count == 1 else ''} an earlier row "
                     f"exactly ({repeats}{', …' if count > len(duplicates.get('rows') or []) else ''})." if count
                     else "No row repeats another exactly.")
    for layout, found in (statistics.get("layouts") or {}).items():
        if (count := found.get("count")) and (note := formats.layout_note(layout, count)):
            notes.append(note)
    if count := ((statistics.get("prompt_read_once") or {}).get("count")):
        notes.append(f"{count:,} row{'s' if count != 1 else ''} repeat{'s its' if count == 1 else ' their'} prompt in "
                     "chosen and rejected (UltraFeedback's layout): read once, as TRL does.")
    for side, found in sorted(((statistics.get("no_assistant_turn") or {}).items())):
        if count := found.get("count"):
            notes.append(f"{count:,} row{'s' if count != 1 else ''} ({_rows_named(found.get('rows') or [], count)}) "
                         f"{'have' if count != 1 else 'has'} a {side} chat with no assistant turn: dpo and reward "
                         "runs learn nothing from that side (review campaigns ask for its answer).")
    if count := ((statistics.get("identical_pairs") or {}).get("count")):
        rows = statistics["identical_pairs"].get("rows") or []
        notes.append(f"{count:,} row{'s' if count != 1 else ''} ({_rows_named(rows, count)}) "
                     f"{'have' if count != 1 else 'has'} the same chosen and rejected answer: dpo and reward runs "
                     "learn nothing from them (review campaigns leave them out).")
    for shape, found in (statistics.get("chat_shapes") or {}).items():
        if (count := found.get("count")) and shape in formats.CHAT_SHAPES:
            notes.append(f"{count:,} row{'s' if count != 1 else ''} ({_rows_named(found.get('rows') or [], count)}) "
                         f"hold{'s' if count == 1 else ''} {formats.CHAT_SHAPES[shape][0]}: some models' chat "
                         "templates (Gemma's) refuse such chats, and a launch on such a model says so.")
    if count := ((statistics.get("turn_splits") or {}).get("rows")):
        splits = statistics["turn_splits"]
        growth = splits.get("split_characters", 0) / max(splits.get("characters", 0), 1)
        notes.append(f"{count:,} conversation{'s' if count != 1 else ''} {'have' if count != 1 else 'has'} several "
                     "assistant turns: a model whose chat template renders earlier turns otherwise than the latest "
                     f"(Qwen3's) trains {'each' if count != 1 else 'it'} one turn per example, making "
                     f"{splits.get('examples', 0):,} examples of {'them' if count != 1 else 'it'} and about "
                     f"{growth:.1f}× the file's characters, and a launch on such a model says so.")
    return notes


def _rows_named(rows: list[int], count: int) -> str:
    """``rows 3, 7, 9`` (``…`` after them when ``count`` is more than they are)."""
    named = ", ".join(str(row) for row in rows)
    return f"row{'s' if count > 1 else ''} {named}{', …' if count > len(rows) else ''}"


def _one_sided_warning(key: str, version: DatasetVersion, task: str) -> str | None:
    sides = (version.statistics or {}).get("no_assistant_turn") or {}
    found = [(side, sides[side]) for side in ("chosen", "rejected") if (sides.get(side) or {}).get("count")]
    if not found:
        return None
    parts = "; ".join(f"{found_side['count']:,} whose {side} side does ({_rows_named(found_side['rows'], found_side['count'])})"
                      for side, found_side in found)
    return (f"{key}: rows of {isolated(str(version))} end with no assistant turn — {parts}: {task} learns nothing "
            "from a side without the assistant's answer; add the answer to those chats, or leave the rows out (rows "
            "without one are meant as a review campaign's prompts)")


def _identical_warning(key: str, version: DatasetVersion, task: str) -> str | None:
    found = (version.statistics or {}).get("identical_pairs") or {}
    if not (count := found.get("count")):
        return None
    return (f"{key}: {count:,} row{'s' if count != 1 else ''} of {isolated(str(version))} "
            f"{'have' if count != 1 else 'has'} the same chosen and rejected answer "
            f"({_rows_named(found.get('rows') or [], count)}): {task} learns nothing from such a pair; remove "
            f"{'those rows' if count != 1 else 'that row'}, or give each the answer meant to lose as rejected")


def derivation_url(*, version: DatasetVersion, kind: str, against: DatasetVersion | None = None) -> str:
    """Where ``version``'s page offers a derivation of ``kind``, its section open (``?derive=``) and in view (its
    anchor), with ``against`` chosen for a decontamination: what a launch warning links to."""
    address = reverse("datasets:version", args=[version.dataset.project.slug, version.dataset.public_id,
                                                 version.number])
    asked = {"derive": kind, **({"against": against.public_id} if against is not None else {})}
    return f"{address}?{urlencode(asked)}#{DERIVATION_ANCHORS[kind]}"


# The version page's sections offering each derivation (templates/datasets/version.html).
DERIVATION_ANCHORS = {"dedupe": "remove-repeats", "decontaminate": "remove-shared"}


def _duplicates_warning(key: str, version: DatasetVersion) -> str | None:
    duplicates = (version.statistics or {}).get("duplicates") or {}
    count, rows = duplicates.get("count") or 0, version.row_count or 0
    if not count or count < DUPLICATE_WARNING_SHARE * rows:
        return None
    repeats = ", ".join(f"row {row} = row {first}" for row, first in duplicates.get("rows") or [])
    return ActionWarning(
        f"{key}: {isolated(str(version))} holds {counted(count, 'exact repeat', grouped=True)} of earlier rows "
        f"among its {rows:,} ({repeats}{', …' if count > len(duplicates.get('rows') or []) else ''}), so the run "
        "weights those rows over the rest; remove the repeats unless that is meant",
        url=derivation_url(version=version, kind="dedupe"), label=f"Remove the repeats of {version}")


@dataclass(frozen=True)
class _RowDigestSource:
    """A ready version's row digests: the ``.rows`` file its validation wrote, or, for a version validated
    before that file was written, its data file to work them out from. Hashable: ``_shared_rows``' cache key."""

    public_id: str
    digests_path: str
    file_path: str
    file_format: str
    kind: str
    columns: str  # the column mapping, as JSON

    @classmethod
    def of(cls, version: DatasetVersion) -> _RowDigestSource:
        return cls(public_id=version.public_id, digests_path=str(version.row_digests_path),
                   file_path=str(version.absolute_path), file_format=version.format, kind=version.dataset.kind,
                   columns=json.dumps(version.column_mapping, sort_keys=True))

    def read(self) -> np.ndarray | None:
        """Each row's ``formats.row_digest`` in file order; None when they cannot be had (the file is gone)."""
        try:
            return np.fromfile(self.digests_path, dtype=np.uint64)
        except FileNotFoundError:
            pass  # validated before digests were kept: read as validation reads it
        except (OSError, ValueError):
            return None
        mapping = formats.ColumnMapping(kind=formats.DatasetKind(self.kind), columns=json.loads(self.columns))
        try:
            examples = formats.iter_examples(self.file_path, fmt=formats.FileFormat(self.file_format), mapping=mapping)
            return np.fromiter((formats.row_digest(example) for example in examples), dtype=np.uint64)
        except (formats.DatasetFormatError, OSError, ValueError):
            return None


def version_row_digests(*, version: DatasetVersion) -> np.ndarray | None:
    """Each row of a ready version's ``formats.row_digest``, in file order (its ``.rows`` file, or worked out from its
    data file for a version validated before those were kept); None when they cannot be had (the file is gone)."""
    return _RowDigestSource.of(version).read()


@functools.lru_cache(maxsize=64)
def _shared_rows(train: _RowDigestSource, evaluation: _RowDigestSource) -> tuple[list[int], int] | None:
    """The (1-based) rows of the evaluation version also in the training one, and its row count; None when either
    has no digests. Cached by the versions' ids: a ready version's rows never change, and the launch page's live
    check asks again at each edit (a large training set's digests are a read of hundreds of megabytes, and a
    version validated before its ``.rows`` file was written is read whole once)."""
    train_rows, eval_rows = train.read(), evaluation.read()
    if train_rows is None or eval_rows is None or not len(train_rows) or not len(eval_rows):
        return None
    # Sorted, not hashed into Python sets: millions of rows are a few hundred milliseconds and 8 bytes each.
    return (np.flatnonzero(np.isin(eval_rows, train_rows)) + 1).tolist(), len(eval_rows)


def _overlap_warning(train: DatasetVersion, evaluation: DatasetVersion) -> str | None:
    shared = _shared_rows(_RowDigestSource.of(train), _RowDigestSource.of(evaluation))
    if shared is None or not shared[0]:
        return None
    rows, eval_count = shared
    return ActionWarning(
        f"data.eval: {isolated(str(evaluation))} shares {counted(len(rows), 'row', grouped=True)} of its "
        f"{eval_count:,} with data.train's {isolated(str(train))} "
        f"({_rows_named(rows[:formats.ROWS_SHOWN], len(rows))}), so evaluation scores rows the run trains on; take "
        "them out of one of the two",
        url=derivation_url(version=train, kind="decontaminate", against=evaluation),
        label=f"Remove them from {train}")


def shared_row_count(*, version: DatasetVersion, other: DatasetVersion) -> int | None:
    """How many rows of ``version`` (every copy counted) ``other`` also holds, compared as training reads them;
    None when either's rows cannot be read. The launch's overlap warning's count, from the same cache."""
    shared = _shared_rows(_RowDigestSource.of(other), _RowDigestSource.of(version))
    return None if shared is None else len(shared[0])


def launch_warnings(*, task: str, train: DatasetVersion | None, evaluation: DatasetVersion | None) -> list[str]:
    """What a run of ``task`` on ``train`` (``data.train``) and ``evaluation`` (``data.eval``) should be told of
    its data, from what validation found (``formats.validate_file``'s statistics and row digests): preference
    rows with a side that has no assistant turn or whose two sides are the same (dpo and reward learn nothing from
    either), many exact duplicates in
    the training rows, and rows the evaluation data shares with it. Versions validated before these were
    counted say nothing."""
    warnings = []
    if task in PREFERENCE_TASKS:
        for key, version in (("data.train", train), ("data.eval", evaluation)):
            if version is not None and (warning := _one_sided_warning(key, version, task)):
                warnings.append(warning)
            if version is not None and (warning := _identical_warning(key, version, task)):
                warnings.append(warning)
    if train is not None and (warning := _duplicates_warning("data.train", train)):
        warnings.append(warning)
    if train is not None and evaluation is not None and train.pk != evaluation.pk:
        if warning := _overlap_warning(train, evaluation):
            warnings.append(warning)
    return warnings


# --------------------------------------------------------------------------------------------
# Comparing two versions of a dataset: what an upload changed.
#
# Rows are compared by their ``formats.row_digest`` after each version's column mapping (two versions read from
# differently named columns hold the same rows when training would read the same examples), as multisets: a row
# version A holds three times and version B once is one unchanged and two removed. The digests are the ``.rows``
# files validation wrote (``_RowDigestSource``), compared sorted with numpy, never as Python sets (a version may
# hold tens of millions of rows); only the rows a page shows are read back from the files.

# Rows of each side (removed, added) a comparison page shows at a time.
COMPARISON_PAGE_SIZE = PREVIEW_PAGE_SIZE


@dataclass(frozen=True, kw_only=True)
class RowDifferences:
    """How the rows of version A and version B differ: ``removed``, A's row numbers (1-based, ascending) that B has
    no counterpart for; ``added``, B's that A has none for; ``unchanged``, the rows in both (counted once a pair)."""

    removed: np.ndarray
    added: np.ndarray
    unchanged: int


@dataclass(frozen=True)
class _SortedDigests:
    """One version's row digests sorted (stably: equal digests stay in file order), each row's place in the file
    (``order``) and which of its digest's rows it is in file order (``occurrence``: 0 for the first, 1, ...), and
    each distinct digest (``values``, ascending) with how many rows hold it (``counts``)."""

    order: np.ndarray
    in_order: np.ndarray
    occurrence: np.ndarray
    values: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, digests: np.ndarray) -> _SortedDigests:
        order = np.argsort(digests, kind="stable")
        in_order = digests[order]
        first_of_digest = np.ones(len(order), dtype=bool)
        first_of_digest[1:] = in_order[1:] != in_order[:-1]
        starts = np.flatnonzero(first_of_digest)
        counts = np.diff(np.append(starts, len(order)))
        occurrence = np.arange(len(order)) - np.repeat(starts, counts)
        return cls(order=order, in_order=in_order, occurrence=occurrence, values=in_order[starts], counts=counts)

    def unmatched_rows(self, other: _SortedDigests) -> np.ndarray:
        """The 1-based rows, ascending, beyond their digest's count in ``other``: of a digest ``other`` holds m
        times, the first m rows in file order are matched and any later ones are not."""
        if not len(other.values):
            return np.sort(self.order) + 1
        place = np.minimum(np.searchsorted(other.values, self.in_order), len(other.values) - 1)
        counterparts = np.where(other.values[place] == self.in_order, other.counts[place], 0)
        return np.sort(self.order[self.occurrence >= counterparts]) + 1


def row_differences(digests_a: np.ndarray, digests_b: np.ndarray) -> RowDifferences:
    """The rows version B (``digests_b``, each row's ``formats.row_digest`` in file order) added to version A
    (``digests_a``) and removed from it, as multisets: of a row A holds k times and B m times, A's rows after its
    first m of them are removed (none when k <= m) and B's after its first k are added. Each side is sorted once."""
    sorted_a, sorted_b = _SortedDigests.of(digests_a), _SortedDigests.of(digests_b)
    removed, added = sorted_a.unmatched_rows(sorted_b), sorted_b.unmatched_rows(sorted_a)
    for rows in (removed, added):
        rows.flags.writeable = False  # shared by every page that asks (``_version_differences``' cache)
    return RowDifferences(removed=removed, added=added, unchanged=len(digests_a) - len(removed))


# Few: two versions of ten million rows, all changed, hold 160 MB of row numbers.
@functools.lru_cache(maxsize=4)
def _version_differences(a: _RowDigestSource, b: _RowDigestSource) -> RowDifferences | None:
    """``row_differences`` of two ready versions, None when either's digests cannot be had. Cached as
    ``_shared_rows`` is: a ready version's rows never change, and each page of a comparison asks again."""
    digests_a, digests_b = a.read(), b.read()
    if digests_a is None or digests_b is None:
        return None
    return row_differences(digests_a, digests_b)


def ready_versions(*, dataset: Dataset) -> list[DatasetVersion]:
    """The ready versions of ``dataset``, newest first: those a comparison may name."""
    return list(version_list(dataset=dataset).filter(status=VersionStatus.READY).select_related("dataset"))


def _named_version(dataset: Dataset, field: str, text: str) -> DatasetVersion:
    """The version ``text`` (a number, as typed in ``?a=``/``?b=``) of ``dataset``, ready; Http404 when it has no
    such version, ValidationError naming ``field`` for anything else."""
    number = whole_number(text.strip().removeprefix("v"))
    if number is None:
        raise ValidationError({field: f"{isolated(text[:40])} is not a version number; give {field} as a number "
                                      f"such as {field}=1 for v1"})
    version = dataset.versions.filter(number=number).select_related("dataset").first()
    if version is None:
        gone = "it was deleted" if number <= dataset.last_version_number else \
            f"its versions go up to v{dataset.last_version_number}"
        raise Http404(f"{isolated(dataset.name)} has no version {number} ({gone}); compare two of its ready versions")
    if version.status != VersionStatus.READY:
        then = ("wait for its check to end" if not version.is_settled
                else "it keeps no rows: upload the file fixed, and compare that version")
        raise ValidationError({field: f"v{number} {version.status_phrase}: only ready versions can be compared; "
                                      f"{then}"})
    return version


def comparison_versions(*, dataset: Dataset, a: str | None, b: str | None) -> tuple[DatasetVersion, DatasetVersion]:
    """Versions A and B of ``dataset`` to compare, from ``?a=`` and ``?b=`` as sent (version numbers). Left out,
    B is the latest ready version and A the latest ready one before B. Http404 naming a number the dataset has no
    version of (never given, or deleted); ValidationError naming the field for what is not a number, a version not
    ready, the same version twice, or no ready version to take by default."""
    ready = ready_versions(dataset=dataset)
    newer = _named_version(dataset, "b", b) if b else None
    if newer is None:
        if not ready:
            raise ValidationError({"b": f"{isolated(dataset.name)} has no ready version yet: compare once two are"})
        newer = ready[0]
    older = _named_version(dataset, "a", a) if a else None
    if older is None:
        older = next((version for version in ready if version.number < newer.number), None)
        if older is None:
            raise ValidationError({"a": f"{isolated(dataset.name)} has no ready version before v{newer.number} to "
                                        "compare it with; upload another version, or choose a with b"})
    if older.pk == newer.pk:
        raise ValidationError({"b": f"a and b are both v{older.number}: choose two different versions"})
    return older, newer


def version_differences(*, a: DatasetVersion, b: DatasetVersion) -> RowDifferences:
    """How ready version B's rows differ from ready version A's (``row_differences``); ValidationError naming the
    version whose rows cannot be read (its file gone from storage)."""
    differences = _version_differences(_RowDigestSource.of(a), _RowDigestSource.of(b))
    if differences is None:
        unreadable = "a" if _RowDigestSource.of(a).read() is None else "b"
        raise ValidationError({unreadable: f"the rows of v{(a if unreadable == 'a' else b).number} cannot be read "
                                           "(its file is gone from storage); upload it again"})
    return differences


def with_previous_ready(*, versions: list[DatasetVersion]) -> list[tuple[DatasetVersion, int | None]]:
    """Each of ``versions`` with the number of the ready version before it, which the dataset page's *compare with*
    link compares it against; None for a version not ready, or with no ready version before it."""
    ready_numbers = sorted(version.number for version in versions if version.status == VersionStatus.READY)
    paired = []
    for version in versions:
        place = bisect.bisect_left(ready_numbers, version.number)
        ready_before = version.status == VersionStatus.READY and place > 0
        paired.append((version, ready_numbers[place - 1] if ready_before else None))
    return paired


def comparison_partner(*, version: DatasetVersion) -> DatasetVersion | None:
    """The version a ready version's page offers to compare it with: the latest ready one before it, else the
    first ready one after it; None when there is no other ready version."""
    others = version.dataset.versions.filter(status=VersionStatus.READY).exclude(pk=version.pk)
    return (others.filter(number__lt=version.number).order_by("-number").first()
            or others.order_by("number").first())


def rows_by_number(*, version: DatasetVersion, numbers: list[int]) -> list[tuple[int, dict[str, Any]]]:
    """The examples of a ready version's rows ``numbers`` (ascending), after its column mapping, decoding only those:
    from its search index for the rows it covers (built as a first search builds it), from the file, read up to the
    last of them and only those made examples (``formats.examples_numbered``), for the rest (rows past
    ``PREVIEW_MAX_ROW``, or a version whose index cannot hold them exactly)."""
    indexed_rows = min(version.row_count or 0, PREVIEW_MAX_ROW)
    found: dict[int, dict[str, Any]] = {}
    if in_index := [number for number in numbers if number <= indexed_rows]:
        index = search.search_index(version, rows=indexed_rows)
        if index is not None:
            offsets = index.offsets_of(in_index)
            found.update(zip(offsets, index.examples(list(offsets.values()))))
    if rest := [number for number in numbers if number not in found]:
        mapping = formats.ColumnMapping(kind=formats.DatasetKind(version.dataset.kind), columns=version.column_mapping)
        found.update(formats.examples_numbered(version.absolute_path, fmt=formats.FileFormat(version.format),
                                               mapping=mapping, numbers=rest))
    return [(number, found[number]) for number in numbers if number in found]


def difference_page(*, version: DatasetVersion, rows: np.ndarray, page: int,
                    page_size: int = COMPARISON_PAGE_SIZE) -> PreviewPage:
    """Page ``page`` (1-based, clamped to the pages there are) of ``rows`` (row numbers of ``version``: those a
    comparison found removed or added), as cells ready to render as the preview renders them."""
    page_count = max(1, -(-len(rows) // page_size))
    page = min(max(page, 1), page_count)
    numbers = [int(number) for number in rows[(page - 1) * page_size: page * page_size]]
    columns, shown = _preview_rows(formats.DatasetKind(version.dataset.kind),
                                   rows_by_number(version=version, numbers=numbers))
    return PreviewPage(columns=columns, rows=shown, page=page, page_count=page_count, rows_previewed=len(rows))


# --------------------------------------------------------------------------------------------
# Versions written from another (``services.dataset_version_split`` and ``dataset_version_derive``): where they came
# from, and what the version page offers to derive.

SPLIT_SIDE_NAMES = {"train": "training side", "held_out": "held-out side"}


def derivation_phrase(record: dict[str, Any]) -> str:
    """How a derived version's page says where it came from, from its ``derivation`` record: "Split from qa v3, seed
    0, 10% held out, stratified by task: the held-out side", "Derived from v3: 1,204 exact repeats removed",
    "Derived from v3: 57 rows shared with qa-eval v2 removed"; "" for a version that was uploaded."""
    if not record:
        return ""
    if record["kind"] == "dedupe":
        return (f"Derived from v{record['number']}: {counted(record['removed_rows'], 'exact repeat', grouped=True)} "
                "removed")
    if record["kind"] == "decontaminate":
        return (f"Derived from v{record['number']}: {counted(record['removed_rows'], 'row', grouped=True)} shared with "
                f"{record['against_name']} removed")
    size = HeldOutSize(fraction=record.get("fraction"), count=record.get("count"))
    stratified = f", stratified by {record['stratify']}" if record.get("stratify") else ""
    return (f"Split from {record['dataset_name']} v{record['number']}, seed {record['seed']}, {size.shown()} held out"
            f"{stratified}: the {SPLIT_SIDE_NAMES[record['side']]}")


@dataclass(frozen=True, kw_only=True)
class DerivationOrigin:
    """A derived version's origin as its page shows it: ``phrase`` (``derivation_phrase``), and the version it came
    from, a split's other side and the version a decontamination removed the rows of, where each still exists (None
    once deleted, or for none: the phrase still names them)."""

    phrase: str
    source: DatasetVersion | None
    partner: DatasetVersion | None
    against: DatasetVersion | None


def derivation_origin(*, version: DatasetVersion) -> DerivationOrigin | None:
    """Where ``version`` came from; None for an upload. The versions are looked up in its own project only."""
    record = version.derivation
    if not record:
        return None
    named = [record.get(key) for key in ("source", "partner", "against") if record.get(key)]
    others = {other.public_id: other for other in DatasetVersion.objects.filter(
        dataset__project_id=version.dataset.project_id, public_id__in=named).select_related("dataset")}
    return DerivationOrigin(phrase=derivation_phrase(record), source=others.get(record.get("source")),
                            partner=others.get(record.get("partner")), against=others.get(record.get("against")))


def repeats_counted(*, version: DatasetVersion) -> int | None:
    """The exact repeats a ready version's check counted (what a dedupe removes); None for a version checked before
    they were counted."""
    count = ((version.statistics or {}).get("duplicates") or {}).get("count")
    return count if isinstance(count, int) else None


def decontamination_choices(*, version: DatasetVersion) -> list[DatasetVersion]:
    """The versions a ready version's page offers to remove the shared rows of: the project's other ready versions
    of its kind (rows of another kind are never the same examples), by dataset name and newest first."""
    return list(DatasetVersion.objects.filter(dataset__project_id=version.dataset.project_id,
                                              dataset__kind=version.dataset.kind, status=VersionStatus.READY)
                .exclude(pk=version.pk).select_related("dataset").order_by("dataset__name", "-number"))


def version_columns(*, version: DatasetVersion) -> tuple[str, ...]:
    """The columns of a ready version's first row (a CSV file's header): those a split may stratify by; () where its
    file cannot be read."""
    try:
        return first_row_columns(version.absolute_path, fmt=formats.FileFormat(version.format))
    except (formats.DatasetFormatError, OSError):
        return ()
