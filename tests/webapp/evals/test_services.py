"""Creating an evaluation: everything checked before a row is saved, each refusal naming its field; queued on the
serve queue once committed; cancel, delete, the readers that keep its model and version from deletion."""
import pytest
from django.core.exceptions import ValidationError

from tests.webapp.evals.conftest import create
from tests.webapp.factories import make_base_model, make_ready_version
from webapp.activity.models import Activity, Verb
from webapp.basemodels.selectors import base_model_readers
from webapp.datasets.models import VersionStatus
from webapp.datasets.selectors import version_readers
from webapp.evals import selectors, services
from webapp.evals.models import Evaluation, EvaluationStatus, Metric
from webapp.projects.selectors import project_readers


def test_it_queues_an_exact_match_evaluation_on_the_serve_queue(team, base_model, prompts_version, sent_tasks,
                                                                django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        evaluation = create(team, base_model, prompts_version, row_limit=4, max_new_tokens=8, group_by="task")
    assert evaluation.public_id.startswith("ev_")
    assert (evaluation.status, evaluation.metric, evaluation.row_limit, evaluation.group_by) == (
        EvaluationStatus.QUEUED, Metric.EXACT_MATCH, 4, "task")
    assert evaluation.model_label == "Base model: falcon" and evaluation.version_label == str(prompts_version)
    assert sent_tasks == [(services.EVALUATION_TASK, [evaluation.pk], "serve")]
    assert Activity.objects.filter(verb=Verb.EVALUATION_LAUNCHED, target_id=evaluation.public_id).exists()


def test_an_sft_version_is_scored_by_loss(team, base_model, sft_version):
    assert create(team, base_model, sft_version).metric == Metric.LOSS


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"model_ref": "bm_nosuchmodel"}, "model", "is not a model of alpha"),
    ({"row_limit": 0}, "row_limit", "rows must be 1 to"),
    ({"max_new_tokens": 5000}, "max_new_tokens", "max new tokens must be 1 to 1024"),
    ({"group_by": "colour"}, "group_by", "row 1 of sums v1 has no 'colour' value"),
])
def test_it_rejects_bad_input_naming_the_field(team, base_model, prompts_version, sent_tasks, change, field, words):
    arguments = {"model_ref": base_model.public_id, "row_limit": 6, "max_new_tokens": 8, "group_by": ""} | change
    with pytest.raises(ValidationError) as refused:
        services.evaluation_create(
            project=team.project, model_ref=arguments["model_ref"], version=prompts_version,
            settings=services.EvaluationSettings(row_limit=arguments["row_limit"],
                                                 max_new_tokens=arguments["max_new_tokens"],
                                                 group_by=arguments["group_by"]),
            user=team.teammate)
    assert words in " ".join(refused.value.message_dict[field])
    assert not Evaluation.objects.exists() and sent_tasks == []


def test_it_rejects_a_prompts_version_without_answers_naming_the_row(team, base_model, sent_tasks):
    version = make_ready_version(team.project, name="bare", kind="prompts",
                                 rows=[{"prompt": "a", "answer": "b"}, {"prompt": "c"}], user=team.owner)
    with pytest.raises(ValidationError) as refused:
        create(team, base_model, version)
    assert "row 2 of bare v1 has no 'answer' text" in refused.value.message_dict["answer_column"][0]
    assert not Evaluation.objects.exists()


