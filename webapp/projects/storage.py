"""What a project's files take on disk: the Storage page and ``GET /api/v1/projects/<slug>/storage/``.

Design note. Every figure is measured on disk when asked (``webapp.core.disk_usage.folder_usage``: what ``du``
reports), not taken from the sizes rows recorded, which miss what a run writes after them (logs, samples, the
checkpoints a resume rotates) and the serving copies. One walk per folder: a run's directory is walked once and its
top-level entries sorted into checkpoints, exports (with the serving copies inside them) and the rest
(``run_parts``). A walk of every file on each load cost 190-300 ms for 300 runs of 5 checkpoints of 8 files on the
2-core bench host, growing with the files (orbax writes tens a checkpoint) and the runs (600 ms at 1,000)
(bench/storage_page.py, bench/RESULTS.md), so the folders the engine writes whole and renames into place, a
checkpoint's step and an export (``written_whole``), keep their sums under their stamps: a load lists each run's
folder, its checkpoints folder and the rest (logs, metrics, samples, growing as the run trains), and a stamp of
each checkpoint and export. A folder's modification time alone would not do: a file written deep in a run's tree
leaves it unchanged. One ``seen`` set for the whole project, so that a file hard-linked into two of its folders
counts once in its total, with the older run (runs are walked oldest first) or the first folder walked.

A base model is the project's disk when Temper wrote it (uploaded) or it lies under the data directory; one
registered by reference to a folder outside it (a shared models mount as ``TEMPER_MODELS_ROOT``) is listed, its size
shown, as outside Temper's data directory and left out of the total. Its serving copy is always Temper's
(``DATA_ROOT/serving-copies/<bm_…>/``).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from webapp.basemodels.models import BaseModel
from webapp.core.disk_free import DiskSpace, data_filesystems
from webapp.core.disk_usage import FolderUsage, folder_usage
from webapp.datasets.models import Dataset
from webapp.datasets.services import dataset_folder
from webapp.projects.models import Project
from webapp.runs.models import ACTIVE_STATUSES, Run
from webapp.runs.selectors import (CheckpointPrunePlan, checkpoint_prune_plan, checkpoints_in_use,
                                   ranking_evaluations)
from webapp.runs.serving_copies import base_model_copy_dir
from webapp.runs.services import CHECKPOINTS_DIRECTORY, EXTERNAL_TASK, checkpoint_steps_in, run_output_dir

EXPORT_DIRECTORY = "export"  # a run's final model
EXPORT_STEP_PREFIX = "export-step-"  # an exported checkpoint's: export-step-<N>
GONE = "gone"  # a folder that was written and is no longer on disk
NONE_YET = "none"  # a run that never wrote one: queued and not started, or trained elsewhere (external)


@dataclass(frozen=True, kw_only=True)
class RunStorage:
    run: Run
    checkpoints: int
    checkpoint_bytes: int
    export_bytes: int  # exported models and checkpoints, with their serving copies
    other_bytes: int  # logs, metrics, samples, spec: the rest of the run directory
    folder: str = ""  # "", GONE or NONE_YET
    # What pruning its checkpoints would delete and free now (runs.selectors.checkpoint_prune_plan); 0 while active.
    prunable_checkpoints: int = 0
    prunable_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.checkpoint_bytes + self.export_bytes + self.other_bytes

    @property
    def prune_skipped(self) -> bool:
        """Active with checkpoints that pruning would otherwise weigh: the project-wide prune leaves it."""
        return self.run.is_active and self.checkpoints > 1


@dataclass(frozen=True, kw_only=True)
class DatasetStorage:
    dataset: Dataset
    versions: int
    bytes: int  # every version's file with its digests and search index
    folder: str = ""


@dataclass(frozen=True, kw_only=True)
class BaseModelStorage:
    base_model: BaseModel
    bytes: int
    serving_copy_bytes: int
    outside: bool  # registered by reference to a folder outside the data directory: not in the total
    folder: str = ""

    @property
    def counted_bytes(self) -> int:
        return self.serving_copy_bytes + (0 if self.outside else self.bytes)


@dataclass(frozen=True, kw_only=True)
class ProjectStorage:
    runs: list[RunStorage]  # largest first
    datasets: list[DatasetStorage]
    base_models: list[BaseModelStorage]
    measured_at: datetime
    # The free and total space of the data directory's filesystem, then the models root's where it is another one.
    filesystems: list[DiskSpace]

    @property
    def checkpoint_bytes(self) -> int:
        return sum(run.checkpoint_bytes for run in self.runs)

    @property
    def export_bytes(self) -> int:
        return sum(run.export_bytes for run in self.runs)

    @property
    def run_other_bytes(self) -> int:
        return sum(run.other_bytes for run in self.runs)

    @property
    def run_bytes(self) -> int:
        return sum(run.total_bytes for run in self.runs)

    @property
    def dataset_bytes(self) -> int:
        return sum(dataset.bytes for dataset in self.datasets)

    @property
    def base_model_bytes(self) -> int:
        """The base models' folders Temper keeps and every serving copy of one."""
        return sum(model.counted_bytes for model in self.base_models)

    @property
    def outside_bytes(self) -> int:
        return sum(model.bytes for model in self.base_models if model.outside)

    @property
    def total_bytes(self) -> int:
        return self.run_bytes + self.dataset_bytes + self.base_model_bytes

    @property
    def prunable_runs(self) -> list[RunStorage]:
        return [run for run in self.runs if run.prunable_checkpoints]

    @property
    def prunable_checkpoints(self) -> int:
        return sum(run.prunable_checkpoints for run in self.runs)

    @property
    def prunable_bytes(self) -> int:
        return sum(run.prunable_bytes for run in self.runs)

    @property
    def prune_skipped_runs(self) -> list[RunStorage]:
        return [run for run in self.runs if run.prune_skipped]

    # The words each table shows in place of a size (GONE, NONE_YET): its legend explains those it uses.
    @property
    def run_folder_words(self) -> set[str]:
        return {run.folder for run in self.runs} - {""}

    @property
    def dataset_folder_words(self) -> set[str]:
        return {dataset.folder for dataset in self.datasets} - {""}

    @property
    def base_model_folder_words(self) -> set[str]:
        return {model.folder for model in self.base_models} - {""}


