"""task: grpo end to end on a micro demo build: reward rises, rollouts are logged, the reference pass only
runs when beta > 0, rows line up with the sampler's log-probs."""
import json

import numpy as np
import pytest

from jaxengine import grpo
from jaxengine.grpo import make_grpo_trainer, rollout_rows
from jaxengine.job import build_job_model, run_job
from jaxengine.sampler import Generation
from jaxengine.spec import parse_spec
from tests.jaxengine.conftest import LONG_PROMPT, read_jsonl, write_prompts

TRL_METRICS = {"reward", "reward_std", "rewards/contains/mean", "rewards/contains/std", "frac_reward_zero_std",
               "completions/mean_length", "completions/min_length", "completions/max_length",
               "completions/clipped_ratio", "kl", "entropy", "clip_ratio", "time/rollout", "time/logprobs",
               "time/update", "loss", "grad_norm", "learning_rate"}


def grpo_spec(demo_dir, run_dir, *, grpo=None, **overrides):
    spec = {
        "task": "grpo", "model": str(demo_dir / "model"), "output_dir": str(run_dir),
        "data": {"train": str(demo_dir / "data/prompts.jsonl"), "max_seq_len": 64},
        "optim": {"learning_rate": 2e-2, "schedule": "constant", "max_grad_norm": None},
        "train": {"max_steps": 12, "batch_size": 4, "seed": 1},
        # The micro model is near uniform: about a quarter of 4-token completions contain an "e".
        "grpo": {"num_generations": 8, "max_new_tokens": 4, "beta": 0.0,
                 "rewards": [{"name": "contains", "args": {"keywords": ["e"]}}], **(grpo or {})},
    }
    spec.update(overrides)
    return parse_spec(spec)


def test_grpo_raises_the_reward_and_logs_every_rollout(demo_dir, tmp_path, reference_passes):
    summary = run_job(grpo_spec(demo_dir, tmp_path / "run"), progress_bar=False)
    assert summary["status"] == "succeeded" and summary["data"]["train"]["rows"] > 300
    assert (tmp_path / "run/export/config.json").is_file()
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    rewards = [m["reward"] for m in metrics]
    assert np.mean(rewards[-3:]) >= np.mean(rewards[:3]) + 0.3, rewards
    assert TRL_METRICS <= set(metrics[0])
    # num_iterations 1: the ratio is exactly 1, so nothing is ever clipped; beta 0: no KL, no reference pass.
    assert all(m["clip_ratio"] == 0.0 and m["kl"] == 0.0 for m in metrics)
    assert reference_passes == []
    samples = read_jsonl(tmp_path / "run/samples.jsonl")
    assert len(samples) == 12 * 4 * 8 and {s["step"] for s in samples} == set(range(1, 13))
    step_one = [s for s in samples if s["step"] == 1]
    assert np.mean([s["reward"] for s in step_one]) == pytest.approx(metrics[0]["reward"], abs=1e-6)
    assert all(s["rewards"]["contains"] == float("e" in s["text"].casefold()) for s in samples)
    # Each rollout carries its row's reference answer (the samples browser's Reference column).
    answers = {(row["prompt"], row["answer"]) for row in read_jsonl(demo_dir / "data/prompts.jsonl")}
    assert all((s["prompt"], s["answer"]) in answers for s in samples)
    # Advantages are per group: zero-mean within each prompt's 8 completions.
    advantages = np.array([s["advantage"] for s in step_one]).reshape(4, 8)
    np.testing.assert_allclose(advantages.sum(axis=1), 0.0, atol=1e-5)


