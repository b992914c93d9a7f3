"""The reward_model reward function: a saved reward model scores prompt + completion exactly as the reward
task scored the same text in training."""
import numpy as np
import pytest

from jaxengine import rewards
from jaxengine.checkpoint.hf import load_hf_model
from jaxengine.data import pipeline
from jaxengine.reward_scoring import reward_model_dir, score_texts
from jaxengine.rewards import RewardError, WeightedReward, score_rewards
from jaxengine.tasks import RewardModel, save_reward_head
from jaxengine.tokenizer import load_tokenizer
from tests.factories import build_tiny_model_dir


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory):
    """A run directory whose export/ holds a tiny backbone and a random reward head."""
    run = tmp_path_factory.mktemp("reward-run")
    export = build_tiny_model_dir(run / "export")
    backbone, _ = load_hf_model(export)
    model = RewardModel(backbone, seed=3)
    model.score[...] = model.score[...] * 1000.0  # scores far from zero, so a wrong position would show
    save_reward_head(model, export)
    return run


def test_scores_match_the_reward_task_on_the_same_text(reward_run):
    prompts, completions = ["What is 2 + 2?", "Name a colour.", "Say nothing."], ["4", "blue, or perhaps red", ""]
    scores = score_texts(reward_run, prompts, completions, batch_size=2)
    export = reward_model_dir(reward_run)
    assert export == reward_run / "export"
    tokenizer = load_tokenizer(export)
    from jaxengine.tasks import load_reward_model

    model = load_reward_model(export)
    model.eval()
    rows = [{"prompt": p, "chosen": c, "rejected": c} for p, c in zip(prompts, completions)]
    pairs, _ = pipeline.encode_rows(rows, task="reward", tokenizer=tokenizer, max_seq_len=512, loss_on="completion")
    assert len(pairs) == 3  # chat-templated: even the empty completion has its end-of-turn tokens
    batch = pipeline.make_batch(pairs, max_seq_len=512, pad_id=tokenizer.pad_id or 0)
    expected = np.asarray(model(batch.chosen))
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)
    assert len(set(np.round(scores, 3))) == 3 and all(np.isfinite(scores))


def test_the_reward_function_reads_the_prompt_and_names_missing_ones(reward_run):
    terms = [WeightedReward(name="reward_model", weight=0.5, args={"model": str(reward_run)})]
    totals, by_name = score_rewards(terms, ["4", "5"], [{"prompt": "What is 2 + 2?"}] * 2)
    np.testing.assert_allclose(totals, 0.5 * np.asarray(by_name["reward_model"]), atol=1e-12)
    assert by_name["reward_model"] == pytest.approx(score_texts(reward_run, ["What is 2 + 2?"] * 2, ["4", "5"]))
    with pytest.raises(RewardError, match="reward 'reward_model' failed on sample 1 .*no 'prompt'"):
        score_rewards(terms, ["4", "5"], [{"prompt": "x"}, {"answer": "5"}])
    assert rewards.reward_model([], [], model="/nowhere") == []  # what spec validation calls: loads nothing


def test_a_directory_without_a_head_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no reward_head.safetensors here or in"):
        reward_model_dir(tmp_path)
