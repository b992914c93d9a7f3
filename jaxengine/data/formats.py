"""Dataset kinds, streaming file readers and the one-pass validator.

Design note: the web process, the ``default`` worker and the engine all read datasets through this
module, so it stays jax-free (stdlib, orjson and pyarrow only; pyarrow is imported lazily, for
Parquet files only). Every reader streams: JSONL line by line, JSON arrays element by element
(``json.JSONDecoder.raw_decode`` over a growing text buffer; also the array of ``{"data": [...]}``, and a
.json file of JSON Lines, as Hugging Face's ``to_json`` writes, line by line), CSV through the ``csv`` module over
lines decoded one at a time (a line, as a JSON array's element, at most 64 MB: ``MAX_LINE_BYTES``), Parquet by
record batches. Memory therefore grows with the largest row, never with the file.

Problems are ``Issue`` values with a stable ``code``, the 1-based ``line`` (text formats) and
``row`` (every format) where it happened, the ``field``, and a message that says what to do.
Problems that make the rest of the file unreadable (empty, binary, wrong encoding in a JSON array,
too large) stop the reader with ``DatasetFormatError``; row-level problems are collected and the
validator moves on, so one pass reports the first ``max_errors`` problems and counts them all.

Statistics (character lengths per field and in total) are gathered in the same pass as exact
length counts, which merge across processes and become histograms at the end.

Kinds and their fields (a ``ColumnMapping`` maps a file's own column names onto them):

- ``text``: ``text`` (string), for continued pre-training;
- ``sft``: ``prompt`` and ``completion`` (strings), or ``messages`` (a list of ``{role, content}``
  with roles system/user/assistant and at least one assistant turn; it wins when both are present);
- ``preference``: ``prompt``, ``chosen``, ``rejected``, each a string or a message list; ``prompt``
  may be left out when ``chosen`` and ``rejected`` are whole conversations (message lists);
- ``prompts``: ``prompt`` (string or message list); every other column is kept as a reference
  value (e.g. ``answer``) for reward functions.
"""
from __future__ import annotations

import bisect
import codecs
import csv
import hashlib
import json
import math
import operator
import os
import re
from array import array
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROLES = frozenset({"system", "user", "assistant"})
DEFAULT_MAX_ERRORS = 20
# A JSON array element larger than this is treated as broken JSON rather than buffered further.
MAX_JSON_ELEMENT_CHARS = 64 * 1024 * 1024
# The same bound for one CSV cell: the csv module's own default, 131,072 characters, refused long documents.
MAX_CSV_CELL_CHARS = MAX_JSON_ELEMENT_CHARS
# The same bound, in bytes, for one line of a JSONL or CSV file: read whole, a file of one 2 GB line (the upload
# limit) held the validating worker's memory several times over before anything was checked.
MAX_LINE_BYTES = MAX_JSON_ELEMENT_CHARS
_JSON_CHUNK_BYTES = 1024 * 1024
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_JSON_WHITESPACE = frozenset(" \t\n\r") | {""}
_SNIFF_BYTES = 8192
_HISTOGRAM_BINS = 30
# Rows named in the statistics' duplicate and one-sided-chat counts, and in the error of an engine's reading of a file
# (pipeline.read_examples); the rest are counted only.
ROWS_SHOWN = 5


class DatasetKind(StrEnum):
    TEXT = "text"
    SFT = "sft"
    PREFERENCE = "preference"
    PROMPTS = "prompts"


class FileFormat(StrEnum):
    JSONL = "jsonl"
    JSON = "json"
    CSV = "csv"
    PARQUET = "parquet"


# The fields of each kind that a column mapping may name.
KIND_FIELDS: dict[DatasetKind, tuple[str, ...]] = {
    DatasetKind.TEXT: ("text",),
    DatasetKind.SFT: ("prompt", "completion", "messages"),
    DatasetKind.PREFERENCE: ("prompt", "chosen", "rejected"),
    DatasetKind.PROMPTS: ("prompt",),
}

KIND_DESCRIPTIONS: dict[DatasetKind, str] = {
    DatasetKind.TEXT: "raw text for continued pre-training: a 'text' column",
    DatasetKind.SFT: ("supervised fine-tuning: 'prompt' and 'completion', or 'messages' (a chat), or LLaMA-Factory's "
                      "ShareGPT or Alpaca layout"),
    DatasetKind.PREFERENCE: ("preference pairs: 'prompt', 'chosen' and 'rejected' (strings or chats), or "
                             "LLaMA-Factory's ShareGPT or Alpaca layout"),
    DatasetKind.PROMPTS: "prompts for RL: 'prompt' plus optional reference columns such as 'answer'",
}

# File name extensions (lower case) and the format each one means.
SPREADSHEET_EXTENSIONS = frozenset({".xlsx", ".xlsm", ".xls", ".ods", ".numbers"})
COMPRESSED_EXTENSIONS = frozenset({".gz", ".gzip", ".zip", ".zst", ".zstd", ".bz2", ".xz", ".7z", ".tgz"})
EXTENSIONS: dict[str, FileFormat] = {
    ".jsonl": FileFormat.JSONL,
    ".ndjson": FileFormat.JSONL,
    ".json": FileFormat.JSON,
    ".csv": FileFormat.CSV,
    ".parquet": FileFormat.PARQUET,
    ".pq": FileFormat.PARQUET,
}

# Leading bytes of files given by mistake, and what to tell them. Like every message of these checks, in
# words that fit the upload form, the API and the command line (validate-data, train, eval) alike; advice that names
# a setting of one of them (a format, a kind, a column mapping) is worded for it by its ``DataSource``.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "a gzip-compressed file: decompress it first"),
    (b"PK\x03\x04", "a zip archive: extract the dataset file from it first"),
    (b"PAR1", "a Parquet file: give it a .parquet extension"),
    (b"\x28\xb5\x2f\xfd", "a zstd-compressed file: decompress it first"),
    (b"BZh", "a bzip2-compressed file: decompress it first"),
)


@dataclass(frozen=True, kw_only=True)
class Issue:
    """One problem found in a dataset file; ``line`` and ``row`` are 1-based."""

    code: str
    message: str
    line: int | None = None
    row: int | None = None
    field: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "line": self.line, "row": self.row, "field": self.field}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Issue:
        return cls(**{key: data.get(key) for key in ("code", "message", "line", "row", "field")})

    def __str__(self) -> str:
        where = []
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        return f"{', '.join(where)}: {self.message}" if where else self.message


class DatasetFormatError(Exception):
    """A problem that stops reading the file (or, from ``iter_examples``, the first bad row); ``later``: the first
    problems of the bad rows after it, ``later_count`` of them counted in all, where the reader went on to name them
    (``iter_examples``'s ``rows_named``)."""

    def __init__(self, issue: Issue, *, later: tuple[Issue, ...] = (), later_count: int = 0):
        super().__init__(_with_later_rows(issue, later, later_count))
        self.issue, self.later, self.later_count = issue, later, later_count


def _with_later_rows(issue: Issue, later: tuple[Issue, ...], later_count: int) -> str:
    """'line 3, row 3: ...; 6 more bad rows: line 5, row 5: the same problem; line 8, row 8: ...; and 4 more', a
    problem said once already said as the same."""
    if not later_count:
        return str(issue)
    said, named = {(issue.field, issue.message)}, []
    for bad in later:
        if (bad.field, bad.message) in said:
            bad = Issue(code=bad.code, message="the same problem", line=bad.line, row=bad.row, field=bad.field)
        said.add((bad.field, bad.message))
        named.append(str(bad))
    unnamed = later_count - len(later)
    rows = f"{later_count} more bad row{'s' if later_count != 1 else ''}"
    return f"{issue}; {rows}: {'; '.join(named)}" + (f"; and {unnamed} more" if unnamed else "")


@dataclass(frozen=True, kw_only=True)
class RawRow:
    """One record as read from the file, before the column mapping: ``value`` is usually a dict."""

    row: int
    line: int | None
    value: Any


@dataclass(frozen=True, kw_only=True)
class ColumnMapping:
    """Maps the kind's fields to the file's column names, e.g. ``{"prompt": "question"}``.

    Fields left out are read from a column of the same name.
    """

    kind: DatasetKind
    columns: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", DatasetKind(self.kind))
        allowed = KIND_FIELDS[self.kind]
        cleaned: dict[str, str] = {}
        for field_name, column in dict(self.columns).items():
            if field_name not in allowed:
                raise ValueError(
                    f"column mapping: '{field_name}' is not a field of kind '{self.kind}'; "
                    f"map one of: {', '.join(allowed)}"
                )
            if not isinstance(column, str):
                raise ValueError(f"column mapping: the column for '{field_name}' must be a column name (a string)")
            if column.strip() and column.strip() != field_name:
                cleaned[field_name] = column.strip()
        used: dict[str, str] = {}
        for field_name in allowed:
            column = cleaned.get(field_name, field_name)
            if column in used:
                raise ValueError(
                    f"column mapping: column '{column}' is mapped to both '{used[column]}' and '{field_name}'; "
                    "each column can feed one field"
                )
            used[column] = field_name
        object.__setattr__(self, "columns", cleaned)

    def column_for(self, field_name: str) -> str:
        return self.columns.get(field_name, field_name)

    def describe(self, field_name: str) -> str:
        """How a field is named in messages: ``'prompt'`` or ``'prompt' (column 'question')``."""
        column = self.column_for(field_name)
        return f"'{field_name}'" if column == field_name else f"'{field_name}' (column '{column}')"


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    """What one validation pass found. ``statistics`` is JSON-ready (see ``LengthStatistics``)."""

    row_count: int
    error_count: int
    errors: tuple[Issue, ...]
    statistics: dict[str, Any]
    columns: tuple[str, ...]
    # ``row_digest`` of each row in file order, as ``array("Q")`` bytes: what a launch compares two versions by.
    row_digests: bytes = b""

    @property
    def ok(self) -> bool:
        return self.error_count == 0


class Entry(StrEnum):
    """The place a dataset file was given in, whose settings a problem's advice may name (``DataSource``)."""

    UPLOAD = "upload"  # the web app's upload form and the REST API's upload: format, kind, column mapping
    VALIDATE_DATA = "validate-data"  # jaxengine validate-data FILE --kind --format --map
    SPEC = "spec"  # a job spec's data.train or data.eval (jaxengine train): data.columns; format by extension
    EVAL = "eval"  # jaxengine eval --data (--metric decides the kind): --map; format by extension
    # a run launched in the web app, on dataset versions uploaded there (and a base model's serving copy measured on one)
    LAUNCH = "launch"


# The tasks that train on each kind, as jaxengine.spec.TASK_DATASET_KINDS says (spec imports this module).
KIND_TASKS: dict[DatasetKind, str] = {DatasetKind.TEXT: "pretrain", DatasetKind.SFT: "sft",
                                      DatasetKind.PREFERENCE: "reward or dpo", DatasetKind.PROMPTS: "grpo or ppo"}


@dataclass(frozen=True, kw_only=True)
class DataSource:
    """Where a dataset file came from, passed down to the checks so that the advice of a problem names what can be
    set in that place: an upload's Format, Kind and Column mapping; validate-data's --format, --kind and --map; a job
    spec's data.columns and task (``key``: the spec key the file was given as, ``task``: the spec's task); eval's
    --map and --metric. A job spec and eval tell the format by the file's extension only, and have no kind to set."""

    entry: Entry
    key: str | None = None
    task: str | None = None

    def format_choice(self) -> str:
        """How to give the format of a file whose extension says none, after "rename it with one of ...". """
        return {Entry.UPLOAD: ", or give its format (Format on the upload form, file_format in the API)",
                Entry.LAUNCH: ", or give its format (Format on the upload form, file_format in the API)",
                Entry.VALIDATE_DATA: ", or give its format with --format",
                Entry.SPEC: f" ({self.key or 'a job spec'}'s format is told by its extension)",
                Entry.EVAL: " (--data's format is told by its extension)"}[self.entry]

    def json_format(self) -> str:
        """How to have a file read as one JSON array."""
        return self._format_advice("JSON", "json")

    def jsonl_format(self) -> str:
        """How to have a file read as JSON Lines."""
        return self._format_advice("JSON Lines", "jsonl")

    def csv_format(self) -> str:
        """How to have a file read as CSV."""
        return self._format_advice("CSV", "csv")

    def _format_advice(self, name: str, extension: str) -> str:
        """How to have a file read in format ``name`` (a file of extension ``extension``), from this entry."""
        if self.entry in (Entry.UPLOAD, Entry.LAUNCH):
            return (f"choose the format {name} (Format on the upload form, file_format in the API) or give the file "
                    f"the .{extension} extension, and upload it again")
        if self.entry is Entry.VALIDATE_DATA:
            return f"give --format {extension}, or give the file the .{extension} extension"
        return f"give the file the .{extension} extension"

    def mapping_place(self) -> str:
        """Where a column mapping is set, as said in parentheses."""
        return {Entry.UPLOAD: "Column mapping on the upload form, mapping in the API",
                Entry.LAUNCH: "the Column mapping of a new version of the dataset, uploaded again",
                Entry.VALIDATE_DATA: "--map FIELD=COLUMN", Entry.EVAL: "--map FIELD=COLUMN",
                Entry.SPEC: "data.columns in the job spec"}[self.entry]

    def kind_advice(self, *, kind: DatasetKind, other: DatasetKind) -> str:
        """What to do with a file whose rows have the fields of ``other`` where ``kind``'s were read."""
        if self.entry is Entry.UPLOAD:
            return (f"if the file holds {other} rows, upload it as a dataset of kind {other} (Kind on the upload "
                    "form, kind in the API)")
        if self.entry is Entry.VALIDATE_DATA:
            return f"if the file holds {other} rows, check it with --kind {other}"
        if self.entry is Entry.EVAL:
            return f"if the file holds {other} rows, jaxengine eval does not score them"
        key = self.key or "the data"
        if self.entry is Entry.LAUNCH:
            return (f"{key} is read as {kind} rows: choose a dataset of kind {kind} for it, or upload the file as a "
                    f"dataset of kind {other}, which {KIND_TASKS[other]} runs train on")
        return (f"{key} of task {self.task or kind} is read as {kind} rows: give a file of {kind} rows for {key}"
                + (f", or set task to {KIND_TASKS[other]}, which train on {other} rows" if key == "data.train" else ""))


# The upload's words: what validate_file, iter_examples and detect_format say where no source is given.
WEB_UPLOAD = DataSource(entry=Entry.UPLOAD)


# --------------------------------------------------------------------------------------------
# Format detection and whole-file checks


def detect_format(filename: str, *, shown_as: str | None = None, source: DataSource = WEB_UPLOAD) -> FileFormat:
    """The file format from a file name's extension; ``ValueError`` names the accepted ones, and the file
    as ``shown_as`` when given (the web app's, between bidi isolates), and how ``source`` gives a format."""
    suffix = Path(filename).suffix.lower()
    shown = filename if shown_as is None else shown_as
    try:
        return EXTENSIONS[suffix]
    except KeyError:
        if suffix == ".tsv":
            raise ValueError(f"'{shown}' is separated by tabs, which Temper does not read: export it again as CSV "
                             "(separated by commas) or as JSON Lines") from None
        if suffix in SPREADSHEET_EXTENSIONS:
            raise ValueError(f"'{shown}' is a spreadsheet workbook, which Temper does not read: export the sheet as "
                             "CSV (UTF-8) and upload that file") from None
        if suffix in COMPRESSED_EXTENSIONS:
            # Told only to rename it, a user renamed rows.jsonl.gz to rows.jsonl and had it refused as binary.
            raise ValueError(
                f"'{shown}' is a compressed file ({Path(filename).suffix}), which Temper does not read: decompress "
                f"it and give the file it holds ('{Path(filename).stem}')"
            ) from None
        accepted = ", ".join(sorted(EXTENSIONS))
        raise ValueError(
            f"cannot tell the format of '{shown}' from its extension: rename it with one of {accepted}"
            + source.format_choice()
        ) from None


