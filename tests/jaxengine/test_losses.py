"""Losses against values worked out by hand with plain ``math`` on tiny inputs (1e-5)."""
import math

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from jaxengine import losses
from jaxengine.losses import LOSSES

TOL = 1e-5


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def log_softmax_at(row: list[float], index: int) -> float:
    return row[index] - math.log(sum(math.exp(v) for v in row))


def close(actual, expected: float) -> None:
    assert abs(float(actual) - expected) <= TOL, (float(actual), expected)


LOGITS = [  # [B=2, T=2, V=3]
    [[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]],
    [[2.0, 2.0, 2.0], [1.5, -0.5, 0.25]],
]
TARGETS = [[1, 2], [0, 1]]


def test_token_log_probs_by_hand():
    got = losses.token_log_probs(jnp.array(LOGITS), jnp.array(TARGETS))
    for b in range(2):
        for t in range(2):
            close(got[b, t], log_softmax_at(LOGITS[b][t], TARGETS[b][t]))


def test_masked_cross_entropy_is_the_mean_over_loss_tokens():
    mask = [[False, True], [True, True]]
    log_probs = losses.token_log_probs(jnp.array(LOGITS), jnp.array(TARGETS))
    loss, metrics = losses.masked_cross_entropy(log_probs, jnp.array(mask))
    picked = [log_softmax_at(LOGITS[b][t], TARGETS[b][t]) for b in range(2) for t in range(2) if mask[b][t]]
    close(loss, -sum(picked) / 3)
    close(metrics["loss_tokens"], 3.0)
    assert LOSSES["cross_entropy"] is losses.masked_cross_entropy


def test_masked_cross_entropy_with_no_loss_tokens_is_zero_not_nan():
    loss, _ = losses.masked_cross_entropy(jnp.zeros((1, 3)), jnp.zeros((1, 3), bool))
    assert float(loss) == 0.0


def test_sequence_log_probs_sums_and_counts_loss_tokens():
    total, count = losses.sequence_log_probs(jnp.array([[-1.0, -2.0, -4.0], [-0.5, -0.25, -8.0]]),
                                             jnp.array([[1, 0, 1], [1, 1, 0]]))
    np.testing.assert_allclose(total, [-5.0, -0.75], atol=TOL)
    np.testing.assert_allclose(count, [2.0, 2.0], atol=TOL)


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 16])
def test_chunked_log_probs_equal_the_plain_ones_and_their_gradients(chunk_size):
    key_h, key_w, key_t = jax.random.split(jax.random.key(0), 3)
    hidden_btd = jax.random.normal(key_h, (2, 7, 5))
    weight_dv = jax.random.normal(key_w, (5, 11))
    targets_bt = jax.random.randint(key_t, (2, 7), 0, 11)
    mask_bt = jnp.array([[1, 1, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1, 1]])

    def plain(weight):
        return losses.masked_cross_entropy(losses.token_log_probs(hidden_btd @ weight, targets_bt), mask_bt)[0]

    def chunked(weight):
        # A budget of 0 bytes: always chunked and recomputed, however small the logits.
        log_probs = losses.chunked_token_log_probs(hidden_btd, targets_bt, lambda h: h @ weight, chunk_size=chunk_size,
                                                   logits_memory_budget=0)
        return losses.masked_cross_entropy(log_probs, mask_bt)[0]

    close(chunked(weight_dv), float(plain(weight_dv)))
    np.testing.assert_allclose(jax.grad(chunked)(weight_dv), jax.grad(plain)(weight_dv), atol=TOL)


def _matmuls_of_gradient(function, *args) -> int:
    """How many dot_generals computing the gradient of ``function`` (w.r.t. all ``args``) runs, each scan
    body's counted once per trip."""
    def count(jaxpr, times=1):
        total = 0
        for equation in jaxpr.eqns:
            if equation.primitive.name == "dot_general":
                total += times
            for sub in jax.extend.core.jaxprs_in_params(equation.params):
                total += count(sub, times * equation.params.get("length", 1))
        return total

    argnums = tuple(range(len(args)))
    return count(jax.make_jaxpr(jax.grad(function, argnums=argnums))(*args).jaxpr)


