"""Training losses as pure functions, registered by name.

Design note: every loss takes arrays and returns ``(loss_scalar, metrics)`` where ``metrics`` maps
the metric names users know from TRL (``rewards/chosen``, ``logps/rejected``...) to scalars. Tasks
pick a loss by the name in the job spec (``LOSSES[name]``) and feed it inputs; nothing here knows
about models or batches, which is what makes the hand-computed tests in
``tests/jaxengine/test_losses.py`` possible. A loss that keeps statistics from one step to the next
(``bco_pair``'s running mean of rewards) stays pure: it takes that state as an argument and returns it
updated, ``(loss_scalar, new_state, metrics)``; the trainer carries it (its "loss state") and checkpoints it.

Token log-probabilities have two implementations with identical results: ``token_log_probs`` from
full logits, and ``chunked_token_log_probs`` from hidden states and the output projection. When the
whole [B, T, V] float32 logits fit ``logits_memory_budget`` it computes them at once and keeps them
for the backward pass (two output projections per step: forward and gradient). Above the budget it
computes logits for ``chunk_size`` positions at a time under ``jax.checkpoint``, so neither pass
ever holds the whole tensor (the largest activation of a small-model fine-tune: batch 16 x 2048
tokens x 152k vocabulary is 20 GB) at the price of a third projection, the recompute.
``loss_token_log_probs`` gathers the loss positions first, so a fine-tune whose loss covers only
completions projects only those rows onto the vocabulary.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Metrics = dict[str, jax.Array]

LOSSES: dict[str, Callable] = {}


def register_loss(name: str) -> Callable[[Callable], Callable]:
    """Register ``fn`` under ``name`` in ``LOSSES``; names are unique."""

    def decorate(fn: Callable) -> Callable:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is registered twice ({LOSSES[name].__qualname__}, {fn.__qualname__})")
        LOSSES[name] = fn
        return fn

    return decorate


def token_log_probs(logits_btv: jax.Array, targets_bt: jax.Array) -> jax.Array:
    """log p(target) at every position, float32 [B, T]: the target's logit minus the log-normaliser.

    The same value as reading the target from ``log_softmax``, without writing the [B, T, V]
    log-probabilities: on CPU the loss alone (value and gradient at 8 x 256 x 16384) took 17 % less
    time (bench/RESULTS.md, "LoRA SFT every position: where the step's time went").
    """
    logits_btv = logits_btv.astype(jnp.float32)
    target_logits_bt = jnp.take_along_axis(logits_btv, targets_bt[..., None], axis=-1)[..., 0]
    return target_logits_bt - jax.nn.logsumexp(logits_btv, axis=-1)


# Logits up to this size (B x T x V x 4 bytes) are stored for the backward pass instead of recomputed
# chunk by chunk. The backward pass holds about twice that (logits and their gradient), so 1 GiB keeps a
# medium fine-tune's peak a few GiB while a batch 16 x 2048 x 152k-vocabulary run (20 GB) still chunks.
LOGITS_MEMORY_BUDGET = 1 << 30


def chunked_token_log_probs(
    hidden_btd: jax.Array,
    targets_bt: jax.Array,
    logits_fn: Callable[[jax.Array], jax.Array],
    *,
    chunk_size: int = 256,
    logits_memory_budget: int = 0,
) -> jax.Array:
    """``token_log_probs(logits_fn(hidden_btd), targets_bt)``, chunked when the logits exceed the budget.

    ``logits_fn`` maps hidden states [B, C, D] to logits [B, C, V] (the model's output projection,
    tied or not, with any soft-capping). When the float32 logits [B, T, V] take more than
    ``logits_memory_budget`` bytes, they are computed ``chunk_size`` positions at a time and each
    chunk's logits are recomputed in the backward pass instead of stored (0, the default for callers
    that predate the budget, such as the RL losses: always chunk). T need not
    divide by ``chunk_size``: the tail is padded and dropped. Sequences of at most ``chunk_size``
    positions take the plain path.
    """
    batch, length, width = hidden_btd.shape
    if length <= chunk_size or _logits_bytes(hidden_btd, logits_fn) <= logits_memory_budget:
        # One chunk, or logits that fit: storing them costs less time than recomputing them.
        return token_log_probs(logits_fn(hidden_btd), targets_bt)
    chunk = chunk_size
    num_chunks = -(-length // chunk)
    pad = num_chunks * chunk - length
    hidden_btd = jnp.pad(hidden_btd, ((0, 0), (0, pad), (0, 0)))
    targets_bt = jnp.pad(targets_bt, ((0, 0), (0, pad)))
    # [N, B, C, D] and [N, B, C]: scan runs over the leading chunk axis.
    hidden_nbcd = hidden_btd.reshape(batch, num_chunks, chunk, width).swapaxes(0, 1)
    targets_nbc = targets_bt.reshape(batch, num_chunks, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def chunk_log_probs(hidden_bcd: jax.Array, targets_bc: jax.Array) -> jax.Array:
        return token_log_probs(logits_fn(hidden_bcd), targets_bc)

    def body(carry: None, xs: tuple[jax.Array, jax.Array]) -> tuple[None, jax.Array]:
        return carry, chunk_log_probs(*xs)

    _, log_probs_nbc = jax.lax.scan(body, None, (hidden_nbcd, targets_nbc))
    return log_probs_nbc.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]


def _logits_bytes(hidden_btd: jax.Array, logits_fn: Callable[[jax.Array], jax.Array]) -> int:
    """Bytes of the float32 logits [B, T, V] of ``hidden_btd`` (V from the shape of one position's logits)."""
    batch, length, _ = hidden_btd.shape
    vocab = jax.eval_shape(logits_fn, jax.ShapeDtypeStruct((1, 1, hidden_btd.shape[-1]), hidden_btd.dtype)).shape[-1]
    return batch * length * vocab * 4


def loss_token_log_probs(
    hidden_btd: jax.Array,
    targets_bt: jax.Array,
    loss_mask_bt: jax.Array,
    logits_fn: Callable[[jax.Array], jax.Array],
    *,
    capacity: int,
    chunk_size: int = 256,
    logits_memory_budget: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """log p(target) at the loss positions only: float32 [capacity] and which slots are real, bool [capacity].

    The positions where ``loss_mask_bt`` is true (row-major order) are gathered into ``capacity``
    slots, static, so the output projection runs on ``capacity`` rows instead of B x T; the slots past
    the number of loss positions repeat position 0 and are marked not real. ``capacity`` must be at
    least that number (the caller counts it on the host and rounds it up, so that few shapes compile);
    ``masked_cross_entropy(log_probs, real)`` then equals the full computation's loss and gradients.
    """
    batch, length, width = hidden_btd.shape
    mask_p = loss_mask_bt.reshape(batch * length)
    (index_n,) = jnp.nonzero(mask_p, size=capacity, fill_value=0)
    real_n = jnp.arange(capacity) < jnp.sum(mask_p)
    hidden_1nd = hidden_btd.reshape(batch * length, width)[index_n][None]
    targets_1n = targets_bt.reshape(batch * length)[index_n][None]
    log_probs_1n = chunked_token_log_probs(hidden_1nd, targets_1n, logits_fn, chunk_size=chunk_size,
                                           logits_memory_budget=logits_memory_budget)
    return log_probs_1n[0], real_n


def sequence_log_probs(token_log_probs_bt: jax.Array, loss_mask_bt: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-row sum of log-probs over loss tokens and the count of those tokens, both [B] float32."""
    mask_bt = loss_mask_bt.astype(jnp.float32)
    return jnp.sum(token_log_probs_bt * mask_bt, axis=-1), jnp.sum(mask_bt, axis=-1)


@register_loss("cross_entropy")
def masked_cross_entropy(token_log_probs_bt: jax.Array, loss_mask_bt: jax.Array) -> tuple[jax.Array, Metrics]:
    """Mean negative log-likelihood over the tokens where ``loss_mask_bt`` is true (0 when none are)."""
    mask_bt = loss_mask_bt.astype(jnp.float32)
    num_tokens = jnp.sum(mask_bt)
    loss = -jnp.sum(token_log_probs_bt * mask_bt) / jnp.maximum(num_tokens, 1.0)
    return loss, {"loss_tokens": num_tokens}


def _preference_metrics(
    chosen_rewards_b: jax.Array, rejected_rewards_b: jax.Array, chosen_logps_b: jax.Array, rejected_logps_b: jax.Array
) -> Metrics:
    return {
        "rewards/chosen": jnp.mean(chosen_rewards_b),
        "rewards/rejected": jnp.mean(rejected_rewards_b),
        "rewards/margins": jnp.mean(chosen_rewards_b - rejected_rewards_b),
        "rewards/accuracies": jnp.mean((chosen_rewards_b > rejected_rewards_b).astype(jnp.float32)),
        "logps/chosen": jnp.mean(chosen_logps_b),
        "logps/rejected": jnp.mean(rejected_logps_b),
    }


def _smoothed_logistic(scaled_logits_b: jax.Array, label_smoothing: float) -> jax.Array:
    # With probability label_smoothing the preference label is assumed flipped (conservative DPO).
    return (
        -jax.nn.log_sigmoid(scaled_logits_b) * (1.0 - label_smoothing)
        - jax.nn.log_sigmoid(-scaled_logits_b) * label_smoothing
    )


def _reference_logits(policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b):
    return (policy_chosen_b - policy_rejected_b) - (reference_chosen_b - reference_rejected_b)


def _implicit_rewards(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b):
    return beta * (policy_chosen_b - reference_chosen_b), beta * (policy_rejected_b - reference_rejected_b)


def _reference_metrics(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b) -> Metrics:
    """The metrics of every loss against a reference: TRL's implicit rewards beta * (policy - reference)."""
    rewards = _implicit_rewards(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)
    return _preference_metrics(*rewards, policy_chosen_b, policy_rejected_b)


@register_loss("sigmoid")
def dpo_sigmoid_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """DPO (Rafailov et al. 2023): -log sigmoid(beta * log-ratio margin), with optional label smoothing.

    Inputs are per-sequence summed log-probs of the completions, [B].
    """
    logits_b = _reference_logits(policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)
    loss = jnp.mean(_smoothed_logistic(beta * logits_b, label_smoothing))
    return loss, _reference_metrics(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)


@register_loss("ipo")
def ipo_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
) -> tuple[jax.Array, Metrics]:
    """IPO (Azar et al. 2023): (log-ratio margin - 1 / (2 beta))^2.

    As in the paper (and TRL), callers pass length-averaged log-probs.
    """
    logits_b = _reference_logits(policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)
    loss = jnp.mean((logits_b - 1.0 / (2.0 * beta)) ** 2)
    return loss, _reference_metrics(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)


@register_loss("hinge")
def hinge_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
) -> tuple[jax.Array, Metrics]:
    """SLiC-style hinge (Zhao et al. 2023): relu(1 - beta * log-ratio margin)."""
    logits_b = _reference_logits(policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)
    loss = jnp.mean(jax.nn.relu(1.0 - beta * logits_b))
    return loss, _reference_metrics(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)


# The DPO variants below are TRL's DPOTrainer ``loss_type``s of the same names, on summed log-probs as there.


@register_loss("robust")
def robust_dpo_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """Robust DPO (Ray Chowdhury et al. 2024): the sigmoid loss made unbiased under labels flipped with probability
    eps = label_smoothing: ((1 - eps) * -log sigmoid(z) - eps * -log sigmoid(-z)) / (1 - 2 eps), z = beta * margin.

    Unlike conservative DPO (sigmoid with smoothing), whose loss is smallest at a finite margin, this one keeps
    falling as the margin grows (it goes below zero): eps is the noise rate the data is believed to have.
    """
    scaled_b = beta * _reference_logits(policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)
    loss_b = (-(1.0 - label_smoothing) * jax.nn.log_sigmoid(scaled_b) + label_smoothing * jax.nn.log_sigmoid(-scaled_b))
    loss = jnp.mean(loss_b / (1.0 - 2.0 * label_smoothing))
    return loss, _reference_metrics(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)


# EXO's target is (1 - eps, eps): eps = 0 would put log 0 in the loss, so 0 means this (TRL's choice too).
EXO_DEFAULT_EPSILON = 1e-3


@register_loss("exo_pair")
def exo_pair_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """EXO, pairwise (Ji et al. 2024, eq. 16): KL from the policy's preference (sigmoid(z), sigmoid(-z)), z = beta *
    margin, to the target (1 - eps, eps), eps = label_smoothing (0: ``EXO_DEFAULT_EPSILON``).

    The loss is 0 at sigmoid(z) = 1 - eps, so past that margin raising the chosen log-prob raises it. Written with
    log_sigmoid, never log(sigmoid): at |z| > ~104 float32's sigmoid(-|z|) is 0 and 0 * log 0 would be NaN.
    """
    epsilon = label_smoothing or EXO_DEFAULT_EPSILON
    scaled_b = beta * _reference_logits(policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)
    loss_b = jax.nn.sigmoid(scaled_b) * (jax.nn.log_sigmoid(scaled_b) - jnp.log1p(-epsilon)) + jax.nn.sigmoid(
        -scaled_b) * (jax.nn.log_sigmoid(-scaled_b) - jnp.log(epsilon))
    return jnp.mean(loss_b), _reference_metrics(
        beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)


@register_loss("nca_pair")
def nca_pair_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
) -> tuple[jax.Array, Metrics]:
    """NCA, pairwise (Chen et al. 2024): -log sigmoid(r_c) - log sigmoid(-r_c) / 2 - log sigmoid(-r_r) / 2 on the
    implicit rewards r = beta * (policy - reference) themselves, not their difference: it pushes the rejected
    reward down rather than only below the chosen one (smallest at r_c = log 2, r_r -> -inf)."""
    chosen_b, rejected_b = _implicit_rewards(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b,
                                             reference_rejected_b)
    loss_b = -jax.nn.log_sigmoid(chosen_b) - 0.5 * jax.nn.log_sigmoid(-chosen_b) - 0.5 * jax.nn.log_sigmoid(-rejected_b)
    return jnp.mean(loss_b), _preference_metrics(chosen_b, rejected_b, policy_chosen_b, policy_rejected_b)