# What to do with a dataset file past the upload limit (TEMPER_MAX_UPLOAD_BYTES: here, and in the web app's refusals
# as it is sent). Not "split it": a run trains on one file (data.train names one), so the parts would each train
# alone; Parquet holds the same rows compressed (the demo's SFT rows: 7 times smaller than their JSON Lines).
TOO_LARGE_REMEDY = ("convert it to Parquet (.parquet: compressed, often several times smaller than JSON Lines or CSV), "
                    "or ask an administrator to raise TEMPER_MAX_UPLOAD_BYTES")


def check_file(path: str | os.PathLike, *, fmt: FileFormat, max_bytes: int | None = None) -> None:
    """Whole-file checks before any row is read: size limit, empty file, binary content.

    Raises ``DatasetFormatError`` with codes ``too_large``, ``empty_file`` or ``binary``.
    """
    size = os.stat(path).st_size
    if max_bytes is not None and size > max_bytes:
        raise DatasetFormatError(
            Issue(
                code="too_large",
                message=f"the file is {_human_bytes(size)}, over the {_human_bytes(max_bytes)} limit; {TOO_LARGE_REMEDY}",
            )
        )
    if size == 0:
        raise DatasetFormatError(Issue(code="empty_file", message="the file is empty (0 bytes); give the file that holds the rows"))
    with open(path, "rb") as handle:
        head = handle.read(_SNIFF_BYTES)
    if fmt is FileFormat.PARQUET:
        if not head.startswith(b"PAR1"):
            raise DatasetFormatError(
                Issue(code="binary", message="this is not a Parquet file (it does not start with 'PAR1'); "
                      "check the file, or give it the extension of its real format")
            )
        return
    # A workbook (xlsx, ods) is a zip archive too, but "extract the dataset file from it" finds none in it.
    if head.startswith(b"PK\x03\x04") and (b"[Content_Types].xml" in head or b"mimetypeapplication/vnd.oasis" in head):
        raise DatasetFormatError(Issue(code="binary", message="this looks like a spreadsheet workbook (Excel or "
                                                              "OpenDocument): export the sheet as CSV (UTF-8) and "
                                                              "upload that file"))
    for magic, what in _MAGIC:
        if head.startswith(magic):
            raise DatasetFormatError(Issue(code="binary", message=f"this looks like {what}"))
    if _looks_utf16(head):
        raise DatasetFormatError(Issue(code="encoding", message="the file is UTF-16 text, not UTF-8: save it as UTF-8 "
                                                                "(a spreadsheet's \"CSV UTF-8\", or an editor's Save As "
                                                                "with the encoding UTF-8) and upload it again"))
    nul = head.find(b"\x00")
    if nul >= 0:
        raise DatasetFormatError(
            Issue(
                code="binary",
                message=f"the file contains binary data (a NUL byte at byte offset {nul}), not {fmt.value.upper()} "
                "text; give a UTF-8 text file",
                line=head.count(b"\n", 0, nul) + 1,
            )
        )


def _looks_utf16(head: bytes) -> bool:
    """UTF-16 text: its byte order mark, or (Latin text without one, as Windows tools write it) a NUL byte in
    every other place and none in the others."""
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return True
    sample = head[:64 - len(head[:64]) % 2]
    if len(sample) < 4:
        return False
    even, odd = sample[0::2], sample[1::2]
    return (even.count(0) == len(even) and odd.count(0) == 0) or (odd.count(0) == len(odd) and even.count(0) == 0)


def _human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("bytes", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{int(value)} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _counted(count: int, noun: str) -> str:
    """'1 cell', '3 cells': the nouns used here take a plain -s."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _encoding_issue(*, line: int, line_offset: int, file_offset: int, row: int | None = None) -> Issue:
    return Issue(
        code="encoding",
        message=f"not valid UTF-8 at byte offset {file_offset} of the file (byte {line_offset} of the line); "
        "save the file with UTF-8 encoding",
        line=line,
        row=row,
    )


# --------------------------------------------------------------------------------------------
# Readers: each yields RawRow for a record or Issue for a row-level problem, and raises
# DatasetFormatError for a problem that stops the reading.


def _line_too_long(raw: bytes, number: int, *, code: str) -> DatasetFormatError:
    if b"\r" in raw.rstrip(b"\r"):  # lines ended by CR alone read as one line
        return DatasetFormatError(_cr_line_endings(number))
    return DatasetFormatError(Issue(
        code=code, line=number,
        message=f"this line is over {_human_bytes(MAX_LINE_BYTES)}, more than Temper reads as one line: split it "
                "into rows of their own, or check that the file's lines end with line breaks"))


def iter_rows(path: str | os.PathLike, *, fmt: FileFormat,
              source: DataSource = WEB_UPLOAD) -> Iterator[RawRow | Issue]:
    """Stream the records of a file. Run ``check_file`` first for size/empty/binary checks."""
    if FileFormat(fmt) is FileFormat.JSONL:
        return _iter_jsonl(Path(path), source=source)
    if FileFormat(fmt) is FileFormat.JSON:
        return _iter_json_array(Path(path), source=source)
    if FileFormat(fmt) is FileFormat.CSV:
        return _iter_csv(Path(path), source=source)
    return _iter_parquet(Path(path))


def _iter_jsonl(path: Path, *, source: DataSource = WEB_UPLOAD) -> Iterator[RawRow | Issue]:
    """One JSON object per line; blank lines are skipped (they count as lines, not rows)."""
    with open(path, "rb") as handle:
        offset = 0
        line_number = 0
        row = 0
        loads, readline = orjson.loads, handle.readline
        # The line limit is read here, not through a generator of lines: its step was 0.3 us a line, a third of
        # the readline's.
        while raw := readline(MAX_LINE_BYTES + 1):
            line_start = offset
            offset += len(raw)
            line_number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise _line_too_long(raw, line_number, code="json")
            if line_start == 0 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            try:
                value = loads(raw)
            except orjson.JSONDecodeError as exc:
                if not raw.strip():
                    continue
                if row == 0 and raw.lstrip().startswith(b"["):
                    raise DatasetFormatError(_json_array_as_jsonl(line_number, source)) from None
                if row == 0 and _ends_lines_with_cr(raw):
                    raise DatasetFormatError(_cr_line_endings(line_number)) from None
                if row == 0 and raw.strip() == b"{":
                    raise DatasetFormatError(_indented_jsonl(line_number)) from None
                if row == 0 and (csv_header := _csv_header_line(raw)) is not None:
                    raise DatasetFormatError(_csv_as_json(csv_header, line_number, source)) from None
                row += 1
                yield _jsonl_issue(raw, exc, line=line_number, row=row, file_offset=line_start)
                continue
            # A list of messages is one chat, a row of its own (check_record says how to write it), not an array.
            if (row == 0 and type(value) is list and value and all(type(element) is dict for element in value)
                    and not all("role" in element for element in value)):
                raise DatasetFormatError(_json_array_as_jsonl(line_number, source))
            row += 1
            if _keys_repeat(raw, value) and (repeated := _repeated_key_in_line(raw)) is not None:
                yield _repeated_key_issue(repeated, line=line_number, row=row)
                continue
            yield RawRow(row=row, line=line_number, value=value)


def _keys_repeat(raw: bytes, value: Any) -> bool:
    """Whether a JSONL line, parsed as ``value``, gives a key twice: its text holds more quotes than two for each
    text of ``value`` (its keys too, at every depth), a key given twice and its value being texts of the line that
    the parsed row no longer holds. A line that has a backslash has its escaped quotes left out of the count (its
    escaped backslashes taken out first, so that each backslash left escapes the byte after it), so JSON held in a
    text, as tool calls' arguments are, is not parsed again. One ``bytes.count`` of the line and a walk of the
    row; a line that does is parsed again to name the key (``_repeated_key_in_line``)."""
    texts = _text_count(value)
    quotes = raw.count(b'"')
    if quotes != 2 * texts and b"\\" in raw:
        text = raw.replace(b"\\\\", b"")
        quotes = text.count(b'"') - text.count(b'\\"')
    return quotes != 2 * texts


def _text_count(value: Any) -> int:
    """The texts in ``value``, the keys of every object included; a loop, not recursion: orjson reads 1024 levels
    of nesting."""
    count, pending = 0, [value]
    while pending:
        item = pending.pop()
        if type(item) is dict:
            count += len(item)
            item = item.values()
        elif type(item) is not list:
            count += type(item) is str
            continue
        for child in item:
            if type(child) is str:
                count += 1
            elif type(child) is dict or type(child) is list:
                pending.append(child)
    return count


class _KeysRepeated(dict):
    """An object of the file that named a key twice (``repeated``: those keys); JSON readers keep the last value."""

    repeated: list[str]


def _pairs_to_object(pairs: list[tuple[str, Any]]) -> dict:
    value = dict(pairs)
    if len(value) == len(pairs):
        return value
    marked = _KeysRepeated(value)
    seen: set[str] = set()
    marked.repeated = [key for key, _ in pairs if key in seen or seen.add(key)]
    return marked


def _repeated_key(value: Any) -> tuple[str | None, str] | None:
    """(where, key) of the first object in ``value`` parsed with ``_pairs_to_object`` that named a key twice:
    ``where`` is None for the row itself, else the dotted path of the object ("messages[0]")."""
    pending: list[tuple[str | None, Any]] = [(None, value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, _KeysRepeated):
            return path, item.repeated[0]
        if type(item) is dict:
            pending.extend((key if path is None else f"{path}.{key}", child) for key, child in reversed(item.items()))
        elif type(item) is list:
            pending.extend((f"{path or ''}[{index}]", child) for index, child in reversed(list(enumerate(item))))
    return None


def _repeated_key_in_line(raw: bytes) -> tuple[str | None, str] | None:
    try:
        return _repeated_key(json.loads(raw, object_pairs_hook=_pairs_to_object))
    except RecursionError:  # json recurses where orjson, which read the row, does not; such a row is left as read
        return None


def _repeated_key_issue(repeated: tuple[str | None, str], *, line: int | None, row: int) -> Issue:
    where, key = repeated
    return Issue(code="duplicate_key", line=line, row=row, field=key if where is None else where,
                 message=f"the {'row' if where is None else 'object'} gives the key '{key}' twice, and JSON readers "
                         "keep only its last value: remove one of them (or rename it)")


def _ends_lines_with_cr(raw: bytes) -> bool:
    """Whether a line that failed to parse is whole lines ended by CR alone: its text up to the first CR parses."""
    cut = raw.find(b"\r")
    if cut < 0 or not raw[cut:].strip():
        return False
    try:
        orjson.loads(raw[:cut])
    except orjson.JSONDecodeError:
        return False
    return True


def _cr_line_endings(line: int) -> Issue:
    # Read by LF, such a file was one line: "broken JSON ... Extra data", or the csv module's "new-line character
    # seen in unquoted field - do you need to open the file in universal-newline mode?".
    return Issue(code="line_endings", line=line,
                 message="the lines of this file end with a carriage return (CR) alone, an old Mac line ending: "
                         "save it again with LF (or CRLF) line endings")


def _csv_header_line(raw: bytes) -> str | None:
    """The first line of a file read as JSON, when it is no JSON but a CSV header row's text (names separated by
    commas, tabs or semicolons, perhaps quoted; no JSON object or array, comment or YAML); else None."""
    try:
        text = raw.removeprefix(codecs.BOM_UTF8).decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    if (not text or text[0] in "{[/#" or ":" in text  # JSON gone wrong, a comment, YAML
            or not any(separator in text for separator in ",\t;")):
        return None
    return text


def _csv_as_json(header: str, line: int, source: DataSource) -> Issue:
    # Read as JSON Lines, each line of a CSV file was "broken JSON at column 1: Expecting value", and as a .json array
    # "it starts with 'p'": JSON under a .csv name was named as such, CSV under a JSON name was not.
    shown = header if len(header) <= 80 else header[:80] + "…"
    return Issue(code="json", line=line, message=f"the first line is not JSON but looks like the header row of a CSV "
                                                 f"file ('{shown}'): {source.csv_format()}")


def _indented_jsonl(line: int) -> Issue:
    # Read line by line, rows written with an indent were a "broken JSON" problem for each of their lines ("Expecting
    # property name enclosed in double quotes", "Extra data", ...), each counted as a row, and nothing said why.
    return Issue(code="json", line=line,
                 message="this line holds only '{', the start of an object written over several lines (indented, "
                         "as json.dump(row, file, indent=2) writes it): a JSON Lines file holds each row whole on one "
                         "line; write each row with json.dumps(row) and a line break, with no indent, and upload it "
                         "again")


def _json_array_as_jsonl(line: int, source: DataSource) -> Issue:
    # Read line by line, an array gave a "broken JSON" problem for each of its lines (or, on one line,
    # "a row that is not an object"), and nothing said that the whole file was one array.
    return Issue(code="json", line=line,
                 message="the file is one JSON array (the layout of a .json file), not one JSON object per line: "
                         + source.json_format())


# orjson refuses values nested deeper than 1024 levels; the json module (the JSON array reader, and the
# wording of a broken line's message) recurses until Python's recursion limit and raises RecursionError,
# which is no JSONDecodeError: uncaught, it ended the whole check (a web upload stayed "validating").
_TOO_DEEP = ("lists or objects nested more than 1024 levels deep, which cannot be read; flatten this row's "
             "values")


class _UnreadableNumber(ValueError):
    """A number Python's json reads and orjson (the JSONL reader, and every row's digest) does not: NaN, Infinity,
    -Infinity, or one past a float's range; ``message`` says what to write."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _refuse_constant(constant: str) -> Any:
    raise _UnreadableNumber(f"{constant} is not a JSON value (JSON has no NaN or Infinity): write null, or the value "
                            "as text in quotes")


def _json_int(text: str) -> int | float:
    """An integer as orjson reads it: exact within 64 bits, else a float. Python's int() refuses over 4,300
    digits, and orjson writes no integer past 64 bits."""
    if len(text) <= 20 and -2**63 <= (value := int(text)) < 2**64:
        return value
    if math.isinf(number := float(text)):
        raise _UnreadableNumber(f"a number of {len(text.lstrip('-')):,} digits, past what a number can hold: write it "
                                "as text in quotes")
    return number


