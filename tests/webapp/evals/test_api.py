"""Evaluations through the REST API: what the pages do, by the same services and with the same refusals; every
answer is what the OpenAPI document says (strict)."""
import json

from django.test import Client
from pydantic import TypeAdapter

from tests.webapp.factories import make_ready_version
from webapp.api import schemas
from webapp.api.services import token_create
from webapp.evals import services
from webapp.evals.models import Evaluation, EvaluationStatus
from webapp.runs.models import Run, RunStatus

from .test_run_evaluations import a_run

BASE = "/api/v1/projects/alpha/evaluations/"


def api(user):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=user, name='test')[1]}")

    def call(method, path, body=None):
        response = getattr(client, method.lower())(path, json.dumps(body) if body is not None else None,
                                                   content_type="application/json")
        return response.status_code, response.json() if response.content else None
    return call


def valid(schema: str, body) -> None:
    TypeAdapter(getattr(schemas, schema)).validate_json(json.dumps(body))


def test_a_member_queues_reads_cancels_and_deletes_one(team, base_model, prompts_version, sent_tasks,
                                                       django_capture_on_commit_callbacks):
    member = api(team.teammate)
    with django_capture_on_commit_callbacks(execute=True):
        status, made = member("POST", BASE, {"model": base_model.public_id,
                                             "dataset_version": prompts_version.public_id, "row_limit": 4,
                                             "group_by": "task"})
    assert status == 202, made
    valid("EvaluationOut", made)
    assert (made["status"], made["metric"], made["row_limit"], made["max_new_tokens"], made["group_by"]) == (
        "queued", "exact_match", 4, 32, "task")
    assert sent_tasks == [(services.EVALUATION_TASK, [Evaluation.objects.get().pk], "serve")]
    status, listed = api(team.viewer)("GET", BASE)
    assert status == 200 and [one["id"] for one in listed["evaluations"]] == [made["id"]]
    valid("EvaluationList", listed)
    assert member("DELETE", f"{BASE}{made['id']}/")[0] == 409  # queued: cancel first
    status, cancelled = member("POST", f"{BASE}{made['id']}/cancel/")
    assert status == 200 and cancelled["status"] == "cancelled"
    valid("EvaluationOut", cancelled)
    assert member("POST", f"{BASE}{made['id']}/cancel/")[0] == 409
    assert member("DELETE", f"{BASE}{made['id']}/") == (204, None)
    assert not Evaluation.objects.exists()


def test_a_running_evaluation_says_its_rows_scored_so_far(team, base_model, prompts_version, client):
    evaluation = services.evaluation_create(project=team.project, model_ref=base_model.public_id,
                                            version=prompts_version, settings=services.EvaluationSettings(),
                                            user=team.teammate)
    services.evaluation_start(evaluation_id=evaluation.pk)
    services.evaluation_progress(evaluation_id=evaluation.pk, rows_done=4, rows_total=6)
    status, running = api(team.viewer)("GET", f"{BASE}{evaluation.public_id}/")
    assert status == 200 and (running["status"], running["rows_done"], running["rows_total"]) == ("running", 4, 6)
    valid("EvaluationOut", running)
    document = client.get("/api/v1/openapi.json").json()["components"]["schemas"]["EvaluationOut"]
    assert {"rows_done", "rows_total"} <= set(document["required"])
    assert "slice" in document["properties"]["rows_done"]["description"]


def test_it_rejects_bad_input_naming_the_field(team, base_model, prompts_version, sent_tasks):
    member = api(team.teammate)
    theirs = make_ready_version(team.outsider_project, name="theirs", kind="prompts",
                                rows=[{"prompt": "a", "answer": "b"}])
    for body, field in (({"model": base_model.public_id, "dataset_version": theirs.public_id}, "dataset_version"),
                        ({"model": "bm_nope", "dataset_version": prompts_version.public_id}, "model"),
                        ({"model": base_model.public_id, "dataset_version": prompts_version.public_id,
                          "row_limit": 0}, "row_limit"),
                        ({"model": base_model.public_id, "dataset_version": prompts_version.public_id,
                          "row_limit": "4"}, "row_limit"),
                        ({"model": base_model.public_id}, "dataset_version")):
        status, answer = member("POST", BASE, body)
        assert status == 400 and field in answer["errors"], (body, answer)
        valid("FieldErrors", answer)
    assert not Evaluation.objects.exists() and sent_tasks == []