def test_lora_gspo_with_reference_dynamic_sampling_reused_rollouts_and_eval(demo_dir, tmp_path, reference_passes):
    spec = grpo_spec(demo_dir, tmp_path / "run",
                     grpo={"loss_type": "gspo", "dynamic_sampling": True, "num_iterations": 2, "beta": 0.1,
                           "advantage": "rloo", "mask_truncated": True,
                           "eval_metrics": [{"name": "exact_match", "args": {"extract": "last_number"}}]},
                     data={"train": str(demo_dir / "data/prompts.jsonl"), "eval": str(demo_dir / "data/eval.jsonl"),
                           "max_seq_len": 64},
                     peft={"method": "lora", "rank": 4},
                     train={"max_steps": 2, "batch_size": 2, "grad_accum": 2, "eval_every": 2, "eval_samples": 3})
    trainer, _ = make_grpo_trainer(spec, build_job_model(spec), tmp_path / "run")
    assert trainer.fit(progress_bar=False)["status"] == "succeeded"
    assert len(reference_passes) == 2  # one rollout batch (reused by step 2), two micro-batches
    metrics = read_jsonl(tmp_path / "run/metrics.jsonl")
    # Fresh adapters add exactly zero, so at step 1 the policy is the reference.
    assert metrics[0]["kl"] == pytest.approx(0.0, abs=1e-6) and metrics[1]["kl"] > 1e-6
    assert metrics[1]["time/rollout"] == 0.0 and metrics[0]["time/rollout"] > 0.0
    assert 0.0 <= metrics[-1]["eval/contains"] <= 1.0 and 0.0 <= metrics[-1]["eval/exact_match"] <= 1.0
    samples = read_jsonl(tmp_path / "run/samples.jsonl")
    evals = [s for s in samples if s["kind"] == "eval"]
    # eval/reward is the training reward alone: exact_match is logged but weighs nothing.
    assert all(s["reward"] == s["rewards"]["contains"] and "exact_match" in s["rewards"] for s in evals)
    rollouts = [s for s in samples if s["kind"] == "rollout"]
    assert {s["step"] for s in rollouts} == {1} and len(rollouts) == 4 * 8
    assert len(evals) == 3
    eval_answers = {(row["prompt"], row["answer"]) for row in read_jsonl(demo_dir / "data/eval.jsonl")}
    assert all((s["prompt"], s["answer"]) in eval_answers for s in evals)
    # Dynamic sampling keeps groups with reward variance when it can find them.
    groups = np.array([s["reward"] for s in rollouts]).reshape(4, 8)
    assert all(group.max() > group.min() for group in groups)


def few_prompts(demo_dir, path, count: int):
    """The first ``count`` rows of the demo's prompts, written to ``path``: a prompt set a short run draws through."""
    path.write_text("".join(line + "\n" for line in (demo_dir / "data/prompts.jsonl").read_text().splitlines()[:count]))
    return str(path)


def test_epoch_is_the_fraction_of_the_prompts_drawn(demo_dir, tmp_path):
    """QA: a GRPO run logged no epoch (sft logs the rows read over the rows). It logs the prompts its rollouts
    drew over the prompts: 4 of 6 per block of num_iterations 2 steps, each block's steps counting them."""
    spec = grpo_spec(demo_dir, tmp_path / "run", grpo={"num_generations": 2, "num_iterations": 2},
                     data={"train": few_prompts(demo_dir, tmp_path / "prompts.jsonl", 6), "max_seq_len": 64},
                     train={"max_steps": 4, "batch_size": 4, "seed": 1})
    assert run_job(spec, progress_bar=False)["status"] == "succeeded"
    epochs = [m["epoch"] for m in read_jsonl(tmp_path / "run/metrics.jsonl")]
    assert epochs == pytest.approx([4 / 6, 4 / 6, 8 / 6, 8 / 6], abs=1e-9)


def test_rows_line_up_with_the_sampler_log_probs(demo_dir, tmp_path):
    spec = grpo_spec(demo_dir, tmp_path / "run", grpo={"num_iterations": 2, "max_new_tokens": 6},
                     train={"max_steps": 2, "batch_size": 2})
    trainer, _ = make_grpo_trainer(spec, build_job_model(spec), tmp_path / "run")
    batch = trainer.batch_source(trainer)
    tokens = batch.tokens
    policy = grpo._reference_log_probs(trainer.params, trainer.rng_state, trainer.frozen,
                                  type(tokens)(**{k: v[0] for k, v in vars(tokens).items()}),
                                  graphdef=trainer.eval_graphdef, chunk_size=256)
    mask = np.asarray(tokens.loss_mask[0])
    assert mask.sum() > 0
    np.testing.assert_allclose(np.asarray(policy)[mask], np.asarray(batch.old_log_probs[0])[mask], atol=1e-4)
    # num_iterations 2: the second step reuses the rollouts (the same batch object's arrays).
    trainer.step = 1
    again = trainer.batch_source(trainer)
    assert again.tokens is batch.tokens and float(again.stats["time/rollout"][0]) == 0.0