def _jsonl_issue(raw: bytes, exc: Exception, *, line: int, row: int, file_offset: int) -> Issue:
    if raw.startswith(codecs.BOM_UTF8):  # the first line's is dropped before parsing
        return Issue(code="json", line=line, row=row,
                     message="this line starts with a byte order mark (BOM), which only a file's first line may have: "
                             "the file may be several files joined together; remove the BOM")
    nul = raw.find(b"\x00")
    if nul >= 0:
        return Issue(
            code="binary",
            message=f"binary data (a NUL byte at byte {nul} of the line); the file must be UTF-8 JSON text",
            line=line,
            row=row,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as decode_error:
        return _encoding_issue(
            line=line, row=row, line_offset=decode_error.start, file_offset=file_offset + decode_error.start
        )
    if "depth limit exceeded" in str(exc):
        return Issue(code="json", message=_TOO_DEEP, line=line, row=row)
    try:
        # Without its line break: a line cut short would otherwise be reported at column 1 of
        # "line 2", the parser having skipped the break as whitespace before running out of text.
        json.loads(text.rstrip("\r\n"), parse_constant=_refuse_constant, parse_int=_json_int)
    except _UnreadableNumber as number:
        return Issue(code="json", message=number.message, line=line, row=row)
    except RecursionError:
        return Issue(code="json", message=_TOO_DEEP, line=line, row=row)
    except json.JSONDecodeError as json_error:
        return Issue(
            code="json",
            message=f"broken JSON at column {json_error.colno}: {_json_reason(json_error)}; each line must be one JSON "
                    "object",
            line=line,
            row=row,
        )
    # orjson is stricter than json in a few corners (e.g. NaN, huge integers, a lone surrogate).
    if "surrogate" in str(exc) and isinstance(exc, json.JSONDecodeError):
        return Issue(code="json", message=f"broken JSON at column {exc.colno}: {LONE_SURROGATE}", line=line, row=row,
                     field=_field_with_lone_surrogate(json.loads(text)))
    return Issue(code="json", message=f"broken JSON: {exc}; each line must be one JSON object", line=line, row=row)


# orjson refuses a lone surrogate escape ("\ud83d" without its "\ude00") and the json module reads it into a str that
# cannot be written as UTF-8: "no low surrogate in string: line 1 column 13 (char 12); each line must be one JSON
# object", or in a .json file "str is not valid UTF-8: surrogates not allowed" with advice for another type.
LONE_SURROGATE = ("half of a character (a lone UTF-16 surrogate: a \\ud800-\\udfff escape without its other half, as "
                  "text cut inside an emoji leaves): remove it, or write the whole character")


def _loads_with_lone_surrogates(text: str | bytes) -> Any:
    """``text`` as JSON, a lone surrogate escape read as the json module reads it (into a str that cannot be written
    as UTF-8) where orjson refuses it: the caller then finds the value and names the field holding it
    (``_field_with_lone_surrogate``), where the text had been taken for something else (a .json file's first line for
    no row, a CSV cell for no list). A ValueError for other broken JSON."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as error:
        if "surrogate" not in str(error):
            raise
        return json.loads(text)


def _holds_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _field_with_lone_surrogate(row: Any) -> str | None:
    """The first key of ``row`` whose value holds a lone surrogate, if ``row`` is an object with one."""
    if type(row) is not dict:
        return None
    return next((key for key, value in row.items() if _holds_lone_surrogate(value)), None)


def _iter_json_array(path: Path, *, source: DataSource = WEB_UPLOAD) -> Iterator[RawRow | Issue]:
    """Elements of a top-level JSON array, parsed one at a time from a text buffer that grows
    only as far as the element being parsed needs; or of the array an object holds under its one key
    (``{"data": [...]}``); or, for a .json file that holds JSON Lines, its lines."""
    if _holds_json_lines(path):
        yield from _iter_jsonl(path, source=source)
        return
    with open(path, "rb") as handle:
        if (csv_header := _csv_header_line(handle.readline(_SNIFF_BYTES))) is not None:
            raise DatasetFormatError(_csv_as_json(csv_header, 1, source))
        handle.seek(0)
        yield from _JsonArrayReader(_DecodedChunks(handle)).rows()


# Hugging Face's Dataset.to_json writes JSON Lines whatever the file's extension, and pandas' to_json(lines=True)
# too: such a .json file was refused for starting with '{'. One line alone is read as a JSON document (json.dump
# writes one line), so that {"data": [...]} and pandas' other layouts get their own answer, unless it is one row
# (``_one_row``).
def _holds_json_lines(path: Path) -> bool:
    """Whether a .json file holds one object per line: its first line is a whole object and more lines follow, or it
    is the file's one line and a row."""
    with open(path, "rb") as handle:
        if not handle.read(_SNIFF_BYTES).removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"{"):
            return False  # an array: its first line, perhaps the whole file, is not read here
        handle.seek(0)
        first = handle.readline(MAX_JSON_ELEMENT_CHARS).removeprefix(codecs.BOM_UTF8).strip()
        if not first.startswith(b"{"):
            return False
        try:
            value = _loads_with_lone_surrogates(first)
        except (ValueError, RecursionError):  # an object over several lines, or cut at the limit
            return False
        while line := handle.readline(MAX_LINE_BYTES):  # bounded: the next line may be a 2 GB one
            if line.strip():
                return True
        return _one_row(value)


def _one_row(value: Any) -> bool:
    """Whether a .json file's one line, an object, is one row (as ``json.dump(row, f)`` writes it, and Hugging Face's
    loader reads it), not a document holding rows: none of its values is an object (pandas' to_json layouts) or a
    list of anything but messages (``{"data": [...]}``, pandas' orient="split"). Such a file was refused as "an object
    whose first key, 'prompt', holds a string, not a list of rows"."""
    return type(value) is dict and bool(value) and all(
        type(item) is not dict and (type(item) is not list or (item and all(
            type(message) is dict and "role" in message for message in item)))
        for item in value.values())


_WRAPPER_ADVICE = ("; a .json dataset is one array of rows ([{...}, {...}]), or an object whose one key holds that "
                   "array ({\"data\": [{...}, {...}]}): save the list of rows alone, or as JSON Lines (.jsonl)")


_VALUE_STARTS = {"{": ("an object", "objects"), "[": ("a list", "lists"), '"': ("a string", "strings"),
                 "t": ("a boolean", "booleans"), "f": ("a boolean", "booleans"), "n": ("null", "nulls")}


class _JsonArrayReader:
    def __init__(self, chunks: _DecodedChunks):
        self._chunks = chunks
        self._decoder = json.JSONDecoder(object_pairs_hook=self._pairs_to_object, parse_constant=_refuse_constant,
                                         parse_int=_json_int)
        self._keys_repeated = False
        self._buffer = chunks.read()
        self._position = 0
        self._line = 1  # line number at self._position
        # Characters of the buffer's first line that were read before the buffer starts (dropped by _fill): a
        # column is counted from its line's start, which may lie in a chunk already dropped.
        self._line_chars_dropped = 0

    def rows(self) -> Iterator[RawRow | Issue]:
        if self._buffer.startswith("\ufeff"):
            self._position = 1
        self._skip_whitespace()
        if self._peek() == "":
            raise DatasetFormatError(Issue(code="empty_file", message="the file holds only spaces and blank lines; "
                                                                      "give the file that holds the rows"))
        # {"data": [...]}, as Hugging Face's JSON loader reads with field="data": the rows are the array it holds.
        wrapper = self._open_wrapper() if self._peek() == "{" else None
        if self._peek() != "[":
            found = self._peek() or "nothing"
            raise self._broken(
                f"a .json dataset must be one array of objects ([{{...}}, {{...}}]) but it starts with {found!r}; "
                "for one object per line use a .jsonl file"
            )
        self._position += 1
        self._skip_whitespace()
        if wrapper is not None and self._peek() not in ("{", "]"):
            raise self._broken(f"the file is an object whose first key, '{wrapper}', holds a list of "
                               f"{self._peek_type()[1]}, not of rows (objects)" + _WRAPPER_ADVICE)
        row = 0
        if self._peek() == "]":
            self._position += 1
        else:
            comma_line = None  # the line of the comma before the element to read
            while True:
                self._skip_whitespace()
                if comma_line is not None and self._peek() == "]":
                    raise DatasetFormatError(Issue(
                        code="json", line=comma_line,
                        message=f"a comma follows the last element of the JSON array (element {row}), and JSON "
                                "allows none there: remove it"))
                line = self._line
                value = self._parse_element(row + 1)
                row += 1
                if self._keys_repeated and (repeated := _repeated_key(value)) is not None:
                    self._keys_repeated = False
                    yield _repeated_key_issue(repeated, line=line, row=row)
                else:
                    yield RawRow(row=row, line=line, value=value)
                self._skip_whitespace()
                separator = self._peek()
                comma_line = self._line
                if separator == "":
                    raise self._broken("the JSON array is not closed with ']'; the file may be cut short")
                self._position += 1
                if separator == "]":
                    break
                if separator != ",":
                    raise self._broken(f"expected ',' or ']' after element {row} of the JSON array, found {separator!r}")
        self._skip_whitespace()
        if wrapper is not None:
            if self._peek() != "}":
                raise self._broken(f"the object holds more keys after '{wrapper}', the list of its rows" + _WRAPPER_ADVICE)
            self._position += 1
            self._skip_whitespace()
        if self._peek():
            raise self._broken("unexpected text after the closing ']' of the JSON array; a .json file holds one array")

    def _open_wrapper(self) -> str:
        """Read ``{"key":`` up to the value; a value that is no array is refused, naming the key."""
        self._position += 1
        self._skip_whitespace()
        if self._peek() != '"':
            raise self._broken("the file is an object with no keys" + _WRAPPER_ADVICE)
        key = self._parse_element(0)
        self._skip_whitespace()
        if self._peek() != ":":
            raise self._broken(f"expected ':' after the key '{key}' of the file's object, found {self._peek()!r}")
        self._position += 1
        self._skip_whitespace()
        if self._peek() != "[":
            holds = self._peek_type()[0]
            hint = (": if it is pandas' to_json output, write it with orient='records' (and lines=True for JSON "
                    "Lines)" if holds == "an object" else "")
            raise self._broken(f"the file is an object whose first key, '{key}', holds {holds}, not a list of "
                               f"rows{hint}" + _WRAPPER_ADVICE)
        return key

    def _peek_type(self) -> tuple[str, str]:
        """The type of the value at the reading position, told by its first character: ("a string", "strings")."""
        return _VALUE_STARTS.get(self._peek(), ("a number", "numbers"))

    def _pairs_to_object(self, pairs: list[tuple[str, Any]]) -> dict:
        value = dict(pairs)
        if len(value) == len(pairs):
            return value
        self._keys_repeated = True
        return _pairs_to_object(pairs)

    def _peek(self) -> str:
        return self._buffer[self._position:self._position + 1]

    def _fill(self) -> bool:
        """Append the next chunk, dropping what was already consumed; False at the end of the file."""
        text = self._chunks.read()
        if not text:
            return False
        dropped = self._buffer[:self._position]
        line_break = dropped.rfind("\n")
        self._line_chars_dropped = (self._line_chars_dropped + len(dropped) if line_break < 0
                                    else len(dropped) - line_break - 1)
        self._buffer = self._buffer[self._position:] + text
        self._position = 0
        return True

    def _skip_whitespace(self) -> None:
        if self._buffer[self._position:self._position + 1] not in _JSON_WHITESPACE:
            return  # the usual case, as after an element and before its comma: nothing to skip
        while True:
            end = _WHITESPACE.match(self._buffer, self._position).end()
            self._line += self._buffer.count("\n", self._position, end)
            self._position = end
            if end < len(self._buffer) or not self._fill():
                return

    def _parse_element(self, row: int) -> Any:
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buffer, self._position)
            except RecursionError:
                raise DatasetFormatError(Issue(code="json", message=_TOO_DEEP, line=self._line, row=row)) from None
            except _UnreadableNumber as number:
                raise DatasetFormatError(Issue(code="json", message=number.message, line=self._line, row=row)) from None
            except json.JSONDecodeError as exc:
                # The element may run past the buffer: read more and retry, up to a size limit.
                maybe_cut = exc.pos >= len(self._buffer) - 16 or exc.msg.startswith("Unterminated string")
                if maybe_cut and len(self._buffer) - self._position < MAX_JSON_ELEMENT_CHARS and self._fill():
                    continue
                line = self._line + self._buffer.count("\n", self._position, exc.pos)
                line_break = self._buffer.rfind("\n", 0, exc.pos)
                column = exc.pos - line_break + (self._line_chars_dropped if line_break < 0 else 0)
                raise DatasetFormatError(
                    Issue(code="json", message=f"broken JSON at column {column}: {_json_reason(exc)}; fix this element "
                          "(elements over 64 MB are not supported)", line=line, row=row)
                ) from None
            self._line += self._buffer.count("\n", self._position, end)
            self._position = end
            return value

    def _broken(self, message: str) -> DatasetFormatError:
        return DatasetFormatError(Issue(code="json", message=message, line=self._line))


class _DecodedChunks:
    """Reads an open binary file as UTF-8 text in chunks, naming the line and byte offset of a bad byte."""

    def __init__(self, handle):
        self._handle = handle
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._bytes_read = 0
        self._newlines = 0
        self._line_start = 0  # file offset where the line being read starts

    def read(self) -> str:
        """The next chunk of text; an empty string only at the end of the file."""
        while True:
            data = self._handle.read(_JSON_CHUNK_BYTES)
            text = self._decode(data)
            # A chunk of only the start of a multi-byte character decodes to nothing yet.
            if text or not data:
                return text

    def _decode(self, data: bytes) -> str:
        pending = self._decoder.getstate()[0]
        try:
            text = self._decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            # exc.start indexes pending + data; the pending bytes (never a newline) came before this chunk.
            combined = pending + data
            base = self._bytes_read - len(pending)
            last_newline = combined.rfind(b"\n", 0, exc.start)
            line_start = base + last_newline + 1 if last_newline >= 0 else self._line_start
            raise DatasetFormatError(
                _encoding_issue(
                    line=self._newlines + combined.count(b"\n", 0, exc.start) + 1,
                    line_offset=base + exc.start - line_start,
                    file_offset=base + exc.start,
                )
            ) from None
        if b"\n" in data:
            self._newlines += data.count(b"\n")
            self._line_start = self._bytes_read + data.rfind(b"\n") + 1
        self._bytes_read += len(data)
        return text


def _decoded_lines(handle) -> Iterator[str]:
    """The lines of a binary file as text, each with its line ending; a line past ``MAX_LINE_BYTES`` stops the
    reading (a ``csv`` Issue naming its number) before more of it is read."""
    offset = 0
    number = 0
    readline = handle.readline
    while raw := readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise _line_too_long(raw, number, code="csv")
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8):]
            offset += len(codecs.BOM_UTF8)
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetFormatError(
                _encoding_issue(line=number, line_offset=exc.start, file_offset=offset + exc.start)
            ) from None
        offset += len(raw)


_CONTROL_NAMES = {"\t": ("a tab", "\\t"), "\n": ("a line break", "\\n"), "\r": ("a carriage return", "\\r")}


def _json_reason(error: json.JSONDecodeError) -> str:
    """json's reason without its dangling "starting at" (the column says where); a control character
    ("Invalid control character at") named, with the escape JSON wants for it."""
    if error.msg == "Invalid control character at" and error.pos < len(error.doc):
        character = error.doc[error.pos]
        if character == "\x00":  # escaped, it is refused as binary data (_check_no_nul): no text needs one
            return "a NUL character inside a string, which is binary data, not text: remove it"
        name, escape = _CONTROL_NAMES.get(character, ("", f"\\u{ord(character):04x}"))
        shown = f"U+{ord(character):04X} ({name})" if name else f"U+{ord(character):04X}"
        return f"a control character, {shown}, inside a string: JSON allows it there only as the escape {escape}"
    return error.msg.removesuffix(" starting at")