def test_it_reads_the_answer_column_sent_and_names_a_missing_one(team, base_model, sent_tasks):
    version = make_ready_version(team.project, name="solved", kind="prompts",
                                 rows=[{"prompt": "1 + 1?", "solution": "2"}])
    member = api(team.teammate)
    status, answer = member("POST", BASE, {"model": base_model.public_id, "dataset_version": version.public_id})
    assert status == 400 and "row 1 of solved v1 has no 'answer' text" in answer["errors"]["answer_column"][0]
    valid("FieldErrors", answer)
    status, made = member("POST", BASE, {"model": base_model.public_id, "dataset_version": version.public_id,
                                         "answer_column": "solution"})
    assert status == 202 and made["answer_column"] == "solution", made
    valid("EvaluationOut", made)
    assert Evaluation.objects.get().answer_column == "solution"


def test_it_queues_one_by_reward_functions_and_names_a_bad_term(team, base_model, prompts_version, sent_tasks,
                                                               client):
    member = api(team.teammate)
    terms = [{"name": "contains", "weight": 2, "args": {"keywords": ["4"]}}, {"name": "numeric_match"}]
    status, answer = member("POST", BASE, {"model": base_model.public_id, "dataset_version": prompts_version.public_id,
                                           "reward_terms": [terms[0], {"name": "format_regex"}]})
    assert status == 400 and "required argument missing: pattern" in answer["errors"]["reward_terms.1.args.pattern"][0]
    valid("FieldErrors", answer)
    assert not Evaluation.objects.exists()
    status, made = member("POST", BASE, {"model": base_model.public_id, "dataset_version": prompts_version.public_id,
                                         "reward_terms": terms, "group_by": "task"})
    assert status == 202, made
    valid("EvaluationOut", made)
    assert made["metric"] == "rewards" and made["reward_terms"] == [
        {"name": "contains", "weight": 2.0, "args": {"keywords": ["4"]}},
        {"name": "numeric_match", "weight": 1.0, "args": {}}]
    document = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert "rewards" in document["EvaluationOut"]["properties"]["metric"]["enum"]
    assert "reward_terms" in document["EvaluationCreate"]["properties"]
    assert "reward_terms" in document["EvaluationOut"]["required"]


def test_it_requires_access(team, base_model, prompts_version, sent_tasks):
    evaluation = services.evaluation_create(project=team.project, model_ref=base_model.public_id,
                                            version=prompts_version, settings=services.EvaluationSettings(),
                                            user=team.teammate)
    body = {"model": base_model.public_id, "dataset_version": prompts_version.public_id}
    assert api(team.viewer)("POST", BASE, body)[0] == 403
    assert api(team.viewer)("POST", f"{BASE}{evaluation.public_id}/cancel/")[0] == 403
    outsider = api(team.outsider)
    for method, path in (("GET", BASE), ("POST", BASE), ("GET", f"{BASE}{evaluation.public_id}/"),
                         ("DELETE", f"{BASE}{evaluation.public_id}/"),
                         ("POST", f"{BASE}{evaluation.public_id}/cancel/")):
        assert outsider(method, path, body if method == "POST" else None)[0] == 404, (method, path)
    assert Evaluation.objects.get().status == EvaluationStatus.QUEUED