def test_an_answer_column_names_where_the_references_are(team, base_model, sent_tasks):
    """As ``jaxengine eval --answer-column``: the references read from that column, scored as ``answer``; a column
    the rows lack, or one named for an sft version, is refused on the field, nothing saved."""
    version = make_ready_version(team.project, name="solved", kind="prompts", user=team.owner,
                                 rows=[{"prompt": "1 + 1?", "solution": "2"}, {"prompt": "2 + 2?", "solution": "4"}])
    evaluation = create(team, base_model, version, answer_column="solution")
    assert evaluation.answer_column == "solution"
    rows = services.version_rows(version=version, metric=Metric.EXACT_MATCH, row_limit=5,
                                 answer_column=evaluation.answer_column)
    assert [row["answer"] for row in rows] == ["2", "4"]
    sft = make_ready_version(team.project, name="chats", kind="sft", user=team.owner)
    for target, column, words in ((version, "answer", "row 1 of solved v1 has no 'answer' text (its columns: "
                                                      "prompt, solution)"),
                                  (version, "reply", "row 1 of solved v1 has no 'reply' text"),
                                  (sft, "solution", "for exact match (a prompts dataset) only")):
        with pytest.raises(ValidationError) as refused:
            create(team, base_model, target, answer_column=column)
        assert words in refused.value.message_dict["answer_column"][0]
    with pytest.raises(ValidationError) as refused:
        services.EvaluationSettings(answer_column="")
    assert "name the column of reference answers" in refused.value.message_dict["answer_column"][0]
    assert Evaluation.objects.count() == 1


def test_it_rejects_a_version_of_another_project_or_not_ready_or_of_another_kind(team, base_model):
    elsewhere = make_ready_version(team.outsider_project, name="theirs", kind="prompts",
                                   rows=[{"prompt": "a", "answer": "b"}])
    pairs = make_ready_version(team.project, name="pairs", kind="preference",
                               rows=[{"prompt": "a", "chosen": "b", "rejected": "c"}])
    checking = make_ready_version(team.project, name="new", kind="sft")
    checking.status = VersionStatus.VALIDATING
    checking.save()
    # A version that failed its check never becomes ready: not told to wait for it.
    failed = make_ready_version(team.project, name="broken", kind="sft")
    failed.status = VersionStatus.FAILED
    failed.save()
    for version, words in ((elsewhere, "choose a dataset version of this project"),
                           (pairs, "is a preference dataset"), (checking, "choose it once it is ready"),
                           (failed, "broken v1 failed its check; it will not be scored: upload the file corrected as "
                                    "a new version of broken and evaluate on that")):
        with pytest.raises(ValidationError) as refused:
            create(team, base_model, version)
        assert words in refused.value.message_dict["dataset_version"][0]
    assert not Evaluation.objects.exists()


def test_group_by_is_for_exact_match_only(team, base_model, sft_version):
    with pytest.raises(ValidationError) as refused:
        create(team, base_model, sft_version, group_by="task")
    assert "exact match" in refused.value.message_dict["group_by"][0]


def test_a_model_of_another_project_is_no_model(team, prompts_version):
    theirs = make_base_model(team.outsider_project, name="theirs", path="/models/theirs")
    with pytest.raises(ValidationError) as refused:
        create(team, theirs, prompts_version)
    assert "is not a model of alpha" in refused.value.message_dict["model"][0]


def test_a_queued_evaluation_keeps_its_model_version_and_project_until_it_ends(team, base_model, prompts_version):
    evaluation = create(team, base_model, prompts_version)
    for readers in (base_model_readers(base_model=base_model), version_readers(versions=[prompts_version]),
                    project_readers(project=team.project)):
        assert any(evaluation.public_id in sentence for sentence in readers), readers
    services.evaluation_cancel(evaluation=evaluation, user=team.owner)
    assert base_model_readers(base_model=base_model) == []
    assert version_readers(versions=[prompts_version]) == []
    assert Activity.objects.filter(verb=Verb.EVALUATION_CANCELLED, target_id=evaluation.public_id).exists()


def test_cancel_drops_the_workers_result_and_is_refused_once_ended(team, base_model, prompts_version):
    evaluation = create(team, base_model, prompts_version)
    assert services.evaluation_start(evaluation_id=evaluation.pk) is not None
    services.evaluation_cancel(evaluation=evaluation, user=team.teammate)
    assert services.evaluation_start(evaluation_id=evaluation.pk) is None  # a message still queued does nothing
    assert not services.evaluation_finish(evaluation_id=evaluation.pk, result={"metric": "exact_match", "value": 1})
    evaluation.refresh_from_db()
    assert evaluation.status == EvaluationStatus.CANCELLED and evaluation.result == {}
    with pytest.raises(ValidationError, match="nothing to cancel"):
        services.evaluation_cancel(evaluation=evaluation, user=team.teammate)


