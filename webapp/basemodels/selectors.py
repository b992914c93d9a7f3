"""Reads of the base model registry for pages."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.db.models import QuerySet
from django.http import Http404

from webapp.basemodels.models import BaseModel
from webapp.core.name_case import name_key
from webapp.projects.models import Project

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


def candidate_model_dirs(*, models_root: Path) -> list[str]:
    """Directories under ``models_root`` (relative paths) that hold a config.json,
    to suggest on the register page."""
    root = models_root.resolve()
    if not root.is_dir():
        return []
    found: list[str] = []
    for depth in range(1, CANDIDATE_DEPTH + 1):
        for config in sorted(root.glob("/".join(["*"] * depth) + "/config.json")):
            found.append(str(config.parent.relative_to(root)))
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
            for path in candidate_model_dirs(models_root=models_root)]
