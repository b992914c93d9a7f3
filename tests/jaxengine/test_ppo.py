"""task: ppo: the PPO objective by hand, the value head, the spec, and end to end on a micro demo build
(reward rises, rollouts logged, the reference pass only when kl_coef > 0, rewards from a reward run)."""
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxengine import grpo, ppo, rl
from jaxengine.job import JobError, build_job_model, run_job
from jaxengine.reward_scoring import score_texts
from jaxengine.spec import SpecError, dump_spec, parse_spec, parse_spec_text
from jaxengine.tasks import HeadParam
from tests.jaxengine.conftest import LONG_PROMPT, read_jsonl, write_prompts

TRL_PPO_METRICS = {"objective/kl", "objective/entropy", "objective/non_score_reward", "objective/rlhf_reward",
                   "objective/scores", "policy/clipfrac", "policy/entropy", "policy/approxkl", "val/clipfrac",
                   "val/ratio", "val/mean", "loss/policy", "loss/value", "reward", "reward_std",
                   "rewards/contains/mean", "rewards/contains/std", "completions/mean_length",
                   "completions/min_length", "completions/max_length", "completions/clipped_ratio", "time/rollout",
                   "time/logprobs", "time/update", "loss", "grad_norm", "learning_rate"}


# --------------------------------------------------------------------------------------------
# The maths, by hand


def test_ppo_loss_by_hand():
    mask = jnp.array([[True, True, False]])
    log_probs, old_log_probs = jnp.array([[-1.0, -2.0, 0.0]]), jnp.array([[-1.1, -1.5, 0.0]])
    values, old_values, returns = jnp.array([[0.5, 1.0, 7.0]]), jnp.array([[0.0, 0.9, 0.0]]), jnp.array([[1.0, 0.0, 0.0]])
    advantages, entropy = jnp.array([[1.0, -2.0, 5.0]]), jnp.array([[1.5, 0.5, 9.0]])
    loss, metrics = rl.ppo_loss(log_probs, old_log_probs, values, old_values, advantages, returns, entropy, mask,
                                epsilon=0.2, epsilon_high=0.2, value_clip=0.2, vf_coef=0.5, entropy_coef=0.1)
    # Token 0: ratio e^0.1 inside the clip, loss -e^0.1. Token 1: ratio e^-0.5 = 0.607 clipped to 0.8, and
    # with A = -2 the clipped term is the smaller: loss 1.6. Token 2 is masked.
    policy = (-math.exp(0.1) + 1.6) / 2
    # Token 0: V 0.5 is clipped to 0 + 0.2, (0.2 - 1)^2 = 0.64 > 0.25; token 1: V 1.0 = clip, (1 - 0)^2 = 1.
    value = 0.5 * (0.64 + 1.0) / 2
    np.testing.assert_allclose(float(metrics["loss/policy"]), policy, atol=1e-6)
    np.testing.assert_allclose(float(metrics["loss/value"]), value, atol=1e-6)
    np.testing.assert_allclose(float(metrics["policy/entropy"]), 1.0, atol=1e-6)
    np.testing.assert_allclose(float(loss), policy + 0.5 * value - 0.1 * 1.0, atol=1e-6)
    assert float(metrics["policy/clipfrac"]) == 0.5 and float(metrics["val/clipfrac"]) == 0.5
    np.testing.assert_allclose(float(metrics["policy/approxkl"]), 0.5 * (0.1**2 + 0.5**2) / 2, atol=1e-6)
    np.testing.assert_allclose(float(metrics["val/ratio"]), (math.exp(0.1) + math.exp(-0.5)) / 2, atol=1e-6)


