"""``task: ppo``: rollouts with the KV-cache sampler, a value head, GAE and the clipped PPO objective.

Design note. As for GRPO (``jaxengine.grpo``, whose rollout, reference and sample-logging pieces
this module reuses), the one trainer runs the optimisation and this module supplies its pieces:

* ``PolicyWithValueHead`` is the trained model: the policy itself plus a scalar linear head
  (weight [D, 1] and bias, ``HeadParam``, so it trains under LoRA too) over the policy's
  final-normed hidden state. Sharing the backbone keeps one model in memory and lets the value
  loss shape the shared features (the "value head" design of the first RLHF PPO implementations);
  ``ppo.vf_coef`` weighs it against the policy. The head starts at zero, so the first values are 0.
  Only the policy is exported: the value head exists for training.
* ``PpoRollouts`` is the trainer's ``batch_source``. Each call samples one completion per prompt
  from ``trainer.current_model()`` (the trainer's own arrays: rollout and update share the weights),
  scores it (reward functions, or a ``task: reward`` run through the ``reward_model`` reward
  function), then runs one forward pass of the policy for the old log-probs and values and, only
  when ``kl_coef > 0``, one of the reference (the same weights with LoRA off, or the starting
  weights kept once under full fine-tuning; ``jaxengine.grpo``). Per-token rewards are
  ``-kl_coef * log(pi / pi_ref)`` with the sequence's score added at its last completion token;
  GAE(gamma, lam) turns them and the values into advantages and returns (returns = advantages +
  values), and the advantages are whitened over all completion tokens of the step's batch (mean 0,
  variance 1, as in TRL's PPOTrainer). Every rollout goes to ``samples.jsonl``.
* ``PpoTask.loss`` recomputes log-probs, values and (for the bonus) the entropy, and applies
  ``rl.ppo_loss``. With ``num_iterations`` 1 the old policy and old values are the current ones under
  stop_gradient (ratio exactly 1, value clip inactive); with more, the rollouts serve that many
  consecutive steps against the stored rollout-time log-probs and values.
"""
from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxengine import grpo, losses, rl
from jaxengine.data.formats import Entry
from jaxengine.data.pipeline import TokenBatch
from jaxengine.rewards import WeightedReward
from jaxengine.sampler import Sampler, SamplingParams
from jaxengine.spec import PpoSpec
from jaxengine.tasks import HeadParam


class PolicyWithValueHead(nnx.Module):
    """A causal LM (``backbone``) with a scalar value head over its final hidden states (see module note)."""

    def __init__(self, backbone):
        self.backbone = backbone
        self.value_weight = HeadParam(jnp.zeros((backbone.config.hidden_size, 1), jnp.float32))
        self.value_bias = HeadParam(jnp.zeros((1,), jnp.float32))

    def hidden_states(self, *args, **kwargs):
        return self.backbone.hidden_states(*args, **kwargs)

    def logits(self, hidden_btd: jax.Array) -> jax.Array:
        return self.backbone.logits(hidden_btd)

    def values(self, hidden_btd: jax.Array) -> jax.Array:
        """Float32 [B, T]: position t's value estimates the return of the completion from target t on."""
        return (hidden_btd.astype(jnp.float32) @ self.value_weight[...] + self.value_bias[...])[..., 0]


@jax.tree_util.register_dataclass
@dataclass(frozen=True, kw_only=True)
class PpoBatch:
    """Prompt + completion rows, right-padded; every [B, T] field is aligned with ``tokens.targets``.

    ``tokens.loss_mask`` is true on the completion tokens that count; ``old_log_probs`` and
    ``old_values`` are the rollout-time policy's; ``advantages`` (whitened) and ``returns`` come from
    GAE; ``stats`` are scalar rollout metrics of the whole step.
    """

    tokens: TokenBatch
    old_log_probs: jax.Array
    old_values: jax.Array
    advantages: jax.Array
    returns: jax.Array
    stats: dict[str, jax.Array]


