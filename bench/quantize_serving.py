"""Quantized serving copies of a run's export: memory against bfloat16, perplexity against the
unquantized model and greedy-token agreement on the run's eval rows.

    .venv/bin/python bench/quantize_serving.py --run bench/out/demo_sft --out /tmp/quantized --limit 200

Prints one JSON object per scheme (int8 per channel, int4 at group 64 and 32).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from jaxengine.job import _read_eval_rows
from jaxengine.quantize import QuantScheme, export_quantized
from jaxengine.spec import load_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a run directory with export/ and spec.yaml (sft)")
    parser.add_argument("--out", required=True, help="where to write the copies (one folder per scheme)")
    parser.add_argument("--limit", type=int, default=200, help="eval rows")
    args = parser.parse_args()
    spec = load_spec(Path(args.run) / "spec.yaml")
    rows = _read_eval_rows(spec.data.eval, spec.task, spec.data.columns)[:args.limit]
    for name, group_size in (("int8", None), ("int4", 64), ("int4", 32)):
        started = time.perf_counter()
        description = export_quantized(Path(args.run) / "export", Path(args.out) / f"{name}-{group_size}",
                                       scheme=QuantScheme.named(name, group_size=group_size), eval_rows=rows,
                                       eval_kind="sft")
        description.pop("modules")
        print(json.dumps({**description, "seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
