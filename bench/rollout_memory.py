"""What a GRPO rollout holds in memory on the demo model: live arrays and the generation program's scratch memory.

A rollout samples from the trainer's own arrays (``Trainer.current_model``): rollout and update share one copy of
the weights. What else a rollout holds is the generation program's scratch memory (XLA's ``temp_size_in_bytes``:
KV cache, activations, and whatever XLA keeps across the decode loop), so the peak of a rollout is

    peak = live arrays as generation starts (weights, optimizer state) + the program's scratch memory

Each ``--peft`` method runs in a fresh process: ``bench/demo_grpo.yaml``'s GRPO (batch 16, G 8, beta 0) for
``--steps`` steps on ``bench/out/demo/model``, measured at the first rollout; ``time/rollout`` is the mean of the
steps after the first (which compiles). ``--jaxengine`` runs another tree's engine (e.g. an export of an earlier
commit: ``git archive <commit> jaxengine | tar -x -C /tmp/before``) for a before/after figure. ``--layers N``
samples from the demo model's shape with N layers instead (random weights, written once to
``/tmp/rollout-memory-model-N``; what a layer costs shows with depth).

    .venv/bin/python bench/rollout_memory.py [--jaxengine /tmp/before] [--compute-dtype bfloat16] [--layers 12]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "bench/out/demo"


def deeper_demo_model(layers: int) -> Path:
    """The demo model's shape with ``layers`` layers, random weights, as a model directory (written once)."""
    out = Path(f"/tmp/rollout-memory-model-{layers}")
    if not (out / "config.json").exists():
        sys.path.insert(0, str(REPO))  # this process runs the checkout's engine, whatever --jaxengine says
        from flax import nnx

        from jaxengine.checkpoint.hf import read_hf_config, save_hf_model
        from jaxengine.models import build_model

        _, config = read_hf_config(DEMO / "model")
        config = config.replace(num_layers=layers, layer_types=(config.layer_types[0],) * layers)
        save_hf_model(build_model(config, rngs=nnx.Rngs(0)), config, out, source_dir=DEMO / "model")
    return out


def measure(peft: str, compute_dtype: str, steps: int, max_new_tokens: int, model_dir: Path) -> dict:
    import jax
    import numpy as np

    from jaxengine import sampler as sampler_module
    from jaxengine.grpo import make_grpo_trainer
    from jaxengine.job import build_job_model
    from jaxengine.spec import parse_spec

    run_dir = Path(tempfile.mkdtemp(prefix="rollout-memory-"))
    spec = parse_spec({
        "task": "grpo", "model": str(model_dir), "output_dir": str(run_dir),
        "data": {"train": str(DEMO / "data/prompts.jsonl"), "max_seq_len": 64},
        "peft": {"method": peft, **({"rank": 16} if peft != "none" else {}),
                 **({"group_size": 64} if peft == "qlora" else {})},
        "train": {"max_steps": steps, "batch_size": 16, "seed": 0, "compute_dtype": compute_dtype},
        "grpo": {"num_generations": 8, "max_new_tokens": max_new_tokens, "beta": 0.0,
                 "rewards": [{"name": "exact_match", "args": {"answer_column": "answer"}}]}})
    gc.collect()
    baseline = sum(array.nbytes for array in jax.live_arrays())
    trainer, _ = make_grpo_trainer(spec, build_job_model(spec), run_dir)
    found = {}
    original = sampler_module.Sampler._current_state

    def measuring(sampler):
        state = original(sampler)
        if "live_bytes" not in found:
            gc.collect()
            found["live_bytes"] = sum(array.nbytes for array in jax.live_arrays()) - baseline
            function = sampler._compiled.function

            def compiled_once(*args, **kwargs):
                found["generation_temp_bytes"] = (function.lower(*args, **kwargs).compile()
                                                  .memory_analysis().temp_size_in_bytes)
                sampler._compiled.function = function
                return function(*args, **kwargs)

            sampler._compiled.function = compiled_once
        return state

    sampler_module.Sampler._current_state = measuring
    trainer.fit(progress_bar=False)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    weights = sum(leaf.nbytes for leaf in jax.tree.leaves((trainer.params, trainer.frozen)))
    layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    return {"peft": peft, "layers": layers, "compute_dtype": compute_dtype, "device": jax.devices()[0].device_kind,
            "weights_bytes": weights, **found, "peak_bytes": found["live_bytes"] + found["generation_temp_bytes"],
            "rollout_seconds": float(np.mean([m["time/rollout"] for m in metrics[1:]]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peft", nargs="+", default=["none", "lora", "qlora"])
    parser.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--layers", type=int, help="the demo model's shape with this many layers (random weights)")
    parser.add_argument("--model", default=str(DEMO / "model"), help=argparse.SUPPRESS)  # a child's model
    parser.add_argument("--jaxengine", default=str(REPO), help="the tree whose jaxengine package runs")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child process's own run
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.peft[0], args.compute_dtype, args.steps, args.max_new_tokens,
                                 Path(args.model))))
        return
    model_dir = deeper_demo_model(args.layers) if args.layers else DEMO / "model"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([args.jaxengine, str(REPO)])}
    for peft in args.peft:
        output = subprocess.run([sys.executable, __file__, "--one", "--peft", peft, "--compute-dtype",
                                 args.compute_dtype, "--steps", str(args.steps), "--max-new-tokens",
                                 str(args.max_new_tokens), "--model", str(model_dir)], env=environment, cwd=REPO, check=True,
                                capture_output=True, text=True).stdout
        print(output.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
