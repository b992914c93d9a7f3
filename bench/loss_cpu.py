"""The SFT loss alone on CPU: value and gradient w.r.t. the hidden states of batch 8 x 256, width 512,
vocabulary 16384 (the ``bench/train_cpu.py`` model's output projection), with the loss on the second
half of each row, three ways:

- ``full``: logits at all B x T positions, stored for the backward pass (the plain path);
- ``gathered``: ``losses.loss_token_log_probs``, logits only at the 1024 loss positions;
- ``recomputed``: all positions, chunked by 256 under ``jax.checkpoint`` (``logits_memory_budget=0``).

Best of 5 alternating rounds, CPU seconds (all threads) and wall seconds per call, after compiling.

    .venv/bin/python bench/loss_cpu.py
"""
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxengine import losses

B, T, D, V = 8, 256, 512, 16384


def main() -> None:
    key_h, key_w, key_t = jax.random.split(jax.random.key(0), 3)
    hidden_btd = jax.random.normal(key_h, (B, T, D))
    table_vd = jax.random.normal(key_w, (V, D)) * 0.02
    targets_bt = jax.random.randint(key_t, (B, T), 0, V)
    mask_bt = jnp.broadcast_to(jnp.arange(T) >= T // 2, (B, T))

    # The table, targets and mask are arguments, not closed-over constants (XLA would fold those).
    def full(h, table, targets, mask):
        log_probs_bt = losses.chunked_token_log_probs(h, targets, lambda x: x @ table.T,
                                                      logits_memory_budget=losses.LOGITS_MEMORY_BUDGET)
        return losses.masked_cross_entropy(log_probs_bt, mask)[0]

    def gathered(h, table, targets, mask):
        log_probs_n, real_n = losses.loss_token_log_probs(h, targets, mask, lambda x: x @ table.T, capacity=B * T // 2,
                                                          logits_memory_budget=losses.LOGITS_MEMORY_BUDGET)
        return losses.masked_cross_entropy(log_probs_n, real_n)[0]

    def recomputed(h, table, targets, mask):
        log_probs_bt = losses.chunked_token_log_probs(h, targets, lambda x: x @ table.T, logits_memory_budget=0)
        return losses.masked_cross_entropy(log_probs_bt, mask)[0]

    args = (hidden_btd, table_vd, targets_bt, mask_bt)
    variants = {name: jax.jit(jax.value_and_grad(fn))
                for name, fn in (("full", full), ("gathered", gathered), ("recomputed", recomputed))}
    results = {name: jax.block_until_ready(fn(*args)) for name, fn in variants.items()}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(5):
        for name, fn in variants.items():
            cpu, wall = time.process_time(), time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append((time.process_time() - cpu, time.perf_counter() - wall))
    for name, pairs in times.items():
        gap = float(np.abs(results[name][1] - results["full"][1]).max())
        print(f"{name:10s} CPU {min(c for c, _ in pairs):.3f} s  wall {min(w for _, w in pairs):.3f} s  "
              f"loss {float(results[name][0]):.6f}  max |grad - full grad| {gap:.1e}")


if __name__ == "__main__":
    main()