def _iter_csv(path: Path, *, source: DataSource = WEB_UPLOAD) -> Iterator[RawRow | Issue]:
    """CSV rows as dicts keyed by the header; every value is a string."""
    first_line = 1  # the line the row being read starts on
    previous_limit = csv.field_size_limit(MAX_CSV_CELL_CHARS)
    with open(path, "rb") as handle:
        # strict: a quote left open, or text after a closing quote, is an error, not cells silently joined
        # The reader's line_num, the lines it has read, is the line a problem it raises is on.
        reader = csv.reader(_decoded_lines(handle), strict=True)
        header = None
        try:
            # Blank lines before the header are skipped as they are between rows: read as the header, they
            # made it an empty list, and a file of blank lines stopped the check with an IndexError.
            while header is None or _blank_csv_row(header):
                header = next(reader, None)
                if header is None:
                    raise DatasetFormatError(Issue(code="empty_file", message="the CSV file holds only spaces and "
                                                   "blank lines: give the file that holds the header row and rows"))
            header_line = reader.line_num
            header = [name.strip() for name in header]
            if header[0].startswith(("{", "[")):
                # JSON saved under a .csv name: every row was otherwise "missing" its fields, with no word of why.
                raise DatasetFormatError(_json_not_csv(header[0], line=header_line, source=source))
            _check_other_separator(header, line=header_line)
            _check_csv_header(header, line=header_line)
            row = 0
            while True:
                first_line = reader.line_num + 1
                cells = next(reader, None)
                if cells is None:
                    return
                # A line of commas alone is a spreadsheet's empty row under its table, blank as an empty line is
                # (each of its cells was otherwise "an empty string" of a row the user never wrote); the first cell is
                # looked at alone first: it is rarely empty.
                if not cells or (not cells[0].strip() and _blank_csv_row(cells)):
                    continue
                row += 1
                if len(cells) != len(header):
                    yield Issue(
                        code="ragged_row",
                        message=f"this row has {_counted(len(cells), 'cell')} but the header has "
                        f"{_counted(len(header), 'column')}; "
                        "quote cells that contain commas or line breaks",
                        line=first_line,
                        row=row,
                    )
                    continue
                # Silently, it was a row of data. Its first cell is compared alone first: it rarely is the header's.
                if cells[0].strip() == header[0] and [cell.strip() for cell in cells] == header:
                    yield Issue(code="csv_header", line=first_line, row=row,
                                message="this row repeats the header row: the file may be several CSV files joined "
                                        "together; remove the repeated header")
                    continue
                yield RawRow(row=row, line=first_line, value=dict(zip(header, cells)))
        except csv.Error as exc:
            # Compact JSON (JSON.stringify, jq -c: no space after a comma) trips the reader inside its first line,
            # before it is a header to look at: it was told to fix its quoting, as a CSV file.
            if (header is None or _blank_csv_row(header)) and (opening := _json_opening(path)):
                raise DatasetFormatError(_json_not_csv(opening, line=reader.line_num, source=source)) from None
            raise DatasetFormatError(_csv_issue(exc, first_line=first_line, line=reader.line_num)) from None
        finally:  # the limit is the process's: other readers of CSV keep theirs
            csv.field_size_limit(previous_limit)


def _json_not_csv(first_text: str, *, line: int, source: DataSource) -> Issue:
    """JSON read as CSV, its first line starting with ``first_text``: an object opens JSON Lines, an array a .json
    file's one array."""
    if first_text.startswith("["):
        return Issue(code="csv_header", line=line, message="the first line is JSON, not a CSV header row: the file "
                                                           f"looks like a JSON array; {source.json_format()}")
    return Issue(code="csv_header", line=line, message="the first line is JSON, not a CSV header row: the file looks "
                                                       f"like JSON Lines; {source.jsonl_format()}")


def _json_opening(path: Path) -> str:
    """The '{' or '[' that opens the file's first text, past a byte order mark, spaces and blank lines; "" when no
    JSON object or array opens it."""
    with open(path, "rb") as handle:
        start = handle.read(4096).removeprefix(codecs.BOM_UTF8).lstrip()
    return start[:1].decode() if start.startswith((b"{", b"[")) else ""


def _blank_csv_row(cells: list[str]) -> bool:
    """A blank line, or one of only spaces, or of commas alone (a spreadsheet's empty row)."""
    return not any(cell.strip() for cell in cells)


def _csv_issue(error: csv.Error, *, first_line: int, line: int) -> Issue:
    reason = str(error)
    if reason == "unexpected end of data":
        return Issue(code="csv", line=first_line,
                     message='a quoted cell that opens on this line is never closed: add its closing " '
                             '(a " inside a quoted cell is written "")')
    if reason.startswith("field larger than field limit"):
        return Issue(code="csv", line=first_line,
                     message=f"a cell of the row that starts on this line is over {MAX_CSV_CELL_CHARS:,} characters, "
                             "more than Temper reads from one CSV cell: shorten it, or check for a quote (\") that "
                             "is never closed")
    if reason.startswith("new-line character seen in unquoted field"):
        if line == 1:
            return _cr_line_endings(line)
        return Issue(code="csv", line=line,
                     message="a cell holds a carriage return (CR) outside quotes: quote the cells that hold line "
                             "breaks, or remove the CR")
    if reason.endswith("expected after '\"'"):
        return Issue(code="csv", line=line,
                     message='text follows the closing " of a quoted cell: quote the whole cell and write each " '
                             'inside it as ""')
    return Issue(code="csv", message=f"unreadable CSV: {error}; check the quoting", line=line)


_OTHER_SEPARATORS = ((";", "semicolons"), ("\t", "tabs"), ("|", "vertical bars"))


def _check_other_separator(header: list[str], *, line: int) -> None:
    """A file separated by semicolons (a spreadsheet's CSV in many locales) or tabs reads as one column;
    every row was then reported missing each of its kind's fields, twice a row for sft."""
    if len(header) != 1:
        return
    for separator, name in _OTHER_SEPARATORS:
        if separator in header[0]:
            raise DatasetFormatError(Issue(
                code="csv_header", line=line,
                message=f"the header row is one column, '{header[0]}': the file looks separated by {name}, and a "
                        "CSV file must be separated by commas; export it again with commas as the separator (or as "
                        "JSON Lines)"))


def _check_csv_header(header: list[str], *, line: int) -> None:
    seen: set[str] = set()
    named = len(header)
    while named and not header[named - 1]:
        named -= 1
    for index, name in enumerate(header, start=1):
        if not name and index == len(header) > 1:
            raise DatasetFormatError(Issue(
                code="csv_header", line=line,
                message=f"the header row ends with a comma, which makes an empty column {index} with no name; remove "
                        "the commas at the ends of the lines (or name the column)"))
        if not name and index > named > 0:  # a spreadsheet's empty columns at the right of its table
            raise DatasetFormatError(Issue(
                code="csv_header", line=line,
                message=f"the header row ends with {len(header) - named} commas, which make empty columns {index} to "
                        f"{len(header)} with no name; remove the commas at the ends of the lines (or name the "
                        "columns)"))
        if not name:
            raise DatasetFormatError(
                Issue(code="csv_header", message=f"column {index} of the header row has no name; name every column",
                      line=line)
            )
        if name in seen:
            raise DatasetFormatError(
                Issue(code="csv_header", message=f"the header names column '{name}' twice; column names must be unique",
                      line=line)
            )
        seen.add(name)


# Parquet packs data in ways a byte count does not bound: a long value stored once in a column's dictionary
# and named by every row, a page of one letter that zstd shrinks 30,000 times, a list of millions of nulls
# in run-length encoded levels. A file of 1 KiB could unpack to gigabytes in the validating worker's memory.
# Before a page is read, a column chunk is refused that unpacks to over PARQUET_PACKED_BYTES at more than
# PARQUET_MAX_RATIO times its stored size (real text compresses up to ~200 times with zstd, when every row
# repeats a long instruction; this bounds a dictionary's values too), or whose values outnumber its rows by
# more than that many times its size. Rows are read PARQUET_BATCH_ROWS at a time (slower than 1,024 at a
# time, still far faster than the checks of each row); a batch that would take over PARQUET_BATCH_BYTES as
# Python values (a dictionary column read as such counted unpacked) is refused before it becomes them, as is
# a file whose rows together would take over PARQUET_MAX_RATIO times its size (hours of checks).
PARQUET_BATCH_ROWS = 16
PARQUET_BATCH_BYTES = 256 * 1024 * 1024
PARQUET_PACKED_BYTES = 16 * 1024 * 1024
PARQUET_MAX_RATIO = 1024
_VALUE_BYTES = 16  # what a value costs as a Python object beyond its text, roughly: a None, an int, a pointer


def _text_type(kind) -> bool:
    import pyarrow

    return any(check(kind) for check in (pyarrow.types.is_string, pyarrow.types.is_large_string,
                                          pyarrow.types.is_binary, pyarrow.types.is_large_binary))


def _unpacked_bytes(array) -> int:
    """What ``array`` (a batch's column) takes as Python values, roughly: the bytes of every text and binary
    value, each repeat of a dictionary entry counted (a file written from Arrow reads back its dictionary
    columns as such), plus ``_VALUE_BYTES`` a value at every level of nesting."""
    import pyarrow
    import pyarrow.compute

    kind, own = array.type, len(array) * _VALUE_BYTES
    if pyarrow.types.is_dictionary(kind):
        if not _text_type(kind.value_type):
            return own
        lengths = pyarrow.compute.binary_length(array.dictionary).take(array.indices)
        return own + (pyarrow.compute.sum(lengths).as_py() or 0)
    if _text_type(kind):
        return own + (pyarrow.compute.sum(pyarrow.compute.binary_length(array)).as_py() or 0)
    if any(check(kind) for check in (pyarrow.types.is_list, pyarrow.types.is_large_list,
                                     pyarrow.types.is_fixed_size_list, pyarrow.types.is_map)):
        return own + _unpacked_bytes(array.flatten())
    if pyarrow.types.is_struct(kind):
        return own + sum(_unpacked_bytes(field) for field in array.flatten())
    return own


def _parquet_packing_problem(parquet_file) -> str | None:
    metadata = parquet_file.metadata
    for group in range(metadata.num_row_groups):
        for column in range(metadata.num_columns):
            chunk = metadata.row_group(group).column(column)
            stored, unpacked = max(chunk.total_compressed_size, 1), chunk.total_uncompressed_size
            if unpacked > PARQUET_PACKED_BYTES and unpacked > PARQUET_MAX_RATIO * stored:
                return (f"column '{chunk.path_in_schema}' of row group {group + 1} unpacks to {_human_bytes(unpacked)} "
                        f"from {_human_bytes(stored)}, over {PARQUET_MAX_RATIO} times its size in the file; "
                        "re-export it without the repeats, or as JSONL")
            # A list's elements, nulls too, are run-length encoded levels: millions of them in a few bytes.
            rows = metadata.row_group(group).num_rows
            if chunk.num_values > rows + PARQUET_MAX_RATIO * stored:
                return (f"column '{chunk.path_in_schema}' of row group {group + 1} holds {chunk.num_values:,} values "
                        f"in {rows:,} row{'s' if rows != 1 else ''} from {_human_bytes(stored)}, over "
                        f"{PARQUET_MAX_RATIO} times its size in the file; re-export it without the repeats, "
                        "or as JSONL")
    return None


def _iter_parquet(path: Path) -> Iterator[RawRow | Issue]:
    """Parquet rows as dicts, a few at a time, within the limits above."""
    import pyarrow
    import pyarrow.parquet

    try:
        parquet_file = pyarrow.parquet.ParquetFile(path)
    except (pyarrow.ArrowInvalid, OSError) as exc:
        raise DatasetFormatError(
            Issue(code="parquet", message=f"unreadable Parquet file: {exc}; re-export it or use JSONL")
        ) from None
    # Rows are read as dicts: of two columns named alike, the last would stand for both without a word.
    seen: set[str] = set()
    for name in parquet_file.schema_arrow.names:
        if name in seen:
            raise DatasetFormatError(
                Issue(code="parquet", message=f"the file names column '{name}' twice; column names must be unique")
            )
        seen.add(name)
    if (problem := _parquet_packing_problem(parquet_file)) is not None:
        raise DatasetFormatError(Issue(code="parquet", message=problem))
    row, total, most = 0, 0, PARQUET_MAX_RATIO * path.stat().st_size + PARQUET_BATCH_BYTES
    try:
        for batch in parquet_file.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            unpacked = sum(_unpacked_bytes(column) for column in batch.columns)
            total += unpacked
            if total > most:
                raise DatasetFormatError(Issue(
                    code="parquet", row=row + 1,
                    message=f"the rows up to row {row + batch.num_rows} unpack to {_human_bytes(total)}, over "
                            f"{PARQUET_MAX_RATIO} times the file's size (a long value repeated from a column's "
                            "dictionary?); re-export it without the repeats, or as JSONL"))
            if unpacked > PARQUET_BATCH_BYTES:
                raise DatasetFormatError(Issue(
                    code="parquet", row=row + 1,
                    message=f"rows {row + 1} to {row + batch.num_rows} unpack to {_human_bytes(unpacked)}, over "
                            f"the {_human_bytes(PARQUET_BATCH_BYTES)} Temper reads {PARQUET_BATCH_ROWS} rows at a "
                            "time (a long value repeated from the column's dictionary?); re-export it without "
                            "the repeats, or as JSONL"))
            for value in batch.to_pylist():
                row += 1
                yield RawRow(row=row, line=None, value=value)
    except (pyarrow.ArrowInvalid, OSError) as exc:
        raise DatasetFormatError(
            Issue(code="parquet", message=f"unreadable Parquet data after row {row}: {exc}", row=row + 1)
        ) from None


# --------------------------------------------------------------------------------------------
# Record checks: turn a raw record into an example of the kind, or a list of problems.
# A problem is (field, code, message); the validator adds line and row.

Problem = tuple[str | None, str, str]
_MISSING = object()


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _missing(mapping: ColumnMapping, field_name: str, record: dict, need: str, source: DataSource) -> Problem:
    if mapping.column_for(field_name) in record:  # there, but null
        return (field_name, "missing_field",
                f"{mapping.describe(field_name)} is null: {need}; give it a value or drop the row")
    columns = ", ".join(f"'{name}'" for name in list(record)[:8]) or "none"
    wanted = mapping.column_for(field_name)
    if (near := next((name for name in record if type(name) is str and name.strip().casefold() == wanted.casefold()),
                     None)) is not None:
        # 'Prompt' beside 'prompt' was listed among the row's columns, the difference left to be spotted.
        return (field_name, "missing_field",
                f"missing {mapping.describe(field_name)}: {need}; this row has a column {near!r}, which differs from "
                f"{wanted!r} only in letter case or spaces: rename the column {wanted!r}, or map it "
                f"({source.mapping_place()})")
    if field_name in record:  # mapped elsewhere, its own column there: a mapping carried over from an older file
        return (field_name, "missing_field",
                f"missing {mapping.describe(field_name)}: {need}; this row has columns {columns}, and the row has a "
                f"column '{field_name}' itself: clear the mapping of '{field_name}' to read it "
                f"({source.mapping_place()})")
    if not mapping.columns and (where := _WHOLE_CONVERSATION_IN.get(mapping.kind)) and {"role", "content"} <= set(record):
        # A chat log written one turn a row (conversation_id, role, content) was told to map a column, which none is.
        return (field_name, "missing_field",
                f"missing {mapping.describe(field_name)}: {need}; this row has columns {columns}: one turn of a "
                f"conversation, where a row is a whole one: put each conversation's turns in {where}, as a JSON list "
                '([{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]), one row per '
                "conversation")
    if not mapping.columns and (other := _kind_of_row(record)) not in (None, mapping.kind):
        # Rows of another kind (preference pairs uploaded as sft) were told to map a column, which none of theirs is.
        return (field_name, "missing_field",
                f"missing {mapping.describe(field_name)}: {need}; this row has columns {columns}, the fields of the "
                f"{other} kind: {source.kind_advice(kind=mapping.kind, other=other)}")
    return (
        field_name,
        "missing_field",
        f"missing {mapping.describe(field_name)}: {need}; this row has columns {columns} "
        f"(map a differently named column to it: {source.mapping_place()})",
    )


# Where a kind holds a whole conversation, for a file written one turn a row.
_WHOLE_CONVERSATION_IN = {
    DatasetKind.SFT: "a 'messages' column",
    DatasetKind.PREFERENCE: "'chosen' and 'rejected' columns, each a whole conversation ending in its answer",
    DatasetKind.PROMPTS: "a 'prompt' column",
}


def _kind_of_row(record: dict) -> DatasetKind | None:
    """The kind whose fields a row has by their own names, if any: preference, then sft, then text."""
    if "chosen" in record and "rejected" in record:
        return DatasetKind.PREFERENCE
    if ("prompt" in record and "completion" in record) or "messages" in record:
        return DatasetKind.SFT
    if "text" in record:
        return DatasetKind.TEXT
    return None


