"""The REST API driven by a plain HTTP client (urllib) against the live test server: tokens,
datasets, runs from a spec, cancel and resume, an external run logged like a tracking server,
samples, artifact download, the OpenAPI document, and access (401 / 403 / 404)."""
from __future__ import annotations

import io
import json
import tarfile
import uuid

import pytest

from tests.webapp.api.client import Api
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.api.models import ApiToken
from webapp.api.services import token_create
from webapp.datasets.models import Dataset
from webapp.runs.models import Artifact, ArtifactKind, MetricPoint, Run, RunStatus


def test_it_requires_a_token(world):
    _team, apis, _sent = world
    status, body = apis["anonymous"].call("GET", "/api/v1/projects/alpha/runs/")
    assert status == 401 and "Bearer" in body["detail"]
    status, _ = Api(apis["owner"].base, "tmp_not-a-token").call("GET", "/api/v1/projects/alpha/runs/")
    assert status == 401


def test_it_lists_the_projects_a_token_reaches(world):
    """Audit: every endpoint sits under /api/v1/projects/<slug>/, and a script holding only a token had no way to
    learn a slug (GET /api/v1/projects/ was a 404 "no API endpoint"): the slug was read off a browser's address bar.
    The list is the token's user's own projects, each with the role that says what the token may do there."""
    from pydantic import TypeAdapter

    from webapp.api import schemas
    from webapp.projects.models import Role
    from webapp.projects.services import membership_add

    team, apis, _sent = world
    status, body = apis["viewer"].call("GET", "/api/v1/projects/")
    assert status == 200, body
    assert [(project["slug"], project["name"], project["role"]) for project in body["projects"]] == [
        ("alpha", "Project alpha", "viewer")]
    assert body["projects"][0]["urls"] == {
        "base_models": f"{apis['viewer'].base}/api/v1/projects/alpha/base-models/",
        "datasets": f"{apis['viewer'].base}/api/v1/projects/alpha/datasets/",
        "runs": f"{apis['viewer'].base}/api/v1/projects/alpha/runs/",
        "pipelines": f"{apis['viewer'].base}/api/v1/projects/alpha/pipelines/",
        "evaluations": f"{apis['viewer'].base}/api/v1/projects/alpha/evaluations/",
        "activity": f"{apis['viewer'].base}/api/v1/projects/alpha/activity/"}  # no webhooks: the owners' (403)
    # Scoped to the caller: the outsider sees its own project, not alpha; by name, each with its own role.
    assert [project["slug"] for project in apis["outsider"].call("GET", "/api/v1/projects/")[1]["projects"]] == [
        "alpha-elsewhere"]
    membership_add(project=team.outsider_project, user=team.teammate, role=Role.OWNER)
    listed = apis["teammate"].call("GET", "/api/v1/projects/")[1]["projects"]
    assert [(project["name"], project["role"]) for project in listed] == [("Elsewhere", "owner"),
                                                                          ("Project alpha", "member")]
    # Each listed slug is one the project's endpoints answer; an owner's listing links its webhooks too.
    assert apis["teammate"].call("GET", listed[0]["urls"]["runs"].removeprefix(apis["teammate"].base))[0] == 200
    assert "webhooks" not in listed[1]["urls"]
    for address in listed[0]["urls"].values():
        assert apis["teammate"].call("GET", address.removeprefix(apis["teammate"].base))[0] == 200, address
    assert apis["anonymous"].call("GET", "/api/v1/projects/")[0] == 401
    assert apis["viewer"].call("GET", "/api/v1/projects/?role=owner") == (400, {"errors": {"role": [
        "unknown query parameter; this address takes no query parameters"]}})
    # The OpenAPI document describes it, and the answer is what it says.
    document = apis["anonymous"].call("GET", "/api/v1/openapi.json")[1]
    schema = document["paths"]["/api/v1/projects/"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/ProjectList"} and "ProjectList" in document["components"]["schemas"]
    assert "`GET /api/v1/projects/` lists the projects it reaches" in document["info"]["description"]
    TypeAdapter(schemas.ProjectList).validate_json(json.dumps(body))


def test_datasets_upload_list_get(world):
    _team, apis, sent = world
    rows = b'{"prompt": "a", "completion": "b"}\n'
    status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/", {"name": "chats", "kind": "sft"},
                                           "chats.jsonl", rows)
    assert status == 201, body
    assert body["dataset"]["name"] == "chats" and body["version"]["status"] == "uploaded"
    assert any(args == [] or args for args in sent)  # validation was queued
    status, body2 = apis["viewer"].call("GET", "/api/v1/projects/alpha/datasets/")
    assert status == 200 and [d["name"] for d in body2["datasets"]] == ["chats"]
    status, detail = apis["viewer"].call("GET", f"/api/v1/projects/alpha/datasets/{body['dataset']['id']}/")
    assert status == 200 and detail["versions"][0]["number"] == 1
    status, _ = apis["viewer"].upload("/api/v1/projects/alpha/datasets/", {"name": "x", "kind": "sft"}, "x.jsonl", rows)
    assert status == 403
    status, bad = apis["teammate"].upload("/api/v1/projects/alpha/datasets/", {"name": "", "kind": "sft"}, "y.jsonl", rows)
    assert status == 400 and "name" in bad["errors"]


def test_a_refused_upload_leaves_nothing_and_says_why(world):
    """QA: an empty file was taken (201) and left a dataset whose only version failed, its name taken for good
    (the web form refused the same file); a JSON list as the mapping got a Python error; kind was ignored
    when adding a version, so an sft file was checked as text and failed with 30 errors."""
    from webapp.datasets.models import Dataset

    _team, apis, _sent = world
    upload = apis["teammate"].upload
    status, body = upload("/api/v1/projects/alpha/datasets/", {"name": "empty", "kind": "sft"}, "empty.jsonl", b"")
    assert status == 400 and body["errors"]["file"] == [
        "\u2068empty.jsonl\u2069 is empty (0 bytes): choose the file that holds your rows, or export it again"]
    assert not Dataset.objects.filter(name="empty").exists()
    rows = b'{"prompt": "a", "completion": "b"}\n'
    status, body = upload("/api/v1/projects/alpha/datasets/", {"name": "m", "kind": "sft", "mapping": '["a"]'},
                          "m.jsonl", rows)
    assert status == 400 and body["errors"]["mapping"][0].startswith(
        "the column mapping must be a JSON object of field → column")
    assert not Dataset.objects.filter(name="m").exists()
    status, created = upload("/api/v1/projects/alpha/datasets/", {"name": "notes", "kind": "text"}, "t.jsonl",
                             b'{"text": "x"}\n')
    status, body = upload("/api/v1/projects/alpha/datasets/", {"dataset": created["dataset"]["id"], "kind": "sft"},
                          "s.jsonl", rows)
    assert status == 400 and body["errors"]["kind"] == [
        "dataset \u2068notes\u2069 is a text dataset, not \u2068sft\u2069; a new version keeps its dataset's kind "
        "(leave kind out)"]
    assert Dataset.objects.get(name="notes").versions.count() == 1


def test_a_right_to_left_dataset_name_is_isolated_in_refusals(world):
    """QA: the kind-mismatch message and the 404 of a missing version put the dataset's name into the sentence
    as it is, so a right-to-left name took the words after it into its run."""
    _team, apis, _sent = world
    api = apis["teammate"]
    _status, created = api.upload("/api/v1/projects/alpha/datasets/", {"name": "ملاحظات", "kind": "text"}, "t.jsonl",
                                  b'{"text": "x"}\n')
    dataset_id = created["dataset"]["id"]
    status, body = api.upload("/api/v1/projects/alpha/datasets/", {"dataset": dataset_id, "kind": "sft"}, "s.jsonl",
                              b'{"prompt": "a", "completion": "b"}\n')
    assert status == 400 and body["errors"]["kind"][0].startswith("dataset \u2068ملاحظات\u2069 is a text dataset")
    status, body = api.call("GET", f"/api/v1/projects/alpha/datasets/{dataset_id}/versions/7/")
    assert status == 404 and "\u2068ملاحظات\u2069 has no version 7" in json.dumps(body, ensure_ascii=False)


def test_a_new_version_refuses_a_name_other_than_its_datasets(world):
    """QA: a new version sent with a dataset id and a name was added to that dataset, the name dropped without
    a word (a client meaning to make the dataset 'other' found a version of 'notes' instead)."""
    from webapp.datasets.models import Dataset

    _team, apis, _sent = world
    upload = apis["teammate"].upload
    _status, created = upload("/api/v1/projects/alpha/datasets/", {"name": "notes", "kind": "text"}, "t.jsonl",
                              b'{"text": "x"}\n')
    dataset_id = created["dataset"]["id"]
    status, body = upload("/api/v1/projects/alpha/datasets/", {"dataset": dataset_id, "name": "other"}, "t.jsonl",
                          b'{"text": "y"}\n')
    assert status == 400 and body["errors"]["name"] == [
        f"dataset {dataset_id} is named \u2068notes\u2069, not \u2068other\u2069: send name for a new dataset, or "
        "dataset (its id) for a new version of one, not both"]
    assert Dataset.objects.get(name="notes").versions.count() == 1 and not Dataset.objects.filter(name="other")
    status, body = upload("/api/v1/projects/alpha/datasets/", {"dataset": dataset_id, "name": "NOTES"}, "t.jsonl",
                          b'{"text": "y"}\n')
    assert status == 201 and body["version"]["number"] == 2


def test_a_version_shows_its_column_mapping_and_statistics(world):
    """QA: a version uploaded through the API with a mapping came back without it, and without the statistics its
    page shows: a client could not check which columns were read, nor how long the rows are."""
    from webapp.datasets import services
    from webapp.datasets.models import DatasetVersion

    _team, apis, _sent = world
    status, body = apis["teammate"].upload(
        "/api/v1/projects/alpha/datasets/",
        {"name": "qa", "kind": "sft", "mapping": '{"prompt": "question", "completion": "answer"}'}, "qa.jsonl",
        b'{"question": "2+2?", "answer": "4"}\n{"question": "Hi", "answer": "Hello"}\n')
    assert status == 201 and body["version"]["mapping"] == {"prompt": "question", "completion": "answer"}
    assert body["version"]["statistics"] == {}
    services.dataset_version_validate(version_id=DatasetVersion.objects.get(public_id=body["version"]["id"]).pk)
    status, version = apis["viewer"].call("GET", f"/api/v1/projects/alpha/datasets/{body['dataset']['id']}/versions/1/")
    assert status == 200 and version["status"] == "ready"
    assert version["statistics"]["rows"] == 2 and version["statistics"]["unit"] == "characters"
    assert version["statistics"]["fields"]["completion"]["max"] == 5


def test_a_kind_named_by_its_task_or_as_chat_is_told_the_kind_to_send(world):
    """Audit: a script that sent kind=dpo, kind=chat or kind=SFT was told only "kind 'dpo' is not one of text, sft,
    preference, prompts", though file_format is taken in any letter case: a task's name now says the kind it trains
    on, a chat says sft, and a kind in capitals is that kind. Nothing is made for a refused one."""
    _team, apis, _sent = world
    upload = apis["teammate"].upload
    rows = b'{"prompt": "a", "chosen": "b", "rejected": "c"}\n'
    status, body = upload("/api/v1/projects/alpha/datasets/", {"name": "pairs", "kind": "dpo"}, "p.jsonl", rows)
    assert (status, body) == (400, {"errors": {"kind": [
        "kind 'dpo' is not one of text, sft, preference, prompts: dpo is a task, which trains on datasets of kind "
        "preference"]}})
    status, body = upload("/api/v1/projects/alpha/datasets/", {"name": "chats", "kind": "chat"}, "c.jsonl", rows)
    assert (status, body) == (400, {"errors": {"kind": [
        "kind 'chat' is not one of text, sft, preference, prompts: chats (a messages column of role and content "
        "turns) are kind sft"]}})
    assert not Dataset.objects.exists()
    status, body = upload("/api/v1/projects/alpha/datasets/", {"name": "pairs", "kind": "Preference"}, "p.jsonl", rows)
    assert status == 201 and body["dataset"]["kind"] == "preference"
    status, body = upload("/api/v1/projects/alpha/datasets/", {"dataset": body["dataset"]["id"], "kind": "PREFERENCE"},
                          "p.jsonl", rows)
    assert status == 201 and body["version"]["number"] == 2


def test_a_file_over_the_upload_limit_is_told_what_can_be_done(world, settings):
    """Audit: a file over TEMPER_MAX_UPLOAD_BYTES was told to "split it into smaller files", but a run trains on one
    dataset version (data.train names one), so the parts would each train alone. Parquet, which Temper reads, is
    compressed: the same rows in a file several times smaller. Both refusals, as the file streams in and before the
    body is read (its Content-Length), say so, and nothing is kept."""
    import asyncio

    from webapp.datasets.uploads import MULTIPART_OVERHEAD_BYTES, RequestBodyLimit

    _team, apis, _sent = world
    settings.TEMPER_MAX_UPLOAD_BYTES = 1000
    status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/", {"name": "big", "kind": "sft"},
                                           "big.jsonl", b'{"prompt": "a", "completion": "b"}\n' * 100)
    remedy = ("convert it to Parquet (.parquet: compressed, often several times smaller than JSON Lines or CSV), or "
              "ask an administrator to raise TEMPER_MAX_UPLOAD_BYTES")
    assert (status, body) == (413, {"detail": f"the file is over the 1000\xa0bytes upload limit; {remedy}"})
    assert not Dataset.objects.exists()
    sent = []

    async def refused_before_read(scope, receive, send):
        raise AssertionError("refused before the application")

    async def send(message):
        sent.append(message)

    guard = RequestBodyLimit(refused_before_read, max_upload_bytes=1000)
    too_long = str(1000 + MULTIPART_OVERHEAD_BYTES + 1).encode()
    asyncio.run(guard({"type": "http", "path": "/api/v1/projects/alpha/datasets/",
                       "headers": [(b"content-length", too_long)]}, None, send))
    assert json.loads(sent[1]["body"]) == {
        "detail": f"the request body is over the upload limit of 1000 bytes (TEMPER_MAX_UPLOAD_BYTES); {remedy}"}


@pytest.mark.parametrize(("filename", "file_format"), [("rows.csv", ""), ("rows.jsonl", "csv")],
                         ids=["csv-name", "csv-format"])
def test_json_lines_read_as_csv_are_named_as_json(world, filename, file_format):
    """Audit: JSON Lines uploaded as CSV (under a .csv name, or with file_format csv) failed with 'text follows the
    closing " of a quoted cell: quote the whole cell and write each " inside it as ""', advice for a CSV file, when
    its rows were written compact (JSON.stringify, jq -c, json.dumps(separators=(",", ":"))): the README says JSON
    under a .csv name is named as such, and it was only where a space after each comma let the first line be read
    as a header row before the quotes tripped the reader."""
    from webapp.datasets import services
    from webapp.datasets.models import DatasetVersion

    _team, apis, _sent = world
    fields = {"name": "rows", "kind": "sft", **({"file_format": file_format} if file_format else {})}
    status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/", fields, filename,
                                           b'{"prompt":"2+2?","completion":"4"}\n{"prompt":"Hi","completion":"Hello"}\n')
    assert status == 201, body
    services.dataset_version_validate(version_id=DatasetVersion.objects.get(public_id=body["version"]["id"]).pk)
    status, version = apis["viewer"].call("GET", f"/api/v1/projects/alpha/datasets/{body['dataset']['id']}/versions/1/")
    assert status == 200 and version["status"] == "failed"
    assert version["errors"] == [{"code": "csv_header", "line": 1, "row": None, "field": None, "message": (
        "the first line is JSON, not a CSV header row: the file looks like JSON Lines; choose the format JSON Lines "
        "(Format on the upload form, file_format in the API) or give the file the .jsonl extension, and upload it "
        "again")}]


def test_a_new_version_sent_without_a_mapping_keeps_the_last_versions(world):
    """QA: a new version sent through the API without ``mapping`` was read with none, where the web form starts
    from the last version's: a file of the same columns failed with "no column 'prompt'" on every row."""
    _team, apis, _sent = world
    upload = apis["teammate"].upload
    rows = b'{"question": "2+2?", "answer": "4"}\n'
    mapping = {"prompt": "question", "completion": "answer"}
    _status, first = upload("/api/v1/projects/alpha/datasets/", {"name": "qa", "kind": "sft",
                                                                 "mapping": json.dumps(mapping)}, "qa.jsonl", rows)
    assert first["mapping_inherited_from"] is None
    dataset_id = first["dataset"]["id"]
    status, second = upload("/api/v1/projects/alpha/datasets/", {"dataset": dataset_id}, "qa2.jsonl", rows)
    assert status == 201 and second["version"]["mapping"] == mapping and second["mapping_inherited_from"] == 1
    # A mapping sent, even an empty one, is the version's own.
    status, third = upload("/api/v1/projects/alpha/datasets/", {"dataset": dataset_id, "mapping": "{}"}, "qa3.jsonl",
                           b'{"prompt": "2+2?", "completion": "4"}\n')
    assert status == 201 and third["version"]["mapping"] == {} and third["mapping_inherited_from"] is None
    status, version = apis["viewer"].call("GET", f"/api/v1/projects/alpha/datasets/{dataset_id}/versions/2/")
    assert status == 200 and version["mapping"] == mapping


