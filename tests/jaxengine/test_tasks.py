"""Preference tasks end to end on a tiny model: the reference plumbing is exact and DPO learns."""
import json
import math

import numpy as np
import pytest
from flax import nnx

from jaxengine.data.pipeline import Example, PreferencePair, make_batch
from jaxengine.models import build_model, preset
from jaxengine.peft.lora import LoraParam, apply_lora
from jaxengine.spec import OptimSpec
from jaxengine.tasks import PreferenceTask, RewardModel, RewardTask, load_reward_model, save_reward_head, with_reference_log_probs
from jaxengine.trainer import Checkpoints, Trainer, TrainConfig


def pairs(count=16, seed=0):
    """Shared prompt, then a chosen continuation that counts up and a rejected one that counts down."""
    rng = np.random.default_rng(seed)
    made = []
    for _ in range(count):
        prompt = list(rng.integers(3, 200, size=int(rng.integers(2, 6))))
        start = int(rng.integers(10, 100))
        chosen, rejected = [start + i for i in range(4)], [start - i for i in range(4)]

        def example(continuation):
            ids = np.asarray(prompt + continuation, np.int32)
            return Example(ids=ids, loss_mask=np.arange(len(ids)) >= len(prompt))

        made.append(PreferencePair(chosen=example(chosen), rejected=example(rejected)))
    return made


@pytest.mark.parametrize("lora", [False, True])
def test_dpo_starts_at_log_two_and_learns_the_preference(tmp_path, lora):
    model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))
    trainable = nnx.Param
    if lora:
        apply_lora(model, targets=("q_proj", "v_proj", "up_proj", "down_proj"), rank=4, alpha=8)
        trainable = LoraParam
    train = with_reference_log_probs(model, pairs(), batch_size=8, max_seq_len=16, pad_id=0)
    assert all(p.reference_chosen < 0 and p.reference_rejected < 0 for p in train)
    config = TrainConfig(total_steps=12, batch_size=8, max_seq_len=16, eval_every=12,
                         optim=OptimSpec(learning_rate=5e-3 if lora else 2e-3, schedule="constant"))
    trainer = Trainer(model=model, task=PreferenceTask(beta=0.5), config=config, train_examples=train,
                      eval_examples=train[:8], pad_id=0, run_dir=tmp_path, trainable=trainable)
    summary = trainer.fit(progress_bar=False)
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    last = summary["final_metrics"]
    # Step 1 scores the initial policy against itself: every margin is 0 and the loss is log 2.
    assert abs(first["loss"] - math.log(2)) < 1e-5 and abs(first["rewards/margins"]) < 1e-5
    assert last["loss"] < 0.5 and last["rewards/accuracies"] == 1.0 and last["eval/rewards/margins"] > 0.5


# TRL's other DPO loss_types, each at the policy == reference start (every log-ratio 0, beta 0.5): its first loss.
AT_ZERO_MARGIN = {
    "robust": math.log(2),  # label_smoothing 0: DPO itself
    "exo_pair": 0.5 * (math.log(0.5) - math.log1p(-1e-3)) + 0.5 * (math.log(0.5) - math.log(1e-3)),
    "nca_pair": 2 * math.log(2),  # -log σ(0) - log σ(0) / 2 - log σ(0) / 2
    "sppo_hard": 2 * (0.5 / 0.5) ** 2,
    "apo_zero": 1.0,  # 1 - σ(0) + σ(0)
    "apo_down": 1.0,  # σ(0) + 1 - σ(0)
    "discopop": 0.5 * math.log(2) + 0.5,  # the mix σ(0 / tau) is 1/2
    "kto_pair": 0.5,  # both reference points max(0, 0): 1 - σ(0) for every term
    "aot": math.log(2),  # every sorted margin 0: DPO at zero margin
    "aot_pair": math.log(2),
    "bco_pair": 2 * math.log(2),  # every reward 0, so their running mean delta too: -log σ(0) - log σ(0)
}


@pytest.fixture(scope="module")
def referenced_pairs():
    model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))
    return with_reference_log_probs(model, pairs(8), batch_size=8, max_seq_len=16, pad_id=0)


