"""Reads of the base model registry for pages."""
from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404

from webapp.basemodels.inspection import (PROJECTS_FOLDER, ModelDirError, being_unpacked, check_registered_model_dir,
                                          hidden_from_project, project_folder)
from webapp.basemodels.models import BaseModel
from webapp.core.name_case import name_key
from webapp.core.bidi import isolated
from webapp.projects.models import Membership, Project, Role

if TYPE_CHECKING:  # the runs app's models import this app's
    from webapp.runs.models import Run

# How deep under the models root the register page looks for model directories.
CANDIDATE_DEPTH = 3
CANDIDATE_LIMIT = 50


def basemodel_list(*, project: Project) -> QuerySet[BaseModel]:
    """The project's base models, by name."""
    return BaseModel.objects.filter(project=project).select_related("registered_by").order_by("name")


def basemodel_named(*, project: Project, name: str) -> BaseModel | None:
    """The base model of ``project`` whose name is ``name`` but for letter case (``name_key``, as its unique
    constraint compares them), or None."""
    return BaseModel.objects.filter(project=project, name_key=name_key(name)).first()


def basemodel_get(*, project: Project, public_id: str) -> BaseModel:
    """The base model ``public_id`` of ``project``; 404 when it belongs elsewhere."""
    model = BaseModel.objects.filter(project=project, public_id=public_id).select_related("registered_by").first()
    if model is None:
        raise Http404("no such base model in this project")
    return model


def demo_dir() -> Path:
    """Where ``manage.py temper_setup`` builds the demo (``jaxengine demo-base --out $TEMPER_MODELS_ROOT/demo``:
    ``model/`` and ``data/``)."""
    return Path(settings.MODELS_ROOT) / "demo"


def demo_model_dir() -> Path:
    """The demo model's directory (``demo_dir``'s ``model``), resolved as registration resolves a model's path."""
    return (demo_dir() / "model").resolve()


def demo_model(*, project: Project, public_id: str | None = None) -> BaseModel | None:
    """The project's base model registered from the demo model's directory (``public_id``: only if it is that one),
    or None. The launch form starts it from its own preset (``webapp.runs.presets.DEMO_PRESET``)."""
    models = BaseModel.objects.filter(project=project, path=str(demo_model_dir()))
    if public_id is not None:
        models = models.filter(public_id=public_id)
    return models.order_by("pk").first()


# (path, project slug) -> (monotonic time judged, refusal): load_refusal's answers for pages listing every model.
_refusals: dict[tuple[str, str], tuple[float, str]] = {}


def load_refusal(*, path: str, project_slug: str, listing: bool = False) -> str:
    """Why the model directory ``path``, registered in project ``project_slug``, may not be loaded for it (registration's
    words, ``inspection.check_registered_model_dir``: it now lies in another project's folder), or "". Every load of
    a base model in the web asks this before it reads the directory or sends it to a worker. ``listing``: for a page
    that lists every model of the project (the chat list, the arena, ``/v1/models``), judged again once the answer
    kept is ``TEMPER_MODEL_FILES_RECHECK_SECONDS`` old, as those pages' file stamps are (``webapp.core.file_stamps``);
    a turn sent, a launch and the workers judge the directory as it is."""
    key = (path, project_slug)
    now = time.monotonic()
    if listing and (kept := _refusals.get(key)) is not None and now - kept[0] < settings.TEMPER_MODEL_FILES_RECHECK_SECONDS:
        return kept[1]
    try:
        check_registered_model_dir(path, models_root=settings.MODELS_ROOT, project_slug=project_slug)
    except ModelDirError as error:
        refusal = str(error)
    else:
        refusal = ""
    _refusals[key] = (now, refusal)
    return refusal


# path -> (monotonic time judged, gone): model_dir_gone's answers for pages listing every model.
_gone: dict[str, tuple[float, bool]] = {}


def model_dir_gone(path: str, *, listing: bool = False) -> bool:
    """Whether the model directory ``path`` (a base model's, a run's export) that a run would load was deleted from
    disk since it was recorded. Judged only where Temper keeps models: under the models root (registration allows
    nothing else) or the data root (runs export under it); a path recorded elsewhere, before those rules, is left to
    the load that reads it. Asked before a launch, a resume or a retry is queued: queued, the run failed in the train
    worker, naming the missing path. ``listing``: for a page that lists every model of the project (the chat list, the
    arena, ``/v1/models``), the answer kept for ``TEMPER_MODEL_FILES_RECHECK_SECONDS``, as ``load_refusal``'s. A run's
    own folder, which a resume reads its checkpoints from, is judged by the same rule
    (``runs.services.lost_checkpoints_refusal``)."""
    model_dir = Path(path)
    if not model_dir.is_absolute():
        return False
    roots = _model_roots(str(settings.MODELS_ROOT), str(settings.DATA_ROOT))
    if not any(model_dir.is_relative_to(root) for root in roots):
        return False
    now = time.monotonic()
    kept = _gone.get(path) if listing else None
    if kept is not None and now - kept[0] < settings.TEMPER_MODEL_FILES_RECHECK_SECONDS:
        return kept[1]
    gone = not model_dir.is_dir()
    _gone[path] = (now, gone)
    return gone