@register_loss("sppo_hard")
def sppo_hard_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
) -> tuple[jax.Array, Metrics]:
    """SPPO with hard labels (Wu et al. 2024): (a - 1/(2 beta))^2 + (b + 1/(2 beta))^2, a and b the chosen and
    rejected log-ratios policy - reference: each completion's log-ratio is regressed to its own target (the paper's
    win probability set to 1 for the chosen, 0 for the rejected)."""
    half_over_beta = 0.5 / beta
    loss_b = (policy_chosen_b - reference_chosen_b - half_over_beta) ** 2 + (
        policy_rejected_b - reference_rejected_b + half_over_beta) ** 2
    return jnp.mean(loss_b), _reference_metrics(
        beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)


@register_loss("apo_zero")
def apo_zero_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
) -> tuple[jax.Array, Metrics]:
    """APO-zero (D'Oosterlinck et al. 2024, eq. 7): 1 - sigmoid(r_c) + sigmoid(r_r), r = beta * (policy -
    reference): raises the chosen likelihood and lowers the rejected one, for chosen answers better than the
    model's own."""
    chosen_b, rejected_b = _implicit_rewards(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b,
                                             reference_rejected_b)
    loss = jnp.mean(jax.nn.sigmoid(-chosen_b) + jax.nn.sigmoid(rejected_b))  # 1 - sigmoid(x) = sigmoid(-x)
    return loss, _preference_metrics(chosen_b, rejected_b, policy_chosen_b, policy_rejected_b)


