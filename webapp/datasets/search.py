"""A ready version's search index: the preview's search reads it instead of the version's file.

Reading a version's file costs most of a search (the JSON parse and each row's check against its kind: about
70-130 ms for the demo's 10,838 rows, a second or two at the preview's row limit), and a search read the whole file
again for every query and every page. The index is built once per version, by its first search, from the rows a
search goes through (the first ``rows`` of the file), as two files beside it:

- ``DatasetVersion.search_index_path``: a header line (what it was built from: ``built_from``), then the rows in
  chunks of about ``CHUNK_CHARS`` characters, a JSON line each: ``numbers`` (row numbers), ``text`` (the rows'
  ``searchable_text`` one after the other), ``ends`` (where each row's text ends in it) and ``offsets`` (where each
  row's example starts in the rows file). A search decodes one chunk at a time, so memory stays bounded however
  long the rows, and finds the text with ``str.find``.
- ``DatasetVersion.search_rows_path``: each row's example after the column mapping, a JSON line each; a search
  decodes only the rows of the page it shows.

An index built from another column mapping, row limit or file is built again. Both files are written under
temporary names and renamed, the rows file first, so a search beside a build reads a whole index or builds its
own. A version whose examples JSON does not give back as they were (values a Parquet file may hold: dates,
bytes) gets an index that says so (``exact: false``), and its searches read the file as before, so that an index
never shows a row otherwise than the preview does.
"""
from __future__ import annotations

import bisect
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxengine.data import formats
from webapp.core.name_case import name_key
from webapp.datasets.models import DatasetVersion

# Characters of searchable text per chunk line of the index (a row longer than this is a chunk of its own).
CHUNK_CHARS = 1 << 20
INDEX_FORMAT = 1


def searchable_text(value: Any) -> str:
    """Every string in ``value`` (nested lists and dicts: chat turns, extra columns) as ``name_key`` compares
    text, one per line."""
    if isinstance(value, str):
        return name_key(value)
    if isinstance(value, dict):
        return "\n".join(searchable_text(item) for item in value.values())
    if isinstance(value, list):
        return "\n".join(searchable_text(item) for item in value)
    return "" if value is None else name_key(str(value))