def test_a_ready_version_s_file_downloads_as_uploaded(world):
    """QA: the API listed, uploaded and deleted versions but gave no way to fetch one's file back (only the web
    page's Download link, behind a login a script does not have)."""
    from webapp.datasets import services
    from webapp.datasets.models import DatasetVersion

    _team, apis, _sent = world
    rows = "\ufeff{\"prompt\": \"مرحبا\", \"completion\": \"👋\"}\r\n".encode()
    _status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/", {"name": "qa", "kind": "sft"},
                                            "greetings.jsonl", rows)
    url = f"/api/v1/projects/alpha/datasets/{body['dataset']['id']}/versions/1/file/"
    status, refused = apis["viewer"].call("GET", url)
    assert status == 404 and refused == {"detail": "version 1 of \u2068qa\u2069 is uploaded: only a ready version "
                                                   "has a file to download; wait for its check to end"}
    services.dataset_version_validate(version_id=DatasetVersion.objects.get(public_id=body["version"]["id"]).pk)
    status, raw = apis["viewer"].call("GET", url)
    assert status == 200 and raw == rows
    assert apis["outsider"].call("GET", url)[0] == 404


def test_a_file_format_is_named_in_any_case_and_a_wrong_one_lists_the_formats(world):
    """QA: file_format "JSONL", as the upload form's menu spells it, was "unknown format 'JSONL'", and a wrong one
    did not say which formats there are."""
    _team, apis, _sent = world
    rows = b'{"prompt": "a", "completion": "b"}\n'
    status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/",
                                           {"name": "a", "kind": "sft", "file_format": "JSONL"}, "rows.txt", rows)
    assert status == 201 and body["version"]["format"] == "jsonl"
    status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/",
                                           {"name": "b", "kind": "sft", "file_format": "xml"}, "rows.txt", rows)
    assert status == 400 and body["errors"]["file_format"] == [
        "unknown format 'xml': use one of jsonl, json, csv, parquet, or leave it out to tell the format from the "
        "file's extension"]


def test_a_mapping_that_is_not_json_says_where_and_shows_one(world):
    """QA: a mapping written as prompt=question, or with single quotes, was "mapping must be a JSON object of field
    → column", with no word of what was wrong in it nor an example."""
    _team, apis, _sent = world
    status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/",
                                           {"name": "m", "kind": "sft", "mapping": "{'prompt': 'question'}"}, "m.jsonl",
                                           b'{"question": "a", "completion": "b"}\n')
    assert status == 400 and body["errors"]["mapping"] == [
        "mapping is not JSON (Expecting property name enclosed in double quotes at column 2): send a JSON object of "
        "field → column, e.g. {\"prompt\": \"question\"}"]


def test_upload_errors_name_the_fields_the_client_sent(world):
    """QA: a bad mapping was reported under "column_mapping", the service's argument, though the request's
    field is "mapping": a client matching errors to its fields found none."""
    from webapp.datasets.models import Dataset

    _team, apis, _sent = world
    rows = b'{"prompt": "a", "completion": "b"}\n'
    for mapping, message in (('["prompt"]', "the column mapping must be a JSON object of field → column"),
                             ('{"answer": "x"}', "column mapping: 'answer' is not a field of kind 'sft'"),
                             ('{"prompt": 5}', "column mapping: the column for 'prompt' must be a column name")):
        status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/",
                                               {"name": "chats", "kind": "sft", "mapping": mapping}, "c.jsonl", rows)
        assert status == 400 and set(body["errors"]) == {"mapping"}, body
        assert body["errors"]["mapping"][0].startswith(message)
    assert not Dataset.objects.exists()
    status, created = apis["teammate"].upload("/api/v1/projects/alpha/datasets/", {"name": "chats", "kind": "sft"},
                                              "c.jsonl", rows)
    status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/",  # a new version of it
                                           {"dataset": created["dataset"]["id"], "mapping": '{"answer": "x"}'},
                                           "c.jsonl", rows)
    assert status == 400 and set(body["errors"]) == {"mapping"}, body


def test_runs_create_get_cancel_resume(world):
    team, apis, sent = world
    model, data = make_base_model(team.project), make_ready_version(team.project)
    spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 5}}
    status, bad = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/",
                                        {"spec": {**spec, "optim": {"schedule": "cosin"}}})
    assert status == 400 and "optim.schedule" in bad["errors"]
    status, both = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"spec": spec, "spec_yaml": "x"})
    assert status == 400 and "exactly one of spec and spec_yaml" in json.dumps(both)
    status, created = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"spec": spec, "name": "api run",
                                                                                     "tags": ["api"]})
    assert status == 201 and created["status"] == "queued" and created["spec"]["train"]["max_steps"] == 5
    run_path = f"/api/v1/projects/alpha/runs/{created['id']}/"
    for tag in ("api", "API"):  # a tag filter matches case aside, as the runs table's
        status, listed = apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/?tag={tag}")
        assert [run["id"] for run in listed["runs"]] == [created["id"]], tag
    assert apis["viewer"].call("POST", run_path + "cancel/")[0] == 403
    status, cancelled = apis["teammate"].call("POST", run_path + "cancel/")
    assert status == 200 and cancelled["status"] == "cancelled"
    status, resumed = apis["teammate"].call("POST", run_path + "resume/", {"max_steps": 9})
    assert status == 200 and resumed["status"] == "queued" and resumed["attempt"] == 2 and resumed["total_steps"] == 9
    assert resumed["stopping"] is False
    # QA: a training run's cancel answered "status": "running" and nothing more, as if the cancel had not been
    # taken; it stops after its current step, and the answer and the run say so until it has.
    Run.objects.filter(public_id=created["id"]).update(status=RunStatus.RUNNING)
    status, cancelled = apis["teammate"].call("POST", run_path + "cancel/")
    assert status == 200 and (cancelled["status"], cancelled["stopping"]) == ("running", True)
    assert apis["viewer"].call("GET", run_path)[1]["stopping"] is True
    assert apis["outsider"].call("GET", run_path)[0] == 404
    assert apis["outsider"].call("POST", run_path + "cancel/")[0] == 404


def test_runs_list_rejects_an_unknown_sort_naming_the_choices(world):
    team, apis, _sent = world
    status, body = apis["viewer"].call("GET", "/api/v1/projects/alpha/runs/?sort=-created")
    assert status == 400
    assert body == {"errors": {"sort": ["'-created' is not one of newest, oldest, name, -name, status, task, steps, loss, "
                                        "eval_loss, reward, duration, or metric:<final metric> (lowest first; "
                                        "-metric:<final metric> highest first)"]}}
    assert apis["viewer"].call("GET", "/api/v1/projects/alpha/runs/?sort=oldest") == (200, {"runs": [], "next": None})
    assert apis["viewer"].call("GET", "/api/v1/projects/alpha/runs/?sort=metric:")[0] == 400  # no metric named


def test_runs_list_sorts_by_any_final_metric_as_the_table(world):
    """QA (a script ranking a sweep by eval/exact_match): the table sorted by any final metric (metric:<name>), the
    REST API by loss and reward alone, refusing metric: as an unknown sort. It takes the same sorts, a page at a
    time, runs without the metric last either way."""
    team, apis, _sent = world
    scores = [0.5, None, 0.25, 0.75, 0.5, None, 0.1]
    runs = [Run.objects.create(project=team.project, name=f"run {index}", task="external", spec={}, resolved_spec={},
                               final_metrics={} if score is None else {"eval/exact_match": {"last": score}})
            for index, score in enumerate(scores)]
    scored = [run for run, score in zip(runs, scores) if score is not None]
    unscored = [run.public_id for run in reversed(runs) if run.final_metrics == {}]  # newest id first
    for sort, sign in (("metric:eval/exact_match", 1), ("-metric:eval/exact_match", -1)):
        # ties newest id first, in either direction
        ordered = sorted(scored, key=lambda run: (sign * run.final_metrics["eval/exact_match"]["last"], -run.pk))
        ids, _links = _listed(apis["viewer"], f"/api/v1/projects/alpha/runs/?sort={sort}&limit=2")
        assert ids == [run.public_id for run in ordered] + unscored, sort




def test_runs_list_q_finds_runs_by_a_part_of_a_tag_or_of_the_notes_as_the_table(world):
    """The REST API's ``q`` searches as the Runs page's box: name, id, and now a part of a tag or of the notes."""
    _team, apis, _sent = world
    runs = {}
    for name, tags, notes in (("plain", [], ""), ("tagged", ["ablation-lr"], ""), ("noted", [], "loss diverged")):
        status, runs[name] = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/",
                                                   {"external": True, "name": name, "tags": tags})
        assert status == 201
        assert apis["teammate"].call("PATCH", f"/api/v1/projects/alpha/runs/{runs[name]['id']}/", {"notes": notes})[0] == 200
    for query, found in (("Ablation", "tagged"), ("DIVERGED", "noted"), ("plain", "plain")):
        status, body = apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/?q={query}")
        assert status == 200 and [run["id"] for run in body["runs"]] == [runs[found]["id"]], query
    # Tags changed through the API are what the search finds from then on.
    assert apis["teammate"].call("PATCH", f"/api/v1/projects/alpha/runs/{runs['tagged']['id']}/",
                                 {"tags": ["Dropout-Sweep"]})[0] == 200
    for query, found in (("ablation", []), ("dropout-s", [runs["tagged"]["id"]])):
        status, body = apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/?q={query}")
        assert status == 200 and [run["id"] for run in body["runs"]] == found, query
    status, document = apis["viewer"].call("GET", "/api/v1/openapi.json")
    query = next(parameter for parameter in document["paths"]["/api/v1/projects/{slug}/runs/"]["get"]["parameters"]
                 if parameter["name"] == "q")
    assert query["description"] == "a part of the name, id, a tag or the notes (case aside)"


def _listed(api, path: str) -> tuple[list[str], list[str]]:
    """Every run id of a list followed page by page through its ``next`` links, and those links."""
    ids, links = [], []
    while path:
        status, body = api.call("GET", path)
        assert status == 200, body
        ids += [run["id"] for run in body["runs"]]
        path = body["next"] and body["next"].removeprefix(api.base)
        links.append(path)
    return ids, links


def test_runs_list_pages_through_every_run(world):
    """QA: the list stopped at 500 runs with no way to read the 501st. It pages: ?limit= (1 to 500,
    default 100) and a next link (null on the last page) that carries the cursor and the query."""
    from django.utils import timezone

    from webapp.runs.services import run_tags_write

    team, apis, _sent = world
    Run.objects.bulk_create(
        [Run(project=team.project, name=f"run {index % 4}", task="external", spec={}, resolved_spec={},
             status=[RunStatus.RUNNING, RunStatus.FAILED][index % 2], current_step=index % 3)
         for index in range(205)])
    Run.objects.filter(name="run 0").update(created_at=timezone.now())  # 52 at one instant: pages split ties
    for run in Run.objects.order_by("pk")[1:]:  # every run but the first tagged, as the services tag (?tag= reads RunTag)
        run_tags_write(run=run, tags=["t"])
    api = apis["viewer"]
    ids, links = _listed(api, "/api/v1/projects/alpha/runs/")
    assert len(links) == 3 and links[-1] is None  # 100, 100, 5
    assert "limit=" not in links[0] and "cursor=" in links[0]
    everything = list(Run.objects.order_by("-created_at", "-id").values_list("public_id", flat=True))
    assert ids == everything
    for sort, order in (("oldest", ("created_at", "-id")), ("name", ("name", "-id")), ("-name", ("-name", "-id")),
                        ("status", ("status", "-id")), ("task", ("task", "-id")), ("steps", ("-current_step", "-id"))):
        ids, _links = _listed(api, f"/api/v1/projects/alpha/runs/?sort={sort}&limit=7")
        assert ids == list(Run.objects.order_by(*order).values_list("public_id", flat=True)), sort
    # The orders by a final metric: runs with equal values (ties split across pages) and runs without one,
    # which come last, after the others, in either direction.
    for index, run in enumerate(Run.objects.order_by("id")):
        if index % 5:
            Run.objects.filter(pk=run.pk).update(final_metrics={"loss": {"last": index % 7 / 4},
                                                                "reward": {"last": -(index % 3)}},
                                                 train_seconds=float(index % 11))
    runs = list(Run.objects.all())
    for sort, key in (("loss", lambda run: run.final_metrics.get("loss", {}).get("last")),
                      ("reward", lambda run: -run.final_metrics["reward"]["last"] if run.final_metrics else None),
                      ("duration", lambda run: -run.train_seconds)):
        expected = sorted(runs, key=lambda run: (key(run) is None, key(run) or 0, -run.pk))
        ids, _links = _listed(api, f"/api/v1/projects/alpha/runs/?sort={sort}&limit=7")
        assert ids == [run.public_id for run in expected], sort
    ids, links = _listed(api, "/api/v1/projects/alpha/runs/?tag=t&status=failed&limit=30")
    assert ids == list(Run.objects.filter(status=RunStatus.FAILED).exclude(tags=[]).order_by("-created_at", "-id")
                       .values_list("public_id", flat=True))
    assert all("tag=t" in link and "status=failed" in link and "limit=30" in link for link in links[:-1])
    status, body = api.call("GET", "/api/v1/projects/alpha/runs/?limit=500")
    assert len(body["runs"]) == 205 and body["next"] is None
    for limit in ("0", "501", "all", "-5"):
        assert api.call("GET", f"/api/v1/projects/alpha/runs/?limit={limit}") == (400, {"errors": {"limit": [
            f"'{limit}' is not a page size; give a whole number from 1 to 500 (100 when left out)"]}})
    for cursor in ("abc", links[0].split("cursor=")[1].split("&")[0][:-2]):
        status, body = api.call("GET", f"/api/v1/projects/alpha/runs/?cursor={cursor}")
        assert status == 400 and body["errors"]["cursor"] == [
            "this cursor was not given by this list; follow the list's next link, or start again without cursor"]
    by_name = _listed(api, "/api/v1/projects/alpha/runs/?sort=name&limit=7")[1][0]
    status, body = api.call("GET", by_name.replace("sort=name", "sort=oldest"))
    assert status == 400 and body["errors"]["cursor"] == [
        "this cursor continues a list in the order name, not oldest; follow the list's next link as given"]


def test_list_filters_refuse_a_value_they_cannot_match_naming_the_parameter(world):
    """QA: ?status=bogus answered 200 with no runs, as if the project had none of that status (a typo,
    or "completed" for "succeeded", looked like an empty project); ?task= and ?archived= did the same, and a
    samples ?step= that is not a step answered every step's samples."""
    team, apis, _sent = world
    _status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "x"})
    get = apis["viewer"].call
    assert get("GET", "/api/v1/projects/alpha/runs/?status=bogus") == (400, {"errors": {"status": [
        "'bogus' is not a run status; use one of queued, running, succeeded, failed, cancelled"]}})
    assert get("GET", "/api/v1/projects/alpha/runs/?task=chat") == (400, {"errors": {"task": [
        "'chat' is not a run task; use one of pretrain, sft, reward, dpo, grpo, ppo, external"]}})
    assert get("GET", "/api/v1/projects/alpha/runs/?archived=true") == (400, {"errors": {"archived": [
        "'true' is not a value of archived; use 1 (archived runs only) or 0 (the others, as when left out)"]}})
    for query, found in (("status=running", [run["id"]]), ("status=succeeded", []), ("status=", [run["id"]]),
                         ("task=external", [run["id"]]), ("task=sft", []), ("archived=0", [run["id"]]),
                         ("archived=1", [])):
        status, body = get("GET", f"/api/v1/projects/alpha/runs/?{query}")
        assert status == 200 and [listed["id"] for listed in body["runs"]] == found, query
    samples = f"/api/v1/projects/alpha/runs/{run['id']}/samples/"
    for step in ("last", "-1", "9" * 30):
        assert get("GET", f"{samples}?step={step}") == (400, {"errors": {"step": [
            f"'{step}' is not a step; give a whole number from 0 to 2147483647, or leave step out for every step"]}})
    metrics = f"/api/v1/projects/alpha/runs/{run['id']}/metrics/"
    status, body = get("GET", f"{metrics}?max_points=many")
    assert status == 400 and set(body["errors"]) == {"max_points"}, body
    # The message asks for at least 2; 0 and 1 were taken as 2 without a word.
    for too_few in ("0", "1"):
        assert get("GET", f"{metrics}?max_points={too_few}") == (400, {"errors": {"max_points": [
            f"'{too_few}' is not a number of points; give a whole number from 2 to 1000000 (2000 when left out)"]}})
    assert get("GET", f"{metrics}?max_points=2")[0] == 200
    for after_step in ("9" * 30, "%203", "%2B3", "3_0", "%D9%A3"):  # int() took all but the first
        status, body = get("GET", f"{metrics}?after_step={after_step}")
        assert status == 400 and set(body["errors"]) == {"after_step"}, body
    assert get("GET", f"{metrics}?after_step=-1")[0] == 200


