"""TRL's DPO loss_types beyond sigmoid/ipo/hinge against their formulas written out here in float64 numpy: values
on small and large margins (where a naive float32 formula overflows), gradients and their signs.

Each ``hand_*`` is the paper's (and TRL's ``DPOTrainer.dpo_loss``) per-pair formula, mean over pairs, computed in
float64 with log sigmoid(x) = -logaddexp(0, -x): independent of the jax code it checks.
"""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxengine import losses
from jaxengine.losses import LOSSES


def log_sigmoid(x):
    return -np.logaddexp(0.0, -np.asarray(x, np.float64))


def sigmoid(x):
    return np.exp(log_sigmoid(x))


def margin(pc, pr, rc, rr):
    return (pc - pr) - (rc - rr)


def hand_robust(pc, pr, rc, rr, *, beta, label_smoothing=0.0):
    eps, z = label_smoothing, beta * margin(pc, pr, rc, rr)
    return np.mean(((1 - eps) * -log_sigmoid(z) - eps * -log_sigmoid(-z)) / (1 - 2 * eps))


def hand_exo_pair(pc, pr, rc, rr, *, beta, label_smoothing=0.0):
    eps, z = label_smoothing or 1e-3, beta * margin(pc, pr, rc, rr)
    return np.mean(sigmoid(z) * (log_sigmoid(z) - math.log(1 - eps)) + sigmoid(-z) * (log_sigmoid(-z) - math.log(eps)))


def hand_nca_pair(pc, pr, rc, rr, *, beta):
    chosen, rejected = beta * (pc - rc), beta * (pr - rr)
    return np.mean(-log_sigmoid(chosen) - 0.5 * log_sigmoid(-chosen) - 0.5 * log_sigmoid(-rejected))


def hand_sppo_hard(pc, pr, rc, rr, *, beta):
    return np.mean((pc - rc - 0.5 / beta) ** 2 + (pr - rr + 0.5 / beta) ** 2)


def hand_apo_zero(pc, pr, rc, rr, *, beta):
    return np.mean(1 - sigmoid(beta * (pc - rc)) + sigmoid(beta * (pr - rr)))


def hand_apo_down(pc, pr, rc, rr, *, beta):
    chosen, rejected = beta * (pc - rc), beta * (pr - rr)
    return np.mean(sigmoid(chosen) + 1 - sigmoid(chosen - rejected))


def hand_discopop(pc, pr, rc, rr, *, beta, tau):
    z = beta * margin(pc, pr, rc, rr)
    mix = sigmoid(z / tau)  # float64: exp(-z) stays finite for every margin below
    return np.mean(-log_sigmoid(z) * (1 - mix) + np.exp(-z) * mix)


def hand_kto_pair(pc, pr, rc, rr, *, beta, reference_points=None):
    """``reference_points`` (chosen, rejected) replaces the batch's own: held fixed, as the loss holds them in the
    backward pass."""
    chosen, rejected = pc - rc, pr - rr
    chosen_point, rejected_point = reference_points or (max(np.mean(chosen), 0.0), max(np.mean(rejected), 0.0))
    return np.mean(np.concatenate([1 - sigmoid(beta * (chosen - rejected_point)),
                                   1 - sigmoid(beta * (chosen_point - rejected))]))


def hand_aot(pc, pr, rc, rr, *, beta, label_smoothing=0.0):
    z = beta * (np.sort(pc - pr) - np.sort(rc - rr))
    return np.mean(-log_sigmoid(z) * (1 - label_smoothing) - log_sigmoid(-z) * label_smoothing)


def hand_aot_pair(pc, pr, rc, rr, *, beta, label_smoothing=0.0):
    z = beta * (np.sort(pc - rc) - np.sort(pr - rr))
    return np.mean(-log_sigmoid(z) * (1 - label_smoothing) - log_sigmoid(-z) * label_smoothing)