def test_delete_is_refused_while_queued(team, base_model, prompts_version):
    evaluation = create(team, base_model, prompts_version)
    with pytest.raises(ValidationError, match="cancel it first"):
        services.evaluation_delete(evaluation=evaluation, user=team.owner)
    services.evaluation_cancel(evaluation=evaluation, user=team.owner)
    services.evaluation_delete(evaluation=evaluation, user=team.owner)
    assert not Evaluation.objects.exists()
    assert Activity.objects.filter(verb=Verb.EVALUATION_DELETED, target_id=evaluation.public_id).exists()


def finished(evaluation, value, count=6):
    services.evaluation_start(evaluation_id=evaluation.pk)
    services.evaluation_finish(evaluation_id=evaluation.pk, result={"metric": evaluation.metric, "value": value,
                                                                    "count": count, "examples": []})
    return Evaluation.objects.get(pk=evaluation.pk)


def test_models_on_the_same_rows_stand_side_by_side_best_first(team, base_model, prompts_version, sft_version):
    other = make_base_model(team.project, name="heron", path="/models/heron")
    older = finished(create(team, base_model, prompts_version), 0.1)
    falcon = finished(create(team, base_model, prompts_version), 0.5)
    heron = finished(create(team, other, prompts_version), 0.75)
    fewer_rows = finished(create(team, other, prompts_version, row_limit=3), 1.0, count=3)
    shorter = finished(create(team, base_model, prompts_version, max_new_tokens=4), 0.25)  # completions cut short
    losses = [finished(create(team, model, sft_version), value) for model, value in ((base_model, 2.0), (other, 1.5))]
    tables = selectors.comparison_tables(evaluations=list(selectors.evaluation_list(project=team.project)))
    rows = {(table.version_label, table.metric, table.row_limit, table.max_new_tokens):
            [evaluation.pk for evaluation in table.evaluations] for table in tables}
    assert rows == {
        ("sums v1", "exact_match", 200, 32): [heron.pk, falcon.pk],  # the newest of each model, higher first
        ("sums v1", "exact_match", 3, 32): [fewer_rows.pk],
        ("sums v1", "exact_match", 200, 4): [shorter.pk],
        ("chats v1", "loss", 200, None): [losses[1].pk, losses[0].pk],  # lower first; no tokens generated
    }
    assert older.pk not in rows[("sums v1", "exact_match", 200, 32)]


def test_exact_match_against_another_answer_column_is_another_figure_and_loss_ignores_generation_settings():
    def key(**fields):
        return selectors.comparison_key(Evaluation(version_label="sums v1", row_limit=200, **fields))

    assert key(metric="exact_match", max_new_tokens=32, answer_column="answer") != key(
        metric="exact_match", max_new_tokens=32, answer_column="gold")
    assert key(metric="rewards", max_new_tokens=32, reward_terms=[{"name": "contains"}], answer_column="answer") == key(
        metric="rewards", max_new_tokens=32, reward_terms=[{"name": "contains"}], answer_column="gold")  # each term names its column
    assert key(metric="loss", max_new_tokens=32) == key(metric="loss", max_new_tokens=8)


TERMS = [{"name": "contains", "weight": 2, "args": {"keywords": ["4"]}}, {"name": "numeric_match"}]
# As stored: each term's weight and arguments written out, so that the same terms written otherwise compare equal.
STORED = [{"name": "contains", "weight": 2.0, "args": {"keywords": ["4"]}},
          {"name": "numeric_match", "weight": 1.0, "args": {}}]