@functools.lru_cache(maxsize=8)
def _model_roots(models_root: str, data_root: str) -> frozenset[Path]:
    # Resolved once per setting, not per model: the listing pages ask model_dir_gone of every model on each load.
    roots = {Path(models_root), Path(data_root)}
    return frozenset(roots | {root.resolve() for root in roots})


# How a list of models (the launch form's, the chat's pickers) marks one whose folder ``model_dir_gone`` finds deleted.
FOLDER_GONE = "its folder is gone"

# What to do about a base model whose folder was deleted: its row keeps the path, so files put back there serve again.
REGISTER_AGAIN = ("put the model's files back in that folder (its page under Base models shows where), or register "
                  "it again")


def gone_model_words(*, run: str = "", step: int | str | None = None, base_model: str = "") -> str:
    """How a refusal names a model whose directory ``model_dir_gone`` finds deleted, as the project names it: the
    export of ``run`` (its name and id, ``named_model``), or its exported checkpoint ``step``; else the base model
    ``base_model`` (likewise named); else the model a run starts from. What to do is the caller's to add."""
    if run:
        if step is not None:
            return (f"checkpoint {step} of run {run}, exported as a starting model, is gone from disk: its folder "
                    "was deleted since")
        return f"the model run {run} exported is gone from disk: its export folder was deleted since"
    if base_model:
        return f"base model {base_model} is gone from disk: its folder was deleted since it was registered"
    return "the model it starts from is gone from disk: its folder was deleted since"


def named_model(name: str, public_id: str) -> str:
    """A run or a base model as a refusal names it: its name, bidi-isolated, then its id."""
    return f"{isolated(name)} ({public_id})"


def base_model_refusal(*, base_model: BaseModel) -> str:
    """``load_refusal`` of ``base_model``'s directory, for its project."""
    return load_refusal(path=base_model.path, project_slug=base_model.project.slug)


def base_model_licence(*, base_model: BaseModel) -> dict:
    """The licence facts of ``base_model``'s folder as the engine reads them for its exports' cards
    (``jaxengine.licence.read_licence``: README.md's front matter and the licence files' names and sizes, no
    weights), with ``built_with_llama`` where its licence asks a derivative to say so, and ``stated`` whether the
    folder states any licence at all. Ask it of a folder ``base_model_refusal`` lets the project read."""
    from jaxengine.licence import LICENCE_FILE_MAX_BYTES, is_llama_licence, read_licence, states_a_licence

    licence = read_licence(base_model.path)
    return {**licence, "built_with_llama": is_llama_licence(licence), "stated": states_a_licence(licence),
            "copy_limit_bytes": LICENCE_FILE_MAX_BYTES}


def may_unregister_base_model(*, membership: Membership, base_model: BaseModel) -> bool:
    """An owner may unregister any base model; a member one they registered; a viewer none."""
    return membership.can(Role.OWNER) or (
        membership.can(Role.MEMBER) and base_model.registered_by_id == membership.user_id)


def ensure_may_unregister_base_model(*, membership: Membership, base_model: BaseModel) -> None:
    """``PermissionDenied`` saying who may, unless ``membership`` may unregister ``base_model`` (pages and API)."""
    if not may_unregister_base_model(membership=membership, base_model=base_model):
        raise PermissionDenied("only an owner, or the member who registered it, may unregister a base model")


def may_delete_base_model_files(*, membership: Membership, base_model: BaseModel) -> bool:
    """Whether ``membership`` may delete ``base_model``'s folder with its registration: an owner's act (it removes
    files under the models root, as only an owner's upload writes them), for a model Temper unpacked itself."""
    return base_model.uploaded and membership.can(Role.OWNER)


def ensure_may_delete_base_model_files(*, membership: Membership) -> None:
    """``PermissionDenied`` saying who may, unless ``membership`` is an owner's (pages and API)."""
    if not membership.can(Role.OWNER):
        raise PermissionDenied("only an owner may delete an uploaded model's files (they are under the models root); "
                               "unregister it without them, or ask an owner")


