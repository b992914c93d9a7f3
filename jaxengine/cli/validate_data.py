"""``jaxengine validate-data FILE --kind KIND [--map FIELD=COLUMN ...] [--json]``: check a dataset file.

The same streaming checks and statistics as an upload in the web app (``jaxengine.data.formats``):
the first problems with their line, row and field, how many in all, and character lengths per
field. Exit code 0 when the file is valid, 1 when it has problems, 2 on a usage error.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxengine.cli import command_description
from jaxengine.data import formats
from jaxengine.words import counted

EXIT_PROBLEMS = 1
EXIT_USAGE = 2
SOURCE = formats.DataSource(entry=formats.Entry.VALIDATE_DATA)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("validate-data", help="check a dataset file against its kind",
                                   description=command_description(__doc__))
    parser.add_argument("file", metavar="FILE", help="a .jsonl, .json, .csv or .parquet file")
    parser.add_argument("--kind", required=True, choices=[kind.value for kind in formats.DatasetKind])
    parser.add_argument("--format", dest="file_format", choices=[fmt.value for fmt in formats.FileFormat],
                        help="the file's format (default: from its extension)")
    parser.add_argument("--map", dest="mappings", action="append", default=[], metavar="FIELD=COLUMN",
                        help="read FIELD from COLUMN, e.g. --map prompt=question (repeatable)")
    parser.add_argument("--max-errors", type=int, default=formats.DEFAULT_MAX_ERRORS, metavar="N",
                        help=f"problems to list, all being counted "
                             f"(default {formats.DEFAULT_MAX_ERRORS}; 0: count only)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(handler=run)


def parse_mappings(items: list[str]) -> dict[str, str]:
    """``["prompt=question"]`` -> ``{"prompt": "question"}``; ``ValueError`` names a bad item."""
    columns: dict[str, str] = {}
    for item in items:
        field_name, separator, column = item.partition("=")
        if not separator or not field_name.strip() or not column.strip():
            raise ValueError(f"--map {item!r}: write FIELD=COLUMN, e.g. --map prompt=question")
        field_name, column = field_name.strip(), column.strip()
        if field_name in columns and columns[field_name] != column:  # the last one was kept without a word
            raise ValueError(f"--map maps {field_name!r} twice ({columns[field_name]!r}, then {column!r}); a field "
                             "is read from one column: keep the --map you mean")
        columns[field_name] = column
    return columns


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        if not path.is_file():
            raise ValueError(f"{path}: " + ("is a directory, not a file" if path.is_dir() else "no such file"))
        if args.max_errors < 0:
            raise ValueError(f"--max-errors must be 0 (count only) or more, got {args.max_errors}")
        file_format = (formats.FileFormat(args.file_format) if args.file_format
                       else formats.detect_format(path.name, source=SOURCE))
        mapping = formats.ColumnMapping(kind=formats.DatasetKind(args.kind), columns=parse_mappings(args.mappings))
    except ValueError as error:
        print(f"jaxengine validate-data: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    report = formats.validate_file(path, fmt=file_format, mapping=mapping, max_errors=args.max_errors, source=SOURCE)
    if args.json:
        print(json.dumps({
            "file": str(path), "format": file_format.value, "kind": mapping.kind.value, "ok": report.ok,
            "rows": report.row_count, "error_count": report.error_count,
            "errors": [issue.to_dict() for issue in report.errors], "statistics": report.statistics,
        }))
    else:
        print(render_text(path, report))
    return 0 if report.ok else EXIT_PROBLEMS


def render_text(path: Path, report: formats.ValidationReport) -> str:
    """Problems as ``FILE:LINE: row R, field F: message`` (compiler style), then a summary line."""
    lines = []
    for issue in report.errors:
        where = f"{path}:{issue.line}" if issue.line is not None else str(path)
        detail = [f"row {issue.row}"] if issue.row is not None else []
        if issue.field is not None:
            detail.append(f"field '{issue.field}'")
        text = f"{', '.join(detail)}: {issue.message}" if detail else issue.message
        lines.append(f"{where}: {text} [{issue.code}]")
    if report.ok:
        lines.append(f"{path}: ok, {counted(report.row_count, 'row')}")
        for layout, found in report.statistics.get("layouts", {}).items():
            lines.append(f"  {formats.layout_note(layout, found['count'])}")
        for name, summary in report.statistics["fields"].items():
            lines.append(f"  {name}: mean {summary['mean']}, p50 {summary['p50']}, p90 {summary['p90']}, "
                         f"max {summary['max']} {'turns' if name.endswith('.turns') else 'characters'}")
    else:
        shown = f" (first {len(report.errors)} shown)" if report.error_count > len(report.errors) else ""
        lines.append(f"{path}: {report.error_count} problem{'s' if report.error_count != 1 else ''}{shown}")
    return "\n".join(lines)
