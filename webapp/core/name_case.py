"""Names that are one name in any letter case, and the renaming of stored rows that broke that rule.

Base model and dataset names are unique per project in any letter case. The database cannot be asked to
compare them: SQLite's LOWER() folds ASCII letters only ("Ärger" and "ärger" were two names), and
PostgreSQL's depends on the database's collation. So each row stores ``name_key``, its name as Python
folds it (``name_key``: NFC, ``str.casefold``), written by ``NameKeyModel.save`` and unique per project.

Before such a rule was added, rows could hold names it refuses; before ``checked_name`` refused invisible
format characters, names could hold them. The migrations rename those rows (``rename_to_distinct_names``):
a name is cleaned where it needs it, and of the names of one project that are then one name, the one that
was already as it is claims it first, then the oldest; each other one gets `` (2)``, `` (3)``, ... appended
(the name cut to fit ``max_length``), the first such suffix not taken in the project. No row is deleted:
runs, chats and versions keep pointing at the same row, now under a name of its own. Each renaming is logged.
"""
from __future__ import annotations

import logging
import unicodedata
from collections import defaultdict
from collections.abc import Callable

from django.db import models
from django.db.models import Count, Value
from django.db.models.functions import Lower

logger = logging.getLogger(__name__)

Renamed = tuple[int, str, str]  # (pk, old name, new name)


def name_key(name: str) -> str:
    """``name`` as names are compared for uniqueness: in NFC, case-folded (every script's letter case:
    "ΣΟΦΙΑ" is "σοφια", "STRASSE" is "straße"), and in NFC again, since folding can decompose a letter."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold())


class NameKeyModel(models.Model):
    """A model whose ``name`` is unique per project in any letter case, through the stored ``name_key``
    (each model declares the unique constraint on ``project`` and ``name_key``)."""

    name_key = models.TextField(editable=False, help_text="name_key(name): what the unique constraint compares.")

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        # The key is derived here, not in the services, so that no write of a name (admin, factories, a
        # save(update_fields=["name"])) leaves it behind. bulk_create and update() bypass save(): set it there.
        self.name_key = name_key(self.name)
        if (fields := kwargs.get("update_fields")) is not None and "name" in fields:
            kwargs["update_fields"] = {*fields, "name_key"}
        super().save(*args, **kwargs)


def fill_name_keys(model) -> None:
    """Set ``name_key`` of every row of ``model`` (a migration's historical model, whose save() is Django's)."""
    for row in model.objects.only("pk", "name", "name_key"):
        if row.name_key != (key := name_key(row.name)):
            row.name_key = key
            row.save(update_fields=["name_key"])


def rename_to_distinct_names(model, *, max_length: int, key: Callable[[str], str] | None,
                             clean: Callable[[str], str] | None = None, scope: str | None = "project_id",
                             blank_fallback: str = "public_id") -> list[Renamed]:
    """Give each row of ``model`` the name ``clean`` makes of its own (unchanged without ``clean``; the row's
    ``blank_fallback`` field where it leaves nothing of a name) and, where ``key`` is given, rows of one
    ``scope`` whose names share a key distinct ones: a name that stays as it was claims its key before a
    cleaned one, an older row before a newer one, and the others are numbered. Returns (pk, old, new) per
    renamed row."""
    groups = defaultdict(list)
    fields = {"pk", "name", blank_fallback, *([scope] if scope else [])}
    for row in model.objects.only(*fields).order_by("pk"):
        groups[getattr(row, scope) if scope else None].append(row)
    renamed = []
    for rows in groups.values():
        wanted = {row.pk: _cleaned(row, clean, max_length=max_length, blank_fallback=blank_fallback) for row in rows}
        if key is not None:
            wanted = _distinct(rows, wanted, key=key, max_length=max_length)
        renamed.extend(_rename(row, wanted[row.pk]) for row in rows if wanted[row.pk] != row.name)
    return renamed


def _rename(row, name: str) -> Renamed:
    logger.warning("%s %s renamed from %r to %r", row._meta.verbose_name, row.pk, row.name, name)
    old_name, row.name = row.name, name
    row.save(update_fields=["name"])
    return row.pk, old_name, name


def _cleaned(row, clean: Callable[[str], str] | None, *, max_length: int, blank_fallback: str) -> str:
    if clean is None:
        return row.name
    name = clean(row.name)[:max_length]  # NFC may lengthen a name (a few characters decompose)
    return name if name or not row.name else getattr(row, blank_fallback)


def _distinct(rows, wanted: dict[int, str], *, key: Callable[[str], str], max_length: int) -> dict[int, str]:
    wanted_keys = {key(name) for name in wanted.values()}
    claimed: set[str] = set()
    distinct = {}
    for row in sorted(rows, key=lambda row: (wanted[row.pk] != row.name, row.pk)):
        name = wanted[row.pk]
        if key(name) in claimed:
            # Nor a name another row of the group wants: that row would then be the one renamed.
            name = _first_free_numbered_name(
                name, max_length=max_length,
                taken=lambda candidate: key(candidate) in claimed or key(candidate) in wanted_keys)
        claimed.add(key(name))
        distinct[row.pk] = name
    return distinct


def _first_free_numbered_name(name: str, *, max_length: int, taken: Callable[[str], bool]) -> str:
    number = 2
    while True:
        suffix = f" ({number})"
        candidate = name[:max_length - len(suffix)] + suffix
        if not taken(candidate):
            return candidate
        number += 1


def rename_names_differing_only_in_case(model, *, max_length: int) -> list[Renamed]:
    """Rename the later rows of each (project, lower name) group of ``model``, as the database's LOWER
    compares them (the ``Lower("name")`` constraint its migration then added); returns (pk, old, new) per row."""
    renamed = []
    groups = (model.objects.annotate(lower_name=Lower("name")).values("project_id", "lower_name")
              .annotate(rows=Count("pk")).filter(rows__gt=1))
    for group in groups:
        rows = list(model.objects.alias(lower_name=Lower("name"))
                    .filter(project_id=group["project_id"], lower_name=group["lower_name"]).order_by("pk"))
        project_names = model.objects.alias(lower_name=Lower("name")).filter(project_id=group["project_id"])
        for row in rows[1:]:
            renamed.append(_rename(row, _first_free_numbered_name(
                row.name, max_length=max_length,
                taken=lambda candidate: project_names.filter(lower_name=Lower(Value(candidate))).exists())))
    return renamed
