"""Whole numbers typed by people (form fields, query parameters, parts of ids such as ``run_…@N``)."""
from __future__ import annotations

# The largest value of a PositiveIntegerField on PostgreSQL (steps, positions): a larger number in a
# query or an INSERT fails in the database (SQLite: OverflowError) instead of matching nothing.
MAX_STORED_INT = 2**31 - 1
# What a JSON or YAML reader's ValueError past Python's limit on integer digits (4,300) is, in words:
# json.loads and int() raise it for "9" * 5000, which no field takes.
TOO_MANY_DIGITS = "a number has more digits than any field takes (over 4,300)"


def whole_number(text: str | None, *, maximum: int | None = MAX_STORED_INT, signed: bool = False) -> int | None:
    """``text`` as a non-negative int, or None when it is not ASCII digits or is over ``maximum``
    (None: no bound, for a caller that names the bound itself). ``signed``: a leading '-' is taken too
    (a step "after" which points come back, -1 for all), and ``maximum`` bounds the size either way.

    This is the one reader of whole numbers in query strings and forms: ``int`` also takes what no
    one types as a number in an address (' 5', '+5', '1_000', Arabic-Indic '٥'), and ``str.isdigit``
    alone takes digits such as '²' that ``int`` refuses (a ValueError, so a 500 page, where the caller
    meant to say what was wrong)."""
    if signed and text and text.startswith("-"):
        size = whole_number(text[1:], maximum=maximum)
        return None if size is None else -size
    if not text or not (text.isascii() and text.isdigit()) or len(text) > 4000:
        return None  # 4,000 digits: past any maximum, and short of Python's limit on int() (a ValueError)
    value = int(text)
    return value if maximum is None or value <= maximum else None
