"""Reads for the chat pages: the models a project can chat with, a user's conversations."""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from webapp.basemodels.models import BaseModel
from webapp.chat.models import Conversation
from webapp.core.bidi import isolated
from webapp.projects.models import Project
from webapp.runs.models import REWARD_TASK, Artifact, RunStatus

QUANTIZED_SUBDIR = "quantized"  # jaxengine.quantize's serving copy inside an export
_CHECKPOINT_DIR = re.compile(r"export-step-(\d+)$")


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """A model to chat with: ``ref`` as stored on a conversation, a label, and the directory served
    (a run export's quantized serving copy when it has one). ``option_label`` is the label with the
    model's or run's name bidi-isolated, for an ``<option>`` (``label`` is stored and compared, so
    it stays the plain text)."""

    ref: str
    label: str
    option_label: str
    path: str
    created: int = 0  # when the model was registered or its run finished (Unix seconds), for /v1/models

    @property
    def cache_key(self) -> str:
        return f"{self.ref}@{self.path}"


def _served_path(export_dir: str) -> str:
    quantized = Path(export_dir) / QUANTIZED_SUBDIR
    return str(quantized) if (quantized / "quantization.json").is_file() else export_dir


def _choice(*, ref: str, path: str, before: str, name: str, after: str = "", created=None) -> ModelChoice:
    return ModelChoice(ref=ref, path=path, label=f"{before}{name}{after}",
                       option_label=f"{before}{isolated(name)}{after}",
                       created=int(created.timestamp()) if created is not None else 0)


def distinct_labels(labels: dict[str, str]) -> dict[str, str]:
    """``{ref: label}`` with each label that several refs share followed by its ref (two runs of a
    project may have the same name), so that no two models read alike."""
    counts = Counter(labels.values())
    return {ref: f"{label} ({ref})" if counts[label] > 1 else label for ref, label in labels.items()}


def model_choices(*, project: Project) -> list[ModelChoice]:
    """Base models, then succeeded runs' exports, then their exported checkpoints, newest first (not a
    reward run's: its model scores text, it does not write any)."""
    choices = [_choice(ref=model.public_id, path=model.path, before="Base model: ", name=model.name,
                       created=model.created_at)
               for model in BaseModel.objects.filter(project=project).order_by("name")]
    artifacts = (Artifact.objects.select_related("run")
                 .filter(run__project=project, kind__in=["model", "checkpoint"]).exclude(run__task=REWARD_TASK)
                 .order_by("-run__created_at", "kind", "path"))
    for artifact in artifacts:
        run = artifact.run
        if artifact.kind == "model" and run.status == RunStatus.SUCCEEDED:
            choices.append(_choice(ref=run.public_id, path=_served_path(artifact.path), before="Run: ", name=run.name,
                                   created=run.finished_at or run.created_at))
        elif artifact.kind == "checkpoint" and (match := _CHECKPOINT_DIR.search(artifact.path)):
            choices.append(_choice(ref=f"{run.public_id}:step-{match.group(1)}", path=_served_path(artifact.path),
                                   before="Run: ", name=run.name, after=f", checkpoint {match.group(1)}",
                                   created=artifact.created_at))
    shown = distinct_labels({choice.ref: choice.label for choice in choices})
    return [choice if shown[choice.ref] == choice.label else
            dataclasses.replace(choice, label=shown[choice.ref], option_label=f"{choice.option_label} ({choice.ref})")
            for choice in choices]


def model_choice(*, project: Project, ref: str) -> ModelChoice | None:
    return next((choice for choice in model_choices(project=project) if choice.ref == ref), None)


def conversation_list(*, project: Project, user) -> list[Conversation]:
    return list(Conversation.objects.filter(project=project, user=user, in_arena=False)[:100])
