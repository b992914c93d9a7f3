"""CPU training benchmark: jaxengine's trainer against google-tunix 0.1.7's PeftTrainer and DPOTrainer.

Both engines train a random-initialised Qwen3-shaped model of the same (small) size in float32 with
LoRA (rank 16, alpha 32) on q/k/v/o/gate/up/down, AdamW, batch 8 x 256 tokens of random ids, no
gradient accumulation, in two SFT workloads: every position trained (``jaxengine``, ``tunix``), and
the first 128 tokens of each row a prompt with the loss on the last 128 only (``jaxengine-prompt``,
``tunix-prompt``: tunix gets that completion mask as its ``TrainingInput.input_mask``, which its
default loss reads as the target mask, while positions and the causal attention mask come from the
whole row, as tunix's own SFT examples build them). tunix applies LoRA with ``qwix`` (its documented
way) and trains with ``PeftTrainer`` and its default loss; ours trains through ``Trainer.fit`` (the
same loop ``jaxengine train`` runs). jaxengine also runs with ``peft.method: qlora`` (NF4, group 64)
for the QLoRA/LoRA ratio.

DPO: the same model and LoRA, batch 4 pairs of a 64-token prompt and two 64-token completions,
sigmoid loss, beta 0.1. tunix's ``DPOTrainer`` runs its reference model (a second instance with the
same weights) inside every step; jaxengine computes the reference log-probs once before training
(``with_reference_log_probs``) — that one-off pass is timed and reported separately.

    steps/s = (timed steps) / (their wall time)

    tokens/s = batch * seq_len * (timed steps) / (their wall time)

    CPU s/step = process CPU time (all threads) over the timed steps / their number

(on a machine shared with other work, CPU time per step moves less with the load than wall time).

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
DPO_PAIRS, PROMPT_LEN, COMPLETION_LEN = 4, 64, 64
SFT_PROMPT_LEN = SEQ_LEN // 2  # the prompted SFT workload: loss on tokens SFT_PROMPT_LEN.. of each row
REPO = Path(__file__).resolve().parents[1]


def token_batches(count: int) -> list[np.ndarray]:
    """Random ids ≥ 1 (tunix treats 0 as padding), the same for every engine."""
    rng = np.random.default_rng(0)
    return [rng.integers(1, MODEL["vocab_size"], size=(BATCH, SEQ_LEN), dtype=np.int32) for _ in range(count)]


def dpo_batches(count: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(prompt [P, 64], chosen [P, 64], rejected [P, 64]) random ids ≥ 1, the same for every engine."""
    rng = np.random.default_rng(1)
    shape = (DPO_PAIRS, PROMPT_LEN)
    return [tuple(rng.integers(1, MODEL["vocab_size"], size=shape, dtype=np.int32) for _ in range(3))
            for _ in range(count)]


def bench_jaxengine_dpo(warmup: int, steps: int) -> dict[str, float]:
    from flax import nnx

    from jaxengine.data.pipeline import Example, PreferencePair
    from jaxengine.models import build_model, preset
    from jaxengine.peft.lora import PROJECTIONS, LoraParam, apply_lora
    from jaxengine.spec import OptimSpec
    from jaxengine.tasks import PreferenceTask, with_reference_log_probs
    from jaxengine.trainer import TrainConfig, Trainer

    config = preset("qwen3-0.6b").replace(**MODEL, layer_types=(), tie_word_embeddings=True,
                                         max_position_embeddings=4096)
    model = build_model(config, rngs=nnx.Rngs(0))
    apply_lora(model, targets=PROJECTIONS, rank=RANK, alpha=ALPHA)
    mask = np.arange(PROMPT_LEN + COMPLETION_LEN) >= PROMPT_LEN
    pairs = [PreferencePair(chosen=Example(ids=np.concatenate([p, c]), loss_mask=mask),
                            rejected=Example(ids=np.concatenate([p, r]), loss_mask=mask))
             for prompt, chosen, rejected in dpo_batches(warmup + steps) for p, c, r in zip(prompt, chosen, rejected)]
    reference_started = time.perf_counter()
    pairs = with_reference_log_probs(model, pairs, batch_size=DPO_PAIRS, max_seq_len=PROMPT_LEN + COMPLETION_LEN,
                                     pad_id=0)
    reference_seconds = time.perf_counter() - reference_started
    train_config = TrainConfig(total_steps=warmup + steps, batch_size=DPO_PAIRS,
                               max_seq_len=PROMPT_LEN + COMPLETION_LEN, keep_last=1,
                               optim=OptimSpec(learning_rate=LEARNING_RATE, schedule="constant", max_grad_norm=None))
    stamps: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(model=model, task=PreferenceTask(beta=0.1), config=train_config, train_examples=pairs,
                          eval_examples=None, pad_id=0, run_dir=run_dir, trainable=LoraParam)
        trainer.fit(on_progress=lambda progress: stamps.__setitem__(progress.step, time.perf_counter()),
                    progress_bar=False)
    timed = steps - 1
    return {"steps_per_s": timed / (stamps[warmup + timed] - stamps[warmup]),
            "reference_pass_seconds_per_pair": reference_seconds / len(pairs)}


