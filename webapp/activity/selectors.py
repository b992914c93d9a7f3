"""Reading the activity log: a project's entries newest first, filtered by person, by what was done and by kind of
object, a page at a time (``webapp.core.keyset``), and where each entry's target is now (its page, or gone)."""
from __future__ import annotations

import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Model, Q, QuerySet
from django.template.defaultfilters import filesizeformat
from django.urls import reverse

from webapp.activity.models import Activity, TargetKind, Verb
from webapp.basemodels.models import BaseModel
from webapp.chat.models import ProjectToken
from webapp.core.keyset import KeysetPage, keyset_page
from webapp.datasets.models import Dataset, DatasetVersion
from webapp.evals.models import Evaluation
from webapp.projects.models import Membership, Project, Role, role_at_least
from webapp.review.models import Campaign
from webapp.runs.models import Pipeline, Run, RunTag
from webapp.webhooks.models import Webhook

FILTER_QUERY = ("actor", "action", "kind")
# What was done, in the words the log reads with ("deleted"), each once: one word names the verbs of every kind of
# object ("deleted" a run, a dataset, ...), which the kind filter tells apart.
ACTIONS = tuple(dict.fromkeys(Verb.labels))


def verbs_of(action: str) -> list[str]:
    """The verbs an ``ACTIONS`` word stands for: ``deleted`` -> ``run.deleted``, ``dataset.deleted``, ..."""
    return [verb for verb, label in Verb.choices if label == action]


@dataclass(frozen=True, kw_only=True)
class ActivityFilters:
    """Entries of one person (``actor``: a username, as the entry snapshot it), of one thing done (``action``, a word
    of ``ACTIONS``) and of one kind of object."""

    actor: str = ""
    action: str = ""
    kind: str = ""

    @classmethod
    def from_query(cls, query: Any) -> ActivityFilters:
        """The filters of a page's or the API's query; a ``ValidationError`` naming ``kind`` and ``action`` for a kind
        or an action the log has no entries of, which would read as "nobody did anything" (both at once: fixed one by
        one, the second would come as a surprise)."""
        kind, action = query.get("kind", "").strip(), query.get("action", "").strip()
        problems = {}
        if kind and kind not in TargetKind.values:
            problems["kind"] = (f"{kind!r} is not a kind of object the activity log names; use one of "
                                f"{', '.join(TargetKind.values)}, or leave it out for all")
        if action and action not in ACTIONS:
            problems["action"] = (f"{action!r} is not something the activity log records; use one of "
                                  f"{', '.join(ACTIONS)}, or leave it out for all")
        if problems:
            raise ValidationError(problems)
        return cls(actor=query.get("actor", "").strip(), action=action, kind=kind)


def actor_display(entry: Activity) -> str:
    """Who did it, as the log shows them: their name when they acted; ``deleted account <name>`` once the account
    is gone; ``manage.py`` for an action with no account."""
    if entry.actor_id is not None:
        return entry.actor_name
    return f"deleted account {entry.actor_name}" if entry.actor_name else "manage.py"


def activity_list(*, project: Project, filters: ActivityFilters) -> QuerySet[Activity]:
    entries = Activity.objects.filter(project=project)
    if filters.actor:
        entries = entries.filter(actor_name=filters.actor)
    if filters.action:
        entries = entries.filter(verb__in=verbs_of(filters.action))
    if filters.kind:
        entries = entries.filter(target_kind=filters.kind)
    return entries.order_by("-created_at", "-id")


def _newest_of_each_verb(entries: QuerySet[Activity], verbs: list[str], count: int) -> list[Activity]:
    """The newest ``count`` of ``entries`` (ordered newest first) whose verb is one of ``verbs``: the newest
    ``count`` of each verb, read from the (project, verb, newest) index, or with a kind the (project, kind, verb,
    newest) one, merged. One ``verb IN (…)`` query is read by SQLite along the project's whole log, or that kind's,
    newest first (that order spares it a sort), until it finds ``count``: a rare action ("deleted", 0.1% of a log)
    read 100,000 entries for 50 (bench/RESULTS.md). A verb of another kind than the one asked (a dataset's deletion
    among runs) finds nothing in the index at once."""
    found = [entry for verb in verbs for entry in entries.filter(verb=verb)[:count]]
    return sorted(found, key=lambda entry: (entry.created_at, entry.pk), reverse=True)[:count]


def activity_page(*, project: Project, filters: ActivityFilters, after: tuple[str, int] | None,
                  limit: int) -> KeysetPage[Activity]:
    """The ``limit`` entries of ``activity_list`` (newest first) after the one whose (time as ISO text, id) is
    ``after``."""
    entries = activity_list(project=project, filters=replace(filters, action=""))
    if after is not None:
        created_at, last_id = after
        entries = entries.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=last_id))
    if filters.action:
        entries = _newest_of_each_verb(entries, verbs_of(filters.action), limit + 1)
    return keyset_page(entries, limit=limit, key=lambda entry: (entry.created_at.isoformat(), entry.pk))


def activity_actors(*, project: Project) -> list[str]:
    """The names the project's log has entries of, for the person filter."""
    return list(Activity.objects.filter(project=project).exclude(actor_name="").order_by("actor_name")
                .values_list("actor_name", flat=True).distinct())


