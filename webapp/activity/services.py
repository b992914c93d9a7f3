"""Writing the activity log: ``activity_record``, called by each service that does something a person asked for,
inside that service's transaction (an action rolled back leaves no entry; a done action always has one)."""
from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from webapp.activity.models import Activity, TargetKind, Verb
from webapp.projects.models import Project

LABEL_MAX = Activity._meta.get_field("target_label").max_length


def target_facts(target: Any) -> tuple[str, str, str]:
    """``(kind, public id, label)`` of an object an entry is about: a model row of a kind the log knows, or a
    ``(kind, id, label)`` triple already (a sweep, which is no row of its own)."""
    if isinstance(target, tuple):
        return target
    describe = _DESCRIBERS.get(target._meta.label)
    if describe is None:
        raise TypeError(f"the activity log has no target kind for {target._meta.label}")
    return describe(target)


_DESCRIBERS = {
    "runs.Run": lambda run: (TargetKind.RUN, run.public_id, run.name),
    "runs.Pipeline": lambda pipeline: (TargetKind.PIPELINE, pipeline.public_id, pipeline.name),
    "datasets.Dataset": lambda dataset: (TargetKind.DATASET, dataset.public_id, dataset.name),
    "datasets.DatasetVersion": lambda version: (TargetKind.DATASET_VERSION, version.public_id,
                                                f"{version.dataset.name} v{version.number}"),
    "basemodels.BaseModel": lambda base_model: (TargetKind.BASE_MODEL, base_model.public_id, base_model.name),
    "review.Campaign": lambda campaign: (TargetKind.CAMPAIGN, campaign.public_id, campaign.name),
    "evals.Evaluation": lambda evaluation: (TargetKind.EVALUATION, evaluation.public_id, str(evaluation)),
    "chat.ProjectToken": lambda token: (TargetKind.CHAT_TOKEN, f"{token.prefix}…", token.name),
    "projects.Membership": lambda membership: (TargetKind.MEMBER, membership.user.get_username(),
                                               membership.user.get_username()),
    # Its host alone: every member reads the log, and a chat's incoming-webhook address is a secret itself.
    "webhooks.Webhook": lambda webhook: (TargetKind.WEBHOOK, webhook.public_id, webhook.host),
}


def activity_record(*, project: Project, actor: AbstractBaseUser | None, verb: Verb, target: Any = None,
                    details: dict[str, Any] | None = None) -> Activity:
    """Add an entry to ``project``'s log: ``actor`` (None: manage.py) did ``verb`` to ``target`` (a model row, see
    ``target_facts``; None: the project itself). Must run inside the action's transaction, so that the entry and
    the action commit or roll back together: outside one it raises, rather than log what may not happen."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("activity_record runs inside the transaction of the action it records")
    kind, target_id, label = target_facts(target) if target is not None else ("", "", "")
    return Activity.objects.create(
        project=project, actor=actor if actor is not None and actor.is_authenticated else None,
        actor_name=actor.get_username() if actor is not None and actor.is_authenticated else "",
        verb=verb, target_kind=kind, target_id=target_id, target_label=label[:LABEL_MAX], details=details or {})