def test_metrics_max_points_over_the_cap_is_refused_naming_the_value_and_the_maximum(world):
    """QA: max_points=5000000 was cut to 1,000,000 without a word, so a client got fewer points than it asked for
    and could not tell. Like limit past its maximum, it is a 400 naming the field, the value and the range; the
    OpenAPI document gives the same maximum."""
    from webapp.runs.selectors import METRICS_MAX_POINTS

    _team, apis, _sent = world
    _status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "x"})
    metrics = f"/api/v1/projects/alpha/runs/{run['id']}/metrics/"
    get = apis["viewer"].call
    for too_many in (str(METRICS_MAX_POINTS + 1), "5000000", "9" * 30):
        assert get("GET", f"{metrics}?max_points={too_many}") == (400, {"errors": {"max_points": [
            f"'{too_many}' is not a number of points; give a whole number from 2 to {METRICS_MAX_POINTS} (2000 when "
            "left out)"]}})
    assert get("GET", f"{metrics}?max_points={METRICS_MAX_POINTS}") == (200, {"series": {}, "unknown_names": [],
                                                                          "metric_names": []})
    document = apis["anonymous"].call("GET", "/api/v1/openapi.json")[1]
    query = {parameter["name"]: parameter for parameter in
             document["paths"]["/api/v1/projects/{slug}/runs/{run_id}/metrics/"]["get"]["parameters"]}
    assert query["max_points"]["schema"] == {"type": "integer", "minimum": 2, "maximum": METRICS_MAX_POINTS}


def test_an_unknown_or_repeated_query_parameter_is_refused_naming_the_allowed_ones(world):
    """QA: a misspelt parameter was left unread, so ?stauts=running listed every run, as if all were running;
    one given twice kept its last value without a word."""
    _team, apis, _sent = world
    _status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "x"})
    get = apis["viewer"].call
    assert get("GET", "/api/v1/projects/alpha/runs/?stauts=running") == (400, {"errors": {"stauts": [
        "unknown query parameter (did you mean status?); allowed here: q, status, task, tag, archived, sort, limit, "
        "cursor"]}})
    assert get("GET", "/api/v1/projects/alpha/runs/?status=running&status=failed") == (400, {"errors": {"status": [
        "given 2 times; give it once (only one value is read)"]}})
    path = f"/api/v1/projects/alpha/runs/{run['id']}/"
    assert get("GET", f"{path}samples/?steps=3") == (400, {"errors": {"steps": [
        "unknown query parameter (did you mean step?); allowed here: step, limit, cursor"]}})
    assert get("GET", f"{path}?verbose=1") == (400, {"errors": {"verbose": [
        "unknown query parameter; this address takes no query parameters"]}})
    # A write reads no query: a parameter sent with it was dropped as silently.
    status, body = apis["teammate"].call("POST", f"{path}finish/?status=failed", {"status": "succeeded"})
    assert status == 400 and body == {"errors": {"status": [
        "unknown query parameter; this address takes no query parameters"]}}
    assert Run.objects.get(public_id=run["id"]).status == RunStatus.RUNNING
    assert get("GET", "/api/v1/projects/alpha/runs/?status=running&limit=5")[0] == 200


def test_the_openapi_document_lists_the_query_parameters_each_address_reads(world):
    """The refusal of an unknown parameter and the document read one list: a parameter documented but refused (or
    read but undocumented) would send a script writer the wrong way."""
    from webapp.api.urls import urlpatterns

    _team, apis, _sent = world
    _status, document = apis["anonymous"].call("GET", "/api/v1/openapi.json")
    views = {str(pattern.pattern).replace("<slug:slug>", "{slug}"): pattern.callback
             for pattern in urlpatterns if str(pattern.pattern).startswith("api/v1/projects/")}
    assert len(views) > 10
    for route, view in views.items():
        address = "/" + route.replace("<str:", "{").replace("<int:", "{").replace(">", "}")
        for method, operation in document["paths"][address].items():
            documented = [parameter["name"] for parameter in operation["parameters"] if parameter["in"] == "query"]
            assert tuple(documented) == view.query_parameters.get(method, ()), (address, method)


def test_a_runs_log_is_read_a_page_at_a_time_or_by_its_tail(world):
    """QA: the run page showed the worker's log and the API had no way to read it: a script that launched a run
    could not see why it failed past error_message's one line."""
    from webapp.runs import services as run_services

    team, apis, _sent = world
    run = Run.objects.create(project=team.project, name="waits", task="sft", status=RunStatus.QUEUED, spec={},
                             resolved_spec={}, created_by=team.teammate)
    path = f"/api/v1/projects/alpha/runs/{run.public_id}/logs/"
    # No log yet: nothing to read, and while the run is queued there is an address to come back to.
    status, body = apis["viewer"].call("GET", path)
    assert status == 200 and body["lines"] == [] and body["next"].endswith(f"{path}?after=0")
    written = [run_services.log_line(run, f"step {step}") for step in range(1, 6)]
    run_services.log_line(run, "loss is <b>NaN</b>", level="warning")
    status, body = apis["viewer"].call("GET", f"{path}?limit=2")
    assert status == 200 and [line["message"] for line in body["lines"]] == ["step 1", "step 2"]
    assert body["lines"][0] == {"id": written[0].pk, "time": written[0].created_at.isoformat(), "level": "info",
                                "message": "step 1"}
    status, body = apis["viewer"].call("GET", body["next"].removeprefix(apis["viewer"].base))
    assert [line["message"] for line in body["lines"]] == ["step 3", "step 4"]
    status, tail = apis["teammate"].call("GET", f"{path}?tail=2")
    assert [(line["level"], line["message"]) for line in tail["lines"]] == [("info", "step 5"),
                                                                           ("warning", "loss is <b>NaN</b>")]
    # The tail's next reads on after it, forward: the next lines the run writes.
    assert "tail" not in tail["next"] and f"after={tail['lines'][-1]['id']}" in tail["next"]
    # Once the run has ended, the last page says so: no next.
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)
    status, body = apis["viewer"].call("GET", f"{path}?after={written[3].pk}&limit=1")
    assert [line["message"] for line in body["lines"]] == ["step 5"] and body["next"] is not None
    status, body = apis["viewer"].call("GET", body["next"].removeprefix(apis["viewer"].base))
    assert [line["message"] for line in body["lines"]] == ["loss is <b>NaN</b>"] and body["next"] is None
    assert apis["viewer"].call("GET", f"{path}?tail=3")[1]["next"] is None
    # Outsiders learn nothing; the API's own refusals for bad paging.
    assert apis["outsider"].call("GET", path)[0] == 404
    assert apis["anonymous"].call("GET", path)[0] == 401
    assert apis["viewer"].call("POST", path, {})[0] == 405
    for query, field, message in (
            ("after=last", "after", "'last' is not a line id; give the id of the last line you have (0, or leave "
                                    "after out, for the first line)"),
            ("limit=0", "limit", "'0' is not a number of lines; give a whole number from 1 to 1000 (the first lines "
                                 "after after; 200 when left out)"),
            ("tail=5000", "tail", "'5000' is not a number of lines; give a whole number from 1 to 1000 (the last "
                                  "lines)"),
            ("tail=2&limit=2", "tail", "give tail (the last lines) or limit (the first lines after after), not both")):
        assert apis["viewer"].call("GET", f"{path}?{query}") == (400, {"errors": {field: [message]}}), query


def test_a_nan_metric_is_left_out_and_the_answer_says_which_and_why(world):
    """A NaN or infinite value (a diverged loss, say) was dropped in silence: the answer read
    {"stored": 0}, and the script that logged it could not tell why. It names each value left out."""
    _team, apis, _sent = world
    status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "diverged"})
    path = f"/api/v1/projects/alpha/runs/{run['id']}/metrics/"
    points = [{"step": 1, "metrics": {"loss": 2.5, "grad_norm": float("inf")}},
              {"step": 2, "metrics": {"loss": float("nan")}}] + [{"step": step, "metrics": {"loss": float("nan")}}
                                                                for step in range(3, 30)]
    status, body = apis["teammate"].call("POST", path, {"points": points})
    assert status == 201 and body["stored"] == 1 and body["skipped"] == 29
    why = "NaN or infinity: not stored (a chart cannot draw it); log a finite value or leave the metric out"
    assert body["skipped_values"][:2] == [{"step": 1, "name": "grad_norm", "why": why},
                                          {"step": 2, "name": "loss", "why": why}]
    assert len(body["skipped_values"]) == 20  # the first 20 are listed; "skipped" counts them all
    status, series = apis["viewer"].call("GET", path + "?names=loss,grad_norm")
    assert series["series"]["loss"]["value"] == [2.5] and "grad_norm" not in series["series"]
    # Kept as each metric's latest value not finite, for what reads final_metrics' older "last" (pipeline guards).
    assert Run.objects.get(public_id=run["id"]).not_finite_metrics == {
        "grad_norm": {"step": 1, "value": "inf"}, "loss": {"step": 29, "value": "nan"}}


def test_an_external_run_is_logged_like_a_tracking_server(world):
    _team, apis, _sent = world
    status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/",
                                        {"external": True, "name": "laptop run", "config": {"lr": 0.1, "layers": 2}})
    assert status == 201 and run["status"] == "running" and run["task"] == "external"
    path = f"/api/v1/projects/alpha/runs/{run['id']}/"
    points = [{"step": step, "metrics": {"loss": 4.0 / step, "acc": step / 10}, "tokens": 100 * step}
              for step in range(1, 11)]
    status, body = apis["teammate"].call("POST", path + "metrics/", {"points": points})
    assert status == 201 and body["stored"] == 20
    status, body = apis["teammate"].call("POST", path + "metrics/", {"points": points[:2]})
    assert body["stored"] == 0 and body["skipped"] == 4  # a step logged twice keeps its first value, and says so
    assert body["skipped_values"][0] == {"step": 1, "name": "loss",
                                         "why": "already logged at this step: the first value is kept"}
    status, bad = apis["teammate"].call("POST", path + "metrics/", {"points": [{"step": -1, "metrics": {}}]})
    assert status == 400 and {"points.0.step", "points.0.metrics"} <= set(bad["errors"])
    # The field's whole range in words, not pydantic's 'Input should be greater than or equal to 0'.
    assert bad["errors"]["points.0.step"] == ["-1 is too small: give a whole number from 0 to 2147483647"]
    status, samples = apis["teammate"].call("POST", path + "samples/", {"samples": [
        {"step": 10, "prompt": "2+2?", "text": "4", "rewards": {"exact": 1.0}}]})
    assert status == 201 and samples["stored"] == 1
    status, series = apis["viewer"].call("GET", path + "metrics/?names=loss&after_step=8")
    assert series["series"]["loss"]["step"] == [9, 10] and series["series"]["loss"]["value"] == [4.0 / 9, 0.4]
    assert series["series"]["loss"]["tokens"] == [900, 1000]
    status, got = apis["viewer"].call("GET", path + "samples/?step=10")
    assert got["samples"][0]["text"] == "4" and got["samples"][0]["reward"] == 1.0
    status, finished = apis["teammate"].call("POST", path + "finish/", {"status": "succeeded"})
    assert finished["status"] == "succeeded" and finished["final_metrics"]["loss"]["last"] == 0.4
    assert finished["current_step"] == 10 and finished["tokens_seen"] == 1000
    status, closed = apis["teammate"].call("POST", path + "metrics/", {"points": points[:1]})
    # "is succeeded" was the status pasted after "is": a sentence says it as one does.
    assert status == 400 and closed == {"errors": {"__all__": [f"run {run['id']} has succeeded; it takes no more data"]}}


def test_an_external_run_name_over_the_limit_is_refused_not_cut(world):
    """QA: an external run named with 121 characters or more was made with its name cut at 120, without a
    word (the web's launch and edit already refuse it)."""
    _team, apis, _sent = world
    status, body = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "n" * 121})
    assert (status, body) == (400, {"errors": {"name": ["121 characters; a run name has at most 120"]}})
    assert not Run.objects.exists()
    status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "n" * 120})
    assert status == 201 and run["name"] == "n" * 120
    status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "  "})
    assert status == 201 and run["name"] == "external run"


def test_logging_into_a_trained_run_is_refused(world):
    team, apis, _sent = world
    model, data = make_base_model(team.project), make_ready_version(team.project)
    spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 5}}
    _status, created = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"spec": spec})
    status, body = apis["teammate"].call("POST", f"/api/v1/projects/alpha/runs/{created['id']}/metrics/",
                                         {"points": [{"step": 1, "metrics": {"loss": 1.0}}]})
    assert status == 400 and "trained by Temper" in json.dumps(body)


def test_artifacts_download_as_tar(world):
    team, apis, _sent = world
    model, data = make_base_model(team.project), make_ready_version(team.project)
    spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 5}}
    _status, created = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"spec": spec})
    run = Run.objects.get(public_id=created["id"])
    export = run.output_dir / "export"
    export.mkdir(parents=True)
    (export / "config.json").write_text('{"model_type": "llama"}')
    (export / "quantized").mkdir()  # the chat's serving copy: not part of the download
    (export / "quantized" / "model.safetensors").write_bytes(b"int8 codes")
    (export / "adapter").mkdir()  # the LoRA adapter: its own download, not part of the merged model's
    (export / "adapter" / "adapter_config.json").write_text("{}")
    # Recorded at the step it holds, as run_finish records it: the download without ?step= was a 404.
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=5, path=str(export))
    status, raw = apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/{run.public_id}/artifacts/model/")
    assert status == 200
    assert apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/{run.public_id}/artifacts/model/?step=5")[0] == 200
    assert apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/{run.public_id}/artifacts/model/?step=4")[0] == 404
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        assert archive.getnames() == ["export/config.json"]
        assert archive.extractfile("export/config.json").read() == b'{"model_type": "llama"}'
    assert apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/{run.public_id}/artifacts/adapter/")[0] == 404
    Artifact.objects.create(run=run, kind=ArtifactKind.ADAPTER, step=5, path=str(export / "adapter"))
    status, raw = apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/{run.public_id}/artifacts/adapter/")
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        assert status == 200 and archive.getnames() == ["adapter/adapter_config.json"]
    # An exported checkpoint's serving copy (made on demand) stays on the server too.
    checkpoint = run.output_dir / "export-step-3"
    (checkpoint / "quantized").mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "quantized" / "model.safetensors").write_bytes(b"int4 codes")
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=3, path=str(checkpoint))
    status, raw = apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/{run.public_id}/artifacts/checkpoint/?step=3")
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        assert status == 200 and archive.getnames() == ["export-step-3/config.json"]
    # '²' passes str.isdigit but not int(), and a 30-digit step overflows the query: both were 500s.
    for step in ("%C2%B2", "9" * 30):
        assert apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/{run.public_id}/artifacts/checkpoint/"
                                          f"?step={step}")[0] == 404
        assert apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/{run.public_id}/samples/?step={step}")[0] == 400
    assert apis["outsider"].call("GET", f"/api/v1/projects/alpha/runs/{run.public_id}/artifacts/model/")[0] == 404


def test_a_runs_artifacts_give_the_address_that_downloads_each(world):
    """Audit: a run's artifacts were {kind, step, size_bytes}, so a script put the download's address together from
    the README (a checkpoint's with ?step=, a model's without it); and the OpenAPI document said a model's step was
    null, where it is the step the model holds. Each now carries its url, and following it gets that artifact."""
    team, apis, _sent = world
    model, data = make_base_model(team.project), make_ready_version(team.project)
    spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 5}}
    _status, created = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"spec": spec})
    run = Run.objects.get(public_id=created["id"])
    export, checkpoint = run.output_dir / "export", run.output_dir / "export-step-3"
    for folder in (export, checkpoint):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=5, path=str(export))
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=3, path=str(checkpoint))
    status, body = apis["viewer"].call("GET", f"/api/v1/projects/alpha/runs/{run.public_id}/")
    base = f"{apis['viewer'].base}/api/v1/projects/alpha/runs/{run.public_id}/artifacts"
    assert status == 200 and [(artifact["kind"], artifact["step"], artifact["url"]) for artifact in body["artifacts"]] == [
        ("checkpoint", 3, f"{base}/checkpoint/?step=3"), ("model", 5, f"{base}/model/")]
    for artifact, folder in zip(body["artifacts"], ("export-step-3", "export")):
        status, raw = apis["viewer"].call("GET", artifact["url"].removeprefix(apis["viewer"].base))
        with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
            assert status == 200 and archive.getnames() == [f"{folder}/config.json"]
    document = apis["anonymous"].call("GET", "/api/v1/openapi.json")[1]
    artifact_schema = document["components"]["schemas"]["ArtifactOut"]["properties"]
    assert "null" not in artifact_schema["step"]["description"] and "url" in artifact_schema
    download = document["paths"]["/api/v1/projects/{slug}/runs/{run_id}/artifacts/{kind}/"]["get"]["summary"]
    assert "checkpoint with ?step=N" in download


