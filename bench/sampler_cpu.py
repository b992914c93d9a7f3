"""CPU sampler benchmark: jaxengine's Sampler against google-tunix 0.1.7's Sampler, side by side.

Both engines get a random-initialised Qwen3-shaped model of the same (small) size, float32, the same
prompts (random token ids; batch 1: one 128-token prompt; batch 16: lengths 65..128, padded to 128 by
both), greedy decoding and no stop token, so every run decodes exactly the requested number of tokens.

    prefill tokens/s = real prompt tokens / time(generate 1 token)
    decode tokens/s  = batch * (N - 1) / (time(generate N tokens) - time(generate 1 token))
    prefill CPU ms, decode CPU ms/step: the same times in process CPU seconds

Each time is the best of --repeats runs after a warm-up run (compilation excluded), and the engines
run one after the other, each in a fresh process, for --rounds rounds, keeping each engine's best
figures: on a shared machine the best run is the one least disturbed by other work. tunix needs
its own virtualenv (it pins safetensors<0.8, ours is 0.8.0), made once with:

    python3 -m venv bench/.venv-tunix
    bench/.venv-tunix/bin/pip install -c <(printf 'jax==0.10.2\\njaxlib==0.10.2\\nflax==0.12.8\\nnumpy==2.4.6\\n') google-tunix==0.1.7

and this script runs itself there (``--engine tunix``) for the tunix rows. jaxengine's model is in
``inference_layout`` (projections joined, an untied [D, V] output kernel), as ``jaxengine generate``,
``jaxengine eval`` and the serve worker load one. Besides the two engines it measures three variants
of ours: the model in its training layout (what GRPO's rollouts sample from), with a per-token
streaming callback, and a host-side decode loop around a jitted, cache-donating step (the design
jaxengine's on-device loop was chosen over).

    .venv/bin/python bench/sampler_cpu.py              # full table (a few minutes on 2 cores)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# Qwen3-0.6B's shape (q/k norm, GQA 2:1, tied embeddings, rope 1e6) at a size that runs on a laptop CPU.
MODEL = dict(vocab_size=16384, hidden_size=512, intermediate_size=1536, num_layers=4, num_heads=8,
             num_kv_heads=4, head_dim=64, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
PROMPT_BUCKET = 128
NEW_TOKENS = 128
BATCHES = (1, 16)
REPO = Path(__file__).resolve().parents[1]


def prompts_for(batch: int) -> list[list[int]]:
    """Random prompts (ids ≥ 1: tunix treats id 0 as padding); the same for every engine."""
    rng = np.random.default_rng(batch)
    lengths = [PROMPT_BUCKET] if batch == 1 else np.linspace(PROMPT_BUCKET // 2 + 1, PROMPT_BUCKET, batch).astype(int)
    return [rng.integers(1, MODEL["vocab_size"], size=int(length)).tolist() for length in lengths]


def best_seconds(run, repeats: int) -> tuple[float, float]:
    """(best wall-clock seconds, best process CPU seconds) of ``run`` over ``repeats`` runs after a warm-up."""
    run()  # warm-up: compiles
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


def rates(generate, prompts: list[list[int]], repeats: int) -> dict[str, float]:
    """generate(prompts, new_tokens) -> None, timed for 1 and NEW_TOKENS new tokens.

    Besides tokens/s (wall clock), the CPU time per decode step: on a shared machine wall-clock
    figures swing with other people's jobs, CPU time much less.
    """
    first_wall, first_cpu = best_seconds(lambda: generate(prompts, 1), repeats)
    full_wall, full_cpu = best_seconds(lambda: generate(prompts, NEW_TOKENS), repeats)
    return {"prefill_tokens_per_s": sum(map(len, prompts)) / first_wall,
            "decode_tokens_per_s": len(prompts) * (NEW_TOKENS - 1) / (full_wall - first_wall),
            "prefill_cpu_ms": first_cpu * 1e3,
            "decode_cpu_ms_per_step": (full_cpu - first_cpu) / (NEW_TOKENS - 1) * 1e3}


def jaxengine_model():
    from flax import nnx

    from jaxengine.models import build_model, preset

    config = preset("qwen3-0.6b").replace(**MODEL, layer_types=(), tie_word_embeddings=True,
                                         max_position_embeddings=4096)
    return build_model(config, rngs=nnx.Rngs(0))


def bench_jaxengine(repeats: int, *, streaming: bool, layout: bool = True) -> dict:
    """``layout``: the model in ``inference_layout``, as ``jaxengine generate``, ``eval`` and the serve
    worker load it; without, the layout a model has in training (GRPO's rollouts sample from that)."""
    from ids_tokenizer import ids_tokenizer  # bench/ is on sys.path when run as a script
    from jaxengine.models.transformer import inference_layout
    from jaxengine.sampler import Sampler, SamplingParams

    model = inference_layout(jaxengine_model()) if layout else jaxengine_model()
    sampler = Sampler(model, ids_tokenizer(MODEL["vocab_size"]))
    on_token = (lambda row, token_id, delta: None) if streaming else None

    def generate(prompts, new_tokens):
        sampler.generate(prompts, SamplingParams(max_new_tokens=new_tokens, temperature=0), on_token=on_token)

    return {batch: rates(generate, prompts_for(batch), repeats) for batch in BATCHES}


def bench_host_loop(repeats: int) -> dict:
    """Our prefill/decode functions, with the decode loop on the host: one jitted step per token,
    the cache donated, the token brought to the host each step (as streaming would need)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxengine.models.transformer import inference_layout
    from jaxengine.sampler import bucket_length, decode, prefill

    graphdef, state = nnx.split(inference_layout(jaxengine_model()))
    total = bucket_length(PROMPT_BUCKET + NEW_TOKENS, minimum=16)

    @jax.jit
    def prefill_step(state, input_ids_bt, pad_counts_b):
        logits_bv, cache = prefill(nnx.merge(graphdef, state), input_ids_bt, pad_counts_b, total_length=total)
        return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32), cache

    @jax.jit
    def decode_step(state, token_b, positions_b, pad_counts_b, cache):
        logits_bv, cache = decode(nnx.merge(graphdef, state), token_b, positions_b, pad_counts_b, cache)
        return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32), cache

    decode_step_donating = jax.jit(decode_step.__wrapped__, donate_argnums=(4,))

    def generate(prompts, new_tokens):
        input_ids = np.zeros((len(prompts), PROMPT_BUCKET), np.int32)
        pad_counts = np.array([PROMPT_BUCKET - len(ids) for ids in prompts], np.int32)
        for row, ids in enumerate(prompts):
            input_ids[row, pad_counts[row]:] = ids
        token, cache = prefill_step(state, input_ids, pad_counts)
        tokens = [np.asarray(token)]
        lengths = PROMPT_BUCKET - pad_counts
        for step in range(1, new_tokens):
            token, cache = decode_step_donating(state, token, lengths + step - 1, pad_counts, cache)
            tokens.append(np.asarray(token))

    return {batch: rates(generate, prompts_for(batch), repeats) for batch in BATCHES}


def bench_tunix(repeats: int) -> dict:
    from flax import nnx
    from tunix.generate.sampler import CacheConfig, Sampler
    from tunix.models.qwen3.model import ModelConfig, Qwen3

    config = ModelConfig(num_layers=MODEL["num_layers"], vocab_size=MODEL["vocab_size"],
                         embed_dim=MODEL["hidden_size"], hidden_dim=MODEL["intermediate_size"],
                         num_heads=MODEL["num_heads"], head_dim=MODEL["head_dim"], num_kv_heads=MODEL["num_kv_heads"],
                         rope_theta=int(MODEL["rope_theta"]), norm_eps=MODEL["rms_norm_eps"], use_tied_embedding=True)
    model = Qwen3(config, rngs=nnx.Rngs(0))

    class IdsTokenizer:
        def encode(self, text, **kwargs):
            return [int(piece) for piece in text.split()]

        def decode(self, ids, **kwargs):
            return " ".join(map(str, ids))

        def bos_id(self):
            return 0  # falsy: tunix then adds no BOS

        def eos_id(self):
            return -1

        def pad_id(self):
            return 0

    sampler = Sampler(model, IdsTokenizer(), CacheConfig(cache_size=PROMPT_BUCKET + NEW_TOKENS, num_layers=MODEL["num_layers"],
                                                         num_kv_heads=MODEL["num_kv_heads"], head_dim=MODEL["head_dim"]))

    def generate(prompts, new_tokens):
        sampler([" ".join(map(str, ids)) for ids in prompts], max_generation_steps=new_tokens,
                max_prompt_length=PROMPT_BUCKET, temperature=0.0, eos_tokens=[-1])

    return {batch: rates(generate, prompts_for(batch), repeats) for batch in BATCHES}


def run_engine(engine: str, repeats: int) -> dict:
    if engine == "jaxengine":
        return bench_jaxengine(repeats, streaming=False)
    if engine == "jaxengine-streaming":
        return bench_jaxengine(repeats, streaming=True)
    if engine == "jaxengine-training-layout":
        return bench_jaxengine(repeats, streaming=False, layout=False)
    if engine == "jaxengine-host-loop":
        return bench_host_loop(repeats)
    return bench_tunix(repeats)


def in_subprocess(python: str, engine: str, repeats: int) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    result = subprocess.run([python, __file__, "--engine", engine, "--repeats", str(repeats), "--json"],
                            env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{engine} benchmark failed:\n{result.stderr[-3000:]}")
    return {int(batch): figures for batch, figures in json.loads(result.stdout.splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("jaxengine", "jaxengine-training-layout", "jaxengine-streaming",
                                             "jaxengine-host-loop", "tunix"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tunix-python", default=str(REPO / "bench/.venv-tunix/bin/python"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(run_engine(args.engine, args.repeats)))
        return
    engines = {"jaxengine": sys.executable, "jaxengine-training-layout": sys.executable,
               "jaxengine-streaming": sys.executable, "jaxengine-host-loop": sys.executable, "tunix": args.tunix_python}
    results: dict[str, dict[int, dict[str, float]]] = {}
    for _ in range(args.rounds):
        for engine, python in engines.items():
            for batch, figures in in_subprocess(python, engine, args.repeats).items():
                best = results.setdefault(engine, {}).setdefault(batch, figures)
                for name, value in figures.items():
                    best[name] = min(best[name], value) if "_cpu_ms" in name else max(best[name], value)
    print(f"model: {MODEL}, float32, prompts padded to {PROMPT_BUCKET}, {NEW_TOKENS} new tokens, greedy, "
          f"best of {args.repeats} runs x {args.rounds} rounds")
    print("| engine | batch | prefill tok/s | decode tok/s | prefill CPU ms | decode CPU ms/step |")
    print("| --- | --- | --- | --- | --- | --- |")
    for engine, by_batch in results.items():
        for batch, figures in by_batch.items():
            print(f"| {engine} | {batch} | {figures['prefill_tokens_per_s']:.0f} | {figures['decode_tokens_per_s']:.1f} "
                  f"| {figures['prefill_cpu_ms']:.1f} | {figures['decode_cpu_ms_per_step']:.2f} |")
    for batch in BATCHES:
        ours, theirs = results["jaxengine"][batch], results["tunix"][batch]
        print(f"batch {batch}: jaxengine / tunix = prefill "
              f"{ours['prefill_tokens_per_s'] / theirs['prefill_tokens_per_s']:.2f}x, decode "
              f"{ours['decode_tokens_per_s'] / theirs['decode_tokens_per_s']:.2f}x (wall clock); by CPU time: prefill "
              f"{theirs['prefill_cpu_ms'] / ours['prefill_cpu_ms']:.2f}x, decode "
              f"{theirs['decode_cpu_ms_per_step'] / ours['decode_cpu_ms_per_step']:.2f}x")


if __name__ == "__main__":
    main()
