"""LLaMA-Factory's two layouts (hiyouga/LLaMA-Factory data/README.md: ShareGPT's {from, value} turns and Alpaca's
instruction/input/output), read into Temper's own fields as LLaMA-Factory reads them (``formats.read_layout``), by
every reader of examples; their bad rows named by the layout's own fields. Before, ShareGPT turns were refused
("write each as {role, content}") and an Alpaca row was missing 'prompt'."""
import csv
import json

import orjson
import pyarrow
import pyarrow.parquet
import pytest

from jaxengine.cli import main
from jaxengine.data import formats
from jaxengine.data.formats import ColumnMapping, DatasetKind, FileFormat, iter_examples, validate_file

SFT = ColumnMapping(kind=DatasetKind.SFT)
PREFERENCE = ColumnMapping(kind=DatasetKind.PREFERENCE)


def write_jsonl(path, rows):
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def read(row, mapping=SFT):
    example, problems = formats.check_record(row, mapping=mapping)
    assert not problems, problems
    return example


def problems_of(row, mapping=SFT):
    example, problems = formats.check_record(row, mapping=mapping)
    assert example is None
    return [(field_name, code) for field_name, code, _message in problems], [message for *_, message in problems]


def turn(role, value):
    return {"from": role, "value": value}


def test_a_sharegpt_chat_is_read_as_messages_with_temper_roles_and_its_system_first():
    row = {"conversations": [turn("human", "Hi"), turn("gpt", "Hello!"), turn("user", "2+2?"), turn("model", "4"),
                             turn("assistant", "Anything else?")],
           "system": "Be brief."}
    assert read(row) == {"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "assistant", "content": "Anything else?"}]}
    # 'messages' of {from, value} turns is the same layout; a first system turn wins over the column, as in
    # LLaMA-Factory; an empty system column (LLaMA-Factory's "") is none.
    assert read({"messages": [turn("system", "Turn."), turn("human", "q"), turn("gpt", "a")], "system": "Column."}) == {
        "messages": [{"role": "system", "content": "Turn."}, {"role": "user", "content": "q"},
                     {"role": "assistant", "content": "a"}]}
    assert read({"conversations": [turn("human", "q"), turn("gpt", "a")], "system": "", "tools": ""}) == {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}


def test_a_sharegpt_preference_row_is_its_conversation_then_each_answer():
    row = {"conversations": [turn("human", "Name a prime."), turn("gpt", "Which size?"), turn("human", "Small.")],
           "chosen": turn("gpt", "7"), "rejected": [turn("gpt", "8")], "system": "Be exact."}
    assert read(row, PREFERENCE) == {
        "prompt": [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "Name a prime."},
                   {"role": "assistant", "content": "Which size?"}, {"role": "user", "content": "Small."}],
        "chosen": [{"role": "assistant", "content": "7"}], "rejected": [{"role": "assistant", "content": "8"}]}


def test_an_alpaca_row_joins_instruction_and_input_as_llama_factory_does():
    assert read({"instruction": "Translate.", "input": "chat", "output": "cat"}) == {
        "prompt": "Translate.\nchat", "completion": "cat"}
    assert read({"instruction": "Say hi.", "input": "", "output": "Hi!"}) == {"prompt": "Say hi.", "completion": "Hi!"}
    assert read({"instruction": "Say hi.", "output": "Hi!", "history": [], "system": None}) == {
        "prompt": "Say hi.", "completion": "Hi!"}
    # A system and a history make it a chat: the history's pairs are the turns before.
    assert read({"instruction": "And 3+3?", "input": "", "output": "6", "system": "Be brief.",
                 "history": [["2+2?", "4"], ["And 2+3?", "5"]]}) == {"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 2+3?"},
        {"role": "assistant", "content": "5"}, {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6"}]}


def test_an_alpaca_preference_row_is_its_prompt_and_both_answers():
    assert read({"instruction": "Name a prime.", "input": "small", "chosen": "7", "rejected": "8"}, PREFERENCE) == {
        "prompt": "Name a prime.\nsmall", "chosen": "7", "rejected": "8"}
    assert read({"instruction": "And a bigger one?", "chosen": "11", "rejected": "12",
                 "history": [["Name a prime.", "7"]]}, PREFERENCE) == {
        "prompt": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"},
                   {"role": "user", "content": "And a bigger one?"}], "chosen": "11", "rejected": "12"}


