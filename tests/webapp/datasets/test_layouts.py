"""Uploads in LLaMA-Factory's ShareGPT and Alpaca layouts become ready versions whose page says how they were read and
previews their rows as Temper reads them (``formats.read_layout``); their token statistics are those of the same
rows in Temper's own layout. Before, ShareGPT rows were refused ("write each as {role, content}") and Alpaca rows
were missing 'prompt'."""
import html
import io
import json

import pyarrow
import pyarrow.parquet
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.factories import build_bpe_tokenizer_dir
from webapp.basemodels.models import BaseModel
from webapp.datasets import services
from webapp.datasets.models import DatasetVersion, VersionStatus


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue: None)


def turn(role, value):
    return {"from": role, "value": value}


SHAREGPT_ROWS = [
    {"conversations": [turn("human", "What is <b>2+2</b>?"), turn("gpt", "It is four.")], "system": "Be brief."},
    {"conversations": [turn("human", "Name a colour."), turn("gpt", "Teal.")]},
]
ALPACA_ROWS = [{"instruction": "Translate to English.", "input": "chat", "output": "cat"},
               {"instruction": "Say hello.", "input": "", "output": "Hello!"}]


def jsonl(rows) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def parquet(rows) -> bytes:
    buffer = io.BytesIO()
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def uploaded(team, client, *, name, kind, filename, content) -> DatasetVersion:
    """A version uploaded through the upload form and checked as the worker checks it."""
    response = client.post(f"/p/{team.project.slug}/datasets/new/", {
        "name": name, "kind": kind, "file_format": "", "file": SimpleUploadedFile(filename, content)})
    assert response.status_code == 302, response.content.decode()[:2000]
    version = DatasetVersion.objects.get(dataset__name=name)
    return services.dataset_version_validate(version_id=version.pk)


def page_of(client, version) -> str:
    return client.get(f"/p/{version.dataset.project.slug}/datasets/{version.dataset.public_id}/v/{version.number}/"
                      ).content.decode()


@pytest.mark.parametrize("filename", ["chats.jsonl", "chats.parquet"])
def test_a_sharegpt_upload_becomes_ready_and_previews_its_turns_with_temper_roles(team, client_for, filename):
    client = client_for(team.teammate)
    content = parquet(SHAREGPT_ROWS) if filename.endswith(".parquet") else jsonl(SHAREGPT_ROWS)
    version = uploaded(team, client, name="sharegpt", kind="sft", filename=filename, content=content)
    assert version.status == VersionStatus.READY, version.errors
    assert version.statistics["layouts"] == {"sharegpt": {"count": 2, "rows": [1, 2]}}
    page = page_of(client, version)
    assert html.escape("ShareGPT layout: read as LLaMA-Factory reads it (2 rows).") in page
    # The preview: the system column as the first turn, human as user, gpt as assistant; the text escaped.
    assert page.count('<span class="turn-role">system</span>') == 1
    assert page.count('<span class="turn-role">user</span>') == 2
    assert page.count('<span class="turn-role">assistant</span>') == 2
    assert "What is &lt;b&gt;2+2&lt;/b&gt;?" in page and "<b>2+2</b>" not in page
    assert "It is four." in page and "Be brief." in page and 'turn-role">human' not in page


def test_a_sharegpt_preference_upload_becomes_ready(team, client_for):
    client = client_for(team.teammate)
    rows = [{"conversations": [turn("human", "Name a prime.")], "chosen": turn("gpt", "Seven."),
             "rejected": turn("gpt", "Eight.")}]
    version = uploaded(team, client, name="pairs", kind="preference", filename="pairs.jsonl", content=jsonl(rows))
    assert version.status == VersionStatus.READY, version.errors
    page = page_of(client, version)
    assert html.escape("ShareGPT layout: read as LLaMA-Factory reads it (1 row).") in page
    assert "Name a prime." in page and "Seven." in page and "Eight." in page