def test_rollout_rows_alignment_and_truncation_mask():
    generations = [Generation(text="", token_ids=[8, 9], prompt_token_ids=[5, 6, 7], logprobs=[-0.1, -0.2],
                              finish_reason="stop"),
                   Generation(text="", token_ids=[4, 4, 4], prompt_token_ids=[5], logprobs=[-1.0, -2.0, -3.0],
                              finish_reason="length")]
    for mask_truncated, second_mask in ((False, [1, 1, 1, 0, 0, 0]), (True, [0] * 6)):
        tokens, old = rollout_rows([[5, 6, 7], [5]], generations, width=6, pad_id=0, mask_truncated=mask_truncated)
        assert tokens.input_ids.tolist() == [[5, 6, 7, 8, 0, 0], [5, 4, 4, 0, 0, 0]]
        assert tokens.targets.tolist() == [[6, 7, 8, 9, 0, 0], [4, 4, 4, 0, 0, 0]]
        assert tokens.loss_mask.astype(int).tolist() == [[0, 0, 1, 1, 0, 0], second_mask]
        assert tokens.segment_ids.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
        np.testing.assert_allclose(old, [[0, 0, -0.1, -0.2, 0, 0], [-1, -2, -3, 0, 0, 0]], atol=1e-7)


def test_guard_reasons():
    guard = grpo.GrpoGuard(zero_std_patience=3, max_kl=0.5, mask_truncated=False)
    flat, varied = {"frac_reward_zero_std": 1.0, "kl": 0.0}, {"frac_reward_zero_std": 0.5, "kl": 0.0}
    assert [guard(record) for record in (flat, flat, varied, flat, flat)] == [None] * 5
    assert "frac_reward_zero_std has been 1.0 for 3 steps" in guard(flat)
    assert "kl 0.6 exceeds grpo.max_kl 0.5" in grpo.GrpoGuard(zero_std_patience=3, max_kl=0.5, mask_truncated=False)(
        {"frac_reward_zero_std": 0.0, "kl": 0.6})
    assert grpo.GrpoGuard(zero_std_patience=3, max_kl=None, mask_truncated=False)(
        {"frac_reward_zero_std": 0.0, "kl": 1e9}) is None


def test_the_guard_stops_a_run_whose_completions_are_all_masked_as_truncated():
    """QA: with grpo.mask_truncated and every completion hitting max_new_tokens, every step had loss 0 and
    grad_norm 0 (no token in the loss), and the run 'succeeded' having trained nothing: a model that never
    trains never learns to stop sooner, so it is stopped, saying what to change."""
    truncated = {"frac_reward_zero_std": 0.0, "kl": 0.0, "completions/clipped_ratio": 1.0}
    some_finished = {**truncated, "completions/clipped_ratio": 0.75}
    guard = grpo.GrpoGuard(zero_std_patience=3, max_kl=None, mask_truncated=True)
    assert [guard(record) for record in (truncated, truncated, some_finished, truncated, truncated)] == [None] * 5
    assert guard(truncated) == (
        "every completion hit grpo.max_new_tokens for 3 steps, and grpo.mask_truncated leaves such completions out "
        "of the loss, so nothing trained. Raise grpo.max_new_tokens, or set grpo.mask_truncated to false")
    unmasked = grpo.GrpoGuard(zero_std_patience=3, max_kl=None, mask_truncated=False)
    assert [unmasked(truncated) for _ in range(4)] == [None] * 4


def test_a_reward_nobody_can_earn_stops_the_run(demo_dir, tmp_path):
    spec = grpo_spec(demo_dir, tmp_path / "run", train={"max_steps": 5, "batch_size": 2},
                     grpo={"zero_std_patience": 2, "rewards": [{"name": "contains", "args": {"keywords": ["@@@"]}}]})
    summary = run_job(spec, progress_bar=False)
    assert summary["status"] == "failed" and summary["step"] == 2
    assert summary["message"].startswith("stopped by the guard at step 2: frac_reward_zero_std has been 1.0 for 2")
    assert len(read_jsonl(tmp_path / "run/metrics.jsonl")) == 2