def test_temper_rows_and_mapped_rows_are_read_as_before():
    row = {"prompt": "q", "completion": "a", "input": "ignored column"}
    assert read(row) == {"prompt": "q", "completion": "a"}
    # A row holding Temper's own fields whole beside another layout's was read in Temper's layout before other
    # layouts were read (a version ready then still is); where Temper's fields are not whole, the mix is refused.
    assert read({**row, "instruction": "i", "output": "o", "conversations": "x"}) == {"prompt": "q", "completion": "a"}
    assert read({"prompt": "q", "chosen": "a", "rejected": "b", "instruction": "i"}, PREFERENCE) == {
        "prompt": "q", "chosen": "a", "rejected": "b"}
    mapped = ColumnMapping(kind=DatasetKind.SFT, columns={"prompt": "instruction", "completion": "output"})
    assert read({"instruction": "q", "input": "more", "output": "a"}, mapped) == {"prompt": "q", "completion": "a"}


@pytest.mark.parametrize(("row", "mapping", "expected", "words"), [
    ({"conversations": [turn("human", "q"), turn("bard", "a")]}, SFT, [("conversations[1].from", "bad_role")],
     "is 'bard', not a role of ShareGPT's layout: use human (or user), gpt (or assistant, model) or system"),
    ({"conversations": [turn("human", "q"), turn("gpt", "  ")]}, SFT, [("conversations[1].value", "empty_string")],
     "is an empty string; give it text or drop the row"),
    ({"conversations": [turn("human", "q"), {"from": "gpt"}]}, SFT, [("conversations[1].value", "missing_field")],
     "the turn has no 'value'"),
    ({"conversations": [turn("human", "q"), turn("function_call", "{}"), turn("observation", "1"),
                        turn("gpt", "a")]}, SFT,
     [("conversations[1].from", "tool_calls"), ("conversations[2].from", "tool_calls")],
     "is 'function_call', a tool call, which Temper does not train on: it reads the text turns of system, user and "
     "assistant only; remove the tool calls and the tool turns that answer them, or write them into the turns' text"),
    ({"conversations": [turn("human", "q"), {"role": "assistant", "content": "a"}]}, SFT,
     [("conversations[1].from", "bad_role")], "a {role, content} message among ShareGPT's {from, value} turns"),
    ({"conversations": [turn("human", "q")]}, SFT, [("conversations", "no_assistant_turn")], "has no assistant turn"),
    ({"conversations": [turn("human", "q"), turn("gpt", "a")], "tools": '[{"name": "f"}]'}, SFT,
     [("tools", "tool_calls")], "holds tool descriptions, which Temper does not train on"),
    ({"conversations": [turn("human", "q"), turn("gpt", "a")], "instruction": "q", "output": "a"}, SFT,
     [("instruction", "mixed_layouts")], "the row mixes two layouts: 'conversations' (ShareGPT) and 'instruction' "
                                         "(Alpaca); a row is read in one layout"),
    ({"instruction": "q", "output": "a", "prompt": "q"}, SFT, [("prompt", "mixed_layouts")],
     "'instruction' (Alpaca) and 'prompt' (Temper's own)"),
    ({"instruction": "q", "input": "x"}, SFT, [("output", "missing_field")],
     "missing 'output': an Alpaca row (instruction, input, output) needs the answer to train on in 'output'"),
    ({"instruction": "", "output": "a"}, SFT, [("instruction", "empty_string")], "is an empty string"),
    ({"instruction": "q", "input": 5, "output": "a"}, SFT, [("input", "wrong_type")], "must be a string, got a number"),
    ({"instruction": "q", "output": "a", "history": [["only the question"]]}, SFT, [("history[0]", "wrong_type")],
     "must be a [user, assistant] pair of texts, got a list of 1"),
    ({"conversations": [turn("human", "q")], "chosen": turn("gpt", "a"), "rejected": turn("gpt", "")}, PREFERENCE,
     [("rejected.value", "empty_string")], "is an empty string"),
    ({"conversations": [turn("human", "q")], "chosen": turn("gpt", "a")}, PREFERENCE,
     [("rejected", "missing_field")], "missing 'rejected': a ShareGPT preference row (conversations, chosen, "
                                      "rejected) needs its rejected answer as a {from, value} turn"),
    ({"instruction": "q", "chosen": "a"}, PREFERENCE, [("rejected", "missing_field")],
     "missing 'rejected': an Alpaca row (instruction, input, chosen, rejected) needs its rejected answer"),
])
def test_a_bad_row_in_a_layout_is_named_by_its_own_field(row, mapping, expected, words):
    found, messages = problems_of(row, mapping)
    assert found == expected
    assert words in messages[0]


