"""Uploads through the web, validated by a real Celery worker over a real Redis."""
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from jaxengine.tokenizer import load_tokenizer
from tests.factories import build_bpe_tokenizer_dir
from tests.live import wait_for
from tests.webapp.factories import make_team
from webapp.basemodels.models import BaseModel
from webapp.datasets.models import DatasetVersion, VersionStatus

pytestmark = pytest.mark.integration


def upload(client: Client, filename: str, content: bytes, **fields) -> DatasetVersion:
    response = client.post("/p/alpha/datasets/new/", {
        "name": filename, "kind": "sft", "file_format": "", **fields,
        "file": SimpleUploadedFile(filename, content),
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    return DatasetVersion.objects.get(dataset__name=filename)


def settled(version: DatasetVersion, workers):
    def check():
        version.refresh_from_db()
        return version.is_settled
    wait_for(check, timeout=30, workers=workers, what=f"{version} to be validated")
    return version


@pytest.fixture
def teammate_client(default_worker):
    team = make_team()
    client = Client()
    client.force_login(team.teammate)
    return client


def test_an_upload_is_validated_by_the_worker_and_becomes_ready(teammate_client, default_worker):
    rows = b"".join(b'{"question": "q%d", "answer": "answer %d"}\n' % (i, i) for i in range(50))
    version = upload(teammate_client, "good.jsonl", rows, map_prompt="question", map_completion="answer")
    version = settled(version, default_worker)
    assert version.status == VersionStatus.READY, version.errors
    assert version.row_count == 50
    assert version.statistics["fields"]["prompt"]["min"] == 2 and version.statistics["fields"]["prompt"]["max"] == 3
    assert version.absolute_path.is_file()


def test_a_bad_upload_fails_with_its_line_numbers(teammate_client, default_worker):
    rows = (b'{"prompt": "a", "completion": "b"}\n'
            b'{"prompt": "a"}\n'
            b'{"prompt": "a", "completion": "b"}\n'
            b'{"prompt": "a", "completion": \n')
    version = settled(upload(teammate_client, "bad.jsonl", rows), default_worker)
    assert version.status == VersionStatus.FAILED
    assert [(error["line"], error["code"]) for error in version.errors] == [(2, "missing_field"), (4, "json")]
    assert version.error_count == 2
    assert not version.absolute_path.exists()


def test_token_lengths_are_counted_by_the_worker(teammate_client, default_worker, tmp_path):
    rows = b'{"prompt": "hello world", "completion": "the model learns"}\n'
    version = settled(upload(teammate_client, "tokens.jsonl", rows), default_worker)
    model_dir = build_bpe_tokenizer_dir(tmp_path / "tokenizer", style="qwen")
    base_model = BaseModel.objects.create(
        project=version.dataset.project, name="tiny", path=str(model_dir), architecture="LlamaForCausalLM",
        parameter_count=1, tokenizer_type="tokenizer.json", dtype="float32", size_bytes=1,
    )
    url = f"/p/alpha/datasets/{version.dataset.public_id}/v/1/tokens/"
    assert teammate_client.post(url, {"base_model": base_model.public_id}).status_code == 302

    def counted():
        version.refresh_from_db()
        return version.token_statistics.get("status") in ("ready", "failed")
    wait_for(counted, timeout=30, workers=default_worker, what="token statistics")
    assert version.token_statistics["status"] == "ready", version.token_statistics
    tokenizer = load_tokenizer(model_dir)
    completion = version.token_statistics["fields"]["completion"]
    assert completion["min"] == completion["max"] == len(tokenizer.encode("the model learns"))


def test_a_split_is_written_and_checked_by_the_worker(teammate_client, default_worker):
    """The version page's split: the worker writes both files and queues their checks, which make them ready, the
    held-out side sharing no row with the training side (a row and its copy on one side)."""
    rows = b"".join(b'{"prompt": "q%d", "completion": "a%d", "task": "%s"}\n' % (i, i, b"ab"[i % 2:i % 2 + 1])
                    for i in range(20))
    source = settled(upload(teammate_client, "whole.jsonl", rows + b'{"prompt": "q0", "completion": "a0", '
                                                                   b'"task": "a"}\n'), default_worker)
    response = teammate_client.post(f"/p/alpha/datasets/{source.dataset.public_id}/v/1/split/", {
        "held_out": "0.2", "seed": "1", "stratify": "task", "train_name": "fit", "held_out_name": "eval"})
    assert response.status_code == 302, response.content.decode()[:2000]
    train = settled(DatasetVersion.objects.get(dataset__name="fit"), default_worker)
    held = settled(DatasetVersion.objects.get(dataset__name="eval"), default_worker)
    assert train.status == held.status == VersionStatus.READY, (train.errors, held.errors)
    assert train.row_count + held.row_count == 21 and held.row_count in (4, 5)
    train_rows = set(train.absolute_path.read_text().splitlines())
    assert not train_rows & set(held.absolute_path.read_text().splitlines())


def test_a_dedupe_and_a_decontamination_are_written_and_checked_by_the_worker(teammate_client, default_worker):
    """The version page's "Remove the exact repeats" then "Remove rows shared with another version": each a new
    version of the same dataset that the worker writes (through the split's task) and checks."""
    rows = [b'{"prompt": "q%d", "completion": "a%d"}\n' % (i, i) for i in range(6)]
    source = settled(upload(teammate_client, "chats.jsonl", b"".join(rows + [rows[1], rows[4], rows[1]])),
                     default_worker)
    evaluation = settled(upload(teammate_client, "held.jsonl", rows[2] + b'{"prompt": "new", "completion": "x"}\n'),
                         default_worker)
    page = f"/p/alpha/datasets/{source.dataset.public_id}/v"
    response = teammate_client.post(f"{page}/1/dedupe/")
    assert response.status_code == 302 and response.url == f"{page}/2/", response.content.decode()[:2000]
    deduped = settled(DatasetVersion.objects.get(dataset=source.dataset, number=2), default_worker)
    assert deduped.status == VersionStatus.READY, deduped.errors
    assert deduped.absolute_path.read_bytes() == b"".join(rows).replace(b'": ', b'":').replace(b', "', b',"')
    response = teammate_client.post(f"{page}/2/decontaminate/", {"against": evaluation.public_id})
    assert response.status_code == 302 and response.url == f"{page}/3/", response.content.decode()[:2000]
    clean = settled(DatasetVersion.objects.get(dataset=source.dataset, number=3), default_worker)
    assert clean.status == VersionStatus.READY and clean.row_count == 5, clean.errors
    assert b'"q2"' not in clean.absolute_path.read_bytes()
    assert clean.derivation["removed_rows"] == 1 and clean.derivation["against_name"] == "held.jsonl v1"