def test_a_prompts_version_is_scored_by_reward_functions_when_given(team, base_model, prompts_version, sent_tasks,
                                                                    django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        evaluation = create(team, base_model, prompts_version, group_by="task", reward_terms=TERMS)
    assert (evaluation.metric, evaluation.reward_terms, evaluation.group_by) == (Metric.REWARDS, STORED, "task")
    assert sent_tasks == [(services.EVALUATION_TASK, [evaluation.pk], "serve")]
    assert create(team, base_model, prompts_version).reward_terms == []  # exact match: none


@pytest.mark.parametrize(("terms", "field", "words"), [
    ([], "reward_terms", "give a list of reward functions"),
    ([{"name": "nope"}], "reward_terms.0.name", "'nope' is not a reward function"),
    ([{"name": "valid_json"}, {"name": "format_regex"}], "reward_terms.1.args.pattern",
     "required argument missing: pattern"),
    ([{"name": "contains", "weight": "heavy", "args": {"keywords": ["a"]}}], "reward_terms.0.weight", "valid number"),
    ([{"name": "valid_json"}, {"name": "valid_json"}], "reward_terms", "valid_json is given twice"),
    ([{"name": "numeric_match", "args": {"answer_column": "colour"}}], "reward_terms.0.args.answer_column",
     "sums v1: row 1 has no 'colour' value, where numeric_match reads the reference answer"),
    ([{"name": "exact_match", "args": {"answer_column": "task"}}, {"name": "numeric_match",
                                                                   "args": {"answer_column": "task"}}],
     "reward_terms.1.args.answer_column", "numeric_match cannot score row 1: reference task='count' is not a number"),
    ([{"name": "reward_model", "args": {"model": "run_nosuchrun"}}], "reward_terms.0.args.model",
     "'run_nosuchrun' is not a run of alpha"),
    ([{"name": "reward_model", "args": {"model": "/srv/models/judge"}}], "reward_terms.0.args.model",
     "choose a succeeded reward run of this project"),
])
def test_it_rejects_reward_terms_the_spec_would_naming_the_term_and_key(team, base_model, prompts_version, sent_tasks,
                                                                        terms, field, words):
    with pytest.raises(ValidationError) as refused:
        create(team, base_model, prompts_version, reward_terms=terms)
    assert words in " ".join(refused.value.message_dict[field])
    assert not Evaluation.objects.exists() and sent_tasks == []


def test_reward_functions_are_refused_for_an_sft_version_and_with_an_answer_column(team, base_model, sft_version,
                                                                                   prompts_version, sent_tasks):
    with pytest.raises(ValidationError) as refused:
        create(team, base_model, sft_version, reward_terms=TERMS)
    assert "chats v1 is an sft dataset, scored by loss" in refused.value.message_dict["reward_terms"][0]
    with pytest.raises(ValidationError) as refused:
        create(team, base_model, prompts_version, reward_terms=TERMS, answer_column="task")
    assert "each reward function reads the column of its args.answer_column" in (
        refused.value.message_dict["answer_column"][0])
    assert not Evaluation.objects.exists() and sent_tasks == []


def test_evaluations_by_reward_functions_stand_side_by_side_only_with_the_same_terms(team, base_model,
                                                                                     prompts_version):
    other = make_base_model(team.project, name="heron", path="/models/heron")
    falcon = finished(create(team, base_model, prompts_version, reward_terms=TERMS), 1.5)
    heron = finished(create(team, other, prompts_version, reward_terms=STORED), 2.5)  # the same terms
    reweighted = [{**TERMS[0], "weight": 1.0}, TERMS[1]]
    other_weights = finished(create(team, other, prompts_version, reward_terms=reweighted), 0.5)
    exact = finished(create(team, other, prompts_version), 0.25)
    tables = selectors.comparison_tables(evaluations=list(selectors.evaluation_list(project=team.project)))
    assert sorted([evaluation.pk for evaluation in table.evaluations] for table in tables) == sorted(
        [[heron.pk, falcon.pk], [other_weights.pk], [exact.pk]])
    rewards_table = next(table for table in tables if falcon in table.evaluations)
    assert rewards_table.higher_is_better and rewards_table.reward_terms == STORED
