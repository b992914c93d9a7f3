"""``task: grpo``: rollouts with the KV-cache sampler, rewards, advantages, and the GRPO-family loss.

Design note. The one trainer (``jaxengine.trainer``) runs the optimisation; this module supplies
its two pieces:

* ``GrpoRollouts`` is the trainer's ``batch_source``. Each call samples G completions for each
  prompt of the step from ``trainer.current_model()`` (the trainer's own arrays merged into a
  module: rollout and update share the weights in memory, nothing is copied), scores them with the
  spec's reward functions (``jaxengine.rewards``), turns group rewards into advantages
  (``jaxengine.rl``), and, only when ``beta > 0``, runs the reference forward pass: the same
  weights with the LoRA adapters replaced by zeros (their update is then exactly zero), or under
  full fine-tuning the starting weights kept once. It writes every rollout to ``samples.jsonl``
  and returns a ``RolloutBatch`` whose ``stats`` carry the rollout metrics into the step's metrics.
* ``GrpoTask.loss`` recomputes the policy log-probs (chunked, as every task) and applies
  ``rl.grpo_loss``. With ``num_iterations`` 1 the old policy *is* the current one, so the old
  log-probs are the current ones under stop_gradient and the ratio is exactly 1 (as in TRL); with
  more, the same rollouts serve ``num_iterations`` consecutive steps and the old log-probs are the
  sampler's (those of the weights that generated them, under the raw distribution).

Rows are ``prompt + completion`` right-padded to one fixed width (the longest prompt plus
``max_new_tokens``), so every step has the same shapes and compiles once.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxengine import losses, rl
from jaxengine.data.formats import Entry
from jaxengine.data.pipeline import TokenBatch
from jaxengine.rewards import (RewardError, WeightedReward, missing_reference_column, reference_answer, score_rewards,
                               unscorable_reference)
from jaxengine.sampler import Generation, Sampler, SamplingParams
from jaxengine.spec import GrpoSpec
from jaxengine.trainer import TrainingError

@jax.tree_util.register_dataclass
@dataclass(frozen=True, kw_only=True)
class RolloutBatch:
    """Prompt + completion rows, right-padded, every [B, T] field aligned with ``tokens.targets``.

    ``tokens.loss_mask`` is true on the completion tokens that count; ``old_log_probs`` are the
    sampler's log-probs of those tokens; ``reference_log_probs`` the reference model's (zeros when
    beta is 0); ``advantages`` one per row [B]; ``stats`` scalar rollout metrics of the whole step.
    """

    tokens: TokenBatch
    old_log_probs: jax.Array
    reference_log_probs: jax.Array
    advantages: jax.Array
    stats: dict[str, jax.Array]


@dataclass(frozen=True, kw_only=True)
class GrpoTask:
    """The GRPO-family loss on a ``RolloutBatch`` (see module note)."""

    loss_type: str = "grpo"
    epsilon: float = 0.2
    epsilon_high: float = 0.2
    beta: float = 0.0
    kl_estimator: str = "k3"
    max_completion_length: int
    use_stored_old_log_probs: bool = False
    chunk_size: int = 256
    # First target position that can hold a completion token (the shortest prompt's length - 1):
    # logits, log-probs and entropy are computed from there on only, not over prompt positions.
    completion_start: int = 0

    def loss(self, model, batch: RolloutBatch) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        tokens = batch.tokens
        lengths_b = jnp.sum(tokens.segment_ids > 0, axis=-1).astype(jnp.int32)
        hidden_btd, _ = model.hidden_states(tokens.input_ids, tokens.positions, lengths_b=lengths_b)
        start = self.completion_start
        hidden_btd, mask_bt = hidden_btd[:, start:], tokens.loss_mask[:, start:]
        log_probs_bt = losses.chunked_token_log_probs(hidden_btd, tokens.targets[:, start:], model.logits,
                                                      chunk_size=self.chunk_size)
        old_log_probs_bt = (batch.old_log_probs[:, start:] if self.use_stored_old_log_probs
                            else jax.lax.stop_gradient(log_probs_bt))
        loss, metrics = rl.grpo_loss(
            log_probs_bt, old_log_probs_bt, batch.reference_log_probs[:, start:], batch.advantages, mask_bt,
            loss_type=self.loss_type, epsilon=self.epsilon, epsilon_high=self.epsilon_high, beta=self.beta,
            kl_estimator=self.kl_estimator, max_completion_length=self.max_completion_length)
        entropy_bt = rl.chunked_entropy(hidden_btd, model.logits, chunk_size=self.chunk_size)
        mask_f = mask_bt.astype(jnp.float32)
        # Token-level (dapo) losses weigh micro-batches by tokens, the others by completions.
        weight = jnp.sum(mask_f) if self.loss_type == "dapo" else jnp.asarray(tokens.input_ids.shape[0], jnp.float32)
        return loss, weight, {"loss": loss, **metrics, "entropy": rl.token_mean(entropy_bt, mask_bt),
                              **batch.stats}



@functools.partial(jax.jit, static_argnames=("graphdef", "chunk_size"))
def _reference_log_probs(params, rng_state, frozen, tokens: TokenBatch, *, graphdef, chunk_size: int) -> jax.Array:
    model = nnx.merge(graphdef, params, rng_state, frozen)
    lengths_b = jnp.sum(tokens.segment_ids > 0, axis=-1).astype(jnp.int32)
    hidden_btd, _ = model.hidden_states(tokens.input_ids, tokens.positions, lengths_b=lengths_b)
    return losses.chunked_token_log_probs(hidden_btd, tokens.targets, model.logits, chunk_size=chunk_size)


def lora_off_reference(trainer) -> Any:
    """Reference weights under LoRA: the trainable (adapter) arrays as zeros, so every update is exactly 0."""
    return jax.tree.map(jnp.zeros_like, trainer.params)


def frozen_copy_reference(params: Any) -> Callable[[Any], Any]:
    """Reference weights under full fine-tuning: a copy of ``params`` (the starting weights), kept once."""
    kept = jax.tree.map(jnp.copy, params)
    return lambda trainer: kept


def rollout_rows(prompt_ids: Sequence[list[int]], generations: Sequence[Generation], *, width: int, pad_id: int,
                 mask_truncated: bool) -> tuple[TokenBatch, np.ndarray]:
    """``prompt + completion`` rows right-padded to ``width`` + 1 tokens as a [B, width] TokenBatch
    (inputs are tokens [0, n-1), targets [1, n)), and the sampler's log-probs aligned with targets.

    Completion token j of a row whose prompt has p tokens is target p - 1 + j. The loss mask covers
    the completion tokens, except those of truncated completions when ``mask_truncated``.
    """
    rows = len(generations)
    input_ids = np.full((rows, width), pad_id, np.int32)
    targets = np.full((rows, width), pad_id, np.int32)
    loss_mask = np.zeros((rows, width), np.bool_)
    segment_ids = np.zeros((rows, width), np.int32)
    old_log_probs = np.zeros((rows, width), np.float32)
    for row, (prompt, generation) in enumerate(zip(prompt_ids, generations, strict=True)):
        sequence = [*prompt, *generation.token_ids]
        if len(sequence) - 1 > width:
            raise ValueError(f"row {row}: {len(sequence)} tokens do not fit the rollout width {width} + 1")
        used = len(sequence) - 1
        input_ids[row, :used] = sequence[:-1]
        targets[row, :used] = sequence[1:]
        segment_ids[row, :used] = 1
        start, count = len(prompt) - 1, len(generation.token_ids)
        old_log_probs[row, start:start + count] = generation.logprobs
        truncated = generation.finish_reason == "length"
        loss_mask[row, start:start + count] = not (mask_truncated and truncated)
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), (rows, width)).copy()
    tokens = TokenBatch(input_ids=input_ids, targets=targets, loss_mask=loss_mask, segment_ids=segment_ids,
                        positions=positions)
    return tokens, old_log_probs


def score_for_step(terms: Sequence[WeightedReward], completions: Sequence[str],
                   references: Sequence[Mapping[str, Any]], *, step: int) -> tuple[list[float], dict[str, list[float]]]:
    """``score_rewards`` for training step ``step`` (its rollouts or its evaluation): a reward function
    that fails is a TrainingError, which ends the run as failed with the last checkpoint kept, saying
    which step, function and sample, rather than an uncaught error (a traceback from ``jaxengine train``)."""
    try:
        return score_rewards(terms, completions, references)
    except RewardError as error:
        raise TrainingError(f"step {step}: {error}") from error


def rollout_stats(rewards_pg: np.ndarray, by_name: Mapping[str, Sequence[float]],
                  generations: Sequence[Generation]) -> dict[str, float]:
    """The step's rollout metrics under TRL's names (``reward_std`` is the mean of the groups' stds)."""
    lengths = np.array([len(generation.token_ids) for generation in generations], np.float64)
    group_std_p = np.std(rewards_pg, axis=1, ddof=1)
    stats = {
        "reward": float(np.mean(rewards_pg)),
        "reward_std": float(np.mean(group_std_p)),
        "frac_reward_zero_std": float(rl.zero_std_fraction(jnp.asarray(rewards_pg))),
        "completions/mean_length": float(np.mean(lengths)),
        "completions/min_length": float(np.min(lengths)),
        "completions/max_length": float(np.max(lengths)),
        "completions/clipped_ratio": float(np.mean([g.finish_reason == "length" for g in generations])),
    }
    for name, scores in by_name.items():
        stats[f"rewards/{name}/mean"] = float(np.mean(scores))
        stats[f"rewards/{name}/std"] = float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0
    return stats


def prompt_indices(block: int, *, per_block: int, count: int, seed: int) -> list[int]:
    """Indices of rollout block ``block``'s prompts: the next ``per_block`` of a seeded permutation of the
    ``count`` prompts per epoch, found from the block alone, so a resumed run draws the same prompts."""
    indices = []
    for position in range(block * per_block, (block + 1) * per_block):
        epoch, offset = divmod(position, count)
        indices.append(int(np.random.default_rng((seed, epoch)).permutation(count)[offset]))
    return indices


class BlockRollouts:
    """A trainer ``batch_source`` that makes rollouts once per block of ``num_iterations`` steps and
    reuses them within the block (policy updates on stored old log-probs, mu > 1). Subclasses set
    ``num_iterations``, ``batch_type`` (their batch dataclass), ``rows`` (the prompts) and ``_cached = None``
    and supply ``prompts_per_block`` and ``_rollout(trainer, block)``.

    A checkpoint saved inside a block carries that block's rollouts (``arrays_to_checkpoint``): the
    run resumed from it trains the block's remaining steps on them, as the run that stopped would
    have, instead of sampling a new block from the weights of the middle of the block."""

    num_iterations: int
    batch_type: type
    _cached: tuple[int, Any] | None

    def __call__(self, trainer):
        block = trainer.step // self.num_iterations
        if self._cached is not None and self._cached[0] == block:
            # The same rollouts again: no time was spent making them this step.
            cached = self._cached[1]
            no_time = np.zeros_like(cached.stats["time/rollout"])
            return dataclasses.replace(cached, stats={**cached.stats, "time/rollout": no_time, "time/logprobs": no_time})
        batch = self._rollout(trainer, block)
        self._cached = (block, batch)
        return batch

    def epoch_after(self, steps: int) -> float:
        """The fractional epoch the trainer logs after ``steps`` steps: the prompts drawn so far over the prompt
        count, as sft's is the rows read over the rows. A block's steps all train on the prompts its rollouts drew,
        so they count from its first step."""
        blocks = -(-steps // self.num_iterations)
        return blocks * self.prompts_per_block / len(self.rows)

    def arrays_to_checkpoint(self, step: int) -> dict[str, np.ndarray]:
        """The current block's rollouts, as named arrays, when the step after ``step`` trains on them."""
        if step % self.num_iterations == 0 or self._cached is None or self._cached[0] != step // self.num_iterations:
            return {}
        block, batch = self._cached
        return {"block": np.asarray(block), **_flatten_batch(batch)}

    def restore_from_checkpoint(self, step: int, arrays: dict[str, np.ndarray]) -> None:
        """Take back the rollouts ``arrays_to_checkpoint`` saved with the checkpoint of ``step`` (if any)."""
        if arrays:
            arrays = dict(arrays)
            self._cached = (int(arrays.pop("block")), _unflatten_batch(self.batch_type, arrays))


# Joins the field names of a batch's nested dataclasses and stats dict into one array name.
_NAME_SEPARATOR = "|"


def _flatten_batch(batch: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """A batch dataclass (fields: arrays, dataclasses of arrays, a dict of arrays) as named host arrays."""
    if dataclasses.is_dataclass(batch):
        parts = {field.name: getattr(batch, field.name) for field in dataclasses.fields(batch)}
    elif isinstance(batch, dict):
        parts = batch
    else:
        return {prefix: np.asarray(batch)}
    flat = {}
    for name, value in parts.items():
        flat.update(_flatten_batch(value, f"{prefix}{_NAME_SEPARATOR}{name}" if prefix else name))
    return flat


def _unflatten_batch(batch_type: type, flat: dict[str, np.ndarray], prefix: str = "") -> Any:
    """The inverse of ``_flatten_batch`` for a batch of type ``batch_type``."""
    hints = typing.get_type_hints(batch_type)
    values = {}
    for field in dataclasses.fields(batch_type):
        name = f"{prefix}{_NAME_SEPARATOR}{field.name}" if prefix else field.name
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind):
            values[field.name] = _unflatten_batch(kind, flat, name)
        elif typing.get_origin(kind) is dict:
            start = name + _NAME_SEPARATOR
            values[field.name] = {key[len(start):]: value for key, value in flat.items() if key.startswith(start)}
        else:
            values[field.name] = flat[name]
    return batch_type(**values)


class GrpoRollouts(BlockRollouts):
    """The trainer's ``batch_source`` for ``task: grpo`` (see module note).

    ``rows``: the prompts dataset rows (``prompt`` plus reference columns); ``prompt_ids`` their
    encoded prompts. Step k's prompts are the next ``batch_size * grad_accum`` of a seeded
    permutation per epoch, found from the step alone, so a resumed run draws the same prompts.
    ``reference`` maps the trainer to the reference weights, or is None when beta is 0.
    ``reference_passes`` counts reference forward passes (one per micro-batch).
    """

    def __init__(self, *, rows: Sequence[Mapping[str, Any]], prompt_ids: Sequence[list[int]], tokenizer,
                 grpo: GrpoSpec, batch_size: int, grad_accum: int, seed: int, pad_id: int,
                 samples_path: Path | None, reference: Callable[[Any], Any] | None, chunk_size: int = 256):
        if grpo.beta > 0 and reference is None:
            raise ValueError("grpo.beta > 0 needs reference weights")
        self.rows = list(rows)
        self.prompt_ids = [list(ids) for ids in prompt_ids]
        self.tokenizer = tokenizer
        self.grpo = grpo
        self.batch_size = batch_size
        self.grad_accum = grad_accum
        self.seed = seed
        self.pad_id = pad_id
        self.samples_path = samples_path
        self.reference = reference if grpo.beta > 0 else None
        self.chunk_size = chunk_size
        self.terms = [WeightedReward(name=term.name, weight=term.weight, args=term.args) for term in grpo.rewards]
        self.width = max(len(ids) for ids in self.prompt_ids) + grpo.max_new_tokens - 1
        # Target position of the first completion token of the shortest prompt (see rollout_rows).
        self.completion_start = min(len(ids) for ids in self.prompt_ids) - 1
        self.reference_passes = 0
        self.num_iterations = grpo.num_iterations
        self.batch_type = RolloutBatch
        self._cached: tuple[int, RolloutBatch] | None = None

    # ---- prompt order ---------------------------------------------------------------------

    @property
    def prompts_per_block(self) -> int:
        """Prompts sampled per rollout block: the batch's, times ``dynamic_sampling_pool`` under dynamic sampling."""
        pool = self.grpo.dynamic_sampling_pool if self.grpo.dynamic_sampling else 1
        return self.batch_size * self.grad_accum * pool

    def prompt_indices(self, block: int) -> list[int]:
        """Indices of the prompts of rollout block ``block`` (one block per ``num_iterations`` steps)."""
        return prompt_indices(block, per_block=self.prompts_per_block, count=len(self.rows), seed=self.seed)

    # ---- one step's data --------------------------------------------------------------------

    def _generate(self, model, indices: Sequence[int], seed: int) -> list[Generation]:
        group = self.grpo.num_generations
        prompts = [self.prompt_ids[index] for index in indices for _ in range(group)]
        params = SamplingParams(max_new_tokens=self.grpo.max_new_tokens, temperature=self.grpo.temperature,
                                top_p=self.grpo.top_p, seed=seed % 2**32)
        return Sampler(model, self.tokenizer).generate(prompts, params)

    def _score(self, indices: Sequence[int], generations: Sequence[Generation], *, step: int):
        group = self.grpo.num_generations
        references = [self.rows[index] for index in indices for _ in range(group)]
        totals, by_name = score_for_step(self.terms, [g.text for g in generations], references, step=step)
        return np.asarray(totals, np.float64).reshape(len(indices), group), by_name

    def _rollout(self, trainer, block: int) -> RolloutBatch:
        grpo, group = self.grpo, self.grpo.num_generations
        started = time.perf_counter()
        model = trainer.current_model()
        indices = self.prompt_indices(block)
        seed = self.seed * 1_000_003 + block
        generations = self._generate(model, indices, seed)
        rewards_pg, by_name = self._score(indices, generations, step=trainer.step + 1)
        # Metrics describe everything the policy produced, before dynamic sampling picks the groups to train on.
        stats = rollout_stats(rewards_pg, by_name, generations)
        if grpo.dynamic_sampling:
            indices, generations, rewards_pg, by_name = self._keep_varied(indices, generations, rewards_pg, by_name)
        rollout_seconds = time.perf_counter() - started

        started = time.perf_counter()
        advantages_pg = np.asarray(rl.ADVANTAGES[grpo.advantage](jnp.asarray(rewards_pg, jnp.float32)))
        prompt_ids = [self.prompt_ids[index] for index in indices for _ in range(group)]
        tokens, old_log_probs = rollout_rows(prompt_ids, generations, width=self.width, pad_id=self.pad_id,
                                             mask_truncated=grpo.mask_truncated)
        micro = [slice(a * self.batch_size * group, (a + 1) * self.batch_size * group) for a in range(self.grad_accum)]
        stacked = jax.tree.map(lambda x: np.stack([x[part] for part in micro]), tokens)
        reference_abt = np.zeros((self.grad_accum, *old_log_probs[micro[0]].shape), np.float32)
        if self.reference is not None:
            reference_params = self.reference(trainer)
            for a, part in enumerate(micro):
                micro_tokens = jax.tree.map(lambda x: x[part], tokens)
                reference_abt[a] = np.asarray(_reference_log_probs(
                    reference_params, trainer.rng_state, trainer.frozen, micro_tokens,
                    graphdef=trainer.eval_graphdef, chunk_size=self.chunk_size))
                self.reference_passes += 1
        stats["time/rollout"] = rollout_seconds
        stats["time/logprobs"] = time.perf_counter() - started
        self._write_samples(trainer.step + 1, indices, generations, rewards_pg, by_name, advantages_pg)
        advantages_b = advantages_pg.reshape(-1).astype(np.float32)
        return RolloutBatch(
            tokens=stacked,
            old_log_probs=np.stack([old_log_probs[part] for part in micro]),
            reference_log_probs=reference_abt,
            advantages=np.stack([advantages_b[part] for part in micro]),
            stats={name: np.full((self.grad_accum,), value, np.float32) for name, value in stats.items()},
        )

    def _groups(self, indices, generations, rewards_pg, by_name) -> list[tuple]:
        """One (prompt index, its G generations, its G rewards, its scores by name) tuple per prompt."""
        size = self.grpo.num_generations
        return [(index, generations[p * size:(p + 1) * size], rewards_pg[p],
                 {name: scores[p * size:(p + 1) * size] for name, scores in by_name.items()})
                for p, index in enumerate(indices)]

    def _keep_varied(self, indices, generations, rewards_pg, by_name):
        """DAPO dynamic sampling, from one pooled rollout: the batch's groups are the pool's groups whose
        rewards differ (in pool order), then, if too few differ, groups with equal rewards (their
        advantages are zero, so they add nothing to the gradient, as without dynamic sampling).

        One sampler call over the whole pool (fixed shape, compiled once) instead of further rounds
        of prompts: a group whose rewards are all equal costs its rollout but no update."""
        groups = self._groups(indices, generations, rewards_pg, by_name)
        varied = [group for group in groups if group[2].max() > group[2].min()]
        flat = [group for group in groups if group[2].max() == group[2].min()]
        chosen = (varied + flat)[:self.batch_size * self.grad_accum]
        return ([group[0] for group in chosen], [g for group in chosen for g in group[1]],
                np.stack([group[2] for group in chosen]),
                {name: [score for group in chosen for score in group[3][name]] for name in by_name})

    def _write_samples(self, step, indices, generations, rewards_pg, by_name, advantages_pg) -> None:
        if self.samples_path is None:
            return
        group = self.grpo.num_generations
        with self.samples_path.open("a") as handle:
            for p, index in enumerate(indices):
                for g in range(group):
                    flat = p * group + g
                    handle.write(json.dumps({
                        "step": step, "kind": "rollout", "prompt": self.rows[index]["prompt"],
                        "text": generations[flat].text, **sample_answer(self.terms, self.rows[index]),
                        "rewards": {name: scores[flat] for name, scores in by_name.items()},
                        "reward": float(rewards_pg[p, g]), "advantage": float(advantages_pg[p, g]),
                        "finish_reason": generations[flat].finish_reason,
                    }) + "\n")


def sample_answer(terms: Sequence[WeightedReward], row: Mapping[str, Any]) -> dict[str, str]:
    """``{"answer": ...}`` for a samples.jsonl record when the row has the reference the reward reads."""
    answer = reference_answer(terms, row)
    return {} if answer is None else {"answer": answer}


class AllMaskedCount:
    """Part of GRPO's and PPO's guards: a reason to stop once, under ``<section>.mask_truncated``, every
    completion was truncated (``completions/clipped_ratio`` 1, so none is in the loss) for ``patience``
    steps in a row. A policy that never trains never learns to finish sooner: waiting longer changes nothing."""

    def __init__(self, *, section: str, patience: int, mask_truncated: bool):
        self.section = section
        self.patience = patience
        self.mask_truncated = mask_truncated
        self.steps = 0

    def __call__(self, record: Mapping[str, float]) -> str | None:
        all_masked = self.mask_truncated and record["completions/clipped_ratio"] >= 1.0
        self.steps = self.steps + 1 if all_masked else 0
        if self.steps < self.patience:
            return None
        return (f"every completion hit {self.section}.max_new_tokens for {self.steps} steps, and "
                f"{self.section}.mask_truncated leaves such completions out of the loss, so nothing trained. Raise "
                f"{self.section}.max_new_tokens, or set {self.section}.mask_truncated to false")


class ZeroStdCount:
    """Part of GRPO's and PPO's guards: a reason to stop once ``frac_reward_zero_std`` has been 1.0 for
    ``patience`` steps in a row: every group (PPO's one group is the whole batch) got equal rewards, so every
    advantage from the reward is zero. ``what_to_do`` ends the reason: the knobs of that section."""

    def __init__(self, *, patience: int, what_to_do: str):
        self.patience = patience
        self.what_to_do = what_to_do
        self.steps = 0

    def __call__(self, record: Mapping[str, float]) -> str | None:
        self.steps = self.steps + 1 if record["frac_reward_zero_std"] >= 1.0 else 0
        if self.steps < self.patience:
            return None
        return f"frac_reward_zero_std has been 1.0 for {self.steps} steps: {self.what_to_do}"


class GrpoGuard:
    """The trainer's ``guard`` for GRPO: a reason to stop when the run cannot learn or drifts too far.

    Stops when ``frac_reward_zero_std`` has been 1.0 for ``zero_std_patience`` steps in a row (no group
    had any reward variance, so every advantage was zero), when under ``mask_truncated`` every completion
    was truncated (all left out of the loss) as many steps in a row (``AllMaskedCount``), or when ``kl``
    exceeds ``max_kl``. (A NaN loss is the trainer's own stop.) The counts start again when a run is resumed.
    """

    def __init__(self, *, zero_std_patience: int, max_kl: float | None, mask_truncated: bool):
        self.max_kl = max_kl
        self.zero_std = ZeroStdCount(patience=zero_std_patience, what_to_do=(
            "every prompt's completions got equal rewards, so there is no learning signal. Check the reward "
            "functions against the completions in samples.jsonl, or raise grpo.temperature or grpo.num_generations"))
        self.all_masked = AllMaskedCount(section="grpo", patience=zero_std_patience, mask_truncated=mask_truncated)

    def __call__(self, record: Mapping[str, float]) -> str | None:
        if reason := self.zero_std(record):
            return reason
        if reason := self.all_masked(record):
            return reason
        if self.max_kl is not None and record["kl"] > self.max_kl:
            return (f"kl {record['kl']:.4g} exceeds grpo.max_kl {self.max_kl:g}: the policy drifted too far from "
                    "the reference. Raise grpo.beta or lower optim.learning_rate")
        return None


# --------------------------------------------------------------------------------------------
# Building a GRPO job from a spec


def read_prompts(path: str, *, tokenizer, columns: Mapping[str, str], max_prompt_tokens: int, source=None
                 ) -> tuple[list[dict], list[list[int]], dict[str, int]]:
    """The ``prompts`` rows of ``path``, their encoded prompts, and counts named as an sft run's data summary names
    them (``pipeline.EncodeStats``: ``rows`` read, ``examples`` kept) with ``dropped_long_prompts``, those left out
    because the prompt is longer than ``max_prompt_tokens`` (no room left for ``max_new_tokens``); ``source`` as
    ``pipeline.read_examples`` takes it."""
    from jaxengine.chat_template import ChatTemplateError
    from jaxengine.data.pipeline import DataError, encode_prompt, read_examples

    rows, prompt_ids, dropped, number = [], [], 0, 0
    for number, row in enumerate(read_examples(path, kind="prompts", columns=dict(columns), source=source), start=1):
        try:
            ids = encode_prompt(tokenizer, row["prompt"])
        except ChatTemplateError as error:
            # As encode_rows names it: a template that refuses some chats only (Gemma's) stopped the run with no row.
            raise DataError(f"{path}: row {number}: {error}; change the row or the model's chat template") from None
        if len(ids) > max_prompt_tokens:
            dropped += 1
            continue
        rows.append(row)
        prompt_ids.append(ids)
    return rows, prompt_ids, {"rows": number, "examples": len(rows), "dropped_long_prompts": dropped}


def make_eval_hook(*, rows: Sequence[Mapping[str, Any]], prompt_ids: Sequence[list[int]], tokenizer,
                   terms: Sequence[WeightedReward], max_new_tokens: int, samples_path: Path, sample_count: int,
                   batch_size: int = 64, group_labels: Sequence[str] | None = None):
    """After each evaluation: greedy completions of every held-out prompt, scored by ``terms`` as
    ``eval/<name>`` (the mean score) and ``eval/reward`` (the weighted total: the training reward, as
    ``eval_metrics`` terms come with weight 0), and with ``group_labels`` (``data.eval_group_by``, one
    per row) ``eval/<name>/<label>`` for each group; the first ``sample_count`` go to samples.jsonl
    (kind ``eval``)."""
    from jaxengine.evaluate import grouped_metrics

    references = list(rows)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, seed=0)

    def hook(model, step: int) -> dict[str, float]:
        sampler = Sampler(model, tokenizer)
        texts = []
        for start in range(0, len(prompt_ids), batch_size):
            texts += [g.text for g in sampler.generate(prompt_ids[start:start + batch_size], params)]
        totals, by_name = score_for_step(terms, texts, references, step=step)
        with samples_path.open("a") as handle:
            for index in range(min(sample_count, len(rows))):
                handle.write(json.dumps({"step": step, "kind": "eval", "prompt": rows[index]["prompt"],
                                         "text": texts[index], **sample_answer(terms, rows[index]),
                                         "reward": totals[index],
                                         "rewards": {name: scores[index] for name, scores in by_name.items()}}) + "\n")
        metrics = {f"eval/{name}": float(np.mean(scores)) for name, scores in by_name.items()}
        metrics["eval/reward"] = float(np.mean(totals))
        for name, scores in by_name.items():
            metrics.update(grouped_metrics(f"eval/{name}", scores, group_labels))
        return metrics

    return hook


@dataclass(frozen=True, kw_only=True)
class RlPrompts:
    """The prompts of an RL job (GRPO, PPO): training and held-out rows with their encoded prompts, and
    the data summary (``counts``: rows read, kept, dropped as too long, per split, and ``max_prompt_tokens``, the
    room a prompt had, which ``jaxengine.job.data_cut_warnings`` names)."""

    rows: list[Mapping[str, Any]]
    prompt_ids: list[list[int]]
    eval_rows: list[Mapping[str, Any]]
    eval_prompt_ids: list[list[int]]
    counts: dict[str, Any]
    eval_group_labels: list[str] | None = None  # data.eval_group_by of each eval row


def _shortest_prompt_tokens(path: str, *, tokenizer, columns: Mapping[str, str]) -> int | None:
    """The token count of the shortest prompt of ``path`` (None when it has none): read again only when no prompt
    fitted, for the message that says how much room they need."""
    from jaxengine.data.pipeline import encode_prompt, read_examples

    return min((len(encode_prompt(tokenizer, row["prompt"]))
                for row in read_examples(path, kind="prompts", columns=dict(columns))), default=None)


def _no_prompt_fits(spec, *, section: str, max_new_tokens: int, context_length: int, dropped: int,
                    shortest: int | None) -> str:
    """Why no prompt of ``data.train`` is left, and what to change: each prompt has the room that
    ``data.max_seq_len`` (or the model's context, when shorter) leaves after ``<section>.max_new_tokens``."""
    length = min(spec.data.max_seq_len, context_length)
    limit = (f"data.max_seq_len ({spec.data.max_seq_len})" if spec.data.max_seq_len <= context_length else
             f"the model's context length ({context_length} tokens, max_position_embeddings in its config.json)")
    message = (f"data.train: {spec.data.train} has no prompt of at most {length - max_new_tokens} tokens, the room "
               f"{limit} leaves after {section}.max_new_tokens ({max_new_tokens})")
    if shortest is None or not dropped:
        return message
    ways = []
    if spec.data.max_seq_len < shortest + max_new_tokens <= context_length:
        ways.append(f"raise data.max_seq_len to at least {shortest + max_new_tokens}")
    if length - shortest >= 1:
        ways.append(f"lower {section}.max_new_tokens to at most {length - shortest}")
    return (f"{message}: all {dropped} prompts are longer (the shortest is {shortest} tokens with the chat "
            f"template); {' or '.join(ways) if ways else 'shorten the prompts, or choose a model of a longer context'}")


def read_rl_prompts(spec, tokenizer, *, section: str, max_new_tokens: int, context_length: int,
                    entry: Entry = Entry.SPEC) -> RlPrompts:
    """``data.train`` and ``data.eval`` of an RL spec, keeping prompts that leave ``max_new_tokens``
    (``<section>.max_new_tokens``) of room in ``data.max_seq_len`` and in the model's ``context_length``
    (the sampler refuses a prompt and completion past it); a JobError when none is left. ``entry``: where the spec
    was given (``jaxengine.job.run_job``), whose settings the advice of a data problem names."""
    from jaxengine.data.pipeline import spec_source
    from jaxengine.job import JobError, eval_group_labels

    if max_new_tokens >= context_length:
        raise JobError(f"{section}.max_new_tokens ({max_new_tokens}) leaves no room for a prompt within the model's "
                       f"context length ({context_length} tokens, max_position_embeddings in its config.json); "
                       f"lower {section}.max_new_tokens below {context_length}")
    max_prompt_tokens = min(spec.data.max_seq_len, context_length) - max_new_tokens
    if max_prompt_tokens < 1:
        raise JobError(f"data.max_seq_len ({spec.data.max_seq_len}) leaves no room for a prompt before "
                       f"{section}.max_new_tokens ({max_new_tokens}); raise max_seq_len or lower max_new_tokens")
    read = dict(tokenizer=tokenizer, columns=spec.data.columns, max_prompt_tokens=max_prompt_tokens)
    rows, prompt_ids, train_counts = read_prompts(spec.data.train, **read,
                                                  source=spec_source("data.train", spec.task, entry))
    if not rows:
        raise JobError(_no_prompt_fits(spec, section=section, max_new_tokens=max_new_tokens,
                                       context_length=context_length, dropped=train_counts["dropped_long_prompts"],
                                       shortest=_shortest_prompt_tokens(spec.data.train, tokenizer=tokenizer,
                                                                        columns=spec.data.columns)))
    eval_rows, eval_prompt_ids, eval_counts = (read_prompts(spec.data.eval, **read,
                                                            source=spec_source("data.eval", spec.task, entry))
                                               if spec.data.eval else ([], [], {}))
    options = getattr(spec, section)
    training = [WeightedReward(name=term.name, args=term.args) for term in options.rewards]
    scored = [*training, *(WeightedReward(name=term.name, args=term.args) for term in options.eval_metrics)]
    # Each split against the terms that score it: eval_metrics read data.eval only.
    for rows_read, key, path, terms in ((rows, "data.train", spec.data.train, training),
                                        (eval_rows, "data.eval", spec.data.eval, scored)):
        if missing := missing_reference_column(terms, rows_read):
            name, column, number = missing
            raise JobError(f"{key}: row {number} of {path} has no '{column}', the reference column reward {name} "
                           f"reads; give prompts data with that column, or set its args.answer_column")
        if unscorable := unscorable_reference(terms, rows_read):
            name, number, problem = unscorable
            raise JobError(f"{key}: row {number} of {path}: reward {name} cannot score it: {problem}; correct the "
                           "row, or give the reward another args.answer_column")
    return RlPrompts(rows=rows, prompt_ids=prompt_ids, eval_rows=eval_rows, eval_prompt_ids=eval_prompt_ids,
                     counts={"train": train_counts, "eval": eval_counts, "max_prompt_tokens": max_prompt_tokens},
                     eval_group_labels=eval_group_labels(spec, eval_rows))


def check_reward_models(options, *, section: str) -> None:
    """A JobError naming the key when a reward model the ``section`` (``grpo`` or ``ppo``) options name,
    as ``ppo.reward_model`` or as a ``reward_model`` function's ``args.model``, is no reward run: checked
    before the run starts, where it otherwise failed the first step after a whole rollout."""
    from jaxengine.job import JobError
    from jaxengine.reward_scoring import reward_model_dir

    named = [(f"{section}.reward_model", getattr(options, "reward_model", None))]
    for key in ("rewards", "eval_metrics"):
        named += [(f"{section}.{key}.{index}.args.model", term.args.get("model"))
                  for index, term in enumerate(getattr(options, key)) if term.name == "reward_model"]
    for key, path in named:
        if path is not None:
            try:
                reward_model_dir(path)
            except FileNotFoundError as error:
                raise JobError(f"{key}: {error}") from None


def with_eval_metrics(terms: Sequence[WeightedReward], eval_metrics) -> list[WeightedReward]:
    """What evaluations score: the training reward's terms, then the extra ``eval_metrics`` with weight 0
    (scored and logged as ``eval/<name>``, but not part of ``eval/reward``, the training reward)."""
    return [*terms, *(WeightedReward(name=term.name, weight=0.0, args=term.args) for term in eval_metrics)]


def rollout_pad_id(tokenizer) -> int:
    return tokenizer.pad_id if tokenizer.pad_id is not None else (tokenizer.eos_ids or [0])[0]


def rl_train_config(spec, *, rows: int, files: dict[str, dict[str, str]]):
    """The TrainConfig of an RL spec over its data ``files`` (``jaxengine.job.data_files``); "best checkpoint" is
    by the first eval metric (``best_metric_for``)."""
    from jaxengine.job import (best_metric_for, earlier_job_identities, job_identity, recorded_settings,
                               resume_settings, total_steps_for)
    from jaxengine.trainer import TrainConfig

    best_metric, higher_is_better = best_metric_for(spec)
    return TrainConfig(
        total_steps=total_steps_for(spec, rows), batch_size=spec.train.batch_size,
        grad_accum=spec.train.grad_accum, max_seq_len=spec.data.max_seq_len,
        eval_every=spec.train.eval_every, save_every=spec.train.save_every, keep_last=spec.train.keep_last,
        seed=spec.train.seed, optim=spec.optim, identity=job_identity(spec),
        identity_aliases=earlier_job_identities(spec), resume_settings=resume_settings(spec),
        recorded_settings=recorded_settings(spec), data_files=files,
        best_metric=best_metric, best_higher_is_better=higher_is_better)


def reference_weights(spec, job_model) -> Callable[[Any], Any]:
    """The KL reference: the base weights with LoRA off, or a frozen copy of the starting weights when
    the whole model trains (there is no adapter to switch off)."""
    if spec.peft.method == "none":
        return frozen_copy_reference(nnx.state(job_model.model, job_model.trainable))
    return lora_off_reference


def make_grpo_trainer(spec, job_model, run_dir: Path, *, placement: Any = None,
                      files: dict[str, dict[str, str]] | None = None, entry: Entry = Entry.SPEC):
    """The Trainer of a ``task: grpo`` spec (rollouts as its batch source) and the data summary;
    ``placement`` as the trainer takes it (e.g. a ``jaxengine.sharding.MeshPlacement``); ``files`` the spec's
    ``jaxengine.job.data_files`` when the caller hashed them already (``run_job``), else hashed here; ``entry`` as
    ``run_job`` takes it."""
    from jaxengine.job import data_files
    from jaxengine.trainer import Trainer

    grpo, tokenizer, model = spec.grpo, job_model.tokenizer, job_model.model
    check_reward_models(grpo, section="grpo")
    prompts = read_rl_prompts(spec, tokenizer, section="grpo", max_new_tokens=grpo.max_new_tokens,
                              context_length=job_model.config.max_position_embeddings, entry=entry)
    pad_id = rollout_pad_id(tokenizer)
    config = rl_train_config(spec, rows=len(prompts.rows), files=data_files(spec) if files is None else files)
    reference = reference_weights(spec, job_model) if grpo.beta > 0 else None
    rollouts = GrpoRollouts(rows=prompts.rows, prompt_ids=prompts.prompt_ids, tokenizer=tokenizer, grpo=grpo,
                            batch_size=spec.train.batch_size, grad_accum=spec.train.grad_accum, seed=spec.train.seed,
                            pad_id=pad_id, samples_path=run_dir / "samples.jsonl", reference=reference)
    task = GrpoTask(loss_type=grpo.loss_type, epsilon=grpo.epsilon, epsilon_high=grpo.upper_clip, beta=grpo.beta,
                    kl_estimator=grpo.kl_estimator, max_completion_length=grpo.max_new_tokens,
                    completion_start=rollouts.completion_start,
                    use_stored_old_log_probs=grpo.num_iterations > 1)
    eval_terms = with_eval_metrics(rollouts.terms, grpo.eval_metrics)
    eval_hook = make_eval_hook(rows=prompts.eval_rows, prompt_ids=prompts.eval_prompt_ids, tokenizer=tokenizer,
                               terms=eval_terms,
                               max_new_tokens=grpo.max_new_tokens, samples_path=run_dir / "samples.jsonl",
                               sample_count=spec.train.eval_samples,
                               group_labels=prompts.eval_group_labels) if prompts.eval_rows else None
    guard = GrpoGuard(zero_std_patience=grpo.zero_std_patience, max_kl=grpo.max_kl,
                      mask_truncated=grpo.mask_truncated)
    trainer = Trainer(model=model, task=task, config=config, batch_source=rollouts, pad_id=pad_id, run_dir=run_dir,
                      trainable=job_model.trainable, eval_hook=eval_hook, guard=guard, placement=placement)
    return trainer, prompts.counts
