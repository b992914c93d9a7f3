"""What validation accepts, training reads: files as users have them (a byte order mark, CRLF lines, quoted line
breaks, Hugging Face's exports, Parquet, many columns, chats of every accepted shape) are validated by
``formats.validate_file`` and then read and tokenized for each task of their kind the way a run does at its
start (``pipeline.read_examples`` and ``encode_rows`` into a first batch; ``grpo.read_prompts`` for prompts),
with real byte-level BPE tokenizers and the chat templates of Qwen 2.5 (ChatML) and Llama 3. With Gemma's
template, which refuses chats whose turns do not alternate, a file holding such chats is one the launch refuses
(validation counts their shapes; a launch tries each on the model's template), and training would indeed refuse it.

A file validation accepts must not fail at a run's first step: each case here is one a user could upload, and a
new accepted layout belongs in ``FILES``.
"""
import json
from pathlib import Path

import orjson
import pyarrow
import pyarrow.parquet
import pytest

from jaxengine.data import formats, pipeline
from jaxengine.grpo import read_prompts
from jaxengine.tokenizer import load_tokenizer
from tests.factories import GEMMA_CHAT_TEMPLATE, build_bpe_tokenizer_dir


def _jsonl(*rows) -> bytes:
    return b"".join(orjson.dumps(row) + b"\n" for row in rows)


def _chat(*turns: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in turns]


def _parquet(rows: list[dict]) -> bytes:
    sink = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


PAIR = {"prompt": "What is 2+2?", "completion": "4"}
CHAT = _chat(("system", "Be brief."), ("user", "What is 2+2?"), ("assistant", "4"))
MANY_COLUMNS = [f"extra {index}" for index in range(2000)]

# name -> (kind, file bytes); the extension is the file's format.
FILES: dict[str, tuple[str, bytes]] = {
    "bom.jsonl": ("sft", b"\xef\xbb\xbf" + _jsonl(PAIR, PAIR | {"completion": "four"})),
    "bom.json": ("sft", b"\xef\xbb\xbf" + json.dumps([PAIR]).encode()),
    "bom-crlf.csv": ("sft", b"\xef\xbb\xbfprompt,completion\r\nWhat is 2+2?,4\r\n"),
    "crlf.jsonl": ("text", _jsonl({"text": "one"}, {"text": "two"}).replace(b"\n", b"\r\n")),
    "crlf-indented.json": ("sft", json.dumps([PAIR], indent=2).replace("\n", "\r\n").encode()),
    "quoted-line-breaks.csv": ("sft", b'prompt,completion\n"first line\nsecond, with a comma","say ""hi""\r\nthen"\n'),
    "blank-lines-first.csv": ("text", b"\n\ntext\nsome text\n\n"),
    "many-columns.csv": ("sft", (",".join(["prompt", "completion", *MANY_COLUMNS]) + "\n"
                                 + ",".join(["q", "a", *("x" for _ in MANY_COLUMNS)]) + "\n").encode()),
    "messages-in-a-cell.csv": ("sft", b'messages\n"' + json.dumps(CHAT).replace('"', '""').encode() + b'"\n'),
    "hf-to-json-lines.json": ("sft", _jsonl(PAIR, {"messages": CHAT})),
    "hf-field-data.json": ("preference", json.dumps(
        {"data": [{"prompt": "p", "chosen": "good", "rejected": "bad"}]}, indent=2).encode()),
    "long-line.jsonl": ("text", _jsonl({"text": "word " * 200_000})),
    "unicode.jsonl": ("sft", _jsonl({"prompt": "café naïve 你好 🙂", "completion": "straße \u202e"})),
    "chats.jsonl": ("sft", _jsonl(
        {"messages": CHAT},
        {"messages": _chat(("user", "hi"), ("system", "mid-way rule"), ("assistant", "hello"))},
        {"messages": _chat(("user", "a"), ("user", "b"), ("assistant", "c"), ("assistant", "d"))},
        {"messages": _chat(("assistant", "I open."), ("user", "ok"), ("assistant", "done"))},
        {"messages": _chat(("assistant", "alone"))},
        {"messages": CHAT, "id": 7, "meta": {"source": "x"}},
    )),
    "pairs-and-chats.jsonl": ("sft", _jsonl(PAIR, {"messages": CHAT}, PAIR | {"messages": CHAT})),
    "mapped.jsonl": ("sft", _jsonl({"question": "q", "answer": "a"})),
    "preference.jsonl": ("preference", _jsonl(
        {"prompt": "p", "chosen": "good", "rejected": "bad"},
        {"prompt": _chat(("user", "p")), "chosen": "good", "rejected": "bad"},
        {"prompt": "p", "chosen": _chat(("assistant", "good")), "rejected": _chat(("assistant", "bad"))},
        {"chosen": [*CHAT[:2], {"role": "assistant", "content": "4"}], "rejected": [*CHAT[:2], {"role": "assistant",
                                                                                                   "content": "5"}]},
        {"prompt": "tie", "chosen": "same", "rejected": "same"},
        {"chosen": _chat(("user", "p"), ("assistant", "a")), "rejected": _chat(("user", "p"))},
    )),
    "prompts.jsonl": ("prompts", _jsonl(
        {"prompt": "2+2?", "answer": "4"},
        {"prompt": "3+3?", "answer": 6},
        {"prompt": "no answer here"},
        {"prompt": "null answer", "answer": None},
        {"prompt": _chat(("system", "Be brief."), ("user", "1+1?")), "answer": "2", "tags": ["math"]},
        {"prompt": _chat(("user", "go on"), ("assistant", "so far")), "answer": "x"},
    )),
    "prompts.csv": ("prompts", b"prompt,answer\n2+2?,4\n\"multi\nline\",\n"),
    "prompt-chats.jsonl": ("prompts", _jsonl({"prompt": _chat(("user", "first"), ("user", "second"))},
                                             {"prompt": _chat(("user", "a"), ("system", "b"))})),
    "chats.parquet": ("sft", _parquet([{"messages": CHAT, "id": 1}, {"messages": CHAT[1:], "id": 2}])),
    "preference.parquet": ("preference", _parquet([{"prompt": "p", "chosen": "good", "rejected": "bad", "score": 0.5}])),
    "prompts.parquet": ("prompts", _parquet([{"prompt": "2+2?", "answer": "4", "level": 1}])),
}
COLUMNS = {"mapped.jsonl": {"prompt": "question", "completion": "answer"}}
TASKS = {kind: [task for task, task_kind in pipeline.TASK_KINDS.items() if task_kind == kind]
         for kind in formats.DatasetKind}


