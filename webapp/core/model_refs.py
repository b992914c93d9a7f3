"""How people and clients name a model, and the one parser of a run's exported checkpoint's name.

A checkpoint has two spellings, both shown by the product: ``run_…@N`` (a run's checkpoint row, a spec, the
launch form, the REST API) and ``run_…:step-N`` (the chat, ``/v1/models``, a conversation's stored model). Every
place that takes a model from a person accepts both and turns it into its own spelling here."""
from __future__ import annotations

import re

_CHECKPOINT = re.compile(r"(run_[0-9A-Za-z]+)(?:@|:step-)([0-9]+)")

# What a model's label starts with, by its kind (``webapp.chat.selectors`` labels the models it offers so, and an
# evaluation keeps the label: ``Evaluation.model_name`` reads the name back from it).
BASE_MODEL_LABEL = "Base model: "
RUN_LABEL = "Run: "


def checkpoint_of(ref: object) -> tuple[str, str] | None:
    """``(run id, step)`` of a checkpoint named in either spelling, else None (a base model, a run, anything)."""
    if isinstance(ref, str) and (match := _CHECKPOINT.fullmatch(ref.strip())):
        return match.group(1), match.group(2)
    return None


def chat_ref(ref: object) -> object:
    """``ref`` as the chat and ``/v1`` spell it: a checkpoint ``run_…:step-N``; anything else unchanged."""
    if (checkpoint := checkpoint_of(ref)) is None:
        return ref
    return f"{checkpoint[0]}:step-{checkpoint[1]}"


def spec_ref(ref: object) -> object:
    """``ref`` as a spec and the launch form spell it: a checkpoint ``run_…@N``; anything else unchanged."""
    if (checkpoint := checkpoint_of(ref)) is None:
        return ref
    return f"{checkpoint[0]}@{checkpoint[1]}"
