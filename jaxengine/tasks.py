"""What each training task contributes to the one trainer: its loss on a batch.

A task is a small frozen object with ``loss(model, batch) -> (loss, weight, metrics)``: ``loss`` is
the mean over the batch's units (loss tokens for language modelling, pairs for preferences),
``weight`` the number of those units. The trainer accumulates ``loss * weight`` over micro-batches
and divides by the total weight, so gradient accumulation gives exactly the gradient of the mean
over the whole optimizer step (a micro-batch with more loss tokens counts for more, as it would
in one big batch). ``metrics`` are averaged with the same weights.

A task whose loss keeps statistics across steps (dpo's bco_pair) also has ``initial_loss_state()`` and
``loss_with_state(model, batch, loss_state) -> (loss, weight, metrics, loss_state)``: the trainer hands each
micro-batch the state the one before left, in order, and keeps the last (``jaxengine.trainer``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxengine import losses
from jaxengine.data.pipeline import (
    PreferenceBatch,
    PreferencePair,
    TokenBatch,
    attention_mask,
    last_token_index,
    make_batch,
)
from jaxengine.spec import SMOOTHED_DPO_LOSSES, DpoSpec


def hidden_states_of(model, batch: TokenBatch, *, unpacked: bool = False) -> jax.Array:
    """Final-normed hidden states [B, T, D] of ``batch`` under ``model``, packed segments kept apart.

    ``unpacked``: every row is one right-padded example, so the model gets row lengths instead
    of a dense [B, T, T] segment mask, which lets it use fused (flash) attention. Hidden states at
    real tokens are the same either way; at padding they differ and are never used.
    """
    if unpacked:
        lengths_b = jnp.sum(batch.segment_ids > 0, axis=-1).astype(jnp.int32)
        hidden_btd, _ = model.hidden_states(batch.input_ids, batch.positions, lengths_b=lengths_b)
        return hidden_btd
    hidden_btd, _ = model.hidden_states(batch.input_ids, batch.positions,
                                        attention_mask_bts=attention_mask(batch.segment_ids))
    return hidden_btd


def token_log_probs_of(model, batch: TokenBatch, *, chunk_size: int, unpacked: bool = False,
                       logits_memory_budget: int = 0) -> jax.Array:
    """Float32 [B, T] log p(targets) under ``model`` (see ``hidden_states_of``), logits chunked above the budget."""
    return losses.chunked_token_log_probs(hidden_states_of(model, batch, unpacked=unpacked), batch.targets,
                                          model.logits, chunk_size=chunk_size,
                                          logits_memory_budget=logits_memory_budget)


# Loss-position counts are rounded up to a multiple of 1/LOSS_POSITION_BUCKETS of the batch's B x T
# positions: at most this many step shapes compile, and at most B x T / 8 rows are projected for nothing.
LOSS_POSITION_BUCKETS = 8


def loss_position_bucket(count: int, positions: int) -> int:
    """``count`` loss positions rounded up to the next bucket of ``positions`` (B x T); at least one bucket."""
    step = -(-positions // LOSS_POSITION_BUCKETS)
    return min(positions, max(1, -(-count // step)) * step)


@dataclass(frozen=True, kw_only=True)
class LanguageModelTask:
    """pretrain and sft: mean next-token cross-entropy over the loss tokens.

    The output projection and the cross-entropy run only on the loss positions (the completions of
    an SFT batch), gathered into ``loss_positions`` rows: the trainer sets that static count for each
    step's batches with ``for_batches``. ``None`` (or every position) takes the full [B, T] path.
    """

    name: str = "sft"
    chunk_size: int = 256
    # Rows are never packed (data.packing off): pass lengths, not a dense mask (see hidden_states_of).
    unpacked: bool = False
    # 0: chunked and recomputed above chunk_size, as before the budget (jobs pass the spec's, by default
    # losses.LOGITS_MEMORY_BUDGET; the demo build keeps 0 so that its model stays the same).
    logits_memory_budget: int = 0
    loss_positions: int | None = None

    def for_batches(self, batches: TokenBatch) -> LanguageModelTask:
        """This task with ``loss_positions`` bucketed for host ``batches`` ([B, T] or stacked [A, B, T])."""
        mask = np.asarray(batches.loss_mask)
        rows, length = mask.shape[-2:]
        most = int(mask.reshape(-1, rows * length).sum(axis=1).max())
        return dataclasses.replace(self, loss_positions=loss_position_bucket(most, rows * length))

    def loss(self, model, batch: TokenBatch) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        rows, length = batch.loss_mask.shape
        if self.loss_positions is None or self.loss_positions >= rows * length:
            log_probs, mask = token_log_probs_of(model, batch, chunk_size=self.chunk_size, unpacked=self.unpacked,
                                                 logits_memory_budget=self.logits_memory_budget), batch.loss_mask
        else:
            log_probs, mask = losses.loss_token_log_probs(
                hidden_states_of(model, batch, unpacked=self.unpacked), batch.targets, batch.loss_mask,
                model.logits, capacity=self.loss_positions, chunk_size=self.chunk_size,
                logits_memory_budget=self.logits_memory_budget)
        loss, metrics = losses.masked_cross_entropy(log_probs, mask)
        return loss, metrics["loss_tokens"], {"loss": loss}

    @staticmethod
    def tokens(batch: TokenBatch) -> jax.Array:
        """Non-padding tokens in the batch (for throughput)."""
        return jnp.sum(batch.segment_ids > 0)


def _concat_rows(first: TokenBatch, second: TokenBatch) -> TokenBatch:
    """Both batches as one [2B, T] batch (first's rows, then second's), for a single forward pass."""
    return jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=0), first, second)


def preference_log_probs(model, batch: PreferenceBatch, *, chunk_size: int):
    """Summed log-probs and loss-token counts of the chosen and rejected continuations, each [B] float32."""
    both = _concat_rows(batch.chosen, batch.rejected)
    sums_2b, counts_2b = losses.sequence_log_probs(token_log_probs_of(model, both, chunk_size=chunk_size),
                                                   both.loss_mask)
    rows = batch.chosen.input_ids.shape[0]
    return sums_2b[:rows], sums_2b[rows:], counts_2b[:rows], counts_2b[rows:]


REFERENCE_FREE = ("simpo", "orpo")
# The loss state's key for bco_pair's running mean of rewards (also its name in checkpoints).
BCO_RUNNING_MEAN = "bco_running_mean"
# Losses defined on length-averaged log-probs (as in their papers and TRL); the others use sums.
AVERAGED = ("ipo", "simpo", "orpo")


@dataclass(frozen=True, kw_only=True)
class PreferenceTask:
    """dpo: one of the registered preference losses on (policy, reference) sequence log-probs.

    The reference log-probs travel in the batch, computed once before training by
    ``with_reference_log_probs`` from the initial model: the base weights themselves under LoRA
    (fresh adapters add exactly zero), the starting weights under full fine-tuning. So no second
    copy of the model is ever held, and the reference costs one forward pass over the data.
    """

    loss_name: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5
    discopop_tau: float = 0.05
    chunk_size: int = 256

    @classmethod
    def from_spec(cls, dpo: DpoSpec) -> PreferenceTask:
        """The task a job's ``dpo`` section asks for, with every setting of it that a loss reads."""
        return cls(loss_name=dpo.loss, beta=dpo.beta, label_smoothing=dpo.label_smoothing,
                   simpo_gamma=dpo.simpo_gamma, discopop_tau=dpo.discopop_tau)

    def initial_loss_state(self) -> dict[str, losses.RunningMean]:
        """What the loss carries from step to step (the trainer keeps it with the weights and checkpoints it):
        bco_pair's running mean of the implicit rewards; nothing for the other losses."""
        return {BCO_RUNNING_MEAN: losses.running_mean_start()} if self.loss_name == "bco_pair" else {}

    def loss(self, model, batch: PreferenceBatch) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``loss_with_state`` from the initial loss state: the batch scored on its own (bco_pair's delta is then
        the batch's mean reward)."""
        loss, weight, metrics, _ = self.loss_with_state(model, batch, self.initial_loss_state())
        return loss, weight, metrics

    def loss_with_state(self, model, batch: PreferenceBatch, loss_state: dict[str, losses.RunningMean]
                        ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array], dict[str, losses.RunningMean]]:
        """(loss, weight, metrics) on ``batch``, and ``loss_state`` (``initial_loss_state``'s form) after it."""
        chosen, rejected, chosen_count, rejected_count = preference_log_probs(model, batch, chunk_size=self.chunk_size)
        reference_chosen, reference_rejected = batch.reference_chosen, batch.reference_rejected
        if self.loss_name in AVERAGED:
            chosen_count, rejected_count = jnp.maximum(chosen_count, 1.0), jnp.maximum(rejected_count, 1.0)
            chosen, rejected = chosen / chosen_count, rejected / rejected_count
            reference_chosen, reference_rejected = reference_chosen / chosen_count, reference_rejected / rejected_count
        if self.loss_name == "simpo":
            loss, metrics = losses.simpo_loss(chosen, rejected, beta=self.beta, gamma=self.simpo_gamma)
        elif self.loss_name == "orpo":
            loss, metrics = losses.orpo_loss(chosen, rejected, beta=self.beta)
        elif self.loss_name == "bco_pair":
            loss, running, metrics = losses.bco_pair_loss(chosen, rejected, reference_chosen, reference_rejected,
                                                          loss_state[BCO_RUNNING_MEAN], beta=self.beta)
            loss_state = {**loss_state, BCO_RUNNING_MEAN: running}
        else:
            loss, metrics = losses.LOSSES[self.loss_name](chosen, rejected, reference_chosen, reference_rejected,
                                                          beta=self.beta, **self._loss_options())
        weight = jnp.asarray(batch.chosen.input_ids.shape[0], jnp.float32)
        return loss, weight, {"loss": loss, **metrics}, loss_state

    def _loss_options(self) -> dict[str, float]:
        """The settings a loss against a reference reads beyond beta."""
        if self.loss_name in SMOOTHED_DPO_LOSSES:
            return {"label_smoothing": self.label_smoothing}
        if self.loss_name == "discopop":
            return {"tau": self.discopop_tau}
        return {}


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk_size"))
def _reference_step(state, batch: PreferenceBatch, *, graphdef, chunk_size: int):
    chosen, rejected, _, _ = preference_log_probs(nnx.merge(graphdef, state), batch, chunk_size=chunk_size)
    return chosen, rejected