@pytest.mark.parametrize("loss_name", sorted(AT_ZERO_MARGIN))
def test_each_trl_variant_trains_a_few_steps(tmp_path, referenced_pairs, loss_name):
    """Three steps of each variant through the trainer: the task hands it the summed log-probs and the references
    (the first loss is the formula's at zero margin), every loss is finite and the preference metrics are logged,
    in training and eval."""
    model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))  # the weights the references were computed with
    config = TrainConfig(total_steps=3, batch_size=8, max_seq_len=16, eval_every=3,
                         optim=OptimSpec(learning_rate=2e-3, schedule="constant"))
    trainer = Trainer(model=model, task=PreferenceTask(loss_name=loss_name, beta=0.5), config=config,
                      train_examples=referenced_pairs, eval_examples=referenced_pairs, pad_id=0, run_dir=tmp_path)
    summary = trainer.fit(progress_bar=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [record for record in records if "loss" in record]
    assert len(steps) == 3 and all(math.isfinite(record["loss"]) for record in steps)
    assert steps[0]["loss"] == pytest.approx(AT_ZERO_MARGIN[loss_name], abs=1e-5)
    assert abs(steps[0]["rewards/margins"]) < 1e-5 and steps[-1]["rewards/margins"] != 0.0
    last = summary["final_metrics"]
    for key in ("rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected", "logps/chosen"):
        assert math.isfinite(last[key]) and math.isfinite(last[f"eval/{key}"]), key
    assert 0.0 <= last["rewards/accuracies"] <= 1.0


def bco_trainer(run_dir, pairs_, *, total_steps, save_every=None, grad_accum=1, loss_name="bco_pair"):
    model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))  # the weights the references were computed with
    config = TrainConfig(total_steps=total_steps, batch_size=8 // grad_accum, grad_accum=grad_accum, max_seq_len=16,
                         save_every=save_every, optim=OptimSpec(learning_rate=2e-3, schedule="constant"))
    return Trainer(model=model, task=PreferenceTask(loss_name=loss_name, beta=0.5), config=config,
                   train_examples=pairs_, pad_id=0, run_dir=run_dir)


def read_records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Crash(Exception):
    pass


def test_bco_pair_resumed_from_a_checkpoint_goes_on_with_its_running_mean(tmp_path, referenced_pairs):
    """A run stopped at step 12 and resumed from its step-10 checkpoint logs the uninterrupted run's losses and
    deltas for steps 11-20: the running mean of rewards comes back from the checkpoint (a fresh one would make
    step 11's delta that step's batch mean alone)."""
    bco_trainer(tmp_path / "straight", referenced_pairs, total_steps=20, save_every=5).fit(progress_bar=False)
    straight = read_records(tmp_path / "straight")

    def crash_at_12(progress):
        if progress.step == 12:
            raise Crash

    with pytest.raises(Crash):
        bco_trainer(tmp_path / "crashed", referenced_pairs, total_steps=20, save_every=5).fit(
            on_progress=crash_at_12, progress_bar=False)
    resumed_trainer = bco_trainer(tmp_path / "crashed", referenced_pairs, total_steps=20, save_every=5)
    summary = resumed_trainer.fit(progress_bar=False)
    resumed = read_records(tmp_path / "crashed")
    assert summary["resumed_from_step"] == 10 and [m["step"] for m in resumed] == list(range(1, 21))
    for before, after in zip(straight[10:], resumed[10:], strict=True):
        for key in ("delta", "loss", "grad_norm", "rewards/margins"):
            assert abs(before[key] - after[key]) <= 1e-5, (after["step"], key, before[key], after[key])
    # Each step's delta moved: the mean is running, not the last batch's; 20 updates were counted.
    assert len({round(m["delta"], 7) for m in straight}) == 20
    assert float(resumed_trainer.loss_state["bco_running_mean"]["count"]) == 20.0


def test_bco_pair_counts_one_update_per_micro_batch_and_checkpoints_it(tmp_path, referenced_pairs):
    """Under grad_accum 2 every micro-batch updates the running mean (as TRL's per forward pass): 3 steps, 6
    updates, saved with the checkpoint as named arrays beside the weights."""
    trainer = bco_trainer(tmp_path, referenced_pairs, total_steps=3, save_every=3, grad_accum=2)
    trainer.fit(progress_bar=False)
    running = trainer.loss_state["bco_running_mean"]
    assert float(running["count"]) == 6.0
    checkpoints = Checkpoints(tmp_path / "checkpoints", keep_last=1)
    try:
        saved = checkpoints.extra(3)
    finally:
        checkpoints.close()
    assert saved == {"loss_state/bco_running_mean/count": 6.0,
                     "loss_state/bco_running_mean/mean": float(running["mean"])}