def _check_string(value: Any, field_name: str, problems: list[Problem]) -> None:
    if type(value) is str:
        if not value or value.isspace():  # what strip() would leave empty, without copying the text
            problems.append((field_name, "empty_string", "is an empty string; give it text or drop the row"))
        elif "\x00" in value:
            _check_no_nul(value, field_name, problems)
    elif type(value) in (int, float, bool):
        # An answer of 42, or a label of true: read as text, it would be "42" and "true".
        shown = orjson.dumps(value).decode()
        problems.append((field_name, "wrong_type", f"must be a string, got {_json_type(value)}: write it as text, in "
                                                   f"quotes (\"{shown}\")"))
    else:
        problems.append((field_name, "wrong_type", f"must be a string, got {_json_type(value)}"))


def _is_plain_text(value: Any) -> bool:
    """Whether ``_check_string`` finds nothing to say of ``value``: a text, neither empty nor only spaces, no NUL."""
    return type(value) is str and value != "" and not value.isspace() and "\x00" not in value


def _check_no_nul(value: str, field_name: str, problems: list[Problem]) -> None:
    """A NUL character is binary data whether the file holds the byte (refused as the file is read) or
    JSON's escape \\u0000 (or Parquet's string) does: no text needs one, and PostgreSQL, where the web app
    stores a row's text (review items, run samples), stores none."""
    if (position := value.find("\x00")) >= 0:
        problems.append((field_name, "binary", f"holds a NUL character (\\u0000) at position {position + 1}, which is "
                                               "binary data, not text; remove it"))


# The start of a list of dicts as Python's repr writes it: [{'role': ...
_PYTHON_LIST_OF_DICTS = re.compile(r"\s*\[\s*\{\s*'")


def _check_messages(value: Any, field_name: str, problems: list[Problem]) -> bool:
    """Check a chat; returns whether it has an assistant turn."""
    if type(value) is not list:
        got = _json_type(value)
        if _holds_json_list(value):
            got = ("a string that holds one as JSON text: store the list itself (decode it with json.loads before "
                   "saving the file)")
        elif type(value) is str and _PYTHON_LIST_OF_DICTS.match(value):
            got = ("a string that holds one as Python writes it (single quotes, as pandas' to_csv saves a list), not "
                   "JSON: write the cell with json.dumps, or save the file as JSONL or Parquet")
        elif (type(value) is str and value.lstrip().startswith("[")
              and type(broken := _cell_json(value)) is _BrokenCell):
            # A CSV cell that was meant as a chat's JSON (_maybe_chat read it as text): where its JSON breaks.
            problems.append((field_name, "wrong_type",
                             f"{broken.reason}; write the chat as a JSON list of {{role, content}} messages"))
            return False
        problems.append((field_name, "wrong_type", f"must be a list of {{role, content}} messages, got {got}"))
        return False
    if not value:
        problems.append((field_name, "empty_messages", "is an empty list; a chat needs at least one message"))
        return False
    has_assistant = False
    for index, message in enumerate(value):
        # Most turns are a role of the three and a text, nothing else: passed without building their names.
        if (type(message) is dict and message.keys() <= _TEXT_TURN_KEYS and type(role := message.get("role")) is str
                and role in ROLES and type(content := message.get("content")) is str and content
                and not content.isspace() and "\x00" not in content):
            has_assistant = has_assistant or role == "assistant"
            continue
        where = f"{field_name}[{index}]"
        if type(message) is not dict:
            problems.append((where, "wrong_type", f"must be an object with 'role' and 'content', got {_json_type(message)}"))
            continue
        if "role" not in message and "content" not in message and "from" in message and "value" in message:
            # Read as ShareGPT's layout only as a whole row, without a column mapping (``read_layout``).
            problems.append((where, "bad_role", SHAREGPT_TURN_HERE))
            continue
        role = message.get("role")
        if type(role) is not str or role not in ROLES:  # a list or an object is no key of a set: TypeError
            problems.append((f"{where}.role", "bad_role", _role_problem(role)))
        elif role == "assistant":
            has_assistant = True
        content = message.get("content", _MISSING)
        if (calls := next((key for key in _TOOL_CALL_KEYS if message.get(key) is not None), None)) is not None:
            # Beside text, the calls were dropped without a word; alone, the turn was "missing content".
            problems.append((f"{where}.{calls}", "tool_calls",
                             f"the turn holds tool calls ('{calls}'), {_TOOL_TURNS_ADVICE}"))
        elif content is _MISSING or content is None:
            problems.append((f"{where}.content", "missing_field", "the message has no 'content'"))
        elif type(content) is list and content and all(type(part) is dict and "type" in part for part in content):
            problems.append((f"{where}.content", "wrong_type",
                             "must be a string, got a list of content parts ([{\"type\": \"text\", \"text\": ...}]): "
                             "Temper reads text only; give the message's text as one string"))
        else:
            _check_string(content, f"{where}.content", problems)
    return has_assistant


SHAREGPT_TURN_HERE = (
    "the message is ShareGPT's {from, value}, not {role, content}: a row in ShareGPT's layout ('conversations' of "
    "such turns, and for a preference row 'chosen' and 'rejected' as such turns) is read as LLaMA-Factory reads it "
    "where no column is mapped; give the rows so, without a column mapping, or write each message as "
    "{\"role\": ..., \"content\": ...} with the roles human → user, gpt → assistant, system → system")


# Roles of other chat formats that mean one of Temper's: ShareGPT's, Gemma's, OpenAI's newer name for system.
_ROLE_SYNONYMS = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant",
                  "developer": "system"}
# Roles of a tool's result: OpenAI's (tool, the older function), Llama 3.1's (ipython).
_TOOL_ROLES = frozenset({"tool", "function", "ipython", "tool_result"})
_TOOL_CALL_KEYS = ("tool_calls", "function_call")
_TOOL_TURNS_ADVICE = ("which Temper does not train on: it reads the text turns of system, user and assistant only; "
                      "remove the tool calls and the tool turns that answer them, or write them into the turns' text")
_TEXT_TURN_KEYS = frozenset({"role", "content"})


def _role_problem(role: Any) -> str:
    if role is None:
        return "role is missing; use one of: system, user, assistant"
    shown = repr(role)
    if type(role) is not str:
        return f"role is {shown}; use one of: system, user, assistant"
    plain = role.strip().lower()
    if plain in ROLES:
        return f"role is {shown}; write it as {plain!r} (roles are lower case, without spaces)"
    if plain in _ROLE_SYNONYMS:
        return f"role is {shown}, another chat format's name; write it as {_ROLE_SYNONYMS[plain]!r}"
    if plain in _TOOL_ROLES:
        return (f"role is {shown}, a tool's result, which Temper does not train on: it reads the text turns of "
                "system, user and assistant only; remove the tool turns and the calls they answer, or write them "
                "into the turns' text")
    return f"role is {shown}; use one of: system, user, assistant"


def _check_text_or_messages(value: Any, field_name: str, problems: list[Problem]) -> bool:
    """A field that may be a string or a chat; returns whether it is a chat."""
    if type(value) is list:
        _check_messages(value, field_name, problems)
        return True
    _check_string(value, field_name, problems)
    return False


def _holds_json_list(value: Any) -> bool:
    try:
        return type(_maybe_chat(value)) is list
    except _LoneSurrogateCell:  # a list all the same
        return True


def _maybe_chat(value: Any, *, messages_only: bool = False) -> Any:
    """CSV cells are strings: a cell holding a JSON list of messages is read as that list. ``messages_only``: only a
    list of messages (objects with a role, a content or ShareGPT's from) is, where the field may be text (every one
    but sft's ``messages``): any other JSON there is the cell's text, an answer that is a JSON array (``["apple",
    "banana"]``) or a prompt "[1, 2]", where every JSON list was read as a chat and refused ("must be a string, got a
    list")."""
    if type(value) is str and value.lstrip().startswith("["):
        try:
            decoded = _loads_with_lone_surrogates(value)
        except (ValueError, RecursionError):
            return value
        if type(decoded) is list and (not messages_only or (decoded and all(
                type(message) is dict and not _MESSAGE_KEYS.isdisjoint(message) for message in decoded))):
            if _holds_lone_surrogate(decoded):
                raise _LoneSurrogateCell
            return decoded
    return value


class _LoneSurrogateCell(Exception):
    """A CSV cell holding JSON with a lone surrogate escape: its row is refused naming the field
    (``check_record``), where the cell was taken for text and refused as "must be a list ..., got a string"."""


# The keys that make a JSON object in a CSV cell a message, a chat's turn: {role, content}, or ShareGPT's {from, value}
# (read so that the checks name it and say how to write it).
_MESSAGE_KEYS = frozenset(("role", "content", "from"))


_ROW_EXAMPLES = {
    DatasetKind.TEXT: '{"text": "..."}',
    DatasetKind.SFT: '{"prompt": "...", "completion": "..."}',
    DatasetKind.PREFERENCE: '{"prompt": "...", "chosen": "...", "rejected": "..."}',
    DatasetKind.PROMPTS: '{"prompt": "..."}',
}


def _not_an_object(value: Any, kind: DatasetKind) -> str:
    if (kind is DatasetKind.SFT and type(value) is list and value
            and all(type(message) is dict and "role" in message for message in value)):
        return ('each row must be a JSON object with named fields, got a list of messages (a chat?): write it as '
                '{"messages": [...]}')
    return (f"each row must be a JSON object with named fields, got {_json_type(value)}: write each row as an object, "
            f"e.g. {_ROW_EXAMPLES[kind]}")


def check_record(
    value: Any, *, mapping: ColumnMapping, cells_are_strings: bool = False, source: DataSource = WEB_UPLOAD,
    read_once: PromptsReadOnce | None = None, layouts: LayoutsRead | None = None,
) -> tuple[dict[str, Any] | None, list[Problem]]:
    """Turn one raw record into an example of ``mapping.kind``, or return the problems found (``_check_record``;
    a CSV cell whose JSON list holds a lone surrogate escape is the row's one problem, named by its field). An sft
    or preference row given without a column mapping in another tool's layout (``read_layout``) is read into
    Temper's fields first, its problems named by its own fields; ``layouts`` (validation's count) is told its
    layout."""
    try:
        if (type(value) is dict and _may_hold_other_layout(value) and not mapping.columns
                and mapping.kind in _LAYOUT_KINDS):
            layout, read, problems = read_layout(value, mapping.kind, cells_are_strings=cells_are_strings)
            if layout is not None or problems:
                return _check_layout_row(value, layout, read, problems, mapping=mapping,
                                         cells_are_strings=cells_are_strings, source=source, read_once=read_once,
                                         layouts=layouts)
        return _check_record(value, mapping=mapping, cells_are_strings=cells_are_strings, source=source,
                             read_once=read_once)
    except _LoneSurrogateCell as cell:
        field_name = cell.args[0]
        return None, [(field_name, "wrong_type", f"its JSON list holds {LONE_SURROGATE}")]


_LAYOUT_KINDS = (DatasetKind.SFT, DatasetKind.PREFERENCE)


def _may_hold_other_layout(row: dict) -> bool:
    """Whether a row may be in another tool's layout (``read_layout``): the few key lookups that let every row of
    Temper's own layout, most rows, pass without it (it doubled the time of a row's checks)."""
    if "conversations" in row or "instruction" in row:
        return True
    messages = row.get("messages")
    if type(messages) is list:
        return bool(messages) and type(messages[0]) is dict and "from" in messages[0]
    return type(messages) is str and '"from"' in messages


def _check_layout_row(
    value: dict, layout: Layout | None, read: dict[str, Any] | None, problems: list[Problem], *, mapping: ColumnMapping,
    cells_are_strings: bool, source: DataSource, read_once: PromptsReadOnce | None, layouts: LayoutsRead | None,
) -> tuple[dict[str, Any] | None, list[Problem]]:
    """``check_record`` of a row that ``read_layout`` read in ``layout`` (as ``read``, or with ``problems``), or
    found mixing layouts (``layout`` None): the row so read checked as any row, its problems named by its own
    fields."""
    if layout is None:
        # A row holding Temper's own fields whole was read in Temper's layout, its other columns left aside, before
        # other layouts were read: still so, so that a version ready then reads as it did.
        example, own_problems = _check_record(value, mapping=mapping, cells_are_strings=cells_are_strings,
                                              source=source, read_once=read_once)
        return (example, []) if not own_problems else (None, problems)
    if (other := _layout_row_kind(value, layout)) is not None and other is not mapping.kind:
        fields = "'chosen' and 'rejected'" if other is DatasetKind.PREFERENCE else "no 'chosen' and 'rejected'"
        return None, [("chosen" if other is DatasetKind.PREFERENCE else _layout_field(layout, value, "messages"),
                       "wrong_kind", f"the row is in {LAYOUT_NAMES[layout]}'s layout with {fields}, a row of the "
                                     f"{other} kind: {source.kind_advice(kind=mapping.kind, other=other)}")]
    if problems:
        return None, problems
    example, problems = _check_record(read, mapping=mapping, cells_are_strings=cells_are_strings, source=source,
                                      read_once=read_once)
    if layouts is not None and not problems:
        layouts.pending = layout
    return example, [(_layout_field(layout, value, field_name), code, message) for field_name, code, message in problems]


def _layout_row_kind(value: Mapping[str, Any], layout: Layout) -> DatasetKind | None:
    """The kind of a row in another tool's layout by its fields: preference with 'chosen' and 'rejected', sft with
    Alpaca's 'output' or ShareGPT's conversation alone."""
    if value.get("chosen") is not None and value.get("rejected") is not None:
        return DatasetKind.PREFERENCE
    if value.get("chosen") is None and value.get("rejected") is None and (
            layout is Layout.SHAREGPT or value.get("output") is not None):
        return DatasetKind.SFT
    return None