def project_storage(*, project: Project) -> ProjectStorage:
    """Every run, dataset and base model of ``project`` with the disk its folders take now, largest first."""
    seen: set[tuple[int, int]] = set()
    # spec and resolved_spec: a prune plan reads the run's ranking metric.
    project_runs = list(Run.objects.filter(project=project).only(
        "public_id", "name", "status", "task", "archived", "started_at", "cancel_requested", "project_id", "spec",
        "resolved_spec").order_by("created_at", "pk"))
    # What a prune plan reads of each run, read for them all at once: hundreds of runs made the page 10x slower.
    prunable = [run for run in project_runs if not run.is_active]
    in_use, evaluations = checkpoints_in_use(runs=prunable), ranking_evaluations(runs=prunable)
    runs = sorted((_run_storage(run, seen, in_use.get(run.pk, set()), evaluations.get(run.pk, []))
                   for run in project_runs),
                  key=lambda row: (-row.total_bytes, row.run.name, row.run.public_id))
    datasets = sorted((_dataset_storage(dataset, seen) for dataset in
                       Dataset.objects.filter(project=project).annotate(version_count=Count("versions"))),
                      key=lambda row: (-row.bytes, row.dataset.name))
    base_models = sorted(_base_model_storage_list(BaseModel.objects.filter(project=project).order_by("created_at", "pk"), seen),
                         key=lambda row: (-row.counted_bytes, -row.bytes, row.base_model.name))
    return ProjectStorage(runs=runs, datasets=datasets, base_models=base_models, measured_at=timezone.now(),
                          filesystems=data_filesystems())


def prune_skipped_runs(*, project: Project) -> list[Run]:
    """The runs of ``project`` a project-wide prune skips: active, with checkpoints it would otherwise weigh
    (``RunStorage.prune_skipped``), oldest first."""
    active = Run.objects.filter(project=project, status__in=ACTIVE_STATUSES).order_by("created_at", "pk")
    return [run for run in active if len(checkpoint_steps_in(run_output_dir(run.public_id))) > 1]


