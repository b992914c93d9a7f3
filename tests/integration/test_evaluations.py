"""Evaluations scored by a real serve worker (thread pool) over a real Redis, from a tiny model directory: the
value, count, groups and completions the web records are what ``jaxengine.evaluate`` gives for the same model on the
same rows, called directly (the references read from the answer column named; by reward terms, as a GRPO run's); a
failure is said in words on the evaluation."""
from __future__ import annotations

import pytest

from jaxengine import evaluate
from jaxengine.data.pipeline import encode_prompt
from jaxengine.rewards import WeightedReward
from jaxengine.sampler import Sampler, SamplingParams
from tests.factories import build_tiny_model_dir
from tests.live import wait_for
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.evals import services
from webapp.evals.models import Evaluation, EvaluationStatus

pytestmark = pytest.mark.integration

MAX_NEW_TOKENS = 8
PROMPTS = [f"Question {index}: name a colour." for index in range(6)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-evaluated"), seed=0)


def greedy_texts(model_dir) -> list[str]:
    """The tiny model's greedy completions of ``PROMPTS``, as ``evaluate.exact_match`` samples them."""
    model, tokenizer = evaluate.load_for_scoring(model_dir)
    return [generation.text for generation in Sampler(model, tokenizer).generate(
        [encode_prompt(tokenizer, prompt) for prompt in PROMPTS],
        SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=0.0, seed=0))]


def finished(evaluation, workers):
    def ended():
        row = Evaluation.objects.get(pk=evaluation.pk)
        return row if not row.is_active else None
    return wait_for(ended, timeout=240, workers=workers, what=f"evaluation {evaluation.public_id}")


def test_the_serve_worker_scores_exact_match_and_loss_as_the_engine_does(celery_workers, transactional_db, settings,
                                                                         redis_url, model_dir):
    settings.REDIS_URL = redis_url
    celery_workers.ensure("serve")
    team = make_team()
    model = make_base_model(team.project, name="tiny", path=str(model_dir))
    # Rows of the "kept" task answer with the model's own completion, the others with what it never says: the
    # groups come out 1 and 0 where the model completes with any text.
    texts = greedy_texts(model_dir)
    rows = [{"prompt": prompt, "answer": text if index % 2 == 0 else "never said", "task": ("kept", "other")[index % 2]}
            for index, (prompt, text) in enumerate(zip(PROMPTS, texts))]
    prompts = make_ready_version(team.project, name="colours", kind="prompts", rows=rows, user=team.owner)
    sft_rows = [{"prompt": prompt, "completion": f"Colour {index}."} for index, prompt in enumerate(PROMPTS)]
    chats = make_ready_version(team.project, name="chats", kind="sft", rows=sft_rows, user=team.owner)

    exact = services.evaluation_create(
        project=team.project, model_ref=model.public_id, version=prompts, user=team.teammate,
        settings=services.EvaluationSettings(row_limit=6, max_new_tokens=MAX_NEW_TOKENS, group_by="task"))
    loss = services.evaluation_create(project=team.project, model_ref=model.public_id, version=chats,
                                      settings=services.EvaluationSettings(row_limit=4), user=team.teammate)
    # The same references under another column, named as jaxengine eval's --answer-column names it.
    solved_rows = [{"prompt": row["prompt"], "solution": row["answer"], "task": row["task"]} for row in rows]
    solved = make_ready_version(team.project, name="solved", kind="prompts", rows=solved_rows, user=team.owner)
    by_column = services.evaluation_create(
        project=team.project, model_ref=model.public_id, version=solved, user=team.teammate,
        settings=services.EvaluationSettings(row_limit=6, max_new_tokens=MAX_NEW_TOKENS, group_by="task",
                                             answer_column="solution"))

    # The same completions scored by GRPO reward terms: exact_match (the kept rows' references are the completions)
    # weighted 2, and a length target.
    terms = [{"name": "exact_match", "weight": 2}, {"name": "length_target", "args": {"target": 10}}]
    by_rewards = services.evaluation_create(
        project=team.project, model_ref=model.public_id, version=prompts, user=team.teammate,
        settings=services.EvaluationSettings(row_limit=6, max_new_tokens=MAX_NEW_TOKENS, group_by="task",
                                             reward_terms=terms))

    exact, loss = finished(exact, celery_workers), finished(loss, celery_workers)
    by_column = finished(by_column, celery_workers)
    by_rewards = finished(by_rewards, celery_workers)
    assert exact.status == EvaluationStatus.SUCCEEDED, exact.error
    loaded, tokenizer = evaluate.load_for_scoring(model_dir)
    direct = evaluate.exact_match(loaded, tokenizer, rows, max_new_tokens=MAX_NEW_TOKENS, by="task")
    assert exact.result == direct
    assert direct["groups"]["other"]["value"] == 0.0
    assert direct["groups"]["kept"] == {"value": 1.0, "count": 3}, texts
    assert exact.started_at is not None and exact.finished_at >= exact.started_at
    assert by_column.status == EvaluationStatus.SUCCEEDED, by_column.error
    assert by_column.result == direct
    assert by_rewards.status == EvaluationStatus.SUCCEEDED, by_rewards.error
    weighted = [WeightedReward(name="exact_match", weight=2.0, args={}),
                WeightedReward(name="length_target", weight=1.0, args={"target": 10})]
    assert by_rewards.result == evaluate.reward_scores(loaded, tokenizer, rows, weighted,
                                                       max_new_tokens=MAX_NEW_TOKENS, by="task")
    lengths = [max(0.0, 1 - abs(len(text) - 10) / 10) for text in texts]
    assert by_rewards.result["groups"]["kept"]["terms"]["exact_match"] == 1.0
    assert by_rewards.result["groups"]["other"]["terms"]["exact_match"] == 0.0
    assert by_rewards.result["value"] == pytest.approx((2 * 3 + sum(lengths)) / 6, abs=1e-5)

    assert loss.status == EvaluationStatus.SUCCEEDED, loss.error
    direct_loss = evaluate.mean_loss(loaded, tokenizer, sft_rows[:4])
    assert loss.result["count"] == direct_loss["count"] == 4
    assert loss.result["value"] == pytest.approx(direct_loss["value"], rel=1e-6)


def test_a_model_deleted_from_disk_fails_the_evaluation_in_words(celery_workers, transactional_db, settings,
                                                                  redis_url, tmp_path):
    settings.REDIS_URL = redis_url
    celery_workers.ensure("serve")
    team = make_team(slug="beta")
    model_dir = build_tiny_model_dir(tmp_path / "doomed", seed=1)
    model = make_base_model(team.project, name="doomed", path=str(model_dir))
    chats = make_ready_version(team.project, name="chats", kind="sft", user=team.owner)
    # Before the evaluation is queued: the serve worker takes it on commit, and could load the model before the
    # weights went (the serve cache, warm from the test before, loads it within a second).
    for weights in model_dir.glob("*.safetensors"):
        weights.unlink()
    evaluation = services.evaluation_create(project=team.project, model_ref=model.public_id, version=chats,
                                            settings=services.EvaluationSettings(row_limit=2), user=team.owner)
    evaluation = finished(evaluation, celery_workers)
    assert evaluation.status == EvaluationStatus.FAILED
    assert evaluation.error.startswith("the evaluation failed: ") and "Traceback" not in evaluation.error