def test_ppo_loss_clips_ratios_above_one_at_epsilon_high_by_hand():
    """ppo.epsilon_high: the upper clip 1 + epsilon_high, apart from the lower 1 - epsilon (DAPO's clip-higher)."""
    mask = jnp.array([[True, True, True]])
    log_probs, old_log_probs = jnp.array([[0.3, -0.5, 0.4]]), jnp.zeros((1, 3))
    advantages, zeros = jnp.array([[1.0, -2.0, -1.0]]), jnp.zeros((1, 3))

    def policy_loss(epsilon_high):
        _, metrics = rl.ppo_loss(log_probs, old_log_probs, zeros, zeros, advantages, zeros, zeros, mask, epsilon=0.2,
                                 epsilon_high=epsilon_high, value_clip=0.2, vf_coef=0.5, entropy_coef=0.0)
        return float(metrics["loss/policy"]), float(metrics["policy/clipfrac"])

    # Token 0: ratio e^0.3 = 1.3499 with A = 1, clipped to 1 + epsilon_high: loss -1.28 (symmetric: -1.2).
    # Token 1: ratio e^-0.5 = 0.6065 with A = -2, clipped to 1 - epsilon = 0.8: loss 1.6 either way.
    # Token 2: ratio e^0.4 = 1.4918 with A = -1: the unclipped term is the smaller, loss e^0.4, never clipped.
    loss, clipfrac = policy_loss(0.28)
    np.testing.assert_allclose(loss, (-1.28 + 1.6 + math.exp(0.4)) / 3, atol=1e-5)
    np.testing.assert_allclose(clipfrac, 2 / 3, atol=1e-6)
    loss, clipfrac = policy_loss(0.2)
    np.testing.assert_allclose(loss, (-1.2 + 1.6 + math.exp(0.4)) / 3, atol=1e-5)
    # Above the ratio, token 0 is not clipped: its loss is -e^0.3.
    loss, clipfrac = policy_loss(0.5)
    np.testing.assert_allclose(loss, (-math.exp(0.3) + 1.6 + math.exp(0.4)) / 3, atol=1e-5)
    np.testing.assert_allclose(clipfrac, 1 / 3, atol=1e-6)


def test_token_rewards_gae_and_whitening_by_hand():
    mask = jnp.array([[False, True, True, False], [False, True, True, True]])
    log_probs = jnp.array([[0.0, -1.0, -2.0, 0.0], [0.0, -1.0, -1.0, -1.0]])
    reference = jnp.array([[0.0, -1.5, -1.0, 0.0], [0.0, -1.0, -1.0, -2.0]])
    scores = jnp.array([1.0, 2.0])
    rewards, kl = rl.ppo_token_rewards(scores, log_probs, reference, mask, kl_coef=0.1)
    # KL per token log pi - log pi_ref; reward -0.1 * KL, plus the score at each row's last completion token.
    np.testing.assert_allclose(kl, [[0, 0.5, -1.0, 0], [0, 0, 0, 1.0]], atol=1e-7)
    np.testing.assert_allclose(rewards, [[0, -0.05, 1.1, 0], [0, 0, 0, 1.9]], atol=1e-6)
    out = ppo.advantages_and_returns(scores, log_probs, reference, jnp.zeros((2, 4)), mask, kl_coef=0.1, gamma=1.0,
                                     lam=0.5)
    # Values 0: A_t = r_t + 0.5 A_{t+1}; returns = advantages (before whitening).
    raw = np.array([[0, -0.05 + 0.5 * 1.1, 1.1, 0], [0, 0.5 * 0.5 * 1.9, 0.5 * 1.9, 1.9]])
    np.testing.assert_allclose(out["returns"], raw, atol=1e-6)
    kept = raw[np.asarray(mask)]  # 0.5, 1.1, 0.475, 0.95, 1.9
    mean = (0.5 + 1.1 + 0.475 + 0.95 + 1.9) / 5
    variance = sum((x - mean) ** 2 for x in (0.5, 1.1, 0.475, 0.95, 1.9)) / 4  # unbiased, as TRL
    np.testing.assert_allclose(np.asarray(out["advantages"])[np.asarray(mask)], (kept - mean) / math.sqrt(variance),
                               atol=1e-5)
    assert np.all(np.asarray(out["advantages"])[~np.asarray(mask)] == 0.0)


def test_last_token_mask_and_a_row_without_completion_tokens():
    mask = jnp.array([[False, True, True, False], [False, False, False, False]])
    assert rl.last_token_mask(mask).astype(int).tolist() == [[0, 0, 1, 0], [0, 0, 0, 0]]
    rewards, _ = rl.ppo_token_rewards(jnp.array([3.0, 4.0]), jnp.zeros((2, 4)), jnp.zeros((2, 4)), mask, kl_coef=0.5)
    assert rewards.tolist() == [[0, 0, 3.0, 0], [0, 0, 0, 0]]


# --------------------------------------------------------------------------------------------
# Value head