def test_the_best_checkpoint_is_by_the_first_eval_metric_and_export_best_uses_it(demo_dir, tmp_path, capsys):
    from jaxengine.cli import main

    run = tmp_path / "run"
    spec = grpo_spec(demo_dir, run, train={"max_steps": 6, "batch_size": 2, "eval_every": 2, "seed": 1},
                     data={"train": str(demo_dir / "data/prompts.jsonl"), "eval": str(demo_dir / "data/eval.jsonl"),
                           "max_seq_len": 64},
                     grpo={"eval_metrics": [{"name": "format_regex", "args": {"pattern": "[aeiou]"}}]})
    summary = run_job(spec, progress_bar=False)
    evals = {m["step"]: m["eval/format_regex"] for m in read_jsonl(run / "metrics.jsonl") if "eval/format_regex" in m}
    assert sorted(evals) == [2, 4, 6]
    best_step = max(evals, key=lambda step: (evals[step], -step))  # highest, the earliest among equals
    assert summary["best_checkpoint"] == {"metric": "eval/format_regex", "step": best_step,
                                          "value": evals[best_step]}
    assert json.loads((run / "summary.json").read_text())["best_checkpoint"]["step"] == best_step
    capsys.readouterr()
    assert main(["export", "--run", str(run), "--best"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == best_step


def test_a_reward_function_that_raises_fails_the_run_naming_step_function_and_prompt(demo_dir, tmp_path, capsys,
                                                                                      monkeypatch):
    """QA: a reward function raising mid-run raised out of ``jaxengine train`` as a traceback (and no
    summary.json); it now fails the run like a NaN loss, keeping the checkpoints. (The registry's own
    functions refuse bad data before the run starts: ``unscorable_reference``; this one fails on completions.)"""
    import yaml

    from jaxengine import rewards
    from jaxengine.cli import main

    def fails_on_held_out(completions, references):
        """Cannot score a completion of the held-out question (an empty one, as the start's check gives, scores)."""
        for index, (text, row) in enumerate(zip(completions, references)):
            if text and row["prompt"] == "What is 2 + 2?":
                raise ValueError(f"sample {index}: cannot score {text!r}")
        return [0.0] * len(completions)

    monkeypatch.setitem(rewards.REWARDS, "fails_on_held_out", fails_on_held_out)
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(json.dumps({"prompt": "What is 2 + 2?", "answer": "4"}) + "\n")
    run = tmp_path / "run"
    spec = grpo_spec(demo_dir, run, train={"max_steps": 4, "batch_size": 2, "eval_every": 2, "save_every": 1},
                     data={"train": str(demo_dir / "data/prompts.jsonl"), "eval": str(eval_file), "max_seq_len": 64},
                     grpo={"rewards": [{"name": "fails_on_held_out"}]})
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    assert main(["train", str(spec_path), "--no-progress"]) == 1
    out, err = capsys.readouterr()
    summary = json.loads(out)
    # Steps 1 and 2 trained; the evaluation at step 2 scores the held-out row and fails before step 2 is saved.
    completion = summary["message"].split("completion ")[1].split("): ")[0]
    message = (f"step 2: reward 'fails_on_held_out' failed on sample 0 (prompt 'What is 2 + 2?', completion "
               f"{completion}): ValueError: sample 0: cannot score {completion}; stopped, keeping checkpoint 1")
    assert summary["status"] == "failed" and summary["message"] == message
    assert err == f"{spec_path}: failed: {message}\n"
    assert json.loads((run / "summary.json").read_text())["message"] == message
    assert sorted(int(path.name) for path in (run / "checkpoints").iterdir() if path.name.isdigit()) == [1]


@pytest.fixture
def no_rollouts(monkeypatch):
    """The test fails at the first rollout sampled: what it checks is refused before any."""
    def no_rollout(*args, **kwargs):
        raise AssertionError("a rollout was sampled")

    monkeypatch.setattr(grpo.Sampler, "generate", no_rollout)


def test_a_held_out_reference_a_reward_cannot_score_fails_before_any_rollout(demo_dir, tmp_path, no_rollouts):
    """QA: numeric_match on a held-out answer that is no number failed the run at its first evaluation,
    eval_every steps of rollouts in; the rows are now scored against an empty completion at the start."""
    from jaxengine.job import JobError

    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"prompt": f"What is {n} + {n}?", "answer": answer}) + "\n"
                                 for n, answer in ((1, "2"), (2, "four"))))
    spec = grpo_spec(demo_dir, tmp_path / "run", train={"max_steps": 4, "batch_size": 2, "eval_every": 2},
                     data={"train": str(demo_dir / "data/prompts.jsonl"), "eval": str(eval_file), "max_seq_len": 64},
                     grpo={"rewards": [{"name": "numeric_match"}]})
    with pytest.raises(JobError) as raised:
        run_job(spec, progress_bar=False)
    assert str(raised.value) == (f"data.eval: row 2 of {eval_file}: reward numeric_match cannot score it: reference "
                                 "answer='four' is not a number; correct the row, or give the reward another "
                                 "args.answer_column")