def test_logits_within_the_budget_are_stored_not_recomputed():
    """The same loss and gradients either way; over the budget the output projection runs once more per chunk."""
    key_h, key_w, key_t = jax.random.split(jax.random.key(1), 3)
    hidden_btd = jax.random.normal(key_h, (2, 8, 5))
    weight_dv = jax.random.normal(key_w, (5, 11))
    targets_bt = jax.random.randint(key_t, (2, 8), 0, 11)
    logits_bytes = 2 * 8 * 11 * 4

    def loss(hidden, weight, budget):
        log_probs = losses.chunked_token_log_probs(hidden, targets_bt, lambda h: h @ weight, chunk_size=4,
                                                   logits_memory_budget=budget)
        return losses.masked_cross_entropy(log_probs, jnp.ones((2, 8), bool))[0]

    def stored(hidden, weight):
        return loss(hidden, weight, logits_bytes)

    def recomputed(hidden, weight):
        return loss(hidden, weight, logits_bytes - 1)

    close(stored(hidden_btd, weight_dv), float(recomputed(hidden_btd, weight_dv)))
    for got, want in zip(jax.grad(stored, argnums=(0, 1))(hidden_btd, weight_dv),
                         jax.grad(recomputed, argnums=(0, 1))(hidden_btd, weight_dv)):
        np.testing.assert_allclose(got, want, atol=TOL)
    # Stored: the forward projection, then the gradients for hidden and weight (3). Chunked: the same
    # per chunk plus the recomputed forward (4), for 2 chunks.
    assert _matmuls_of_gradient(stored, hidden_btd, weight_dv) == 3
    assert _matmuls_of_gradient(recomputed, hidden_btd, weight_dv) == 8
    assert losses.LOGITS_MEMORY_BUDGET == 1 << 30


@pytest.mark.parametrize("capacity", [5, 8, 14])
def test_loss_token_log_probs_equal_the_full_computation_and_its_gradients(capacity):
    key_h, key_w, key_t = jax.random.split(jax.random.key(2), 3)
    hidden_btd = jax.random.normal(key_h, (2, 7, 5))
    weight_dv = jax.random.normal(key_w, (5, 11))
    targets_bt = jax.random.randint(key_t, (2, 7), 0, 11)
    # 5 loss positions, in both rows; the capacity may leave slots over.
    mask_bt = jnp.array([[0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 1, 1]], bool)

    def full(hidden, weight):
        return losses.masked_cross_entropy(losses.token_log_probs(hidden @ weight, targets_bt), mask_bt)[0]

    def gathered(hidden, weight):
        log_probs_n, real_n = losses.loss_token_log_probs(hidden, targets_bt, mask_bt, lambda h: h @ weight,
                                                          capacity=capacity, chunk_size=4, logits_memory_budget=0)
        return losses.masked_cross_entropy(log_probs_n, real_n)[0]

    log_probs_n, real_n = losses.loss_token_log_probs(hidden_btd, targets_bt, mask_bt, lambda h: h @ weight_dv,
                                                      capacity=capacity)
    assert log_probs_n.shape == (capacity,) and int(jnp.sum(real_n)) == 5
    expected = losses.token_log_probs(hidden_btd @ weight_dv, targets_bt)[np.asarray(mask_bt)]
    np.testing.assert_allclose(log_probs_n[:5], expected, atol=TOL)
    close(gathered(hidden_btd, weight_dv), float(full(hidden_btd, weight_dv)))
    for got, want in zip(jax.grad(gathered, argnums=(0, 1))(hidden_btd, weight_dv),
                         jax.grad(full, argnums=(0, 1))(hidden_btd, weight_dv)):
        np.testing.assert_allclose(got, want, atol=TOL)


# Two preference pairs: policy and reference summed log-probs of chosen / rejected completions.
PC, PR, RC, RR = [-3.0, -5.0], [-4.0, -4.5], [-3.5, -4.8], [-3.9, -4.4]


def margins(beta: float) -> list[float]:
    return [beta * ((PC[i] - PR[i]) - (RC[i] - RR[i])) for i in range(2)]


def test_dpo_sigmoid_by_hand_with_label_smoothing():
    beta, smoothing = 0.5, 0.1
    loss, metrics = losses.dpo_sigmoid_loss(*map(jnp.array, (PC, PR, RC, RR)), beta=beta, label_smoothing=smoothing)
    expected = sum(-log_sigmoid(z) * (1 - smoothing) - log_sigmoid(-z) * smoothing for z in margins(beta)) / 2
    close(loss, expected)
    chosen = [beta * (PC[i] - RC[i]) for i in range(2)]  # [0.25, -0.1]
    rejected = [beta * (PR[i] - RR[i]) for i in range(2)]  # [-0.05, -0.05]
    close(metrics["rewards/chosen"], sum(chosen) / 2)
    close(metrics["rewards/rejected"], sum(rejected) / 2)
    close(metrics["rewards/margins"], (chosen[0] - rejected[0] + chosen[1] - rejected[1]) / 2)
    close(metrics["rewards/accuracies"], 0.5)  # first pair: 0.25 > -0.05; second: -0.1 < -0.05
    close(metrics["logps/chosen"], -4.0)
    close(metrics["logps/rejected"], -4.25)


def test_dpo_sigmoid_without_smoothing_is_log_sigmoid():
    loss, _ = losses.dpo_sigmoid_loss(*map(jnp.array, (PC, PR, RC, RR)), beta=0.1)
    close(loss, -sum(log_sigmoid(z) for z in margins(0.1)) / 2)


def test_ipo_by_hand():
    beta = 0.25
    loss, _ = LOSSES["ipo"](*map(jnp.array, (PC, PR, RC, RR)), beta=beta)
    close(loss, sum((m / beta - 1 / (2 * beta)) ** 2 for m in margins(beta)) / 2)