def test_the_list_takes_a_model_and_keeps_it_in_its_next_link(team, prompts_version):
    """``?model=`` as the Evaluations page takes it: a base model's evaluations, or a run's with its checkpoints'."""
    def made(model_ref: str) -> str:
        return Evaluation.objects.create(
            project=team.project, model_ref=model_ref, model_label=model_ref, dataset_version=prompts_version,
            version_label="v", metric="exact_match", row_limit=4, max_new_tokens=8).public_id

    of_run = [made("run_a"), made("run_a:20"), made("run_a:10")]
    made("bm_b"), made("run_ab")  # another model, and a run whose id only begins with the other's
    viewer = api(team.viewer)
    status, first = viewer("GET", f"{BASE}?model=run_a&limit=2")
    assert status == 200, first
    valid("EvaluationList", first)
    status, second = viewer("GET", first["next"].split("testserver", 1)[1])
    assert [one["id"] for one in first["evaluations"] + second["evaluations"]] == of_run[::-1]
    assert second["next"] is None
    assert [one["id"] for one in viewer("GET", f"{BASE}?model=bm_none")[1]["evaluations"]] == []


def test_a_member_evaluates_every_checkpoint_of_a_run(team, prompts_version, tmp_path, sent_tasks, client,
                                                      django_capture_on_commit_callbacks):
    """``{"run": …}`` in place of ``model``: what the page's *Evaluate every checkpoint…* does, answered with the
    evaluations queued and the models skipped, left for another request and not exported, counted; a repeat with the
    same Idempotency-Key is answered with what the first queued and queues nothing."""
    run = a_run(team, tmp_path / "run")
    member = Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=team.teammate, name='test')[1]}")
    body = json.dumps({"run": run.public_id, "dataset_version": prompts_version.public_id, "row_limit": 6,
                       "max_new_tokens": 8})

    def send(key: str):
        with django_capture_on_commit_callbacks(execute=True):
            response = member.post(BASE, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)
        assert response.status_code == 202, response.content
        valid("RunEvaluationsOut", response.json())
        return response

    first = send("every-1")
    made = first.json()
    assert [one["model"] for one in made["evaluations"]] == [f"{run.public_id}:step-10", f"{run.public_id}:step-20",
                                                             run.public_id]
    assert (made["run"], made["skipped"], made["left"], made["not_exported"]) == (run.public_id, 0, 0, 1)
    assert len(sent_tasks) == Evaluation.objects.count() == 3
    replayed = send("every-1")
    assert replayed["Idempotent-Replayed"] == "true" and replayed.json() == made
    assert len(sent_tasks) == Evaluation.objects.count() == 3
    again = send("every-2").json()  # a new request: every model is evaluated so already
    assert (again["evaluations"], again["skipped"]) == ([], 3)
    assert Evaluation.objects.count() == 3
    document = client.get("/api/v1/openapi.json").json()
    assert "run" in document["components"]["schemas"]["EvaluationCreate"]["properties"]
    answers = document["paths"]["/api/v1/projects/{slug}/evaluations/"]["post"]["responses"]["202"]
    assert {"$ref": "#/components/schemas/RunEvaluationsOut"} in answers["content"]["application/json"]["schema"][
        "oneOf"]


def test_every_checkpoint_refusals_name_the_run_and_save_nothing(team, prompts_version, tmp_path, sent_tasks):
    member = api(team.teammate)
    theirs = Run.objects.create(project=team.outsider_project, name="theirs", task="sft", status=RunStatus.SUCCEEDED,
                                spec={}, resolved_spec={}, created_by=team.outsider)
    unexported = a_run(team, tmp_path / "unexported", exported=(), status=RunStatus.RUNNING)
    run = a_run(team, tmp_path / "run")
    version = prompts_version.public_id
    for sent, field, words in (({"run": "run_nope"}, "run", "'run_nope' is not a run of alpha"),
                               ({"run": theirs.public_id}, "run", "is not a run of alpha"),
                               ({"run": unexported.public_id}, "run", "its checkpoints once they are exported"),
                               ({"run": run.public_id, "model": run.public_id}, "__all__", "exactly one of model and run"),
                               ({}, "__all__", "exactly one of model and run"),
                               ({"run": run.public_id, "row_limit": 0}, "row_limit", "")):
        status, answer = member("POST", BASE, {"dataset_version": version, **sent})
        assert status == 400 and words in " ".join(answer["errors"].get(field, [])), (sent, answer)
        valid("FieldErrors", answer)
    assert api(team.viewer)("POST", BASE, {"run": run.public_id, "dataset_version": version})[0] == 403
    assert not Evaluation.objects.exists() and sent_tasks == []