def bench_tunix_dpo(warmup: int, steps: int) -> dict[str, float]:
    import jax
    import optax
    from flax import nnx
    from tunix.sft.dpo import dpo_trainer

    model, reference = tunix_model(lora=True), tunix_model(lora=False)
    stamps: list[float] = []
    batches = [dpo_trainer.TrainingInput(
        prompt_ids=prompt, prompt_mask=np.ones_like(prompt, dtype=np.bool_),
        chosen_ids=chosen, chosen_mask=np.ones_like(chosen, dtype=np.bool_),
        rejected_ids=rejected, rejected_mask=np.ones_like(rejected, dtype=np.bool_),
    ) for prompt, chosen, rejected in dpo_batches(warmup + steps + 1)]
    trainer = dpo_trainer.DPOTrainer(
        model, reference, optax.adamw(LEARNING_RATE),
        dpo_trainer.DPOTrainingConfig(eval_every_n_steps=10**9, max_steps=warmup + steps, beta=0.1),
    )
    trainer.with_data_hooks(StampingHooks(batches, stamps))
    trainer.train(batches)
    jax.block_until_ready(nnx.state(model))
    stamps.append(time.perf_counter())
    return {"steps_per_s": steps / (stamps[-1] - stamps[warmup])}


class StampingHooks:
    """tunix data hooks that hand out ``batches`` and record when each step asked for its batch."""

    def __init__(self, batches, stamps: list[float], cpu_stamps: list[float] | None = None):
        self.batches = iter(batches)
        self.stamps = stamps
        self.cpu_stamps = cpu_stamps if cpu_stamps is not None else []

    def load_next_train_batch(self, trainer):
        self.stamps.append(time.perf_counter())
        self.cpu_stamps.append(time.process_time())
        return next(self.batches)

    def load_next_eval_batch(self, trainer):
        return None


def tunix_model(*, lora: bool):
    import jax.numpy as jnp
    import qwix
    from flax import nnx
    from tunix.models.qwen3.model import ModelConfig, Qwen3
    from tunix.sft import utils

    config = ModelConfig(num_layers=MODEL["num_layers"], vocab_size=MODEL["vocab_size"],
                         embed_dim=MODEL["hidden_size"], hidden_dim=MODEL["intermediate_size"],
                         num_heads=MODEL["num_heads"], head_dim=MODEL["head_dim"], num_kv_heads=MODEL["num_kv_heads"],
                         rope_theta=int(MODEL["rope_theta"]), norm_eps=MODEL["rms_norm_eps"], use_tied_embedding=True)
    model = Qwen3(config, rngs=nnx.Rngs(0))
    if not lora:
        return model
    tokens = jnp.ones((1, SEQ_LEN), jnp.int32)
    positions = jnp.arange(SEQ_LEN)[None]
    mask = utils.make_causal_attn_mask(jnp.ones((1, SEQ_LEN), jnp.bool_))
    provider = qwix.LoraProvider(module_path=".*(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)",
                                 rank=RANK, alpha=ALPHA)
    return qwix.apply_lora_to_model(model, provider, tokens, positions, None, mask, rngs=nnx.Rngs(1))


def bench_jaxengine(warmup: int, steps: int, *, qlora: bool, prompt_len: int = 0) -> dict[str, float]:
    from flax import nnx

    from jaxengine.data.pipeline import Example
    from jaxengine.losses import LOGITS_MEMORY_BUDGET
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
    examples = [Example(ids=row, loss_mask=np.arange(SEQ_LEN) >= prompt_len)
                for batch in token_batches(warmup + steps) for row in batch]
    train_config = TrainConfig(total_steps=warmup + steps, batch_size=BATCH, max_seq_len=SEQ_LEN, keep_last=1,
                               optim=OptimSpec(learning_rate=LEARNING_RATE, schedule="constant", max_grad_norm=None))
    stamps: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as run_dir:
        # Unpacked rows and the default logits budget, as ``jaxengine train`` runs SFT with data.packing off.
        task = LanguageModelTask(unpacked=True, logits_memory_budget=LOGITS_MEMORY_BUDGET)
        trainer = Trainer(model=model, task=task, config=train_config,
                          train_examples=examples, eval_examples=None, pad_id=0, run_dir=run_dir, trainable=LoraParam)
        # The final step also writes a checkpoint before reporting: time steps warmup+1 .. warmup+steps-1.
        trainer.fit(on_progress=lambda progress: stamps.__setitem__(progress.step,
                                                                    (time.perf_counter(), time.process_time())),
                    progress_bar=False)
    timed = steps - 1
    (wall_start, cpu_start), (wall_end, cpu_end) = stamps[warmup], stamps[warmup + timed]
    return {"tokens_per_s": BATCH * SEQ_LEN * timed / (wall_end - wall_start),
            "cpu_s_per_step": (cpu_end - cpu_start) / timed}


