"""``evaluation.succeeded`` and ``evaluation.failed``, end to end against a real HTTP server: an evaluation that the
serve worker scored, or could not, tells the hooks subscribed to that end once (a redelivered end, a cancelled
evaluation's late result, another project's hooks: nothing); the Webhooks page and the OpenAPI document offer them."""
from __future__ import annotations

from tests.webapp.evals.conftest import PROMPT_ROWS
from tests.webapp.factories import make_base_model, make_ready_version
from tests.webapp.webhooks.conftest import SITE, hook
from webapp.evals import services
from webapp.webhooks.models import EVENT_GROUPS


def queued(team, count: int):
    """``count`` evaluations of one base model on one prompts version, and that version."""
    base_model = make_base_model(team.project, name="<b>falcon</b>", path="/models/falcon")
    version = make_ready_version(team.project, name="sums", kind="prompts", rows=PROMPT_ROWS, user=team.owner)
    return [services.evaluation_create(project=team.project, model_ref=base_model.public_id, version=version,
                                       settings=services.EvaluationSettings(row_limit=6), user=team.owner)
            for _ in range(count)], version


def test_an_evaluation_ending_tells_the_hooks_subscribed_to_that_end_once(
        team, receiver, sent, django_capture_on_commit_callbacks):
    hook(team.project, receiver, "/succeeded", ["evaluation.succeeded"])
    hook(team.project, receiver, "/failed", ["evaluation.failed"])
    hook(team.project, receiver, "/slack", ["evaluation.succeeded"], format="slack")
    hook(team.outsider_project, receiver, "/elsewhere", ["evaluation.succeeded", "evaluation.failed"])
    (scored, broken, cancelled), version = queued(team, 3)
    result = {"metric": "exact_match", "value": 0.5, "count": 6, "examples": []}
    with django_capture_on_commit_callbacks(execute=True):
        for evaluation in (scored, broken, cancelled):
            services.evaluation_start(evaluation_id=evaluation.pk)
        assert services.evaluation_finish(evaluation_id=scored.pk, result=result)
        assert services.evaluation_fail(evaluation_id=broken.pk, reason="<b>falcon</b> cannot be loaded")
        services.evaluation_cancel(evaluation=cancelled, user=team.owner)
    with django_capture_on_commit_callbacks(execute=True):  # the worker's ends delivered again, a late result
        assert not services.evaluation_finish(evaluation_id=scored.pk, result=result)
        assert not services.evaluation_fail(evaluation_id=broken.pk, reason="again")
        assert not services.evaluation_finish(evaluation_id=cancelled.pk, result=result)

    assert sorted(received.path for received in receiver.requests) == ["/failed", "/slack", "/succeeded"]
    (succeeded,) = receiver.at("/succeeded")
    assert succeeded.headers["X-Temper-Event"] == "evaluation.succeeded"
    assert succeeded.json["object"] == {
        "type": "evaluation", "id": scored.public_id, "name": "Base model: <b>falcon</b> on sums v1",
        "status": "succeeded", "model": scored.model_ref, "dataset_version": version.public_id,
        "metric": "exact_match", "reward_terms": [], "value": 0.5, "count": 6,
        "url": f"{SITE}/p/alpha/evaluations/{scored.public_id}/", "error": ""}
    (failed,) = receiver.at("/failed")
    assert (failed.json["event"], failed.json["object"]["id"], failed.json["object"]["status"]) == (
        "evaluation.failed", broken.public_id, "failed")
    assert (failed.json["object"]["value"], failed.json["object"]["error"]) == (None, "<b>falcon</b> cannot be loaded")
    (slack,) = receiver.at("/slack")
    assert slack.json == {"text": f"[alpha] Evaluation <{SITE}/p/alpha/evaluations/{scored.public_id}/|Base model: "
                                  "&lt;b&gt;falcon&lt;/b&gt; on sums v1> succeeded: exact match 0.5000"}


def test_the_webhooks_page_and_the_openapi_document_offer_them(team, client_for, client):
    assert set(EVENT_GROUPS["Evaluations"]) == {"evaluation.succeeded", "evaluation.failed"}
    page = client_for(team.owner).get("/p/alpha/webhooks/").content.decode()
    assert 'value="evaluation.succeeded"' in page and 'value="evaluation.failed"' in page
    assert "an evaluation succeeds or fails" in page
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert {"evaluation.succeeded", "evaluation.failed"} <= set(
        schemas["WebhookCreate"]["properties"]["events"]["items"]["enum"])


def test_an_evaluation_by_reward_functions_tells_its_terms(team, receiver, sent, django_capture_on_commit_callbacks):
    hook(team.project, receiver, "/succeeded", ["evaluation.succeeded"])
    hook(team.project, receiver, "/slack", ["evaluation.succeeded"], format="slack")
    base_model = make_base_model(team.project, name="falcon", path="/models/falcon")
    version = make_ready_version(team.project, name="sums", kind="prompts", rows=PROMPT_ROWS, user=team.owner)
    terms = [{"name": "contains", "weight": 2.0, "args": {"keywords": ["4"]}},
             {"name": "numeric_match", "weight": 1.0, "args": {}}]
    evaluation = services.evaluation_create(project=team.project, model_ref=base_model.public_id, version=version,
                                            settings=services.EvaluationSettings(reward_terms=terms), user=team.owner)
    with django_capture_on_commit_callbacks(execute=True):
        services.evaluation_start(evaluation_id=evaluation.pk)
        services.evaluation_finish(evaluation_id=evaluation.pk, result={"metric": "rewards", "value": 1.5, "count": 6,
                                                                        "terms": {"contains": 0.75}, "examples": []})
    (succeeded,) = receiver.at("/succeeded")
    assert (succeeded.json["object"]["metric"], succeeded.json["object"]["reward_terms"],
            succeeded.json["object"]["value"]) == ("rewards", terms, 1.5)
    (slack,) = receiver.at("/slack")  # what the figure is: not "rewards 1.5000", read as a count
    assert slack.json["text"].endswith("on sums v1> succeeded: mean reward 1.500 (2 functions)")