def _check_record(
    value: Any, *, mapping: ColumnMapping, cells_are_strings: bool, source: DataSource,
    read_once: PromptsReadOnce | None,
) -> tuple[dict[str, Any] | None, list[Problem]]:
    """Turn one raw record into an example of ``mapping.kind``, or return the problems found.

    An example holds the kind's fields under their own names (after the column mapping); for
    ``prompts`` every other column is kept too. ``cells_are_strings`` (CSV) lets a cell hold a
    JSON-encoded message list. ``source`` decides how a missing field's advice is worded. A preference row in
    UltraFeedback's layout is read with its prompt's turns once (``read_prompt_once``), as every reader of the
    examples then has it; ``read_once`` (validation's count of such rows) is told whether this row was.
    """
    kind = mapping.kind
    if type(value) is not dict:
        return None, [(None, "wrong_type", _not_an_object(value, kind))]
    problems: list[Problem] = []
    columns = mapping.columns

    def get(field_name: str) -> Any:
        found = value.get(columns.get(field_name, field_name))  # a column left out or null: missing alike
        if found is None:
            return _MISSING
        if not cells_are_strings:
            return found
        try:
            return _maybe_chat(found, messages_only=field_name != "messages")
        except _LoneSurrogateCell:
            raise _LoneSurrogateCell(field_name) from None

    if kind is DatasetKind.TEXT:
        text = get("text")
        if text is _MISSING:
            return None, [_missing(mapping, "text", value, "the text kind needs a 'text' field", source)]
        _check_string(text, "text", problems)
        return (None if problems else {"text": text}), problems

    if kind is DatasetKind.SFT:
        messages = get("messages")
        if messages is not _MISSING:
            if not _check_messages(messages, "messages", problems) and not problems:
                problems.append(("messages", "no_assistant_turn",
                                 "has no assistant turn, so there is nothing to train on; add the assistant's reply"))
            return (None if problems else {"messages": messages}), problems
        prompt, completion = get("prompt"), get("completion")
        if _is_plain_text(prompt) and _is_plain_text(completion):  # the usual pair, passed without the loop below
            return {"prompt": prompt, "completion": completion}, problems
        need = "the sft kind needs 'prompt' and 'completion', or 'messages'"
        for field_name, field_value in (("prompt", prompt), ("completion", completion)):
            if field_value is _MISSING:
                problems.append(_missing(mapping, field_name, value, need, source))
            elif type(field_value) is list:
                problems.append((field_name, "wrong_type", "must be a string, got a list (a chat?); for a chat, give "
                                                           "the whole conversation as 'messages', the completion as "
                                                           "its last, assistant, turn"))
            else:
                _check_string(field_value, field_name, problems)
        return (None if problems else {"prompt": prompt, "completion": completion}), problems

    if kind is DatasetKind.PREFERENCE:
        prompt, chosen, rejected = get("prompt"), get("chosen"), get("rejected")
        if _is_plain_text(prompt) and _is_plain_text(chosen) and _is_plain_text(rejected):  # as for sft's pair
            return {"prompt": prompt, "chosen": chosen, "rejected": rejected}, problems
        need = "the preference kind needs 'prompt', 'chosen' and 'rejected'"
        chats = []
        for field_name, field_value in (("chosen", chosen), ("rejected", rejected)):
            if field_value is _MISSING:
                problems.append(_missing(mapping, field_name, value, need, source))
            else:
                chats.append(_check_text_or_messages(field_value, field_name, problems))
        if prompt is _MISSING:
            if not (len(chats) == 2 and all(chats)):
                problems.append(_missing(mapping, "prompt", value, need + " (the prompt may be left out only when "
                                         "'chosen' and 'rejected' are whole conversations)", source))
            prompt = None
        else:
            _check_text_or_messages(prompt, "prompt", problems)
        if problems:
            return None, problems
        example = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
        if prompt is not None and (type(chosen) is list or type(rejected) is list):
            read = read_prompt_once(example)
            if type(read) is tuple:
                return None, [read]
            if read is not None:
                example = read
                if read_once is not None:
                    read_once.pending = True
        return example, problems

    prompt = get("prompt")
    if prompt is _MISSING:
        return None, [_missing(mapping, "prompt", value, "the prompts kind needs a 'prompt' field", source)]
    _check_text_or_messages(prompt, "prompt", problems)
    prompt_column = mapping.column_for("prompt")
    for key, item in value.items():  # references for reward functions, shown beside the run's samples
        if type(item) is str and "\x00" in item and key != prompt_column:
            _check_no_nul(item, key, problems)
    if problems:
        return None, problems
    example = dict(value)  # the row's columns in their order, the prompt's moved last as 'prompt'
    del example[prompt_column]
    example["prompt"] = prompt
    return example, problems


def read_prompt_once(example: Mapping[str, Any]) -> dict[str, Any] | Problem | None:
    """A preference example (prompt, chosen, rejected; checked) in UltraFeedback's layout
    (HuggingFaceH4/ultrafeedback_binarized: a prompt, and chosen and rejected as whole conversations that each begin
    with the prompt's turns), read as TRL's ``maybe_extract_prompt`` reads a prompt of text beside conversations:
    the prompt is the longest run of turns that chosen and rejected share from their start (short of the shorter
    side's last turn, as there), the sides are the rest. Training puts the prompt before each side
    (``rendered_chats``, ``jaxengine.data.pipeline``), which read such a prompt twice.

    Returns the example so read (the row's own prompt where the shared run is its turns, else that run); the
    problem of a row where one side begins with the prompt's turns and the other does not, or where a side is the
    prompt's turns and nothing after them; None for a row of any other layout, read as it is."""
    prompt, sides = example["prompt"], (("chosen", example["chosen"]), ("rejected", example["rejected"]))
    turns = _as_chat(prompt, "user")
    repeating = [name for name, side in sides if type(side) is list and len(side) >= len(turns) and all(
        type(message) is dict and message.get("role") == turn["role"] and message.get("content") == turn["content"]
        for message, turn in zip(side, turns))]
    if not repeating:
        return None
    what = "turn" if len(turns) == 1 else f"{len(turns)} turns"
    if len(repeating) == 1:
        [name] = repeating
        other = "rejected" if name == "chosen" else "chosen"
        return (name, "prompt_repeated", (
            f"starts with the prompt's {what} again and '{other}' does not: training puts the prompt before each "
            f"side, so the model would read it twice in '{name}'; give '{name}' without the prompt's turns, as "
            f"'{other}' is, or give both as whole conversations that begin with them (UltraFeedback's layout, read "
            "with the prompt once, as TRL does)"))
    chosen, rejected = example["chosen"], example["rejected"]
    shared, last = 0, min(len(chosen), len(rejected)) - 1
    while shared < last and chosen[shared] == rejected[shared]:
        shared += 1
    if shared < len(turns):  # a side that is the prompt's turns alone
        name = "chosen" if len(chosen) == len(turns) else "rejected"
        return (name, "prompt_repeated", (
            f"is the prompt's {what} again and nothing after {'it' if len(turns) == 1 else 'them'}: give the answer "
            "after the prompt's turns, as a whole conversation that begins with them is read with the prompt once"))
    return {"prompt": prompt if shared == len(turns) else chosen[:shared], "chosen": chosen[shared:],
            "rejected": rejected[shared:]}


@dataclass
class PromptsReadOnce:
    """Preference rows in UltraFeedback's layout, read with their prompt's turns once (``read_prompt_once``):
    counted for the version page, which says they were read so. ``check_record`` sets ``pending`` for a row
    read so; ``add``, called with that row's number, counts it."""

    count: int = 0
    rows: list[int] = field(default_factory=list)
    pending: bool = False

    def add(self, example: Mapping[str, Any], row: int) -> None:
        if self.pending:
            self.pending = False
            self.count += 1
            if len(self.rows) < ROWS_SHOWN:
                self.rows.append(row)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "rows": self.rows}


# --------------------------------------------------------------------------------------------
# Other tools' layouts: LLaMA-Factory's two (hiyouga/LLaMA-Factory data/README.md, "Alpaca Format" and "Sharegpt
# Format"), which many Hugging Face hub datasets are written in, read into Temper's own fields by ``read_layout``
# before a row's checks, so that every reader of examples (validation, previews, statistics, training, compares,
# review campaigns, launch checks) reads them alike.


class Layout(StrEnum):
    """A row layout of another tool that ``read_layout`` reads as that tool reads it."""

    SHAREGPT = "sharegpt"
    ALPACA = "alpaca"


# How a layout is named on the version page and by jaxengine validate-data: "ShareGPT layout: read as ...".
LAYOUT_NAMES = {Layout.SHAREGPT: "ShareGPT", Layout.ALPACA: "Alpaca"}

# ShareGPT's roles (LLaMA-Factory's tags user_tag human, assistant_tag gpt, system_tag system, and the names of
# OpenAI's and Gemma's turns that ShareGPT files also hold) and Temper's role for each.
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "model": "assistant", "system": "system"}
# LLaMA-Factory's function_tag and observation_tag (a tool call and its result), and the tool roles of other formats.
_SHAREGPT_TOOL_ROLES = {"function_call": "a tool call", "observation": "a tool's result",
                        **{role: "a tool's result" for role in _TOOL_ROLES}}


def _layout_cell(value: Any, field_name: str, cells_are_strings: bool) -> Any:
    """Alpaca's list field (history) as read from a CSV cell: the JSON list it holds."""
    if not cells_are_strings:
        return value
    try:
        return _maybe_chat(value)
    except _LoneSurrogateCell:
        raise _LoneSurrogateCell(field_name) from None


@dataclass(frozen=True)
class _BrokenCell:
    """A CSV cell of a ShareGPT conversation whose JSON does not parse, and why (the row's problem says it)."""

    reason: str


def _cell_json(text: str) -> Any:
    """A CSV cell's JSON, decoded, or a ``_BrokenCell`` saying where it breaks: one wording for a ShareGPT
    conversation's cell and a chat's (``_check_messages``)."""
    try:
        return _loads_with_lone_surrogates(text)
    except json.JSONDecodeError as error:
        return _BrokenCell(f"broken JSON at character {error.pos + 1}: {_json_reason(error)}")
    except (ValueError, RecursionError):
        return _BrokenCell("its JSON is nested too deeply")


def _sharegpt_cell(value: Any, field_name: str, cells_are_strings: bool) -> Any:
    """A ShareGPT conversation as read from a CSV cell, decoded once: its JSON, or a ``_BrokenCell``."""
    if not cells_are_strings or type(value) is not str or not value.lstrip().startswith("["):
        return value
    decoded = _cell_json(value)
    if type(decoded) is not _BrokenCell and _holds_lone_surrogate(decoded):
        raise _LoneSurrogateCell(field_name)
    return decoded


def _sharegpt_conversation(record: Mapping[str, Any], cells_are_strings: bool) -> tuple[str, Any] | None:
    """The field holding a row's ShareGPT conversation and the conversation, a CSV cell decoded once (it is read
    from what finding the layout decoded): 'conversations', or 'messages' whose turns are {from, value}
    (LLaMA-Factory's messages column, default conversations); None for a row of another layout."""
    if (conversations := record.get("conversations")) is not None:
        return "conversations", _sharegpt_cell(conversations, "conversations", cells_are_strings)
    messages = record.get("messages")
    if type(messages) is str and '"from"' not in messages:  # a CSV cell of Temper's chat: left to its own checks
        return None
    messages = _sharegpt_cell(messages, "messages", cells_are_strings)
    if type(messages) is _BrokenCell or (type(messages) is list and messages and type(messages[0]) is dict
                                         and "from" in messages[0] and "role" not in messages[0]):
        return "messages", messages
    return None


def _layouts_in(record: Mapping[str, Any], kind: DatasetKind, sharegpt_field: str | None) -> list[tuple[str, str]]:
    """(layout name, the field that shows it) of each layout whose prompt side ``record`` holds, in the order
    ShareGPT, Alpaca, Temper's own."""
    found = []
    if sharegpt_field is not None:
        found.append((LAYOUT_NAMES[Layout.SHAREGPT], sharegpt_field))
    if record.get("instruction") is not None:
        found.append((LAYOUT_NAMES[Layout.ALPACA], "instruction"))
    own = ("prompt", "messages") if kind is DatasetKind.SFT else ("prompt",)
    if (field_name := next((name for name in own if record.get(name) is not None and name != sharegpt_field),
                           None)):
        found.append(("Temper's own", field_name))
    return found


def read_layout(record: Mapping[str, Any], kind: DatasetKind, *, cells_are_strings: bool = False,
                ) -> tuple[Layout | None, dict[str, Any] | None, list[Problem]]:
    """The one reading of a row written in another tool's layout (sft and preference rows read without a column
    mapping): ``(layout, the row in Temper's own fields, problems)``; ``(None, None, [])`` for a row in Temper's own
    layout, read as it is. The row so read is then checked as any row of ``kind`` (``check_record``).

    ShareGPT (LLaMA-Factory's ``formatting: sharegpt``): ``conversations`` (or ``messages``) a list of {from, value}
    turns, human/user → user, gpt/assistant/model → assistant, system → system; a top-level ``system`` text becomes
    a first system turn, unless the first turn is one (it wins, as LLaMA-Factory has it). A preference row's
    conversation is its prompt, ``chosen`` and ``rejected`` one {from, value} turn each (or a list of them).
    Alpaca (LLaMA-Factory's default ``formatting: alpaca``): the prompt is ``instruction``, then a line break and
    ``input`` where it is not empty (LLaMA-Factory's "instruction\\ninput"), the answer ``output`` (a preference
    row's ``chosen`` and ``rejected``); ``system`` a first system turn, ``history`` a list of [user, assistant]
    pairs the turns before. Tool turns and tool descriptions are refused, as in Temper's own chats."""
    sharegpt = _sharegpt_conversation(record, cells_are_strings)
    found = _layouts_in(record, kind, sharegpt[0] if sharegpt is not None else None)
    if len(found) > 1:
        (first, first_field), (second, second_field) = found[:2]
        return None, None, [(second_field, "mixed_layouts", (
            f"the row mixes two layouts: '{first_field}' ({first}) and '{second_field}' ({second}); a row is read in "
            f"one layout: keep the fields of one and drop the other's, or put such rows in a file of their own"))]
    if not found or found[0][0] == "Temper's own":
        return None, None, []
    problems: list[Problem] = []
    _check_no_tools(record, problems)
    if found[0][0] == LAYOUT_NAMES[Layout.SHAREGPT]:
        read = _read_sharegpt(record, *sharegpt, kind, cells_are_strings, problems)
        return Layout.SHAREGPT, (read if not problems else None), problems
    read = _read_alpaca(record, kind, cells_are_strings, problems)
    return Layout.ALPACA, (read if not problems else None), problems


def _read_sharegpt(record: Mapping[str, Any], field_name: str, conversation: Any, kind: DatasetKind,
                   cells_are_strings: bool, problems: list[Problem]) -> dict[str, Any]:
    """A row in ShareGPT's layout, its ``conversation`` in ``field_name``, in Temper's fields (``read_layout``)."""
    if type(conversation) is _BrokenCell:
        problems.append((field_name, "wrong_type",
                         f"{conversation.reason}; write the conversation as a JSON list of {{from, value}} turns"))
        return {}
    turns = _sharegpt_turns(conversation, field_name, problems)
    if turns and turns[0]["role"] != "system":
        turns[:0] = _system_turn(record, problems)
    if kind is DatasetKind.SFT:
        return {"messages": turns}
    read = {"prompt": turns}
    for side in ("chosen", "rejected"):
        if (answer := _sharegpt_answer(record.get(side), side, cells_are_strings, problems)) is not None:
            read[side] = answer
    return read


def _read_alpaca(record: Mapping[str, Any], kind: DatasetKind, cells_are_strings: bool,
                 problems: list[Problem]) -> dict[str, Any]:
    """A row in Alpaca's layout in Temper's fields (``read_layout``): a prompt and a completion, or a chat where it
    has a system or a history."""
    turns = _system_turn(record, problems) + _alpaca_history(
        _layout_cell(record.get("history"), "history", cells_are_strings), problems)
    prompt = _alpaca_prompt(record, problems)
    answers = ("output",) if kind is DatasetKind.SFT else ("chosen", "rejected")
    for name in answers:
        if record.get(name) is None:
            problems.append((name, "missing_field", (
                f"missing '{name}': an Alpaca row (instruction, input, {', '.join(answers)}) needs "
                f"{'the answer to train on' if name == 'output' else f'its {name} answer'} in '{name}'; give it or "
                "drop the row")))
        elif kind is DatasetKind.SFT:
            _check_string(record[name], name, problems)
    if problems:
        return {}
    if kind is DatasetKind.SFT:
        if not turns:
            return {"prompt": prompt, "completion": record["output"]}
        return {"messages": [*turns, {"role": "user", "content": prompt},
                             {"role": "assistant", "content": record["output"]}]}
    return {"prompt": [*turns, {"role": "user", "content": prompt}] if turns else prompt,
            "chosen": record["chosen"], "rejected": record["rejected"]}


def _layout_field(layout: Layout, record: Mapping[str, Any], field_name: str | None) -> str | None:
    """The field of a row in ``layout`` that Temper's field ``field_name`` of the row so read came from, for naming
    the problems its checks find there ('messages' is ShareGPT's 'conversations', 'completion' Alpaca's 'output')."""
    if layout is Layout.SHAREGPT and field_name in ("messages", "prompt"):
        return "conversations" if record.get("conversations") is not None else "messages"
    if layout is Layout.ALPACA:
        return {"prompt": "instruction", "completion": "output", "messages": "instruction"}.get(field_name, field_name)
    return field_name


def _check_no_tools(record: Mapping[str, Any], problems: list[Problem]) -> None:
    """LLaMA-Factory's ``tools`` column, the tool descriptions its template puts before a chat: refused, as tool
    turns are, where it holds any (an empty text or list, as files without tools often have, is none)."""
    if record.get("tools") not in (None, "", "[]", []):
        problems.append(("tools", "tool_calls", f"holds tool descriptions, {_TOOL_TURNS_ADVICE}"))