def test_an_alpaca_upload_is_ready_with_its_prompt_joined_and_tokens_counted_as_temper_rows(team, client_for,
                                                                                          tmp_path):
    client = client_for(team.teammate)
    version = uploaded(team, client, name="alpaca", kind="sft", filename="alpaca.jsonl", content=jsonl(ALPACA_ROWS))
    assert version.status == VersionStatus.READY, version.errors
    page = page_of(client, version)
    assert html.escape("Alpaca layout: read as LLaMA-Factory reads it (2 rows).") in page
    assert "Translate to English.\nchat" in html.unescape(page)

    own = uploaded(team, client, name="own", kind="sft", filename="own.jsonl", content=jsonl(
        [{"prompt": "Translate to English.\nchat", "completion": "cat"}, {"prompt": "Say hello.", "completion": "Hello!"}]))
    assert "layouts" not in own.statistics
    assert {key: value for key, value in version.statistics.items() if key != "layouts"} == own.statistics
    model = BaseModel.objects.create(project=team.project, name="tiny", path=str(build_bpe_tokenizer_dir(tmp_path / "tok")),
                                     architecture="LlamaForCausalLM", parameter_count=1,
                                     tokenizer_type="tokenizer.json", dtype="float32", size_bytes=1)
    counted = [services.token_statistics_compute(version_id=each.pk, base_model_id=model.pk).token_statistics
               for each in (version, own)]
    assert counted[0]["fields"] == counted[1]["fields"] and counted[0]["fields"]["prompt"]["count"] == 2


def test_a_row_mixing_layouts_fails_the_upload_naming_its_row_and_field(team, client_for):
    client = client_for(team.teammate)
    rows = [ALPACA_ROWS[0], {**SHAREGPT_ROWS[1], "instruction": "Name a colour."}]
    version = uploaded(team, client, name="mixed", kind="sft", filename="mixed.jsonl", content=jsonl(rows))
    assert version.status == VersionStatus.FAILED
    [error] = version.errors
    assert (error["line"], error["row"], error["field"], error["code"]) == (2, 2, "instruction", "mixed_layouts")
    assert "the row mixes two layouts: 'conversations' (ShareGPT) and 'instruction' (Alpaca)" in error["message"]
    assert "mixes two layouts" in html.unescape(page_of(client, version))


def test_an_alpaca_version_compares_with_the_same_rows_in_temper_layout_as_unchanged(team):
    """Versions are compared as training reads them: a version re-uploaded in Temper's own layout, one row changed,
    differs from its Alpaca version by that row alone."""
    from tests.webapp.datasets.test_compare import upload
    from webapp.datasets import selectors

    first = upload(team, jsonl(ALPACA_ROWS))
    second = upload(team, jsonl([{"prompt": "Translate to English.\nchat", "completion": "cat"},
                                 {"prompt": "Say hello.", "completion": "Hi!"}]), dataset=first.dataset)
    assert first.status == second.status == VersionStatus.READY
    differences = selectors.version_differences(a=first, b=second)
    assert (differences.unchanged, differences.removed.tolist(), differences.added.tolist()) == (1, [2], [2])


def test_a_review_campaign_loads_a_sharegpt_preference_version_as_temper_reads_it(team):
    from tests.webapp.factories import make_ready_version
    from webapp.review import services as review_services
    from webapp.review.models import Item

    rows = [{"conversations": [turn("human", "Name a prime.")], "chosen": turn("gpt", "Seven."),
             "rejected": turn("gpt", "Eight.")}]
    version = make_ready_version(team.project, name="pairs", kind="preference", rows=rows, user=team.owner)
    assert version.status == VersionStatus.READY, version.errors
    campaign = review_services.campaign_create(project=team.project, name="pass 1", guidelines="", required_reviews=1,
                                               reviewers=[team.teammate], source_version=version, user=team.owner)
    review_services.campaign_load_items(campaign_id=campaign.pk)
    [item] = Item.objects.filter(campaign=campaign)
    assert item.prompt == [{"role": "user", "content": "Name a prime."}]
    assert {json.dumps(item.response_a), json.dumps(item.response_b)} == {
        json.dumps([{"role": "assistant", "content": answer}]) for answer in ("Seven.", "Eight.")}