@dataclass(frozen=True, kw_only=True)
class PpoTask:
    """The PPO loss on a ``PpoBatch`` (see module note)."""

    epsilon: float = 0.2
    epsilon_high: float = 0.2
    value_clip: float = 0.2
    vf_coef: float = 0.5
    entropy_coef: float = 0.0
    use_stored_old: bool = False
    chunk_size: int = 256

    def loss(self, model: PolicyWithValueHead, batch: PpoBatch) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        tokens = batch.tokens
        lengths_b = jnp.sum(tokens.segment_ids > 0, axis=-1).astype(jnp.int32)
        hidden_btd, _ = model.hidden_states(tokens.input_ids, tokens.positions, lengths_b=lengths_b)
        log_probs_bt = losses.chunked_token_log_probs(hidden_btd, tokens.targets, model.logits,
                                                      chunk_size=self.chunk_size)
        values_bt = model.values(hidden_btd)
        entropy_bt = rl.chunked_entropy(hidden_btd, model.logits, chunk_size=self.chunk_size,
                                        differentiable=self.entropy_coef > 0)
        if self.use_stored_old:
            old_log_probs_bt, old_values_bt = batch.old_log_probs, batch.old_values
        else:
            old_log_probs_bt, old_values_bt = jax.lax.stop_gradient(log_probs_bt), jax.lax.stop_gradient(values_bt)
        loss, metrics = rl.ppo_loss(log_probs_bt, old_log_probs_bt, values_bt, old_values_bt, batch.advantages,
                                    batch.returns, entropy_bt, tokens.loss_mask, epsilon=self.epsilon,
                                    epsilon_high=self.epsilon_high, value_clip=self.value_clip, vf_coef=self.vf_coef,
                                    entropy_coef=self.entropy_coef)
        # Every term is a token mean, so micro-batches weigh by their completion tokens.
        weight = jnp.sum(tokens.loss_mask.astype(jnp.float32))
        return loss, weight, {"loss": loss, **metrics, **batch.stats}


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk_size"))
def _log_probs_and_values(params, rng_state, frozen, tokens: TokenBatch, *, graphdef, chunk_size: int):
    model = nnx.merge(graphdef, params, rng_state, frozen)
    lengths_b = jnp.sum(tokens.segment_ids > 0, axis=-1).astype(jnp.int32)
    hidden_btd, _ = model.hidden_states(tokens.input_ids, tokens.positions, lengths_b=lengths_b)
    log_probs_bt = losses.chunked_token_log_probs(hidden_btd, tokens.targets, model.logits, chunk_size=chunk_size)
    return log_probs_bt, model.values(hidden_btd)


@functools.partial(jax.jit, static_argnames=("kl_coef", "gamma", "lam"))
def advantages_and_returns(scores_b, log_probs_bt, reference_log_probs_bt, values_bt, mask_bt, *, kl_coef: float,
                           gamma: float, lam: float) -> dict[str, jax.Array]:
    """A step's whitened GAE advantages, returns, per-token rewards and KL, [B, T] each (see module note)."""
    rewards_bt, kl_bt = rl.ppo_token_rewards(scores_b, log_probs_bt, reference_log_probs_bt, mask_bt, kl_coef=kl_coef)
    advantages_bt, returns_bt = rl.gae(rewards_bt, values_bt, mask_bt, gamma=gamma, lam=lam)
    return {"advantages": rl.masked_whiten(advantages_bt, mask_bt), "returns": returns_bt, "rewards": rewards_bt,
            "kl": kl_bt}


def completion_stats(scores_b: np.ndarray, token_log_probs_bt: np.ndarray, kl_bt: np.ndarray, mask_bt: np.ndarray, *,
                     kl_coef: float) -> dict[str, float]:
    """TRL's ``objective/*`` metrics of a step's completions: per-completion sums over its tokens, then means."""
    mask = mask_bt.astype(np.float64)
    kl_b = np.sum(kl_bt * mask, axis=1)
    non_score_b = -kl_coef * kl_b
    return {
        "objective/kl": float(np.mean(kl_b)),
        "objective/entropy": float(np.mean(np.sum(-token_log_probs_bt * mask, axis=1))),
        "objective/non_score_reward": float(np.mean(non_score_b)),
        "objective/rlhf_reward": float(np.mean(scores_b + non_score_b)),
        "objective/scores": float(np.mean(scores_b)),
    }


