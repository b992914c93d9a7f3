"""RL math against hand-computed values (1e-5): advantages, clipped surrogate, KL estimators, aggregations,
GSPO's sequence ratio, truncation masking, GAE, the clipped value loss and entropy."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxengine import rl

TOL = dict(rtol=0, atol=1e-5)


def test_group_advantages_use_unbiased_std_and_eps():
    rewards_pg = jnp.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # mean 0.5, unbiased std sqrt(4 * 0.25 / 3)
    np.testing.assert_allclose(rl.group_advantages(rewards_pg),
                               [[expected, -expected, -expected, expected], [0, 0, 0, 0]], **TOL)


def test_group_mean_and_rloo_advantages():
    rewards_pg = jnp.array([[1.0, 2.0, 3.0]])
    np.testing.assert_allclose(rl.group_mean_advantages(rewards_pg), [[-1.0, 0.0, 1.0]], **TOL)
    # 1 - mean(2, 3), 2 - mean(1, 3), 3 - mean(1, 2)
    np.testing.assert_allclose(rl.rloo_advantages(rewards_pg), [[-1.5, 0.0, 1.5]], **TOL)
    assert set(rl.ADVANTAGES) == {"group", "group_mean", "rloo"}


def test_zero_std_fraction():
    assert float(rl.zero_std_fraction(jnp.array([[1.0, 1.0], [0.0, 1.0], [3.0, 3.0], [0.0, 0.5]]))) == 0.5


def test_clipped_surrogate_cases_with_asymmetric_clip():
    log_ratio_bt = jnp.log(jnp.array([[1.5, 1.5, 0.5, 0.5]]))
    advantages = jnp.array([1.0, -1.0, 1.0, -1.0])
    loss, clipped = jax.vmap(lambda lr, a: rl.clipped_surrogate(lr[None], a[None], epsilon=0.2, epsilon_high=0.28))(
        log_ratio_bt[0][:, None], advantages)
    # ratio 1.5, A=+1: clipped to 1.28; A=-1: unclipped -1.5 is the min; ratio 0.5, A=+1: 0.5 is the min;
    # A=-1: clipped 0.8 -> -0.8 is the min.
    np.testing.assert_allclose(loss.ravel(), [-1.28, 1.5, -0.5, 0.8], **TOL)
    assert clipped.ravel().tolist() == [True, False, False, True]


def test_kl_estimators():
    log_probs, reference = jnp.array([[-1.0, -0.5]]), jnp.array([[-2.0, -0.5]])
    np.testing.assert_allclose(rl.kl_k1(log_probs, reference), [[1.0, 0.0]], **TOL)
    np.testing.assert_allclose(rl.kl_k2(log_probs, reference), [[0.5, 0.0]], **TOL)
    # exp(-1) - (-1) - 1 = exp(-1)
    np.testing.assert_allclose(rl.kl_k3(log_probs, reference), [[0.36787944, 0.0]], **TOL)


def test_aggregations():
    loss_bt = jnp.array([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    mask_bt = jnp.array([[True, True, True], [True, False, False]])
    assert float(rl.aggregate("dapo", loss_bt, mask_bt, max_completion_length=4)) == pytest.approx(10 / 4, abs=1e-5)
    assert float(rl.aggregate("grpo", loss_bt, mask_bt, max_completion_length=4)) == pytest.approx((2 + 4) / 2, abs=1e-5)
    assert float(rl.aggregate("gspo", loss_bt, mask_bt, max_completion_length=4)) == pytest.approx(3.0, abs=1e-5)
    assert float(rl.aggregate("dr_grpo", loss_bt, mask_bt, max_completion_length=4)) == pytest.approx(10 / 8, abs=1e-5)
    with pytest.raises(ValueError, match="not one of grpo, dr_grpo, dapo, gspo"):
        rl.aggregate("ppo", loss_bt, mask_bt, max_completion_length=4)


def test_gspo_ratio_is_the_geometric_mean_and_its_gradient_spreads_evenly():
    log_probs = jnp.array([[-1.0, -2.0, -9.0], [-1.3, -1.1, -9.0]])
    old = jnp.array([[-1.5, -1.5, 0.0], [-1.5, -1.5, 0.0]])
    mask = jnp.array([[True, True, False], [True, True, False]])
    log_ratio = rl.sequence_log_ratio(log_probs, old, mask)
    np.testing.assert_allclose(log_ratio[:, :2], [[0.0, 0.0], [0.3, 0.3]], **TOL)  # mean(0.5, -0.5); mean(0.2, 0.4)
    # d/d log_pi_t of mean_seq(exp(s)) = exp(s) / (|y| * B) at real tokens, 0 at masked ones.
    grad = jax.grad(lambda lp: rl.sequence_mean(jnp.exp(rl.sequence_log_ratio(lp, old, mask)), mask))(log_probs)
    np.testing.assert_allclose(grad, [[0.25, 0.25, 0.0], [math.exp(0.3) / 4] * 2 + [0.0]], **TOL)


def test_grpo_loss_with_equal_old_log_probs_has_ratio_one():
    log_probs = jnp.array([[-1.0, -2.0], [-0.5, -0.7]])
    mask = jnp.array([[True, True], [True, False]])
    advantages = jnp.array([2.0, -1.0])
    loss, metrics = rl.grpo_loss(log_probs, jax.lax.stop_gradient(log_probs), None, advantages, mask,
                                 loss_type="grpo", epsilon=0.2, epsilon_high=0.2, beta=0.0, kl_estimator="k3",
                                 max_completion_length=2)
    assert float(loss) == -0.5  # ratio exactly 1: -(2 + -1) / 2
    assert float(metrics["clip_ratio"]) == 0.0 and float(metrics["kl"]) == 0.0


def test_grpo_loss_adds_beta_times_kl_per_token():
    log_probs = jnp.array([[-1.0, -0.5]])
    reference = jnp.array([[-2.0, -0.5]])
    mask = jnp.array([[True, True]])
    loss, metrics = rl.grpo_loss(log_probs, log_probs, reference, jnp.array([1.0]), mask, loss_type="dapo",
                                 epsilon=0.2, epsilon_high=0.2, beta=0.1, kl_estimator="k1", max_completion_length=2)
    # per token: -1 + 0.1 * [1, 0] -> mean (-0.9 - 1) / 2
    assert float(loss) == pytest.approx(-0.95, abs=1e-5)
    assert float(metrics["kl"]) == pytest.approx(0.5, abs=1e-5)


def test_mask_truncated():
    mask = jnp.array([[True, True], [True, False]])
    assert rl.mask_truncated(mask, jnp.array([True, False])).tolist() == [[False, False], [True, False]]


def test_gae_by_hand():
    rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    values = jnp.array([[0.5, 0.6, 0.7], [0.5, 0.6, 99.0]])
    mask = jnp.array([[True, True, True], [True, True, False]])
    advantages, returns = rl.gae(rewards[:1], values[:1], mask[:1], gamma=1.0, lam=0.95)
    # deltas 0.1, 0.1, 0.3; A2 = 0.3, A1 = 0.1 + 0.95 * 0.3, A0 = 0.1 + 0.95 * A1
    np.testing.assert_allclose(advantages, [[0.46575, 0.385, 0.3]], **TOL)
    np.testing.assert_allclose(returns, [[0.96575, 0.985, 1.0]], **TOL)
    advantages, returns = rl.gae(rewards[1:], values[1:], mask[1:], gamma=0.9, lam=0.5)
    # masked last token: V after token 1 is 0; deltas 0.9 * 0.6 - 0.5 = 0.04, 2 - 0.6 = 1.4
    np.testing.assert_allclose(advantages, [[0.04 + 0.45 * 1.4, 1.4, 0.0]], **TOL)
    np.testing.assert_allclose(returns, [[1.17, 2.0, 0.0]], **TOL)


def test_clipped_value_loss():
    values = jnp.array([[1.0, 2.0, 1.0]])
    old_values = jnp.array([[0.5, 2.0, 0.5]])
    returns = jnp.array([[0.0, 2.5, 2.0]])
    loss, clip_fraction = rl.clipped_value_loss(values, old_values, returns, jnp.ones((1, 3), bool), value_clip=0.2)
    # max(1.0, 0.49), max(0.25, 0.25), max(1.0, 1.69) -> 0.5 * 2.94 / 3
    assert float(loss) == pytest.approx(0.49, abs=1e-5)
    assert float(clip_fraction) == pytest.approx(1 / 3, abs=1e-5)


def test_entropy_plain_and_chunked():
    logits = jnp.array([[[0.0, math.log(3.0)]]])  # p = (0.25, 0.75)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    np.testing.assert_allclose(rl.entropy_from_logits(logits), [[expected]], **TOL)
    hidden = jax.random.normal(jax.random.key(0), (2, 7, 4))
    kernel = jax.random.normal(jax.random.key(1), (4, 5))
    full = rl.entropy_from_logits(hidden @ kernel)
    np.testing.assert_allclose(rl.chunked_entropy(hidden, lambda h: h @ kernel, chunk_size=3), full, rtol=0, atol=1e-6)
