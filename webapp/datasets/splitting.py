"""Splitting a ready dataset version into a training side and a held-out side (``services.dataset_version_split``).

Design note: rows are assigned by their ``formats.row_digest`` (the example after the column mapping, as training
reads it), never one by one: exact duplicates are one group and go to the same side, so the held-out side shares
no row with the training side and a launch's overlap warning (``selectors.launch_warnings``) says nothing of the
pair. Groups are drawn in an order shuffled by ``seed`` alone, so a split made again from the same version with the
same settings is the same split. Stratified by a column, each of its values holds out its share of the rows
(largest remainders, ties broken by the same shuffle), which keeps a rare label's rows on both sides.

The files are written as every derivation's are (``derivations.write_rows``): from the source's raw records, so
that the new versions keep its column mapping and read as the same examples.
"""
from __future__ import annotations

import itertools
import math
import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from jaxengine.data import formats
from jaxengine.words import counted
from webapp.datasets.derivations import DerivationError

# Stratifying asks for a short label: past this many distinct values a column is no label (a prompt, an id) and
# each value would hold out a row or none.
MAX_STRATA = 1000
# A request checks a stratify column on the first rows alone (``check_strata``): a column of ids or prompts shows
# itself within its first MAX_STRATA + 1 rows, while a short label's column would be read whole, which is the
# worker's to do (``column_labels``), not a form's. 10,000 rows of 1 KB are a read of about 10 MB.
STRATA_CHECKED_ROWS = 10_000
# Seeds a numpy generator takes whole; a split records its seed, so one typed is one stored.
MAX_SEED = 2**63 - 1


class SplitError(DerivationError):
    """A split that cannot be made, said for the person who asked (the field it concerns is the service's to name)."""


@dataclass(frozen=True, kw_only=True)
class HeldOutSize:
    """How much to hold out: a ``fraction`` of the rows in (0, 1), or a ``count`` of rows; one of the two."""

    fraction: float | None = None
    count: int | None = None

    def rows(self, total: int) -> int:
        """The held-out rows of a version of ``total`` rows; ``SplitError`` where a side would be empty."""
        if self.count is not None:
            if self.count >= total:
                raise SplitError(f"{self.count:,} rows is not fewer than the version's {total:,}: hold out fewer "
                                 "rows, so that some are left to train on")
            return self.count
        held = math.floor(self.fraction * total + 0.5)
        if held < 1:
            raise SplitError(f"{self.shown()} of {total:,} rows is no row: hold out a larger fraction, or a count "
                             "such as 1")
        if held >= total:
            raise SplitError(f"{self.shown()} of {total:,} rows leaves none to train on: hold out a smaller "
                             "fraction, or a count")
        return held

    def shown(self) -> str:
        """As a page says it: "10%" or "200 rows"."""
        if self.count is not None:
            return f"{self.count:,} row{'s' if self.count != 1 else ''}"
        return f"{self.fraction * 100:g}%"


HELD_OUT_EXAMPLE = "give a fraction such as 0.1 (or 10%), or a number of rows such as 500"


def held_out_size(value: Any) -> HeldOutSize:
    """``value`` as typed in a form ("0.1", "10%", "500") or sent in JSON (0.1, 500): a fraction is a number with a
    point or a percent sign, a count a whole number. ``SplitError`` for anything else, or out of range."""
    if isinstance(value, bool) or value is None:
        raise SplitError(f"the held-out size is missing: {HELD_OUT_EXAMPLE}")
    if isinstance(value, int):
        return _count(value)
    if isinstance(value, float):
        return _fraction(value, shown=f"{value:g}")
    text = str(value).strip()
    if not text:
        raise SplitError(f"the held-out size is missing: {HELD_OUT_EXAMPLE}")
    try:
        if text.endswith("%"):
            return _fraction(float(text[:-1]) / 100, shown=text)
        if text.isascii() and text.isdigit():
            return _count(int(text))
        return _fraction(float(text), shown=text)
    except ValueError as error:
        if isinstance(error, SplitError):
            raise
        raise SplitError(f"{text[:40]!r} is not a size: {HELD_OUT_EXAMPLE}") from None


def _count(count: int) -> HeldOutSize:
    if count < 1:
        raise SplitError(f"{count} rows holds nothing out: {HELD_OUT_EXAMPLE}")
    return HeldOutSize(count=count)


def _fraction(fraction: float, *, shown: str) -> HeldOutSize:
    if not (math.isfinite(fraction) and 0 < fraction < 1):
        raise SplitError(f"{shown} is not a fraction between 0 and 1 (both left out): {HELD_OUT_EXAMPLE}")
    return HeldOutSize(fraction=fraction)


def _stratum_targets(held_out: int, stratum_rows: np.ndarray, tie_order: np.ndarray) -> np.ndarray:
    """Each stratum's held-out rows, summing to ``held_out``: its share rounded down, the rows left over given to
    the largest remainders (ties in ``tie_order``)."""
    exact = held_out * stratum_rows / stratum_rows.sum()
    targets = np.floor(exact).astype(np.int64)
    left = held_out - int(targets.sum())
    if left:
        by_remainder = np.lexsort((tie_order, -(exact - targets)))
        targets[by_remainder[:left]] += 1
    return targets