def test_value_head_shapes_and_training_under_lora(tiny_hf_model_dir):
    from jaxengine.checkpoint.hf import load_hf_model
    from jaxengine.peft.lora import LoraParam, apply_lora

    backbone, config = load_hf_model(tiny_hf_model_dir("llama"))
    model = ppo.PolicyWithValueHead(backbone)
    ids = jnp.array([[1, 5, 7, 2], [3, 4, 0, 0]])
    hidden, _ = model.hidden_states(ids, jnp.broadcast_to(jnp.arange(4), (2, 4)))
    assert model.values(hidden).shape == (2, 4) and model.values(hidden).dtype == jnp.float32
    assert np.all(np.asarray(model.values(hidden)) == 0.0)  # the head starts at zero
    model.value_weight[...] = jnp.ones((config.hidden_size, 1))
    model.value_bias[...] = jnp.array([0.5])
    np.testing.assert_allclose(model.values(hidden), np.asarray(hidden).sum(-1) + 0.5, rtol=1e-5, atol=1e-5)
    apply_lora(model.backbone, targets=("q_proj",), rank=2, alpha=4.0, seed=0)
    trained = nnx.state(model, nnx.Any(LoraParam, HeadParam))
    names = {".".join(map(str, path)) for path, _ in nnx.to_flat_state(trained)}
    assert {"value_weight", "value_bias"} <= names and all(n.startswith(("value_", "backbone.")) for n in names)


# --------------------------------------------------------------------------------------------
# Spec


def ppo_mapping(demo_dir, run_dir, *, ppo_section=None, **overrides):
    spec = {
        "task": "ppo", "model": str(demo_dir / "model"), "output_dir": str(run_dir),
        "data": {"train": str(demo_dir / "data/prompts.jsonl"), "max_seq_len": 64},
        "optim": {"learning_rate": 2e-2, "schedule": "constant", "max_grad_norm": None},
        "train": {"max_steps": 12, "batch_size": 16, "seed": 1},
        # The micro model is near uniform: about a quarter of 4-token completions contain an "e".
        "ppo": {"max_new_tokens": 4, "kl_coef": 0.0, "lam": 1.0, "vf_coef": 0.1,
                "rewards": [{"name": "contains", "args": {"keywords": ["e"]}}]} if ppo_section is None else ppo_section,
    }
    spec.update(overrides)
    return spec


def test_spec_round_trip_and_defaults(tmp_path):
    spec = parse_spec(ppo_mapping(tmp_path, tmp_path / "run", ppo_section={"reward_model": "runs/my-reward-run"}))
    assert (spec.ppo.gamma, spec.ppo.lam, spec.ppo.value_clip, spec.ppo.vf_coef, spec.ppo.entropy_coef,
            spec.ppo.kl_coef) == (1.0, 0.95, 0.2, 0.5, 0.0, 0.04)
    assert spec.data.train.endswith("prompts.jsonl") and spec.grpo is None
    assert parse_spec_text(dump_spec(spec)) == spec
    with_rewards = parse_spec(ppo_mapping(tmp_path, tmp_path / "run"))
    assert parse_spec_text(dump_spec(with_rewards)) == with_rewards and with_rewards.ppo.reward_model is None


def test_epsilon_high_defaults_to_epsilon_and_is_refused_below_it(tmp_path):
    def ppo_spec(**clip):
        return parse_spec(ppo_mapping(tmp_path, tmp_path / "run", ppo_section={"reward_model": "runs/r", **clip}))

    assert ppo_spec().ppo.epsilon_high is None and ppo_spec().ppo.upper_clip == 0.2
    assert ppo_spec(epsilon=0.1).ppo.upper_clip == 0.1  # null follows epsilon: the symmetric clip
    assert ppo_spec(epsilon=0.1, epsilon_high=0.28).ppo.upper_clip == 0.28
    assert parse_spec_text(dump_spec(ppo_spec(epsilon_high=0.28))).ppo.epsilon_high == 0.28
    with pytest.raises(SpecError) as refused:
        ppo_spec(epsilon=0.2, epsilon_high=0.1)
    assert refused.value.problems == [
        "ppo.epsilon_high: 0.1 is below ppo.epsilon 0.2; give epsilon_high at least epsilon (equal, or null: the "
        "symmetric PPO clip; larger: DAPO's clip-higher), or lower epsilon"]