def test_hinge_by_hand():
    beta = 2.0
    loss, metrics = LOSSES["hinge"](*map(jnp.array, (PC, PR, RC, RR)), beta=beta)
    close(loss, sum(max(0.0, 1 - z) for z in margins(beta)) / 2)
    close(metrics["rewards/margins"], sum(margins(beta)) / 2)


def test_simpo_by_hand():
    avg_c, avg_r, beta, gamma = [-0.5, -1.2], [-0.9, -1.0], 2.0, 0.5
    loss, metrics = LOSSES["simpo"](jnp.array(avg_c), jnp.array(avg_r), beta=beta, gamma=gamma)
    close(loss, sum(-log_sigmoid(beta * (avg_c[i] - avg_r[i]) - gamma) for i in range(2)) / 2)
    close(metrics["rewards/chosen"], beta * (-0.5 - 1.2) / 2)
    close(metrics["rewards/accuracies"], 0.5)


def test_orpo_by_hand():
    avg_c, avg_r, beta = [-0.5, -1.2], [-0.9, -1.0], 0.1

    def log_odds(avg: float) -> float:
        p = math.exp(avg)
        return math.log(p / (1 - p))

    ratio_terms = [log_sigmoid(log_odds(avg_c[i]) - log_odds(avg_r[i])) for i in range(2)]
    loss, metrics = LOSSES["orpo"](jnp.array(avg_c), jnp.array(avg_r), beta=beta)
    nll = -(avg_c[0] + avg_c[1]) / 2
    close(loss, nll - beta * sum(ratio_terms) / 2)
    close(metrics["nll_loss"], nll)
    close(metrics["log_odds_ratio"], sum(ratio_terms) / 2)


@pytest.mark.parametrize("certain", ["chosen", "rejected", "both"])
def test_orpo_stays_finite_where_a_completion_is_certain(certain):
    """An average log-prob of 0 (float32's log-softmax gives exactly 0 once a token's logit leads by ~17: a model
    sure of the answer, as after SFT on the same task) made log1p(-exp(0)) = -inf: a certain rejected answer gave
    an infinite loss, a certain chosen one a finite loss with NaN gradients that wrote NaN weights. The odds are
    taken at p <= 1 - 1e-6, where the odds-ratio term is as good as saturated."""
    beta, p_floor = 0.1, 1e-6
    avg_c = [0.0 if certain in ("chosen", "both") else -0.5, -1e-9]
    avg_r = [0.0 if certain in ("rejected", "both") else -2.0, -3.0]

    def log_odds(avg: float) -> float:
        return avg - math.log(max(-math.expm1(avg), p_floor))  # log(p / (1 - p)), 1 - p at least 1e-6

    ratio_terms = [log_sigmoid(log_odds(avg_c[i]) - log_odds(avg_r[i])) for i in range(2)]
    loss_fn = lambda chosen, rejected: LOSSES["orpo"](chosen, rejected, beta=beta)[0]  # noqa: E731
    chosen, rejected = jnp.array(avg_c), jnp.array(avg_r)
    close(loss_fn(chosen, rejected), -sum(avg_c) / 2 - beta * sum(ratio_terms) / 2)
    grad_chosen, grad_rejected = jax.grad(loss_fn, argnums=(0, 1))(chosen, rejected)
    assert np.isfinite(grad_chosen).all() and np.isfinite(grad_rejected).all(), (grad_chosen, grad_rejected)
    # Where 1 - p is held at its floor the odds no longer move with p; the rest of the gradient is by hand.
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    for i in range(2):
        pull = beta * sigmoid(-(log_odds(avg_c[i]) - log_odds(avg_r[i]))) / 2  # d loss / d log odds ratio, negated
        d_c = 1 + (math.exp(avg_c[i]) / -math.expm1(avg_c[i]) if -math.expm1(avg_c[i]) > p_floor else 0.0)
        d_r = 1 + (math.exp(avg_r[i]) / -math.expm1(avg_r[i]) if -math.expm1(avg_r[i]) > p_floor else 0.0)
        close(grad_chosen[i], -0.5 - pull * d_c)
        close(grad_rejected[i], pull * d_r)


def test_bradley_terry_by_hand_with_centering():
    chosen, rejected, coef = [1.5, -0.2, 0.3], [0.5, 0.4, 0.3], 0.01
    loss, metrics = LOSSES["bradley_terry"](jnp.array(chosen), jnp.array(rejected), center_rewards_coefficient=coef)
    expected = -sum(log_sigmoid(c - r) for c, r in zip(chosen, rejected)) / 3
    expected += coef * sum((c + r) ** 2 for c, r in zip(chosen, rejected)) / 3
    close(loss, expected)
    close(metrics["accuracy"], 1 / 3)  # a tie is not a correct ranking
    close(metrics["margin"], (1.0 - 0.6 + 0.0) / 3)


def test_registry_refuses_a_duplicate_name():
    with pytest.raises(ValueError, match="registered twice"):
        losses.register_loss("sigmoid")(lambda: None)