def bench_tunix(warmup: int, steps: int, *, prompt_len: int = 0) -> dict[str, float]:
    import jax
    import optax
    from flax import nnx
    from tunix.sft import peft_trainer, utils

    model = tunix_model(lora=True)

    def model_inputs(training_input):
        # input_mask is the loss (completion) mask; every token is real (ids >= 1, 0 is padding).
        real_mask = training_input.input_tokens != 0
        return {"input_tokens": training_input.input_tokens, "input_mask": training_input.input_mask,
                "positions": utils.build_positions_from_mask(real_mask),
                "attention_mask": utils.make_causal_attn_mask(real_mask)}

    stamps: list[float] = []
    cpu_stamps: list[float] = []
    completion_mask = np.broadcast_to(np.arange(SEQ_LEN) >= prompt_len, (BATCH, SEQ_LEN))
    batches = [peft_trainer.TrainingInput(input_tokens=ids, input_mask=completion_mask.copy())
               for ids in token_batches(warmup + steps + 1)]
    trainer = peft_trainer.PeftTrainer(
        model, optax.adamw(LEARNING_RATE),
        peft_trainer.TrainingConfig(eval_every_n_steps=10**9, max_steps=warmup + steps),
    ).with_gen_model_input_fn(model_inputs)
    trainer.with_data_hooks(StampingHooks(batches, stamps, cpu_stamps))
    trainer.train(batches)
    jax.block_until_ready(nnx.state(model))
    stamps.append(time.perf_counter())
    cpu_stamps.append(time.process_time())
    # stamps[i] is when step i+1 asked for its batch; tunix keeps up to two steps in flight, so time
    # from the start of step warmup+1 to the end of the run.
    return {"tokens_per_s": BATCH * SEQ_LEN * steps / (stamps[-1] - stamps[warmup]),
            "cpu_s_per_step": (cpu_stamps[-1] - cpu_stamps[warmup]) / steps}


def in_subprocess(python: str, engine: str, warmup: int, steps: int) -> dict[str, float]:
    command = [python, __file__, "--engine", engine, "--warmup", str(warmup), "--steps", str(steps)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if result.returncode:
        raise RuntimeError(f"{engine} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


ENGINES = {
    "jaxengine": lambda warmup, steps: bench_jaxengine(warmup, steps, qlora=False),
    "tunix": lambda warmup, steps: bench_tunix(warmup, steps),
    "jaxengine-prompt": lambda warmup, steps: bench_jaxengine(warmup, steps, qlora=False, prompt_len=SFT_PROMPT_LEN),
    "tunix-prompt": lambda warmup, steps: bench_tunix(warmup, steps, prompt_len=SFT_PROMPT_LEN),
    "jaxengine-qlora": lambda warmup, steps: bench_jaxengine(warmup, steps, qlora=True),
    "jaxengine-dpo": bench_jaxengine_dpo,
    "tunix-dpo": bench_tunix_dpo,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=tuple(ENGINES))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="*", choices=tuple(ENGINES), help="run only these engines")
    parser.add_argument("--tunix-python", default=str(REPO / "bench/.venv-tunix/bin/python"))
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(ENGINES[args.engine](args.warmup, args.steps)))
        return
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for engine in args.only or ENGINES:
            python = args.tunix_python if engine.startswith("tunix") else sys.executable
            figures = in_subprocess(python, engine, args.warmup, args.steps)
            print(json.dumps({"engine": engine, **figures}), file=sys.stderr, flush=True)
            rate_key = "steps_per_s" if engine.endswith("dpo") else "tokens_per_s"
            if engine not in best or figures[rate_key] > best[engine][rate_key]:
                best[engine] = figures
    # jaxengine / tunix per SFT workload: by wall-clock tokens/s, and by CPU seconds per step (tunix / ours).
    ratios = {workload: {"wall": best[f"jaxengine{suffix}"]["tokens_per_s"] / best[f"tunix{suffix}"]["tokens_per_s"],
                         "cpu": best[f"tunix{suffix}"]["cpu_s_per_step"] / best[f"jaxengine{suffix}"]["cpu_s_per_step"]}
              for workload, suffix in (("every position", ""), ("prompt", "-prompt"))
              if f"jaxengine{suffix}" in best and f"tunix{suffix}" in best}
    print(json.dumps({"model": MODEL, "batch": BATCH, "seq_len": SEQ_LEN, "rank": RANK, "best": best,
                      "ratios": ratios}))


if __name__ == "__main__":
    main()