def test_checkpoints_rank_by_the_first_eval_metric_else_the_reward(tmp_path):
    from jaxengine.job import best_metric_for

    def best(section):
        data = {"train": str(tmp_path / "data/prompts.jsonl"), "eval": str(tmp_path / "data/eval.jsonl")}
        return best_metric_for(parse_spec(ppo_mapping(tmp_path, tmp_path / "run", ppo_section=section, data=data)))

    assert best({"reward_model": "runs/r"}) == ("eval/reward_model", True)
    assert best({"rewards": [{"name": "contains", "args": {"keywords": ["e"]}}]}) == ("eval/contains", True)
    assert best({"reward_model": "runs/r", "eval_metrics": [{"name": "exact_match"}]}) == ("eval/exact_match", True)


@pytest.mark.parametrize("section, message", [
    ({}, "ppo.reward_model: give exactly one of reward_model and rewards (neither given): choose a reward model "
         "(a task: reward run) or add a reward function such as exact_match"),
    ({"reward_model": "runs/r", "rewards": [{"name": "exact_match"}]},
     "ppo.reward_model: give exactly one of reward_model and rewards (both given): remove the reward functions, "
     "or choose no reward model"),
    ({"reward_model": "  "}, "ppo.reward_model: empty"),
    ({"reward_model": "runs/r", "lam": 1.5}, "ppo.lam: 1.5 is too large: give a number from 0 to 1"),
    ({"reward_model": "runs/r", "kl_coef": -1}, "ppo.kl_coef: -1 is too small: give a number of at least 0"),
    ({"reward_model": "runs/r", "beta": 0.1}, "ppo.beta: unknown key; allowed keys here: gamma, lam"),
    ({"rewards": [{"name": "exact_match"}, {"name": "exact_match"}]}, "ppo.rewards: ['exact_match', 'exact_match'] "
                                                                      "names a function twice"),
    ({"rewards": [{"name": "no_such_fn"}]}, "ppo.rewards.0.name: 'no_such_fn' is not a reward function"),
])
def test_bad_ppo_sections_are_named(tmp_path, section, message):
    with pytest.raises(SpecError) as error:
        parse_spec(ppo_mapping(tmp_path, tmp_path / "run", ppo_section=section))
    assert any(problem.startswith(message) for problem in error.value.problems), error.value.problems


def test_a_ppo_section_needs_task_ppo_and_errors_carry_the_line(tmp_path):
    grpo_spec = {**ppo_mapping(tmp_path, tmp_path / "run"), "task": "grpo",
                 "grpo": {"rewards": [{"name": "exact_match"}]}}
    with pytest.raises(SpecError, match="ppo: only used when task is ppo"):
        parse_spec(grpo_spec)
    text = "task: ppo\nmodel: m\noutput_dir: o\ndata: {train: t}\ntrain: {max_steps: 1}\nppo:\n  gamma: 2\n  rewards: []\n"
    with pytest.raises(SpecError) as error:
        parse_spec_text(text, source="ppo.yaml")
    assert error.value.problems == ["ppo.yaml:7: ppo.gamma: 2 is too large: give a number from 0 to 1"]


# --------------------------------------------------------------------------------------------
# End to end on a micro demo build


def test_ppo_raises_the_reward_and_logs_every_rollout(demo_dir, tmp_path, reference_passes):
    summary = run_job(parse_spec(ppo_mapping(demo_dir, tmp_path / "run")), progress_bar=False)
    assert summary["status"] == "succeeded" and summary["data"]["train"]["rows"] > 300
    assert (tmp_path / "run/export/config.json").is_file()
    assert not (tmp_path / "run/export/value_head.safetensors").exists()
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    rewards = [m["reward"] for m in metrics]
    assert np.mean(rewards[-3:]) >= np.mean(rewards[:3]) + 0.3, rewards
    assert TRL_PPO_METRICS <= set(metrics[0])
    # num_iterations 1: the ratio is exactly 1 and old values are the current ones, so nothing is clipped;
    # kl_coef 0: no KL, no reference pass.
    assert all(m["policy/clipfrac"] == 0.0 and m["val/clipfrac"] == 0.0 and m["val/ratio"] == 1.0 for m in metrics)
    assert all(m["objective/kl"] == 0.0 for m in metrics) and reference_passes == []
    # The value head starts at zero and follows the returns (the scores: gamma = lam = 1, no KL) upward.
    assert metrics[0]["val/mean"] == 0.0 and np.mean([m["val/mean"] for m in metrics[-3:]]) > 0.3
    samples = read_jsonl(tmp_path / "run/samples.jsonl")
    assert len(samples) == 12 * 16 and {s["step"] for s in samples} == set(range(1, 13))
    step_one = [s for s in samples if s["step"] == 1]
    assert np.mean([s["reward"] for s in step_one]) == pytest.approx(metrics[0]["reward"], abs=1e-6)
    assert all(s["rewards"]["contains"] == float("e" in s["text"].casefold()) == s["reward"] for s in samples)
    answers = {(row["prompt"], row["answer"]) for row in read_jsonl(demo_dir / "data/prompts.jsonl")}
    assert all((s["prompt"], s["answer"]) in answers for s in samples)  # the samples browser's Reference