def test_base_models_are_listed_for_every_role_and_hidden_from_outsiders(world):
    team, apis, _sent = world
    tiny = make_base_model(team.project, name="tiny", path="/models/tiny")
    make_base_model(team.outsider_project, name="theirs", path="/models/theirs")
    for role in ("viewer", "teammate"):
        status, body = apis[role].call("GET", "/api/v1/projects/alpha/base-models/")
        assert status == 200 and [model["id"] for model in body["base_models"]] == [tiny.public_id]
    status, one = apis["viewer"].call("GET", f"/api/v1/projects/alpha/base-models/{tiny.public_id}/")
    assert status == 200 and (one["name"], one["architecture"]) == ("tiny", tiny.architecture)
    assert "path" not in one  # where it lies on the server is not the client's business
    assert apis["outsider"].call("GET", "/api/v1/projects/alpha/base-models/")[0] == 404
    assert apis["teammate"].call("GET", "/api/v1/projects/alpha/base-models/bm_missing/")[0] == 404
    # The listed id is what a run's spec names.
    status, created = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"spec": {
        "task": "sft", "model": one["id"], "data": {"train": make_ready_version(team.project).public_id},
        "train": {"max_steps": 5}}})
    assert status == 201, created


def test_openapi_document_describes_every_endpoint(world):
    _team, apis, _sent = world
    status, document = apis["anonymous"].call("GET", "/api/v1/openapi.json")
    assert status == 200 and document["openapi"] == "3.1.0"
    paths = document["paths"]
    assert set(paths["/api/v1/projects/{slug}/runs/{run_id}/metrics/"]) == {"get", "post"}
    assert "/api/v1/projects/{slug}/datasets/" in paths
    assert set(paths["/api/v1/projects/{slug}/base-models/{model_id}/"]) == {"get", "delete"}
    schemas = document["components"]["schemas"]
    assert {"RunCreate", "MetricsLog", "JobSpec", "OptimSpec", "PipelineDocument", "Guard"} <= set(schemas)
    assert schemas["OptimSpec"]["properties"]["schedule"]["enum"] == ["constant", "linear", "cosine"]
    chat_template_kwargs = schemas["DataSpec"]["properties"]["chat_template_kwargs"]
    assert chat_template_kwargs["type"] == "object" and "enable_thinking" in chat_template_kwargs["description"]
    assert "tagged sweep-<id>" in schemas["RunCreate"]["properties"]["sweep"]["description"]
    assert "sweep" in paths["/api/v1/projects/{slug}/runs/"]["post"]["responses"]["201"]["description"]
    query = {parameter["name"]: parameter for parameter in paths["/api/v1/projects/{slug}/runs/"]["get"]["parameters"]}
    named, by_metric = query["sort"]["schema"]["anyOf"]
    assert named["enum"] == ["newest", "oldest", "name", "-name", "status", "task", "steps", "loss", "eval_loss",
                             "reward", "duration"]
    assert by_metric == {"type": "string", "pattern": "^-?metric:.+$"} and "metric:<final metric>" in query["sort"]["description"]
    assert query["status"]["schema"]["enum"] == ["queued", "running", "succeeded", "failed", "cancelled"]
    assert query["task"]["schema"]["enum"][-1] == "external" and query["archived"]["schema"]["enum"] == ["0", "1"]
    assert query["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 500} and "cursor" in query
    assert "next" in paths["/api/v1/projects/{slug}/runs/"]["get"]["responses"]["200"]["description"]
    for path in ("runs", "datasets", "pipelines", "base-models"):  # the POSTs that take an Idempotency-Key
        responses = paths[f"/api/v1/projects/{{slug}}/{path}/"]["post"]["responses"]
        assert "another body" in responses["422"]["description"]
        assert "still being processed" in responses["409"]["description"]
    assert not {"409", "422"} & set(paths["/api/v1/projects/{slug}/runs/{run_id}/cancel/"]["post"]["responses"])


def test_the_tokens_page_shows_a_new_token_once(world, client_for):
    team, _apis, _sent = world
    client = client_for(team.viewer)
    page = client.post("/accounts/tokens/", {"name": "ci"}).content.decode()
    assert 'id="new-token"' in page and "<code>tmp_" in page
    assert 'id="new-token"' not in client.get("/accounts/tokens/").content.decode()



def test_the_tokens_page_says_where_tokens_of_the_openai_compatible_api_are_made(world, client_for):
    """QA: a newcomer who wanted to call /v1 made a token on the API tokens page, the one the top bar names,
    and learnt only from the 401 that /v1 takes a project's token, made on its Chat page."""
    team, _apis, _sent = world
    page = client_for(team.teammate).get("/accounts/tokens/").content.decode()
    note = page.split('<p id="v1-tokens">')[1].split("</p>")[0]
    assert "The OpenAI-compatible API at <code>/v1/</code> takes a project token (<code>tpk_…</code>) instead" in note
    assert f'href="/p/{team.project.slug}/chat/#api-tokens"' in note
    viewer_note = client_for(team.viewer).get("/accounts/tokens/").content.decode().split('<p id="v1-tokens">')[1]
    assert "/chat/" not in viewer_note.split("</p>")[0]  # a viewer may not chat, nor make one

def test_the_tokens_page_takes_a_name_as_long_as_is_kept(world, client_for):
    """A name is kept to 100 characters; the page took any length and cut it without a word (the chat
    page's project-token name input stops at 100)."""
    team, _apis, _sent = world
    page = client_for(team.viewer).get("/accounts/tokens/").content.decode()
    assert '<input type="text" id="token-name" name="name" placeholder="laptop" maxlength="100">' in page
    assert ApiToken._meta.get_field("name").max_length == 100


def test_revoking_a_token_says_whether_one_was_revoked(world, client_for):
    team, _apis, _sent = world
    mine, _secret = token_create(user=team.viewer, name="mine")
    theirs, _secret = token_create(user=team.teammate, name="theirs")
    client = client_for(team.viewer)
    page = client.post(f"/accounts/tokens/{mine.pk}/revoke/", follow=True).content.decode()
    assert "Token revoked." in page and "mine" not in page.split("Token revoked.")[1]
    again = client.post(f"/accounts/tokens/{mine.pk}/revoke/", follow=True).content.decode()
    other = client.post(f"/accounts/tokens/{theirs.pk}/revoke/", follow=True).content.decode()
    for page in (again, other):  # a second click and another user's id read alike, and change nothing
        assert "Token revoked." not in page and "nothing was revoked" in page
    assert ApiToken.objects.filter(pk=theirs.pk).exists()


def test_revoking_asks_first_naming_the_token(world, client_for):
    # Revoking cannot be undone: the button sits behind a summary that says so (no script needed).
    team, _apis, _sent = world
    token, _secret = token_create(user=team.viewer, name="<b>ci</b>")
    page = client_for(team.viewer).get("/accounts/tokens/").content.decode()
    confirm = page.split('<details class="confirm">')[1].split("</details>")[0]
    assert "<summary>Revoke…</summary>" in confirm and f'action="/accounts/tokens/{token.pk}/revoke/"' in confirm
    assert "cannot be undone" in confirm and "Revoke <bdi>&lt;b&gt;ci&lt;/b&gt;</bdi>" in confirm
    assert "<b>ci</b>" not in page


def test_pipelines_start_and_report_their_stages(world):
    team, apis, sent = world
    model, data = make_base_model(team.project), make_ready_version(team.project)
    # Eval data in both stages: the second stage's guard reads eval/loss of both.
    stage = {"task": "sft", "data": {"train": data.public_id, "eval": data.public_id}, "train": {"max_steps": 5}}
    document = {"name": "two", "stages": [{"name": "a", "spec": {**stage, "model": model.public_id}},
                                          {"name": "b", "spec": stage,
                                           "guard": {"metric": "eval/loss", "max_drop_percent": 5,
                                                     "higher_is_better": False}}]}
    status, bad = apis["teammate"].call("POST", "/api/v1/projects/alpha/pipelines/",
                                        {**document, "stages": [{"name": "a", "spec": stage}]})
    assert status == 400 and "stages.0.spec.model" in bad["errors"]
    assert apis["viewer"].call("POST", "/api/v1/projects/alpha/pipelines/", document)[0] == 403
    status, created = apis["teammate"].call("POST", "/api/v1/projects/alpha/pipelines/", document)
    assert status == 201 and created["status"] == "running" and created["stages"][0]["run"].startswith("run_")
    assert created["stages"][1]["run"] is None and created["stages"][1]["guard"]["metric"] == "eval/loss"
    status, got = apis["viewer"].call("GET", f"/api/v1/projects/alpha/pipelines/{created['id']}/")
    assert status == 200 and got["name"] == "two"
    assert apis["outsider"].call("GET", f"/api/v1/projects/alpha/pipelines/{created['id']}/")[0] == 404


def test_a_pipeline_is_cancelled_through_the_api(world):
    """There was no POST pipelines/<id>/cancel/: a script had to find the current stage's run and cancel that."""
    team, apis, _sent = world
    model, data = make_base_model(team.project), make_ready_version(team.project)
    document = {"name": "one", "stages": [{"name": "a", "spec": {"task": "sft", "model": model.public_id,
                                                                 "data": {"train": data.public_id},
                                                                 "train": {"max_steps": 5}}}]}
    status, created = apis["teammate"].call("POST", "/api/v1/projects/alpha/pipelines/", document)
    assert created["cancelled_by"] == ""
    path = f"/api/v1/projects/alpha/pipelines/{created['id']}/cancel/"
    assert apis["viewer"].call("POST", path)[0] == 403 and apis["outsider"].call("POST", path)[0] == 404
    status, cancelled = apis["owner"].call("POST", path)
    # Who cancelled it, as the page says: a pipeline a person cancelled is not resumed with its run.
    assert status == 200 and cancelled["status"] == "cancelled" and cancelled["cancelled_by"] == "alpha-owner"
    assert cancelled["message"].startswith("cancelled by alpha-owner at stage 1 (\u2068a\u2069); its run")
    assert apis["owner"].call("GET", f"/api/v1/projects/alpha/runs/{created['stages'][0]['run']}/")[1]["status"] == \
        "cancelled"
    assert apis["owner"].call("POST", path) == (400, {"errors": {"__all__": [
        f"pipeline \u2068one\u2069 ({created['id']}) has already ended (cancelled); only a running pipeline can be "
        "cancelled"]}})


def test_values_the_database_cannot_hold_are_named_not_a_500(world):
    """QA: each of these was a 500 with a traceback (OverflowError, IntegrityError on the JSON column,
    RecursionError), though nothing was stored."""
    from webapp.runs.models import Pipeline

    team, apis, _sent = world
    call = apis["teammate"].call
    status, run = call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "logged"})
    base = f"/api/v1/projects/alpha/runs/{run['id']}/"
    status, body = call("POST", base + "metrics/", {"points": [{"step": 10**20, "metrics": {"loss": 1.0}}]})
    assert status == 400 and "points.0.step" in body["errors"]
    status, body = call("POST", base + "metrics/", {"points": [{"step": 1, "tokens": 10**20, "metrics": {"loss": 1}}]})
    assert status == 400 and "points.0.tokens" in body["errors"]
    status, body = call("POST", base + "samples/", data=b'{"samples": [{"step": 1, "prompt": "p", "text": "t", '
                                                          b'"rewards": {"r": NaN}}]}')
    assert status == 400 and "samples.0.rewards.r" in body["errors"]
    status, body = call("POST", "/api/v1/projects/alpha/runs/", data=b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and body["errors"]["__all__"] == ["the body nests too deeply to be a request"]
    model, data = make_base_model(team.project), make_ready_version(team.project)
    stage = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 2}}
    for document, key in (
            ({"name": "   ", "stages": [{"name": "a", "spec": stage}]}, "name"),
            ({"name": "odd", "stages": [{"name": "a", "spec": stage},
                                        {"name": "e", "export": {"quantize": "int4", "group_size": 7}}]},
             "stages.1.export"),
            ({"name": "inf", "stages": [{"name": "a", "spec": stage},
                                        {"name": "b", "spec": stage, "guard": {"metric": "loss",
                                                                               "max_drop_percent": float("inf")}}]},
             "stages.1.guard.max_drop_percent")):
        status, body = call("POST", "/api/v1/projects/alpha/pipelines/", document)
        assert status == 400 and key in body["errors"], body
    assert not Pipeline.objects.exists()


def test_a_non_finite_wall_time_or_config_value_is_named_not_stored_or_a_500(world):
    """QA: a point's ``wall_time`` of NaN was answered "stored": 1 and then silently dropped (SQLite
    keeps a NaN as NULL, which the NOT NULL column's INSERT OR IGNORE skipped); one of Infinity was
    stored, after which the run's metrics, its state.json and the compare page wrote ``Infinity``,
    which is not JSON (the charts could not read them). An external run's config holding NaN or
    Infinity was a 500 (the JSON column's check refused the INSERT). Each is a 400 naming the field."""
    _team, apis, _sent = world
    call = apis["teammate"].call
    status, run = call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "clocked"})
    path = f"/api/v1/projects/alpha/runs/{run['id']}/metrics/"
    for wall_time in (float("nan"), float("inf"), float("-inf")):
        status, body = call("POST", path, {"points": [{"step": 1, "metrics": {"loss": 1.0}, "wall_time": wall_time}]})
        assert status == 400 and "points.0.wall_time" in body["errors"], body
    assert not MetricPoint.objects.exists()
    status, body = call("POST", path, {"points": [{"step": 1, "metrics": {"loss": 1.0}, "wall_time": 0}]})
    assert status == 201 and body["stored"] == 1
    assert MetricPoint.objects.get().wall_time == 0.0  # the Unix epoch as sent, not "now"
    for value in (float("nan"), float("inf")):
        status, body = call("POST", "/api/v1/projects/alpha/runs/",
                            {"external": True, "name": "odd config", "config": {"optim": {"lr": [1e-4, value]}}})
        assert status == 400 and body["errors"] == {"config.optim.lr.1": [f"{value} is not a finite number"]}, body
    assert not Run.objects.filter(name="odd config").exists()


def test_an_address_without_its_slash_or_a_post_to_the_openapi_document_gets_json(world):
    """A POST to .../runs (no slash) got Django's 301 to .../runs/, which urllib followed as a GET: the runs
    list came back and nothing was launched. A POST to openapi.json got the CSRF check's HTML page."""
    team, apis, _sent = world
    status, body = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs", {"external": True, "name": "x"})
    assert status == 404 and body["detail"] == ("no API address /api/v1/projects/alpha/runs; it ends with a slash: "
                                                "/api/v1/projects/alpha/runs/")
    assert not Run.objects.exists()
    status, body = apis["teammate"].call("POST", "/api/v1/openapi.json", {})
    assert status == 405 and body["detail"] == "POST is not allowed here; use GET, HEAD"
    assert apis["anonymous"].call("GET", "/api/v1/openapi.json")[0] == 200