def _system_turn(record: Mapping[str, Any], problems: list[Problem]) -> list[dict]:
    """A row's top-level ``system`` as its first turn; none where it is missing or empty (LLaMA-Factory's "")."""
    system = record.get("system")
    if system is None or system == "":
        return []
    _check_string(system, "system", problems)
    return [{"role": "system", "content": system}]


def _sharegpt_turn(turn: Any, where: str, problems: list[Problem]) -> dict | None:
    """One {from, value} turn as Temper's {role, content}; None, its problems told, where it cannot be."""
    if type(turn) is not dict:
        problems.append((where, "wrong_type", f"must be a {{from, value}} turn, got {_json_type(turn)}"))
        return None
    if "from" not in turn:
        what = ("a {role, content} message among ShareGPT's {from, value} turns: write every turn of the row the "
                "same way" if "role" in turn else "the turn has no 'from': give its role (human, gpt or system)")
        problems.append((f"{where}.from", "bad_role", what))
        return None
    source_role, content = turn["from"], turn.get("value")
    role = _SHAREGPT_ROLES.get(source_role) if type(source_role) is str else None
    if type(source_role) is str and source_role in _SHAREGPT_TOOL_ROLES:
        problems.append((f"{where}.from", "tool_calls",
                         f"is '{source_role}', {_SHAREGPT_TOOL_ROLES[source_role]}, {_TOOL_TURNS_ADVICE}"))
    elif role is None:
        problems.append((f"{where}.from", "bad_role", (
            f"is {source_role!r}, not a role of ShareGPT's layout: use human (or user), gpt (or assistant, model) "
            "or system")))
    if content is None:
        problems.append((f"{where}.value", "missing_field", "the turn has no 'value': give the turn's text"))
    else:
        _check_string(content, f"{where}.value", problems)
    return {"role": role, "content": content} if role is not None else None


def _sharegpt_turns(turns: Any, field_name: str, problems: list[Problem]) -> list[dict]:
    """A ShareGPT conversation as Temper's turns; its problems named by turn (``conversations[2].from``)."""
    if type(turns) is not list:
        problems.append((field_name, "wrong_type", f"must be a list of {{from, value}} turns, got {_json_type(turns)}"))
        return []
    if not turns:
        problems.append((field_name, "empty_messages", "is an empty list; a chat needs at least one turn"))
        return []
    read = [_sharegpt_turn(turn, f"{field_name}[{index}]", problems) for index, turn in enumerate(turns)]
    return [turn for turn in read if turn is not None]


def _sharegpt_answer(answer: Any, side: str, cells_are_strings: bool, problems: list[Problem]) -> list[dict] | None:
    """A ShareGPT preference row's ``chosen`` or ``rejected``: one {from, value} turn (LLaMA-Factory's layout) or a
    list of them, as Temper's turns."""
    if answer is None:
        problems.append((side, "missing_field", (
            f"missing '{side}': a ShareGPT preference row (conversations, chosen, rejected) needs its {side} answer "
            f"as a {{from, value}} turn in '{side}'; give it or drop the row")))
        return None
    if cells_are_strings and type(answer) is str and answer.lstrip().startswith(("{", "[")):
        try:
            answer = _loads_with_lone_surrogates(answer)
        except (ValueError, RecursionError):
            pass
    if type(answer) is list:
        return _sharegpt_turns(answer, side, problems)
    turn = _sharegpt_turn(answer, side, problems)
    return [turn] if turn is not None else None


def _alpaca_prompt(record: Mapping[str, Any], problems: list[Problem]) -> str:
    """An Alpaca row's prompt: ``instruction``, and ``input`` after a line break where it is not empty, as
    LLaMA-Factory joins them ("\\n".join of the two, an empty input left out)."""
    instruction, query = record["instruction"], record.get("input")
    _check_string(instruction, "instruction", problems)
    if query is None or query == "":
        return instruction
    if type(query) is not str:
        _check_string(query, "input", problems)
        return instruction
    _check_no_nul(query, "input", problems)
    return f"{instruction}\n{query}" if type(instruction) is str else instruction


def _alpaca_history(history: Any, problems: list[Problem]) -> list[dict]:
    """An Alpaca row's ``history`` ([[user, assistant], ...], the turns before its instruction) as Temper's turns;
    none where it is missing or empty (an empty CSV cell too)."""
    if history is None or history == [] or history == "":
        return []
    if type(history) is not list:
        problems.append(("history", "wrong_type", f"must be a list of [user, assistant] pairs, got "
                                                  f"{_json_type(history)}"))
        return []
    turns = []
    for index, pair in enumerate(history):
        if type(pair) is not list or len(pair) != 2:
            got = f"a list of {len(pair)}" if type(pair) is list else _json_type(pair)
            problems.append((f"history[{index}]", "wrong_type",
                             f"must be a [user, assistant] pair of texts, got {got}"))
            continue
        for role, text, position in (("user", pair[0], 0), ("assistant", pair[1], 1)):
            _check_string(text, f"history[{index}][{position}]", problems)
            turns.append({"role": role, "content": text})
    return turns


@dataclass
class LayoutsRead:
    """Rows read in another tool's layout (``read_layout``), counted per layout for the version page and
    validate-data, which say how they were read. ``check_record`` sets ``pending`` to a row's layout; ``add``,
    called with that row's number, counts it."""

    counts: dict[str, dict[str, Any]] = field(default_factory=dict)
    pending: Layout | None = None

    def add(self, example: Mapping[str, Any], row: int) -> None:
        if self.pending is not None:
            found = self.counts.setdefault(self.pending.value, {"count": 0, "rows": []})
            found["count"] += 1
            if len(found["rows"]) < ROWS_SHOWN:
                found["rows"].append(row)
            self.pending = None

    def to_dict(self) -> dict[str, Any]:
        return self.counts


def layout_note(layout: str, count: int) -> str | None:
    """What the version page and validate-data say of ``count`` rows read in ``layout`` (a ``Layout`` value)."""
    if layout not in LAYOUT_NAMES:
        return None
    return (f"{LAYOUT_NAMES[Layout(layout)]} layout: read as LLaMA-Factory reads it "
            f"({count:,} row{'s' if count != 1 else ''}).")


# --------------------------------------------------------------------------------------------
# Statistics


_CONTENT = operator.itemgetter("content")


def _chars(value: Any) -> int:
    if type(value) is str:
        return len(value)
    if type(value) is list:
        return sum(map(len, map(_CONTENT, value)))
    return 0


@dataclass
class LengthStatistics:
    """Exact counts of character lengths per field, mergeable across processes.

    ``to_dict`` gives, per field: count, min, max, mean, p50/p90/p99 and a histogram
    ``{"edges": [...], "counts": [...]}`` with ``len(edges) == len(counts) + 1``.
    """

    rows: int = 0
    lengths: dict[str, Counter] = field(default_factory=dict)

    def add(self, example: Mapping[str, Any], fields: tuple[str, ...]) -> None:
        self.rows += 1
        total = 0
        lengths = self.lengths
        for name in fields:
            value = example.get(name)
            if value is None:
                continue
            size = len(value) if type(value) is str else _chars(value)
            total += size
            counter = lengths.get(name)
            if counter is None:
                counter = lengths[name] = Counter()
            counter[size] += 1
            if type(value) is list:
                turns = lengths.get(f"{name}.turns")
                if turns is None:
                    turns = lengths[f"{name}.turns"] = Counter()
                turns[len(value)] += 1
        totals = lengths.get("total")
        if totals is None:
            totals = lengths["total"] = Counter()
        totals[total] += 1

    def merge(self, other: LengthStatistics) -> None:
        self.rows += other.rows
        for name, counter in other.lengths.items():
            self.lengths.setdefault(name, Counter()).update(counter)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "unit": "characters",
            "fields": {name: summarize_lengths(counter) for name, counter in sorted(self.lengths.items())},
        }