def test_epoch_is_the_fraction_of_the_prompts_drawn(demo_dir, tmp_path):
    """QA: as for grpo, a PPO run logged no epoch: it logs the prompts its rollouts drew over the prompts."""
    from tests.jaxengine.test_grpo import few_prompts

    mapping = ppo_mapping(demo_dir, tmp_path / "run", train={"max_steps": 3, "batch_size": 4, "seed": 1},
                          data={"train": few_prompts(demo_dir, tmp_path / "prompts.jsonl", 5), "max_seq_len": 64})
    assert run_job(parse_spec(mapping), progress_bar=False)["status"] == "succeeded"
    epochs = [m["epoch"] for m in read_jsonl(tmp_path / "run/metrics.jsonl")]
    assert epochs == pytest.approx([4 / 5, 8 / 5, 12 / 5], abs=1e-9)


def test_a_run_stopped_inside_a_block_of_reused_rollouts_resumes_to_the_same_metrics(demo_dir, tmp_path):
    """QA: as for grpo, a PPO run with num_iterations 2 stopped after step 3 sampled a new block on resume."""
    from tests.jaxengine.test_grpo import assert_same_metrics, stop_before_step

    def spec(run_dir):
        mapping = ppo_mapping(demo_dir, run_dir, train={"max_steps": 4, "batch_size": 4, "save_every": 1, "seed": 1})
        mapping["ppo"].update(num_iterations=2, kl_coef=0.04)
        return parse_spec(mapping)

    run_job(spec(tmp_path / "straight"), progress_bar=False)
    assert run_job(spec(tmp_path / "stopped"), should_stop=stop_before_step(4), progress_bar=False)["step"] == 3
    summary = run_job(spec(tmp_path / "stopped"), progress_bar=False)
    assert summary["status"] == "succeeded" and summary["resumed_from_step"] == 3
    assert_same_metrics(tmp_path / "straight", tmp_path / "stopped", steps=4)


def test_lora_with_kl_reused_rollouts_eval_and_the_guard(demo_dir, tmp_path, reference_passes):
    spec = parse_spec(ppo_mapping(
        demo_dir, tmp_path / "run",
        ppo_section={"max_new_tokens": 4, "kl_coef": 0.1, "num_iterations": 2, "entropy_coef": 0.01,
                     "rewards": [{"name": "contains", "args": {"keywords": ["e"]}}],
                     "eval_metrics": [{"name": "exact_match", "args": {"extract": "last_number"}}]},
        data={"train": str(demo_dir / "data/prompts.jsonl"), "eval": str(demo_dir / "data/eval.jsonl"),
              "max_seq_len": 64},
        peft={"method": "lora", "rank": 4},
        train={"max_steps": 4, "batch_size": 4, "grad_accum": 2, "eval_every": 4, "eval_samples": 3}))
    trainer, _ = ppo.make_ppo_trainer(spec, build_job_model(spec), tmp_path / "run")
    summary = trainer.fit(progress_bar=False)
    assert summary["status"] == "succeeded"
    # The best checkpoint is ranked by the first eval metric.
    assert summary["best_checkpoint"]["metric"] == "eval/exact_match" and summary["best_checkpoint"]["step"] == 4
    assert len(reference_passes) == 4 == trainer.batch_source.reference_passes  # 2 rollout batches x 2 micro-batches
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    # Fresh adapters add exactly zero, so at step 1 the policy is the reference; later it is not.
    assert metrics[0]["objective/kl"] == pytest.approx(0.0, abs=1e-5) and abs(metrics[2]["objective/kl"]) > 1e-6
    # The second step of each batch reuses its rollouts against the stored old policy.
    assert metrics[1]["time/rollout"] == 0.0 < metrics[0]["time/rollout"]
    assert metrics[0]["val/ratio"] == pytest.approx(1.0, abs=1e-5) and metrics[1]["val/ratio"] != 1.0
    assert 0.0 <= metrics[-1]["eval/contains"] <= 1.0 and 0.0 <= metrics[-1]["eval/exact_match"] <= 1.0
    samples = read_jsonl(tmp_path / "run/samples.jsonl")
    assert [s["step"] for s in samples if s["kind"] == "rollout"] == [1] * 8 + [3] * 8
    evals = [s for s in samples if s["kind"] == "eval"]
    assert len(evals) == 3 and all(s["reward"] == s["rewards"]["contains"] for s in evals)
    guard = ppo.PpoGuard(max_kl=0.5, zero_std_patience=20, truncated_patience=20, mask_truncated=False)
    finished = {"completions/clipped_ratio": 0.0, "frac_reward_zero_std": 0.0}
    assert guard({**finished, "objective/kl": 0.4}) is None
    assert guard({**finished, "objective/kl": 0.6}).startswith("objective/kl 0.6 exceeds ppo.max_kl 0.5")
    assert ppo.PpoGuard(max_kl=None, zero_std_patience=20, truncated_patience=20, mask_truncated=False)(
        {**finished, "objective/kl": 1e9}) is None