def test_bco_pair_evaluates_from_the_running_mean_without_changing_it(tmp_path, referenced_pairs):
    """An eval batch is scored as a training micro-batch would be (the mean updated with its mean reward, counting
    once) and the update dropped: a run evaluating every step trains as one that never evaluates."""
    def run(run_dir, eval_every):
        model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))
        config = TrainConfig(total_steps=3, batch_size=8, max_seq_len=16, eval_every=eval_every,
                             optim=OptimSpec(learning_rate=2e-3, schedule="constant"))
        trainer = Trainer(model=model, task=PreferenceTask(loss_name="bco_pair", beta=0.5), config=config,
                          train_examples=referenced_pairs, eval_examples=referenced_pairs, pad_id=0, run_dir=run_dir)
        trainer.fit(progress_bar=False)
        return read_records(run_dir)

    evaluated, plain = run(tmp_path / "evaluated", 1), run(tmp_path / "plain", None)
    for with_eval, without in zip(evaluated, plain, strict=True):
        assert with_eval["loss"] == without["loss"] and with_eval["delta"] == without["delta"]
    for step, record in enumerate(evaluated, start=1):  # one eval batch of all 8 pairs: its mean reward counts once
        eval_mean_reward = (record["eval/rewards/chosen"] + record["eval/rewards/rejected"]) / 2
        assert record["eval/delta"] == pytest.approx((step * record["delta"] + eval_mean_reward) / (step + 1),
                                                     abs=1e-6)


def test_checkpoints_of_losses_without_state_keep_their_format_and_bco_pair_resumes_over_one(
        tmp_path, referenced_pairs):
    """A sigmoid run's checkpoint holds no loss state, as every checkpoint written before loss states did; a
    bco_pair run resumed over such a checkpoint (dpo.loss changed) starts its running mean afresh."""
    bco_trainer(tmp_path, referenced_pairs, total_steps=2, save_every=2, loss_name="sigmoid").fit(progress_bar=False)
    checkpoints = Checkpoints(tmp_path / "checkpoints", keep_last=1)
    try:
        assert "extra" not in checkpoints.meta(2) and checkpoints.extra(2) == {}
    finally:
        checkpoints.close()
    trainer = bco_trainer(tmp_path, referenced_pairs, total_steps=4)
    summary = trainer.fit(progress_bar=False)
    assert summary["resumed_from_step"] == 2 and summary["status"] == "succeeded"
    assert float(trainer.loss_state["bco_running_mean"]["count"]) == 2.0
    step_3 = read_records(tmp_path)[2]
    assert step_3["step"] == 3 and math.isfinite(step_3["loss"]) and math.isfinite(step_3["delta"])


def test_the_task_of_a_dpo_section_reads_each_of_its_settings():
    """Every dpo setting reaches the task under its own name (dpo.loss as loss_name), none left at a default."""
    from jaxengine.spec import DpoSpec

    dpo = DpoSpec(loss="exo_pair", beta=0.3, label_smoothing=0.2, simpo_gamma=0.7, discopop_tau=0.4)
    task = PreferenceTask.from_spec(dpo)
    for name in DpoSpec.model_fields:
        assert getattr(task, "loss_name" if name == "loss" else name) == getattr(dpo, name), name
        assert getattr(dpo, name) != DpoSpec.model_fields[name].default, f"give {name} a value other than its default"


def test_reference_free_losses_need_no_reference(tmp_path):
    model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))
    batch = make_batch(pairs(4), max_seq_len=16, pad_id=0)
    for name in ("simpo", "orpo", "ipo", "hinge"):
        loss, weight, metrics = PreferenceTask(loss_name=name, beta=0.5).loss(model, batch)
        assert np.isfinite(float(loss)) and float(weight) == 4 and "rewards/accuracies" in metrics


