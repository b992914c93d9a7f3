"""Benchmark: validate a ~1 GB JSONL ``sft`` file (time and peak memory).

Writes the file under bench/out/ (gitignored), validates it in a fresh child process so that
its peak resident memory (``ru_maxrss`` of the child) measures the validator alone, prints the
figures and deletes the file. Its CPU seconds, printed too, move less than the wall time on a machine
shared with other jobs.

    .venv/bin/python bench/validate_dataset.py [--gigabytes 1.0] [--broken]

Half of the rows are prompt/completion pairs, half three-turn chats; lengths vary from a few
words to a few hundred, so the rows average about 1 KB. ``--broken`` drops the completion of
every pair and the assistant turn of every chat, so that every row is an error (the worst case:
each one is explained until 20 are kept, then counted).
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
WORDS = ("the model learns to answer questions about data with careful reasoning and short clear "
         "sentences while citing sources écrits en français 日本語 too").split()

CHILD = """
import json, sys, time
from jaxengine.data.formats import ColumnMapping, FileFormat, validate_file
start, cpu_start = time.perf_counter(), time.process_time()
report = validate_file(sys.argv[1], fmt=FileFormat.JSONL, mapping=ColumnMapping(kind="sft"))
seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "rows": report.row_count,
                  "errors": report.error_count}))
"""


def write_file(path: Path, target_bytes: int, *, broken: bool) -> int:
    rng = random.Random(0)

    def text(low: int, high: int) -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))

    size = 0
    with open(path, "wb") as handle:
        while size < target_bytes:
            if rng.random() < 0.5:
                row = {"prompt": text(5, 60), "completion": text(20, 200)}
                if broken:
                    del row["completion"]
            else:
                row = {"messages": [
                    {"role": "system", "content": text(5, 15)},
                    {"role": "user", "content": text(5, 60)},
                    {"role": "assistant", "content": text(20, 200)},
                ]}
                if broken:
                    row["messages"].pop()
            line = orjson.dumps(row) + b"\n"
            handle.write(line)
            size += len(line)
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--broken", action="store_true", help="make every row an error")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "validate_sft.jsonl"
    try:
        size = write_file(path, int(args.gigabytes * 1024**3), broken=args.broken)
        result = subprocess.run([sys.executable, "-c", CHILD, str(path)], cwd=ROOT, check=True,
                                capture_output=True, text=True)
        figures = json.loads(result.stdout)
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    finally:
        path.unlink(missing_ok=True)
    print(f"file: {size / 1024**3:.2f} GiB, {figures['rows']} rows, {figures['errors']} errors")
    print(f"validation: {figures['seconds']:.1f} s ({size / 1024**2 / figures['seconds']:.0f} MiB/s), "
          f"{figures['cpu_seconds']:.1f} s of CPU, peak RSS {peak_mb:.0f} MiB")


if __name__ == "__main__":
    main()
