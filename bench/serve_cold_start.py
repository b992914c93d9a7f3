"""A fresh serve process's first answer: load the model, then time one request (compiles included), as a
restarted serve worker meets its first chat. ``--warm`` first runs the serve worker's warm-up
(``BatchingServer.warm`` with ``BatchDecoder.warmup_requests()``) and times it, then the answer.

Run it twice with the same ``JAX_COMPILATION_CACHE_DIR`` (what the worker sets from ``TEMPER_JAX_CACHE``,
with ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``): the first run fills the persistent compilation
cache, the second reads it.

    JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \\
        .venv/bin/python bench/serve_cold_start.py --model bench/out/demo/model [--warm]

Prints one JSON object: load seconds, warm-up seconds (wall and process CPU), the first answer's time to
first token, whole time (wall and CPU) and longest pause between two tokens, and its tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--warm", action="store_true", help="run the serve worker's warm-up before the answer")
    args = parser.parse_args()
    started = time.perf_counter()
    from jaxengine.data.pipeline import encode_prompt
    from jaxengine.sampler import SamplingParams
    from jaxengine.serving import BatchDecoder, BatchingServer, ServeRequest, load_serving_model

    loaded = load_serving_model(args.model)
    decoder = BatchDecoder(loaded.model, loaded.tokenizer)
    server = BatchingServer(decoder)
    loaded_at = time.perf_counter()
    figures = {"model": args.model, "cache_dir": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
               "load_seconds": round(loaded_at - started, 2)}
    if args.warm:
        wall, cpu = time.perf_counter(), time.process_time()
        server.warm(decoder.warmup_requests())
        server.warmed.wait()
        figures.update(warmup_seconds=round(time.perf_counter() - wall, 2),
                       warmup_cpu_seconds=round(time.process_time() - cpu, 2))
    request = ServeRequest(prompt_ids=tuple(encode_prompt(loaded.tokenizer, "What is 17 + 25?")),
                           params=SamplingParams(max_new_tokens=args.tokens, temperature=0.7), ignore_eos=True)
    read_times = []  # when each read of the device streamed its tokens (the first token, then each call's)
    wall, cpu = time.perf_counter(), time.process_time()
    result = server.submit(request, on_tokens=lambda token_ids, delta: read_times.append(time.perf_counter())).result()
    server.close()
    pauses = [later - earlier for earlier, later in zip(read_times, read_times[1:])]
    figures.update(first_token_seconds=round(read_times[0] - wall, 3),
                   first_answer_seconds=round(time.perf_counter() - wall, 2),
                   first_answer_cpu_seconds=round(time.process_time() - cpu, 2),
                   longest_pause_seconds=round(max(pauses), 3), tokens=len(result.token_ids),
                   load_average=[round(v, 2) for v in os.getloadavg()])
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