@register_loss("apo_down")
def apo_down_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
) -> tuple[jax.Array, Metrics]:
    """APO-down (D'Oosterlinck et al. 2024, eq. 8): sigmoid(r_c) + 1 - sigmoid(r_c - r_r), r = beta * (policy -
    reference): lowers the chosen likelihood and the rejected one more, for chosen answers worse than the
    model's own."""
    chosen_b, rejected_b = _implicit_rewards(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b,
                                             reference_rejected_b)
    loss = jnp.mean(jax.nn.sigmoid(chosen_b) + jax.nn.sigmoid(rejected_b - chosen_b))
    return loss, _preference_metrics(chosen_b, rejected_b, policy_chosen_b, policy_rejected_b)


@register_loss("discopop")
def discopop_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
    tau: float,
) -> tuple[jax.Array, Metrics]:
    """DiscoPOP (Chan et al. 2024, eq. 5, the log-ratio modulated loss): with z = beta * margin and m =
    sigmoid(z / tau), (1 - m) * -log sigmoid(z) + m * exp(-z): logistic where the margin is negative, exponential
    where it is positive.

    The exponential term is taken as exp(-z + log sigmoid(z / tau)): written as exp(-z) * m (as TRL does) it
    overflows to inf at z < -88 in float32 while m is 0 there, and inf * 0 made the loss NaN.
    """
    scaled_b = beta * _reference_logits(policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)
    logistic_b = -jax.nn.log_sigmoid(scaled_b) * jax.nn.sigmoid(-scaled_b / tau)  # 1 - m = sigmoid(-z / tau)
    exponential_b = jnp.exp(jax.nn.log_sigmoid(scaled_b / tau) - scaled_b)
    return jnp.mean(logistic_b + exponential_b), _reference_metrics(
        beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)