def test_the_kl_ceiling_stops_a_run(demo_dir, tmp_path):
    section = {"max_new_tokens": 4, "kl_coef": 0.01, "max_kl": 1e-9,
               "rewards": [{"name": "contains", "args": {"keywords": ["e"]}}]}
    spec = parse_spec(ppo_mapping(demo_dir, tmp_path / "run", ppo_section=section,
                                  train={"max_steps": 5, "batch_size": 4, "seed": 1}))
    summary = run_job(spec, progress_bar=False)
    # Full fine-tuning: the reference is the starting weights, so step 1 has KL 0 and step 2 does not.
    assert summary["status"] == "failed" and summary["step"] == 2, summary["message"]
    assert summary["message"].startswith("stopped by the guard at step 2: objective/kl ")


def test_the_guard_stops_a_run_whose_completions_are_all_masked_as_truncated(demo_dir, tmp_path):
    """QA: with ppo.mask_truncated and every completion hitting max_new_tokens, no token was in the loss: every
    step had grad_norm 0 and the run 'succeeded' having trained nothing. As GRPO's guard does (the same code),
    it is stopped after ppo.truncated_patience such steps, saying what to change."""
    truncated = {"objective/kl": 0.0, "completions/clipped_ratio": 1.0, "frac_reward_zero_std": 0.0}
    some_finished = {**truncated, "completions/clipped_ratio": 0.5}
    guard = ppo.PpoGuard(max_kl=None, zero_std_patience=20, truncated_patience=2, mask_truncated=True)
    assert [guard(record) for record in (truncated, some_finished, truncated)] == [None] * 3
    assert guard(truncated) == (
        "every completion hit ppo.max_new_tokens for 2 steps, and ppo.mask_truncated leaves such completions out "
        "of the loss, so nothing trained. Raise ppo.max_new_tokens, or set ppo.mask_truncated to false")
    unmasked = ppo.PpoGuard(max_kl=None, zero_std_patience=20, truncated_patience=2, mask_truncated=False)
    assert [unmasked(truncated) for _ in range(3)] == [None] * 3

    # A whole run: 2-token completions of the demo model never finish.
    spec = parse_spec(ppo_mapping(demo_dir, tmp_path / "run", train={"max_steps": 6, "batch_size": 4, "seed": 1},
                                  ppo_section={"max_new_tokens": 2, "kl_coef": 0.0, "mask_truncated": True,
                                               "truncated_patience": 3,
                                               "rewards": [{"name": "length_target", "args": {"target": 3}}]}))
    summary = run_job(spec, progress_bar=False)
    assert summary["status"] == "failed" and summary["step"] == 3, summary["message"]
    assert summary["message"] == ("stopped by the guard at step 3: every completion hit ppo.max_new_tokens for 3 "
                                  "steps, and ppo.mask_truncated leaves such completions out of the loss, so nothing "
                                  "trained. Raise ppo.max_new_tokens, or set ppo.mask_truncated to false")
    assert [record["grad_norm"] for record in read_jsonl(tmp_path / "run/metrics.jsonl")] == [0.0] * 3


