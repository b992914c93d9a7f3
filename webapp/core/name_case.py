"""Renaming rows whose names differ only in letter case, before a ``Lower("name")`` unique constraint is
added per project (the migrations of base models and datasets use it; ``Demo`` and ``demo`` could both
exist before).

The oldest row of each group keeps its name; each later one gets `` (2)``, `` (3)``, ... appended (the
name cut to fit ``max_length``), the first such suffix not taken in the project in any letter case. No
row is deleted: runs, chats and versions keep pointing at the same row, now under a name of its own.
"""
from __future__ import annotations

from django.db.models import Count, Value
from django.db.models.functions import Lower


def rename_names_differing_only_in_case(model, *, max_length: int) -> list[tuple[int, str, str]]:
    """Rename the later rows of each (project, lower name) group of ``model``; returns (pk, old, new) per row."""
    renamed = []
    groups = (model.objects.annotate(lower_name=Lower("name")).values("project_id", "lower_name")
              .annotate(rows=Count("pk")).filter(rows__gt=1))
    for group in groups:
        rows = list(model.objects.alias(lower_name=Lower("name"))
                    .filter(project_id=group["project_id"], lower_name=group["lower_name"]).order_by("pk"))
        for row in rows[1:]:
            number = 2
            while True:
                suffix = f" ({number})"
                candidate = row.name[:max_length - len(suffix)] + suffix
                taken = (model.objects.alias(lower_name=Lower("name"))
                         .filter(project_id=row.project_id, lower_name=Lower(Value(candidate))).exists())
                if not taken:
                    break
                number += 1
            renamed.append((row.pk, row.name, candidate))
            row.name = candidate
            row.save(update_fields=["name"])
    return renamed