def split_assignment(digests: np.ndarray, *, held_out: int, seed: int,
                     labels: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Which rows go to the held-out side (True), in file order, for a version whose rows have ``digests`` (each
    row's ``formats.row_digest``): about ``held_out`` of them, exactly so where no duplicates stand in the way.
    ``labels`` (one small integer a row: its stratify column's value, coded) holds out each label's share. Rows of
    one digest are on one side (of a duplicate's labels, its first row's counts). ``SplitError`` where a side would
    be empty (every row a copy of a few)."""
    digests = np.asarray(digests, dtype=np.uint64)
    total = len(digests)
    if not 0 < held_out < total:
        raise SplitError(f"cannot hold out {held_out:,} of {total:,} rows: hold out at least one and leave one")
    _values, first_row, group_of_row, group_rows = np.unique(digests, return_index=True, return_inverse=True,
                                                             return_counts=True)
    if labels is None:
        stratum_of_group = np.zeros(len(first_row), dtype=np.int16)
    else:
        _strata, stratum_of_group = np.unique(np.asarray(labels, dtype=np.int64)[first_row], return_inverse=True)
        if len(_strata) <= np.iinfo(np.int16).max:  # a stable sort of 16-bit keys is a radix sort: linear
            stratum_of_group = stratum_of_group.astype(np.int16)
    generator = np.random.default_rng(seed)
    # One shuffle orders the groups within every stratum, and the strata where their remainders tie.
    shuffled = generator.permutation(len(first_row))
    stratum_rows = np.bincount(stratum_of_group, weights=group_rows).astype(np.int64)
    targets = _stratum_targets(held_out, stratum_rows, generator.permutation(len(stratum_rows)))
    # Groups by stratum, each stratum's in the shuffled order; taken while the stratum's running total fits.
    in_order = (shuffled if labels is None
                else shuffled[np.argsort(stratum_of_group[shuffled], kind="stable")])
    sizes, strata = group_rows[in_order], stratum_of_group[in_order]
    running = np.cumsum(sizes)
    stratum_starts = np.concatenate(([0], np.cumsum(stratum_rows)[:-1]))
    taken = running - stratum_starts[strata] <= targets[strata]
    # A duplicate group that overshot stopped its stratum's run: later groups that fit fill it, in the same order.
    short = targets - np.bincount(strata[taken], weights=sizes[taken], minlength=len(targets)).astype(np.int64)
    group_bounds = np.concatenate(([0], np.cumsum(np.bincount(stratum_of_group, minlength=len(targets)))))
    for stratum in np.flatnonzero(short > 0):
        start = group_bounds[stratum]
        fitting = np.flatnonzero(~taken[start:group_bounds[stratum + 1]]
                                 & (sizes[start:group_bounds[stratum + 1]] <= short[stratum])) + start
        for place in fitting:  # a row each, mostly: as many turns as rows are missing
            if sizes[place] <= short[stratum]:
                taken[place] = True
                short[stratum] -= sizes[place]
                if not short[stratum]:
                    break
    held_group = np.zeros(len(first_row), dtype=bool)
    held_group[in_order[taken]] = True
    held = held_group[group_of_row]
    held_rows = int(held.sum())
    if held_rows == 0 or held_rows == total:
        raise SplitError(f"the {total:,} rows are copies of {counted(len(first_row), 'distinct row', grouped=True)}, "
                         f"which cannot be split so that {held_out:,} are held out and the sides share none: hold out "
                         "more rows, or remove the duplicates")
    return held


def column_label(value: Any) -> bytes:
    """A stratify column's value as a key: equal values (JSON-equal, keys in any order) are one label; a row
    without the column has the label of null."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str)


def column_labels(path: str | os.PathLike, *, fmt: formats.FileFormat, column: str,
                  max_rows: int | None = None) -> np.ndarray:
    """Each row's value of ``column`` (of the first ``max_rows`` alone, where given), coded as a small integer (first
    seen, first coded), streamed from the file; ``SplitError`` for a column of more than ``MAX_STRATA`` values, as
    soon as the value past them is read."""
    codes: dict[bytes, int] = {}
    labels = array("q")
    for item in itertools.islice(formats.iter_rows(path, fmt=fmt), max_rows):
        if type(item) is formats.Issue:
            raise formats.DatasetFormatError(item)
        value = item.value.get(column) if type(item.value) is dict else None
        label = codes.setdefault(column_label(value), len(codes))
        if len(codes) > MAX_STRATA:
            raise SplitError(f"column {column!r} holds more than {MAX_STRATA:,} different values, too many to "
                             "stratify by: choose a short label column such as task or source, or none")
        labels.append(label)
    return np.frombuffer(labels, dtype=np.int64) if labels else np.zeros(0, dtype=np.int64)


def check_strata(path: str | os.PathLike, *, fmt: formats.FileFormat, column: str) -> None:
    """``column_labels``' refusal of a column of too many values where the first ``STRATA_CHECKED_ROWS`` rows already
    show it: a split's request says so on its ``stratify`` field; a column whose values grow past ``MAX_STRATA``
    only further on is refused by the worker."""
    column_labels(path, fmt=fmt, column=column, max_rows=STRATA_CHECKED_ROWS)


def first_row_columns(path: str | os.PathLike, *, fmt: formats.FileFormat) -> tuple[str, ...]:
    """The columns of a version's first row (a CSV file's header), read alone: what a split may stratify by."""
    for item in formats.iter_rows(path, fmt=fmt):
        return tuple(item.value) if type(item) is not formats.Issue and type(item.value) is dict else ()
    return ()
