"""Reads for the chat pages: the models a project can chat with, a user's conversations."""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass

from django.db.models import Exists, OuterRef, QuerySet

from webapp.basemodels.models import BaseModel
from webapp.chat.models import Conversation, Message
from webapp.core.bidi import isolated
from webapp.projects.models import Project
from webapp.runs.models import REWARD_TASK, Artifact, RunStatus
from webapp.runs.serving_copies import Served, base_model_copy_dir, export_copy_dir, served_model

_CHECKPOINT_DIR = re.compile(r"export-step-(\d+)$")


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """A model to chat with: ``ref`` as stored on a conversation, a label, the directory served (its
    quantized serving copy once it has one: ``webapp.runs.serving_copies.served_model``) and that copy's
    ``quantization`` (int8, int4; "" when the model serves unquantized). ``option_label`` is the label
    with the model's or run's name bidi-isolated and the copy named, for an ``<option>`` (``label`` is
    stored on conversations and compared, so it stays the plain name, whichever copy serves)."""

    ref: str
    label: str
    option_label: str
    path: str
    quantization: str = ""
    created: int = 0  # when the model was registered or its run finished (Unix seconds), for /v1/models

    @property
    def cache_key(self) -> str:
        # The copy's scheme too: a copy made again in another scheme is written at the same path.
        return f"{self.ref}@{self.path}" + (f"#{self.quantization}" if self.quantization else "")


def _choice(*, ref: str, served: Served, before: str, name: str, after: str = "", created=None) -> ModelChoice:
    shown = f" · {served.scheme} serving copy" if served.scheme else ""
    return ModelChoice(ref=ref, path=served.path, quantization=served.scheme, label=f"{before}{name}{after}",
                       option_label=f"{before}{isolated(name)}{after}{shown}",
                       created=int(created.timestamp()) if created is not None else 0)


def distinct_labels(labels: dict[str, str]) -> dict[str, str]:
    """``{ref: label}`` with each label that several refs share followed by its ref (two runs of a
    project may have the same name), so that no two models read alike."""
    counts = Counter(labels.values())
    return {ref: f"{label} ({ref})" if counts[label] > 1 else label for ref, label in labels.items()}


def model_choices(*, project: Project) -> list[ModelChoice]:
    """Base models, then runs newest first, each run's final model (if it succeeded) before its exported
    checkpoints, latest step first (not a reward run's: its model scores text, it does not write any)."""
    choices = [_choice(ref=model.public_id, served=served_model(model.path, base_model_copy_dir(model)),
                       before="Base model: ", name=model.name, created=model.created_at)
               for model in BaseModel.objects.filter(project=project).order_by("name")]
    artifacts = (Artifact.objects.select_related("run")
                 .filter(run__project=project, kind__in=["model", "checkpoint"]).exclude(run__task=REWARD_TASK)
                 .order_by("-run__created_at", "run_id", "-kind", "-step"))  # kind "model" after "checkpoint"
    for artifact in artifacts:
        run = artifact.run
        served = served_model(artifact.path, export_copy_dir(artifact.path))
        if artifact.kind == "model" and run.status == RunStatus.SUCCEEDED:
            choices.append(_choice(ref=run.public_id, served=served, before="Run: ", name=run.name,
                                   created=run.finished_at or run.created_at))
        elif artifact.kind == "checkpoint" and (match := _CHECKPOINT_DIR.search(artifact.path)):
            choices.append(_choice(ref=f"{run.public_id}:step-{match.group(1)}", served=served,
                                   before="Run: ", name=run.name, after=f", checkpoint {match.group(1)}",
                                   created=artifact.created_at))
    shown = distinct_labels({choice.ref: choice.label for choice in choices})
    return [choice if shown[choice.ref] == choice.label else
            dataclasses.replace(choice, label=shown[choice.ref], option_label=f"{choice.option_label} ({choice.ref})")
            for choice in choices]


# A run's exported checkpoint as a spec names it (``run_…@N``, the launch form and the REST API): the chat and
# ``/v1/models`` list it as ``run_…:step-N``, and either names it.
_SPEC_CHECKPOINT = re.compile(r"(run_[0-9A-Za-z]+)@([0-9]+)")


def model_choice(*, project: Project, ref: str) -> ModelChoice | None:
    if match := _SPEC_CHECKPOINT.fullmatch(ref):
        ref = f"{match.group(1)}:step-{match.group(2)}"
    return next((choice for choice in model_choices(project=project) if choice.ref == ref), None)


def conversation_list(*, project: Project, user) -> QuerySet[Conversation]:
    """The user's chat conversations in the project, most recently active first, without those in which
    nothing was ever sent: each Start makes one (its page prepares the model while the person types), and
    a Start left without a message is not a conversation to come back to."""
    return (Conversation.objects.filter(project=project, user=user, in_arena=False)
            .filter(Exists(Message.objects.filter(conversation=OuterRef("pk")))).order_by("-updated_at", "-pk"))
