"""Sharded training on 8 fake CPU devices: step time per (data, fsdp, tensor) layout, and the memory
per device of parameters + optimizer state, FSDP against data parallel.

A random-initialised Llama-shaped model (float32, full fine-tuning, AdamW) trains on random token
ids through the trainer's own sharded path: ``Trainer(mesh=...)`` places the state
(``jaxengine.sharding.MeshPlacement``) and the timed call is the trainer's jitted step with its
in/out shardings (the one ``Trainer.fit`` runs), inside ``jax.set_mesh`` as ``fit`` runs it. "one
device" is the unsharded path (``mesh=None``) for reference. Every layout runs in this one process,
side by side, for ``--rounds`` rounds in turn, keeping each one's best time (on a shared machine the
best round is the least disturbed one); CPU seconds per step are reported too.

Memory per device = the bytes of the parameter and optimizer-state shards that live on each device
(``addressable_shards``), the largest over the 8 devices. With FSDP every weight matrix is split
eight ways and Adam's two moments follow their parameters, so it should be about 1/8 of data
parallel's, which keeps a full copy on every device (norm scales and step counters are replicated:
they make the ratio slightly above 1/8).

The 8 devices are emulated on the host's cores, so absolute step times say little about real
accelerators; the layouts' memory figures are exact.

    .venv/bin/python bench/sharding_cpu.py          # the table in bench/RESULTS.md
"""
from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYOUTS = {
    "one device": None,
    "data 8": dict(data=8),
    "fsdp 8": dict(fsdp=8),
    "tensor 8": dict(tensor=8),
    "data 2 x fsdp 4": dict(data=2, fsdp=4),
    "data 2 x fsdp 2 x tensor 2": dict(data=2, fsdp=2, tensor=2),
}
MODEL = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8, num_kv_heads=4,
             head_dim=32, layer_types=("full_attention",) * 4)


def state_bytes_per_device(trees) -> dict:
    """Bytes of the arrays' shards on each device."""
    per_device: dict = {}
    for leaf in __import__("jax").tree.leaves(trees):
        for shard in leaf.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    return per_device


def make_trainer(layout, *, batch: int, seq_len: int, run_dir: str):
    from flax import nnx

    from jaxengine.data import pipeline
    from jaxengine.models import build_model, preset
    from jaxengine.sharding import make_mesh
    from jaxengine.spec import OptimSpec
    from jaxengine.tasks import LanguageModelTask
    from jaxengine.trainer import TrainConfig, Trainer

    config = dataclasses.replace(preset("tiny-llama"), **MODEL)
    model = build_model(config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    examples = [pipeline.Example(ids=rng.integers(3, config.vocab_size, seq_len).astype(np.int32),
                                 loss_mask=np.ones(seq_len, bool)) for _ in range(batch * 2)]
    optim = OptimSpec(learning_rate=1e-4, schedule="constant")
    trainer = Trainer(model=model, task=LanguageModelTask(name="sft", unpacked=True),
                      config=TrainConfig(total_steps=1000, batch_size=batch, max_seq_len=seq_len, optim=optim),
                      train_examples=examples, pad_id=0, run_dir=run_dir,
                      mesh=None if layout is None else make_mesh(**layout))
    stream = pipeline.BatchStream(examples=examples, batch_size=batch, max_seq_len=seq_len, pad_id=0, seed=0)
    return trainer, trainer._next_batches(stream)


def time_layout(name: str, layout, *, batch: int, seq_len: int, steps: int) -> dict:
    import contextlib

    import jax
    import jax.numpy as jnp

    with tempfile.TemporaryDirectory() as run_dir:
        trainer, host_batches = make_trainer(layout, batch=batch, seq_len=seq_len, run_dir=run_dir)
        batches = host_batches if trainer.placement is None else trainer.placement.put_batches(host_batches)
        context = contextlib.nullcontext() if trainer.placement is None else jax.set_mesh(trainer.placement.mesh)
        memory = state_bytes_per_device((trainer.params, trainer.opt_state))
        with context:
            def step(index):
                trainer.params, trainer.opt_state, trainer.rng_state, trainer.loss_state, metrics = trainer._train_step(
                    trainer.params, trainer.opt_state, trainer.rng_state, trainer.loss_state, trainer.frozen, batches,
                    jnp.int32(index),
                    graphdef=trainer.graphdef, task=trainer.task, optim=trainer.config.optim, total_steps=1000)
                return metrics

            compile_started = time.perf_counter()
            jax.block_until_ready(step(0))
            compile_seconds = time.perf_counter() - compile_started
            jax.block_until_ready(step(1))
            wall, cpu = time.perf_counter(), time.process_time()
            for index in range(steps):
                metrics = step(2 + index)
            loss = float(metrics["loss"])
            wall, cpu = (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps
    return {"layout": name, "step_seconds": wall, "cpu_seconds_per_step": cpu, "compile_seconds": compile_seconds,
            "state_mib_per_device": max(memory.values()) / 2**20, "state_mib_total": sum(memory.values()) / 2**20,
            "devices": len(memory), "loss": loss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import jax

    print(f"jax {jax.__version__}, {jax.device_count()} devices, load average {os.getloadavg()}", flush=True)
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for name, layout in LAYOUTS.items():
            result = time_layout(name, layout, batch=args.batch, seq_len=args.seq, steps=args.steps)
            print(json.dumps(result), flush=True)
            if name not in best or result["step_seconds"] < best[name]["step_seconds"]:
                best[name] = result
            jax.clear_caches()
    data, fsdp = best["data 8"]["state_mib_per_device"], best["fsdp 8"]["state_mib_per_device"]
    print(f"\n{'layout':28} {'step s':>8} {'CPU s/step':>10} {'vs one device':>13} {'state MiB/device':>16}")
    for name, result in best.items():
        ratio = result["step_seconds"] / best["one device"]["step_seconds"]
        print(f"{name:28} {result['step_seconds']:8.3f} {result['cpu_seconds_per_step']:10.3f} {ratio:13.2f} "
              f"{result['state_mib_per_device']:16.2f}")
    print(f"\nFSDP / data-parallel state per device: {fsdp / data:.4f} (1/8 = 0.125); "
          f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
