"""Where a ``bench/sampler_cpu.py`` decode step spends its time, per compiled XLA op.

Runs one engine of ``bench/sampler_cpu.py`` (tunix in its own venv) for a greedy generation of 128
tokens at the given batch, first untraced (wall and process CPU time per generated token, prefill
included), then under ``jax.profiler.trace`` with the optimized HLO dumped, and lists the ops by
thunk time per decode step, each with its output shape and the jax operation it came from (the
thunk-time reading is ``bench/train_cpu_profile.py``'s).

    .venv/bin/python bench/sampler_cpu_profile.py jaxengine --batch 1
    bench/.venv-tunix/bin/python bench/sampler_cpu_profile.py tunix --batch 16

Durations are summed over XLA's CPU thread pool and move with whatever else the machine runs: read
the shares and the op shapes, not the microseconds.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

OP = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+) ")


def op_facts(dump_dir: Path) -> dict[str, tuple[str, str]]:
    """op name -> (output shape, jax op_name) over the largest optimized module (the generate function)."""
    text = max(dump_dir.glob("*after_optimizations.txt"), key=lambda path: path.stat().st_size).read_text()
    facts = {}
    for line in text.splitlines():
        if match := OP.match(line):
            op_name = re.search(r'op_name="([^"]*)"', line)
            facts.setdefault(match.group(1), (match.group(2).split("{")[0], op_name.group(1) if op_name else ""))
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=("jaxengine", "jaxengine-training-layout", "tunix"))
    parser.add_argument("--batch", type=int, choices=(1, 16), default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    dump_dir, trace_dir = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump_dir} --xla_dump_hlo_as_text"
    import jax

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sampler_cpu
    from train_cpu_profile import thunk_times

    generators = []
    sampler_cpu.rates = lambda generate, prompts, repeats: generators.append(generate) or {}
    if args.engine == "tunix":
        sampler_cpu.bench_tunix(1)
    else:
        sampler_cpu.bench_jaxengine(1, streaming=False, layout=args.engine == "jaxengine")
    generate, prompts, new_tokens = generators[0], sampler_cpu.prompts_for(args.batch), sampler_cpu.NEW_TOKENS
    generate(prompts, new_tokens)  # compiles
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.runs):
        generate(prompts, new_tokens)
    steps = args.runs * (new_tokens - 1)
    print(f"{args.engine}, batch {args.batch}: {(time.perf_counter() - wall) / steps * 1e3:.3f} ms wall and "
          f"{(time.process_time() - cpu) / steps * 1e3:.3f} ms CPU per decode step (prefill included)")
    with jax.profiler.trace(str(trace_dir)):
        for _ in range(args.runs):
            generate(prompts, new_tokens)
    facts = op_facts(dump_dir)
    # A while loop's own thunk spans its body's ops: counted through them.
    rows = sorted(((ns / steps / 1e3, name) for name, ns in thunk_times(trace_dir).items()
                   if name in facts and not name.startswith("while")), reverse=True)
    print(f"op time per decode step: {sum(us for us, _ in rows):.0f} us (ops of the generate function)")
    for us, name in rows[:args.top]:
        shape, op_name = facts[name]
        print(f"  {us:8.1f} us  {name:26s} {shape:30s} {op_name[-70:]}")


if __name__ == "__main__":
    main()
