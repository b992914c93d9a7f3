"""Concurrent streamed chat answers end to end over HTTP: N clients at once post a streaming
``/v1/chat/completions`` to a running Temper and read it to the end, through the web process, Redis and
the serve worker's batching server, as the chat panel and API users do. ``bench/serve_throughput.py``
measures the decoder alone; this measures what a person gets.

    TEMPER_DATA=/tmp/var TEMPER_PORT=8799 bash scripts/up.sh &
    .venv/bin/python manage.py apitoken --user admin --project demo      # prints the token
    .venv/bin/python bench/api_streams.py --url http://127.0.0.1:8799 --token TOKEN --streams 1 16

For each N, best of ``--repeats`` rounds (after one warm-up round): aggregate completion tokens/s (the
tokens every answer reports in its usage, over the wall time from the first request to the last answer's
end), streamed chunks/s, and the median and worst time to first chunk. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import openai


def one_answer(client: openai.OpenAI, model: str, prompt: str, tokens: int, seed: int) -> dict:
    started = time.perf_counter()
    first = None
    chunks = 0
    usage = None
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=tokens, temperature=0.7,
        seed=seed, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
            if first is None:
                first = time.perf_counter() - started
    return {"first_chunk_s": first, "chunks": chunks, "tokens": usage.completion_tokens if usage else 0}


def one_round(client: openai.OpenAI, model: str, streams: int, tokens: int) -> dict:
    answers: list[dict] = [{}] * streams

    def run(index: int) -> None:
        answers[index] = one_answer(client, model, f"What is {index} + {index + 7}?", tokens, seed=index)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(streams)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    firsts = [answer["first_chunk_s"] for answer in answers if answer.get("first_chunk_s") is not None]
    return {"seconds": seconds,
            "tokens_per_s": sum(answer.get("tokens", 0) for answer in answers) / seconds,
            "chunks_per_s": sum(answer.get("chunks", 0) for answer in answers) / seconds,
            "tokens": sum(answer.get("tokens", 0) for answer in answers),
            "first_chunk_median_s": statistics.median(firsts) if firsts else None,
            "first_chunk_max_s": max(firsts) if firsts else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--model", help="a model id of /v1/models (default: the first)")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=f"{args.url}/v1", api_key=args.token, timeout=120, max_retries=0)
    model = args.model or client.models.list().data[0].id
    one_round(client, model, 1, args.tokens)  # warm-up: loads the model in the serve worker
    results = {}
    for streams in args.streams:
        one_round(client, model, streams, args.tokens)
        rounds = [one_round(client, model, streams, args.tokens) for _ in range(args.repeats)]
        results[streams] = max(rounds, key=lambda result: result["tokens_per_s"])
    print(json.dumps({"model": model, "tokens": args.tokens, "results": results}, indent=1))


if __name__ == "__main__":
    main()
