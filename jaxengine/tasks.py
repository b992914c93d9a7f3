"""What each training task contributes to the one trainer: its loss on a batch.

A task is a small frozen object with ``loss(model, batch) -> (loss, weight, metrics)``: ``loss`` is
the mean over the batch's units (loss tokens for language modelling, pairs for preferences),
``weight`` the number of those units. The trainer accumulates ``loss * weight`` over micro-batches
and divides by the total weight, so gradient accumulation gives exactly the gradient of the mean
over the whole optimizer step (a micro-batch with more loss tokens counts for more, as it would
in one big batch). ``metrics`` are averaged with the same weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jaxengine import losses
from jaxengine.data.pipeline import TokenBatch, attention_mask


def token_log_probs_of(model, batch: TokenBatch, *, chunk_size: int) -> jax.Array:
    """Float32 [B, T] log p(targets) under ``model``, packed segments kept apart, logits chunked."""
    hidden_btd, _ = model.hidden_states(batch.input_ids, batch.positions,
                                        attention_mask_bts=attention_mask(batch.segment_ids))
    return losses.chunked_token_log_probs(hidden_btd, batch.targets, model.logits, chunk_size=chunk_size)


@dataclass(frozen=True, kw_only=True)
class LanguageModelTask:
    """pretrain and sft: mean next-token cross-entropy over the loss tokens."""

    name: str = "sft"
    chunk_size: int = 256

    def loss(self, model, batch: TokenBatch) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        log_probs_bt = token_log_probs_of(model, batch, chunk_size=self.chunk_size)
        loss, metrics = losses.masked_cross_entropy(log_probs_bt, batch.loss_mask)
        return loss, metrics["loss_tokens"], {"loss": loss}

    @staticmethod
    def tokens(batch: TokenBatch) -> jax.Array:
        """Non-padding tokens in the batch (for throughput)."""
        return jnp.sum(batch.segment_ids > 0)