def test_a_reward_nobody_can_earn_stops_the_run(demo_dir, tmp_path):
    """QA: PPO had no stop on frac_reward_zero_std: a batch scored all alike, step after step, trained only
    on the KL penalty and the run 'succeeded'. As GRPO's guard does (the same code, grpo.ZeroStdCount), it is
    stopped after ppo.zero_std_patience such steps in a row, saying what to check."""
    flat, varied = {"frac_reward_zero_std": 1.0, "objective/kl": 0.0, "completions/clipped_ratio": 0.0}, {
        "frac_reward_zero_std": 0.0, "objective/kl": 0.0, "completions/clipped_ratio": 0.0}
    guard = ppo.PpoGuard(max_kl=None, zero_std_patience=3, truncated_patience=20, mask_truncated=False)
    assert [guard(record) for record in (flat, flat, varied, flat, flat)] == [None] * 5
    assert guard(flat) == (
        "frac_reward_zero_std has been 1.0 for 3 steps: every completion of the batch got the same reward, so the "
        "reward gives no learning signal. Check the reward functions (or reward model) against the completions in "
        "samples.jsonl, or raise ppo.temperature")

    spec = parse_spec(ppo_mapping(demo_dir, tmp_path / "run", train={"max_steps": 5, "batch_size": 4, "seed": 1},
                                  ppo_section={"max_new_tokens": 4, "zero_std_patience": 2,
                                               "rewards": [{"name": "contains", "args": {"keywords": ["@@@"]}}]}))
    summary = run_job(spec, progress_bar=False)
    assert summary["status"] == "failed" and summary["step"] == 2, summary["message"]
    assert summary["message"].startswith("stopped by the guard at step 2: frac_reward_zero_std has been 1.0 for 2")
    assert [record["frac_reward_zero_std"] for record in read_jsonl(tmp_path / "run/metrics.jsonl")] == [1.0] * 2


def test_ppo_from_a_reward_run(demo_dir, tmp_path):
    reward_run = tmp_path / "reward-run"
    reward_spec = {"task": "reward", "model": str(demo_dir / "model"), "output_dir": str(reward_run),
                   "data": {"train": str(demo_dir / "data/preference.jsonl"), "max_seq_len": 64},
                   "train": {"max_steps": 3, "batch_size": 4}}
    assert run_job(parse_spec(reward_spec), progress_bar=False)["status"] == "succeeded"
    spec = parse_spec(ppo_mapping(demo_dir, tmp_path / "run",
                                  ppo_section={"max_new_tokens": 4, "reward_model": str(reward_run)},
                                  train={"max_steps": 2, "batch_size": 3}))
    assert run_job(spec, progress_bar=False)["status"] == "succeeded"
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    assert {"rewards/reward_model/mean", "objective/scores", "objective/rlhf_reward"} <= set(metrics[0])
    samples = read_jsonl(tmp_path / "run/samples.jsonl")
    assert len(samples) == 2 * 3
    # Each rollout's reward is the reward model's score of its prompt + completion.
    expected = score_texts(reward_run, [s["prompt"] for s in samples], [s["text"] for s in samples], max_seq_len=64)
    np.testing.assert_allclose([s["reward"] for s in samples], expected, rtol=1e-5, atol=1e-5)
    assert len({round(s["reward"], 6) for s in samples}) > 1


def test_a_reward_model_path_without_a_reward_run_is_named(demo_dir, tmp_path):
    spec = parse_spec(ppo_mapping(demo_dir, tmp_path / "run", ppo_section={"reward_model": str(tmp_path)}))
    with pytest.raises(JobError, match=r"ppo.reward_model: .*no reward_head.safetensors"):
        ppo.make_ppo_trainer(spec, build_job_model(spec), tmp_path / "run")


