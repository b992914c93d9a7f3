"""Paging of the API's lists (runs, a run's samples): ``?limit=`` and an opaque ``cursor`` carried by
each page's ``next`` link.

Design note: the cursor is the sort key of a page's last run (``run_selectors.run_page``) and the
order it was read in, signed (``django.core.signing``) so that a client cannot hand-edit it into a
query on another column; a cursor of another order, an edited one or a stale one is a 400 naming
``cursor`` that says to follow the ``next`` link or start again. The ``next`` link keeps the rest of
the query, so a client only ever follows it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core import signing
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from webapp.core.numbers import whole_number

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
# Samples are small and read in bulk: larger pages.
SAMPLES_DEFAULT_LIMIT = 1000
SAMPLES_MAX_LIMIT = 5000
# Row numbers (a dataset comparison's removed and added rows, webapp.api.views.dataset_compare): small, read in bulk.
ROWS_DEFAULT_LIMIT = 1000
ROWS_MAX_LIMIT = 10_000
# A run's log lines (webapp.api.views.run_logs): the run page shows its last 200.
LOG_DEFAULT_LIMIT = 200
LOG_MAX_LIMIT = 1000
_SALT = "webapp.api.paging.cursor"
# The query parameters of a paged list.
QUERY = ("limit", "cursor")


@dataclass(frozen=True, kw_only=True)
class PageQuery:
    """A page asked for: at most ``limit`` runs after the sort key ``after`` (None: from the first)."""

    limit: int
    after: tuple[Any, int] | None


def page_query(request: HttpRequest, *, sort: str, default_limit: int = DEFAULT_LIMIT,
               max_limit: int = MAX_LIMIT) -> PageQuery:
    """``limit`` and ``cursor`` of ``request``'s query, for a list in the order ``sort``; a
    ``ValidationError`` naming each that is not one the list takes or gave."""
    errors: dict[str, str] = {}
    limit_text = request.GET.get("limit")
    limit = default_limit if limit_text is None else whole_number(limit_text, maximum=max_limit)
    if not limit:
        errors["limit"] = (f"{limit_text!r} is not a page size; give a whole number from 1 to {max_limit} "
                           f"({default_limit} when left out)")
    after = None
    cursor = request.GET.get("cursor")
    if cursor:
        try:
            cursor_sort, value, last_id = signing.loads(cursor, salt=_SALT)
        except (signing.BadSignature, ValueError, TypeError):
            errors["cursor"] = ("this cursor was not given by this list; follow the list's next link, or start "
                                "again without cursor")
        else:
            if cursor_sort != sort:
                errors["cursor"] = (f"this cursor continues a list in the order {cursor_sort}, not {sort}; follow the "
                                    "list's next link as given")
            after = (value, last_id)
    if errors:
        raise ValidationError(errors)
    return PageQuery(limit=limit, after=after)


def next_link(request: HttpRequest, *, sort: str, after: tuple[Any, int] | None) -> str | None:
    """The address of the page after the one that ended at sort key ``after`` (None: it was the
    last): ``request``'s own, with the cursor replaced."""
    if after is None:
        return None
    query = request.GET.copy()
    query["cursor"] = signing.dumps([sort, *after], salt=_SALT, compress=True)
    return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
