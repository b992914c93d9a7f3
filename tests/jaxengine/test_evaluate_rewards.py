"""``evaluate.reward_scores``: a model's greedy completions scored by GRPO/PPO reward terms (``grpo.rewards``), the
figures worked out by hand from the completions it returns; the terms checked as the spec checks them; a row no term
can score refused before anything is generated."""
import pytest

from jaxengine import evaluate
from jaxengine.rewards import WeightedReward
from tests.factories import build_tiny_model_dir

PROMPTS = [f"Question {index}: name a colour." for index in range(6)]
ROWS = [{"prompt": prompt, "answer": str(index), "task": ("even", "odd")[index % 2]}
        for index, prompt in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return evaluate.load_for_scoring(build_tiny_model_dir(tmp_path_factory.mktemp("tiny-rewards")))


def by_hand(text: str, keyword: str) -> tuple[float, float]:
    """(contains [keyword], length_target 12 chars) of one completion."""
    return float(keyword.casefold() in text.casefold()), max(0.0, 1.0 - abs(len(text) - 12) / 12)


def test_it_scores_the_greedy_completions_by_each_term_with_weights(tiny):
    model, tokenizer = tiny
    texts = evaluate.greedy_completions(model, tokenizer, ROWS, max_new_tokens=6)
    # exact_match generates by the same loop: its examples are these completions
    assert [example["text"] for example in evaluate.exact_match(model, tokenizer, ROWS, max_new_tokens=6)[
        "examples"]] == texts[:5]
    keyword = next(text for text in texts if text.strip()).strip()[:2]  # found in one completion at least
    terms = [WeightedReward(name="contains", weight=2.0, args={"keywords": [keyword]}),
             WeightedReward(name="length_target", weight=0.5, args={"target": 12})]
    result = evaluate.reward_scores(model, tokenizer, ROWS, terms, max_new_tokens=6, by="task", batch_size=4)

    scores = [by_hand(text, keyword) for text in texts]
    totals = [2.0 * found + 0.5 * length for found, length in scores]
    assert result["metric"] == "rewards" and result["count"] == 6 and result["by"] == "task"
    assert result["value"] == pytest.approx(sum(totals) / 6, abs=1e-5)
    assert result["terms"] == pytest.approx({"contains": sum(found for found, _ in scores) / 6,
                                             "length_target": sum(length for _, length in scores) / 6}, abs=1e-5)
    assert 0 < result["terms"]["contains"]
    assert result["groups"]["even"]["value"] == pytest.approx(sum(totals[0::2]) / 3, abs=1e-5)
    assert result["groups"]["odd"]["value"] == pytest.approx(sum(totals[1::2]) / 3, abs=1e-5)
    assert result["groups"]["odd"]["count"] == 3
    assert result["groups"]["odd"]["terms"]["length_target"] == pytest.approx(
        sum(length for _, length in scores[1::2]) / 3, abs=1e-5)
    assert [example["text"] for example in result["examples"]] == texts[:5]
    assert result["examples"][1]["scores"] == pytest.approx({"contains": scores[1][0], "length_target": scores[1][1]})
    assert result["examples"][1]["total"] == pytest.approx(totals[1], abs=1e-5)
    assert result["examples"][0]["answer"] == "0"  # no term reads a column: the answer column's, as the samples log


def test_a_weight_scales_the_total_and_not_the_terms_own_mean():
    texts = ["red", "a blue sky", "", "RED and blue"]
    rows = [{"prompt": "p", "answer": "x"} for _ in texts]
    once = evaluate.score_reward_terms(texts, rows, [WeightedReward(name="contains", args={"keywords": ["red"]})])
    thrice = evaluate.score_reward_terms(texts, rows, [WeightedReward(name="contains", weight=3.0,
                                                                      args={"keywords": ["red"]})])
    assert once["value"] == pytest.approx(0.5, abs=1e-5) and thrice["value"] == pytest.approx(1.5, abs=1e-5)
    assert once["terms"] == thrice["terms"] == {"contains": 0.5}
    assert "groups" not in once


def test_a_row_no_term_can_score_is_refused_before_anything_is_generated():
    numbers = [{"prompt": "a", "answer": "4"}, {"prompt": "b", "answer": "four"}]
    # No model at all: the refusal comes before the first generation.
    with pytest.raises(ValueError, match="numeric_match cannot score row 2: reference answer='four' is not a number"):
        evaluate.reward_scores(None, None, numbers, [WeightedReward(name="numeric_match")], max_new_tokens=4)
    with pytest.raises(ValueError, match="row 1 has no 'solution' value, where exact_match reads the reference"):
        evaluate.reward_scores(None, None, numbers, [WeightedReward(name="exact_match",
                                                                    args={"answer_column": "solution"})],
                               max_new_tokens=4)


@pytest.mark.parametrize(("items", "key", "words"), [
    ([], "", "give a list of reward functions"),
    ([{"name": "nope"}], "0.name", "'nope' is not a reward function"),
    ([{"name": "contains", "args": {"keywords": ["a"]}}, {"name": "format_regex"}], "1.args.pattern",
     "required argument missing: pattern"),
    ([{"name": "length_target", "args": {"target": 0}}], "0.args.target", "target must be positive"),
    ([{"name": "contains", "weight": "x", "args": {"keywords": ["a"]}}], "0.weight", "valid number"),
    ([{"name": "valid_json", "colour": 1}], "0.colour", "unknown key"),
    ([{"name": "valid_json"}, {"name": "valid_json", "weight": 2}], "", "valid_json is given twice"),
])
def test_terms_are_checked_as_the_spec_checks_them_naming_the_key(items, key, words):
    terms, problems = evaluate.reward_term_problems(items)
    assert terms == [] and list(problems) == [key] and words in problems[key]


def test_good_terms_become_weighted_rewards():
    terms, problems = evaluate.reward_term_problems([{"name": "valid_json", "weight": 0.5},
                                                     {"name": "contains", "args": {"keywords": ["a"]}}])
    assert problems == {}
    assert terms == [WeightedReward(name="valid_json", weight=0.5, args={}),
                     WeightedReward(name="contains", weight=1.0, args={"keywords": ["a"]})]