@pytest.mark.parametrize("method,path,allowed", [
    ("delete", "/api/v1/projects/alpha/runs/", "GET, POST, HEAD"),
    ("get", "/api/v1/projects/alpha/runs/run_x/cancel/", "POST"),
    ("put", "/api/v1/projects/alpha/base-models/", "GET, POST, HEAD"),
    ("post", "/api/v1/openapi.json", "GET, HEAD"),
])
def test_a_wrong_method_is_told_the_allowed_ones_in_the_allow_header(db, method, path, allowed):
    """A 405 came without the Allow header HTTP requires on it (RFC 9110, 15.5.6): only the body said what to use."""
    from django.test import Client

    secret = token_create(user=make_team().teammate, name="test")[1]
    response = getattr(Client(), method)(path, HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 405 and response["Allow"] == allowed
    assert response.json() == {"detail": f"{method.upper()} is not allowed here; use {allowed}"}


def test_head_is_answered_wherever_get_is(db):
    """QA: HEAD on the API's GET addresses was a 405, where HTTP has every GET address answer HEAD (RFC 9110,
    9.3.2); on an address that also takes POST it is still a read, never the POST."""
    from django.test import Client

    team = make_team()
    secret = token_create(user=team.teammate, name="test")[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    for path in ("/api/v1/projects/alpha/runs/", "/api/v1/projects/alpha/base-models/"):
        got, head = client.get(path), client.head(path)
        assert (head.status_code, head["Content-Type"]) == (got.status_code, got["Content-Type"]) == (200, "application/json")
    assert client.head("/api/v1/projects/alpha/runs/run_x/cancel/").status_code == 405
    assert not Run.objects.exists()


def test_bodies_take_numbers_and_booleans_as_json_writes_them_not_as_text(world):
    """A step of "3" was read as 3 and "external": "yes" as true, where the job spec refuses such values:
    a script's mistake was guessed at. A whole number still fills a float."""
    _team, apis, _sent = world
    call = apis["teammate"].call
    status, body = call("POST", "/api/v1/projects/alpha/runs/", {"external": "yes", "name": "x"})
    assert status == 400 and "external" in body["errors"], body
    status, run = call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "x"})
    assert status == 201
    metrics = f"/api/v1/projects/alpha/runs/{run['id']}/metrics/"
    status, body = call("POST", metrics, {"points": [{"step": "3", "metrics": {"loss": 1.0}}]})
    assert status == 400 and "points.0.step" in body["errors"], body
    status, body = call("POST", metrics, {"points": [{"step": 3, "metrics": {"loss": "1.0"}}]})
    assert status == 400 and "points.0.metrics.loss" in body["errors"], body
    assert call("POST", metrics, {"points": [{"step": 3, "metrics": {"loss": 1}}]})[0] == 201


def test_numbers_past_pythons_digit_limit_and_deep_nesting_are_named_not_a_server_error(world):
    """QA: a 5,000-digit number anywhere in a body (json.loads' ValueError), in a spec's YAML (int()'s),
    and "[" * 2000 in spec_yaml (PyYAML's RecursionError) were 500 pages."""
    _team, apis, _sent = world
    call = apis["teammate"].call
    huge = "9" * 5000
    status, body = call("POST", "/api/v1/projects/alpha/runs/", data=('{"spec": {"train": {"max_steps": ' + huge + '}}}').encode())
    assert status == 400 and body["errors"]["__all__"] == [
        "the body cannot be read: a number has more digits than any field takes (over 4,300)"], body
    for text, problem in (("train: {max_steps: " + huge + "}", "a number has more digits than any setting takes"),
                          ("[" * 2000 + "]" * 2000, "it nests too deeply"), ("when: 2024-13-01", "month must be in 1..12")):
        status, body = call("POST", "/api/v1/projects/alpha/runs/", {"spec_yaml": text})
        assert status == 400 and problem in " ".join(body["errors"]["spec_yaml"]), body
    status, body = call("GET", "/api/v1/projects/alpha/runs/")  # nothing was made
    assert body["runs"] == []


def test_a_body_that_is_not_utf8_is_named_as_such(world):
    """QA: a body in Latin-1 (a script that encoded 'café' as its platform does) was refused as holding "a
    number [with] more digits than any field takes": the decoding error was taken for the digit limit, and
    the script's author was sent looking for a number. It says the body is not UTF-8, and where."""
    _team, apis, _sent = world
    status, body = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/",
                                         data='{"external": true, "name": "café"}'.encode("latin-1"))
    assert status == 400 and body == {"errors": {"__all__": [
        "the body is not JSON in UTF-8: byte 0xe9 at position 31 is not UTF-8; send JSON encoded as UTF-8"]}}, body
    assert not Run.objects.exists()


def test_an_external_run_cannot_be_resumed_or_retried(world, client_for):
    """An external run was 'resumed' (200, queued): the train worker then failed it, replacing its finish
    message. Resume and retry are refused in the service, so the API and the web page both say why."""
    team, apis, sent = world
    _status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "laptop"})
    path = f"/api/v1/projects/alpha/runs/{run['id']}/"
    apis["teammate"].call("POST", path + "finish/", {"status": "failed", "message": "OOM on my laptop"})
    status, body = apis["teammate"].call("POST", path + "resume/", {"max_steps": 100})
    assert status == 400 and "external run" in json.dumps(body) and "outside Temper" in json.dumps(body)
    stored = Run.objects.get(public_id=run["id"])
    assert (stored.status, stored.error_message, stored.attempt) == ("failed", "OOM on my laptop", 1)
    client = client_for(team.teammate)
    page = client.get(f"/p/alpha/runs/{run['id']}/").content.decode()
    assert "runs:resume" not in page and ">Resume</button>" not in page and ">Retry</button>" not in page
    for action in ("resume", "retry"):
        answer = client.post(f"/p/alpha/runs/{run['id']}/{action}/", follow=True).content.decode()
        assert "outside Temper" in answer
    assert Run.objects.count() == 1 and Run.objects.get().status == "failed"
    assert sent == []


def test_text_with_nul_or_past_its_column_is_refused_by_field(world):
    """The API skipped what the web forms check: a dataset named with 5,000 characters (the column holds 100)
    or with a NUL was made, metric names of 100,000 characters, '' and 'a\\x00' were stored. PostgreSQL
    refuses NUL in text (a 500 there). Each is a 400 naming the field; nothing is stored."""
    _team, apis, _sent = world
    api = apis["teammate"]
    for name, why in (("d" * 5000, "5,000 characters; at most 100"), ("qa\x00", "NUL character (\\x00) at position 3")):
        status, body = api.upload("/api/v1/projects/alpha/datasets/", {"name": name, "kind": "sft"}, "a.jsonl",
                                  b'{"prompt": "p", "completion": "c"}\n')
        assert (status, list(body["errors"])) == (400, ["name"]) and why in body["errors"]["name"][0]
    status, body = api.upload("/api/v1/projects/alpha/datasets/", {"name": "ok", "kind": "sft",
                                                                    "mapping": '{"prompt": "q\\u0000"}'},
                              "a.jsonl", b'{"prompt": "p", "completion": "c"}\n')
    assert status == 400 and list(body["errors"]) == ["mapping.prompt"]
    assert not Dataset.objects.exists()
    status, body = api.call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "x\x00"})
    assert status == 400 and list(body["errors"]) == ["name"]
    status, body = api.call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "config": {"lr": "1\x00"}})
    assert status == 400 and list(body["errors"]) == ["config.lr"]
    _status, run = api.call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "laptop"})
    path = f"/api/v1/projects/alpha/runs/{run['id']}/"
    for metric, why in (("m" * 100_000, "100,000 characters; at most 100"), ("", "empty"),
                        ("a\x00", "NUL character (\\x00) at position 2")):
        status, body = api.call("POST", path + "metrics/", {"points": [{"step": 1, "metrics": {"loss": 1.0}},
                                                                       {"step": 2, "metrics": {metric: 1.0}}]})
        assert (status, list(body["errors"])) == (400, ["points.1.metrics"]) and why in body["errors"]["points.1.metrics"][0]
    assert not MetricPoint.objects.exists()
    status, body = api.call("POST", path + "samples/", {"samples": [{"step": 1, "prompt": "p", "text": "t\x00"}]})
    assert status == 400 and list(body["errors"]) == ["samples.0.text"]
    status, body = api.call("POST", path + "finish/", {"status": "failed", "message": "oom\x00"})
    assert status == 400 and list(body["errors"]) == ["message"]
    assert Run.objects.get(public_id=run["id"]).status == "running"


def test_a_metric_name_of_only_spaces_is_refused_as_an_empty_one(world):
    """QA: a metric named ' ' was stored, and charted under a blank title on the run and compare pages
    (and a blank cell of the CSV) where nothing says which metric it is; it is refused as '' is."""
    _team, apis, _sent = world
    api = apis["teammate"]
    _status, run = api.call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "blank"})
    path = f"/api/v1/projects/alpha/runs/{run['id']}/metrics/"
    for metric in (" ", "\t \n", "\u3000"):
        status, body = api.call("POST", path, {"points": [{"step": 1, "metrics": {"loss": 1.0, metric: 2.0}}]})
        assert (status, list(body["errors"])) == (400, ["points.0.metrics"]), body
        assert "empty" in body["errors"]["points.0.metrics"][0]
    assert not MetricPoint.objects.exists()
    status, body = api.call("POST", path, {"points": [{"step": 1, "metrics": {" loss": 1.0}}]})
    assert status == 201 and MetricPoint.objects.get().name == " loss"  # a name is kept as sent, spaces and all


def test_text_with_a_lone_surrogate_is_refused_by_field(world):
    """QA: JSON may escape half of a UTF-16 pair ("\\ud800"), which decodes to no character: a run name or a
    metric name holding one, or a finish message, was a 500 (the database's UTF-8 encoding failed), and a
    config, a tag or a sample's text was stored, to fail each page that wrote it out. Each is a 400 naming the
    field; nothing is stored."""
    _team, apis, _sent = world
    api = apis["teammate"]
    runs = "/api/v1/projects/alpha/runs/"
    for body, field in (('{"external": true, "name": "a\\ud800b"}', "name"),
                        ('{"external": true, "config": {"k": ["x", "a\\udfff"]}}', "config.k.1"),
                        ('{"external": true, "config": {"\\ud800": 1}}', "config"),
                        ('{"external": true, "tags": ["t\\ud800"]}', "tags")):
        status, answer = api.call("POST", runs, data=body.encode())
        assert status == 400 and list(answer["errors"]) == [field], answer
        assert "U+D800" in answer["errors"][field][0] or "U+DFFF" in answer["errors"][field][0]
    assert not Run.objects.exists()
    _status, run = api.call("POST", runs, {"external": True, "name": "laptop"})
    path = f"{runs}{run['id']}/"
    for suffix, body, field in (
            ("metrics/", '{"points": [{"step": 1, "metrics": {"l\\ud800": 1}}]}', "points.0.metrics"),
            ("samples/", '{"samples": [{"step": 1, "prompt": "p", "text": "t\\ud800"}]}', "samples.0.text"),
            ("finish/", '{"status": "failed", "message": "m\\ud800"}', "message")):
        status, answer = api.call("POST", path + suffix, data=body.encode())
        assert status == 400 and list(answer["errors"]) == [field], answer
    assert not MetricPoint.objects.exists() and Run.objects.get(public_id=run["id"]).status == "running"
    status, _answer = api.call("POST", path + "samples/", data='{"samples": [{"step": 1, "prompt": "p", '
                                                               '"text": "\\ud83d\\ude00"}]}'.encode())
    assert status == 201  # a whole pair is a character (an emoji), and is kept


def test_an_upload_with_two_files_or_two_names_is_refused(world):
    """Two 'file' parts made a dataset of the last one, without a word about the first."""
    _team, apis, _sent = world
    boundary = uuid.uuid4().hex
    row = b'{"prompt": "p", "completion": "c"}\n'

    def part(name: str, value: bytes, filename: str | None = None) -> bytes:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        return f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n"

    for parts, field in (([part("name", b"qa"), part("kind", b"sft"), part("file", row, "a.jsonl"),
                           part("file", row, "b.jsonl")], "file"),
                         ([part("name", b"qa"), part("name", b"qb"), part("kind", b"sft"),
                           part("file", row, "a.jsonl")], "name")):
        status, body = apis["teammate"].call("POST", "/api/v1/projects/alpha/datasets/",
                                             data=b"".join(parts) + f"--{boundary}--\r\n".encode(),
                                             content_type=f"multipart/form-data; boundary={boundary}")
        assert status == 400 and list(body["errors"]) == [field] and "send one" in body["errors"][field][0]
        if field == "file":  # the web form's refusal, in the same words
            assert body["errors"]["file"] == ["2 files were sent: send one file per upload (upload each as a "
                                              "version of its own)"]
    assert not Dataset.objects.exists()


def test_a_sweep_launches_a_run_per_combination_or_none(world):
    team, apis, sent = world
    model, data = make_base_model(team.project), make_ready_version(team.project)
    spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 5},
            "peft": {"method": "lora"}}  # full fine-tuning reads no peft.rank: such a sweep would be refused
    runs_path = "/api/v1/projects/alpha/runs/"
    status, bad = apis["teammate"].call("POST", runs_path, {"spec": spec, "sweep": {
        "optim.learning_rate": [0.0001, 2.0], "peft.rank": [8, 16], "peft.rnak": [4]}})
    assert status == 400 and bad == {"errors": {"sweep": [
        "peft.rnak: not a key of peft in an sft spec; its keys: method, rank, alpha, dropout, targets, quant_bits, "
        "group_size"]}}
    status, bad = apis["teammate"].call("POST", runs_path, {"spec": spec, "sweep": {
        "optim.learning_rate": [0.0001, 2.0], "peft.rank": [8, 16]}})
    assert status == 400 and bad == {"errors": {"sweep": [
        "optim.learning_rate = 2.0: 2.0 is too large: give a number above 0 and at most 1 (combination 3 of 4: "
        "learning_rate=2.0 rank=8)"]}}
    assert not Run.objects.exists() and sent == []
    status, bad = apis["teammate"].call("POST", runs_path, {"spec": spec, "sweep": {"peft.rank": "8, 16"}})
    assert status == 400 and list(bad["errors"]) == ["sweep.peft.rank"]
    status, external = apis["teammate"].call("POST", runs_path, {"external": True, "sweep": {"peft.rank": [8]}})
    assert status == 400 and "an external run takes config, not spec, spec_yaml or sweep" in json.dumps(external)

    status, created = apis["teammate"].call("POST", runs_path, {
        "spec_yaml": json.dumps(spec), "name": "api", "tags": ["mine"],
        "sweep": {"optim.learning_rate": [0.0001, 0.001], "peft.rank": [8, 16]}})
    assert status == 201 and created["sweep"].startswith("sweep-")
    assert [(run["name"], run["spec"]["optim"]["learning_rate"], run["spec"]["peft"]["rank"], run["tags"])
            for run in created["runs"]] == [
        (f"api · learning_rate={lr} rank={rank}", lr, rank, [created["sweep"], "mine"])
        for lr in (0.0001, 0.001) for rank in (8, 16)]
    assert sent == [[Run.objects.get(public_id=run["id"]).pk, 1] for run in created["runs"]]  # queued in that order
    status, listed = apis["viewer"].call("GET", f"{runs_path}?tag={created['sweep']}&sort=oldest")
    assert [run["id"] for run in listed["runs"]] == [run["id"] for run in created["runs"]]
    assert apis["viewer"].call("POST", runs_path, {"spec": spec, "sweep": {"peft.rank": [8, 16]}})[0] == 403
    assert apis["outsider"].call("POST", runs_path, {"spec": spec, "sweep": {"peft.rank": [8, 16]}})[0] == 404
    assert Run.objects.count() == 4


def test_an_upload_with_a_field_the_api_does_not_take_is_refused_naming_it(world):
    """QA: a misnamed field was dropped without a word, as the JSON bodies' unknown keys are not: "format": "csv"
    (for file_format) or "column_mapping" (for mapping) made a dataset read by the file's extension and
    without the mapping, and "type" for kind was told only that kind was missing."""
    _team, apis, _sent = world
    rows = b'prompt,completion\na,b\n'
    for fields, field in (({"name": "a", "kind": "sft", "format": "csv"}, "format"),
                          ({"name": "b", "kind": "sft", "column_mapping": '{"prompt": "q"}'}, "column_mapping")):
        status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/", fields, "rows.txt", rows)
        assert status == 400 and list(body["errors"]) == [field], body
        assert body["errors"][field] == [f"{field!r} is not a field of an upload; send file, kind, name (or dataset "
                                         "for a new version), file_format, mapping"]
    assert not Dataset.objects.exists()
    status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/",
                                           {"name": "c", "kind": "sft", "file_format": "csv"}, "rows.txt", rows)
    assert status == 201, body


def test_a_body_s_own_problems_are_told_without_pydantic_s_words(world):
    """QA: a launch with neither spec nor spec_yaml was told "Value error, give exactly one of ...", and a JSON
    list for the body "Input should be a valid dictionary or instance of RunCreate" (a class the client never
    sees)."""
    _team, apis, _sent = world
    api = apis["teammate"]
    status, body = api.call("POST", "/api/v1/projects/alpha/runs/", {})
    assert status == 400 and body == {"errors": {"__all__": ["give exactly one of spec and spec_yaml (or external: true)"]}}
    for sent in (b"[1]", b'"spec"'):
        status, body = api.call("POST", "/api/v1/projects/alpha/runs/", data=sent)
        assert status == 400 and body == {"errors": {"__all__": ["the body must be a JSON object"]}}, body


