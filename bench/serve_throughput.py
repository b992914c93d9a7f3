"""Serving throughput on CPU: time to first token and tokens/s per stream for 1 and N concurrent
chats decoded as one batch by ``jaxengine.serving.BatchDecoder`` (the serve worker's path).

    .venv/bin/python bench/serve_throughput.py --model bench/out/demo_sft/export --streams 1 16 --tokens 64

Each configuration is run once to compile, then timed; prints one JSON object per stream count.
"""
from __future__ import annotations

import argparse
import json
import time

from jaxengine.data.pipeline import encode_prompt
from jaxengine.sampler import SamplingParams
from jaxengine.serving import BatchDecoder, ServeRequest, load_serving_model


def measure(decoder: BatchDecoder, prompts: list[list[int]], tokens: int) -> dict:
    requests = [ServeRequest(prompt_ids=tuple(ids), params=SamplingParams(max_new_tokens=tokens, temperature=0.7,
                                                                          seed=row), ignore_eos=True)
                for row, ids in enumerate(prompts)]  # every stream decodes its whole budget
    decoder.run(requests)  # compile
    started = time.perf_counter()
    results = decoder.run(requests)
    seconds = time.perf_counter() - started
    generated = sum(len(result.token_ids) for result in results)
    return {"streams": len(prompts), "seconds": round(seconds, 3), "tokens": generated,
            "aggregate_tokens_per_second": round(generated / seconds, 1),
            "tokens_per_second_per_stream": round(generated / seconds / len(prompts), 1),
            "time_to_first_token_ms": round(1000 * max(result.first_token_seconds for result in results), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory or quantized serving copy")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    loaded = load_serving_model(args.model)
    decoder = BatchDecoder(loaded.model, loaded.tokenizer)
    questions = [f"What is {17 + i} + {25 + 2 * i}?" for i in range(max(args.streams))]
    prompts = [encode_prompt(loaded.tokenizer, question) for question in questions]
    for count in args.streams:
        print(json.dumps({"model": args.model, **measure(decoder, prompts[:count], args.tokens)}), flush=True)


if __name__ == "__main__":
    main()
