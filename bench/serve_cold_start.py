"""A fresh serve process's first answer: load the model, then time one request through ``BatchDecoder``
(compiles included), as a restarted serve worker meets its first chat. Run it twice with the same
``JAX_COMPILATION_CACHE_DIR`` (what the worker sets from ``TEMPER_JAX_CACHE``): the first run fills the
persistent compilation cache, the second reads it.

    JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache .venv/bin/python bench/serve_cold_start.py --model bench/out/demo_sft/export

Prints one JSON object: load seconds, first answer seconds (wall and process CPU), tokens.
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
    args = parser.parse_args()
    started = time.perf_counter()
    from jaxengine.data.pipeline import encode_prompt
    from jaxengine.sampler import SamplingParams
    from jaxengine.serving import BatchDecoder, ServeRequest, load_serving_model

    loaded = load_serving_model(args.model)
    decoder = BatchDecoder(loaded.model, loaded.tokenizer)
    loaded_at = time.perf_counter()
    request = ServeRequest(prompt_ids=tuple(encode_prompt(loaded.tokenizer, "What is 17 + 25?")),
                           params=SamplingParams(max_new_tokens=args.tokens, temperature=0.7), ignore_eos=True)
    wall, cpu = time.perf_counter(), time.process_time()
    [result] = decoder.run([request])
    print(json.dumps({"model": args.model, "cache_dir": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
                      "load_seconds": round(loaded_at - started, 2),
                      "first_answer_seconds": round(time.perf_counter() - wall, 2),
                      "first_answer_cpu_seconds": round(time.process_time() - cpu, 2),
                      "tokens": len(result.token_ids), "load_average": [round(v, 2) for v in os.getloadavg()]}))


if __name__ == "__main__":
    main()
