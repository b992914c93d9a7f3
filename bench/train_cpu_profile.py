"""Where a ``bench/train_cpu.py`` training step spends its CPU time, per compiled XLA op.

Runs one engine of ``bench/train_cpu.py`` (in its own venv for tunix) under ``jax.profiler.trace``
with the optimized HLO dumped, and sums the thunk times of XLA's CPU executor per op over every
executed step (compilation emits no thunk events; the warmup steps run the same executable, so the
figures are per step of that executable). Each op is named with its output shape and the jax
operation it came from, and put in one of four groups:

- ``matmul, vocab``: a dot whose operands or output have the vocabulary axis (the output projection,
  forward and gradient);
- ``matmul, other``: every other dot (projections, LoRA, attention);
- ``elementwise, vocab``: non-dot ops over [.., vocab] arrays (the cross-entropy: softmax, one-hot);
- ``elementwise, other``: everything else (norms, rotary, activations, softmax of attention, copies).

    .venv/bin/python bench/train_cpu_profile.py jaxengine
    bench/.venv-tunix/bin/python bench/train_cpu_profile.py tunix

Figures are the ops' durations summed (over every executor thread), measured on whatever else the
machine is running: read the shares, not the milliseconds.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
from pathlib import Path

SHAPE = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([\w\-]+)\((.*)$", re.M)
COMPUTATION = re.compile(r"^%?([\w.\-]+) \([^\n]*\{\n(.*?)\n\}", re.M | re.S)


def hlo_ops(dump_dir: Path, vocab: int) -> dict[str, tuple[str, bool, bool, str]]:
    """op name -> (output shape, contains a dot, touches a vocab-sized axis, jax op_name), over the
    largest optimized module (the training step)."""
    modules = sorted(dump_dir.glob("*after_optimizations.txt"), key=lambda path: path.stat().st_size)
    text = modules[-1].read_text()
    bodies = {match.group(1): match.group(2) for match in COMPUTATION.finditer(text)}
    shapes = {name: shape for name, shape, _, _ in SHAPE.findall(text)}
    has_vocab = re.compile(rf"\[[\d,]*\b{vocab}\b[\d,]*\]")
    ops = {}
    for name, shape, kind, rest in SHAPE.findall(text):
        called = re.search(r"calls=%([\w.\-]+)", rest)
        body = bodies.get(called.group(1), "") if called else ""
        operands = " ".join(shapes.get(operand, "") for operand in re.findall(r"%([\w.\-]+)", rest.split(")")[0]))
        has_dot = kind == "dot" or " dot(" in body
        op_name = re.search(r'op_name="([^"]*)"', rest)
        ops.setdefault(name, (shape.split("{")[0], has_dot, bool(has_vocab.search(f"{shape} {operands} {body}")),
                              op_name.group(1) if op_name else ""))
    return ops


def thunk_times(trace_dir: Path) -> dict[str, float]:
    """op name -> nanoseconds summed over the XLA CPU thread pool's events."""
    import jax

    (path,) = trace_dir.glob("**/*.xplane.pb")
    totals: dict[str, float] = collections.defaultdict(float)
    for plane in jax.profiler.ProfileData.from_file(str(path)).planes:
        for line in plane.lines:
            if line.name.startswith("tf_XLAEigen"):
                for event in line.events:
                    totals[event.name] += event.duration_ns
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", help="an engine of bench/train_cpu.py, e.g. jaxengine or tunix")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    dump_dir, trace_dir = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump_dir} --xla_dump_hlo_as_text"
    import jax

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import train_cpu

    with jax.profiler.trace(str(trace_dir)):
        train_cpu.ENGINES[args.engine](args.warmup, args.steps)
    executed = args.warmup + args.steps
    ops = hlo_ops(dump_dir, train_cpu.MODEL["vocab_size"])
    groups: dict[str, float] = collections.defaultdict(float)
    rows = []
    for name, nanoseconds in thunk_times(trace_dir).items():
        if name not in ops:
            continue
        shape, has_dot, touches_vocab, op_name = ops[name]
        ms = nanoseconds / 1e6 / executed
        groups[("matmul" if has_dot else "elementwise") + (", vocab" if touches_vocab else ", other")] += ms
        rows.append((ms, name, shape, op_name))
    total = sum(groups.values())
    print(f"{args.engine}: {total:.0f} ms of op time per step")
    for group, ms in sorted(groups.items(), key=lambda item: -item[1]):
        print(f"  {group:20s} {ms:7.0f} ms  {100 * ms / total:5.1f} %")
    for ms, name, shape, op_name in sorted(rows, reverse=True)[:args.top]:
        print(f"  {ms:7.1f} ms  {name:28s} {shape:24s} {op_name[-90:]}")


if __name__ == "__main__":
    main()