def test_validation_counts_the_rows_of_each_layout_and_names_bad_ones_by_line(tmp_path):
    rows = [{"conversations": [turn("human", "q"), turn("gpt", "a")]}, {"prompt": "q", "completion": "a"},
            {"instruction": "i", "input": "x", "output": "o"}, {"conversations": [turn("human", "q2"),
                                                                                   turn("gpt", "a2")]}]
    report = validate_file(write_jsonl(tmp_path / "mixed.jsonl", rows), fmt=FileFormat.JSONL, mapping=SFT)
    assert report.ok, report.errors
    assert report.statistics["layouts"] == {"sharegpt": {"count": 2, "rows": [1, 4]},
                                            "alpaca": {"count": 1, "rows": [3]}}
    assert report.statistics["fields"]["messages"]["count"] == 2  # read as chats: their lengths counted as such
    own = validate_file(write_jsonl(tmp_path / "own.jsonl", rows[1:2]), fmt=FileFormat.JSONL, mapping=SFT)
    assert "layouts" not in own.statistics

    bad = write_jsonl(tmp_path / "bad.jsonl", [rows[0], {"conversations": [turn("human", "q"), turn("gpt", ""),
                                                                           turn("bot", "a")]}])
    report = validate_file(bad, fmt=FileFormat.JSONL, mapping=SFT)
    assert [str(issue) for issue in report.errors] == [
        "line 2, row 2, field 'conversations[1].value': is an empty string; give it text or drop the row",
        "line 2, row 2, field 'conversations[2].from': is 'bot', not a role of ShareGPT's layout: use human (or "
        "user), gpt (or assistant, model) or system"]
    with pytest.raises(formats.DatasetFormatError, match=r"row 2, field 'conversations\[1\].value'"):
        list(iter_examples(bad, fmt=FileFormat.JSONL, mapping=SFT))