def test_an_empty_exact_match_reference_fails_before_any_rollout(demo_dir, tmp_path, no_rollouts):
    """QA: exact_match against a blank reference answer scored every completion 0, silently: the row could
    never be matched. It is refused at the start, naming the file and the row."""
    from jaxengine.job import JobError

    train_file = tmp_path / "train.jsonl"
    train_file.write_text("".join(json.dumps({"prompt": f"What is {n} + {n}?", "answer": answer}) + "\n"
                                  for n, answer in ((1, "2"), (2, "4"), (3, " "))))
    spec = grpo_spec(demo_dir, tmp_path / "run", train={"max_steps": 4, "batch_size": 2},
                     data={"train": str(train_file), "max_seq_len": 64},
                     grpo={"rewards": [{"name": "exact_match"}]})
    with pytest.raises(JobError) as raised:
        run_job(spec, progress_bar=False)
    assert str(raised.value) == (f"data.train: row 3 of {train_file}: reward exact_match cannot score it: reference "
                                 "answer=' ' is empty, so no completion can match it; correct the row, or give the "
                                 "reward another args.answer_column")


def stop_before_step(step: int):
    """A ``should_stop`` that lets steps 1 .. step - 1 run (it is asked before each step)."""
    asked = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) >= step

    return should_stop