def test_every_answer_is_what_the_openapi_document_says(world):
    """QA: every response in the OpenAPI document was {"type": "object"}, so a client generated from it knew no
    field of any answer. Each endpoint's real answers (successes and errors) now validate, strictly and with no
    key left over, against the schema the document gives for that status."""
    from pydantic import TypeAdapter, ValidationError

    from webapp.api import schemas

    team, apis, _sent = world
    api = apis["teammate"]
    document = api.call("GET", "/api/v1/openapi.json")[1]
    components = document["components"]["schemas"]
    model, data = make_base_model(team.project), make_ready_version(team.project)
    base = "/api/v1/projects/alpha"

    def check(method: str, path: str, status: int, body=None, *, template: str | None = None, call=None):
        """The answer of ``method path``: its status, and its body valid against the document's schema for it."""
        got_status, got = call() if call else api.call(method, f"{base}/{path}", body)
        assert got_status == status, (path, got)
        operation = document["paths"][f"/api/v1/projects/{{slug}}/{template or path}"][method.lower()]
        schema = operation["responses"][str(status)]["content"]["application/json"]["schema"]
        names = [reference["$ref"].rsplit("/", 1)[1] for reference in schema.get("oneOf", [schema])]
        assert set(names) <= set(components), names
        problems = []
        for name in names:  # strict, no key left over; one of them when the document gives several
            try:
                TypeAdapter(getattr(schemas, name)).validate_json(json.dumps(got))
                return got
            except ValidationError as error:
                problems.append(error)
        raise AssertionError(f"{method} {path}: {problems}")

    check("GET", "base-models/", 200)
    check("GET", f"base-models/{model.public_id}/", 200, template="base-models/{model_id}/")
    check("GET", "storage/", 200)
    rows = b'{"prompt": "a", "completion": "b"}\n'
    uploaded = check("POST", "datasets/", 201, template="datasets/", call=lambda: api.upload(
        f"{base}/datasets/", {"name": "up", "kind": "sft"}, "up.jsonl", rows))
    check("GET", "datasets/", 200)
    check("GET", f"datasets/{data.dataset.public_id}/", 200, template="datasets/{dataset_id}/")
    check("GET", f"datasets/{data.dataset.public_id}/versions/1/", 200,
          template="datasets/{dataset_id}/versions/{number}/")
    second = make_ready_version(team.project, rows=[{"prompt": "q0", "completion": "answer 0"}])  # v2 of data's
    compared = check("GET", f"datasets/{data.dataset.public_id}/compare/", 200, template="datasets/{dataset_id}/compare/")
    assert (compared["unchanged"], compared["removed"], compared["added"]) == (1, 7, 0)
    check("GET", f"datasets/{data.dataset.public_id}/compare/?a=2&b=2", 400, template="datasets/{dataset_id}/compare/")
    derive = "datasets/{dataset_id}/versions/{number}/derive/"
    derived = check("POST", f"datasets/{data.dataset.public_id}/versions/1/derive/", 202,
                    {"kind": "decontaminate", "against": second.public_id}, template=derive)
    assert derived["derivation"]["kind"] == "decontaminate" and derived["derivation"]["removed_rows"] == 1
    check("POST", f"datasets/{data.dataset.public_id}/versions/1/derive/", 400, {"kind": "dedupe"}, template=derive)
    spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 5},
            "peft": {"method": "lora"}}
    run = check("POST", "runs/", 201, {"spec": spec, "name": "one"})
    check("POST", "runs/", 201, {"spec": spec, "sweep": {"peft.rank": [4, 8]}})
    check("GET", "runs/?limit=1", 200, template="runs/")
    check("GET", f"runs/{run['id']}/", 200, template="runs/{run_id}/")
    check("GET", f"runs/{run['id']}/logs/?tail=5", 200, template="runs/{run_id}/logs/")
    check("POST", f"runs/{run['id']}/cancel/", 200, template="runs/{run_id}/cancel/")
    check("POST", f"runs/{run['id']}/retry/", 201, template="runs/{run_id}/retry/")
    check("POST", f"runs/{run['id']}/duplicate/", 201, {"spec": {"train": {"max_steps": 6}}},
          template="runs/{run_id}/duplicate/")
    check("POST", f"runs/{run['id']}/duplicate/", 400, {"spec": {"train": {"max_steps": "six"}}},
          template="runs/{run_id}/duplicate/")
    external = check("POST", "runs/", 201, {"external": True, "name": "laptop", "config": {"lr": 0.1}})
    runs = "runs/{run_id}/"
    check("GET", f"runs/{run['id']}/checkpoints/", 200, template=runs + "checkpoints/")
    check("POST", f"runs/{run['id']}/checkpoints/1/export/", 404, template=runs + "checkpoints/{step}/export/")
    check("POST", f"runs/{external['id']}/metrics/", 201, {"points": [{"step": 1, "metrics": {"loss": 2.0}}]},
          template=runs + "metrics/")
    check("POST", f"runs/{external['id']}/samples/", 201,
          {"samples": [{"step": 1, "prompt": "p", "text": "t", "rewards": {"r": 1.0}}]}, template=runs + "samples/")
    check("GET", f"runs/{external['id']}/metrics/", 200, template=runs + "metrics/")
    check("GET", f"runs/{external['id']}/samples/", 200, template=runs + "samples/")
    finished = check("POST", f"runs/{external['id']}/finish/", 200, {"status": "succeeded"}, template=runs + "finish/")
    assert finished["status"] == "succeeded"
    check("PATCH", f"runs/{external['id']}/", 200, {"name": "desk", "tags": ["t"], "notes": "n", "archived": True},
          template=runs)
    check("PATCH", f"runs/{external['id']}/", 400, {"name": ""}, template=runs)
    pipeline = check("POST", "pipelines/", 201, {"name": "p", "stages": [{"name": "a", "spec": spec}]})
    check("GET", "pipelines/", 200)
    check("GET", f"pipelines/{pipeline['id']}/", 200, template="pipelines/{pipeline_id}/")
    cancelled = check("POST", f"pipelines/{pipeline['id']}/cancel/", 200, template="pipelines/{pipeline_id}/cancel/")
    assert cancelled["status"] == "cancelled"
    check("POST", f"pipelines/{pipeline['id']}/cancel/", 400, template="pipelines/{pipeline_id}/cancel/")
    # The errors: a field's problem, and the rest.
    check("POST", "runs/", 400, {"spec": spec, "bogus": 1})
    check("GET", "runs/run_nothing/", 404, template="runs/{run_id}/")
    check("POST", "runs/", 403, {"spec": spec}, call=lambda: apis["viewer"].call("POST", f"{base}/runs/", {"spec": spec}))
    check("GET", "runs/", 401, call=lambda: apis["anonymous"].call("GET", f"{base}/runs/"))
    check("DELETE", f"datasets/{data.dataset.public_id}/", 400, template="datasets/{dataset_id}/",  # runs read it
          call=lambda: apis["owner"].call("DELETE", f"{base}/datasets/{data.dataset.public_id}/"))
    check("GET", f"datasets/{uploaded['dataset']['id']}/versions/2/", 404,
          template="datasets/{dataset_id}/versions/{number}/")


def test_samples_come_a_page_at_a_time_with_a_link_to_the_next(world):
    """QA: the samples of a run came back cut at the first 5,000 without a word, so a script reading a long GRPO
    run's rollouts lost the rest; they now page as the runs list does (limit, and the next link)."""
    _team, apis, _sent = world
    api = apis["teammate"]
    status, run = api.call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "rl"})
    path = f"/api/v1/projects/alpha/runs/{run['id']}/samples/"
    logged = [{"step": step, "prompt": f"p{step}.{n}", "text": "t"} for step in (2, 1, 3) for n in range(3)]
    assert api.call("POST", path, {"samples": logged})[0] == 201
    read, url, pages = [], f"{path}?limit=4", 0
    while url:
        status, page = api.call("GET", url.removeprefix(api.base))
        assert status == 200 and len(page["samples"]) <= 4, page
        read += [(sample["step"], sample["position"], sample["prompt"]) for sample in page["samples"]]
        url, pages = page["next"], pages + 1
    assert pages == 3 and read == sorted(read) and len(read) == 9 and len(set(read)) == 9
    assert [prompt for _step, _position, prompt in read][:3] == ["p1.0", "p1.1", "p1.2"]
    status, page = api.call("GET", f"{path}?step=2&limit=2")
    assert [sample["prompt"] for sample in page["samples"]] == ["p2.0", "p2.1"] and "step=2" in page["next"]
    status, page = api.call("GET", page["next"].removeprefix(api.base))
    assert [sample["prompt"] for sample in page["samples"]] == ["p2.2"] and page["next"] is None
    status, page = api.call("GET", path)
    assert len(page["samples"]) == 9 and page["next"] is None  # up to 1,000 a page when limit is left out
    assert api.call("GET", f"{path}?limit=5001") == (400, {"errors": {"limit": [
        "'5001' is not a page size; give a whole number from 1 to 5000 (1000 when left out)"]}})


def test_a_refused_token_is_told_why(world):
    """QA: a revoked token and a project token (tpk_…, the /v1 API's) were both told "send 'Authorization: Bearer
    <token>' with a token from the API tokens page", as if none had been sent."""
    from webapp.api.services import token_revoke
    from webapp.chat.tokens import project_token_create

    team, apis, _sent = world
    runs = "/api/v1/projects/alpha/runs/"
    revoked = ApiToken.objects.get(user=team.teammate)
    assert token_revoke(user=team.teammate, token_id=revoked.pk)
    status, body = apis["teammate"].call("GET", runs)
    assert status == 401 and body == {"detail": "the token sent is not a valid API token (revoked, mistyped, or its "
                                                "user deactivated); make one on the API tokens page and send it as "
                                                "'Authorization: Bearer <token>'"}
    project_secret = project_token_create(user=team.owner, project=team.project, name="chat")[1]
    status, body = Api(apis["owner"].base, project_secret).call("GET", runs)
    assert status == 401 and body == {"detail": "this is a project token (tpk_…), for the OpenAI-compatible API at "
                                                "/v1/; the REST API takes a token from the API tokens page (tmp_…)"}
    status, body = apis["anonymous"].call("GET", runs)
    assert status == 401 and body == {"detail": "send 'Authorization: Bearer <token>' with a token from the API "
                                                "tokens page"}


def test_an_unknown_task_is_told_once(world):
    """QA: a spec's unknown task was told twice under task, once by Temper's check and once by the engine's."""
    _team, apis, _sent = world
    status, body = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"spec": {"task": "sftx"}})
    assert status == 400 and body["errors"]["task"] == ["'sftx' is not one of pretrain, sft, reward, dpo, grpo, ppo"]


def test_pipelines_come_a_page_at_a_time_with_a_link_to_the_next(world):
    """QA: the pipelines list was cut at the newest 200 without a word; it now pages as the runs list does."""
    from webapp.runs.models import Pipeline

    team, apis, _sent = world
    made = [Pipeline.objects.create(project=team.project, name=f"p{n}", stages=[], created_by=team.owner).public_id
            for n in range(5)]
    read, url, pages = [], "/api/v1/projects/alpha/pipelines/?limit=2", 0
    while url:
        status, page = apis["viewer"].call("GET", url.removeprefix(apis["viewer"].base))
        assert status == 200 and len(page["pipelines"]) <= 2, page
        read += [pipeline["id"] for pipeline in page["pipelines"]]
        url, pages = page["next"], pages + 1
    assert pages == 3 and read == made[::-1]  # newest first, each once
    status, page = apis["viewer"].call("GET", "/api/v1/projects/alpha/pipelines/")
    assert [pipeline["id"] for pipeline in page["pipelines"]] == made[::-1] and page["next"] is None


def test_datasets_come_a_page_at_a_time_with_a_link_to_the_next(world):
    """The datasets list had no paging: every dataset in one answer. It now pages by name as the runs list does."""
    team, apis, _sent = world
    # bulk_create does not call save(), which fills name_key.
    Dataset.objects.bulk_create([Dataset(project=team.project, name=name, name_key=f"{name}-{index}", kind="sft",
                                         created_by=team.owner) for index, name in enumerate(
                                             ["set-d", "set-a", "set-c", "set-b", "set-e"])])
    read, url, pages = [], "/api/v1/projects/alpha/datasets/?limit=2", 0
    while url:
        status, page = apis["viewer"].call("GET", url.removeprefix(apis["viewer"].base))
        assert status == 200 and len(page["datasets"]) <= 2, page
        read += [dataset["name"] for dataset in page["datasets"]]
        url, pages = page["next"], pages + 1
    assert pages == 3 and read == ["set-a", "set-b", "set-c", "set-d", "set-e"]  # by name, each once
    status, page = apis["viewer"].call("GET", "/api/v1/projects/alpha/datasets/")
    assert len(page["datasets"]) == 5 and page["next"] is None
    status, body = apis["viewer"].call("GET", "/api/v1/projects/alpha/datasets/?limit=0")
    assert status == 400 and "limit" in body["errors"]
    status, body = apis["viewer"].call("GET", "/api/v1/projects/alpha/datasets/?cursor=edited")
    assert status == 400 and "cursor" in body["errors"]


def test_a_run_is_renamed_tagged_noted_and_archived_as_on_its_page(world):
    """The API could not rename, tag, note or archive a run that the web page could: PATCH runs/<id>/ does it
    through the page's services, with their rules and the API's field-named errors."""
    _team, apis, _sent = world
    _status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "x"})
    url = f"/api/v1/projects/alpha/runs/{run['id']}/"
    status, body = apis["teammate"].call("PATCH", url, {"name": "lr sweep", "tags": ["a", " b ", "a"],
                                                        "notes": "**why**"})
    assert status == 200, body
    assert (body["name"], body["tags"], body["notes"], body["archived"]) == ("lr sweep", ["a", "b"], "**why**", False)
    status, body = apis["teammate"].call("PATCH", url, {"tags": []})  # only what is sent changes
    assert status == 200 and (body["name"], body["tags"], body["notes"]) == ("lr sweep", [], "**why**")
    # An open run is not archived, and nothing else of that request is kept.
    status, body = apis["teammate"].call("PATCH", url, {"name": "renamed", "archived": True})
    assert status == 400 and body["errors"]["archived"][0].endswith("cancel it first, then archive it. Nothing was "
                                                                    "archived"), body
    assert apis["viewer"].call("GET", url)[1]["name"] == "lr sweep"
    apis["teammate"].call("POST", f"{url}finish/", {"status": "succeeded"})
    status, body = apis["teammate"].call("PATCH", url, {"archived": True})
    assert status == 200 and body["archived"] is True
    status, body = apis["owner"].call("PATCH", url, {"archived": False})
    assert status == 200 and body["archived"] is False
    # The page's rules: a name is required, tags are checked; each error names its field.
    status, body = apis["teammate"].call("PATCH", url, {"name": " "})
    assert status == 400 and list(body["errors"]) == ["name"]
    status, body = apis["teammate"].call("PATCH", url, {"tags": ["x" * 41]})
    assert status == 400 and list(body["errors"]) == ["tags"]
    status, body = apis["teammate"].call("PATCH", url, {"notes": None})
    assert status == 400 and body["errors"]["notes"] == ['null is not a value of notes: leave the key out to keep '
                                                         'it as it is, or send "" to clear it']
    status, body = apis["teammate"].call("PATCH", url, {"archived": "yes", "colour": "red"})
    assert status == 400 and set(body["errors"]) == {"archived", "colour"}
    status, body = apis["teammate"].call("PATCH", url, {})
    assert status == 400 and body["errors"]["__all__"] == ["give at least one of name, tags, notes, archived"]
    # A viewer reads the run but changes nothing of it; an outsider does not find it.
    assert apis["viewer"].call("PATCH", url, {"name": "mine"})[0] == 403
    assert apis["outsider"].call("PATCH", url, {"name": "mine"})[0] == 404
    assert apis["viewer"].call("GET", url)[1]["name"] == "lr sweep"


