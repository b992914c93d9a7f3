"""Evaluations generate through the serve worker's model cache and batching server (``worker.tasks.evals``), by the
slice loop review campaigns share (``worker.tasks.answers.answers_in_slices``), in this process with a tiny model:
the figures are ``jaxengine.evaluate``'s on the same rows, progress is recorded after each slice, a cancel stops the
generation at the next slice, and a slice past its deadline fails the evaluation naming the model, the row and what
to do."""
import pytest

from jaxengine import evaluate
from jaxengine.rewards import WeightedReward
from jaxengine.sampler import Sampler
from jaxengine.serving import BatchDecoder, BatchingServer, ServeRequest, load_serving_model
from tests import factories
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.celery import app as celery_app
from webapp.chat.selectors import model_choice
from webapp.evals import services
from webapp.evals.models import Evaluation, EvaluationStatus
from worker.tasks import evals, serve
from worker.tasks.answers import GenerationError, GenerationStopped, answers_in_slices
from worker.tasks.serve import server_for

MAX_NEW_TOKENS = 6
PROMPTS = [f"Question {index}: name a colour." for index in range(5)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-evalserve"), seed=0)


@pytest.fixture(scope="module")
def scoring(model_dir):
    """The model and tokenizer as ``jaxengine eval`` scores them."""
    return evaluate.load_for_scoring(model_dir)


@pytest.fixture(scope="module")
def small_server(model_dir):
    """A batching server of two rows a batch on the tiny model: five prompts take three slices."""
    loaded = load_serving_model(model_dir)
    server = BatchingServer(BatchDecoder(loaded.model, loaded.tokenizer), max_batch=2)
    yield server, loaded.tokenizer
    server.close()


def greedy_requests(tokenizer) -> list[ServeRequest]:
    params = evaluate.greedy_params(MAX_NEW_TOKENS)
    return [ServeRequest(prompt_ids=tuple(evaluate.greedy_prompt(tokenizer, {"prompt": prompt})), params=params)
            for prompt in PROMPTS]


def one_at_a_time(scoring) -> list[str]:
    model, tokenizer = scoring
    sampler = Sampler(model, tokenizer)
    return [sampler.generate([evaluate.greedy_prompt(tokenizer, {"prompt": prompt})],
                             evaluate.greedy_params(MAX_NEW_TOKENS))[0].text for prompt in PROMPTS]


def test_the_slices_answer_every_request_and_report_after_each(small_server, scoring):
    server, tokenizer = small_server
    progress = []
    texts = answers_in_slices(server, greedy_requests(tokenizer), timeout=600,
                              on_progress=lambda done: progress.append(done) or True, cut_answer=str)
    assert progress == [2, 4, 5]
    assert texts == one_at_a_time(scoring), "batched greedy differs from one-at-a-time greedy"


def test_the_slices_stop_when_told_and_submit_no_more(small_server, monkeypatch):
    server, tokenizer = small_server
    submitted = []
    submit = server.submit
    monkeypatch.setattr(server, "submit", lambda request, **kwargs: (submitted.append(request), submit(request))[1])
    with pytest.raises(GenerationStopped):
        answers_in_slices(server, greedy_requests(tokenizer), timeout=600, on_progress=lambda done: False,
                          cut_answer=str)
    assert len(submitted) == 2, "the rows after the first slice were submitted"


def test_an_answer_past_its_slices_deadline_is_an_error_naming_its_row(small_server):
    server, tokenizer = small_server
    # 0: the deadline has passed when the server first looks at the request, whatever this machine's speed.
    with pytest.raises(GenerationError) as cut:
        answers_in_slices(server, greedy_requests(tokenizer), timeout=0, on_progress=lambda done: True,
                          cut_answer=lambda index: f"row {index + 1} was cut")
    assert str(cut.value) == "row 1 was cut"


@pytest.fixture
def evaluate_on(db, model_dir, monkeypatch):
    """``evaluate_on(rows, **settings)``: an evaluation of the tiny model on a prompts version of ``rows`` (or an sft
    one), queued and not sent; ``run`` it with ``evals.run_evaluation`` in this process."""
    monkeypatch.setattr(celery_app, "send_task", lambda *args, **kwargs: None)
    team = make_team()
    model = make_base_model(team.project, name="tiny", path=str(model_dir))

    def evaluate_on(rows, *, kind="prompts", **settings) -> Evaluation:
        version = make_ready_version(team.project, name=f"rows-{Evaluation.objects.count()}", kind=kind, rows=rows,
                                     user=team.owner)
        return services.evaluation_create(project=team.project, model_ref=model.public_id, version=version,
                                          settings=services.EvaluationSettings(**settings), user=team.teammate)

    return evaluate_on


def prompt_rows(scoring) -> list[dict]:
    """Rows whose even ones' references are the model's own greedy completions, so that both groups score."""
    texts = one_at_a_time(scoring)
    return [{"prompt": prompt, "answer": text if index % 2 == 0 else "never said", "task": ("kept", "other")[index % 2]}
            for index, (prompt, text) in enumerate(zip(PROMPTS, texts))]


def test_exact_match_rewards_and_loss_are_the_engines_figures(evaluate_on, scoring, monkeypatch):
    model, tokenizer = scoring
    monkeypatch.setattr(evaluate, "load_for_scoring", lambda *args, **kwargs: pytest.fail(
        "the evaluation loaded a copy of its own beside the serve worker's cache"))
    rows = prompt_rows(scoring)
    exact = evaluate_on(rows, row_limit=5, max_new_tokens=MAX_NEW_TOKENS, group_by="task")
    terms = [{"name": "exact_match", "weight": 2}, {"name": "length_target", "args": {"target": 10}}]
    rewards = evaluate_on(rows, row_limit=5, max_new_tokens=MAX_NEW_TOKENS, reward_terms=terms)
    sft_rows = [{"prompt": prompt, "completion": f"Colour {index}."} for index, prompt in enumerate(PROMPTS)]
    loss = evaluate_on(sft_rows, kind="sft", row_limit=4)
    for evaluation in (exact, rewards, loss):
        evals.run_evaluation(evaluation.pk)
        evaluation.refresh_from_db()
        assert evaluation.status == EvaluationStatus.SUCCEEDED, evaluation.error
    assert model_choice(project=exact.project, ref=exact.model_ref).cache_key in serve._cache.keys, (
        "not loaded under the chat's key")
    assert exact.result == evaluate.exact_match(model, tokenizer, rows, max_new_tokens=MAX_NEW_TOKENS, by="task")
    assert exact.result["groups"]["kept"] == {"value": 1.0, "count": 3}
    assert (exact.rows_done, exact.rows_total) == (5, 5)
    weighted = [WeightedReward(name="exact_match", weight=2.0, args={}),
                WeightedReward(name="length_target", weight=1.0, args={"target": 10})]
    assert rewards.result == evaluate.reward_scores(model, tokenizer, rows, weighted, max_new_tokens=MAX_NEW_TOKENS)
    direct_loss = evaluate.mean_loss(model, tokenizer, sft_rows[:4])
    assert loss.result["count"] == direct_loss["count"] == 4
    assert loss.result["value"] == pytest.approx(direct_loss["value"], rel=1e-6)


def served(evaluation: Evaluation):
    """The serve worker's batching server for ``evaluation``'s model, as the task gets it."""
    choice = model_choice(project=evaluation.project, ref=evaluation.model_ref)
    return server_for(choice.cache_key, choice.path)[0]


def test_a_cancel_stops_the_generation_at_the_next_slice(evaluate_on, scoring, monkeypatch):
    """QA: a cancel only dropped the result once every row was generated, the serve worker held meanwhile. The
    worker reads the cancel when it records the first slice's rows, and asks for no more."""
    evaluation = evaluate_on(prompt_rows(scoring), row_limit=5, max_new_tokens=MAX_NEW_TOKENS)
    monkeypatch.setattr(served(evaluation), "max_batch", 2)
    recorded = []
    record = services.evaluation_progress

    def cancel_after_the_first_slice(**kwargs):
        if kwargs["rows_done"] == 2:
            services.evaluation_cancel(evaluation=evaluation, user=evaluation.created_by)
        recorded.append(kwargs["rows_done"])
        return record(**kwargs)

    monkeypatch.setattr(services, "evaluation_progress", cancel_after_the_first_slice)
    evals.run_evaluation(evaluation.pk)
    assert recorded == [0, 2], "rows were generated after the cancel"
    evaluation.refresh_from_db()
    assert evaluation.status == EvaluationStatus.CANCELLED and evaluation.result == {}
    assert (evaluation.rows_done, evaluation.rows_total) == (0, 5), "a cancelled evaluation's count is not moved"


def test_progress_is_recorded_after_each_slice(evaluate_on, scoring, monkeypatch):
    evaluation = evaluate_on(prompt_rows(scoring), row_limit=5, max_new_tokens=MAX_NEW_TOKENS)
    monkeypatch.setattr(served(evaluation), "max_batch", 2)
    seen = []
    record = services.evaluation_progress
    monkeypatch.setattr(services, "evaluation_progress", lambda **kwargs: (record(**kwargs), seen.append(
        Evaluation.objects.values_list("rows_done", "rows_total").get(pk=evaluation.pk)))[0])
    evals.run_evaluation(evaluation.pk)
    assert seen == [(0, 5), (2, 5), (4, 5), (5, 5)]
    evaluation.refresh_from_db()
    assert evaluation.status == EvaluationStatus.SUCCEEDED, evaluation.error


def test_a_slice_past_its_deadline_fails_the_evaluation_saying_what_to_do(evaluate_on, scoring, settings):
    settings.TEMPER_EVAL_ANSWER_TIMEOUT_SECONDS = 0
    evaluation = evaluate_on(prompt_rows(scoring), row_limit=5, max_new_tokens=MAX_NEW_TOKENS)
    evals.run_evaluation(evaluation.pk)
    evaluation.refresh_from_db()
    assert evaluation.status == EvaluationStatus.FAILED and evaluation.result == {}
    assert evaluation.error == (
        f"Base model: tiny took longer than 0 s (TEMPER_EVAL_ANSWER_TIMEOUT_SECONDS) to complete row 1 of "
        f"{evaluation.version_label}, and its completion was cut; evaluate fewer rows or fewer new tokens, or a "
        "smaller model, or give the serve worker a larger TEMPER_EVAL_ANSWER_TIMEOUT_SECONDS")


def test_a_row_the_model_cannot_take_fails_the_evaluation_naming_it(evaluate_on, scoring):
    evaluation = evaluate_on(prompt_rows(scoring), row_limit=5, max_new_tokens=1000)  # the tiny context is 256
    evals.run_evaluation(evaluation.pk)
    evaluation.refresh_from_db()
    assert evaluation.status == EvaluationStatus.FAILED
    assert evaluation.error.startswith(f"Base model: tiny cannot complete row 1 of {evaluation.version_label}: ")
    assert "context length (256)" in evaluation.error