class PpoRollouts(grpo.BlockRollouts):
    """The trainer's ``batch_source`` for ``task: ppo`` (see module note).

    ``rows``: the prompts dataset rows; ``prompt_ids`` their encoded prompts; ``terms`` the reward.
    Each step's prompts are the next ``batch_size * grad_accum`` (``grpo.prompt_indices``), one completion
    each. ``reference`` maps the trainer to the reference weights, or is None when kl_coef is 0.
    ``reference_passes`` counts reference forward passes (one per micro-batch).
    """

    def __init__(self, *, rows: Sequence[Mapping[str, Any]], prompt_ids: Sequence[list[int]], tokenizer, ppo: PpoSpec,
                 terms: Sequence[WeightedReward], batch_size: int, grad_accum: int, seed: int, pad_id: int,
                 samples_path: Path | None, reference: Callable[[Any], Any] | None, chunk_size: int = 256):
        if ppo.kl_coef > 0 and reference is None:
            raise ValueError("ppo.kl_coef > 0 needs reference weights")
        self.rows = list(rows)
        self.prompt_ids = [list(ids) for ids in prompt_ids]
        self.tokenizer = tokenizer
        self.ppo = ppo
        self.terms = list(terms)
        self.batch_size = batch_size
        self.grad_accum = grad_accum
        self.seed = seed
        self.pad_id = pad_id
        self.samples_path = samples_path
        self.reference = reference if ppo.kl_coef > 0 else None
        self.chunk_size = chunk_size
        self.width = max(len(ids) for ids in self.prompt_ids) + ppo.max_new_tokens - 1
        self.reference_passes = 0
        self.num_iterations = ppo.num_iterations
        self.batch_type = PpoBatch
        self._cached: tuple[int, PpoBatch] | None = None

    @property
    def prompts_per_block(self) -> int:
        """Prompts sampled per rollout block: one completion for each row of the batch."""
        return self.batch_size * self.grad_accum

    def _rollout(self, trainer, block: int) -> PpoBatch:
        ppo = self.ppo
        started = time.perf_counter()
        model = trainer.current_model()
        indices = grpo.prompt_indices(block, per_block=self.prompts_per_block, count=len(self.rows), seed=self.seed)
        prompt_ids = [self.prompt_ids[index] for index in indices]
        params = SamplingParams(max_new_tokens=ppo.max_new_tokens, temperature=ppo.temperature, top_p=ppo.top_p,
                                seed=(self.seed * 1_000_003 + block) % 2**32)
        generations = Sampler(model.backbone, self.tokenizer).generate(prompt_ids, params)
        references = [self.rows[index] for index in indices]
        scores, by_name = grpo.score_for_step(self.terms, [g.text for g in generations], references,
                                              step=trainer.step + 1)
        scores_b = np.asarray(scores, np.float32)
        # One group: the whole batch (reward_std is the batch's, frac_reward_zero_std 1 when all scores are equal).
        stats = grpo.rollout_stats(scores_b[None, :].astype(np.float64), by_name, generations)
        rollout_seconds = time.perf_counter() - started

        started = time.perf_counter()
        tokens, sampled_log_probs = grpo.rollout_rows(prompt_ids, generations, width=self.width, pad_id=self.pad_id,
                                                      mask_truncated=ppo.mask_truncated)
        micro = [slice(a * self.batch_size, (a + 1) * self.batch_size) for a in range(self.grad_accum)]
        old_log_probs = np.zeros(tokens.targets.shape, np.float32)
        old_values = np.zeros(tokens.targets.shape, np.float32)
        reference_log_probs = np.zeros(tokens.targets.shape, np.float32)
        reference_params = self.reference(trainer) if self.reference is not None else None
        for part in micro:
            micro_tokens = jax.tree.map(lambda x: x[part], tokens)
            log_probs, values = _log_probs_and_values(trainer.params, trainer.rng_state, trainer.frozen, micro_tokens,
                                                      graphdef=trainer.eval_graphdef, chunk_size=self.chunk_size)
            old_log_probs[part], old_values[part] = np.asarray(log_probs), np.asarray(values)
            if reference_params is not None:
                # Looked up on the module at call time, so tests can count the passes as GRPO's do.
                reference_log_probs[part] = np.asarray(grpo._reference_log_probs(
                    reference_params, trainer.rng_state, trainer.frozen, micro_tokens,
                    graphdef=trainer.eval_graphdef, chunk_size=self.chunk_size))
                self.reference_passes += 1
            else:
                reference_log_probs[part] = old_log_probs[part]  # no reference: no KL penalty
        mask = np.asarray(tokens.loss_mask)
        targets = {name: np.asarray(value) for name, value in advantages_and_returns(
            scores_b, old_log_probs, reference_log_probs, old_values, mask, kl_coef=ppo.kl_coef, gamma=ppo.gamma,
            lam=ppo.lam).items()}
        stats.update(completion_stats(scores_b, sampled_log_probs, targets["kl"], mask, kl_coef=ppo.kl_coef))
        stats["val/mean"] = float(np.sum(old_values * mask) / max(mask.sum(), 1))
        stats["time/rollout"] = rollout_seconds
        stats["time/logprobs"] = time.perf_counter() - started
        self._write_samples(trainer.step + 1, indices, generations, scores_b, by_name, targets, mask)

        def stacked(array):
            return np.stack([array[part] for part in micro])

        return PpoBatch(
            tokens=jax.tree.map(stacked, tokens), old_log_probs=stacked(old_log_probs),
            old_values=stacked(old_values), advantages=stacked(targets["advantages"]),
            returns=stacked(targets["returns"]),
            stats={name: np.full((self.grad_accum,), value, np.float32) for name, value in stats.items()},
        )

    def _write_samples(self, step, indices, generations, scores_b, by_name, targets, mask) -> None:
        if self.samples_path is None:
            return
        with self.samples_path.open("a") as handle:
            for row, index in enumerate(indices):
                tokens = max(int(mask[row].sum()), 1)
                handle.write(json.dumps({
                    "step": step, "kind": "rollout", "prompt": self.rows[index]["prompt"], "text": generations[row].text,
                    **grpo.sample_answer(self.terms, self.rows[index]),
                    "rewards": {name: scores[row] for name, scores in by_name.items()},
                    "reward": float(scores_b[row]),
                    # The completion's mean whitened advantage and its summed KL to the reference.
                    "advantage": float(np.sum(targets["advantages"][row]) / tokens),
                    "kl": float(np.sum(targets["kl"][row])),
                    "finish_reason": generations[row].finish_reason,
                }) + "\n")


