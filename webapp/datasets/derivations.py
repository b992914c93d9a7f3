"""New versions written from a ready one by a worker: the two sides of a split (``splitting``), a version without
its exact repeats, a version without the rows it shares with another (``services.dataset_version_derive``).

Design note: every derivation decides each source row's destination from the rows' ``formats.row_digest`` (the
example after the column mapping, as training reads it, so that the version comparison page and a launch's warnings
agree with what was removed) and then streams the source's raw records into its files (``write_rows``). The files
keep the source's column mapping and read as the same examples (same digests): a CSV source gives CSV files, any
other format JSON Lines (Parquet and a JSON array are read as JSON values, which JSON Lines holds without a schema
to carry over).
"""
from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from jaxengine.data import formats

# A row's destination that no file receives (``write_rows``).
DROPPED = -1


class DerivationError(ValueError):
    """A derivation that cannot be made, said for the person who asked (the field it concerns is the service's to
    name)."""


def first_occurrences(digests: np.ndarray) -> np.ndarray:
    """Which rows to keep (True), in file order, so that each digest is kept once: its first row; the later copies
    are the exact repeats a version's check counted (``statistics["duplicates"]``)."""
    digests = np.asarray(digests, dtype=np.uint64)
    keep = np.zeros(len(digests), dtype=bool)
    keep[np.unique(digests, return_index=True)[1]] = True
    return keep


def rows_not_in(digests: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Which rows to keep (True), in file order: those whose digest ``other`` (another version's) does not hold,
    every copy of a shared row dropped."""
    return ~np.isin(np.asarray(digests, dtype=np.uint64), np.asarray(other, dtype=np.uint64))


def derived_format(source_format: formats.FileFormat) -> formats.FileFormat:
    """The format a version derived from a ``source_format`` one is written in (see the module note)."""
    return formats.FileFormat.CSV if source_format is formats.FileFormat.CSV else formats.FileFormat.JSONL


def write_rows(source: Path, *, fmt: formats.FileFormat, destinations: np.ndarray,
               paths: Sequence[Path]) -> list[int]:
    """Stream the rows of ``source`` into ``paths``, each row into ``paths[destinations[row]]`` (none where it is
    ``DROPPED``), in ``derived_format``; each file is written under a temporary name and moved into place whole, so
    one that exists is complete. Returns the files' sizes in bytes. ``DerivationError`` where the file's rows are not
    the rows ``destinations`` was made for."""
    out_format = derived_format(fmt)
    partial = [path.with_name(path.name + ".partial") for path in paths]
    rows = 0
    handles = []
    try:
        for path in partial:
            handles.append(open(path, "w", encoding="utf-8", newline=""))
        writers = [_row_writer(handle, out_format) for handle in handles]
        for item in formats.iter_rows(source, fmt=fmt):
            if type(item) is formats.Issue:
                raise formats.DatasetFormatError(item)
            if rows >= len(destinations):
                rows += 1
                break
            if (destination := int(destinations[rows])) != DROPPED:
                writers[destination](item.value)
            rows += 1
        for handle in handles:
            handle.close()
        if rows != len(destinations):
            raise DerivationError(f"the file holds other rows than its check counted (not {len(destinations):,}): "
                                  "upload it again and derive from that version")
        for written, path in zip(partial, paths):
            os.replace(written, path)
    finally:
        for handle in handles:
            handle.close()
        for written in partial:
            written.unlink(missing_ok=True)
    return [path.stat().st_size for path in paths]


def _row_writer(handle, out_format: formats.FileFormat):
    """A function that writes one raw record to ``handle``: a CSV row (the header before the first), or a JSON
    line. A value JSON cannot hold (a Parquet timestamp) is written as its text."""
    if out_format is formats.FileFormat.JSONL:
        def write_line(value: Any) -> None:
            try:
                handle.write(orjson.dumps(value, default=str).decode() + "\n")
            except TypeError as error:  # nesting past orjson's depth, a lone surrogate
                raise DerivationError(f"a row cannot be written as JSON ({error}); convert the file to JSON Lines, "
                                      "upload it and derive from that version") from None
        return write_line
    writer = csv.writer(handle)
    header: list[str] = []

    def write_row(value: dict[str, str]) -> None:
        if not header:
            header.extend(value)
            writer.writerow(header)
        writer.writerow([value[column] for column in header])
    return write_row