def test_a_reward_model_function_without_a_reward_run_is_named_before_the_run_starts(demo_dir, tmp_path):
    """QA: grpo's reward_model reward (and an eval metric of ppo) on a directory that holds no reward model
    failed the first step, after a whole rollout, while ppo.reward_model was named before the run started."""
    scored = {"name": "reward_model", "args": {"model": str(tmp_path)}}
    grpo_spec = parse_spec({**ppo_mapping(demo_dir, tmp_path / "run"), "task": "grpo", "ppo": None,
                            "grpo": {"rewards": [{"name": "contains", "args": {"keywords": ["e"]}}, scored]}})
    with pytest.raises(JobError, match=r"^grpo.rewards.1.args.model: .*no reward_head.safetensors"):
        grpo.make_grpo_trainer(grpo_spec, build_job_model(grpo_spec), tmp_path / "run")
    ppo_spec = parse_spec(ppo_mapping(demo_dir, tmp_path / "run", ppo_section={
        "rewards": [{"name": "contains", "args": {"keywords": ["e"]}}], "eval_metrics": [scored]},
        data={"train": str(demo_dir / "data/prompts.jsonl"), "eval": str(demo_dir / "data/eval.jsonl")}))
    with pytest.raises(JobError, match=r"^ppo.eval_metrics.0.args.model: .*no reward_head.safetensors"):
        ppo.make_ppo_trainer(ppo_spec, build_job_model(ppo_spec), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_step_whose_completions_are_all_masked_logs_its_rollout_metrics(demo_dir, tmp_path):
    """QA: PPO weighs its metrics by completion tokens; with mask_truncated and every completion truncated
    that weight was 0, and every metric of the step, the rollouts' own included, was logged as 0: reward 0,
    completions/clipped_ratio 0 (not 1), mean_length 0, so the live page hid why nothing trained."""
    run = tmp_path / "run"
    spec = ppo_mapping(demo_dir, run, train={"max_steps": 2, "batch_size": 4, "seed": 1},
                       ppo_section={"max_new_tokens": 2, "kl_coef": 0.0, "mask_truncated": True,
                                    "rewards": [{"name": "length_target", "args": {"target": 3}}]})
    assert run_job(parse_spec(spec), progress_bar=False)["status"] == "succeeded"
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    for record in (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()):
        rollouts = [sample for sample in samples if sample["step"] == record["step"] and sample["kind"] == "rollout"]
        truncated = np.mean([sample["finish_reason"] == "length" for sample in rollouts])
        assert record["completions/clipped_ratio"] == pytest.approx(truncated, abs=1e-6)
        assert record["rewards/length_target/mean"] == pytest.approx(
            np.mean([sample["rewards"]["length_target"] for sample in rollouts]), abs=1e-6)
        assert record["completions/max_length"] == 2.0


def test_an_eval_metric_that_cannot_reach_a_helper_process_is_refused_before_the_model_loads(demo_dir, tmp_path,
                                                                                            monkeypatch):
    """Issue 8, PPO's eval_metrics: scored off the main thread in a helper process, a function that cannot be
    pickled failed the run at its first evaluation; it is refused when the job starts, naming its key."""
    from jaxengine import rewards
    from tests.factories import on_a_thread

    def local_length(completions, references):
        return [float(len(text)) for text in completions]

    monkeypatch.setitem(rewards.REWARDS, "local_length", local_length)
    mapping = ppo_mapping(demo_dir, tmp_path / "run", train={"max_steps": 2, "batch_size": 2, "eval_every": 1})
    mapping["data"]["eval"] = mapping["data"]["train"]
    mapping["ppo"]["eval_metrics"] = [{"name": "exact_match"}, {"name": "local_length"}]
    outcome = on_a_thread(lambda: run_job(parse_spec(mapping), progress_bar=False))
    assert isinstance(outcome.get("error"), JobError), outcome
    assert str(outcome["error"]).startswith("ppo.eval_metrics.1.name: reward 'local_length': its function (")
    assert str(outcome["error"]).endswith(") cannot be scored within its 60 s time limit off the main thread "
                                          "(trainer-thread): there the limit scores it in a helper process, and the "
                                          "function cannot be sent to one; define it at the top level of a module, or "
                                          "run the trainer on the main thread")
    assert not (tmp_path / "run").exists()


def test_prompts_left_out_as_too_long_are_said_before_the_first_step(demo_dir, tmp_path):
    """PPO reads its prompts as GRPO does (``grpo.read_rl_prompts``), and left out those past the room data.max_seq_len
    leaves before ppo.max_new_tokens as silently: its log says them, naming ppo's setting (cancelled before the first
    step: nothing compiles)."""
    train = write_prompts(tmp_path / "train.jsonl", ["What is 1 + 2?", "What is 2 + 2?", LONG_PROMPT])
    spec = parse_spec(ppo_mapping(demo_dir, tmp_path / "run", data={"train": train, "max_seq_len": 64}))
    heard = []
    summary = run_job(spec, progress_bar=False, on_log=heard.append, should_stop=lambda: True)
    assert summary["data"]["train"] == {"rows": 3, "examples": 2, "dropped_long_prompts": 1}
    assert heard == [
        "data.train: 1 of 3 rows (33%) had a prompt longer than the 60 tokens data.max_seq_len 64 leaves before "
        "ppo.max_new_tokens, and was left out: raise data.max_seq_len, lower ppo.max_new_tokens, or shorten it"]