@pytest.mark.parametrize(("path", "sent", "errors"), [
    # a misspelled key was "Extra inputs are not permitted", naming no key that is allowed
    ("runs/", {"external": True, "nmae": "x"},
     {"nmae": ["unknown key; allowed keys here: spec, spec_yaml, name, tags, sweep, external, config"]}),
    ("runs/{external}/metrics/", {"points": [{"step": 1, "metrics": {"loss": 1.0}, "token": 5}]},
     {"points.0.token": ["unknown key; allowed keys here: step, metrics, tokens, wall_time"]}),
    # a boolean or number sent as text: "Input should be a valid boolean" / "... integer"
    ("runs/", {"external": "yes"}, {"external": ["'yes' is text (in quotes); write true or false without quotes"]}),
    ("runs/{external}/metrics/", {"points": [{"step": "3", "metrics": {"loss": 1.0}}]},
     {"points.0.step": ["'3' is text (in quotes); write the number without quotes: 3"]}),
    # Python's words for JSON's types: "Input should be a valid dictionary" / "... list" / "... string"
    ("runs/", {"spec": "task: sft"}, {"spec": ['"task: sft" is not a JSON object ({...})']}),
    ("runs/", {"external": True, "tags": "nightly"}, {"tags": ['"nightly" is not a JSON array ([...])']}),
    ("runs/{external}/finish/", {}, {"status": ["required key is missing"]}),
    ("runs/{external}/finish/", {"status": "done"},
     {"status": ['"done" is not one of succeeded, failed, cancelled']}),
    # a union's members were keys of their own, keys the client never sent: "samples.0.prompt.str" and
    # "samples.0.prompt.list[dict[str,str]]"
    ("runs/{external}/samples/", {"samples": [{"step": 1, "prompt": 5, "text": "t"}]},
     {"samples.0.prompt": ["5 is not text (a JSON string) or a JSON array ([...])"]}),
    ("runs/{external}/samples/", {"samples": [{"step": 1, "prompt": [{"role": "user", "content": 1}], "text": "t"}]},
     {"samples.0.prompt.0.content": ["1 is not text (a JSON string)"]}),
    # a metric named like a union member is a key, not a member
    ("runs/{external}/metrics/", {"points": [{"step": 1, "metrics": {"str": "x"}}]},
     {"points.0.metrics.str": ['"x" is not a number']}),
    # "give at least 1 (got 0)": one of what?
    ("runs/{external}/metrics/", {"points": []}, {"points": ["give at least 1 item (got 0)"]}),
    ("runs/{external}/samples/", {"samples": [{"step": 1, "prompt": "p", "text": "t"}] * 10_001},
     {"samples": ["give at most 10,000 items (got 10,001); send the rest in another request"]}),
])
def test_a_body_s_problems_are_told_in_json_s_words_under_the_keys_sent(world, path, sent, errors):
    """QA: pydantic's own words reached the client: 'Extra inputs are not permitted' for a misspelled key (not
    which keys are allowed), 'Input should be a valid dictionary' for a JSON object, 'Field required', and a
    union's members as keys ('samples.0.prompt.str'). They now read as the job spec's and pipelines' do."""
    _team, apis, _sent = world
    api = apis["teammate"]
    status, external = api.call("POST", "/api/v1/projects/alpha/runs/", {"external": True})
    assert status == 201, external
    status, body = api.call("POST", "/api/v1/projects/alpha/" + path.format(external=external["id"]), sent)
    assert status == 400 and body == {"errors": errors}, body


def test_a_new_version_of_a_dataset_not_in_the_project_names_the_field(world):
    """QA: an upload whose dataset field named no dataset of the project (mistyped, or another project's) was a
    404 'no such dataset in this project', as for an address that does not exist: it named neither the field
    nor what to send. A spec naming an unknown dv_… is a 400 under its key; so is this, and nothing is made."""
    from webapp.datasets import services as dataset_services
    from webapp.datasets.models import Dataset, DatasetVersion

    team, apis, _sent = world
    elsewhere = dataset_services.dataset_create(project=team.outsider_project, name="theirs", kind="text",
                                                user=team.outsider)
    for sent in ("ds_mistyped", elsewhere.public_id):
        status, body = apis["teammate"].upload("/api/v1/projects/alpha/datasets/", {"dataset": sent}, "t.jsonl",
                                               b'{"text": "x"}\n')
        assert status == 400 and body == {"errors": {"dataset": [
            f"'\u2068{sent}\u2069' is not a dataset of alpha; send the id (ds_…) that GET datasets/ lists, or leave "
            "dataset out and send name and kind for a new dataset"]}}, body
    assert not DatasetVersion.objects.exists() and list(Dataset.objects.all()) == [elsewhere]


def test_the_openapi_document_lists_the_405_413_and_500_the_api_answers(world, settings):
    """QA: the document listed 400, 401, 403 and 404 only, while every address answers a method it does not take
    with a 405 (and its Allow header), a body over the size limit with a 413, and a failure with a JSON 500, as the
    README says: a client generated from it had no shape for them. Real ones validate against what it gives."""
    from pydantic import TypeAdapter

    from webapp.api import schemas

    _team, apis, _sent = world
    api = apis["teammate"]
    paths = api.call("GET", "/api/v1/openapi.json")[1]["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert {"405", "500"} <= set(responses), (method, path)
            assert "Allow" in responses["405"]["headers"], (method, path)
            assert ("413" in responses) == ("requestBody" in operation), (method, path)
    runs = paths["/api/v1/projects/{slug}/runs/"]
    status, body = api.call("PUT", "/api/v1/projects/alpha/runs/", {"external": True})
    assert status == 405 and runs["post"]["responses"]["405"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/Detail")
    TypeAdapter(schemas.Detail).validate_python(body)
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    status, body = api.call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "x" * 2000})
    assert status == 413 and runs["post"]["responses"]["413"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/Detail")
    TypeAdapter(schemas.Detail).validate_python(body)


def test_an_artifact_not_found_says_which_there_are(world):
    """QA: `artifacts/checkpoint/` without ?step= answered "run … has no checkpoint artifact" for a run that had
    exported checkpoints (it was missing the step, not the checkpoint), and a step or kind not there named none
    that is: a client was left to guess."""
    team, apis, _sent = world
    model, data = make_base_model(team.project), make_ready_version(team.project)
    spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 9}}
    run = Run.objects.get(public_id=apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"spec": spec})[1]["id"])
    for step in (3, 7):
        directory = run.output_dir / f"export-step-{step}"
        directory.mkdir(parents=True)
        Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=step, path=str(directory))
    base = f"/api/v1/projects/alpha/runs/{run.public_id}/artifacts"
    for path, detail in (
            ("checkpoint/", f"give the exported checkpoint's step as ?step=N; run {run.public_id} has 2 checkpoint "
                            "artifacts, at steps 3, 7"),
            ("checkpoint/?step=5", f"run {run.public_id} has no checkpoint artifact at step \u20685\u2069; it has 2 "
                                   "checkpoint artifacts, at steps 3, 7"),
            ("weights/", "'\u2068weights\u2069' is not a kind of artifact; download model, adapter, or checkpoint?step=N"),
            # The bare "has no model artifact" did not say whether one would come.
            ("model/", f"run {run.public_id} has no model artifact (it is queued): a run exports its model, and a LoRA "
                       "run its adapter, when it succeeds")):
        status, body = apis["viewer"].call("GET", f"{base}/{path}")
        assert status == 404 and body == {"detail": detail}, (path, body)
    assert apis["viewer"].call("GET", f"{base}/checkpoint/?step=7")[0] == 200
    Artifact.objects.filter(step=3).delete()  # "has them at steps 7": one is said as one
    assert apis["viewer"].call("GET", f"{base}/checkpoint/") == (404, {"detail": (
        f"give the exported checkpoint's step as ?step=N; run {run.public_id} has 1 checkpoint artifact, at step 7")})
    Artifact.objects.all().delete()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    assert apis["viewer"].call("GET", f"{base}/checkpoint/") == (404, {"detail": (
        f"run {run.public_id} has no checkpoint artifact; export a checkpoint on the run's page (Checkpoints), then "
        "download it here with ?step=N")})
    assert apis["viewer"].call("GET", f"{base}/adapter/") == (404, {"detail": (
        f"run {run.public_id} has no adapter artifact; only a run with peft.method lora or qlora writes one: download "
        "model/ for the trained weights")})


def test_a_tag_holding_a_comma_is_refused_as_the_run_page_would_split_it(world):
    """QA: tags sent as a list could hold a comma ("a,b"), stored as one tag; the run page's edit form and Launch a
    copy give tags back as "a, b" text, so saving the form (to change the notes, say) made it two tags."""
    _team, apis, _sent = world
    api = apis["teammate"]
    message = ("tag '\u2068lr=1e-4,bs=8\u2069' holds a comma, which separates tags on the run page; send each tag as "
               "its own item, or use another character")
    status, body = api.call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "tags": ["lr=1e-4,bs=8"]})
    assert status == 400 and body == {"errors": {"tags": [message]}}, body
    assert not Run.objects.exists()
    status, run = api.call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "tags": ["lr=1e-4", "bs=8"]})
    assert status == 201 and run["tags"] == ["lr=1e-4", "bs=8"]
    status, body = api.call("PATCH", f"/api/v1/projects/alpha/runs/{run['id']}/", {"tags": ["lr=1e-4,bs=8"]})
    assert status == 400 and body == {"errors": {"tags": [message]}}, body
    assert Run.objects.get(public_id=run["id"]).tags == ["lr=1e-4", "bs=8"]


def test_a_form_sent_where_json_is_read_is_told_to_send_json(world):
    """QA: `curl -F spec_yaml=...` (or --data-urlencode) to runs/ or pipelines/ was told only "the body is not
    JSON: Expecting value at line 1", not that it went as a form nor what to send instead."""
    _team, apis, _sent = world
    api = apis["teammate"]
    form = "&".join(["external=true", "name=x"]).encode()
    for path in ("runs/", "pipelines/"):
        status, body = api.call("POST", f"/api/v1/projects/alpha/{path}", data=form,
                                content_type="application/x-www-form-urlencoded")
        assert status == 400 and body == {"errors": {"__all__": [
            "the body is not JSON: Expecting value at line 1; it was sent as a form "
            "(application/x-www-form-urlencoded): send a JSON object with 'Content-Type: application/json' (only "
            "POST datasets/ takes a form, for its file)"]}}, body
    status, body = api.call("POST", "/api/v1/projects/alpha/runs/", data=b'{"external": tru}')
    assert status == 400 and body == {"errors": {"__all__": [
        "the body is not JSON: Expecting value at line 1; send a JSON object"]}}, body
    assert not Run.objects.exists()


def test_a_refused_patch_names_the_run_by_the_name_it_keeps(world):
    """QA: PATCH {"name": "renamed", "archived": true} on a running run was refused, all or nothing, as "run
    renamed (run_…) is running: cancel it first" — the name the run was refused, not the one it kept."""
    _team, apis, _sent = world
    api = apis["teammate"]
    _status, run = api.call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "first"})
    status, body = api.call("PATCH", f"/api/v1/projects/alpha/runs/{run['id']}/", {"name": "renamed", "archived": True})
    assert status == 400 and body == {"errors": {"archived": [
        f"run \u2068first\u2069 ({run['id']}) is running: cancel it first, then archive it. Nothing was archived"]}}, body
    assert Run.objects.get(public_id=run["id"]).name == "first"


def test_an_upload_under_a_taken_name_gives_the_id_to_send_for_a_new_version(world):
    """QA: a second upload under a dataset's name was told to 'upload a new version of it instead', and an API
    client had to list the datasets to find the id that a new version is sent with."""
    _team, apis, _sent = world
    upload = apis["teammate"].upload
    _status, created = upload("/api/v1/projects/alpha/datasets/", {"name": "notes", "kind": "text"}, "t.jsonl",
                              b'{"text": "x"}\n')
    status, body = upload("/api/v1/projects/alpha/datasets/", {"name": "Notes", "kind": "text"}, "t.jsonl",
                          b'{"text": "y"}\n')
    dataset_id = created["dataset"]["id"]
    assert status == 400 and body == {"errors": {"name": [
        "alpha already has a dataset named 'notes' (names that differ only in letter case are the same name); upload "
        f"a new version of it instead (in the API: dataset {dataset_id}, no name)"]}}, body
    status, body = upload("/api/v1/projects/alpha/datasets/", {"dataset": dataset_id}, "t.jsonl", b'{"text": "y"}\n')
    assert status == 201 and body["version"]["number"] == 2


def test_a_key_given_twice_in_a_json_object_is_refused(world):
    """QA: JSON keeps the last of a key given twice, so {"name": "a", ..., "name": "b"} (a body built by hand, or a
    mapping's "prompt" twice) dropped the first without a word; a spec's YAML and a multipart upload refuse theirs."""
    _team, apis, _sent = world
    api = apis["teammate"]
    status, body = api.call("POST", "/api/v1/projects/alpha/runs/",
                            data=b'{"external": true, "name": "first", "config": {"lr": 1, "lr": 2}}')
    assert status == 400 and body == {"errors": {"__all__": [
        "'lr' is given twice in one object; JSON keeps the last, so send it once"]}}, body
    status, body = api.upload("/api/v1/projects/alpha/datasets/",
                              {"name": "n", "kind": "sft", "mapping": '{"prompt": "q", "prompt": "question"}'},
                              "rows.jsonl", b'{"question": "a", "completion": "b"}\n')
    assert status == 400 and body == {"errors": {"mapping": [
        "mapping: 'prompt' is given twice in one object; JSON keeps the last, so send it once"]}}, body
    assert not Run.objects.exists() and not Dataset.objects.exists()


def test_the_openapi_document_lets_resume_be_sent_without_a_body(world):
    """QA: the document marked resume/'s body required, so a generated client could not send the call the README
    shows working without one: a stopped run resumed to its own total."""
    team, apis, _sent = world
    api = apis["teammate"]
    paths = api.call("GET", "/api/v1/openapi.json")[1]["paths"]
    assert paths["/api/v1/projects/{slug}/runs/{run_id}/resume/"]["post"]["requestBody"]["required"] is False
    assert paths["/api/v1/projects/{slug}/runs/"]["post"]["requestBody"]["required"] is True
    model, data = make_base_model(team.project), make_ready_version(team.project)
    spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 5}}
    run = api.call("POST", "/api/v1/projects/alpha/runs/", {"spec": spec})[1]
    api.call("POST", f"/api/v1/projects/alpha/runs/{run['id']}/cancel/")
    status, resumed = api.call("POST", f"/api/v1/projects/alpha/runs/{run['id']}/resume/")
    assert status == 200 and resumed["status"] == "queued" and resumed["total_steps"] == 5, resumed


def test_an_expired_token_is_refused_saying_when_it_expired(team, client):
    """secqa: a token worked until someone revoked it: one leaked into a log, a shell history or a repository
    worked for ever. A token now has an end (chosen on the tokens page), and past it is refused as a revoked one
    is, saying when it ended and what to do."""
    from datetime import UTC, datetime, timedelta

    from django.utils import timezone

    runs = "/api/v1/projects/alpha/runs/"
    _token, ended = token_create(user=team.teammate, name="ci", expires_at=datetime(2026, 1, 2, 3, 4, tzinfo=UTC))
    _token, working = token_create(user=team.teammate, name="ci", expires_at=timezone.now() + timedelta(minutes=1))
    response = client.get(runs, headers={"Authorization": f"Bearer {ended}"})
    assert response.status_code == 401 and response["WWW-Authenticate"] == 'Bearer realm="temper"'
    assert response.json() == {"detail": "the token sent expired at 2026-01-02 03:04 UTC; make a new one on the API "
                                         "tokens page and send it as 'Authorization: Bearer <token>'"}
    assert client.get(runs, headers={"Authorization": f"Bearer {working}"}).status_code == 200


def test_the_tokens_page_makes_a_token_that_ends_after_the_time_chosen(team, client_for):
    from datetime import timedelta

    from django.utils import timezone

    client = client_for(team.viewer)
    page = client.get("/accounts/tokens/").content.decode()
    assert '<label for="token-expires">Expires after</label> <select id="token-expires" name="expires">' in page
    assert '<option value="90" selected>90 days</option>' in page  # the default
    for lifetime, days in (("30", 30), ("never", None), (None, 90)):
        sent = {"name": f"ci-{lifetime}"} | ({} if lifetime is None else {"expires": lifetime})
        assert client.post("/accounts/tokens/", sent).status_code == 200
        token = ApiToken.objects.get(user=team.viewer, name=f"ci-{lifetime}")
        if days is None:
            assert token.expires_at is None
        else:
            assert abs(token.expires_at - (timezone.now() + timedelta(days=days))) < timedelta(minutes=1)
    refused = client.post("/accounts/tokens/", {"name": "ci", "expires": "7"})
    assert refused.status_code == 400
    assert "&#x27;7&#x27; is not a lifetime a token may have; choose one of 30, 90, 365, never" in refused.content.decode()
    assert not ApiToken.objects.filter(user=team.viewer, name="ci").exists()
    listed = client.get("/accounts/tokens/").content.decode()
    assert "<td><span class=\"muted\">never</span></td>" in listed
    ApiToken.objects.filter(name="ci-30").update(expires_at=timezone.now() - timedelta(days=1))
    assert "<strong>expired</strong>" in client.get("/accounts/tokens/").content.decode()


