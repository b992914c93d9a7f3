"""Time of a split request's check of its stratify column (``webapp.datasets.splitting.check_strata``: the first
``STRATA_CHECKED_ROWS`` rows) against the worker's read of every row (``column_labels``), on a JSONL file of ``--rows``
rows of about ``--row-bytes`` bytes, with an ``id`` column (a value a row: refused) and a ``task`` column of 7 values.

    .venv/bin/python bench/stratify_check.py [--rows 96000] [--row-bytes 1000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.timing import timed  # noqa: E402
from jaxengine.data import formats  # noqa: E402
from webapp.datasets import splitting  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=96_000)
    parser.add_argument("--row-bytes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="temper-bench-strata-") as folder:
        path = Path(folder) / "rows.jsonl"
        filler = "w" * args.row_bytes
        with open(path, "wb") as handle:
            for index in range(args.rows):
                handle.write(orjson.dumps({"id": index, "task": f"task-{index % 7}", "prompt": filler,
                                           "completion": "c"}) + b"\n")
        print(f"{args.rows:,} rows, {path.stat().st_size / 1e6:.0f} MB, {args.repeats} repeats; "
              f"STRATA_CHECKED_ROWS {splitting.STRATA_CHECKED_ROWS:,}")
        steps = {f"{name} {column}": step for column in ("id", "task") for name, step in (
            ("check_strata", lambda column=column: splitting.check_strata(path, fmt=formats.FileFormat.JSONL,
                                                                          column=column)),
            ("column_labels", lambda column=column: splitting.column_labels(path, fmt=formats.FileFormat.JSONL,
                                                                            column=column)))}
        for name, step in steps.items():
            seconds = timed(step, args.repeats, expected=splitting.SplitError)
            print(f"{name:<20} median {statistics.median(seconds):.3f} s  best {min(seconds):.3f} s")


if __name__ == "__main__":
    main()