HAND = {"robust": hand_robust, "exo_pair": hand_exo_pair, "nca_pair": hand_nca_pair, "sppo_hard": hand_sppo_hard,
        "apo_zero": hand_apo_zero, "apo_down": hand_apo_down, "discopop": hand_discopop,
        "kto_pair": hand_kto_pair, "aot": hand_aot, "aot_pair": hand_aot_pair}
CASES = [  # (loss, its settings)
    ("robust", {"beta": 0.5}), ("robust", {"beta": 0.5, "label_smoothing": 0.2}),
    ("exo_pair", {"beta": 0.5}), ("exo_pair", {"beta": 0.5, "label_smoothing": 0.1}),
    ("nca_pair", {"beta": 0.5}), ("sppo_hard", {"beta": 0.5}), ("apo_zero", {"beta": 0.5}),
    ("apo_down", {"beta": 0.5}), ("discopop", {"beta": 0.5, "tau": 0.05}), ("discopop", {"beta": 0.5, "tau": 1.0}),
    ("kto_pair", {"beta": 0.5}), ("aot", {"beta": 0.5}), ("aot", {"beta": 0.5, "label_smoothing": 0.2}),
    ("aot_pair", {"beta": 0.5}), ("aot_pair", {"beta": 0.5, "label_smoothing": 0.2}),
]
CASE_IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in settings.items())}" for name, settings in CASES]

# Three pairs of summed log-probs (policy chosen, policy rejected, reference chosen, reference rejected): margins
# 1.5, -1.25 and 0, chosen rewards of either sign. Exact in float32. Sorting reorders them (aot, aot_pair: the
# policy's margins 1, -0.5, -1.5 against the reference's -0.5, 0.75, -1.5; chosen log-ratios 0.5, -0.25, -0.5 against
# rejected -1, 1, -0.5), no ties; kto_pair's reference points are both 0 (means -1/12 and -1/6, clamped: the tests
# of kto_pair below have points above 0).
SMALL = [np.array(values, np.float64) for values in
         ([-3.0, -5.0, -7.5], [-4.0, -4.5, -6.0], [-3.5, -4.75, -7.0], [-3.0, -5.5, -5.5])]
# Margins of 300, -300 and 250 (the policy's completions far apart where the reference had them level): at beta 0.5
# beta * margin is 150, -150 and 125, where float32's sigmoid(-|z|) is 0 and exp(|z|) is inf.
LARGE = [np.array(values, np.float64) for values in
         ([-10.0, -310.0, -10.0], [-310.0, -10.0, -260.0], [-160.0, -160.0, -10.0], [-160.0, -160.0, -10.0])]


def run(name, settings, inputs):
    return LOSSES[name](*(jnp.asarray(array, jnp.float32) for array in inputs), **settings)