@pytest.fixture(scope="module", params=["qwen", "llama3", "gemma-template"])
def tokenizer(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"tokenizer-{request.param}")
    if request.param == "gemma-template":  # refuses chats whose turns do not alternate user and assistant
        return load_tokenizer(build_bpe_tokenizer_dir(folder, chat_template=GEMMA_CHAT_TEMPLATE))
    return load_tokenizer(build_bpe_tokenizer_dir(folder, style=request.param))


def refused_shapes(report: formats.ValidationReport, tokenizer) -> list[str]:
    """The chat shapes of a file that a launch on a model with ``tokenizer``'s template refuses."""
    def render(messages, add_generation_prompt):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    return [shape for shape, counted in report.statistics.get("chat_shapes", {}).items()
            if counted["count"] and formats.chat_shape_refusal(shape, render) is not None]


def test_every_task_reads_a_kind():
    assert all(TASKS[kind] for kind in formats.DatasetKind)


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_file_validation_accepts_is_read_and_tokenized_by_every_task_of_its_kind(name, tmp_path, tokenizer):
    kind, content = FILES[name]
    path = tmp_path / name
    path.write_bytes(content)
    columns = COLUMNS.get(name, {})
    fmt = formats.detect_format(name)
    report = formats.validate_file(path, fmt=fmt, mapping=formats.ColumnMapping(kind=kind, columns=columns))
    assert report.ok, [str(issue) for issue in report.errors]
    if refused_shapes(report, tokenizer):
        # The launch refuses such a file on such a model (webapp.runs.services._check_chat_shapes), rightly: the
        # run would stop at its start, on a row it names.
        with pytest.raises(pipeline.DataError, match=r": row \d+: .*Conversation roles must alternate"):
            if kind == "prompts":
                read_prompts(str(path), tokenizer=tokenizer, columns=columns, max_prompt_tokens=4096)
            else:
                pipeline.encode_rows(pipeline.read_examples(path, kind=kind, columns=columns), source=path,
                                     task=TASKS[formats.DatasetKind(kind)][0], tokenizer=tokenizer, max_seq_len=256)
        return
    for task in TASKS[formats.DatasetKind(kind)]:
        if kind == "prompts":
            rows, prompt_ids, counts = read_prompts(str(path), tokenizer=tokenizer, columns=columns,
                                                    max_prompt_tokens=4096)
            assert counts == {"rows": report.row_count, "examples": report.row_count, "dropped_long_prompts": 0}
            assert all(ids and max(ids) < tokenizer.vocab_size for ids in prompt_ids)
            continue
        rows = list(pipeline.read_examples(path, kind=kind, columns=columns))
        assert len(rows) == report.row_count
        examples, stats = pipeline.encode_rows(rows, task=task, tokenizer=tokenizer, max_seq_len=256,
                                               source=path, vocab_size=tokenizer.vocab_size)
        # Only a preference side with no assistant turn has nothing to train on (the launch warns of it); a long
        # text is split into windows.
        one_sided = sum(side["count"] for side in report.statistics.get("no_assistant_turn", {}).values())
        assert stats.dropped == one_sided, (task, stats)
        if task == "pretrain":
            assert stats.examples >= report.row_count, stats
        else:
            assert stats.examples == report.row_count - one_sided, (task, stats)
        pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.eos_ids[0]
        stream = pipeline.BatchStream(examples=examples, batch_size=2, max_seq_len=256, pad_id=pad_id, seed=0,
                                      packing=task in ("pretrain", "sft"))
        batch = stream.next_batch()
        first = batch.chosen if isinstance(batch, pipeline.PreferenceBatch) else batch
        assert first.loss_mask.any()


def test_the_files_cover_every_format_and_kind():
    assert {Path(name).suffix for name in FILES} == set(formats.EXTENSIONS) - {".ndjson", ".pq"}
    assert {kind for kind, _ in FILES.values()} == {kind.value for kind in formats.DatasetKind}