# The three losses below read statistics of the whole batch, not of each pair alone: the mean log-ratio (kto_pair),
# the order of the batch's log-ratios (aot, aot_pair). The batch is the micro-batch the trainer hands the task
# (``train.batch_size`` pairs, across every device of a sharded step: the jitted mean and sort see the global
# array); under ``train.grad_accum`` each micro-batch uses its own, as does each eval batch (the last one shorter).


@register_loss("kto_pair")
def kto_pair_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
) -> tuple[jax.Array, Metrics]:
    """KTO on pairs (Ethayarajh et al. 2024, eq. 7; TRL's older DPOTrainer ``kto_pair``): 1 - sigmoid(beta * (a -
    z_r)) for each chosen and 1 - sigmoid(beta * (z_c - b)) for each rejected, a and b their log-ratios policy -
    reference, averaged over all 2B terms (TRL concatenates the halves).

    The reference points z_c = max(mean(a), 0) and z_r = max(mean(b), 0) are batch statistics: the micro-batch's
    (see the note above), so micro-batches under grad_accum each use their own. Each half is measured against the
    other half's point, as the KTO report estimates its KL term from unrelated completions. The points are held
    constant in the backward pass, as the KTO authors' code (HALOs) and TRL's KTOTrainer do; TRL's DPOTrainer
    ``kto_pair`` let the gradient flow through the batch mean (same loss values, other gradients).
    """
    chosen_logratios_b = policy_chosen_b - reference_chosen_b
    rejected_logratios_b = policy_rejected_b - reference_rejected_b
    chosen_point = jax.lax.stop_gradient(jnp.maximum(jnp.mean(chosen_logratios_b), 0.0))
    rejected_point = jax.lax.stop_gradient(jnp.maximum(jnp.mean(rejected_logratios_b), 0.0))
    # 1 - sigmoid(x) = sigmoid(-x)
    chosen_losses_b = jax.nn.sigmoid(-beta * (chosen_logratios_b - rejected_point))
    rejected_losses_b = jax.nn.sigmoid(-beta * (chosen_point - rejected_logratios_b))
    loss = 0.5 * (jnp.mean(chosen_losses_b) + jnp.mean(rejected_losses_b))
    return loss, _reference_metrics(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)