def run_parts(children: dict[str, int]) -> tuple[int, int, int]:
    """A run directory's top-level entries (name: bytes) as (checkpoints, exports, the rest). An export being
    written or replaced is a hidden sibling of its place (``.export.replaced-…``, ``jaxengine.checkpoint.hf
    .replace_directory``), counted with the exports."""
    checkpoints = exports = other = 0
    for name, size in children.items():
        if name == CHECKPOINTS_DIRECTORY:
            checkpoints += size
        elif is_export_name(name.lstrip(".").split(".", 1)[0]):
            exports += size
        else:
            other += size
    return checkpoints, exports, other


def is_export_name(name: str) -> bool:
    return name == EXPORT_DIRECTORY or (name.startswith(EXPORT_STEP_PREFIX) and name[len(EXPORT_STEP_PREFIX):].isdigit())


def written_whole(run_directory: str) -> Callable[[str], bool]:
    """The folders of ``run_directory`` the engine writes beside their place and renames in when whole, never
    changing them inside after: a checkpoint's step (orbax renames ``<step>.orbax-checkpoint-tmp-…``) and an export
    (``jaxengine.job.export_trained``; its serving copy is renamed into it, changing its entries). Their sums are
    kept under their stamps (``folder_usage``'s ``sealed``)."""
    checkpoints = os.path.join(run_directory, CHECKPOINTS_DIRECTORY)

    def sealed(path: str) -> bool:
        parent, name = os.path.split(path)
        return (parent == checkpoints and name.isdigit()) or (parent == run_directory and is_export_name(name))

    return sealed


def _run_storage(run: Run, seen: set[tuple[int, int]], in_use: set[int],
                 evaluations: list[tuple[int, float]]) -> RunStorage:
    directory = run_output_dir(run.public_id)
    usage = folder_usage(directory, seen=seen, sealed=written_whole(str(directory)))
    checkpoints, exports, other = run_parts(usage.children)
    own_entry = usage.bytes - sum(usage.children.values())  # the directory's own blocks
    never_written = run.task == EXTERNAL_TASK or run.started_at is None
    steps = checkpoint_steps_in(directory)
    prune = _prune_plan(run, directory, in_use, evaluations) if len(steps) > 1 and not run.is_active else None
    return RunStorage(run=run, checkpoints=len(steps), checkpoint_bytes=checkpoints,
                      export_bytes=exports, other_bytes=other + own_entry,
                      folder=_folder_word(usage, never_written=never_written),
                      prunable_checkpoints=len(prune.deleted) if prune else 0,
                      prunable_bytes=prune.bytes_freed if prune else 0)


def _prune_plan(run: Run, directory: Path, in_use: set[int],
                evaluations: list[tuple[int, float]]) -> CheckpointPrunePlan:
    # The step folders' sums were just kept under their stamps by the run's walk: read again, not walked again.
    steps = folder_usage(directory / CHECKPOINTS_DIRECTORY, sealed=written_whole(str(directory))).children
    return checkpoint_prune_plan(run=run, sizes={int(name): size for name, size in steps.items() if name.isdigit()},
                                 in_use=in_use, evaluations=evaluations)


def _dataset_storage(dataset: Dataset, seen: set[tuple[int, int]]) -> DatasetStorage:
    usage = folder_usage(dataset_folder(dataset.public_id), seen=seen)
    return DatasetStorage(dataset=dataset, versions=dataset.version_count, bytes=usage.bytes,
                          folder=_folder_word(usage, never_written=dataset.version_count == 0))


def _base_model_storage_list(models, seen: set[tuple[int, int]]) -> list[BaseModelStorage]:
    rows = []
    for model in models:  # a path is registered once in a project (unique): no folder is measured twice
        outside = not model.uploaded and not inside_data_directory(model.path)
        # A folder outside keeps its own links to itself: its files are not the project's disk to count once.
        usage = folder_usage(model.path, seen=set() if outside else seen)
        copy = folder_usage(base_model_copy_dir(model), seen=seen)
        rows.append(BaseModelStorage(base_model=model, bytes=usage.bytes, serving_copy_bytes=copy.bytes,
                                     outside=outside, folder=GONE if usage.gone else ""))
    return rows


def inside_data_directory(path: str | Path) -> bool:
    """Whether ``path`` (a registered model's folder, resolved at registration) lies under ``DATA_ROOT``."""
    return Path(path).is_relative_to(Path(settings.DATA_ROOT).resolve())


def _folder_word(usage: FolderUsage, *, never_written: bool) -> str:
    if not usage.gone:
        return ""
    return NONE_YET if never_written else GONE
