"""Concurrent requests arriving a few milliseconds apart at a warmed ``BatchingServer``, as the serve
worker receives a burst of chats: per round, its time, aggregate tokens/s, the median first token and
the XLA compiles it met (counted on jax's compile events; "stalling": on the serving loop while a request
of the round was unanswered, the rest ran while the server was idle), in one process without the web
or Redis.

    .venv/bin/python bench/serve_staggered.py --model bench/out/demo/model --rounds 14

The server is made and warmed as the serve worker makes it (``serving_devices``, ``devices_for_model`` and
the worker's own warm-up, ``BatchDecoder.warmup``: its requests, groups and prompt scorings); each round
submits ``--streams`` requests of ``--tokens`` tokens at temperature 0.7, each after a uniform random pause
of 0 to ``--stagger-ms`` (seeded). Prints one JSON object per round, with the cache moves it ran in numpy
while their programs were not compiled (count and seconds: on the serving loop, so they stall the rows too)
and the programs it newly missed (the keys of ``_Compiled.missed``, which the compile thread compiles once
the server is idle).
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import statistics
import threading
import time

import jax

from jaxengine import serving
from jaxengine.sampler import SamplingParams
from jaxengine.serving import (BatchDecoder, BatchingServer, ModelCache, ServeRequest, devices_for_model,
                               serving_devices)


def watch_moves(moves: collections.Counter, missed: list[str]) -> None:
    """Counts and times the numpy moves (``_relayout_on_host``, ``_insert_on_host``) into ``moves`` and lists each
    program a batch newly did without into ``missed``, by wrapping the serving module's own functions."""
    for name in ("_relayout_on_host", "_insert_on_host"):
        def timed(*args, _move=getattr(serving, name), _name=name, **kwargs):
            started = time.perf_counter()
            try:
                return _move(*args, **kwargs)
            finally:
                moves[_name.strip("_") + "_s"] += time.perf_counter() - started
                moves[_name.strip("_")] += 1
        setattr(serving, name, timed)
    miss = serving.ContinuousBatch._miss

    def recorded_miss(batch, key, compile_it):
        if key not in batch._compiled.missed:
            missed.append(repr(key))
        return miss(batch, key, compile_it)

    serving.ContinuousBatch._miss = recorded_miss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face-format model directory")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--stagger-ms", type=float, default=12.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pause-s", type=float, default=1.0,
                        help="seconds between rounds, as bursts of chats are apart (the server compiles what a "
                             "burst missed while idle)")
    parser.add_argument("--max-repeat", type=int, default=1,
                        help="each prompt asks its question 1 to this many times (uniform), so prompts fall in "
                             "several buckets as real chats' do (default 1: one bucket)")
    args = parser.parse_args()

    compiles: collections.Counter[str] = collections.Counter()  # by the thread that compiled
    futures: list = []  # the round's requests
    stalls: list[float] = []  # compiles on the serving loop while a request of the round was unanswered
    moves: collections.Counter[str] = collections.Counter()  # numpy moves: counts and seconds
    missed: list[str] = []  # programs newly done without, compiled later on the compile thread
    watch_moves(moves, missed)

    def on_event(event: str, seconds: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles[threading.current_thread().name] += 1
            if threading.current_thread().name == "batching-server" and not all(f.done() for f in futures):
                stalls.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(on_event)
    devices = serving_devices(None)  # before any JAX work, as the serve worker asks: one host device per core
    loaded = ModelCache(budget_bytes=1 << 40).get("bench", args.model)
    decoder = BatchDecoder(loaded.model, loaded.tokenizer, devices=devices_for_model(devices, loaded.nbytes))
    server = BatchingServer(decoder)
    started = time.perf_counter()
    server.warm(decoder.warmup())
    server.warmed.wait()
    print(json.dumps({"warmup_seconds": round(time.perf_counter() - started, 1), "devices": len(decoder.devices),
                      "compiles": dict(compiles)}))
    compiles.clear()
    moves.clear()
    missed.clear()
    rng = random.Random(args.seed)
    try:
        for round_ in range(args.rounds):
            futures.clear()
            started = time.monotonic()
            for index in range(args.streams):
                question = f"What is the largest digit in {rng.randint(1000, 9999)}? The answer is"
                prompt = loaded.tokenizer.encode(" ".join([question] * rng.randint(1, args.max_repeat)))
                params = SamplingParams(max_new_tokens=args.tokens, temperature=0.7, seed=round_ * args.streams + index)
                futures.append(server.submit(ServeRequest(prompt_ids=tuple(prompt), params=params, ignore_eos=True)))
                time.sleep(rng.uniform(0, args.stagger_ms / 1000))
            results = [future.result() for future in futures]
            seconds = time.monotonic() - started
            tokens = sum(len(result.token_ids) for result in results)
            time.sleep(args.pause_s)
            print(json.dumps({"round": round_, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds),
                              "first_token_median_s": round(statistics.median(r.first_token_seconds for r in results), 3),
                              "compiles": dict(compiles), "stalling_compiles": len(stalls),
                              "stalled_s": round(sum(stalls), 3),
                              "numpy_moves": {name: round(value, 3) for name, value in sorted(moves.items())},
                              "missed": missed[:]}))
            compiles.clear()
            stalls.clear()
            moves.clear()
            missed.clear()
    finally:
        server.close()
        jax.monitoring.unregister_event_duration_listener(on_event)


if __name__ == "__main__":
    main()
