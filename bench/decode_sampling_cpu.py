"""The per-step sampling work of a decode step on CPU, before and after the sampler read it in one pass.

Times, jitted, over logits [B, 16384] (the sampler bench's vocabulary): the greedy argmax
(``jaxengine.sampler.first_max_index``) and the argmax with the chosen token's log-probability (what every
decode step of ``Sampler`` computes), against the formulations they replaced: a max and then a min over
the whole row, and a gather from ``log_softmax``. Best of 5 x 500 calls, wall and process CPU microseconds.

    .venv/bin/python bench/decode_sampling_cpu.py
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxengine.sampler import _token_logprobs, first_max_index

VOCAB = 16384


def two_pass_argmax(values_bv):
    """The argmax before: a max, then a min over the indices that hold it, each over the whole row."""
    size = values_bv.shape[-1]
    largest_b1 = jnp.max(values_bv, axis=-1, keepdims=True)
    holds_it_bv = (values_bv == largest_b1) | jnp.isnan(values_bv)
    return jnp.min(jnp.where(holds_it_bv, jnp.arange(size, dtype=jnp.int32), size), axis=-1)


def step_before(logits_bv):
    token_b = two_pass_argmax(logits_bv)
    return token_b, jnp.take_along_axis(jax.nn.log_softmax(logits_bv, axis=-1), token_b[:, None], axis=-1)[:, 0]


def step_after(logits_bv):
    token_b = first_max_index(logits_bv)
    return token_b, _token_logprobs(logits_bv, token_b)


def best_microseconds(function, argument, calls: int = 500) -> tuple[float, float]:
    jax.block_until_ready(function(argument))
    best = (float("inf"), float("inf"))
    for _ in range(5):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            result = function(argument)
        jax.block_until_ready(result)
        best = min(best, ((time.perf_counter() - wall) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6))
    return best


def main() -> None:
    print("| rows | argmax before | argmax after | argmax + logprob before | argmax + logprob after |")
    print("| --- | --- | --- | --- | --- |")
    for batch in (1, 16):
        logits_bv = jnp.asarray(np.random.default_rng(batch).standard_normal((batch, VOCAB), np.float32) * 3)
        before, after = jax.jit(step_before), jax.jit(step_after)
        assert (np.asarray(before(logits_bv)[0]) == np.asarray(after(logits_bv)[0])).all()
        np.testing.assert_allclose(before(logits_bv)[1], after(logits_bv)[1], atol=1e-5)
        cells = [best_microseconds(jax.jit(two_pass_argmax), logits_bv), best_microseconds(jax.jit(first_max_index), logits_bv),
                 best_microseconds(before, logits_bv), best_microseconds(after, logits_bv)]
        print(f"| {batch} | " + " | ".join(f"{wall:.0f} us ({cpu:.0f} CPU)" for wall, cpu in cells) + " |")


if __name__ == "__main__":
    main()