@pytest.mark.parametrize(("name", "settings"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("inputs", [SMALL, LARGE], ids=["small-margins", "large-margins"])
def test_each_variant_is_its_formula(name, settings, inputs):
    loss, metrics = run(name, settings, inputs)
    expected = HAND[name](*inputs, **settings)
    assert np.isfinite(expected)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5, atol=1e-5)
    pc, pr, rc, rr = inputs
    beta = settings["beta"]  # every variant reports TRL's implicit rewards beta * (policy - reference)
    np.testing.assert_allclose(float(metrics["rewards/chosen"]), np.mean(beta * (pc - rc)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(metrics["rewards/rejected"]), np.mean(beta * (pr - rr)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(metrics["rewards/accuracies"]), np.mean(pc - rc > pr - rr), atol=1e-6)
    np.testing.assert_allclose(float(metrics["logps/chosen"]), np.mean(pc), rtol=1e-6)


@pytest.mark.parametrize(("name", "settings"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("inputs", [SMALL, LARGE], ids=["small-margins", "large-margins"])
def test_each_variants_gradient_is_its_formulas(name, settings, inputs):
    """d loss / d policy log-probs against central differences of the float64 formula (finite at large margins:
    no inf * 0 in the backward pass either)."""
    grads = jax.grad(lambda pc, pr: run(name, settings, (pc, pr, *inputs[2:]))[0], argnums=(0, 1))(
        jnp.asarray(inputs[0], jnp.float32), jnp.asarray(inputs[1], jnp.float32))
    step = 1e-5
    hand = HAND[name]
    if name == "kto_pair":  # its reference points are constants of the backward pass: differentiate with them fixed
        chosen, rejected = inputs[0] - inputs[2], inputs[1] - inputs[3]
        points = (max(np.mean(chosen), 0.0), max(np.mean(rejected), 0.0))
        hand = functools.partial(hand_kto_pair, reference_points=points)
    for which, grad in enumerate(grads):
        assert np.isfinite(grad).all(), grad
        expected = []
        for row in range(3):
            up, down = [array.copy() for array in inputs], [array.copy() for array in inputs]
            up[which][row] += step
            down[which][row] -= step
            expected.append((hand(*up, **settings) - hand(*down, **settings)) / (2 * step))
        np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-4, atol=1e-5)


SIGNS = [  # (loss, settings, one pair (pc, pr, rc, rr), sign of d loss / d chosen, of d loss / d rejected)
    # robust: always raise the chosen, lower the rejected, label noise or not.
    ("robust", {"beta": 1.0, "label_smoothing": 0.2}, (-1.0, -4.0, -2.0, -2.0), -1, 1),
    ("robust", {"beta": 1.0, "label_smoothing": 0.2}, (-4.0, -1.0, -2.0, -2.0), -1, 1),
    # exo_pair: towards sigmoid(z) = 1 - eps (z = log 999 = 6.9), then back: at z = 10 it lowers the chosen.
    ("exo_pair", {"beta": 1.0}, (-1.0, -4.0, -2.0, -2.0), -1, 1),
    ("exo_pair", {"beta": 1.0}, (-1.0, -11.0, -2.0, -2.0), 1, -1),
    # nca_pair: the chosen reward up to log 2, no further; the rejected reward always down.
    ("nca_pair", {"beta": 1.0}, (-1.5, -1.0, -2.0, -2.0), -1, 1),
    ("nca_pair", {"beta": 1.0}, (-1.0, -9.0, -2.0, -2.0), 1, 1),
    # sppo_hard: each log-ratio to +-1 / (2 beta) = +-1 from either side.
    ("sppo_hard", {"beta": 0.5}, (-2.0, -2.0, -2.0, -2.0), -1, 1),
    ("sppo_hard", {"beta": 0.5}, (-0.5, -4.0, -2.0, -2.0), 1, -1),
    # apo_zero: chosen up, rejected down, always.
    ("apo_zero", {"beta": 1.0}, (-1.0, -4.0, -2.0, -2.0), -1, 1),
    ("apo_zero", {"beta": 1.0}, (-4.0, -1.0, -2.0, -2.0), -1, 1),
    # apo_down: the rejected always down; the chosen down too while it leads the rejected by enough...
    ("apo_down", {"beta": 1.0}, (-2.0, -4.0, -2.0, -2.0), 1, 1),
    # ... and up where the rejected leads it: sigmoid'(r_c) < sigmoid'(r_r - r_c) (2: 0.105, 1: 0.197).
    ("apo_down", {"beta": 1.0}, (0.0, 1.0, -2.0, -2.0), -1, 1),
    # discopop: chosen up either side of zero margin, but not near it: its blend is not monotonic there.
    ("discopop", {"beta": 1.0, "tau": 0.05}, (-1.0, -2.0, -2.0, -2.0), -1, 1),
    ("discopop", {"beta": 1.0, "tau": 0.05}, (-3.0, -2.0, -2.0, -2.0), -1, 1),
    ("discopop", {"beta": 1.0, "tau": 0.05}, (-2.0, -2.0, -2.0, -2.0), 1, -1),
    # kto_pair, aot, aot_pair: chosen up, rejected down, whichever leads (a pair alone is its own batch).
    ("kto_pair", {"beta": 1.0}, (-1.0, -4.0, -2.0, -2.0), -1, 1),
    ("kto_pair", {"beta": 1.0}, (-4.0, -1.0, -2.0, -2.0), -1, 1),
    ("aot", {"beta": 1.0, "label_smoothing": 0.2}, (-4.0, -1.0, -2.0, -2.0), -1, 1),
    ("aot_pair", {"beta": 1.0}, (-4.0, -1.0, -2.0, -2.0), -1, 1),
    # ... except with label smoothing past the margin where the loss is smallest (z = log 4 at eps 0.2): back down.
    ("aot", {"beta": 1.0, "label_smoothing": 0.2}, (0.0, -4.0, -2.0, -2.0), 1, -1),
    ("aot_pair", {"beta": 1.0, "label_smoothing": 0.2}, (0.0, -4.0, -2.0, -2.0), 1, -1),
]


@pytest.mark.parametrize(("name", "settings", "pair", "chosen_sign", "rejected_sign"), SIGNS)
def test_raising_the_chosen_log_prob_moves_the_loss_as_the_formula_says(name, settings, pair, chosen_sign,
                                                                         rejected_sign):
    pc, pr, rc, rr = (jnp.array([value], jnp.float32) for value in pair)
    grad_chosen, grad_rejected = jax.grad(lambda c, r: LOSSES[name](c, r, rc, rr, **settings)[0],
                                          argnums=(0, 1))(pc, pr)
    assert np.sign(float(grad_chosen[0])) == chosen_sign and np.sign(float(grad_rejected[0])) == rejected_sign, (
        float(grad_chosen[0]), float(grad_rejected[0]))


def test_robust_without_label_noise_is_dpo():
    inputs = [jnp.asarray(array, jnp.float32) for array in SMALL]
    robust, _ = LOSSES["robust"](*inputs, beta=0.5)
    sigmoid_loss, _ = LOSSES["sigmoid"](*inputs, beta=0.5)
    np.testing.assert_allclose(float(robust), float(sigmoid_loss), rtol=1e-6)


def test_the_naive_float32_formulas_break_where_these_do_not():
    """The inputs of LARGE are ones where the formulas as TRL writes them overflow in float32: discopop's exp(-z) *
    sigmoid(z / tau) is inf * 0 and EXO's sigmoid(-z) * log(sigmoid(-z)) is 0 * -inf."""
    z = jnp.asarray(0.5 * margin(*LARGE), jnp.float32)
    naive_discopop = jnp.exp(-z) * jax.nn.sigmoid(z / 0.05)
    naive_exo = jax.nn.sigmoid(-z) * jnp.log(jax.nn.sigmoid(-z))
    assert np.isnan(naive_discopop).any() and np.isnan(naive_exo).any()
    for name, settings in (("discopop", {"beta": 0.5, "tau": 0.05}), ("exo_pair", {"beta": 0.5})):
        assert np.isfinite(float(run(name, settings, LARGE)[0]))


def test_exo_pair_reads_zero_label_smoothing_as_trls_epsilon():
    inputs = [jnp.asarray(array, jnp.float32) for array in SMALL]
    default, _ = LOSSES["exo_pair"](*inputs, beta=0.5)
    explicit, _ = LOSSES["exo_pair"](*inputs, beta=0.5, label_smoothing=losses.EXO_DEFAULT_EPSILON)
    assert float(default) == float(explicit) and losses.EXO_DEFAULT_EPSILON == 1e-3


def test_every_spec_loss_is_registered():
    import typing

    from jaxengine.spec import DpoLoss

    assert set(typing.get_args(DpoLoss)) <= set(LOSSES)


FOURTH = (1.0, -3.0, -2.0, -1.0)


def whole_and_halves(name, settings):
    """A 4-pair batch's loss, and the mean of the losses of its two 2-pair halves (the same pairs as two
    micro-batches under grad_accum 2)."""
    # A fourth pair (chosen log-ratio 3, rejected -2; margins: policy's 4, reference's -1), exact in float32.
    inputs = [jnp.asarray(np.concatenate([array, [value]]), jnp.float32) for array, value in zip(SMALL, FOURTH)]
    whole, _ = LOSSES[name](*inputs, **settings)
    halves = [LOSSES[name](*(array[rows] for array in inputs), **settings)[0] for rows in (slice(0, 2), slice(2, 4))]
    return float(whole), float(np.mean(halves))


@pytest.mark.parametrize("name", ["kto_pair", "aot", "aot_pair"])
def test_batch_statistic_losses_depend_on_the_micro_batch(name):
    """kto_pair's reference points and AOT's sorting are statistics of the batch the loss sees: the same pairs in
    two micro-batches give another loss than in one, where a per-pair loss (sigmoid) gives the same."""
    whole, halves = whole_and_halves(name, {"beta": 0.5})
    assert abs(whole - halves) > 1e-3, (whole, halves)
    whole, halves = whole_and_halves("sigmoid", {"beta": 0.5})
    assert whole == pytest.approx(halves, rel=1e-6)


def test_kto_pair_measures_each_side_against_the_other_sides_clamped_mean():
    """One pair whose chosen log-ratio is 2 and rejected 3: the chosen term is measured against the rejected
    mean 3, the rejected term against the chosen mean 2. Where both means are negative the points are 0."""
    one = [jnp.array([value], jnp.float32) for value in (0.0, 1.0, -2.0, -2.0)]
    loss, _ = LOSSES["kto_pair"](*one, beta=1.0)
    assert float(loss) == pytest.approx(0.5 * ((1 - sigmoid(2.0 - 3.0)) + (1 - sigmoid(2.0 - 3.0))), abs=1e-6)
    below = [jnp.array([value], jnp.float32) for value in (-3.0, -5.0, -2.0, -2.0)]  # log-ratios -1 and -3
    loss, _ = LOSSES["kto_pair"](*below, beta=1.0)
    assert float(loss) == pytest.approx(0.5 * ((1 - sigmoid(-1.0)) + (1 - sigmoid(3.0))), abs=1e-6)


def test_kto_pairs_reference_points_carry_no_gradient():
    """With the rejected log-ratios above zero, their mean is the chosen term's reference point: raising a rejected
    log-prob moves the loss only through its own term (beta sigmoid'(beta (z_c - b)) / (2B)), not through that
    point too, as the KTO authors' code (HALOs) and TRL's KTOTrainer hold it."""
    pc, pr, rc, rr = (jnp.array(values, jnp.float32) for values in ([-1.0, -2.0], [-1.0, -1.5], [-2.0, -2.0],
                                                                        [-2.0, -2.0]))
    grad_rejected = jax.grad(lambda r: LOSSES["kto_pair"](pc, r, rc, rr, beta=1.0)[0])(pr)
    chosen_point, rejected = max(np.mean([1.0, 0.0]), 0.0), np.array([1.0, 0.5])
    # d/db of (1 - σ(z_c - b)) / 4, z_c held: σ'(z_c - b) / 4
    own = sigmoid(chosen_point - rejected) * (1 - sigmoid(chosen_point - rejected)) / 4
    np.testing.assert_allclose(np.asarray(grad_rejected), own, rtol=1e-5)


# bco_pair against its formula in float64: three batches in a row (3 pairs, 1, 2), each loss reading the running mean
# of the implicit rewards after that batch's own update (TRL's order), each batch's mean counting once.
BCO_BATCHES = [SMALL, [array[2:] for array in LARGE], [array[1:] for array in SMALL]]


def hand_batch_mean_reward(pc, pr, rc, rr, *, beta):
    return np.mean(np.concatenate([beta * (pc - rc), beta * (pr - rr)]))


def hand_bco_pair(pc, pr, rc, rr, *, beta, delta):
    chosen, rejected = beta * (pc - rc), beta * (pr - rr)
    return np.mean(-log_sigmoid(chosen - delta) - log_sigmoid(-(rejected - delta)))


def test_bco_pairs_running_mean_and_loss_over_batches_are_the_formula():
    running = losses.running_mean_start()
    assert float(running["mean"]) == 0.0 and float(running["count"]) == 0.0
    batch_means = []
    for count, batch in enumerate(BCO_BATCHES, start=1):
        loss, running, metrics = LOSSES["bco_pair"](*(jnp.asarray(a, jnp.float32) for a in batch), running, beta=0.5)
        batch_means.append(hand_batch_mean_reward(*batch, beta=0.5))
        delta = np.mean(batch_means)  # every batch's mean counts once, its own included
        assert float(running["count"]) == count
        np.testing.assert_allclose(float(running["mean"]), delta, rtol=1e-6, atol=1e-6)
        assert float(metrics["delta"]) == float(running["mean"])
        np.testing.assert_allclose(float(loss), hand_bco_pair(*batch, beta=0.5, delta=delta), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(float(metrics["rewards/margins"]),
                                   np.mean(0.5 * (batch[0] - batch[2]) - 0.5 * (batch[1] - batch[3])), atol=1e-5)
    # The batch means by hand: 0.5 * mean(0.5, -0.25, -0.5, -1, 1, -0.5) = -1/16, then 0.5 * mean(0, -250) = -62.5,
    # then 0.5 * mean(-0.25, -0.5, 1, -0.5) = -1/32.
    np.testing.assert_allclose(batch_means, [-1 / 16, -62.5, -1 / 32], rtol=1e-12)


def test_the_running_mean_update_weights_each_batch_by_its_count():
    """Chan et al.'s update as TRL's RunningMoments: mean + (batch mean - mean) * n / (count + n); counts by hand."""
    running = losses.running_mean_start()
    for values_mean, values_count, mean, count in ((2.0, 3.0, 2.0, 3.0),  # the first batch sets the mean
                                                   (-1.0, 1.0, 1.25, 4.0),  # (2 * 3 - 1) / 4
                                                   (0.5, 4.0, 0.875, 8.0)):  # (1.25 * 4 + 0.5 * 4) / 8
        running = losses.running_mean_update(running, jnp.float32(values_mean), values_count)
        assert (float(running["mean"]), float(running["count"])) == (mean, count)


def test_bco_pairs_gradient_holds_delta_fixed():
    """jax's gradient is the finite-difference gradient of the float64 formula with delta held at its value: raising
    a log-prob moves the batch mean, and so delta, but no gradient flows through it (TRL detaches the mean), nor
    into the running state."""
    inputs = [np.asarray(array, np.float64) for array in SMALL]
    start = {"mean": jnp.float32(0.25), "count": jnp.float32(3.0)}

    def jax_loss(chosen, rejected, running):
        return LOSSES["bco_pair"](chosen, rejected, *(jnp.asarray(a, jnp.float32) for a in inputs[2:]), running,
                                  beta=0.5)[0]

    grad_chosen, grad_rejected, grad_running = jax.grad(jax_loss, argnums=(0, 1, 2))(
        *(jnp.asarray(a, jnp.float32) for a in inputs[:2]), start)
    assert float(grad_running["mean"]) == 0.0 and float(grad_running["count"]) == 0.0

    def delta_of(pc, pr):
        return (0.25 * 3 + hand_batch_mean_reward(pc, pr, *inputs[2:], beta=0.5)) / 4

    held = delta_of(*inputs[:2])

    def finite_differences(which, moving):
        grads, step = [], 1e-6
        for row in range(3):
            up, down = [list(inputs[:2]) for _ in range(2)]
            up[which], down[which] = inputs[which].copy(), inputs[which].copy()
            up[which][row] += step
            down[which][row] -= step
            values = [hand_bco_pair(*side, *inputs[2:], beta=0.5, delta=delta_of(*side) if moving else held)
                      for side in (up, down)]
            grads.append((values[0] - values[1]) / (2 * step))
        return np.array(grads)

    for which, grad in ((0, grad_chosen), (1, grad_rejected)):
        np.testing.assert_allclose(np.asarray(grad), finite_differences(which, moving=False), atol=1e-6)
        assert np.abs(np.asarray(grad) - finite_differences(which, moving=True)).max() > 1e-3
