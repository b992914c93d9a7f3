"""CPU training benchmark: jaxengine's trainer against google-tunix 0.1.7's PeftTrainer, side by side.

Both engines train a random-initialised Qwen3-shaped model of the same (small) size in float32 with
LoRA (rank 16, alpha 32) on q/k/v/o/gate/up/down, AdamW, batch 8 x 256 tokens of random ids with
every position trained, no gradient accumulation. tunix applies LoRA with ``qwix`` (its documented
way) and trains with ``PeftTrainer`` and its default loss; ours trains through ``Trainer.fit`` (the
same loop ``jaxengine train`` runs). jaxengine also runs with ``peft.method: qlora`` (NF4, group 64)
for the QLoRA/LoRA ratio.

    tokens/s = batch * seq_len * (timed steps) / (their wall time)

Each engine first runs ``--warmup`` steps (compilation), then ``--steps`` timed steps; every engine
runs in a fresh process, for ``--rounds`` rounds, keeping each one's best figure (on a shared
machine the best run is the least disturbed one). tunix runs in its own virtualenv, made as
described in ``bench/sampler_cpu.py``.

    .venv/bin/python bench/train_cpu.py          # the table in bench/RESULTS.md
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Qwen3-0.6B's shape (q/k norm, GQA 2:1, tied embeddings, rope 1e6) at a size that trains on a laptop CPU.
MODEL = dict(vocab_size=16384, hidden_size=512, intermediate_size=1536, num_layers=4, num_heads=8,
             num_kv_heads=4, head_dim=64, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
BATCH, SEQ_LEN, RANK, ALPHA, LEARNING_RATE = 8, 256, 16, 32.0, 1e-4
REPO = Path(__file__).resolve().parents[1]


def token_batches(count: int) -> list[np.ndarray]:
    """Random ids ≥ 1 (tunix treats 0 as padding), the same for every engine."""
    rng = np.random.default_rng(0)
    return [rng.integers(1, MODEL["vocab_size"], size=(BATCH, SEQ_LEN), dtype=np.int32) for _ in range(count)]


def bench_jaxengine(warmup: int, steps: int, *, qlora: bool) -> float:
    from flax import nnx

    from jaxengine.data.pipeline import Example
    from jaxengine.models import build_model, preset
    from jaxengine.peft.lora import PROJECTIONS, LoraParam, apply_lora
    from jaxengine.peft.quant import quantize_model
    from jaxengine.spec import OptimSpec
    from jaxengine.tasks import LanguageModelTask
    from jaxengine.trainer import TrainConfig, Trainer

    config = preset("qwen3-0.6b").replace(**MODEL, layer_types=(), tie_word_embeddings=True,
                                         max_position_embeddings=4096)
    model = build_model(config, rngs=nnx.Rngs(0))
    if qlora:
        quantize_model(model, bits=4, group_size=64)
    apply_lora(model, targets=PROJECTIONS, rank=RANK, alpha=ALPHA)
    examples = [Example(ids=row, loss_mask=np.ones(SEQ_LEN, np.bool_))
                for batch in token_batches(warmup + steps) for row in batch]
    train_config = TrainConfig(total_steps=warmup + steps, batch_size=BATCH, max_seq_len=SEQ_LEN, keep_last=1,
                               optim=OptimSpec(learning_rate=LEARNING_RATE, schedule="constant", max_grad_norm=None))
    stamps: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(model=model, task=LanguageModelTask(), config=train_config, train_examples=examples,
                          eval_examples=None, pad_id=0, run_dir=run_dir, trainable=LoraParam)
        # The final step also writes a checkpoint before reporting: time steps warmup+1 .. warmup+steps-1.
        trainer.fit(on_progress=lambda progress: stamps.__setitem__(progress.step, time.perf_counter()),
                    progress_bar=False)
    timed = steps - 1
    return BATCH * SEQ_LEN * timed / (stamps[warmup + timed] - stamps[warmup])


def bench_tunix(warmup: int, steps: int) -> float:
    import jax
    import jax.numpy as jnp
    import optax
    import qwix
    from flax import nnx
    from tunix.models.qwen3.model import ModelConfig, Qwen3
    from tunix.sft import peft_trainer, utils

    config = ModelConfig(num_layers=MODEL["num_layers"], vocab_size=MODEL["vocab_size"],
                         embed_dim=MODEL["hidden_size"], hidden_dim=MODEL["intermediate_size"],
                         num_heads=MODEL["num_heads"], head_dim=MODEL["head_dim"], num_kv_heads=MODEL["num_kv_heads"],
                         rope_theta=int(MODEL["rope_theta"]), norm_eps=MODEL["rms_norm_eps"], use_tied_embedding=True)
    model = Qwen3(config, rngs=nnx.Rngs(0))
    tokens = jnp.ones((1, SEQ_LEN), jnp.int32)
    positions = jnp.arange(SEQ_LEN)[None]
    mask = utils.make_causal_attn_mask(jnp.ones((1, SEQ_LEN), jnp.bool_))
    provider = qwix.LoraProvider(module_path=".*(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)",
                                 rank=RANK, alpha=ALPHA)
    model = qwix.apply_lora_to_model(model, provider, tokens, positions, None, mask, rngs=nnx.Rngs(1))

    def model_inputs(training_input):
        input_mask = training_input.input_mask
        return {"input_tokens": training_input.input_tokens, "input_mask": input_mask,
                "positions": utils.build_positions_from_mask(input_mask),
                "attention_mask": utils.make_causal_attn_mask(input_mask)}

    stamps: list[float] = []

    class Stamp:  # tunix calls data hooks once per step to fetch the batch
        def __init__(self, batches):
            self.batches = iter(batches)

        def load_next_train_batch(self, trainer):
            stamps.append(time.perf_counter())
            return next(self.batches)

        def load_next_eval_batch(self, trainer):
            return None

    batches = [peft_trainer.TrainingInput(input_tokens=ids, input_mask=np.ones_like(ids, dtype=np.bool_))
               for ids in token_batches(warmup + steps + 1)]
    trainer = peft_trainer.PeftTrainer(
        model, optax.adamw(LEARNING_RATE),
        peft_trainer.TrainingConfig(eval_every_n_steps=10**9, max_steps=warmup + steps),
    ).with_gen_model_input_fn(model_inputs)
    trainer.with_data_hooks(Stamp(batches))
    trainer.train(batches)
    jax.block_until_ready(nnx.state(model))
    stamps.append(time.perf_counter())
    # stamps[i] is when step i+1 asked for its batch; tunix overlaps up to two steps in flight, so
    # time from the start of step warmup+1 to the end of the run.
    return BATCH * SEQ_LEN * steps / (stamps[-1] - stamps[warmup])


def in_subprocess(python: str, engine: str, warmup: int, steps: int) -> float:
    command = [python, __file__, "--engine", engine, "--warmup", str(warmup), "--steps", str(steps)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if result.returncode:
        raise RuntimeError(f"{engine} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("jaxengine", "jaxengine-qlora", "tunix"))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tunix-python", default=str(REPO / "bench/.venv-tunix/bin/python"))
    args = parser.parse_args()
    if args.engine:
        if args.engine == "tunix":
            rate = bench_tunix(args.warmup, args.steps)
        else:
            rate = bench_jaxengine(args.warmup, args.steps, qlora=args.engine == "jaxengine-qlora")
        print(json.dumps({"tokens_per_s": rate}))
        return
    pythons = {"jaxengine": sys.executable, "jaxengine-qlora": sys.executable, "tunix": args.tunix_python}
    best = {engine: 0.0 for engine in pythons}
    for _ in range(args.rounds):
        for engine, python in pythons.items():
            best[engine] = max(best[engine], in_subprocess(python, engine, args.warmup, args.steps))
    print(json.dumps({"model": MODEL, "batch": BATCH, "seq_len": SEQ_LEN, "rank": RANK, "tokens_per_s": best}))
    print(f"LoRA SFT tokens/s: jaxengine {best['jaxengine']:.0f}, tunix {best['tunix']:.0f} "
          f"(ratio {best['jaxengine'] / best['tunix']:.2f}); QLoRA / LoRA = {best['jaxengine-qlora'] / best['jaxengine']:.2f}")


if __name__ == "__main__":
    main()
