"""Keyset paging: a page of a list is the rows after the last one a client read, by the list's own order,
never an offset, so a row added or removed while a client reads page after page moves none of the rows
still to come onto a page already read (or off every page). Each selector filters its rows to those after
``after`` by its order's key; ``keyset_page`` cuts the page and names the key the next one starts after."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db.models import QuerySet

Row = TypeVar("Row")


@dataclass(frozen=True, kw_only=True)
class KeysetPage(Generic[Row]):
    """One page: its ``rows`` and, when more follow, ``next_after``: the key of its last row (the selector's
    ``after`` for the next page; JSON values, for a cursor), else None."""

    rows: list[Row]
    next_after: tuple[Any, ...] | None


def keyset_page(rows: QuerySet | list, *, limit: int, key: Callable[[Row], tuple[Any, ...]]) -> KeysetPage[Row]:
    """The first ``limit`` of ``rows`` (ordered, and filtered to those after the previous page), reading one
    more to know whether another page follows; ``key(row)`` is a row's place in the order."""
    found = list(rows[:limit + 1])
    if len(found) <= limit:
        return KeysetPage(rows=found, next_after=None)
    return KeysetPage(rows=found[:limit], next_after=key(found[limit - 1]))