class PpoGuard:
    """The trainer's ``guard`` for PPO: stops when ``frac_reward_zero_std`` has been 1.0 (the whole batch
    scored equally) for ``zero_std_patience`` steps in a row (``grpo.ZeroStdCount``), when under
    ``mask_truncated`` every completion was truncated for ``truncated_patience`` steps in a row
    (``grpo.AllMaskedCount``), both as GRPO's guard, or when ``objective/kl`` exceeds ``max_kl`` (a NaN
    loss is the trainer's own stop)."""

    def __init__(self, *, max_kl: float | None, zero_std_patience: int, truncated_patience: int,
                 mask_truncated: bool):
        self.max_kl = max_kl
        self.zero_std = grpo.ZeroStdCount(patience=zero_std_patience, what_to_do=(
            "every completion of the batch got the same reward, so the reward gives no learning signal. Check the "
            "reward functions (or reward model) against the completions in samples.jsonl, or raise ppo.temperature"))
        self.all_masked = grpo.AllMaskedCount(section="ppo", patience=truncated_patience,
                                              mask_truncated=mask_truncated)

    def __call__(self, record: Mapping[str, float]) -> str | None:
        if reason := self.zero_std(record):
            return reason
        if reason := self.all_masked(record):
            return reason
        if self.max_kl is not None and record["objective/kl"] > self.max_kl:
            return (f"objective/kl {record['objective/kl']:.4g} exceeds ppo.max_kl {self.max_kl:g}: the policy "
                    "drifted too far from the reference. Raise ppo.kl_coef or lower optim.learning_rate")
        return None


