"""CPU GRPO benchmark: a jaxengine ``task: grpo`` step against google-tunix 0.1.7's ``GRPOLearner``.

Both engines train the random-initialised Qwen3-shaped model of ``bench/train_cpu.py`` (float32, full
fine-tuning, AdamW) with GRPO on the same prompts: ``PROMPTS`` prompts of ``PROMPT_LEN`` random token
ids per step, G = ``GENERATIONS`` completions each of ``COMPLETION_LEN`` tokens (ours has no stop
token; tunix's eos is id 0, see ``TunixIdsTokenizer``), temperature 1, beta 0 (no
reference model: neither engine runs a reference pass), one policy update per batch of rollouts
(``num_iterations`` 1), the same toy reward (the share of even ids in the completion). tunix uses its
``vanilla`` rollout (its own KV-cache ``Sampler``) colocated with the actor, i.e. the same weights in
memory, as ours; ours runs through ``Trainer.fit`` with ``GrpoRollouts`` as ``jaxengine train`` does.

    step time = (time from the start of step W+1 to the end of step W+N) / N

for W warm-up steps (compilation) and N timed steps, as wall clock and as process CPU time (user +
sys of every thread). Each engine runs in a fresh process, for ``--rounds`` rounds, keeping each
one's best (least disturbed) figures. tunix runs in its own virtualenv, made as described in
``bench/sampler_cpu.py``.

    .venv/bin/python bench/grpo_cpu.py          # the table in bench/RESULTS.md
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from train_cpu import MODEL  # noqa: E402  (the same model config as the training benchmark)

PROMPTS, GENERATIONS, PROMPT_LEN, COMPLETION_LEN, LEARNING_RATE = 2, 8, 64, 64, 1e-5


def step_prompts(count: int) -> list[str]:
    """``PROMPTS`` prompts per step, each ``PROMPT_LEN`` random ids ≥ 2 written as "12 34 ..."."""
    rng = np.random.default_rng(0)
    return [" ".join(map(str, rng.integers(2, MODEL["vocab_size"], size=PROMPT_LEN))) for _ in range(count * PROMPTS)]


SCORED: list[int] = []  # completions scored per reward call: checks that both engines roll out PROMPTS * G


def scored_rewards(completions) -> list[float]:
    if completions:  # jaxengine's spec validation probes each reward function with no completions
        SCORED.append(len(completions))
    return [even_share(text) for text in completions]


def even_share(text: str) -> float:
    """The toy reward: the share of even ids in a completion (varies between completions, so advantages do too)."""
    ids = [int(piece) for piece in text.split()]
    return sum(1 for i in ids if i % 2 == 0) / max(len(ids), 1)


class Stamps:
    """(wall, process CPU) seconds at the start of each step, plus one at the end."""

    def __init__(self):
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def stamp(self) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())

    def per_step(self, warmup: int) -> dict[str, float]:
        steps = len(self.wall) - 1 - warmup
        return {"step_seconds": (self.wall[-1] - self.wall[warmup]) / steps,
                "step_cpu_seconds": (self.cpu[-1] - self.cpu[warmup]) / steps, "timed_steps": steps,
                "completions_per_reward_call": sorted(set(SCORED))}


# --------------------------------------------------------------------------------------------
# jaxengine


def bench_jaxengine(warmup: int, steps: int) -> dict[str, float]:
    from flax import nnx

    from ids_tokenizer import ids_tokenizer
    from jaxengine.grpo import GrpoRollouts, GrpoTask
    from jaxengine.models import build_model, preset
    from jaxengine.rewards import REWARDS, register_reward
    from jaxengine.spec import GrpoSpec, OptimSpec
    from jaxengine.trainer import TrainConfig, Trainer

    if "bench_even_share" not in REWARDS:
        register_reward("bench_even_share")(lambda completions, references: scored_rewards(completions))
    config = preset("qwen3-0.6b").replace(**MODEL, layer_types=(), tie_word_embeddings=True,
                                         max_position_embeddings=4096)
    model = build_model(config, rngs=nnx.Rngs(0))
    tokenizer = ids_tokenizer(MODEL["vocab_size"])
    prompts = step_prompts(warmup + steps)
    grpo = GrpoSpec(num_generations=GENERATIONS, max_new_tokens=COMPLETION_LEN, temperature=1.0, beta=0.0,
                    rewards=[{"name": "bench_even_share"}])
    total = warmup + steps
    stamps = Stamps()
    with tempfile.TemporaryDirectory() as run_dir:
        rollouts = GrpoRollouts(rows=[{"prompt": p} for p in prompts], prompt_ids=[tokenizer.encode(p) for p in prompts],
                                tokenizer=tokenizer, grpo=grpo, batch_size=PROMPTS, grad_accum=1, seed=0, pad_id=0,
                                samples_path=None, reference=None)
        train_config = TrainConfig(total_steps=total + 1, batch_size=PROMPTS, max_seq_len=PROMPT_LEN + COMPLETION_LEN,
                                   keep_last=1, optim=OptimSpec(learning_rate=LEARNING_RATE, schedule="constant",
                                                                max_grad_norm=None))
        task = GrpoTask(loss_type="grpo", max_completion_length=COMPLETION_LEN,
                        completion_start=rollouts.completion_start)
        trainer = Trainer(model=model, task=task,
                          config=train_config, batch_source=rollouts, pad_id=0, run_dir=run_dir)
        stamps.stamp()
        # Step total + 1 (not timed) also writes the final checkpoint.
        trainer.fit(on_progress=lambda progress: stamps.stamp() if progress.step <= total else None,
                    progress_bar=False)
    return stamps.per_step(warmup)


# --------------------------------------------------------------------------------------------
# tunix


class TunixIdsTokenizer:
    """tunix's tokenizer protocol over "12 34" strings. Id 0 is pad and eos: prompts never contain it,
    and a random model samples it with probability ~1/vocab per token, so completions run full length
    (a row that does stop is padded to the same length and the decode loop runs on for the others)."""

    def encode(self, text, **kwargs):
        return [int(piece) for piece in text.split()]

    def decode(self, ids, **kwargs):
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self):
        return 1

    def eos_id(self):
        return 0

    def pad_id(self):
        return 0


def bench_tunix(warmup: int, steps: int) -> dict[str, float]:
    import jax
    import optax
    from flax import nnx
    from tunix.models.qwen3.model import ModelConfig, Qwen3
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    config = ModelConfig(num_layers=MODEL["num_layers"], vocab_size=MODEL["vocab_size"],
                         embed_dim=MODEL["hidden_size"], hidden_dim=MODEL["intermediate_size"],
                         num_heads=MODEL["num_heads"], head_dim=MODEL["head_dim"], num_kv_heads=MODEL["num_kv_heads"],
                         rope_theta=int(MODEL["rope_theta"]), norm_eps=MODEL["rms_norm_eps"], use_tied_embedding=True)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    model = Qwen3(config, rngs=nnx.Rngs(0))
    total = warmup + steps
    roles = rl_cluster_lib.Role
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
        rollout_engine="vanilla", offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optax.adamw(LEARNING_RATE), eval_every_n_steps=10**9, max_steps=total),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=COMPLETION_LEN, max_prompt_length=PROMPT_LEN,
            kv_cache_size=4 * (PROMPT_LEN + COMPLETION_LEN), temperature=1.0, top_p=1.0, top_k=None),
    )
    cluster = rl_cluster_lib.RLCluster(actor=model, reference=None, tokenizer=TunixIdsTokenizer(),
                                       cluster_config=cluster_config)
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, reward_fns=lambda prompts, completions, **kwargs: scored_rewards(completions),
        algo_config=grpo_learner.GRPOConfig(num_generations=GENERATIONS, num_iterations=1, beta=0.0, epsilon=0.2))
    stamps = Stamps()
    prompts = step_prompts(total)

    def batches():
        for step in range(total):
            stamps.stamp()  # the learner asks for a step's prompts as it starts the step
            # An array, as a grain batch gives it: the learner repeats its rows G times (a list's strings
            # would each become one array-valued prompt).
            yield {"prompts": np.array(prompts[step * PROMPTS:(step + 1) * PROMPTS])}

    learner.train(batches())
    jax.block_until_ready(nnx.state(model))
    stamps.stamp()
    return stamps.per_step(warmup)


# --------------------------------------------------------------------------------------------


ENGINES = {"jaxengine": bench_jaxengine, "tunix": bench_tunix}


def in_subprocess(python: str, engine: str, warmup: int, steps: int) -> dict[str, float]:
    command = [python, __file__, "--engine", engine, "--warmup", str(warmup), "--steps", str(steps)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if result.returncode:
        raise RuntimeError(f"{engine} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=tuple(ENGINES))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tunix-python", default=str(REPO / "bench/.venv-tunix/bin/python"))
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(ENGINES[args.engine](args.warmup, args.steps)))
        return
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for engine in ENGINES:
            python = args.tunix_python if engine == "tunix" else sys.executable
            figures = in_subprocess(python, engine, args.warmup, args.steps)
            print(engine, json.dumps(figures), file=sys.stderr)
            if engine not in best or figures["step_cpu_seconds"] < best[engine]["step_cpu_seconds"]:
                best[engine] = figures
    ratio = {key: best["jaxengine"][key] / best["tunix"][key] for key in ("step_seconds", "step_cpu_seconds")}
    print(json.dumps({"model": MODEL, "prompts": PROMPTS, "generations": GENERATIONS, "prompt_len": PROMPT_LEN,
                      "completion_len": COMPLETION_LEN, "best": best, "jaxengine_over_tunix": ratio}))


if __name__ == "__main__":
    main()