@dataclass(frozen=True)
class TargetNow:
    """Where an entry's target is now: ``exists`` (False: deleted since) and its page's ``address`` when it has
    one (a project token has none but its owner's chat page)."""

    exists: bool
    address: str | None


def targets_now(*, project: Project, entries: Iterable[Activity], role: str) -> dict[tuple[str, str], TargetNow]:
    """``TargetNow`` of each (kind, id) the ``entries`` name, with one query per kind, as a member of ``role`` sees
    it: a target whose page needs a higher role than theirs shows without its address."""
    ids: dict[str, set[str]] = defaultdict(set)
    for entry in entries:
        if entry.target_kind:
            ids[entry.target_kind].add(entry.target_id)
    found: dict[tuple[str, str], TargetNow] = {}
    for kind, kind_ids in ids.items():
        addresses = _ADDRESSES[kind](project, kind_ids)
        if not role_at_least(role, _PAGE_ROLES.get(kind, Role.VIEWER)):
            addresses = dict.fromkeys(addresses)
        for target_id in kind_ids:
            found[(kind, target_id)] = (TargetNow(exists=True, address=addresses[target_id])
                                        if target_id in addresses else TargetNow(exists=False, address=None))
    return found


def _by_public_id(model: type[Model], url_name: str) -> Callable[[Project, set[str]], dict[str, str | None]]:
    def addresses(project: Project, ids: set[str]) -> dict[str, str | None]:
        return {public_id: reverse(url_name, args=[project.slug, public_id])
                for public_id in model.objects.filter(project=project, public_id__in=ids)
                .values_list("public_id", flat=True)}
    return addresses


def _versions(project: Project, ids: set[str]) -> dict[str, str | None]:
    rows = (DatasetVersion.objects.filter(dataset__project=project, public_id__in=ids)
            .values_list("public_id", "dataset__public_id", "number"))
    return {public_id: reverse("datasets:version", args=[project.slug, dataset_id, number])
            for public_id, dataset_id, number in rows}


def _sweeps(project: Project, tags: set[str]) -> dict[str, str | None]:
    present = set(RunTag.objects.filter(project=project, tag__in=tags)
                  .values_list("tag", flat=True))
    runs = reverse("runs:list", args=[project.slug])
    return {tag: f"{runs}?{urllib.parse.urlencode({'tag': tag})}" for tag in present}


def _members(project: Project, names: set[str]) -> dict[str, str | None]:
    members = reverse("projects:members", args=[project.slug])
    return {name: members for name in Membership.objects.filter(
        project=project, user__username__in=names).values_list("user__username", flat=True)}


def _chat_tokens(project: Project, shown: set[str]) -> dict[str, str | None]:
    prefixes = {text.rstrip("…") for text in shown}
    return {f"{prefix}…": None for prefix in ProjectToken.objects.filter(
        project=project, prefix__in=prefixes).values_list("prefix", flat=True)}


_ADDRESSES: dict[str, Callable[[Project, set[str]], dict[str, str | None]]] = {
    TargetKind.RUN: _by_public_id(Run, "runs:detail"),
    TargetKind.PIPELINE: _by_public_id(Pipeline, "runs:pipeline"),
    TargetKind.DATASET: _by_public_id(Dataset, "datasets:detail"),
    TargetKind.BASE_MODEL: _by_public_id(BaseModel, "basemodels:detail"),
    TargetKind.CAMPAIGN: _by_public_id(Campaign, "review:detail"),
    TargetKind.EVALUATION: _by_public_id(Evaluation, "evals:detail"),
    TargetKind.DATASET_VERSION: _versions,
    TargetKind.SWEEP: _sweeps,
    TargetKind.MEMBER: _members,
    TargetKind.CHAT_TOKEN: _chat_tokens,
    TargetKind.WEBHOOK: _by_public_id(Webhook, "webhooks:edit"),
}
# The kinds whose pages only some roles may open (the others' are every member's).
_PAGE_ROLES = {TargetKind.WEBHOOK: Role.OWNER}


@dataclass(frozen=True)
class ActivityRow:
    """An entry as the page and the API show it: who did it, where its target is now, and its details in words."""

    entry: Activity
    actor: str
    target: TargetNow | None
    details: str


def activity_rows(*, project: Project, entries: list[Activity], role: str) -> list[ActivityRow]:
    """The rows of ``entries`` as a member of ``role`` reads them (``targets_now``)."""
    now = targets_now(project=project, entries=entries, role=role)
    return [ActivityRow(entry=entry, actor=actor_display(entry),
                        target=now.get((entry.target_kind, entry.target_id)) if entry.target_kind else None,
                        details=details_text(entry.details))
            for entry in entries]


def details_text(details: dict[str, Any]) -> str:
    """``details`` in words, key by key in the order written: ``step: 100; bytes freed: 1.2 MB``."""
    def shown(key: str, value: Any) -> str:
        if key.endswith("bytes_freed") and isinstance(value, int):
            return str(filesizeformat(value)).replace("\xa0", " ")
        if isinstance(value, bool):  # before str(): a hook turned off read "active: False"
            return "yes" if value else "no"
        if isinstance(value, list):
            return ", ".join(map(str, value))
        return str(value)

    return "; ".join(f"{key.replace('_', ' ')}: {shown(key, value)}" for key, value in details.items())