@register_loss("aot_pair")
def aot_pair_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """AOT for unpaired data (Melnyk et al. 2024; TRL's name despite the suffix): the sigmoid loss (conservative
    with ``label_smoothing``) on sort(a) - sort(b), a and b the batch's chosen and rejected log-ratios policy -
    reference, each sorted on its own.

    Matching the i-th smallest chosen to the i-th smallest rejected is the one-dimensional optimal transport
    between their distributions: it asks the chosen rewards to be higher at every quantile than the rejected ones
    (first-order stochastic dominance), not pair by pair, so which rejected came with which chosen does not
    matter. A batch statistic (see the note above).
    """
    delta_b = jnp.sort(policy_chosen_b - reference_chosen_b) - jnp.sort(policy_rejected_b - reference_rejected_b)
    loss = jnp.mean(_smoothed_logistic(beta * delta_b, label_smoothing))
    return loss, _reference_metrics(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)


@register_loss("aot")
def aot_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """AOT for paired data (Melnyk et al. 2024): the sigmoid loss (conservative with ``label_smoothing``) on sort(policy
    chosen - rejected) - sort(reference chosen - rejected): the policy's distribution of log-prob margins made to
    dominate the reference's, quantile by quantile. A batch statistic (see the note above).
    """
    delta_b = jnp.sort(policy_chosen_b - policy_rejected_b) - jnp.sort(reference_chosen_b - reference_rejected_b)
    loss = jnp.mean(_smoothed_logistic(beta * delta_b, label_smoothing))
    return loss, _reference_metrics(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b, reference_rejected_b)


