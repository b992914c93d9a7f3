"""Benchmark: validate a large dataset file of one format and kind (time and peak memory).

Writes the file (under bench/out/, gitignored, or at ``--file``), validates it in a fresh child process so that
its peak resident memory (``ru_maxrss`` of the child) measures the validator alone, prints the figures and
deletes the file (``--file`` keeps it, and a later run with the same ``--file`` reuses it). Its CPU seconds,
printed too, move less than the wall time on a machine shared with other jobs.

    .venv/bin/python bench/validate_dataset.py [--gigabytes 1.0] [--broken]
        [--format jsonl|json|csv] [--kind sft|preference|preference-chat|prompts] [--file PATH] [--repeats N]

Rows of every kind have texts of a few words to a few hundred:

- ``sft``: half prompt/completion pairs, half three-turn chats (in CSV, pairs only, the chat's being JSON text
  in a cell); the rows average about 1 KB;
- ``preference``: prompt, chosen and rejected texts;
- ``preference-chat``: chosen and rejected conversations (a user turn and an assistant turn, the prompt left
  out), as Anthropic's HH-RLHF is written; one in four has a system turn first;
- ``prompts``: a prompt and reference columns for reward functions (an answer, a number, a source).

``--format json`` writes one JSON array, an element's keys on lines of their own (``orjson``'s OPT_INDENT_2),
as ``json.dump(rows, indent=...)`` writes it; ``csv`` quotes cells as Python's ``csv`` writer does (cells
holding commas, quotes or line breaks). ``--broken`` leaves out one field each row needs (the completion and
the assistant turn, a preference's rejected, a prompt), so that every row is an error (the worst case: each one
is explained until 20 are kept, then counted).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import random
import resource
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
WORDS = ("the model learns to answer questions about data with careful reasoning and short clear "
         "sentences while citing sources écrits en français 日本語 too").split()
# CSV's texts have a comma and quotes among their words too, so that its writer quotes cells as real ones need.
CSV_WORDS = (*WORDS, "reasoning,", '"clear"')
KINDS = {"sft": "sft", "preference": "preference", "preference-chat": "preference", "prompts": "prompts"}

CHILD = """
import json, sys, time
from jaxengine.data.formats import ColumnMapping, FileFormat, validate_file
start, cpu_start = time.perf_counter(), time.process_time()
report = validate_file(sys.argv[1], fmt=FileFormat(sys.argv[2]), mapping=ColumnMapping(kind=sys.argv[3]))
seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "rows": report.row_count,
                  "errors": report.error_count}))
"""


def make_rows(kind: str, *, broken: bool, rng: random.Random, words: Sequence[str] = WORDS):
    """Endless rows of ``kind`` (a key of ``KINDS``), each a dict as the file holds it."""

    def text(low: int, high: int) -> str:
        return " ".join(rng.choices(words, k=rng.randint(low, high)))

    while True:
        if kind == "sft":
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
        elif kind == "preference":
            row = {"prompt": text(5, 60), "chosen": text(20, 150), "rejected": text(20, 150)}
            if broken:
                del row["rejected"]
        elif kind == "preference-chat":
            system = [{"role": "system", "content": text(5, 15)}] if rng.random() < 0.25 else []
            prompt = [*system, {"role": "user", "content": text(5, 60)}]
            row = {"chosen": [*prompt, {"role": "assistant", "content": text(20, 150)}],
                   "rejected": [*prompt, {"role": "assistant", "content": text(20, 150)}]}
            if broken:
                del row["rejected"]
        else:
            row = {"prompt": text(10, 120), "answer": text(1, 8), "number": rng.randint(0, 10**6),
                   "source": rng.choice(["gsm8k", "math", "arc", "mbpp"])}
            if broken:
                del row["prompt"]
        yield row


def write_file(path: Path, target_bytes: int, *, fmt: str, kind: str, broken: bool) -> int:
    rows = make_rows(kind, broken=broken, rng=random.Random(0), words=CSV_WORDS if fmt == "csv" else WORDS)
    size = 0
    with open(path, "wb") as handle:
        if fmt == "csv":
            text = io.StringIO()
            writer = csv.writer(text, lineterminator="\n")
            header = {"sft": ["prompt", "completion"], "preference": ["prompt", "chosen", "rejected"],
                      "preference-chat": ["chosen", "rejected"], "prompts": ["prompt", "answer", "number", "source"]}
            writer.writerow(header[kind])
        while size < target_bytes:
            row = next(rows)
            if fmt == "jsonl":
                data = orjson.dumps(row) + b"\n"
            elif fmt == "json":
                data = (b"[\n" if size == 0 else b",\n") + orjson.dumps(row, option=orjson.OPT_INDENT_2)
            else:
                if kind == "sft" and "messages" in row:
                    continue  # an sft CSV holds pairs; a chat in a cell is the preference-chat kind's
                writer.writerow([json.dumps(value, ensure_ascii=False) if type(value) is list else value
                                 for value in row.values()])
                data = text.getvalue().encode()
                text.seek(0)
                text.truncate()
            handle.write(data)
            size += len(data)
        if fmt == "json":
            handle.write(b"\n]\n")
            size += 3
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--broken", action="store_true", help="make every row an error")
    parser.add_argument("--format", choices=("jsonl", "json", "csv"), default="jsonl")
    parser.add_argument("--kind", choices=tuple(KINDS), default="sft")
    parser.add_argument("--file", type=Path, help="write the file here (once) and keep it")
    parser.add_argument("--repeats", type=int, default=1, help="validate the file this many times")
    args = parser.parse_args()
    if args.file is None:
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"validate_{args.kind}.{args.format}"
    else:
        path = args.file
    try:
        if args.file is None or not path.exists():
            write_file(path, int(args.gigabytes * 1024**3), fmt=args.format, kind=args.kind, broken=args.broken)
        size = path.stat().st_size
        for _ in range(args.repeats):
            result = subprocess.run([sys.executable, "-c", CHILD, str(path), args.format, KINDS[args.kind]],
                                    cwd=ROOT, check=True, capture_output=True, text=True)
            figures = json.loads(result.stdout)
            peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child's
            print(f"file: {size / 1024**3:.2f} GiB, {figures['rows']} rows, {figures['errors']} errors")
            print(f"validation: {figures['seconds']:.1f} s ({size / 1024**2 / figures['seconds']:.0f} MiB/s), "
                  f"{figures['cpu_seconds']:.1f} s of CPU, peak RSS {peak_mb:.0f} MiB", flush=True)
    finally:
        if args.file is None:
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