def with_reference_log_probs(model, pairs: Sequence[PreferencePair], *, batch_size: int, max_seq_len: int,
                             pad_id: int, chunk_size: int = 256, only: Sequence[int] | None = None
                             ) -> list[PreferencePair]:
    """``pairs`` with ``reference_chosen``/``reference_rejected`` computed by ``model`` (in eval mode).

    ``only``: the indices of the pairs training will read (``pipeline.examples_drawn``); the others get
    NaN, so that reading one would fail the run's loss check instead of training on a made-up reference.
    """
    model.eval()
    graphdef, state = nnx.split(model)
    model.train()
    indices = range(len(pairs)) if only is None else only
    filled = [dataclasses.replace(pair, reference_chosen=math.nan, reference_rejected=math.nan) for pair in pairs]
    for start in range(0, len(indices), batch_size):
        chunk = list(indices[start : start + batch_size])
        batch = make_batch([pairs[index] for index in chunk], max_seq_len=max_seq_len, pad_id=pad_id)
        chosen, rejected = _reference_step(state, batch, graphdef=graphdef, chunk_size=chunk_size)
        for index, c, r in zip(chunk, np.asarray(chosen), np.asarray(rejected)):
            filled[index] = dataclasses.replace(pairs[index], reference_chosen=float(c), reference_rejected=float(r))
    return filled