# bco_pair's running mean of the implicit rewards: {"mean": float32 [], "count": float32 []}, carried across steps.
RunningMean = dict[str, jax.Array]


def running_mean_start() -> RunningMean:
    """A running mean over no values yet: mean 0, count 0 (TRL's ``RunningMoments`` starts its count at 1e-24,
    which its first update's sum drops: that update sets the mean to the first value, as this one does)."""
    return {"mean": jnp.zeros((), jnp.float32), "count": jnp.zeros((), jnp.float32)}


def running_mean_update(running: RunningMean, values_mean: jax.Array, values_count: float) -> RunningMean:
    """``running`` with ``values_count`` values of mean ``values_mean`` added: the mean moves toward theirs by their
    share of the total count (Chan et al.'s parallel update, as TRL's ``RunningMoments.update``: new mean = mean +
    (values_mean - mean) * values_count / (count + values_count)); the count adds up. The count is float32, exact
    up to 2**24 updates."""
    count = running["count"] + values_count
    mean = running["mean"] + (values_mean - running["mean"]) * (values_count / count)
    return {"mean": mean, "count": count}


@register_loss("bco_pair")
def bco_pair_loss(
    policy_chosen_b: jax.Array,
    policy_rejected_b: jax.Array,
    reference_chosen_b: jax.Array,
    reference_rejected_b: jax.Array,
    running: RunningMean,
    *,
    beta: float,
) -> tuple[jax.Array, RunningMean, Metrics]:
    """BCO on pairs (Jung et al. 2024; TRL's DPOTrainer ``bco_pair``): a binary classifier of the implicit rewards r
    = beta * (policy - reference), -log sigmoid(r_c - delta) - log sigmoid(-(r_r - delta)), chosen above and
    rejected below delta, the running mean of every reward seen in training.

    Returns the loss, ``running`` updated, and the metrics with ``delta`` (the name TRL's BCOTrainer logs it under).
    As TRL does, the running mean is first updated with this batch's mean reward (over its 2B chosen and rejected
    rewards) and then read, so the batch's own rewards are in delta; the update counts that mean as one value
    (TRL's ``running.update`` of a scalar: count 1), so delta is the plain mean of the batches' mean rewards,
    whatever their sizes. delta carries no gradient (TRL detaches the batch mean; the state is no parameter).
    """
    chosen_b, rejected_b = _implicit_rewards(beta, policy_chosen_b, policy_rejected_b, reference_chosen_b,
                                             reference_rejected_b)
    batch_mean = jax.lax.stop_gradient(jnp.mean(jnp.concatenate([chosen_b, rejected_b])))
    running = jax.lax.stop_gradient(running_mean_update(running, batch_mean, 1.0))
    delta = running["mean"]
    loss_b = -jax.nn.log_sigmoid(chosen_b - delta) - jax.nn.log_sigmoid(-(rejected_b - delta))
    metrics = _preference_metrics(chosen_b, rejected_b, policy_chosen_b, policy_rejected_b)
    return jnp.mean(loss_b), running, {**metrics, "delta": delta}