# --------------------------------------------------------------------------------------------
# Building a PPO job from a spec


def reward_terms(ppo: PpoSpec, *, max_seq_len: int) -> list[WeightedReward]:
    """The training reward: ``ppo.rewards``, or the ``reward_model`` reward function on ``ppo.reward_model``."""
    if ppo.reward_model is None:
        return [WeightedReward(name=term.name, weight=term.weight, args=term.args) for term in ppo.rewards]
    return [WeightedReward(name="reward_model", args={"model": ppo.reward_model, "max_seq_len": max_seq_len})]


def make_ppo_trainer(spec, job_model, run_dir: Path, *, placement: Any = None,
                     files: dict[str, dict[str, str]] | None = None, entry: Entry = Entry.SPEC):
    """The Trainer of a ``task: ppo`` spec (rollouts as its batch source) and the data summary;
    ``placement`` as the trainer takes it (e.g. a ``jaxengine.sharding.MeshPlacement``); ``files`` the spec's
    ``jaxengine.job.data_files`` when the caller hashed them already (``run_job``), else hashed here; ``entry`` as
    ``run_job`` takes it."""
    from jaxengine.job import data_files
    from jaxengine.trainer import Trainer

    ppo, tokenizer, model = spec.ppo, job_model.tokenizer, job_model.model
    grpo.check_reward_models(ppo, section="ppo")
    prompts = grpo.read_rl_prompts(spec, tokenizer, section="ppo", max_new_tokens=ppo.max_new_tokens,
                                   context_length=job_model.config.max_position_embeddings, entry=entry)
    pad_id = grpo.rollout_pad_id(tokenizer)
    config = grpo.rl_train_config(spec, rows=len(prompts.rows), files=data_files(spec) if files is None else files)
    reference = grpo.reference_weights(spec, job_model) if ppo.kl_coef > 0 else None
    terms = reward_terms(ppo, max_seq_len=spec.data.max_seq_len)
    rollouts = PpoRollouts(rows=prompts.rows, prompt_ids=prompts.prompt_ids, tokenizer=tokenizer, ppo=ppo, terms=terms,
                           batch_size=spec.train.batch_size, grad_accum=spec.train.grad_accum, seed=spec.train.seed,
                           pad_id=pad_id, samples_path=run_dir / "samples.jsonl", reference=reference)
    task = PpoTask(epsilon=ppo.epsilon, epsilon_high=ppo.upper_clip, value_clip=ppo.value_clip, vf_coef=ppo.vf_coef,
                   entropy_coef=ppo.entropy_coef, use_stored_old=ppo.num_iterations > 1)
    eval_hook = None
    if prompts.eval_rows:
        policy_hook = grpo.make_eval_hook(rows=prompts.eval_rows, prompt_ids=prompts.eval_prompt_ids,
                                          tokenizer=tokenizer, terms=grpo.with_eval_metrics(terms, ppo.eval_metrics), max_new_tokens=ppo.max_new_tokens,
                                          samples_path=run_dir / "samples.jsonl", sample_count=spec.train.eval_samples,
                                          group_labels=prompts.eval_group_labels)

        def eval_hook(model: PolicyWithValueHead, step: int) -> dict[str, float]:
            return policy_hook(model.backbone, step)

    guard = PpoGuard(max_kl=ppo.max_kl, zero_std_patience=ppo.zero_std_patience,
                     truncated_patience=ppo.truncated_patience, mask_truncated=ppo.mask_truncated)
    trainer = Trainer(model=model, task=task, config=config, batch_source=rollouts, pad_id=pad_id, run_dir=run_dir,
                      trainable=job_model.trainable, eval_hook=eval_hook, guard=guard, placement=placement)
    return trainer, prompts.counts