def test_metric_times_count_from_the_runs_first_point_whatever_names_are_asked_for(world):
    """``names`` with no ``after_step`` counted each point's time from those names' own first point: an evaluation
    first logged 40 s into the run read 0 s there, and 40 s on the run page, state.json and a read of every name."""
    _team, apis, _sent = world
    status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "evals"})
    path = f"/api/v1/projects/alpha/runs/{run['id']}/metrics/"
    points = [{"step": step, "metrics": {"loss": 1.0 / step, **({"eval/loss": 2.0 / step} if step % 5 == 0 else {})}}
              for step in range(1, 21)]
    assert apis["teammate"].call("POST", path, {"points": points})[0] == 201
    for point in MetricPoint.objects.filter(run__public_id=run["id"]):
        MetricPoint.objects.filter(pk=point.pk).update(wall_time=1000.0 + 10 * point.step)
    whole = apis["viewer"].call("GET", path)[1]["series"]
    assert whole["eval/loss"]["time"] == [40.0, 90.0, 140.0, 190.0]
    status, named = apis["viewer"].call("GET", path + "?names=eval/loss")
    assert status == 200 and named["series"]["eval/loss"]["time"] == whole["eval/loss"]["time"]
    # Reduced to buckets (more steps than max_points), the same.
    status, reduced = apis["viewer"].call("GET", path + "?names=eval/loss&max_points=2")
    assert status == 200 and reduced["series"]["eval/loss"]["downsampled"]
    assert reduced["series"]["eval/loss"]["time"] == [10.0 * (step - 1) for step in reduced["series"]["eval/loss"]["step"]]


def test_a_version_is_read_by_the_dv_id_a_spec_names(world):
    """Audit: a run's spec names its data by dv_… ids, but a version could be read only by its dataset's id and its
    number, so a script holding a run's spec had to list every dataset to find one. GET dataset-versions/<dv id>/
    answers what GET datasets/<ds id>/versions/<n>/ does; another project's version is a 404, as a missing one."""
    from pydantic import TypeAdapter

    from webapp.api import schemas
    from webapp.projects.models import Role
    from webapp.projects.services import membership_add

    team, apis, _sent = world
    version = make_ready_version(team.project)
    by_number = apis["viewer"].call("GET", f"/api/v1/projects/alpha/datasets/{version.dataset.public_id}/versions/1/")
    status, by_id = apis["viewer"].call("GET", f"/api/v1/projects/alpha/dataset-versions/{version.public_id}/")
    assert (status, by_id) == by_number and by_id["id"] == version.public_id
    assert by_id["dataset"] == version.dataset.public_id  # which dataset it is a version of, read by its id alone
    TypeAdapter(schemas.DatasetVersionOut).validate_json(json.dumps(by_id))
    # Another project's version, though the caller may read it there: named under alpha it is no version of alpha.
    elsewhere = make_ready_version(team.outsider_project, name="theirs")
    membership_add(project=team.outsider_project, user=team.teammate, role=Role.VIEWER)
    assert apis["teammate"].call("GET", f"/api/v1/projects/alpha/dataset-versions/{elsewhere.public_id}/") == (
        404, {"detail": "no such dataset version in this project"})
    assert apis["teammate"].call("GET", f"/api/v1/projects/alpha-elsewhere/dataset-versions/{elsewhere.public_id}/"
                                 )[0] == 200
    assert apis["outsider"].call("GET", f"/api/v1/projects/alpha/dataset-versions/{version.public_id}/") == (
        404, apis["outsider"].call("GET", "/api/v1/projects/alpha/dataset-versions/dv_missing/")[1])
    document = apis["anonymous"].call("GET", "/api/v1/openapi.json")[1]
    answer = document["paths"]["/api/v1/projects/{slug}/dataset-versions/{version_id}/"]["get"]["responses"]["200"]
    assert answer["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/DatasetVersionOut"}


def test_metrics_asked_for_by_a_name_the_run_has_not_logged_say_so_and_list_its_names(world):
    """Audit: ?names=los (a typo for loss) answered {"series": {}}, as a run with no points yet does, with no hint.
    The answer keeps its series and adds unknown_names (the names asked for that the run has logged no point of)
    and metric_names (every name it has logged); a name whose points all lie before after_step is no unknown one."""
    _team, apis, _sent = world
    _status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "typo"})
    path = f"/api/v1/projects/alpha/runs/{run['id']}/metrics/"
    points = [{"step": step, "metrics": {"loss": 1.0 / step, "eval/loss": 2.0}} for step in (1, 2)]
    assert apis["teammate"].call("POST", path, {"points": points})[0] == 201
    status, body = apis["viewer"].call("GET", path + "?names=los,eval/loss")
    assert status == 200 and list(body["series"]) == ["eval/loss"]
    assert body["unknown_names"] == ["los"] and body["metric_names"] == ["eval/loss", "loss"]
    status, body = apis["viewer"].call("GET", path + "?names=loss&after_step=2")
    assert (status, body) == (200, {"series": {}, "unknown_names": [], "metric_names": ["eval/loss", "loss"]})
    status, body = apis["viewer"].call("GET", path)
    assert set(body["series"]) == {"eval/loss", "loss"} and body["unknown_names"] == []


def test_a_rest_token_makes_lists_and_revokes_the_users_v1_tokens_of_a_project(world):
    """Audit: the OpenAI-compatible API (/v1/) takes a project token that only the Chat page (or manage.py apitoken)
    made, so scripting the chat needed a browser once. chat-tokens/ makes one (its secret in that answer only),
    lists the caller's own and revokes one, with the Chat page's rules: members and owners (viewers 403)."""
    from pydantic import TypeAdapter

    from webapp.api import schemas
    from webapp.chat.models import ProjectToken

    team, apis, _sent = world
    base = "/api/v1/projects/alpha/chat-tokens/"
    status, made = apis["teammate"].call("POST", base, {"name": "ci", "expires": "30"})
    assert status == 201, made
    assert made["token"].startswith("tpk_") and made["name"] == "ci" and made["prefix"] == made["token"][:10]
    assert made["expires_at"] is not None and made["base_url"].endswith("/v1")
    # The token it answered works at /v1/, as the Chat page's does.
    models = Api(apis["teammate"].base, made["token"]).call("GET", "/v1/models")
    assert models[0] == 200 and models[1]["object"] == "list"
    assert apis["teammate"].call("POST", base, {})[1]["name"] == "token"  # as the Chat page names one left unnamed
    status, listed = apis["teammate"].call("GET", base)
    assert status == 200 and [token["name"] for token in listed["tokens"]] == ["token", "ci"]
    assert all("token" not in token for token in listed["tokens"])  # a secret is shown once, when made
    TypeAdapter(schemas.ChatTokenCreated).validate_json(json.dumps(made))
    TypeAdapter(schemas.ChatTokenList).validate_json(json.dumps(listed))
    assert apis["owner"].call("GET", base) == (200, {"tokens": []})  # only one's own
    assert apis["viewer"].call("POST", base, {"name": "x"})[0] == 403
    assert apis["outsider"].call("POST", base, {"name": "x"})[0] == 404
    assert apis["teammate"].call("POST", base, {"name": "x", "expires": "7"}) == (400, {"errors": {"expires": [
        "'7' is not a lifetime a token may have; choose one of 30, 90, 365, never (days, or never)"]}})
    assert apis["owner"].call("DELETE", f"{base}{made['id']}/")[0] == 404  # not the owner's to revoke
    assert apis["teammate"].call("DELETE", f"{base}{made['id']}/")[0] == 204
    assert Api(apis["teammate"].base, made["token"]).call("GET", "/v1/models")[0] == 401
    assert apis["teammate"].call("DELETE", f"{base}{made['id']}/") == (
        404, {"detail": "no token of yours in this project has that id (revoked already?)"})
    assert ProjectToken.objects.filter(user=team.teammate).count() == 1
    # With an Idempotency-Key, a retry makes no second token; its secret is not kept, so it is not shown again.
    again = {"name": "retry"}
    first = apis["teammate"].call("POST", base, again, headers={"Idempotency-Key": "k1"})
    second = apis["teammate"].call("POST", base, again, headers={"Idempotency-Key": "k1"})
    assert first[0] == second[0] == 201 and first[1]["token"].startswith("tpk_") and second[1]["token"] is None
    assert second[1]["id"] == first[1]["id"] and ProjectToken.objects.filter(name="retry").count() == 1


def _stopped_run(team, apis, *, tags=("api",)) -> tuple[dict, dict]:
    """A run launched by the teammate through the API and cancelled while queued, and the spec it was launched with."""
    model, data = make_base_model(team.project), make_ready_version(team.project)
    spec = {"task": "sft", "model": model.public_id,
            "data": {"train": data.public_id, "max_seq_len": 256}, "train": {"max_steps": 5},
            "optim": {"learning_rate": 0.0003}}
    status, created = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/",
                                            {"spec": spec, "name": "api run", "tags": list(tags)})
    assert status == 201, created
    assert apis["teammate"].call("POST", f"/api/v1/projects/alpha/runs/{created['id']}/cancel/")[0] == 200
    return created, spec


def test_retry_starts_the_runs_spec_over_as_a_new_run(world):
    """The run page's Retry had no REST address: a script could resume a stopped run, but not start it over."""
    team, apis, sent = world
    run, _spec = _stopped_run(team, apis)
    path = f"/api/v1/projects/alpha/runs/{run['id']}/retry/"
    queued = len(sent)
    status, retry = apis["teammate"].call("POST", path)
    assert status == 201, retry
    assert retry["id"] != run["id"] and (retry["name"], retry["status"], retry["tags"]) == (
        "api run (retry)", "queued", ["api"])
    assert retry["spec"] == run["spec"] and len(sent) == queued + 1
    assert apis["teammate"].call("GET", f"/api/v1/projects/alpha/runs/{retry['id']}/")[1] == retry  # as GET run
    status, again = apis["owner"].call("POST", path, {})
    assert status == 201 and again["name"] == "api run (retry 2)"
    # A body's field is refused by name: max_steps is resume's, not a retry's.
    status, body = apis["teammate"].call("POST", path, {"max_steps": 9})
    assert status == 400 and list(body["errors"]) == ["max_steps"], body
    assert Run.objects.count() == 3


def test_retry_and_duplicate_require_a_member(world):
    team, apis, sent = world
    run, _spec = _stopped_run(team, apis)
    for action in ("retry", "duplicate"):
        path = f"/api/v1/projects/alpha/runs/{run['id']}/{action}/"
        assert apis["viewer"].call("POST", path)[0] == 403
        assert apis["outsider"].call("POST", path)[0] == 404
        assert apis["anonymous"].call("POST", path)[0] == 401
        assert apis["teammate"].call("GET", path)[0] == 405
    assert Run.objects.count() == 1


def test_retry_and_duplicate_sent_again_with_their_idempotency_key_make_one_run(world):
    """As the other POSTs that make something: a retry of the request (a timeout, a lost answer) gets the run the
    first made, and nothing more is queued."""
    team, apis, sent = world
    run, _spec = _stopped_run(team, apis)
    for action, first_body, other_body in (("retry", None, {}), ("duplicate", {}, {"name": "other"})):
        path = f"/api/v1/projects/alpha/runs/{run['id']}/{action}/"
        headers = {"Idempotency-Key": f"{action}-once"}
        first = apis["teammate"].call("POST", path, first_body, headers=headers)
        queued = len(sent)
        assert first[0] == 201 and apis["teammate"].call("POST", path, first_body, headers=headers) == first
        assert len(sent) == queued
        status, body = apis["teammate"].call("POST", path, other_body, headers=headers)
        assert status == 422 and "Idempotency-Key" in body["errors"], body
    assert sorted(Run.objects.values_list("name", flat=True)) == ["api run", "api run (copy)", "api run (retry)"]


def test_retry_and_resume_of_a_run_whose_data_was_deleted_name_the_duplicate_address(world):
    """Their refusal told an API user to "duplicate it", a button of the run page the API had no address for: it
    names POST …/duplicate/ and the spec key to give anew; the run page keeps its words (its Duplicate button)."""
    from webapp.datasets import services as dataset_services
    from webapp.runs import services as run_services

    team, apis, sent = world
    run, _spec = _stopped_run(team, apis)
    version = team.project.datasets.get().versions.get()
    dataset_services.dataset_version_delete(version=version)
    gone = f"what run {run['id']} trains on was deleted since (its training data {version.public_id}): "
    for action in ("retry", "resume"):
        status, body = apis["teammate"].call("POST", f"/api/v1/projects/alpha/runs/{run['id']}/{action}/")
        assert (status, body) == (400, {"errors": {"__all__": [
            gone + f"POST runs/{run['id']}/duplicate/ with a new data.train in its spec"]}}), (action, body)
    stored = Run.objects.get(public_id=run["id"])
    assert run_services.retry_refusal(stored) == gone + "duplicate it to choose another"
    # The way named works: the copy launched with another version.
    other = make_ready_version(team.project, name="other")
    path = f"/api/v1/projects/alpha/runs/{run['id']}/duplicate/"
    status, body = apis["teammate"].call("POST", path)
    assert status == 400 and list(body["errors"]) == ["data.train"], body
    status, copy = apis["teammate"].call("POST", path, {"spec": {"data": {"train": other.public_id}}})
    assert status == 201 and copy["spec"]["data"]["train"] == other.public_id, copy
    assert Run.objects.count() == 2


def test_an_external_run_is_not_duplicated(world):
    _team, apis, _sent = world
    _status, run = apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"external": True, "name": "laptop"})
    status, body = apis["teammate"].call("POST", f"/api/v1/projects/alpha/runs/{run['id']}/duplicate/")
    assert status == 400 and "cannot be duplicated here" in body["errors"]["__all__"][0], body
    assert Run.objects.count() == 1


def test_duplicate_launches_the_runs_spec_with_the_changes_merged_on(world):
    """The run page's Duplicate fills the launch form with the run's spec, which the API had no way to: duplicate/
    launches it, the body's partial spec merged onto it key by key."""
    team, apis, sent = world
    run, spec = _stopped_run(team, apis, tags=("api", "sweep-0123abcd"))
    path = f"/api/v1/projects/alpha/runs/{run['id']}/duplicate/"
    status, copy = apis["teammate"].call("POST", path)
    assert status == 201, copy
    assert (copy["name"], copy["status"], copy["tags"]) == ("api run (copy)", "queued", ["api"])  # no sweep's tag
    assert copy["spec"] == run["spec"] and copy["id"] != run["id"]
    other = make_ready_version(team.project, name="other")
    status, changed = apis["teammate"].call("POST", path, {
        "spec": {"data": {"train": other.public_id}, "train": {"epochs": 2}}, "name": "more data", "tags": []})
    assert status == 201, changed
    assert (changed["name"], changed["tags"]) == ("more data", [])
    # Nested keys merged: data.max_seq_len and optim kept; epochs given, its rival max_steps dropped as the form does.
    assert changed["spec"]["data"] == {**run["spec"]["data"], "train": other.public_id}
    assert changed["spec"]["optim"] == run["spec"]["optim"] and changed["spec"]["data"]["max_seq_len"] == 256
    assert changed["spec"]["train"]["epochs"] == 2 and changed["spec"]["train"].get("max_steps") is None
    assert apis["teammate"].call("GET", f"/api/v1/projects/alpha/runs/{changed['id']}/")[1] == changed
    assert Run.objects.get(public_id=run["id"]).spec == run["spec"]  # the original unchanged


def test_duplicate_refuses_bad_changes_by_field_and_makes_nothing(world):
    team, apis, sent = world
    run, _spec = _stopped_run(team, apis)
    path = f"/api/v1/projects/alpha/runs/{run['id']}/duplicate/"
    queued = len(sent)
    for body, field in (({"spec": {"optim": {"schedule": "cosin"}}}, "optim.schedule"),
                        ({"spec": {"optim": {"warmup": 3}}}, "optim.warmup"),
                        ({"spec": {"train": {"max_steps": "ten"}}}, "train.max_steps"),
                        ({"spec": "x"}, "spec"),
                        ({"spec": {}, "nmae": "typo"}, "nmae"),
                        ({"tags": "api"}, "tags")):
        status, answer = apis["teammate"].call("POST", path, body)
        assert status == 400 and field in answer["errors"], (body, answer)
    # In the words POST runs/ refuses the merged spec in: one check of a spec.
    merged = {**run["spec"], "optim": {**run["spec"]["optim"], "schedule": "cosin"}}
    assert (apis["teammate"].call("POST", path, {"spec": {"optim": {"schedule": "cosin"}}})
            == apis["teammate"].call("POST", "/api/v1/projects/alpha/runs/", {"spec": merged}))
    assert Run.objects.count() == 1 and len(sent) == queued


def test_a_copy_of_a_run_with_a_long_name_is_named_within_the_limit(world):
    """' (copy)' after a name of the longest length made one the launch refuses, for a name the client never sent;
    the name before the suffix is cut to fit, as a retry's is (the launch page's Duplicate offers the same)."""
    team, apis, _sent = world
    run, _spec = _stopped_run(team, apis)
    long_name = "n" * 120
    assert apis["teammate"].call("PATCH", f"/api/v1/projects/alpha/runs/{run['id']}/", {"name": long_name})[0] == 200
    status, copy = apis["teammate"].call("POST", f"/api/v1/projects/alpha/runs/{run['id']}/duplicate/")
    assert status == 201 and copy["name"] == "n" * 113 + " (copy)", copy