@register_loss("simpo")
def simpo_loss(
    policy_chosen_avg_b: jax.Array,
    policy_rejected_avg_b: jax.Array,
    *,
    beta: float,
    gamma: float,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """SimPO (Meng et al. 2024), reference-free: -log sigmoid(beta * (avg_c - avg_r) - gamma).

    Inputs are length-averaged log-probs of the completions, [B]; rewards are beta * avg log-prob.
    """
    scaled_b = beta * (policy_chosen_avg_b - policy_rejected_avg_b) - gamma
    loss = jnp.mean(_smoothed_logistic(scaled_b, label_smoothing))
    metrics = _preference_metrics(
        beta * policy_chosen_avg_b, beta * policy_rejected_avg_b, policy_chosen_avg_b, policy_rejected_avg_b
    )
    return loss, metrics


# ORPO's 1 - p is held at least this: float32's log-softmax is exactly 0 once a token leads by ~17 logits (a model
# sure of an answer), and log(1 - 1) = -inf made the loss infinite (rejected) or its gradients NaN (chosen). At odds
# of 1e6 the odds-ratio term is as good as saturated.
_MIN_ONE_MINUS_P = 1e-6


def _log_one_minus_p(avg_log_prob_b: jax.Array) -> jax.Array:
    """log(1 - exp(avg)), exact (expm1, not 1 - exp) down to 1 - p = 1e-6 and held there: finite, as its gradient."""
    return jnp.log(jnp.maximum(-jnp.expm1(avg_log_prob_b), _MIN_ONE_MINUS_P))


@register_loss("orpo")
def orpo_loss(
    policy_chosen_avg_b: jax.Array,
    policy_rejected_avg_b: jax.Array,
    *,
    beta: float,
) -> tuple[jax.Array, Metrics]:
    """ORPO (Hong et al. 2024), reference-free: NLL(chosen) - beta * log sigmoid(log odds ratio).

    Inputs are length-averaged log-probs (<= 0), [B]. odds(p) = p / (1 - p) with p = exp(avg log-prob);
    NLL(chosen) is the mean over rows of each chosen completion's average token NLL.
    """
    log_odds_b = (policy_chosen_avg_b - policy_rejected_avg_b) - (
        _log_one_minus_p(policy_chosen_avg_b) - _log_one_minus_p(policy_rejected_avg_b)
    )
    odds_ratio_term_b = jax.nn.log_sigmoid(log_odds_b)
    nll = -jnp.mean(policy_chosen_avg_b)
    loss = nll - beta * jnp.mean(odds_ratio_term_b)
    metrics = _preference_metrics(
        beta * policy_chosen_avg_b, beta * policy_rejected_avg_b, policy_chosen_avg_b, policy_rejected_avg_b
    )
    metrics.update({"nll_loss": nll, "log_odds_ratio": jnp.mean(odds_ratio_term_b), "log_odds": jnp.mean(log_odds_b)})
    return loss, metrics


@register_loss("bradley_terry")
def bradley_terry_loss(
    chosen_rewards_b: jax.Array,
    rejected_rewards_b: jax.Array,
    *,
    center_rewards_coefficient: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """Reward-model loss: -log sigmoid(r_chosen - r_rejected), plus coef * mean((r_c + r_r)^2).

    The centring term (Eisenstein et al. 2023) keeps rewards near zero without changing preferences.
    """
    margins_b = chosen_rewards_b - rejected_rewards_b
    loss = -jnp.mean(jax.nn.log_sigmoid(margins_b))
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * jnp.mean((chosen_rewards_b + rejected_rewards_b) ** 2)
    return loss, {
        "accuracy": jnp.mean((margins_b > 0).astype(jnp.float32)),
        "margin": jnp.mean(margins_b),
        "rewards/chosen": jnp.mean(chosen_rewards_b),
        "rewards/rejected": jnp.mean(rejected_rewards_b),
    }
