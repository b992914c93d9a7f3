"""GPU training benchmark (H200): tokens/s, MFU and peak memory of the one trainer's jitted step.

A random-initialised model of a real shape (jaxengine preset, default ``qwen3-0.6b``; also
``llama3.2-1b``) in bfloat16 parameters and compute, trained on random token ids with every
token in the loss, through the production path: ``jaxengine.trainer.Trainer`` builds the
(trainable, frozen) split and the optimizer state, and ``jaxengine.trainer.train_step`` (the
same jitted, donated step ``Trainer.fit`` calls) runs the timed steps. Checkpointing, evaluation
and metric files are left out: they are not part of the step.

Configurations (each one a fresh model, run in this order, a failure in one does not stop the rest):
    full    full fine-tuning, batch B x T (layer rematerialisation on unless --no-remat)
            attention through the fused path (rows are unpacked): --attention auto|xla|cudnn
    lora    LoRA r16 on all projections
    qlora   LoRA r16 over an NF4 (4-bit, group 64) frozen base
    sharded full, through the sharded path on a mesh of every device (fsdp; one device on a single
            H200): ``Trainer(mesh=...)`` placement, the step jitted with in/out shardings, run inside
            ``jax.set_mesh`` with the models' activation constraints live. Run after ``full`` in one
            process, it prints ``sharded/full tokens/s`` (issue 6's target: >= 0.97 on one H200)

MFU = model FLOPs per second / 989e12 (H200 dense bf16 peak), model FLOPs per token =
6 * N_matmul + 12 * L * T * (num_heads * head_dim) (the PaLM count: N_matmul is every matmul
weight including the output projection, the embedding lookup excluded; the attention term counts
the full T x T score matrix). LoRA/QLoRA MFU is reported with the same (full-model) FLOPs for
comparison, although their backward pass skips the frozen weights' gradient matmuls.

    python bench/gpu_train.py --preset qwen3-0.6b --batch 16 --seq 2048
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEAK_FLOPS = 989e12


def model_flops_per_token(config, *, seq_len: int) -> float:
    hidden, heads, kv_heads, head_dim = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * config.intermediate_size
    matmul_params = config.num_layers * (attention + mlp) + hidden * config.vocab_size
    return 6 * matmul_params + 12 * config.num_layers * seq_len * heads * head_dim


def run_config(name: str, *, preset_name: str, batch: int, seq_len: int, steps: int, remat: bool,
               attention: str) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxengine.data import pipeline
    from jaxengine.models import build_model, preset
    from jaxengine.models.layers import resolve_attention_implementation
    from jaxengine.sharding import make_mesh
    from jaxengine.spec import OptimSpec
    from jaxengine.tasks import LanguageModelTask
    from jaxengine.trainer import TrainConfig, Trainer, train_step

    config = preset(preset_name)
    model = build_model(config, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16,
                        remat=remat, attention_implementation=attention)
    attention_used = resolve_attention_implementation(attention, dtype=jnp.bfloat16, head_dim=config.head_dim)
    trainable = nnx.Param
    extra = {}
    if name in ("lora", "qlora"):
        from jaxengine.peft.lora import LoraParam, apply_lora

        if name == "qlora":
            from jaxengine.peft.quant import quantize_model

            extra["base_storage"] = quantize_model(model, bits=4, group_size=64)
        apply_lora(model, targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                   rank=16, alpha=32)
        trainable = LoraParam

    rng = np.random.default_rng(0)
    examples = [pipeline.Example(ids=rng.integers(0, config.vocab_size, seq_len).astype(np.int32),
                                 loss_mask=np.ones(seq_len, bool)) for _ in range(batch * 4)]
    optim = OptimSpec(learning_rate=1e-5, schedule="constant", weight_decay=0.0)
    with tempfile.TemporaryDirectory() as run_dir:
        # Unpacked rows: the task passes row lengths, so attention takes the fused path (cuDNN when chosen).
        trainer = Trainer(model=model, task=LanguageModelTask(name="sft", unpacked=True),
                          config=TrainConfig(total_steps=1000, batch_size=batch, max_seq_len=seq_len,
                                             optim=optim),
                          train_examples=examples, eval_examples=None, pad_id=0, run_dir=run_dir,
                          trainable=trainable, mesh=make_mesh(fsdp=jax.device_count()) if name == "sharded" else None)
        stream = pipeline.BatchStream(examples=examples, batch_size=batch, max_seq_len=seq_len, pad_id=0,
                                      seed=0)
        host_batches = trainer._next_batches(stream)
        batches = jax.device_put(host_batches) if trainer.placement is None else trainer.placement.put_batches(
            host_batches)
        tokens_per_step = int(batches.input_ids[0].size)  # [A, B, T]: one micro-batch per step here
        # The sharded trainer's own step (in/out shardings) under its mesh, as Trainer.fit runs it.
        step_function = train_step if trainer.placement is None else trainer._train_step
        mesh_context = (contextlib.nullcontext() if trainer.placement is None
                        else jax.set_mesh(trainer.placement.mesh))

        def step(params, opt_state, rng_state, index):
            with mesh_context:
                # sft has no loss state: the empty one goes in and comes back.
                params, opt_state, rng_state, _, metrics = step_function(
                    params, opt_state, rng_state, trainer.loss_state, trainer.frozen, batches, jnp.int32(index),
                    graphdef=trainer.graphdef, task=trainer.task, optim=optim, total_steps=1000)
                return params, opt_state, rng_state, metrics

        params, opt_state, rng_state = trainer.params, trainer.opt_state, trainer.rng_state
        compile_started = time.perf_counter()
        params, opt_state, rng_state, metrics = step(params, opt_state, rng_state, 0)
        first_loss = float(metrics["loss"])
        compile_seconds = time.perf_counter() - compile_started
        params, opt_state, rng_state, metrics = step(params, opt_state, rng_state, 1)
        jax.block_until_ready(metrics)
        started = time.perf_counter()
        for index in range(steps):
            params, opt_state, rng_state, metrics = step(params, opt_state, rng_state, 2 + index)
        last_loss = float(metrics["loss"])
        seconds = (time.perf_counter() - started) / steps

    stats = jax.devices()[0].memory_stats() or {}
    tokens_per_second = tokens_per_step / seconds
    flops = model_flops_per_token(config, seq_len=seq_len) * tokens_per_second
    return {
        "config": name, "remat": remat, "attention": attention_used, "preset": preset_name, "batch": batch, "seq_len": seq_len,
        "step_seconds": round(seconds, 4), "tokens_per_second": round(tokens_per_second),
        "mfu": round(flops / PEAK_FLOPS, 4), "compile_seconds": round(compile_seconds, 1),
        "peak_memory_gib": round(stats.get("peak_bytes_in_use", 0) / 2**30, 2),
        "first_loss": round(first_loss, 4), "last_loss": round(last_loss, 4),
        "trainable_parameters": trainer.trainable_parameter_count, **extra,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen3-0.6b")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--configs", default="full,lora,qlora")
    parser.add_argument("--no-remat", dest="remat", action="store_false", help="keep every layer's activations")
    parser.add_argument("--attention", default="auto", choices=("auto", "xla", "cudnn"),
                        help="fused attention kernel; auto = cuDNN on GPU (an explicit cudnn that fails is reported "
                             "as FAILED, never replaced by xla)")
    args = parser.parse_args()

    import jax

    print(f"jax {jax.__version__} on {jax.devices()}", flush=True)
    results = {}
    for name in args.configs.split(","):
        try:
            result = run_config(name, preset_name=args.preset, batch=args.batch, seq_len=args.seq, steps=args.steps,
                                remat=args.remat, attention=args.attention)
            results[name] = result
            print(json.dumps(result), flush=True)
        except Exception:  # report and go on: one failing configuration must not hide the others
            print(f"{name}: FAILED", flush=True)
            traceback.print_exc()
        jax.clear_caches()
    if "full" in results and "sharded" in results:
        ratio = results["sharded"]["tokens_per_second"] / results["full"]["tokens_per_second"]
        print(f"sharded/full tokens/s: {ratio:.3f} (target >= 0.97)", flush=True)


if __name__ == "__main__":
    main()