def assert_same_metrics(straight_dir, resumed_dir, steps: int) -> None:
    """Every logged metric but timings and memory equal (<= 1e-5) at every step of the two runs."""
    straight, resumed = read_jsonl(straight_dir / "metrics.jsonl"), read_jsonl(resumed_dir / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [m["step"] for m in straight] == list(range(1, steps + 1))
    for before, after in zip(straight, resumed):
        for key, value in before.items():
            if not key.startswith(("time/", "memory/", "tokens_per_second")):
                assert abs(after[key] - value) <= 1e-5, (before["step"], key, value, after[key])


def test_a_run_stopped_inside_a_block_of_reused_rollouts_resumes_to_the_same_metrics(demo_dir, tmp_path):
    """QA: with num_iterations 2, a run stopped after step 3 (half-way through the block of steps 3-4)
    sampled new rollouts from step 3's weights on resume, so step 4 trained on other data than the
    run that was not stopped; the block's rollouts now travel with the checkpoint."""
    def spec(run_dir):
        return grpo_spec(demo_dir, run_dir, train={"max_steps": 4, "batch_size": 2, "save_every": 1, "seed": 1},
                         grpo={"num_iterations": 2, "beta": 0.04})

    run_job(spec(tmp_path / "straight"), progress_bar=False)
    assert run_job(spec(tmp_path / "stopped"), should_stop=stop_before_step(4), progress_bar=False)["step"] == 3
    summary = run_job(spec(tmp_path / "stopped"), progress_bar=False)
    assert summary["status"] == "succeeded" and summary["resumed_from_step"] == 3
    assert_same_metrics(tmp_path / "straight", tmp_path / "stopped", steps=4)
    # The block's rollouts were logged once, at step 3, by the run that made them.
    assert [s["step"] for s in read_jsonl(tmp_path / "stopped/samples.jsonl")] == [
        s["step"] for s in read_jsonl(tmp_path / "straight/samples.jsonl")]


def test_dynamic_sampling_trains_on_the_pool_groups_with_reward_variance_first():
    from types import SimpleNamespace

    rewards_pg = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    generations = [f"g{i}" for i in range(8)]
    by_name = {"r": list(rewards_pg.reshape(-1))}
    for batch_size, kept in ((2, [11, 13]), (3, [11, 13, 10])):
        pool = SimpleNamespace(grpo=SimpleNamespace(num_generations=2), batch_size=batch_size, grad_accum=1)
        pool._groups = grpo.GrpoRollouts._groups.__get__(pool)
        indices, chosen, chosen_pg, chosen_by_name = grpo.GrpoRollouts._keep_varied(
            pool, [10, 11, 12, 13], generations, rewards_pg, by_name)
        assert indices == kept
        positions = [[10, 11, 12, 13].index(index) for index in kept]
        assert chosen == [generations[2 * p + g] for p in positions for g in range(2)]
        np.testing.assert_array_equal(chosen_pg, rewards_pg[positions])
        assert chosen_by_name["r"] == list(rewards_pg[positions].reshape(-1))


@pytest.mark.parametrize("loss_type", ["dapo", "gspo"])
def test_the_loss_from_the_first_completion_position_equals_the_loss_over_every_position(demo_dir, tmp_path,
                                                                                        loss_type):
    """GrpoTask computes logits only from ``completion_start`` on; prompt positions carry no loss, so
    the loss, its gradient and every metric are those of the whole width (stored old and reference
    log-probs included, as num_iterations > 1 and beta > 0 use them)."""
    import dataclasses

    import jax
    from flax import nnx

    spec = grpo_spec(demo_dir, tmp_path / "run", grpo={"num_iterations": 2, "beta": 0.1, "loss_type": loss_type},
                     peft={"method": "lora", "rank": 4}, train={"max_steps": 2, "batch_size": 2})
    trainer, _ = make_grpo_trainer(spec, build_job_model(spec), tmp_path / "run")
    assert trainer.task.completion_start == trainer.batch_source.completion_start > 0
    batch = trainer.batch_source(trainer)
    first = jax.tree.map(lambda x: x[0], batch)
    # Move the policy off the rollout weights so that ratios and KL are not trivially 1 and 0.
    params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(0), p.shape), trainer.params)

    def loss_and_grads(task):
        def loss_fn(params):
            model = nnx.merge(trainer.graphdef, params, trainer.rng_state, trainer.frozen)
            loss, _, metrics = task.loss(model, first)
            return loss, metrics
        # Jitted as the trainer does (op by op it took 40-80 s of the suite; jitted about a third).
        return jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)

    (sliced, sliced_metrics), sliced_grads = loss_and_grads(trainer.task)
    (whole, whole_metrics), whole_grads = loss_and_grads(dataclasses.replace(trainer.task, completion_start=0))
    assert abs(float(whole_metrics["kl"])) > 1e-4
    np.testing.assert_allclose(sliced, whole, rtol=1e-5, atol=1e-6)
    for name in ("kl", "clip_ratio", "entropy"):
        np.testing.assert_allclose(sliced_metrics[name], whole_metrics[name], rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(sliced_grads), jax.tree.leaves(whole_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_eval_group_by_scores_each_group_of_held_out_prompts(demo_dir, tmp_path):
    spec = grpo_spec(demo_dir, tmp_path / "run",
                     data={"train": str(demo_dir / "data/prompts.jsonl"), "eval": str(demo_dir / "data/eval.jsonl"),
                           "max_seq_len": 64, "eval_group_by": "task"},
                     train={"max_steps": 1, "batch_size": 2, "eval_every": 1, "eval_samples": 8})
    trainer, _ = make_grpo_trainer(spec, build_job_model(spec), tmp_path / "run")
    assert trainer.fit(progress_bar=False)["status"] == "succeeded"
    final = read_jsonl(tmp_path / "run/metrics.jsonl")[-1]
    task_of = {row["prompt"]: row["task"] for row in read_jsonl(demo_dir / "data/eval.jsonl")}
    evals = [s for s in read_jsonl(tmp_path / "run/samples.jsonl") if s["kind"] == "eval"]
    assert len(evals) == len(task_of) == 8  # every held-out prompt is scored and, here, logged
    by_task: dict[str, list[float]] = {}
    for sample in evals:
        by_task.setdefault(task_of[sample["prompt"]], []).append(sample["rewards"]["contains"])
    grouped = {key: value for key, value in final.items() if key.startswith("eval/contains/")}
    assert grouped == {f"eval/contains/{task}": pytest.approx(np.mean(scores)) for task, scores in by_task.items()}
    assert np.mean([score for scores in by_task.values() for score in scores]) == pytest.approx(final["eval/contains"])


def test_a_completion_budget_beyond_the_model_context_fails_before_any_rollout(demo_dir, tmp_path, no_rollouts):
    """QA: max_new_tokens past the model's context (2048 here) with a data.max_seq_len that leaves room for
    it passed every check and raised the sampler's ContextLengthError as a traceback at the first rollout.
    (A data.max_seq_len past the model's positions, here its context, is refused itself now.)"""
    from jaxengine.job import JobError

    spec = grpo_spec(demo_dir, tmp_path / "run", data={"train": str(demo_dir / "data/prompts.jsonl"),
                                                       "max_seq_len": 2048},
                     grpo={"max_new_tokens": 2100})
    with pytest.raises(JobError) as raised:
        run_job(spec, progress_bar=False)
    assert str(raised.value) == ("grpo.max_new_tokens (2100) leaves no room for a prompt within the model's "
                                 "context length (2048 tokens, max_position_embeddings in its config.json); "
                                 "lower grpo.max_new_tokens below 2048")


def test_prompts_that_fit_max_seq_len_but_not_the_model_context_are_dropped(demo_dir, tmp_path):
    """With data.max_seq_len past the context, a prompt is kept only where it and max_new_tokens fit the
    context: those past it failed the sampler mid-run (ContextLengthError)."""
    train = tmp_path / "prompts.jsonl"
    train.write_text("".join(json.dumps({"prompt": prompt, "answer": "1"}) + "\n"
                             for prompt in ("1 2", "What is the largest digit in 1 2 3 4? " * 40)))
    spec = grpo_spec(demo_dir, tmp_path / "run", data={"train": str(train), "max_seq_len": 4096},
                     grpo={"max_new_tokens": 1900})
    tokenizer = build_job_model(spec).tokenizer
    prompts = grpo.read_rl_prompts(spec, tokenizer, section="grpo", max_new_tokens=1900, context_length=2048)
    assert [row["prompt"] for row in prompts.rows] == ["1 2"]
    assert prompts.counts["train"] == {"rows": 2, "examples": 1, "dropped_long_prompts": 1}


def test_prompts_left_out_as_too_long_are_counted_and_said_before_the_first_step(demo_dir, tmp_path):
    """SFT and DPO runs said the rows they cut to data.max_seq_len; a GRPO run left out, silently, each prompt longer
    than the room data.max_seq_len leaves before grpo.max_new_tokens. Its data summary counts them as an sft one
    counts its rows (rows read, examples kept) and the run's log says them, as warnings, before the first step
    (cancelled before it here: nothing compiles)."""
    from jaxengine.job import RunLogWarning

    train = write_prompts(tmp_path / "train.jsonl", ["What is 1 + 2?", LONG_PROMPT, "What is 2 + 2?", LONG_PROMPT])
    held_out = write_prompts(tmp_path / "eval.jsonl", ["What is 3 + 2?", LONG_PROMPT])
    spec = grpo_spec(demo_dir, tmp_path / "run", data={"train": train, "eval": held_out, "max_seq_len": 64})
    heard = []
    summary = run_job(spec, progress_bar=False, on_log=heard.append, should_stop=lambda: True)
    assert (summary["status"], summary["step"]) == ("cancelled", 0)
    assert summary["data"] == {"train": {"rows": 4, "examples": 2, "dropped_long_prompts": 2},
                               "eval": {"rows": 2, "examples": 1, "dropped_long_prompts": 1}, "max_prompt_tokens": 60}
    assert heard == [
        "data.train: 2 of 4 rows (50%) had a prompt longer than the 60 tokens data.max_seq_len 64 leaves before "
        "grpo.max_new_tokens, and were left out: raise data.max_seq_len, lower grpo.max_new_tokens, or shorten those "
        "prompts",
        "data.eval: 1 of 2 rows (50%) had a prompt longer than the 60 tokens data.max_seq_len 64 leaves before "
        "grpo.max_new_tokens, and was left out: raise data.max_seq_len, lower grpo.max_new_tokens, or shorten it"]
    assert all(isinstance(line, RunLogWarning) for line in heard)


def test_no_prompt_that_fits_says_how_long_the_prompts_are_and_what_to_change(demo_dir, tmp_path):
    """A run whose every prompt was longer than data.max_seq_len leaves before max_new_tokens failed with a bare
    count ("no prompt of at most 24 tokens ({'rows': 0, 'dropped_long_prompts': 200})"): the message says how long
    the shortest prompt is and the settings that would let it in (found by launching GRPO on a tiny model)."""
    from jaxengine.job import JobError
    from jaxengine.prompts import encode_prompt

    train = tmp_path / "prompts.jsonl"
    prompts = ("What is the largest digit in 1 2 3 4?", "What is the largest digit in 1 2 3 4 5 6 7 8?")
    train.write_text("".join(json.dumps({"prompt": prompt, "answer": "1"}) + "\n" for prompt in prompts))
    tokenizer = build_job_model(grpo_spec(demo_dir, tmp_path / "run")).tokenizer
    shortest = len(encode_prompt(tokenizer, prompts[0]))
    # Two tokens short of the shortest prompt and its 4 new tokens.
    spec = grpo_spec(demo_dir, tmp_path / "run", data={"train": str(train), "max_seq_len": shortest + 2},
                     grpo={"max_new_tokens": 4})
    with pytest.raises(JobError) as raised:
        grpo.read_rl_prompts(spec, tokenizer, section="grpo", max_new_tokens=4, context_length=2048)
    assert str(raised.value) == (
        f"data.train: {train} has no prompt of at most {shortest - 2} tokens, the room data.max_seq_len "
        f"({shortest + 2}) leaves after grpo.max_new_tokens (4): all 2 prompts are longer (the shortest is {shortest} "
        f"tokens with the chat template); raise data.max_seq_len to at least {shortest + 4} or lower "
        f"grpo.max_new_tokens to at most 2")


def test_a_reward_function_that_cannot_reach_a_helper_process_is_refused_before_the_model_loads(demo_dir, tmp_path,
                                                                                               monkeypatch):
    """Issue 8: off the main thread each reward term is scored in a helper process (its time limit), and a
    function that cannot be pickled (defined inside a function) cannot be sent to one: that was found at the
    first scoring, after the model was loaded and the step compiled, and failed the run there. The job is
    refused when it starts, in the same words, naming the key."""
    from jaxengine import rewards
    from jaxengine.job import JobError
    from tests.factories import on_a_thread

    def local_length(completions, references):
        return [float(len(text)) for text in completions]

    monkeypatch.setitem(rewards.REWARDS, "local_length", local_length)
    spec = grpo_spec(demo_dir, tmp_path / "run", train={"max_steps": 1, "batch_size": 2},
                     grpo={"num_generations": 2, "rewards": [{"name": "contains", "args": {"keywords": ["e"]}},
                                                             {"name": "local_length"}]})
    outcome = on_a_thread(lambda: run_job(spec, progress_bar=False))
    assert isinstance(outcome.get("error"), JobError), outcome
    assert str(outcome["error"]) == (
        "grpo.rewards.1.name: reward 'local_length': its function (test_a_reward_function_that_cannot_reach_a_helper_"
        "process_is_refused_before_the_model_loads.<locals>.local_length) cannot be scored within its 60 s time "
        "limit off the main thread (trainer-thread): there the limit scores it in a helper process, and the function "
        "cannot be sent to one; define it at the top level of a module, or run the trainer on the main thread")
    assert not (tmp_path / "run").exists()  # the trainer, which makes it once the model is loaded, was never built


def test_a_resume_under_settings_that_shape_the_saved_state_or_the_data_order_is_refused(demo_dir, tmp_path):
    """Issue 8: a run resumed with another grpo.num_generations or train.batch_size went on silently, its
    rollout blocks drawing other prompts than the run it continues (and saved rollouts of another shape). The
    resume compared the job's identity and seed only; it is refused now, naming each setting with its saved and
    its new value and what to do, before the model loads and with the run's spec.yaml left as it was; and by
    the trainer, from the checkpoints' own record, where the spec.yaml is gone."""
    from jaxengine.job import JobError
    from jaxengine.trainer import TrainingError

    run = tmp_path / "run"
    settings = {"max_steps": 2, "batch_size": 2, "save_every": 1}
    assert run_job(grpo_spec(demo_dir, run, train=settings, grpo={"num_generations": 4}),
                   should_stop=stop_before_step(2), progress_bar=False)["step"] == 1
    written = (run / "spec.yaml").read_text()
    changed = grpo_spec(demo_dir, run, train={**settings, "batch_size": 1}, grpo={"num_generations": 2})
    what_to_do = ("they shape the saved state or the order of the training data, so the run cannot go on under "
                  "new values: put each back as saved to resume it, or start a new run (another output_dir)")
    with pytest.raises(JobError) as raised:
        run_job(changed, progress_bar=False)
    assert str(raised.value) == (
        f"output_dir: {run} holds checkpoints saved under other settings than this spec's: train.batch_size 2 "
        f"(this spec: 1), grpo.num_generations 4 (this spec: 2); {what_to_do}")
    assert (run / "spec.yaml").read_text() == written
    (run / "spec.yaml").unlink()
    with pytest.raises(TrainingError) as raised:
        run_job(changed, progress_bar=False)
    assert str(raised.value) == (
        f"{run / 'checkpoints'}: checkpoints saved under other settings than this spec's: train.batch_size 2 "
        f"(this spec: 1), grpo.num_generations 4 (this spec: 2); {what_to_do}")
    (run / "spec.yaml").write_text(written)
    summary = run_job(grpo_spec(demo_dir, run, train=settings, grpo={"num_generations": 4}), progress_bar=False)
    assert summary["status"] == "succeeded" and summary["resumed_from_step"] == 1