def test_a_sharegpt_file_in_parquet_and_csv_reads_as_in_jsonl(tmp_path):
    rows = [{"conversations": [turn("human", "q"), turn("gpt", "a")], "system": "s"},
            {"conversations": [turn("human", "q2"), turn("gpt", "a2")], "system": None}]
    expected = list(iter_examples(write_jsonl(tmp_path / "rows.jsonl", rows), fmt=FileFormat.JSONL, mapping=SFT))
    assert expected[1] == {"messages": [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]}
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "rows.parquet")
    assert list(iter_examples(tmp_path / "rows.parquet", fmt=FileFormat.PARQUET, mapping=SFT)) == expected
    with open(tmp_path / "rows.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["conversations", "system"])
        writer.writerows([[json.dumps(row["conversations"]), row["system"] or ""] for row in rows])
    assert list(iter_examples(tmp_path / "rows.csv", fmt=FileFormat.CSV, mapping=SFT)) == expected
    # A CSV preference row's answers, each one {from, value} turn as a JSON object in its cell.
    with open(tmp_path / "pairs.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["conversations", "chosen", "rejected"])
        writer.writerow([json.dumps([turn("human", "q")]), json.dumps(turn("gpt", "a")), json.dumps(turn("gpt", "b"))])
    [pair] = iter_examples(tmp_path / "pairs.csv", fmt=FileFormat.CSV, mapping=PREFERENCE)
    assert pair == {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
                    "rejected": [{"role": "assistant", "content": "b"}]}


def test_validate_data_says_which_layout_it_read(tmp_path, capsys):
    path = write_jsonl(tmp_path / "alpaca.jsonl", [{"instruction": "i", "input": "", "output": "o"}] * 3)
    assert main(["validate-data", str(path), "--kind", "sft"]) == 0
    assert "  Alpaca layout: read as LLaMA-Factory reads it (3 rows)." in capsys.readouterr().out.splitlines()


def test_read_layout_leaves_temper_rows_and_other_kinds_alone():
    assert formats.read_layout({"prompt": "q", "completion": "a"}, DatasetKind.SFT) == (None, None, [])
    assert formats.read_layout({"chosen": [], "rejected": []}, DatasetKind.PREFERENCE) == (None, None, [])
    assert formats.read_layout({"instruction": "i", "output": "o"}, DatasetKind.SFT)[0] is formats.Layout.ALPACA
    # The prompts kind keeps every column as a reference value: an 'instruction' there is one.
    prompts = ColumnMapping(kind=DatasetKind.PROMPTS)
    assert read({"prompt": "q", "instruction": "i"}, prompts) == {"instruction": "i", "prompt": "q"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests import factories

    return factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-layouts"))


def test_sft_on_an_alpaca_or_sharegpt_file_trains_the_tokens_of_the_same_rows_in_temper_layout(tiny_model, tmp_path):
    """A short sft run through jaxengine on an Alpaca file and on a ShareGPT file: their examples' token ids and loss
    masks are those of the same rows written as Temper's prompt/completion, and each run trains on them as on those."""
    from jaxengine.data import pipeline
    from jaxengine.job import run_job
    from jaxengine.spec import parse_spec
    from jaxengine.tokenizer import load_tokenizer

    alpaca = [{"instruction": f"Add {i} and {i}.", "input": f"Answer with digits ({i})." if i % 2 else "",
               "output": f"{2 * i}"} for i in range(4)]
    own = [{"prompt": row["instruction"] + (f"\n{row['input']}" if row["input"] else ""), "completion": row["output"]}
           for row in alpaca]
    sharegpt = [{"conversations": [turn("human", row["prompt"]), turn("gpt", row["completion"])]} for row in own]
    paths = {"alpaca": write_jsonl(tmp_path / "alpaca.jsonl", alpaca),
             "sharegpt": write_jsonl(tmp_path / "sharegpt.jsonl", sharegpt),
             "own": write_jsonl(tmp_path / "own.jsonl", own)}
    tokenizer = load_tokenizer(tiny_model)
    encoded = {name: pipeline.encode_rows(list(pipeline.read_examples(path, kind="sft")), task="sft",
                                          tokenizer=tokenizer, max_seq_len=64)[0] for name, path in paths.items()}
    for layout in ("alpaca", "sharegpt"):
        assert len(encoded[layout]) == 4
        for read, written in zip(encoded[layout], encoded["own"]):
            assert read.ids.tolist() == written.ids.tolist() and read.loss_mask.tolist() == written.loss_mask.tolist()
            assert any(read.loss_mask.tolist()) and not all(read.loss_mask.tolist())

    summaries = {}
    for name, path in paths.items():
        spec = parse_spec({"task": "sft", "model": str(tiny_model), "output_dir": str(tmp_path / f"run-{name}"),
                           "data": {"train": str(path), "max_seq_len": 64}, "peft": {"method": "none"},
                           "train": {"max_steps": 2, "batch_size": 2, "seed": 0}})
        summaries[name] = run_job(spec, progress_bar=False)
    losses = {name: [json.loads(line)["loss"] for line in (tmp_path / f"run-{name}/metrics.jsonl").read_text().splitlines()]
              for name in paths}
    for layout in ("alpaca", "sharegpt"):
        assert summaries[layout]["status"] == "succeeded" and summaries[layout]["step"] == 2
        assert summaries[layout]["data"]["train"] == summaries["own"]["data"]["train"]
        assert losses[layout] == losses["own"] and len(losses[layout]) == 2


def test_the_readme_examples_of_each_layout_are_read_as_it_says(tmp_path):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("**LLaMA-Factory's layouts (ShareGPT, Alpaca).**"):]
    sharegpt, alpaca = [[json.loads(line) for line in block.split("\n") if line.strip()]
                        for block in re.findall(r"```json\n(.*?)```", section, re.S)[:2]]
    assert read(sharegpt[0])["messages"][0] == {"role": "system", "content": "Be brief."}
    assert read(sharegpt[1], PREFERENCE)["chosen"] == [{"role": "assistant", "content": "7"}]
    assert read(alpaca[0]) == {"prompt": "Translate to English.\nchat", "completion": "cat"}
    assert [turn["role"] for turn in read(alpaca[1])["messages"]] == ["system", "user", "assistant", "user",
                                                                        "assistant"]


@pytest.mark.parametrize(("row", "mapping", "field_name", "words"), [
    ({"conversations": [turn("human", "q")], "chosen": turn("gpt", "a"), "rejected": turn("gpt", "b")}, SFT,
     "chosen", "the row is in ShareGPT's layout with 'chosen' and 'rejected', a row of the preference kind: if the "
               "file holds preference rows, upload it as a dataset of kind preference"),
    ({"instruction": "q", "chosen": "a", "rejected": "b"}, SFT, "chosen", "Alpaca's layout with 'chosen' and "
                                                                          "'rejected', a row of the preference kind"),
    ({"instruction": "q", "input": "", "output": "a"}, PREFERENCE, "instruction",
     "the row is in Alpaca's layout with no 'chosen' and 'rejected', a row of the sft kind: if the file holds sft "
     "rows, upload it as a dataset of kind sft"),
    ({"conversations": [turn("human", "q"), turn("gpt", "a")]}, PREFERENCE, "conversations", "a row of the sft kind"),
])
def test_a_layout_row_of_the_other_kind_says_which_kind_to_choose(row, mapping, field_name, words):
    found, messages = problems_of(row, mapping)
    assert found == [(field_name, "wrong_kind")]
    assert words in messages[0]


def test_an_alpaca_csv_with_empty_cells_reads_as_its_jsonl(tmp_path):
    """A CSV cell is a string: an empty input, system or history cell is none, as a missing one is."""
    with open(tmp_path / "alpaca.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["instruction", "input", "output", "system", "history"])
        writer.writerow(["Translate.", "chat", "cat", "", ""])
        writer.writerow(["And 3+3?", "", "6", "Be brief.", json.dumps([["2+2?", "4"]])])
    assert list(iter_examples(tmp_path / "alpaca.csv", fmt=FileFormat.CSV, mapping=SFT)) == [
        {"prompt": "Translate.\nchat", "completion": "cat"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"},
                      {"role": "assistant", "content": "6"}]}]


def test_a_csv_sharegpt_messages_cell_is_decoded_once_and_a_bad_one_named_by_row_and_column(tmp_path, monkeypatch):
    """LLaMA-Factory's 'messages' column of {from, value} turns, as a CSV cell: its JSON was decoded to find the layout
    and again to read it; a cell whose JSON is broken was taken for text ("must be a list of {role, content}
    messages, got a string"), where it says what is broken."""
    chat = [turn("system", "Be brief."), turn("human", "q"), turn("gpt", "a")]
    with open(tmp_path / "messages.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["messages", "system"])
        writer.writerow([json.dumps(chat), "ignored: the first turn is the system's"])
    decoded = []
    loads = formats._loads_with_lone_surrogates
    monkeypatch.setattr(formats, "_loads_with_lone_surrogates", lambda text: decoded.append(text) or loads(text))
    assert list(iter_examples(tmp_path / "messages.csv", fmt=FileFormat.CSV, mapping=SFT)) == [{"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"}]}]
    assert decoded == [json.dumps(chat)]

    with open(tmp_path / "bad.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["messages"])
        writer.writerows([[json.dumps(chat)], [json.dumps(chat)[:-2]], [json.dumps([turn("human", "q"),
                                                                                   turn("bot", "a")])]])
    report = validate_file(tmp_path / "bad.csv", fmt=FileFormat.CSV, mapping=SFT)
    assert [str(issue) for issue in report.errors] == [
        "line 3, row 2, field 'messages': broken JSON at character 105: unexpected end of data; write "
        "the conversation as a JSON list of {from, value} turns",
        "line 4, row 3, field 'messages[1].from': is 'bot', not a role of ShareGPT's layout: use human (or user), "
        "gpt (or assistant, model) or system"]
    with pytest.raises(formats.DatasetFormatError, match=r"row 2, field 'messages': broken JSON"):
        list(iter_examples(tmp_path / "bad.csv", fmt=FileFormat.CSV, mapping=SFT))