class HeadParam(nnx.Param):
    """A task head's weight: trained under full fine-tuning and under LoRA alike."""


class RewardModel(nnx.Module):
    """A causal LM backbone with a scalar head read at each sequence's last real token."""

    def __init__(self, backbone, *, seed: int = 0):
        self.backbone = backbone
        width = backbone.config.hidden_size
        key = jax.random.key(seed)
        # Small init: rewards start near zero, so the first Bradley-Terry losses are near log 2.
        self.score = HeadParam(jax.random.normal(key, (width, 1), jnp.float32) / (10.0 * np.sqrt(width)))

    def __call__(self, batch: TokenBatch) -> jax.Array:
        """Float32 rewards [B] of right-padded, unpacked sequences."""
        hidden_btd, _ = self.backbone.hidden_states(batch.input_ids, batch.positions,
                                                    attention_mask_bts=attention_mask(batch.segment_ids))
        last_b = last_token_index(batch)
        hidden_bd = jnp.take_along_axis(hidden_btd, last_b[:, None, None], axis=1)[:, 0]
        return (hidden_bd.astype(jnp.float32) @ self.score[...])[:, 0]


@dataclass(frozen=True, kw_only=True)
class RewardTask:
    """reward: Bradley-Terry on (chosen, rejected) rewards; logs ``accuracy`` and ``margin``."""

    center_rewards_coefficient: float = 0.0

    def loss(self, model: RewardModel, batch: PreferenceBatch) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        rewards_2b = model(_concat_rows(batch.chosen, batch.rejected))
        rows = batch.chosen.input_ids.shape[0]
        loss, metrics = losses.bradley_terry_loss(rewards_2b[:rows], rewards_2b[rows:],
                                                  center_rewards_coefficient=self.center_rewards_coefficient)
        return loss, jnp.asarray(rows, jnp.float32), {"loss": loss, **metrics}


REWARD_HEAD_FILE = "reward_head.safetensors"


def save_reward_head(model: RewardModel, out_dir) -> None:
    """Write the head as ``score.weight`` [1, D] (the layout of transformers' *ForSequenceClassification)."""
    from jaxengine.checkpoint.hf import write_safetensors

    write_safetensors({"score.weight": np.ascontiguousarray(np.asarray(model.score[...], np.float32).T)},
                      f"{out_dir}/{REWARD_HEAD_FILE}", metadata={"format": "pt"})


def load_reward_model(model_dir) -> RewardModel:
    """A reward model from an exported run (``export/``: the backbone in HF format plus the head file)."""
    from safetensors.numpy import load_file

    from jaxengine.checkpoint.hf import load_hf_model

    backbone, _ = load_hf_model(model_dir)
    model = RewardModel(backbone)
    model.score[...] = jnp.asarray(load_file(f"{model_dir}/{REWARD_HEAD_FILE}")["score.weight"].T)
    return model
