"""The pure math of policy-gradient RL for language models: advantages, ratios, clipped surrogates,
KL estimators, loss aggregation, GAE, the clipped value loss and the PPO objective.

Design note: everything here maps arrays to arrays and knows nothing of models, samplers or
batches, so each piece is tested against numbers worked out by hand
(``tests/jaxengine/test_rl.py``). Conventions: ``_pg`` arrays are [P, G] (P prompts, G completions
each), ``_b`` per completion (B = P * G, prompt-major: completions of one prompt are adjacent),
``_bt`` per completion token, with ``mask_bt`` true on completion tokens that count.

Advantage estimators are registered by the names ``grpo.advantage`` takes, aggregations by the
names ``grpo.loss_type`` takes (``ADVANTAGES``, ``AGGREGATIONS``).
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

ADVANTAGES: dict[str, Callable] = {}
KL_ESTIMATORS: dict[str, Callable] = {}


def _register(table: dict[str, Callable], name: str) -> Callable[[Callable], Callable]:
    def decorate(fn: Callable) -> Callable:
        if name in table:
            raise ValueError(f"{name!r} is registered twice ({table[name].__qualname__}, {fn.__qualname__})")
        table[name] = fn
        return fn

    return decorate


# --------------------------------------------------------------------------------------------
# Advantages (one scalar per completion, from the rewards of its group)


@_register(ADVANTAGES, "group")
def group_advantages(rewards_pg: jax.Array, *, eps: float = 1e-4) -> jax.Array:
    """GRPO (Shao et al. 2024): (r - group mean) / (group std + eps), [P, G].

    The std is the unbiased one (ddof 1), as in TRL; a group whose rewards are all equal gets 0.
    """
    mean_p1 = jnp.mean(rewards_pg, axis=1, keepdims=True)
    std_p1 = jnp.std(rewards_pg, axis=1, keepdims=True, ddof=1)
    return (rewards_pg - mean_p1) / (std_p1 + eps)


@_register(ADVANTAGES, "group_mean")
def group_mean_advantages(rewards_pg: jax.Array, *, eps: float = 1e-4) -> jax.Array:
    """Dr. GRPO (Liu et al. 2025): r - group mean, without the std division that reweights easy/hard prompts."""
    del eps  # same signature as the other estimators
    return rewards_pg - jnp.mean(rewards_pg, axis=1, keepdims=True)


@_register(ADVANTAGES, "rloo")
def rloo_advantages(rewards_pg: jax.Array, *, eps: float = 1e-4) -> jax.Array:
    """RLOO (Ahmadian et al. 2024): r_i minus the mean of the other G - 1 rewards of its group."""
    del eps
    group = rewards_pg.shape[1]
    others_pg = (jnp.sum(rewards_pg, axis=1, keepdims=True) - rewards_pg) / (group - 1)
    return rewards_pg - others_pg


def zero_std_fraction(rewards_pg: jax.Array) -> jax.Array:
    """Share of groups whose rewards are all equal (they give no learning signal): ``frac_reward_zero_std``."""
    return jnp.mean((jnp.max(rewards_pg, axis=1) == jnp.min(rewards_pg, axis=1)).astype(jnp.float32))


# --------------------------------------------------------------------------------------------
# Ratios and the clipped surrogate


def token_log_ratio(log_probs_bt: jax.Array, old_log_probs_bt: jax.Array) -> jax.Array:
    """log(pi / pi_old) per token (PPO/GRPO's per-token importance ratio in log space)."""
    return log_probs_bt - old_log_probs_bt


def sequence_log_ratio(log_probs_bt: jax.Array, old_log_probs_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """GSPO (Zheng et al. 2025) per token, [B, T]: every token carries its sequence's log ratio
    mean_t log(pi / pi_old) (the log of the geometric mean of the token ratios).

    Written as ``log_pi - sg(log_pi) + sg(sequence ratio)`` (the paper's GSPO-token form): the value is
    the sequence ratio at every token, and with a per-sequence advantage the gradient is GSPO's.
    """
    mask = mask_bt.astype(jnp.float32)
    delta_bt = (log_probs_bt - old_log_probs_bt) * mask
    sequence_b = jnp.sum(delta_bt, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
    return log_probs_bt - jax.lax.stop_gradient(log_probs_bt) + jax.lax.stop_gradient(sequence_b)[:, None]


def clipped_surrogate(log_ratio_bt: jax.Array, advantages_b: jax.Array, *, epsilon: float,
                      epsilon_high: float) -> tuple[jax.Array, jax.Array]:
    """Per-token PPO-clip loss -min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A), [B, T], and whether
    the clip was active (the min picked the clipped term and it differs), [B, T] bool.

    ``epsilon_high`` > ``epsilon`` is DAPO's clip-higher (Yu et al. 2025): more room for raising the
    probability of unlikely tokens.
    """
    ratio_bt = jnp.exp(log_ratio_bt)
    clipped_bt = jnp.clip(ratio_bt, 1.0 - epsilon, 1.0 + epsilon_high)
    advantages_b1 = advantages_b[:, None]
    unclipped_loss_bt = ratio_bt * advantages_b1
    clipped_loss_bt = clipped_bt * advantages_b1
    is_clipped_bt = clipped_loss_bt < unclipped_loss_bt
    return -jnp.minimum(unclipped_loss_bt, clipped_loss_bt), is_clipped_bt


# --------------------------------------------------------------------------------------------
# KL to the reference (Schulman's estimators of KL(pi || pi_ref) from samples of pi)


@_register(KL_ESTIMATORS, "k1")
def kl_k1(log_probs_bt: jax.Array, reference_log_probs_bt: jax.Array) -> jax.Array:
    """log(pi / pi_ref): unbiased, high variance, can be negative."""
    return log_probs_bt - reference_log_probs_bt


@_register(KL_ESTIMATORS, "k2")
def kl_k2(log_probs_bt: jax.Array, reference_log_probs_bt: jax.Array) -> jax.Array:
    """0.5 * log(pi / pi_ref)^2: biased, low variance, non-negative."""
    return 0.5 * jnp.square(log_probs_bt - reference_log_probs_bt)


@_register(KL_ESTIMATORS, "k3")
def kl_k3(log_probs_bt: jax.Array, reference_log_probs_bt: jax.Array) -> jax.Array:
    """pi_ref / pi - log(pi_ref / pi) - 1: unbiased and non-negative (GRPO's choice)."""
    log_ratio_bt = reference_log_probs_bt - log_probs_bt
    return jnp.exp(log_ratio_bt) - log_ratio_bt - 1.0


# --------------------------------------------------------------------------------------------
# Aggregation of per-token losses into one scalar


def token_mean(loss_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """DAPO: sum over every completion token of the batch / number of those tokens."""
    mask = mask_bt.astype(jnp.float32)
    return jnp.sum(loss_bt * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def sequence_mean(loss_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """GRPO (and GSPO): mean over each sequence's tokens, then mean over sequences."""
    mask = mask_bt.astype(jnp.float32)
    per_sequence_b = jnp.sum(loss_bt * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
    return jnp.mean(per_sequence_b)


def constant_normalizer(loss_bt: jax.Array, mask_bt: jax.Array, *, max_completion_length: int) -> jax.Array:
    """Dr. GRPO: sum over tokens / (B * max_completion_length), a constant, so no length bias."""
    mask = mask_bt.astype(jnp.float32)
    return jnp.sum(loss_bt * mask) / (loss_bt.shape[0] * max_completion_length)


LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "gspo")


def aggregate(loss_type: str, loss_bt: jax.Array, mask_bt: jax.Array, *, max_completion_length: int) -> jax.Array:
    """The scalar loss of ``loss_type``: grpo and gspo per sequence, dapo per token, dr_grpo constant."""
    if loss_type in ("grpo", "gspo"):
        return sequence_mean(loss_bt, mask_bt)
    if loss_type == "dapo":
        return token_mean(loss_bt, mask_bt)
    if loss_type == "dr_grpo":
        return constant_normalizer(loss_bt, mask_bt, max_completion_length=max_completion_length)
    raise ValueError(f"loss_type {loss_type!r} is not one of {', '.join(LOSS_TYPES)}")


def mask_truncated(mask_bt: jax.Array, truncated_b: jax.Array) -> jax.Array:
    """``mask_bt`` with every token of truncated completions (no stop token within the budget) off (DAPO)."""
    return mask_bt & ~truncated_b[:, None]


def grpo_loss(log_probs_bt: jax.Array, old_log_probs_bt: jax.Array, reference_log_probs_bt: jax.Array | None,
              advantages_b: jax.Array, mask_bt: jax.Array, *, loss_type: str, epsilon: float, epsilon_high: float,
              beta: float, kl_estimator: str, max_completion_length: int) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The GRPO-family objective: clipped surrogate (+ beta * KL when beta > 0), aggregated by ``loss_type``.

    Returns (loss, metrics ``kl`` (token mean of the estimator; 0 without a reference) and
    ``clip_ratio`` (share of completion tokens where clipping was active)).
    """
    if loss_type == "gspo":
        log_ratio_bt = sequence_log_ratio(log_probs_bt, old_log_probs_bt, mask_bt)
    else:
        log_ratio_bt = token_log_ratio(log_probs_bt, old_log_probs_bt)
    per_token_bt, is_clipped_bt = clipped_surrogate(log_ratio_bt, advantages_b, epsilon=epsilon,
                                                    epsilon_high=epsilon_high)
    kl = jnp.zeros((), jnp.float32)
    if beta > 0:
        kl_bt = KL_ESTIMATORS[kl_estimator](log_probs_bt, reference_log_probs_bt)
        per_token_bt = per_token_bt + beta * kl_bt
        kl = token_mean(kl_bt, mask_bt)
    loss = aggregate(loss_type, per_token_bt, mask_bt, max_completion_length=max_completion_length)
    return loss, {"kl": kl, "clip_ratio": token_mean(is_clipped_bt.astype(jnp.float32), mask_bt)}


# --------------------------------------------------------------------------------------------
# PPO pieces


def gae(rewards_bt: jax.Array, values_bt: jax.Array, mask_bt: jax.Array, *, gamma: float,
        lam: float) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation (Schulman et al. 2016) over each row's masked tokens.

    delta_t = r_t + gamma * V_{t+1} - V_t (V after the last real token is 0),
    A_t = delta_t + gamma * lam * A_{t+1}. Returns (advantages, returns = advantages + values), [B, T],
    zero outside the mask. Tokens are assumed contiguous within each row's mask.
    """
    mask = mask_bt.astype(jnp.float32)
    values_bt = values_bt * mask
    rewards_bt = rewards_bt * mask
    next_values_bt = jnp.concatenate([values_bt[:, 1:], jnp.zeros_like(values_bt[:, :1])], axis=1)
    next_mask_bt = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
    deltas_bt = rewards_bt + gamma * next_values_bt * next_mask_bt - values_bt

    def step(next_advantage_b, inputs):
        delta_b, next_mask_b = inputs
        advantage_b = delta_b + gamma * lam * next_advantage_b * next_mask_b
        return advantage_b, advantage_b

    _, advantages_tb = jax.lax.scan(step, jnp.zeros(rewards_bt.shape[0], jnp.float32),
                                    (deltas_bt.T, next_mask_bt.T), reverse=True)
    advantages_bt = advantages_tb.T * mask
    return advantages_bt, (advantages_bt + values_bt) * mask


def clipped_value_loss(values_bt: jax.Array, old_values_bt: jax.Array, returns_bt: jax.Array, mask_bt: jax.Array, *,
                       value_clip: float) -> tuple[jax.Array, jax.Array]:
    """PPO value loss 0.5 * max((V - R)^2, (clip(V, V_old ± value_clip) - R)^2), token mean over the mask,
    and the share of tokens where the clipped term was the larger."""
    clipped_bt = old_values_bt + jnp.clip(values_bt - old_values_bt, -value_clip, value_clip)
    unclipped_sq_bt = jnp.square(values_bt - returns_bt)
    clipped_sq_bt = jnp.square(clipped_bt - returns_bt)
    loss = 0.5 * token_mean(jnp.maximum(unclipped_sq_bt, clipped_sq_bt), mask_bt)
    return loss, token_mean((clipped_sq_bt > unclipped_sq_bt).astype(jnp.float32), mask_bt)


def entropy_from_logits(logits_btv: jax.Array) -> jax.Array:
    """Entropy of each position's next-token distribution, -sum_v p log p, float32 [B, T]."""
    log_probs_btv = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(log_probs_btv) * log_probs_btv, axis=-1)


def chunked_entropy(hidden_btd: jax.Array, logits_fn: Callable[[jax.Array], jax.Array], *,
                    chunk_size: int = 256, differentiable: bool = False) -> jax.Array:
    """``entropy_from_logits(logits_fn(hidden_btd))``, ``chunk_size`` positions at a time, so the [B, T, V]
    logits are never held at once. Without gradient (a metric) unless ``differentiable`` (PPO's entropy
    bonus), when each chunk's logits are recomputed in the backward pass instead of stored."""
    if not differentiable:
        hidden_btd = jax.lax.stop_gradient(hidden_btd)
    batch, length, width = hidden_btd.shape
    if length <= chunk_size:
        return entropy_from_logits(logits_fn(hidden_btd))
    num_chunks = -(-length // chunk_size)
    padded_btd = jnp.pad(hidden_btd, ((0, 0), (0, num_chunks * chunk_size - length), (0, 0)))
    hidden_nbcd = padded_btd.reshape(batch, num_chunks, chunk_size, width).swapaxes(0, 1)

    def chunk_entropy(hidden_bcd: jax.Array) -> jax.Array:
        return entropy_from_logits(logits_fn(hidden_bcd))

    entropy_nbc = jax.lax.map(jax.checkpoint(chunk_entropy) if differentiable else chunk_entropy, hidden_nbcd)
    return entropy_nbc.swapaxes(0, 1).reshape(batch, num_chunks * chunk_size)[:, :length]


# --------------------------------------------------------------------------------------------
# The PPO objective (Schulman et al. 2017; per-token rewards, values and advantages as in Ouyang et al.
# 2022 and TRL's PPOTrainer)


def masked_whiten(values_bt: jax.Array, mask_bt: jax.Array, *, eps: float = 1e-8) -> jax.Array:
    """(x - mean) / sqrt(var + eps) with the mean and the unbiased variance over the masked entries of
    the whole batch (TRL's ``masked_whiten``); zero outside the mask."""
    mask = mask_bt.astype(jnp.float32)
    count = jnp.sum(mask)
    mean = jnp.sum(values_bt * mask) / jnp.maximum(count, 1.0)
    variance = jnp.sum(jnp.square(values_bt - mean) * mask) / jnp.maximum(count - 1.0, 1.0)
    return (values_bt - mean) * jax.lax.rsqrt(variance + eps) * mask


def last_token_mask(mask_bt: jax.Array) -> jax.Array:
    """True at each row's last masked position, [B, T] bool (all false for a row without one)."""
    length = mask_bt.shape[1]
    positions_bt = jnp.broadcast_to(jnp.arange(length), mask_bt.shape)
    last_b = jnp.max(jnp.where(mask_bt, positions_bt, -1), axis=1)
    return positions_bt == last_b[:, None]


def ppo_token_rewards(scores_b: jax.Array, log_probs_bt: jax.Array, reference_log_probs_bt: jax.Array,
                      mask_bt: jax.Array, *, kl_coef: float) -> tuple[jax.Array, jax.Array]:
    """Per-token rewards -kl_coef * (log pi - log pi_ref) at every completion token, plus the sequence's
    score at its last one; and the per-token KL estimate log(pi / pi_ref) (k1). Both [B, T], zero off the mask."""
    mask = mask_bt.astype(jnp.float32)
    kl_bt = (log_probs_bt - reference_log_probs_bt) * mask
    score_bt = scores_b[:, None] * last_token_mask(mask_bt).astype(jnp.float32)
    return -kl_coef * kl_bt + score_bt, kl_bt


def ppo_loss(log_probs_bt: jax.Array, old_log_probs_bt: jax.Array, values_bt: jax.Array, old_values_bt: jax.Array,
             advantages_bt: jax.Array, returns_bt: jax.Array, entropy_bt: jax.Array, mask_bt: jax.Array, *,
             epsilon: float, epsilon_high: float, value_clip: float, vf_coef: float,
             entropy_coef: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """policy loss + vf_coef * value loss - entropy_coef * entropy, each a token mean over the mask.

    The policy loss is the per-token clipped surrogate (``clipped_surrogate``: ratios clipped to
    [1 - epsilon, 1 + epsilon_high]) on per-token advantages; the value loss is ``clipped_value_loss``.
    Metrics under TRL's PPO names: ``loss/policy``, ``loss/value``, ``policy/clipfrac``, ``val/clipfrac``,
    ``policy/entropy``, ``policy/approxkl`` (0.5 * mean squared log ratio) and ``val/ratio`` (mean ratio).
    """
    log_ratio_bt = token_log_ratio(log_probs_bt, old_log_probs_bt)
    # clipped_surrogate takes one advantage per row: every token is its own row here.
    surrogate_n1, is_clipped_n1 = clipped_surrogate(log_ratio_bt.reshape(-1, 1), advantages_bt.reshape(-1),
                                                    epsilon=epsilon, epsilon_high=epsilon_high)
    policy_loss = token_mean(surrogate_n1.reshape(log_ratio_bt.shape), mask_bt)
    value_loss, value_clipfrac = clipped_value_loss(values_bt, old_values_bt, returns_bt, mask_bt,
                                                    value_clip=value_clip)
    entropy = token_mean(entropy_bt, mask_bt)
    loss = policy_loss + vf_coef * value_loss - entropy_coef * entropy
    return loss, {
        "loss/policy": policy_loss,
        "loss/value": value_loss,
        "policy/clipfrac": token_mean(is_clipped_n1.reshape(log_ratio_bt.shape).astype(jnp.float32), mask_bt),
        "val/clipfrac": value_clipfrac,
        "policy/entropy": entropy,
        "policy/approxkl": 0.5 * token_mean(jnp.square(log_ratio_bt), mask_bt),
        "val/ratio": token_mean(jnp.exp(log_ratio_bt), mask_bt),
    }
