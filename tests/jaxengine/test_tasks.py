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
from jaxengine.trainer import Trainer, TrainConfig


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
