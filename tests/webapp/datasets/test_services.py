"""Dataset services: storing uploads, numbering versions, validation outcomes, token statistics."""
import html
import json
import re
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile

from jaxengine.data import formats
from jaxengine.tokenizer import load_tokenizer
from tests.factories import build_bpe_tokenizer_dir
from webapp.basemodels.models import BaseModel
from webapp.core.bidi import isolated
from webapp.datasets import selectors, services
from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus

SFT_ROWS = b'{"prompt": "Hi", "completion": "Hello!"}\n{"prompt": "2+2?", "completion": "4"}\n'


@pytest.fixture
def sent_tasks(monkeypatch):
    """Tasks the services send (by name) once their transaction commits."""
    sent = []
    monkeypatch.setattr(services.celery_app, "send_task",
                        lambda name, args, queue: sent.append((name, tuple(args), queue)))
    return sent


def create(team, *, name="chats", kind="sft", content=SFT_ROWS, filename="chats.jsonl", mapping=None, fmt=None):
    return services.dataset_create_with_upload(
        project=team.project, name=name, kind=kind, upload=SimpleUploadedFile(filename, content),
        file_format=fmt, column_mapping=mapping or {}, user=team.teammate,
    )


def test_upload_is_stored_and_validation_queued_after_commit(team, sent_tasks, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        version = create(team)
    assert version.status == VersionStatus.UPLOADED and version.number == 1
    assert version.absolute_path.read_bytes() == SFT_ROWS
    assert version.size_bytes == len(SFT_ROWS) and version.format == "jsonl"
    assert version.file_path == f"datasets/{version.dataset.public_id}/{version.public_id}.jsonl"
    assert sent_tasks == [("worker.tasks.datasets.validate_dataset_version", (version.pk,), "default")]


def test_nothing_is_queued_when_the_transaction_rolls_back(team, sent_tasks, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        create(team)
    assert len(callbacks) == 1 and sent_tasks == []


def test_versions_count_up(team):
    first = create(team)
    second = services.dataset_version_create(
        dataset=first.dataset, upload=SimpleUploadedFile("again.jsonl", SFT_ROWS), file_format=None,
        column_mapping={}, user=team.owner,
    )
    assert (first.number, second.number) == (1, 2)
    assert first.absolute_path != second.absolute_path


def test_format_comes_from_extension_unless_given(team):
    assert create(team, filename="rows.csv", content=b"prompt,completion\na,b\n").format == "csv"
    assert create(team, name="other", filename="rows.txt", fmt="jsonl").format == "jsonl"


@pytest.mark.parametrize(
    ("arguments", "field", "message"),
    [({"filename": "rows.txt"}, "file", "cannot tell the format"),
     ({"mapping": {"answer": "x"}}, "column_mapping", "not a field of kind 'sft'"),
     ({"kind": "chat"}, "kind", "not one of text, sft, preference, prompts"),
     # QA: left out (the API's kind), it was "kind '' is not one of ...", as if '' had been chosen.
     ({"kind": ""}, "kind", "choose the dataset's kind: one of text, sft, preference, prompts"),
     ({"name": "  "}, "name", "give the dataset a name")],
)
def test_it_rejects_bad_uploads_and_creates_nothing(team, arguments, field, message):
    with pytest.raises(ValidationError) as raised:
        create(team, **arguments)
    assert message in " ".join(raised.value.message_dict[field])
    assert not Dataset.objects.exists() and not DatasetVersion.objects.exists()


def test_it_rejects_a_duplicate_name(team):
    create(team)
    with pytest.raises(ValidationError, match="already has a dataset named 'chats'"):
        create(team)


def test_names_differing_only_in_letter_case_are_one_name(team):
    """QA: "Demo" and "demo" could both exist in one project."""
    create(team)
    with pytest.raises(ValidationError) as excinfo:
        create(team, name="Chats")
    assert excinfo.value.message_dict["name"] == [
        "alpha already has a dataset named 'chats' (names that differ only in letter case are the same name); "
        f"upload a new version of it instead (in the API: dataset {Dataset.objects.get().public_id}, no name)"]
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        Dataset.objects.create(project=team.project, name="CHATS", kind="sft")
    # Exports (arena, review) that name a dataset add a version to the one of that name in any case.
    assert selectors.dataset_named(project=team.project, name="CHATS").name == "chats"


@pytest.mark.parametrize("first, second", [("Ärger", "ärger"), ("ΣΟΦΙΑ", "σοφια"), ("Straße", "STRASSE")])
def test_names_differing_only_in_letter_case_are_one_name_in_every_script(team, first, second):
    """QA: on SQLite, LOWER() folds ASCII letters only, so "Ärger" and "ärger" could both be stored."""
    create(team, name=first)
    with pytest.raises(ValidationError) as excinfo:
        create(team, name=second)
    assert excinfo.value.message_dict["name"] == [
        f"alpha already has a dataset named {first!r} (names that differ only in letter case are the same name); "
        f"upload a new version of it instead (in the API: dataset {Dataset.objects.get().public_id}, no name)"]
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        Dataset.objects.create(project=team.project, name=second, kind="sft")
    assert selectors.dataset_named(project=team.project, name=second).name == first
    assert Dataset.objects.create(project=team.outsider_project, name=second, kind="sft").name == second


def test_validation_makes_a_good_version_ready_with_statistics(team):
    version = services.dataset_version_validate(version_id=create(team).pk)
    version.refresh_from_db()
    assert version.status == VersionStatus.READY
    assert (version.row_count, version.error_count, version.errors) == (2, 0, [])
    assert version.statistics["fields"]["completion"]["max"] == 6
    assert version.validated_at is not None and version.absolute_path.is_file()


def test_validation_fails_a_bad_version_and_deletes_its_file(team):
    content = b'{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\nnot json\n'
    version = services.dataset_version_validate(version_id=create(team, content=content).pk)
    version.refresh_from_db()
    assert version.status == VersionStatus.FAILED
    assert [(e["line"], e["code"]) for e in version.errors] == [(2, "missing_field"), (3, "json")]
    assert version.error_count == 2 and version.statistics == {}
    assert not version.absolute_path.exists()


def test_validation_applies_the_column_mapping(team):
    content = b'{"question": "q", "answer": "a"}\n'
    version = create(team, content=content, mapping={"prompt": "question", "completion": "answer"})
    assert services.dataset_version_validate(version_id=version.pk).status == VersionStatus.READY


def test_a_ready_version_never_changes(team):
    version = services.dataset_version_validate(version_id=create(team).pk)
    version.absolute_path.write_bytes(b"garbage\n")
    again = services.dataset_version_validate(version_id=version.pk)
    assert again.status == VersionStatus.READY and again.row_count == 2


def test_validation_of_a_missing_file(team):
    version = create(team)
    version.absolute_path.unlink()
    version = services.dataset_version_validate(version_id=version.pk)
    assert version.status == VersionStatus.FAILED and version.errors[0]["code"] == "missing_file"


def test_a_check_that_stops_on_an_error_of_temper_fails_the_version_saying_so(team, monkeypatch, caplog):
    """A reader's own bug (an exception no check names: dataqa found several, an IndexError on a CSV of blank
    lines among them) left the version "validating" for good, and its "check again" met the same bug. It fails,
    with the error named as Temper's and what to do, and the traceback goes to the worker's log."""
    version = create(team)

    def a_readers_bug(*args, **kwargs):
        raise IndexError("list index out of range")

    monkeypatch.setattr(services.formats, "validate_file", a_readers_bug)
    version = services.dataset_version_validate(version_id=version.pk)
    version.refresh_from_db()
    assert version.status == VersionStatus.FAILED and version.error_count == 1
    [issue] = version.errors
    assert issue["code"] == "internal_error"
    assert issue["message"] == (
        "Temper's check of this file stopped on an error of its own (IndexError: list index out of range), not on "
        "a problem it found in the file: tell whoever runs Temper (the default worker's log has the details), "
        "and upload the file again once it is mended")
    assert not version.absolute_path.exists()
    assert any(record.exc_info and record.exc_info[0] is IndexError for record in caplog.records)


@pytest.fixture
def tokenizer_model(team, tmp_path):
    model_dir = build_bpe_tokenizer_dir(tmp_path / "tok", style="qwen")
    return BaseModel.objects.create(
        project=team.project, name="tiny", path=str(model_dir), architecture="LlamaForCausalLM",
        parameter_count=1, tokenizer_type="tokenizer.json", dtype="float32", size_bytes=1,
    )


def test_token_statistics_count_tokens_per_field(team, tokenizer_model, sent_tasks, django_capture_on_commit_callbacks):
    content = b'{"prompt": "hello world", "completion": "the model"}\n' + json.dumps(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}).encode() + b"\n"
    version = services.dataset_version_validate(version_id=create(team, content=content).pk)
    with django_capture_on_commit_callbacks(execute=True):
        services.token_statistics_request(version=version, base_model=tokenizer_model)
    assert version.token_statistics == {"status": "computing", "base_model": "tiny"}
    assert sent_tasks[-1] == ("worker.tasks.datasets.compute_token_statistics", (version.pk, tokenizer_model.pk), "default")

    version = services.token_statistics_compute(version_id=version.pk, base_model_id=tokenizer_model.pk)
    tokenizer = load_tokenizer(tokenizer_model.path)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    expected = {
        "prompt": len(tokenizer.encode("hello world")),
        "completion": len(tokenizer.encode("the model")),
        "messages": len(tokenizer.encode(chat)),
    }
    stats = version.token_statistics
    assert stats["status"] == "ready" and stats["rows"] == 2 and stats["sampled"] is False
    for field, count in expected.items():
        assert (stats["fields"][field]["min"], stats["fields"][field]["max"]) == (count, count)
    assert stats["fields"]["total"]["max"] == max(expected["prompt"] + expected["completion"], expected["messages"])


def test_token_counts_say_which_template_variables_they_render_chats_with(team, client, tmp_path):
    """QA: a run renders chats with its data.chat_template_kwargs (Qwen3's enable_thinking: false adds an empty
    think block to each answer), the page's counts with the model's own variables only, and it did not say so."""
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    version = ready(team, name="counted", kind="sft", rows=[{"messages": chat}])
    template = (REAL_TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")
    plain_dir = build_bpe_tokenizer_dir(tmp_path / "plain", chat_template=template)
    unthinking_dir = build_bpe_tokenizer_dir(tmp_path / "unthinking", chat_template=template)
    (unthinking_dir / "chat_template_kwargs.json").write_text('{"enable_thinking": false}')
    for name, directory, said in (
            ("plain", plain_dir, "no template variables set (the template's defaults)"),
            ("unthinking", unthinking_dir, "the model's own template variables: enable_thinking: false")):
        model = BaseModel.objects.create(project=team.project, name=name, path=str(directory),
                                         architecture="Qwen3ForCausalLM", parameter_count=1,
                                         tokenizer_type="tokenizer.json", dtype="float32", size_bytes=1)
        version = services.token_statistics_compute(version_id=version.pk, base_model_id=model.pk)
        tokenizer = load_tokenizer(directory)
        assert version.token_statistics["fields"]["messages"]["max"] == len(
            tokenizer.encode(tokenizer.apply_chat_template(chat)))
        page = " ".join(html.unescape(re.sub(r"<[^>]+>", "", version_page(team, client, version))).split())
        assert (f"chats as the chat template renders them, with {said}; a run renders them with its "
                "data.chat_template_kwargs over those, which may count otherwise.") in page


def test_token_counts_of_a_template_that_splits_turns_count_the_examples_an_sft_run_trains(team, client, tmp_path):
    """Follow-up: on Qwen3, whose template drops earlier turns' reasoning, an sft run trains a conversation of several
    assistant turns one turn per example, each with the conversation before it; the page's token chart counted such a
    conversation whole, as no run trains it. It counts those examples, and says so; a template that keeps
    conversations whole counts them whole."""
    two_turns = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                 {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6"}]
    one_turn = two_turns[:2]
    version = ready(team, name="turns", kind="sft", rows=[{"messages": two_turns}, {"messages": one_turn}])
    for name, template in (("qwen3", (REAL_TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")), ("chatml", None)):
        directory = build_bpe_tokenizer_dir(tmp_path / name, chat_template=template)
        model = BaseModel.objects.create(project=team.project, name=name, path=str(directory),
                                         architecture="Qwen3ForCausalLM", parameter_count=1,
                                         tokenizer_type="tokenizer.json", dtype="float32", size_bytes=1)
        stats = services.token_statistics_compute(version_id=version.pk, base_model_id=model.pk).token_statistics
        tokenizer = load_tokenizer(directory)

        def tokens(chat):
            return len(tokenizer.encode(tokenizer.apply_chat_template(chat)))

        # Split: the two turns' examples (the chat up to each turn) and the one-turn chat; whole: the two chats.
        examples = ([tokens(two_turns[:2]), tokens(two_turns), tokens(one_turn)] if name == "qwen3"
                    else [tokens(two_turns), tokens(one_turn)])
        assert stats["rows"] == 2
        for field in ("messages", "total"):
            summary = stats["fields"][field]
            assert (summary["count"], summary["min"], summary["max"]) == (len(examples), min(examples), max(examples))
            assert summary["mean"] == pytest.approx(sum(examples) / len(examples), abs=0.01)
        page = html.unescape(version_page(team, client, version))
        if name == "qwen3":
            assert stats["split_by_turn"] == {"rows": 1, "examples": 2}
            assert ("so an sft run trains a conversation of several assistant turns one turn per example, each with "
                    "the conversation before it; counted so here: 1 conversation as its 2 examples. These figures "
                    "count examples, not rows") in page
        else:
            assert "split_by_turn" not in stats and 'id="token-split-note"' not in page


def test_token_statistics_need_a_ready_version(team, tokenizer_model):
    version = create(team)
    with pytest.raises(ValidationError, match="once the version is ready"):
        services.token_statistics_request(version=version, base_model=tokenizer_model)


def test_token_statistics_report_a_broken_tokenizer(team, tokenizer_model, tmp_path):
    version = services.dataset_version_validate(version_id=create(team).pk)
    tokenizer_model.path = str(tmp_path / "nowhere")
    tokenizer_model.save()
    version = services.token_statistics_compute(version_id=version.pk, base_model_id=tokenizer_model.pk)
    assert version.token_statistics["status"] == "failed" and "no such directory" in version.token_statistics["error"]


def test_an_unreachable_broker_leaves_the_version_waiting(team, monkeypatch, django_capture_on_commit_callbacks,
                                                           caplog):
    from kombu.exceptions import OperationalError

    def refuse(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(services.celery_app, "send_task", refuse)
    with django_capture_on_commit_callbacks(execute=True):
        version = create(team)
    version.refresh_from_db()
    assert version.status == VersionStatus.UPLOADED
    assert "is Redis (REDIS_URL) up?" in caplog.text


def test_requeue_sends_the_validation_again(team, sent_tasks, django_capture_on_commit_callbacks):
    version = create(team)
    with django_capture_on_commit_callbacks(execute=True):
        services.dataset_version_requeue(version=version)
    assert sent_tasks == [("worker.tasks.datasets.validate_dataset_version", (version.pk,), "default")]
    # A check that stopped half-way (its worker process killed: Celery drops the message) can be queued again.
    DatasetVersion.objects.filter(pk=version.pk).update(status=VersionStatus.VALIDATING)
    version.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        services.dataset_version_requeue(version=version)
    assert sent_tasks[-1] == ("worker.tasks.datasets.validate_dataset_version", (version.pk,), "default")
    version = services.dataset_version_validate(version_id=version.pk)
    assert version.status == VersionStatus.READY
    with pytest.raises(ValidationError, match="is ready, not waiting for a worker"):
        services.dataset_version_requeue(version=version)


def test_look_alike_names_are_refused_or_collide(team):
    """A dataset named 'qa3-sft' + U+200B (zero-width space) was made beside 'qa3-sft'; a name typed with a
    combining accent ('cafe' + U+0301) was a second 'café'."""
    create(team, name="qa3-sft")
    with pytest.raises(ValidationError) as refused:
        create(team, name="qa3-sft\u200b")
    assert refused.value.message_dict["name"][0].startswith("an invisible character, U+200B (ZERO WIDTH SPACE), "
                                                            "at position 8")
    create(team, name="café")
    with pytest.raises(ValidationError, match="already has a dataset named 'café'"):
        create(team, name="cafe\u0301")
    assert sorted(Dataset.objects.values_list("name", flat=True)) == ["café", "qa3-sft"]


@pytest.mark.parametrize("filename, character, position", [("report\u202elsx.csv", "U+202E (RIGHT-TO-LEFT OVERRIDE)", 7),
                                                         ("chats\u200b.jsonl", "U+200B (ZERO WIDTH SPACE)", 6)])
def test_a_file_name_with_a_bidi_control_or_zero_width_character_is_refused(team, filename, character, position):
    """'report' + U+202E + 'lsx.csv' showed as 'reportvsc.xsl' on the version pages, told by another extension."""
    with pytest.raises(ValidationError) as refused:
        create(team, filename=filename)
    assert refused.value.message_dict["file"][0].startswith(f"an invisible character, {character}, at position {position}")
    assert not Dataset.objects.filter(project=team.project).exists() and not DatasetVersion.objects.exists()


def test_a_file_name_is_stored_in_nfc(team):
    assert create(team, filename="cafe\u0301.jsonl").original_filename == "café.jsonl"


def test_token_statistics_report_a_chat_template_that_refuses_a_row(team, tmp_path):
    """QA: a base model whose chat template raises on a row (Gemma's on a system turn) made the worker's
    task raise ChatTemplateError, leaving the statistics 'computing'; they fail naming the template."""
    model_dir = build_bpe_tokenizer_dir(tmp_path / "tok", style="qwen",
                                        chat_template="{{ raise_exception('System role not supported') }}")
    base_model = BaseModel.objects.create(
        project=team.project, name="strict", path=str(model_dir), architecture="LlamaForCausalLM",
        parameter_count=1, tokenizer_type="tokenizer.json", dtype="float32", size_bytes=1)
    content = json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": "hello"}]}).encode() + b"\n"
    version = services.dataset_version_validate(version_id=create(team, content=content).pk)
    version = services.token_statistics_compute(version_id=version.pk, base_model_id=base_model.pk)
    assert version.token_statistics["status"] == "failed"
    assert "System role not supported" in version.token_statistics["error"]


def test_token_statistics_record_an_unexpected_error_instead_of_computing_for_ever(team, tmp_path, client):
    """QA: only the listed errors were caught; any other (here a chat template dividing by zero) ended the
    worker's task and left the statistics 'computing', the page counting for ever with no error shown."""
    model_dir = build_bpe_tokenizer_dir(tmp_path / "tok", style="qwen",
                                        chat_template="{{ 1 // (messages | length - 2) }}")
    base_model = BaseModel.objects.create(
        project=team.project, name="divides", path=str(model_dir), architecture="LlamaForCausalLM",
        parameter_count=1, tokenizer_type="tokenizer.json", dtype="float32", size_bytes=1)
    exchange = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    content = (json.dumps({"messages": exchange * 2}).encode() + b"\n"
               + json.dumps({"messages": exchange}).encode() + b"\n")  # two turns: the template divides by 0
    version = services.dataset_version_validate(version_id=create(team, content=content).pk)
    services.token_statistics_request(version=version, base_model=base_model)
    version = services.token_statistics_compute(version_id=version.pk, base_model_id=base_model.pk)
    version.refresh_from_db()
    assert version.token_statistics["status"] == "failed"
    assert version.token_statistics["error"] == (
        f"row 2, field messages: {model_dir / 'tokenizer_config.json'}: chat template line 1: integer division or "
        "modulo by zero (ZeroDivisionError); the template fails on this conversation: fix it or choose a model with "
        "another")
    client.force_login(team.owner)
    page = client.get(f"/p/{team.project.slug}/datasets/{version.dataset.public_id}/v/{version.number}/").content.decode()
    assert "failed: row 2, field messages: " in page and "(ZeroDivisionError)" in page and "Try again</button>" in page


def ready(team, *, name, kind, rows):
    """A version of ``rows`` uploaded and validated as the worker does it."""
    content = "".join(json.dumps(row) + "\n" for row in rows).encode()
    return services.dataset_version_validate(version_id=create(team, name=name, kind=kind, content=content).pk)


def launch_warnings(team, *, task, train, evaluation=None):
    from tests.webapp.factories import make_base_model
    from webapp.runs import services as run_services

    data = {"train": train.public_id, **({"eval": evaluation.public_id} if evaluation is not None else {})}
    model = BaseModel.objects.filter(project=team.project).first() or make_base_model(team.project)
    spec = {"task": task, "model": model.public_id, "data": data, "train": {"max_steps": 2}}
    return run_services.launch_check(project=team.project, spec=spec, axes=[]).warnings


def test_preference_rows_with_a_side_that_has_no_assistant_turn_are_counted_and_warned_of_at_launch(team, client):
    """QA: such rows are valid (a review campaign's prompts), but a DPO or reward run picked them and silently
    learned nothing from that side."""
    def chat(*roles, says="says"):
        return [{"role": role, "content": f"{role} {says}"} for role in roles]

    rows = [{"chosen": chat("user", "assistant"), "rejected": chat("user", "assistant", says="errs")} for _ in range(3)]
    rows[1] = {"chosen": chat("user"), "rejected": chat("user", "assistant")}
    rows[2] = {"chosen": chat("user"), "rejected": chat("system", "user")}
    version = ready(team, name="pairs", kind="preference", rows=rows)
    assert version.status == VersionStatus.READY
    assert version.statistics["no_assistant_turn"] == {"chosen": {"count": 2, "rows": [2, 3]},
                                                       "rejected": {"count": 1, "rows": [3]}}
    page = version_page(team, client, version)
    assert "2 rows (rows 2, 3) have a chosen chat with no assistant turn: dpo and reward runs learn" in page
    assert "1 row (row 3) has a rejected chat with no assistant turn" in page
    assert launch_warnings(team, task="dpo", train=version) == [
        f"data.train: rows of {isolated('pairs v1')} end with no assistant turn — 2 whose chosen side does (rows 2, "
        "3); 1 whose rejected side does (row 3): dpo learns nothing from a side without the assistant's answer; add "
        "the answer to those chats, or leave the rows out (rows without one are meant as a review campaign's "
        "prompts)"]
    whole = ready(team, name="whole", kind="preference", rows=rows[:1])
    assert launch_warnings(team, task="reward", train=whole, evaluation=version)[0].startswith(
        f"data.eval: rows of {isolated('pairs v1')} end with no assistant turn")
    assert launch_warnings(team, task="dpo", train=whole) == []


def test_preference_rows_whose_chosen_is_their_rejected_are_counted_and_warned_of_at_launch(team, client):
    """QA: a pair whose two answers are the same is valid, but a DPO or reward run learned nothing from it, and
    nothing said so (a review campaign leaves such rows out)."""
    rows = [{"prompt": f"q{index}", "chosen": "yes", "rejected": "no"} for index in range(4)]
    rows[1]["rejected"] = rows[3]["rejected"] = "yes "
    version = ready(team, name="ties", kind="preference", rows=rows)
    assert version.status == VersionStatus.READY
    assert version.statistics["identical_pairs"] == {"count": 2, "rows": [2, 4]}
    page = version_page(team, client, version)
    assert ("2 rows (rows 2, 4) have the same chosen and rejected answer: dpo and reward runs learn nothing from "
            "them (review campaigns leave them out).") in page
    assert launch_warnings(team, task="reward", train=version) == [
        f"data.train: 2 rows of {isolated('ties v1')} have the same chosen and rejected answer (rows 2, 4): reward "
        "learns nothing from such a pair; remove those rows, or give each the answer meant to lose as rejected"]
    untied = ready(team, name="untied", kind="preference", rows=rows[:1])
    assert launch_warnings(team, task="dpo", train=untied) == []


def version_page(team, client, version) -> str:
    client.force_login(team.owner)
    return client.get(f"/p/{team.project.slug}/datasets/{version.dataset.public_id}/v/{version.number}/").content.decode()


def test_duplicate_rows_are_counted_and_many_are_warned_of_at_launch(team, client):
    """QA: exact duplicates went unseen: not counted, not shown, not warned of."""
    rows = [{"prompt": f"q{index}", "completion": "a"} for index in range(6)]
    version = ready(team, name="chats", kind="sft", rows=[*rows, rows[1], rows[4], rows[1]])
    assert version.statistics["duplicates"] == {"count": 3, "rows": [[7, 2], [8, 5], [9, 2]]}
    assert ("3 rows repeat an earlier row exactly (row 7 = row 2, row 8 = row 5, row 9 = row 2)."
            in version_page(team, client, version))
    assert launch_warnings(team, task="sft", train=version) == [
        f"data.train: {isolated('chats v1')} holds 3 exact repeats of earlier rows among its 9 (row 7 = row 2, row 8 = "
        "row 5, row 9 = row 2), so the run weights those rows over the rest; remove the repeats unless that is "
        "meant"]
    # One repeat in more than a hundred rows is common and harmless: not said.
    many = ready(team, name="many", kind="sft", rows=[*({"prompt": f"q{i}", "completion": "a"} for i in range(150)),
                                                      {"prompt": "q0", "completion": "a"}])
    assert many.statistics["duplicates"]["count"] == 1
    assert launch_warnings(team, task="sft", train=many) == []


def test_versions_validated_before_row_digests_were_kept_are_still_compared(team):
    """QA: versions validated before the ``.rows`` file was written beside them (or whose file was lost) were
    never compared: the launch said nothing of the rows the eval set shares with the training set. Their digests
    are worked out from the data file, as validation works them out."""
    train = ready(team, name="old train", kind="sft", rows=[{"prompt": f"q{i}", "completion": "a"} for i in range(5)])
    held_out = ready(team, name="old held", kind="sft", rows=[{"prompt": "q4", "completion": "a"},
                                                              {"prompt": "new", "completion": "a"}])
    kept = held_out.row_digests_path.read_bytes()
    for version in (train, held_out):
        version.row_digests_path.unlink()
    assert launch_warnings(team, task="sft", train=train, evaluation=held_out) == [
        # "1 of the 2 rows … are also in"
        f"data.eval: {isolated('old held v1')} shares 1 row of its 2 with data.train's {isolated('old train v1')} "
        "(row 1), so evaluation scores rows the run trains on; take them out of one of the two"]
    assert selectors._RowDigestSource.of(held_out).read().tobytes() == kept, "the digests validation wrote"
    assert not held_out.row_digests_path.exists(), "a launch check writes nothing"


def test_rows_that_eval_shares_with_train_are_warned_of_at_launch(team, django_capture_on_commit_callbacks):
    train = ready(team, name="train", kind="sft", rows=[{"prompt": f"q{i}", "completion": "a"} for i in range(5)])
    held_out = ready(team, name="held", kind="sft", rows=[{"prompt": "new", "completion": "a"},
                                                          {"prompt": "q3", "completion": "a"},
                                                          {"prompt": "other", "completion": "a"},
                                                          {"prompt": "q0", "completion": "a"}])
    assert launch_warnings(team, task="sft", train=train, evaluation=held_out) == [
        f"data.eval: {isolated('held v1')} shares 2 rows of its 4 with data.train's {isolated('train v1')} (rows "
        "2, 4), so evaluation scores rows the run trains on; take them out of one of the two"]
    # The digests go with the version's file.
    digests = held_out.row_digests_path
    assert digests.is_file()
    with django_capture_on_commit_callbacks(execute=True):
        services.dataset_version_delete(version=held_out)
    assert not digests.exists()


def test_chats_the_models_chat_template_refuses_are_counted_and_refused_at_launch(team, client, tmp_path):
    """QA: a chat with a system turn mid-way, or two user turns in a row, is valid and trains on a ChatML model,
    but Gemma's template raises on it: the run was launched and stopped at its start, on the first such row."""
    from tests.factories import GEMMA_CHAT_TEMPLATE
    from tests.webapp.factories import make_base_model
    from webapp.runs import services as run_services

    def chat(*roles):
        return {"messages": [{"role": role, "content": f"{role} says"} for role in roles]}

    rows = [chat("system", "user", "assistant"), chat("user", "system", "assistant"),
            chat("user", "user", "assistant", "assistant"), chat("user", "system", "assistant")]
    version = ready(team, name="shapes", kind="sft", rows=rows)
    assert version.status == VersionStatus.READY
    assert version.statistics["chat_shapes"] == {"system_later": {"count": 2, "rows": [2, 4]},
                                                 "same_role_twice": {"count": 1, "rows": [3]},
                                                 "assistant_first": {"count": 0, "rows": []}}
    page = html.unescape(version_page(team, client, version))
    assert ("2 rows (rows 2, 4) hold a system turn after the first turn: some models' chat templates (Gemma's) "
            "refuse such chats, and a launch on such a model says so.") in page
    strict = make_base_model(team.project, name="strict", path=str(
        build_bpe_tokenizer_dir(tmp_path / "strict", chat_template=GEMMA_CHAT_TEMPLATE)))
    spec = {"task": "sft", "model": strict.public_id, "data": {"train": version.public_id}, "train": {"max_steps": 2}}
    with pytest.raises(ValidationError) as refused:
        run_services.launch_check(project=team.project, spec=spec, axes=[])
    refusal = ("which the model's chat template refuses (chat template line 11: Conversation roles must alternate "
               "user/assistant/user/assistant/...), so the run would stop at its start: put a system turn first and "
               "user and assistant turns in turn in those chats, or choose a model whose template takes them")
    assert refused.value.message_dict == {"data.train": [
        f"2 rows of shapes v1 (rows 2, 4) hold a system turn after the first turn, {refusal}",
        f"1 row of shapes v1 (row 3) holds two turns of one role in a row, {refusal}"]}
    chatml = make_base_model(team.project, name="chatml", path=str(build_bpe_tokenizer_dir(tmp_path / "chatml")))
    assert run_services.launch_check(project=team.project, spec={**spec, "model": chatml.public_id}, axes=[])


def test_the_launch_probes_chat_shapes_with_the_runs_template_variables(team, tmp_path):
    """A template may refuse a shape only with some variables (here a system turn mid-way, with enable_thinking
    false): the launch's probe renders with data.chat_template_kwargs as the run will, so it refuses then, not
    otherwise."""
    from tests.webapp.factories import make_base_model
    from webapp.runs import services as run_services

    rows = [{"messages": [{"role": "user", "content": "u"}, {"role": "system", "content": "s"},
                          {"role": "assistant", "content": "a"}]}]
    version = ready(team, name="later-system", kind="sft", rows=rows)
    template = ("{% for m in messages %}{% if m.role == 'system' and not loop.first and enable_thinking is defined "
                "and enable_thinking is false %}{{ raise_exception('no system turn later without thinking') }}"
                "{% endif %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    model = make_base_model(team.project, name="picky", path=str(
        build_bpe_tokenizer_dir(tmp_path / "picky", chat_template=template)))
    spec = {"task": "sft", "model": model.public_id, "data": {"train": version.public_id}, "train": {"max_steps": 2}}
    assert run_services.launch_check(project=team.project, spec=spec, axes=[])
    spec["data"]["chat_template_kwargs"] = {"enable_thinking": False}
    with pytest.raises(ValidationError) as refused:
        run_services.launch_check(project=team.project, spec=spec, axes=[])
    assert "no system turn later without thinking" in refused.value.message_dict["data.train"][0]


REAL_TEMPLATES = Path(__file__).parents[2] / "jaxengine" / "tokenizer" / "real_templates"


def test_conversations_a_template_trains_one_turn_per_example_are_warned_of_at_launch(team, client, tmp_path):
    """QA: on Qwen3, whose template drops earlier turns' reasoning, each assistant turn of a conversation is an
    example of its own with the conversation before it, so the tokens grow with the square of the turns; the
    launch said nothing. It says so from validation's counts, and not where the conversations train whole."""
    from tests.webapp.factories import make_base_model
    from webapp.runs import services as run_services

    def chat(*texts):
        return {"messages": [{"role": ("user", "assistant")[index % 2], "content": text}
                             for index, text in enumerate(texts)]}

    rows = [{"messages": [{"role": "system", "content": "Answer briefly."}, *chat(
                "What is 2+2?", "4", "And 3+3?", "6", "Thanks", "You are welcome.")["messages"]]},
            chat("Hi", "Hello"), chat("2+2?", "4", "3+3?", "6")]
    version = ready(team, name="turns", kind="sft", rows=rows)
    # By hand, in characters: 59, 7 and 10 whole; split, 28 + 37 + 59, 7 and 5 + 10.
    assert version.statistics["turn_splits"] == {"rows": 2, "examples": 5, "characters": 76, "split_characters": 146}
    assert ("2 conversations have several assistant turns: a model whose chat template renders earlier turns otherwise "
            "than the latest (Qwen3's) trains each one turn per example, making 5 examples of them and about 1.9× the "
            "file's characters, and a launch on such a model says so.") in html.unescape(version_page(team, client, version))

    def model(name, template):
        return make_base_model(team.project, name=name, path=str(
            build_bpe_tokenizer_dir(tmp_path / name, chat_template=template))).public_id

    qwen3 = model("qwen3", (REAL_TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8"))
    spec = {"task": "sft", "model": qwen3, "data": {"train": version.public_id}, "train": {"max_steps": 2}}
    warning = (f"data.train: the model's chat template renders earlier assistant turns otherwise than the latest "
               f"(Qwen3's drops their reasoning), so 2 conversations of the 3 rows of {isolated('turns v1')} are "
               "trained one assistant turn per example, each with the conversation before it: 6 examples instead of "
               "3 rows, and about 1.9× the tokens (an estimate from the conversations' lengths in characters). To "
               "train each conversation once, choose a model whose chat template marks assistant turns with "
               "{% generation %}, or set data.loss_on: all (every token trained, the user turns too)")
    assert run_services.launch_check(project=team.project, spec=spec, axes=[]).warnings == [warning]
    # With thinking off, too: the template still renders the latest turn otherwise.
    unthinking = {**spec, "data": {**spec["data"], "chat_template_kwargs": {"enable_thinking": False}}}
    assert run_services.launch_check(project=team.project, spec=unthinking, axes=[]).warnings == [warning]
    for whole in ({**spec, "data": {**spec["data"], "loss_on": "all"}},
                  {**spec, "model": model("marked", (REAL_TEMPLATES / "qwen2_5_generation.jinja").read_text(
                      encoding="utf-8"))},
                  {**spec, "model": model("chatml", None)}):
        assert run_services.launch_check(project=team.project, spec=whole, axes=[]).warnings == []


def _turns_chat(*texts):
    return {"messages": [{"role": ("user", "assistant")[index % 2], "content": text}
                         for index, text in enumerate(texts)]}


def validated_before_turn_splits(version: DatasetVersion) -> DatasetVersion:
    """``version`` as validation left it before it counted turn splits."""
    statistics = {key: value for key, value in version.statistics.items() if key != "turn_splits"}
    DatasetVersion.objects.filter(pk=version.pk).update(statistics=statistics)
    return DatasetVersion.objects.get(pk=version.pk)


def test_the_launch_check_on_a_version_validated_before_turn_splits_has_the_worker_count_them(
        team, client, tmp_path, sent_tasks, django_capture_on_commit_callbacks):
    """Follow-up: a version validated before turn splits were counted had none in its statistics, so a launch on Qwen3
    warned of nothing. The launch page's live check then counted them in its request, one pass over the whole file (a
    large old version held every check of the page for that long). It queues the count on the default queue instead,
    as the version's page does (once), and warns that those conversations are being counted, with ``counting`` in its
    answer so the page asks again; once the worker has stored the count it says how many, from the stored count."""
    from tests.webapp.factories import make_base_model

    rows = [_turns_chat("2+2?", "4", "3+3?", "6"), _turns_chat("Hi", "Hello")]
    counted = ready(team, name="turns", kind="sft", rows=rows).statistics["turn_splits"]
    # By hand, in characters: 10 and 7 whole; split, 5 + 10 and 7.
    assert counted == {"rows": 1, "examples": 2, "characters": 17, "split_characters": 22}
    old = validated_before_turn_splits(DatasetVersion.objects.get(dataset__name="turns"))
    qwen3 = make_base_model(team.project, name="qwen3", path=str(build_bpe_tokenizer_dir(
        tmp_path / "qwen3", chat_template=(REAL_TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")))).public_id
    spec = {"task": "sft", "model": qwen3, "data": {"train": old.public_id}, "train": {"max_steps": 2}}
    client.force_login(team.teammate)
    form = {"mode": "yaml", "task": "sft", "spec_yaml": json.dumps(spec)}

    def checked() -> dict:
        with django_capture_on_commit_callbacks(execute=True):
            return client.post(f"/p/{team.project.slug}/runs/new/check/", form).json()

    sent_tasks.clear()
    answer = checked()
    assert "turn_splits" not in DatasetVersion.objects.get(pk=old.pk).statistics  # not counted by the request
    assert answer["errors"] == {} and answer["counting"] is True
    assert answer["warnings"] == [
        "data.train: the model's chat template renders earlier assistant turns otherwise than the latest (Qwen3's "
        "drops their reasoning), so a conversation of several assistant turns is trained one assistant turn per "
        f"example, each with the conversation before it; counting those of {isolated('turns v1')}… (it was validated "
        "before they were counted: a worker counts them now, and then this check and the version's page say how "
        "many). To train each conversation once, choose a model whose chat template marks assistant turns with "
        "{% generation %}, or set data.loss_on: all (every token trained, the user turns too)"]
    assert sent_tasks == [(services.TURN_SPLITS_TASK, (old.pk,), "default")]
    assert checked()["counting"] is True and len(sent_tasks) == 1  # asked again while queued: not queued again

    from worker.tasks.datasets import count_turn_splits

    count_turn_splits(old.pk)  # the worker's task, as the default queue's worker runs it
    assert DatasetVersion.objects.get(pk=old.pk).statistics["turn_splits"] == counted
    answer = checked()
    assert answer["counting"] is False and answer["warnings"] == [
        f"data.train: the model's chat template renders earlier assistant turns otherwise than the latest (Qwen3's "
        f"drops their reasoning), so 1 conversation of the 2 rows of {isolated('turns v1')} is trained one assistant "
        "turn per example, each with the conversation before it: 3 examples instead of 2 rows, and about 1.3× the "
        "tokens (an estimate from the conversations' lengths in characters). To train each conversation once, choose "
        "a model whose chat template marks assistant turns with {% generation %}, or set data.loss_on: all (every "
        "token trained, the user turns too)"]
    assert len(sent_tasks) == 1
    # Other kinds have none to count.
    prompts = ready(team, name="asked", kind="prompts", rows=[{"prompt": "2+2?"}])
    assert services.version_turn_splits(version=prompts) is None and "turn_splits" not in prompts.statistics


def test_the_page_of_a_version_validated_before_turn_splits_has_the_worker_count_them(
        team, client, sent_tasks, django_capture_on_commit_callbacks):
    """Session 32: the page of a version validated before turn splits were counted counted them during its GET, one
    pass over the whole file: a large old version's page took as long to answer. The page queues the count on the
    default queue (once: its refreshes while it is queued do not queue it again) and says it is counting, refreshing
    itself, until the worker has stored it; a count its task lost is queued again after TURN_SPLITS_REQUEUE_SECONDS."""
    rows = [_turns_chat("2+2?", "4", "3+3?", "6"), _turns_chat("Hi", "Hello")]
    counted = ready(team, name="turns", kind="sft", rows=rows).statistics["turn_splits"]
    old = validated_before_turn_splits(DatasetVersion.objects.get(dataset__name="turns"))
    note = ("1 conversation has several assistant turns: a model whose chat template renders earlier turns otherwise "
            "than the latest (Qwen3's) trains it one turn per example, making 2 examples of it and about 1.3× the "
            "file's characters")

    def page() -> str:
        with django_capture_on_commit_callbacks(execute=True):
            return html.unescape(version_page(team, client, old))

    sent_tasks.clear()
    first = page()
    assert "turn_splits" not in DatasetVersion.objects.get(pk=old.pk).statistics  # not counted by the request
    assert note not in first and 'id="turn-splits-counting"' in first and 'http-equiv="refresh"' in first
    assert sent_tasks == [(services.TURN_SPLITS_TASK, (old.pk,), "default")]
    assert 'id="turn-splits-counting"' in page() and len(sent_tasks) == 1  # a refresh does not queue it again

    # Its task lost: queued again once the wait is past.
    stored = DatasetVersion.objects.get(pk=old.pk)
    stored.statistics = {**stored.statistics, services.TURN_SPLITS_QUEUED: stored.statistics[
        services.TURN_SPLITS_QUEUED] - services.TURN_SPLITS_REQUEUE_SECONDS}
    stored.save(update_fields=["statistics"])
    page()
    assert sent_tasks == [(services.TURN_SPLITS_TASK, (old.pk,), "default")] * 2

    from worker.tasks.datasets import count_turn_splits

    count_turn_splits(old.pk)  # the worker's task, as the default queue's worker runs it
    assert DatasetVersion.objects.get(pk=old.pk).statistics == {**old.statistics, "turn_splits": counted}
    done = page()
    assert note in done and 'id="turn-splits-counting"' not in done and 'http-equiv="refresh"' not in done
    assert len(sent_tasks) == 2


def test_preference_rows_in_ultrafeedbacks_layout_are_noted_and_counted_with_the_prompt_once(team, client,
                                                                                          tokenizer_model):
    """UltraFeedback's layout (a prompt, and chosen and rejected as whole conversations that begin with its turn) is
    read with the prompt once, as TRL reads it (``formats.read_prompt_once``): validation counts the rows so read
    and the version page says so, its preview shows each side without the prompt, and the token statistics count
    the prompt once. Commit 89b691ae refused such a file (prompt_repeated)."""
    question = {"role": "user", "content": "Name a prime."}
    rows = [{"prompt": "Name a prime.", "chosen": [question, {"role": "assistant", "content": "Seven."}],
             "rejected": [question, {"role": "assistant", "content": "Eight."}]}] * 2
    version = ready(team, name="ultrafeedback", kind="preference", rows=[*rows, {"prompt": "q", "chosen": "a",
                                                                                "rejected": "b"}])
    assert version.status == VersionStatus.READY, version.errors
    assert version.statistics["prompt_read_once"] == {"count": 2, "rows": [1, 2]}
    page = version_page(team, client, version)
    assert html.escape("2 rows repeat their prompt in chosen and rejected (UltraFeedback's layout): read once, as "
                       "TRL does.") in page
    # The preview: each row's prompt once, its sides without it.
    assert page.count("Name a prime.") == 2 and page.count("Seven.") == 2

    version = services.token_statistics_compute(version_id=version.pk, base_model_id=tokenizer_model.pk)
    tokenizer = load_tokenizer(tokenizer_model.path)
    fields = version.token_statistics["fields"]
    assert fields["prompt"]["max"] == len(tokenizer.encode("Name a prime."))
    assert fields["prompt + chosen"]["max"] == max(len(pair.chosen) for pair in dpo_pairs(version, tokenizer))


def dpo_pairs(version, tokenizer) -> list:
    """The preference pairs a dpo run encodes of ``version``'s rows, none cut."""
    from jaxengine.data.pipeline import encode_rows

    mapping = formats.ColumnMapping(kind=formats.DatasetKind.PREFERENCE, columns=version.column_mapping)
    examples = formats.iter_examples(version.absolute_path, fmt=formats.FileFormat(version.format), mapping=mapping)
    return encode_rows(examples, task="dpo", tokenizer=tokenizer, max_seq_len=10**9)[0]


def test_preference_token_lengths_count_each_side_after_its_prompt(team, client, tokenizer_model):
    """A preference version's token statistics counted chosen and rejected without the prompt, though a run puts the
    prompt before each side and data.max_seq_len cuts the two together: they count the prompt, then each side with
    its prompt, as a dpo run encodes them, and say so in their labels. Counts made before (chosen and rejected alone,
    and their total) still show as they were."""
    rows = [{"prompt": "Name a prime number between ten and twenty.", "chosen": "Eleven.", "rejected": "Eight."},
            {"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Hello there"}],
             "rejected": "Go away."}]
    version = ready(team, name="pairs", kind="preference", rows=rows)
    version = services.token_statistics_compute(version_id=version.pk, base_model_id=tokenizer_model.pk)
    stats = version.token_statistics
    assert stats["status"] == "ready" and set(stats["fields"]) == {"prompt", "prompt + chosen", "prompt + rejected"}
    tokenizer = load_tokenizer(tokenizer_model.path)
    pairs = dpo_pairs(version, tokenizer)
    for side in ("chosen", "rejected"):
        lengths = sorted(len(getattr(pair, side)) for pair in pairs)
        assert (stats["fields"][f"prompt + {side}"]["min"], stats["fields"][f"prompt + {side}"]["max"]) == (
            lengths[0], lengths[-1])
    assert stats["fields"]["prompt + chosen"]["min"] > stats["fields"]["prompt"]["max"]
    page = html.unescape(version_page(team, client, version))
    assert "<b>prompt + chosen</b>" in page and "<b>prompt + rejected</b>" in page

    old = {**stats, "fields": {"chosen": stats["fields"]["prompt"], "rejected": stats["fields"]["prompt"],
                               "prompt": stats["fields"]["prompt"], "total": stats["fields"]["prompt + chosen"]}}
    DatasetVersion.objects.filter(pk=version.pk).update(token_statistics=old)
    page = html.unescape(version_page(team, client, version))
    assert all(f"<b>{field}</b>" in page for field in ("chosen", "rejected", "prompt", "total"))


def test_a_preference_version_validated_before_ultrafeedbacks_layout_was_read_once_is_counted_again(
        team, client, sent_tasks, monkeypatch, django_capture_on_commit_callbacks):
    """A version in UltraFeedback's layout validated before such rows were read with their prompt once (before commit
    89b691ae: its sides counted whole, the prompt in each) kept those statistics, and no ``prompt_read_once``, until
    uploaded again. Its page has the worker count them again, as it does an old version's turn splits (queued once,
    "counting…" and a refresh meanwhile): the statistics and row digests are then those of a version validated now."""
    question = {"role": "user", "content": "Name a prime number between ten and twenty, please."}
    rows = [{"prompt": question["content"], "chosen": [question, {"role": "assistant", "content": answer}],
             "rejected": [question, {"role": "assistant", "content": "Eight."}]} for answer in ("Eleven.", "Thirteen.")]
    rows.append({"prompt": "q", "chosen": "a", "rejected": "b"})
    now = ready(team, name="ultrafeedback", kind="preference", rows=rows)
    with monkeypatch.context() as before:  # validation as it read such rows then: each side as it is
        before.setattr(formats, "read_prompt_once", lambda example: None)
        old = ready(team, name="ultrafeedback-old", kind="preference", rows=rows)
    statistics = {key: value for key, value in old.statistics.items() if key != "prompt_read_once"}
    DatasetVersion.objects.filter(pk=old.pk).update(statistics=statistics)
    old = DatasetVersion.objects.get(pk=old.pk)
    assert old.statistics["fields"]["chosen"] != now.statistics["fields"]["chosen"]  # the prompt counted in each side
    assert old.row_digests_path.read_bytes() != now.row_digests_path.read_bytes()
    note = "2 rows repeat their prompt in chosen and rejected (UltraFeedback's layout): read once, as TRL does."

    def page() -> str:
        with django_capture_on_commit_callbacks(execute=True):
            return html.unescape(version_page(team, client, old))

    sent_tasks.clear()
    first = page()
    assert "prompt_read_once" not in DatasetVersion.objects.get(pk=old.pk).statistics  # not counted by the request
    assert note not in first
    assert 'id="prompt-read-once-counting"' in first and 'http-equiv="refresh"' in first
    assert 'id="prompt-read-once-counting"' in page()
    assert sent_tasks == [(services.PROMPT_READ_ONCE_TASK, (old.pk,), "default")]  # a refresh does not queue it again
    # The REST API's statistics leave the bookkeeping out.
    assert services.shown_statistics(DatasetVersion.objects.get(pk=old.pk).statistics) == old.statistics

    from worker.tasks.datasets import count_prompt_read_once

    count_prompt_read_once(old.pk)  # the worker's task, as the default queue's worker runs it
    counted = DatasetVersion.objects.get(pk=old.pk)
    assert counted.statistics == now.statistics
    assert counted.row_digests_path.read_bytes() == now.row_digests_path.read_bytes()
    done = page()
    assert note in done and 'id="prompt-read-once-counting"' not in done and 'http-equiv="refresh"' not in done
    assert len(sent_tasks) == 1
    # A version validated now has nothing to count again.
    assert services.late_count_request(version=now) is False