def version_examples(version: DatasetVersion, *, rows: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """The first ``rows`` rows of ``version``'s file as ``(row number, example)`` after its column mapping."""
    mapping = formats.ColumnMapping(kind=formats.DatasetKind(version.dataset.kind), columns=version.column_mapping)
    examples = formats.numbered_examples(version.absolute_path, fmt=formats.FileFormat(version.format),
                                         mapping=mapping)
    for count, found in enumerate(examples):
        if count >= rows:
            return
        yield found


@dataclass(frozen=True)
class SearchIndex:
    """An open search index of a version (``search_index``)."""

    index_path: Path
    rows_path: Path

    def matching_rows(self, needle: str) -> Iterator[tuple[int, int]]:
        """``(row number, offset of its example)`` of each row whose searchable text holds ``needle``
        (``name_key``'d), in file order."""
        with self.index_path.open(encoding="utf-8") as lines:
            next(lines)  # the header
            for line in lines:
                chunk = json.loads(line)
                yield from _chunk_matches(chunk, needle)

    def offsets_of(self, numbers: list[int]) -> dict[int, int]:
        """Where the examples of the rows numbered ``numbers`` start in the rows file, for those the index holds;
        the chunks after the one holding the last of them are not read."""
        wanted, last = set(numbers), max(numbers, default=0)
        found = {}
        with self.index_path.open(encoding="utf-8") as lines:
            next(lines)  # the header
            for line in lines:
                chunk = json.loads(line)
                found.update((number, offset) for number, offset in zip(chunk["numbers"], chunk["offsets"])
                             if number in wanted)
                if chunk["numbers"][-1] >= last:
                    break
        return found

    def examples(self, offsets: list[int]) -> list[dict[str, Any]]:
        """The examples stored at ``offsets`` of the rows file."""
        found = []
        with self.rows_path.open("rb") as rows:
            for offset in offsets:
                rows.seek(offset)
                found.append(json.loads(rows.readline()))
        return found


def _chunk_matches(chunk: dict[str, Any], needle: str) -> Iterator[tuple[int, int]]:
    text, ends, numbers, offsets = chunk["text"], chunk["ends"], chunk["numbers"], chunk["offsets"]
    if not needle:
        yield from zip(numbers, offsets)
        return
    start = 0
    while start < len(text):
        found = text.find(needle, start)
        if found < 0:
            return
        row = bisect.bisect_right(ends, found)  # the row whose text holds position ``found``
        if found + len(needle) <= ends[row]:  # not a match that runs on into the next row's text
            yield numbers[row], offsets[row]
        start = ends[row]


def built_from(version: DatasetVersion, *, rows: int) -> dict[str, Any]:
    """What an index of ``version`` covering its first ``rows`` rows is built from: it is built again when any of it
    differs."""
    return {"format": INDEX_FORMAT, "rows": rows, "mapping": version.column_mapping,
            "size": version.absolute_path.stat().st_size}


def search_index(version: DatasetVersion, *, rows: int) -> SearchIndex | None:
    """The search index of ``version``'s first ``rows`` rows, built when there is none (or one of another mapping,
    row limit or file); None when its examples cannot be stored exactly (the search then reads the file)."""
    index = SearchIndex(version.search_index_path, version.search_rows_path)
    wanted = built_from(version, rows=rows)
    header = _read_header(index.index_path)
    if header is None or header.get("built_from") != wanted:
        header = _build(version, index, wanted)
    return index if header["exact"] else None


def _read_header(path: Path) -> dict[str, Any] | None:
    try:
        with path.open(encoding="utf-8") as lines:
            return json.loads(next(lines, "null"))
    except (OSError, ValueError):
        return None


def _build(version: DatasetVersion, index: SearchIndex, wanted: dict[str, Any]) -> dict[str, Any]:
    directory = index.index_path.parent
    header = {"built_from": wanted, "exact": True}
    with (tempfile.NamedTemporaryFile("wb", dir=directory, prefix=".search-rows-", delete=False) as rows_file,
          tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, prefix=".search-", delete=False)
          as index_file):
        try:
            index_file.write(json.dumps(header) + "\n")
            chunk: dict[str, list] = {"numbers": [], "ends": [], "offsets": [], "text": []}
            length = 0
            for number, example in version_examples(version, rows=wanted["rows"]):
                stored = json.dumps(example, ensure_ascii=False, default=str)
                if json.loads(stored) != example:
                    header["exact"] = False
                    break
                chunk["offsets"].append(rows_file.tell())
                rows_file.write(stored.encode() + b"\n")
                text = searchable_text(example)
                length += len(text)
                chunk["numbers"].append(number)
                chunk["ends"].append(length)
                chunk["text"].append(text)
                if length >= CHUNK_CHARS:
                    _write_chunk(index_file, chunk)
                    chunk, length = {"numbers": [], "ends": [], "offsets": [], "text": []}, 0
            if not header["exact"]:  # a header that says so, and nothing else
                index_file.seek(0)
                index_file.truncate()
                index_file.write(json.dumps(header) + "\n")
                rows_file.truncate(0)
            elif chunk["numbers"]:
                _write_chunk(index_file, chunk)
        except BaseException:
            os.unlink(rows_file.name)
            os.unlink(index_file.name)
            raise
    os.replace(rows_file.name, index.rows_path)
    os.replace(index_file.name, index.index_path)
    return header


def _write_chunk(handle, chunk: dict[str, list]) -> None:
    handle.write(json.dumps({**chunk, "text": "".join(chunk["text"])}, ensure_ascii=False) + "\n")
