"""GPU GRPO benchmark (H200, issue 9): rollout and update tokens/s of a ~1B model with G = 8.

A random-initialised Llama-3.2-1B-shaped model (jaxengine preset ``llama3.2-1b``) in bfloat16
parameters and compute, full fine-tuning (AdamW, layer rematerialisation), trained with GRPO exactly
as ``jaxengine train`` runs ``task: grpo`` (``Trainer.fit`` with ``grpo.GrpoRollouts`` as its batch
source, rollouts sampled from the trainer's own weights by the KV-cache ``Sampler``): ``--prompts``
prompts of 128 random token ids per step, G = 8 completions each of ``--tokens`` tokens (no stop
token, so every completion runs its whole budget), temperature 1, beta 0 (no reference pass), a toy
reward (the share of even ids). From the run's ``metrics.jsonl``, over the steps after the first two
(compilation):

    rollout tokens/s = prompts * G * completions/mean_length / time/rollout   (generated tokens)
    update tokens/s  = the trainer's tokens_per_second (prompt + completion tokens / time/update)

with ``time/logprobs`` (the old-policy pass) reported beside them.

    python bench/gpu_grpo.py                                     # llama3.2-1b, 8 prompts x 8, 128 + 128
    python bench/gpu_grpo.py --preset tiny-llama --prompts 2 --tokens 16 --steps 3   # a CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_cpu import even_share  # noqa: E402  (the CPU GRPO benchmark's toy reward: the share of even ids)
from ids_tokenizer import ids_tokenizer  # noqa: E402  (bench/ is on sys.path when run as a script)

GENERATIONS, PROMPT_LENGTH, WARMUP_STEPS = 8, 128, 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="llama3.2-1b", help="jaxengine model preset (default llama3.2-1b)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (each sampled G = 8 times)")
    parser.add_argument("--tokens", type=int, default=128, help="completion tokens")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (after two compiling ones)")
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxengine.grpo import GrpoRollouts, GrpoTask
    from jaxengine.models import build_model, preset
    from jaxengine.rewards import REWARDS, register_reward
    from jaxengine.spec import GrpoSpec, OptimSpec
    from jaxengine.trainer import TrainConfig, Trainer

    started = time.perf_counter()
    if "bench_even_share" not in REWARDS:
        register_reward("bench_even_share")(lambda completions, references: [even_share(text) for text in completions])
    config = preset(args.preset)
    config = config.replace(max_position_embeddings=max(config.max_position_embeddings, PROMPT_LENGTH + args.tokens))
    model = build_model(config, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16, remat=True)
    parameters = sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
    print(f"jax {jax.__version__}, device {jax.devices()[0].device_kind}; {config.family} {args.preset}, "
          f"{parameters / 1e9:.2f}B parameters, bf16, full fine-tuning; {args.prompts} prompts x G={GENERATIONS}, "
          f"{PROMPT_LENGTH} prompt + {args.tokens} completion tokens")
    tokenizer = ids_tokenizer(config.vocab_size)
    total = WARMUP_STEPS + args.steps
    rng = np.random.default_rng(0)
    prompts = [" ".join(map(str, rng.integers(1, config.vocab_size, size=PROMPT_LENGTH)))
               for _ in range(total * args.prompts)]
    grpo = GrpoSpec(num_generations=GENERATIONS, max_new_tokens=args.tokens, temperature=1.0, beta=0.0,
                    rewards=[{"name": "bench_even_share"}])
    with tempfile.TemporaryDirectory() as run_dir:
        rollouts = GrpoRollouts(rows=[{"prompt": p} for p in prompts], prompt_ids=[tokenizer.encode(p) for p in prompts],
                                tokenizer=tokenizer, grpo=grpo, batch_size=args.prompts, grad_accum=1, seed=0, pad_id=0,
                                samples_path=None, reference=None)
        train_config = TrainConfig(total_steps=total, batch_size=args.prompts, max_seq_len=PROMPT_LENGTH + args.tokens,
                                   keep_last=1, optim=OptimSpec(learning_rate=1e-6, schedule="constant"))
        task = GrpoTask(loss_type="grpo", max_completion_length=args.tokens, completion_start=rollouts.completion_start)
        trainer = Trainer(model=model, task=task, config=train_config, batch_source=rollouts, pad_id=0, run_dir=run_dir)
        status = trainer.fit(progress_bar=False)["status"]
        metrics = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    timed = metrics[WARMUP_STEPS:]
    assert status == "succeeded" and len(timed) == args.steps, (status, len(metrics))
    generated = sum(args.prompts * GENERATIONS * m["completions/mean_length"] for m in timed)
    rollout_seconds = sum(m["time/rollout"] for m in timed)
    update_tokens = sum(m["tokens_per_second"] * m["time/update"] for m in timed)
    update_seconds = sum(m["time/update"] for m in timed)
    logprob_seconds = sum(m["time/logprobs"] for m in timed)
    print(f"rollout: {generated / rollout_seconds:,.0f} generated tokens/s ({rollout_seconds / args.steps:.2f} s a step)")
    print(f"update: {update_tokens / update_seconds:,.0f} tokens/s ({update_seconds / args.steps:.2f} s a step); "
          f"old log-probs {logprob_seconds / args.steps:.2f} s a step")
    print(f"over {args.steps} steps after {WARMUP_STEPS} compiling ones; total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
