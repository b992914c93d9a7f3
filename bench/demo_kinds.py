"""Greedy exact match by demo task kind at each evaluation of a run, from its ``samples.jsonl``.

    .venv/bin/python bench/demo_kinds.py bench/out/demo_sft [--data bench/out/demo/data/eval.jsonl]

The demo's one exact-match figure hides which kinds of prompt (smallest, even, largest, add, count) the
model reads; RL can only sharpen a kind the model partly reads. An SFT run logs its greedy eval samples
(``train.eval_samples`` prompts) without their kind, so the kind is looked up in the eval file by
prompt. A GRPO or PPO run's eval records carry ``kind: eval``; its rollouts are skipped. (A run with
``data.eval_group_by: task``, as the bench demo specs now have, logs ``eval/exact_match/<kind>`` itself;
this reads runs without it.)
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from jaxengine.evaluate import answers_match, mean_by


def eval_records(samples_path: Path) -> dict[int, list[dict]]:
    """The greedy eval records of a run by step (SFT records have no ``kind``; RL eval ones say ``eval``)."""
    by_step: dict[int, list[dict]] = defaultdict(list)
    for line in samples_path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("kind", "eval") == "eval" and "answer" in record:
            by_step[record["step"]].append(record)
    return dict(sorted(by_step.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--data", type=Path, default=Path("bench/out/demo/data/eval.jsonl"),
                        help="the eval file with a task column (default: the bench demo's)")
    args = parser.parse_args()
    task_of = {row["prompt"]: row["task"] for row in map(json.loads, args.data.read_text().splitlines())}
    kinds = sorted(set(task_of.values()))
    print(f"{'step':>6} {'n':>4} {'all':>6} " + " ".join(f"{kind:>8}" for kind in kinds))
    for step, records in eval_records(args.run_dir / "samples.jsonl").items():
        matches = answers_match([record["text"] for record in records], records)
        groups = mean_by(matches, [task_of[record["prompt"]] for record in records])
        cells = " ".join(f"{groups[kind]['value']:8.1%}" if kind in groups else f"{'-':>8}" for kind in kinds)
        print(f"{step:>6} {len(records):>4} {sum(matches) / len(matches):6.1%} {cells}")


if __name__ == "__main__":
    main()