def summarize_lengths(counter: Mapping[int, int], *, bins: int = _HISTOGRAM_BINS) -> dict[str, Any]:
    """Summary and histogram of a ``{length: how many}`` count."""
    items = sorted(counter.items())
    count = sum(n for _, n in items)
    if count == 0:
        return {"count": 0}
    low, high = items[0][0], items[-1][0]
    width = _nice_width((high - low + 1) / bins)
    first_edge = (low // width) * width
    n_bins = (high - first_edge) // width + 1
    edges = [first_edge + i * width for i in range(n_bins + 1)]
    counts = [0] * n_bins
    for length, n in items:
        counts[(length - first_edge) // width] += n
    cumulative = []
    running = 0
    for _, n in items:
        running += n
        cumulative.append(running)

    def percentile(q: float) -> int:
        rank = max(1, -(-int(q * count * 1000) // 1000))  # ceil without float drift on small counts
        return items[bisect.bisect_left(cumulative, rank)][0]

    return {
        "count": count,
        "min": low,
        "max": high,
        "mean": round(sum(length * n for length, n in items) / count, 2),
        "p50": percentile(0.5),
        "p90": percentile(0.9),
        "p99": percentile(0.99),
        "histogram": {"edges": edges, "counts": counts},
    }


def _nice_width(raw: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is at least ``raw``."""
    if raw <= 1:
        return 1
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale >= raw:
                return step * scale
        scale *= 10


# --------------------------------------------------------------------------------------------
# Validation and reading for the engine


def row_digest(example: Mapping[str, Any]) -> int:
    """A 64-bit digest of an example as training reads it (its fields after the column mapping, keys sorted):
    two rows with the same one are exact duplicates (a chance collision needs billions of rows)."""
    encoded = orjson.dumps(example, option=orjson.OPT_SORT_KEYS)
    return int.from_bytes(hashlib.blake2b(encoded, digest_size=8).digest(), "little")


@dataclass
class DuplicateRows:
    """Exact duplicates among a file's rows (by ``row_digest``), each against the first row that had it;
    ``digests`` keeps every row's, in file order.

    Only the digests and row numbers are kept while the file streams (16 bytes a row, in two flat arrays): a
    dictionary from digest to first row took about 100 bytes a row, gigabytes for the tens of millions of short
    rows an upload at the size limit can hold. ``to_dict`` finds the repeats once, by a stable sort."""

    digests: array = field(default_factory=lambda: array("Q"))
    rows: array = field(default_factory=lambda: array("Q"))

    def add(self, digest: int, row: int) -> None:
        """Count the row numbered ``row``, whose ``row_digest`` is ``digest``."""
        self.digests.append(digest)
        self.rows.append(row)

    def to_dict(self) -> dict[str, Any]:
        digests = np.frombuffer(self.digests, dtype=np.uint64) if self.digests else np.zeros(0, np.uint64)
        order = np.argsort(digests, kind="stable")  # equal digests stay in file order: each group's first is first
        in_order = digests[order]
        repeat = np.zeros(len(order), dtype=bool)
        repeat[1:] = in_order[1:] == in_order[:-1]
        group_start = np.maximum.accumulate(np.where(repeat, 0, np.arange(len(order))))
        repeats, firsts = order[repeat], order[group_start[repeat]]
        shown = np.argsort(repeats, kind="stable")[:ROWS_SHOWN]  # the earliest repeats in the file
        rows = np.frombuffer(self.rows, dtype=np.uint64) if self.rows else np.zeros(0, np.uint64)
        return {"count": int(repeat.sum()),
                "rows": [[int(rows[repeats[i]]), int(rows[firsts[i]])] for i in shown]}


def _has_assistant_turn(chat: list) -> bool:
    # Most chats end with an assistant turn: that one is looked at alone, without a generator's steps.
    if chat and type(last := chat[-1]) is dict and last.get("role") == "assistant":
        return True
    return any(type(message) is dict and message.get("role") == "assistant" for message in chat)


@dataclass
class OneSidedChats:
    """Preference rows whose ``chosen`` or ``rejected`` is a chat with no assistant turn: valid (a review
    campaign asks for answers to such rows), but DPO and reward training learn nothing from that side."""

    rows: dict[str, list[int]] = field(default_factory=lambda: {"chosen": [], "rejected": []})
    counts: dict[str, int] = field(default_factory=lambda: {"chosen": 0, "rejected": 0})

    def add(self, example: Mapping[str, Any], row: int) -> None:
        for side in ("chosen", "rejected"):
            value = example.get(side)
            if type(value) is list and not _has_assistant_turn(value):
                self.counts[side] += 1
                if len(self.rows[side]) < ROWS_SHOWN:
                    self.rows[side].append(row)

    def to_dict(self) -> dict[str, Any]:
        return {side: {"count": self.counts[side], "rows": self.rows[side]} for side in ("chosen", "rejected")}


def _comparable_turn(turn: dict) -> tuple[Any, str]:
    return turn.get("role"), str(turn.get("content") or "").strip()


def _comparable_response(response: Any) -> Any:
    if isinstance(response, list):
        return [_comparable_turn(turn) for turn in response]
    return str(response or "").strip()


def is_same_response(first: Any, second: Any) -> bool:
    """Whether two responses say the same, whitespace around each text aside: a pair of them holds
    nothing to prefer, and exported it would be a preference pair whose chosen is its rejected."""
    # What comparing the two _comparable_response values answers, without building them for the usual pairs: two
    # texts, or two chats of one prompt, which differ in their last turns (compared first, and no further).
    if type(first) is str and type(second) is str:
        return first.strip() == second.strip()
    if type(first) is list and type(second) is list:
        if len(first) != len(second):
            return False
        if first and _comparable_turn(first[-1]) != _comparable_turn(second[-1]):
            return False
    return _comparable_response(first) == _comparable_response(second)


@dataclass
class IdenticalPairs:
    """Preference rows whose ``chosen`` and ``rejected`` say the same (``is_same_response``): valid (a tie, as some
    exports keep them), but DPO and reward training learn nothing from such a pair, and review campaigns leave
    them out."""

    count: int = 0
    rows: list[int] = field(default_factory=list)

    def add(self, example: Mapping[str, Any], row: int) -> None:
        if is_same_response(example.get("chosen"), example.get("rejected")):
            self.count += 1
            if len(self.rows) < ROWS_SHOWN:
                self.rows.append(row)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "rows": self.rows}


# Conversations that some models' chat templates refuse: Gemma's, Mistral's and Llama 2's raise unless the turns
# alternate user, assistant, ... after one optional first system turn, and a run on such a model stopped at its
# first such row. Validation counts the chats of each shape as training renders them (``ChatShapes``); a launch
# renders each shape found, as the probe chat here, with the run's model's template (``chat_shape_refusal``).
CHAT_SHAPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "system_later": ("a system turn after the first turn", ("user", "system", "assistant")),
    "same_role_twice": ("two turns of one role in a row", ("user", "user", "assistant")),
    "assistant_first": ("an assistant turn before any user turn", ("assistant", "user", "assistant")),
}


def chat_shapes(messages: list[dict]) -> set[str]:
    """The ``CHAT_SHAPES`` a conversation has."""
    roles = [message.get("role") for message in messages]
    # Most chats are one system turn or none, then user and assistant turns in turn: none of the shapes.
    turns = roles[1:] if roles[:1] == ["system"] else roles
    asked, answered = turns[::2], turns[1::2]
    if asked.count("user") == len(asked) and answered.count("assistant") == len(answered):
        return set()
    found = set()
    if any(role == "system" for role in roles[1:]):
        found.add("system_later")
    if any(first == second for first, second in zip(roles, roles[1:])):
        found.add("same_role_twice")
    if next((role for role in roles if role != "system"), None) == "assistant":
        found.add("assistant_first")
    return found


def _as_chat(value: Any, role: str) -> list[dict]:
    """``value`` as a chat: a text as one turn of ``role``; a list as it is (not copied: it is only read)."""
    if type(value) is str:
        return [{"role": role, "content": value}]
    return value if type(value) is list else list(value)


def rendered_chats(example: Mapping[str, Any], kind: DatasetKind) -> list[list[dict]]:
    """The conversations training renders with the chat template for an example of ``kind``
    (``jaxengine.data.pipeline``): a prompt/completion pair is a user turn and an assistant turn."""
    if kind is DatasetKind.SFT:
        return [example["messages"]] if "messages" in example else []
    if kind is DatasetKind.PREFERENCE:
        prompt = example.get("prompt")
        return [_as_chat(example[side], "assistant") if prompt is None
                else _as_chat(prompt, "user") + _as_chat(example[side], "assistant") for side in ("chosen", "rejected")]
    if kind is DatasetKind.PROMPTS and type(example.get("prompt")) is list:
        return [example["prompt"]]
    return []


def chat_shape_refusal(shape: str, render) -> str | None:
    """The error a chat template gives for ``shape``'s probe chat, or None when it renders it: ``render(messages,
    add_generation_prompt)`` renders with the template (and raises ``ValueError`` for a refusal), once whole and
    once up to each assistant turn, as training does."""
    roles = CHAT_SHAPES[shape][1]
    probe = [{"role": role, "content": f"{role} text"} for role in roles]
    try:
        render(probe, False)
        for index, role in enumerate(roles):
            if role == "assistant" and index:
                render(probe[:index], True)
                render(probe[:index + 1], False)
    except ValueError as error:
        return str(error)
    return None


@dataclass
class ChatShapes:
    """How many rows hold a chat of each ``CHAT_SHAPES`` shape, and the first ``ROWS_SHOWN`` of them."""

    kind: DatasetKind
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHAT_SHAPES, 0))
    rows: dict[str, list[int]] = field(default_factory=lambda: {shape: [] for shape in CHAT_SHAPES})

    def add(self, example: Mapping[str, Any], row: int) -> None:
        if self.kind is DatasetKind.PREFERENCE:
            if (type(example.get("prompt")) is str and type(example["chosen"]) is str
                    and type(example["rejected"]) is str):
                return  # each side renders as a user turn and an assistant turn: none of the shapes
        elif type(example.get("messages" if self.kind is DatasetKind.SFT else "prompt")) is not list:
            return  # no chat to render: an sft pair, or a prompt of text
        found: set[str] = set()
        for chat in rendered_chats(example, self.kind):
            found |= chat_shapes(chat)
        for shape in found:
            self.counts[shape] += 1
            if len(self.rows[shape]) < ROWS_SHOWN:
                self.rows[shape].append(row)

    def to_dict(self) -> dict[str, Any]:
        return {shape: {"count": self.counts[shape], "rows": self.rows[shape]} for shape in CHAT_SHAPES}


@dataclass
class TurnSplits:
    """What training an sft file one assistant turn per example would make of it: the number of chats with more
    than one assistant turn, the examples they become, and the characters before and after. A chat template that
    renders earlier turns otherwise than the latest (Qwen3 drops their reasoning) trains each such chat so
    (``jaxengine.data.pipeline``: each turn with the conversation before it), and a launch on such a model
    warns of it from these counts (``turns_split_apart``), the characters standing in for the tokens."""

    rows: int = 0
    examples: int = 0
    characters: int = 0
    split_characters: int = 0

    def add(self, example: Mapping[str, Any], row: int) -> None:
        chat = example.get("messages")
        if type(chat) is not list:  # a prompt and a completion, two texts: one turn
            size = len(example.get("prompt") or "") + len(example.get("completion") or "")
            self.characters += size
            self.split_characters += size
            return
        running, through_turns, turns = 0, 0, 0
        for message in chat:  # checked: each a role and a text
            running += len(message["content"])
            if message["role"] == "assistant":
                turns += 1
                through_turns += running  # this turn's example: the conversation up to it, then the turn
        self.characters += running
        if turns > 1:
            self.rows += 1
            self.examples += turns
            self.split_characters += through_turns
        else:
            self.split_characters += running

    def to_dict(self) -> dict[str, int]:
        return {"rows": self.rows, "examples": self.examples, "characters": self.characters,
                "split_characters": self.split_characters}


TURN_SPLIT_PROBE = [{"role": "user", "content": "first question"}, {"role": "assistant", "content": "first answer"},
                    {"role": "user", "content": "second question"}, {"role": "assistant", "content": "second answer"}]


def turns_split_apart(render) -> bool:
    """Whether a chat template trains a conversation of several assistant turns one turn per example, as
    ``jaxengine.data.pipeline`` does where a conversation's prefixes are not where its full rendering begins
    (Qwen3's template drops earlier turns' reasoning): ``render(messages, add_generation_prompt)`` renders the
    probe chat ``TURN_SPLIT_PROBE`` whole and up to each assistant turn. A template that refuses the probe
    (``ValueError``) is said to keep it whole: the launch's chat-shape check speaks of refusals."""
    try:
        full = render(TURN_SPLIT_PROBE, False)
        for index, message in enumerate(TURN_SPLIT_PROBE):
            if message["role"] != "assistant":
                continue
            start, end = render(TURN_SPLIT_PROBE[:index], True), render(TURN_SPLIT_PROBE[:index + 1], False)
            if not (full.startswith(start) and full.startswith(end) and len(start) <= len(end)):
                return True
    except ValueError:
        return False
    return False


@dataclass
class _Pass:
    """Mutable state of one validation pass over a file or a byte range of it."""

    max_errors: int
    rows: int = 0
    error_count: int = 0
    errors: list[Issue] = field(default_factory=list)
    columns: tuple[str, ...] = ()
    statistics: LengthStatistics = field(default_factory=LengthStatistics)
    duplicates: DuplicateRows = field(default_factory=DuplicateRows)
    one_sided: OneSidedChats | None = None
    identical: IdenticalPairs | None = None
    read_once: PromptsReadOnce | None = None
    layouts: LayoutsRead | None = None
    shapes: ChatShapes | None = None
    turn_splits: TurnSplits | None = None

    def report(self, issue: Issue) -> None:
        self.error_count += 1
        if len(self.errors) < self.max_errors:
            self.errors.append(issue)


def _unkept_value_issue(example: Mapping[str, Any], *, line: int | None, row: int) -> Issue:
    """The problem of a row whose ``row_digest`` raised TypeError, named by its first field orjson cannot write."""
    for key, value in example.items():
        try:
            orjson.dumps(value)
        except TypeError as error:
            if "Recursion limit" in str(error):
                return Issue(code="too_deep", line=line, row=row, field=key,
                             message="holds lists or objects nested more than 254 levels deep, which Temper does not "
                                     "keep; flatten them, or store such a value as a JSON string")
            if "surrogates not allowed" in str(error):
                return Issue(code="wrong_type", line=line, row=row, field=key, message=f"holds {LONE_SURROGATE}")
            return Issue(code="wrong_type", line=line, row=row, field=key,
                         message=f"holds a value of a type Temper does not keep ({error}): store it as text or a number")
    raise AssertionError("row_digest raised TypeError on a row each of whose values orjson writes")


def _stat_fields(kind: DatasetKind) -> tuple[str, ...]:
    return KIND_FIELDS[kind] if kind is not DatasetKind.PROMPTS else ("prompt",)


def _validate_stream(items: Iterator[RawRow | Issue], *, mapping: ColumnMapping, fmt: FileFormat,
                     state: _Pass, source: DataSource = WEB_UPLOAD) -> None:
    cells_are_strings = fmt is FileFormat.CSV
    fields = _stat_fields(mapping.kind)
    add = state.statistics.add
    if mapping.kind is DatasetKind.PREFERENCE and state.one_sided is None:
        state.one_sided, state.identical, state.read_once = OneSidedChats(), IdenticalPairs(), PromptsReadOnce()
    if mapping.kind is not DatasetKind.TEXT and state.shapes is None:
        state.shapes = ChatShapes(kind=mapping.kind)
    if mapping.kind is DatasetKind.SFT and state.turn_splits is None:
        state.turn_splits = TurnSplits()
    if mapping.kind in (DatasetKind.SFT, DatasetKind.PREFERENCE) and state.layouts is None:
        state.layouts = LayoutsRead()
    # Looked up once, not on every row.
    add_duplicate = state.duplicates.add
    collectors = [collector.add for collector in (state.read_once, state.layouts, state.one_sided, state.identical,
                                                  state.shapes, state.turn_splits) if collector is not None]
    try:
        for item in items:
            if type(item) is Issue:
                state.rows = max(state.rows, item.row or 0)
                state.report(item)
                continue
            row, value = item.row, item.value
            state.rows = row
            if not state.columns and type(value) is dict:
                state.columns = tuple(value)
            example, problems = check_record(value, mapping=mapping, cells_are_strings=cells_are_strings,
                                             source=source, read_once=state.read_once, layouts=state.layouts)
            if problems:
                for field_name, code, message in problems:
                    if len(state.errors) < state.max_errors:
                        state.report(Issue(code=code, message=message, line=item.line, row=row, field=field_name))
                    else:
                        state.error_count += 1  # counted, not kept: skip building the Issue
            elif state.error_count == 0:  # once a row is bad the file fails: its statistics are not kept
                try:
                    digest = row_digest(example)
                # orjson reads 1024 levels of nesting but writes 254, and no Decimal or bytes (Parquet's): uncaught,
                # it ended the check.
                except TypeError:
                    state.report(_unkept_value_issue(example, line=item.line, row=row))
                    continue
                add(example, fields)
                add_duplicate(digest, row)
                for collect in collectors:
                    collect(example, row)
    except DatasetFormatError as exc:
        state.report(exc.issue)


def validate_file(
    path: str | os.PathLike,
    *,
    fmt: FileFormat,
    mapping: ColumnMapping,
    max_bytes: int | None = None,
    max_errors: int = DEFAULT_MAX_ERRORS,
    source: DataSource = WEB_UPLOAD,
) -> ValidationReport:
    """Validate a dataset file against its kind in one streaming pass and gather statistics.

    Errors are in file order; the first ``max_errors`` are kept and all are counted. Whole-file
    problems (too large, empty, binary) are reported as the only error. ``source``: where the file was given,
    whose settings the problems' advice names.
    """
    fmt = FileFormat(fmt)
    try:
        check_file(path, fmt=fmt, max_bytes=max_bytes)
    except DatasetFormatError as exc:
        return ValidationReport(row_count=0, error_count=1, errors=(exc.issue,), statistics={}, columns=())
    state = _Pass(max_errors=max_errors)
    _validate_stream(iter_rows(path, fmt=fmt, source=source), mapping=mapping, fmt=fmt, state=state, source=source)
    if state.rows == 0 and state.error_count == 0:
        state.report(Issue(code="empty_file", message="the file has no rows; give a file with at least one record"))
    statistics: dict[str, Any] = {}
    if state.error_count == 0:
        statistics = {**state.statistics.to_dict(), "duplicates": state.duplicates.to_dict()}
        if state.one_sided is not None:
            statistics["no_assistant_turn"] = state.one_sided.to_dict()
            statistics["identical_pairs"] = state.identical.to_dict()
            statistics["prompt_read_once"] = state.read_once.to_dict()
        if state.shapes is not None:
            statistics["chat_shapes"] = state.shapes.to_dict()
        if state.turn_splits is not None:
            statistics["turn_splits"] = state.turn_splits.to_dict()
        if state.layouts is not None and state.layouts.counts:  # only where a row was read in another tool's layout
            statistics["layouts"] = state.layouts.to_dict()
    return ValidationReport(
        row_count=state.rows,
        error_count=state.error_count,
        errors=tuple(state.errors),
        statistics=statistics,
        columns=state.columns,
        row_digests=state.duplicates.digests.tobytes() if state.error_count == 0 else b"",
    )


def iter_examples(path: str | os.PathLike, *, fmt: FileFormat, mapping: ColumnMapping,
                  source: DataSource = WEB_UPLOAD, rows_named: int = 1) -> Iterator[dict[str, Any]]:
    """Stream the examples of a dataset file; raises ``DatasetFormatError`` at the first bad row.

    This is how the engine reads data: the same readers and checks as ``validate_file``, their advice worded for
    ``source``. With ``rows_named`` over 1, the first bad row stops the examples but not the reading: the rest of the
    file is checked, without building examples, and the error names up to ``rows_named`` bad rows in all and counts
    the others, as an upload's check does (the caller reads the file to its end anyway, or fails).
    """
    fmt = FileFormat(fmt)
    check_file(path, fmt=fmt)
    cells_are_strings = fmt is FileFormat.CSV
    items = iter_rows(path, fmt=fmt, source=source)
    for item in items:
        if type(item) is Issue:
            first = item
        else:
            example, problems = check_record(item.value, mapping=mapping, cells_are_strings=cells_are_strings,
                                             source=source)
            if not problems:
                yield example
                continue
            field_name, code, message = problems[0]
            first = Issue(code=code, message=message, line=item.line, row=item.row, field=field_name)
        if rows_named <= 1:
            raise DatasetFormatError(first)
        later = _Pass(max_errors=rows_named - 1)  # the upload's collector: the first kept, all counted
        _later_bad_rows(items, after=first, state=later, mapping=mapping, cells_are_strings=cells_are_strings,
                        source=source)
        raise DatasetFormatError(first, later=tuple(later.errors), later_count=later.error_count)


def _later_bad_rows(items: Iterator[RawRow | Issue], *, after: Issue, state: _Pass, mapping: ColumnMapping,
                    cells_are_strings: bool, source: DataSource) -> None:
    """Report to ``state`` the first problem of each bad row of ``items`` (the rows after ``after``'s)."""
    last_row = after.row
    try:
        for item in items:
            if type(item) is Issue:
                issue = item
            else:
                _example, problems = check_record(item.value, mapping=mapping, cells_are_strings=cells_are_strings,
                                                  source=source)
                if not problems:
                    continue
                field_name, code, message = problems[0]
                issue = Issue(code=code, message=message, line=item.line, row=item.row, field=field_name)
            if issue.row is not None and issue.row == last_row:
                continue
            last_row = issue.row
            state.report(issue)
    except DatasetFormatError as error:  # the rest cannot be read: that is its last problem
        state.report(error.issue)


def read_page(path: str | os.PathLike, *, fmt: FileFormat, mapping: ColumnMapping, offset: int,
              limit: int) -> list[tuple[int, dict[str, Any]]]:
    """Rows ``offset+1 .. offset+limit`` as ``(row number, example)``, for previews of valid files."""
    page: list[tuple[int, dict[str, Any]]] = []
    for number, example in numbered_examples(path, fmt=fmt, mapping=mapping):
        if number <= offset:
            continue
        page.append((number, example))
        if len(page) >= limit:
            break
    return page


def examples_numbered(path: str | os.PathLike, *, fmt: FileFormat, mapping: ColumnMapping,
                      numbers: Collection[int]) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows ``numbers`` of a valid file as ``numbered_examples`` gives them, in file order, for showing a few
    rows of a large file: the rows between are read but not made examples, and reading stops after the last."""
    wanted, last = set(numbers), max(numbers, default=0)
    cells_are_strings = FileFormat(fmt) is FileFormat.CSV
    for item in iter_rows(path, fmt=fmt):
        if type(item) is Issue:
            continue
        if item.row in wanted:
            example, _problems = check_record(item.value, mapping=mapping, cells_are_strings=cells_are_strings)
            yield item.row, example if example is not None else {}
        if item.row >= last:
            return


def numbered_examples(path: str | os.PathLike, *, fmt: FileFormat,
                      mapping: ColumnMapping) -> Iterator[tuple[int, dict[str, Any]]]:
    """Every row of a valid file as ``(row number, example)`` after the column mapping (empty where a
    row cannot be read as one), for previews and searches."""
    cells_are_strings = FileFormat(fmt) is FileFormat.CSV
    for item in iter_rows(path, fmt=fmt):
        if type(item) is Issue:
            continue
        example, _problems = check_record(item.value, mapping=mapping, cells_are_strings=cells_are_strings)
        yield item.row, example if example is not None else {}