def base_model_readers(*, base_model: BaseModel) -> list[str]:
    """What still needs ``base_model`` (the work unregistering it would break), one sentence each: runs
    queued or training from it, runs stopped short that may still be resumed or retried from it
    (``stopped_runs_needing``), running pipelines whose stages name it, its serving copy being written,
    review campaigns generating answers with it (or cancelled, while the serve worker still answers with it),
    evaluations of it queued or running, chat and arena answers being written with it."""
    # Imported here: these apps' models import this one's.
    from webapp.chat.selectors import answers_being_written
    from webapp.evals.selectors import model_evaluation_readers
    from webapp.review.selectors import generation_readers
    from webapp.runs.models import ACTIVE_STATUSES, Pipeline, PipelineStatus, Run, ServingCopyStatus

    readers = []
    for run in Run.objects.filter(base_model=base_model, status__in=ACTIVE_STATUSES).order_by("created_at"):
        readers.append(f"run {isolated(run.name)} ({run.public_id}) is {run.status} from it; cancel it or wait for it "
                       "to finish")
    if stopped := stopped_runs_needing(base_model=base_model):
        readers.append(stopped_runs_sentence(stopped))
    for pipeline in Pipeline.objects.filter(project=base_model.project_id, status=PipelineStatus.RUNNING):
        if base_model.public_id in json.dumps(pipeline.stages):
            readers.append(f"pipeline {isolated(pipeline.name)} is running, and its stages name it; cancel it or wait "
                           "for it to finish")
    if base_model.serving_copies.filter(status=ServingCopyStatus.WRITING).exists():
        readers.append("a serving copy of it is being written; wait until it is ready")
    readers.extend(generation_readers(project_id=base_model.project_id, model_id=base_model.public_id, model="it"))
    readers.extend(model_evaluation_readers(project_id=base_model.project_id, model_id=base_model.public_id,
                                            model="it"))
    readers.extend(answers_being_written(project_id=base_model.project_id, ref=base_model.public_id))
    return readers


def stopped_runs_needing(*, base_model: BaseModel) -> list[Run]:
    """The runs started from ``base_model`` itself (not from a run trained on it, whose export a resume or a retry
    reads instead) that stopped short and may still go on (``runs.services.may_still_go_on``), oldest first. A
    resume reads the model's folder, a retry launches its ``bm_`` id: unregistered, the retry is refused; with its
    folder deleted, the resume too (once queued, it failed in the train worker on the missing folder)."""
    from webapp.runs.models import Run
    from webapp.runs.services import STOPPED_SHORT, may_still_go_on  # runs.services imports this module

    stopped = Run.objects.filter(base_model=base_model, status__in=STOPPED_SHORT).order_by("created_at")
    return [run for run in stopped if not run.started_from_a_run and may_still_go_on(run)]


# How many runs a refusal names before it counts the rest.
RUNS_NAMED = 3


def stopped_runs_sentence(runs: list[Run]) -> str:
    """Why ``runs`` (``stopped_runs_needing``) keep their base model registered, and what to do. An archived run is
    only hidden from the table, and may still be resumed (which brings it back), so archiving them frees nothing."""
    shown = ", ".join(named_model(run.name, run.public_id) for run in runs[:RUNS_NAMED])
    more = f" and {len(runs) - RUNS_NAMED} more" if len(runs) > RUNS_NAMED else ""
    which = f"run {shown} stopped" if len(runs) == 1 else f"runs {shown}{more} stopped"
    them = "it" if len(runs) == 1 else "them"
    return (f"{which} short (cancelled or failed) and may still be resumed or retried from it; delete {them} first "
            "(archived, a run may still be resumed), or keep the model")


def candidate_model_dirs(*, models_root: Path, project_slug: str) -> list[str]:
    """Directories that project ``project_slug`` may register (relative paths under ``models_root``) that hold a
    config.json, to suggest on the register page: its own folder's (``projects/<slug>/``) first, then those every
    project sees; none in another project's folder. One reached through a link out of the root, or into another
    project's folder, is left out: registering it is refused, and listing it would tell what lies where the link
    points."""
    root = models_root.resolve()
    if not root.is_dir():
        return []
    own = project_folder(models_root=root, project_slug=project_slug)
    found: list[str] = []
    for base in (own, root):
        for depth in range(0 if base == own else 1, CANDIDATE_DEPTH + 1):
            for config in sorted(base.glob("/".join(["*"] * depth + ["config.json"]))):
                relative = config.parent.relative_to(root)
                if base == root and relative.parts[0] == PROJECTS_FOLDER:
                    continue  # the project folders, its own listed above
                if being_unpacked(relative):
                    continue
                if (not config.parent.resolve().is_relative_to(root)
                        or hidden_from_project(config.parent, root=root, project_slug=project_slug)):
                    continue
                found.append(str(relative))
                if len(found) >= CANDIDATE_LIMIT:
                    return found
    return found


@dataclass(frozen=True)
class Candidate:
    path: str  # relative to the models root
    registered_as: str | None  # the project's base model of that directory, if there is one


def register_candidates(*, project: Project, models_root: Path) -> list[Candidate]:
    """``candidate_model_dirs`` with the name each already has in ``project`` (registering it again is refused)."""
    root = models_root.resolve()
    registered = dict(BaseModel.objects.filter(project=project).values_list("path", "name"))
    return [Candidate(path=path, registered_as=registered.get(str((root / path).resolve())))
            for path in candidate_model_dirs(models_root=models_root, project_slug=project.slug)]