def test_reward_model_learns_the_ranking_and_round_trips(tmp_path):
    from jaxengine.checkpoint.hf import save_hf_model

    reward_model = RewardModel(build_model(preset("tiny-llama"), rngs=nnx.Rngs(0)))
    train = pairs(16)
    config = TrainConfig(total_steps=15, batch_size=8, max_seq_len=16,
                         optim=OptimSpec(learning_rate=3e-3, schedule="constant"))
    trainer = Trainer(model=reward_model, task=RewardTask(), config=config, train_examples=train,
                      eval_examples=None, pad_id=0, run_dir=tmp_path / "run")
    summary = trainer.fit(progress_bar=False)
    first = json.loads((tmp_path / "run/metrics.jsonl").read_text().splitlines()[0])
    assert abs(first["loss"] - math.log(2)) < 0.05  # the small head init starts every margin near 0
    assert summary["final_metrics"]["accuracy"] == 1.0 and summary["final_metrics"]["loss"] < 0.3
    trained = trainer.current_model()
    save_hf_model(trained.backbone, trained.backbone.config, tmp_path / "export")
    save_reward_head(trained, tmp_path / "export")
    batch = make_batch(train[:4], max_seq_len=16, pad_id=0)
    np.testing.assert_allclose(load_reward_model(tmp_path / "export")(batch.chosen), trained(batch.chosen), atol=1e-5)


def test_references_are_computed_only_for_the_pairs_asked_for():
    model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))
    every = with_reference_log_probs(model, pairs(), batch_size=8, max_seq_len=16, pad_id=0)
    some = with_reference_log_probs(model, pairs(), batch_size=8, max_seq_len=16, pad_id=0, only=[1, 4, 5, 11])
    for index, (whole, part) in enumerate(zip(every, some)):
        if index in (1, 4, 5, 11):  # the same values, batched with other pairs
            assert part.reference_chosen == pytest.approx(whole.reference_chosen, abs=1e-5)
            assert part.reference_rejected == pytest.approx(whole.reference_rejected, abs=1e-5)
        else:  # never read by training; NaN would fail its loss check if it were
            assert math.isnan(part.reference_chosen) and math.isnan(part.reference_rejected)


def test_preference_log_probs_are_the_completion_log_probs_transformers_gives(demo_dir):
    """The log-probs every DPO loss starts from, against transformers on the same token ids: the reference pass's
    summed log-prob of each chosen and rejected completion (a batch of 4, the last padded), and the length-averaged
    ones that ipo, simpo and orpo read (logps/chosen, logps/rejected), at 1e-5."""
    import torch
    from transformers import AutoModelForCausalLM

    from jaxengine.checkpoint.hf import load_hf_model
    from jaxengine.data.pipeline import encode_rows
    from jaxengine.tokenizer import load_tokenizer

    rows = [json.loads(line) for line in (demo_dir / "data/preference.jsonl").read_text().splitlines()[:6]]
    tokenizer = load_tokenizer(demo_dir / "model")
    preference_pairs, _ = encode_rows(rows, task="dpo", tokenizer=tokenizer, max_seq_len=64)
    reference = AutoModelForCausalLM.from_pretrained(demo_dir / "model", dtype=torch.float32).eval()

    def completion_log_probs(example):
        with torch.no_grad():
            logits = reference(torch.tensor(example.ids[None].astype(np.int64))).logits[0].double()
        log_probs = torch.log_softmax(logits, dim=-1)
        trained = [float(log_probs[i - 1, example.ids[i]]) for i in range(1, len(example.ids)) if example.loss_mask[i]]
        return sum(trained), len(trained)

    expected = [(completion_log_probs(pair.chosen), completion_log_probs(pair.rejected)) for pair in preference_pairs]
    model, _ = load_hf_model(demo_dir / "model")
    scored = with_reference_log_probs(model, preference_pairs, batch_size=4, max_seq_len=64, pad_id=tokenizer.pad_id)
    for pair, ((chosen, _), (rejected, _)) in zip(scored, expected, strict=True):
        assert pair.reference_chosen == pytest.approx(chosen, abs=1e-5)
        assert pair.reference_rejected == pytest.approx(rejected, abs=1e-5)
    _, _, metrics = PreferenceTask(loss_name="ipo", beta=0.5).loss(
        model, make_batch(scored, max_seq_len=64, pad_id=tokenizer.pad_id))
    assert float(metrics["logps/chosen"]) == pytest.approx(np.mean([s / n for (s, n), _ in expected]), abs=1e-5)
    assert float(metrics["logps/rejected"]) == pytest.approx(np.mean([s / n for _, (s, n) in expected]), abs=1e-5)
