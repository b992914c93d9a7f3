"""Bodies Django cannot read (malformed multipart, a file name past its limit, a form past
DATA_UPLOAD_MAX_MEMORY_SIZE) and bodies over the upload limit: JSON in the API's own error shape under
/api/ and /v1/ (a program reads the answer), a page saying what was wrong everywhere else. They were
Django's bare "Bad Request (400)" and a text/plain 413."""
import asyncio
import json

import pytest
from django.http.multipartparser import MultiPartParserError
from django.test import Client

from webapp.api.services import token_create
from webapp.core.views import bad_request
from webapp.datasets.uploads import MULTIPART_OVERHEAD_BYTES, RequestBodyLimit
from webapp.runs import services as run_services

DATASETS = "/api/v1/projects/alpha/datasets/"


def multipart(boundary: str, filename: str = "a.jsonl") -> bytes:
    return (f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nqa\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="kind"\r\n\r\nsft\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            f'Content-Type: application/octet-stream\r\n\r\n{{"prompt": "p", "completion": "c"}}\n\r\n'
            f"--{boundary}--\r\n").encode()


BAD_BODIES = {
    "no boundary": ("multipart/form-data", multipart("b0undary")),
    "a 300-character boundary": ("multipart/form-data; boundary=" + "b" * 300, multipart("b" * 300)),
    "a 3,000-character file name": ("multipart/form-data; boundary=b0undary", multipart("b0undary", "f" * 3000 + ".jsonl")),
}


@pytest.mark.parametrize("content_type, body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_an_unreadable_body_is_json_under_the_api(team, content_type, body):
    secret = token_create(user=team.teammate, name="t")[1]
    response = Client().post(DATASETS, body, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert "multipart" in json.loads(response.content)["detail"] or "file name" in json.loads(response.content)["detail"]


@pytest.mark.parametrize("content_type, body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_an_unreadable_upload_is_a_page_saying_what_was_wrong(team, client_for, content_type, body):
    response = client_for(team.teammate).post("/p/alpha/datasets/new/", body, content_type=content_type)
    assert response.status_code == 400 and response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "<h1>The form could not be read</h1>" in page and ("multipart" in page or "file name" in page)


def test_an_unreadable_body_under_v1_is_in_the_openai_shape(rf):
    """The OpenAI-compatible views read JSON bodies themselves; a body Django refuses first answers so too."""
    response = bad_request(rf.post("/v1/chat/completions"), MultiPartParserError("Invalid boundary in multipart: None"))
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert json.loads(response.content)["error"] == {
        "message": "the body could not be read: Invalid boundary in multipart: None", "type": "invalid_request_error",
        "param": None, "code": "bad_request"}


def test_a_form_over_the_memory_limit_is_a_page_saying_so(team, client_for, settings):
    """Notes of 10 MB gave a bare 'Bad Request (400)' page."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    run = run_services.run_create_external(project=team.project, name="laptop", config={}, user=team.owner)
    response = client_for(team.teammate).post(f"/p/alpha/runs/{run.public_id}/edit/", {"notes": "x" * 2000})
    assert response.status_code == 413
    page = response.content.decode()
    assert "<h1>The form is too large</h1>" in page and "1000 bytes" in page.replace("\u00a0", " ")


def run_guard(path: str) -> tuple[dict, bytes]:
    async def app(scope, receive, send):
        raise AssertionError("refused before the application")

    sent = []

    async def send(message):
        sent.append(message)

    guard = RequestBodyLimit(app, max_upload_bytes=10)
    too_long = str(10 + MULTIPART_OVERHEAD_BYTES + 1).encode()
    asyncio.run(guard({"type": "http", "path": path, "headers": [(b"content-length", too_long)]}, None, send))
    return dict(sent[0]["headers"]), sent[1]["body"]


def test_an_oversize_body_is_refused_in_each_places_shape():
    headers, body = run_guard(DATASETS)
    assert headers[b"content-type"] == b"application/json" and "TEMPER_MAX_UPLOAD_BYTES" in json.loads(body)["detail"]
    headers, body = run_guard("/v1/completions")
    assert headers[b"content-type"] == b"application/json"
    assert json.loads(body)["error"]["code"] == "request_too_large"
    headers, body = run_guard("/p/alpha/datasets/new/")
    assert headers[b"content-type"].startswith(b"text/html") and b"TEMPER_MAX_UPLOAD_BYTES" in body


def test_a_host_name_the_server_does_not_answer_to_is_named_with_the_setting_that_admits_it():
    """QA: after `TEMPER_HOST=0.0.0.0 make up`, the machine's address said "the request could not be read (a
    header or the body is malformed)" and "Go back to the form", of a first visit with no form and no fault."""
    response = Client().get("/accounts/login/", HTTP_HOST="10.1.2.3:8000")
    assert response.status_code == 400
    page = response.content.decode()
    assert "<h1>Unknown host name</h1>" in page
    assert "does not answer to the host name &#x27;10.1.2.3&#x27;: add it to TEMPER_ALLOWED_HOSTS" in page
    assert "malformed" not in page and "Go back to the form" not in page


def test_an_unknown_host_name_is_json_under_the_api():
    response = Client().get("/api/v1/openapi.json", HTTP_HOST="10.1.2.3:8000")
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert "add it to TEMPER_ALLOWED_HOSTS" in json.loads(response.content)["detail"]


def test_a_host_header_that_is_no_host_name_is_said_to_be_so_and_not_echoed():
    response = Client().get("/accounts/login/", HTTP_HOST="<b>x</b>")
    assert response.status_code == 400
    page = response.content.decode()
    assert "not a host name" in page and "<b>x</b>" not in page


def test_an_unknown_host_name_is_logged_in_one_line_without_its_traceback(caplog):
    """Every request to an address not in TEMPER_ALLOWED_HOSTS (a scanner trying the machine's IP, say) wrote
    DisallowedHost's whole traceback to the server's log."""
    import logging

    with caplog.at_level(logging.WARNING, logger="django.security"):
        assert Client().get("/", HTTP_HOST="10.1.2.3").status_code == 400
    [record] = [record for record in caplog.records if record.name.startswith("django.security")]
    assert "Invalid HTTP_HOST header: '10.1.2.3'" in record.getMessage()
    assert record.exc_info is None and "Traceback" not in caplog.text


def test_a_json_body_over_the_memory_limit_is_told_to_a_program_as_such(team, settings):
    """QA: a REST body over DATA_UPLOAD_MAX_MEMORY_SIZE was told "Go back and shorten the longest text: notes
    and guidelines hold 20,000 characters at most", the words of the page for a form."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    secret = token_create(user=team.teammate, name="t")[1]
    response = Client().post("/api/v1/projects/alpha/runs/", json.dumps({"name": "x" * 2000}),
                             content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 413 and response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "the body is over the 1000 bytes a request's body may hold "
                                         "(DATA_UPLOAD_MAX_MEMORY_SIZE); send a smaller one (a dataset's file, "
                                         "sent as a multipart upload, is not counted)"}
