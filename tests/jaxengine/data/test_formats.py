"""Dataset formats: every reader, every kind, and each problem a user can upload."""
import csv
import gzip
import itertools
import json
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

import orjson
import pyarrow
import pyarrow.parquet
import pytest

from jaxengine.data import formats
from jaxengine.data.formats import (
    ColumnMapping,
    DatasetFormatError,
    DatasetKind,
    FileFormat,
    detect_format,
    iter_examples,
    read_page,
    rendered_chats,
    summarize_lengths,
    validate_file,
)

ROOT = Path(__file__).resolve().parents[3]
SFT = ColumnMapping(kind=DatasetKind.SFT)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def only_error(report: formats.ValidationReport) -> formats.Issue:
    assert report.error_count == 1, report.errors
    return report.errors[0]


def test_module_is_jax_free():
    code = (
        "import sys, jaxengine.data.formats;"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'jax','jaxlib','flax','optax','orbax','torch'});"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("name", "expected"),
    [("a.jsonl", FileFormat.JSONL), ("b.NDJSON", FileFormat.JSONL), ("c.json", FileFormat.JSON),
     ("d.csv", FileFormat.CSV), ("e.parquet", FileFormat.PARQUET)],
)
def test_detect_format(name, expected):
    assert detect_format(name) is expected


def test_detect_format_rejects_unknown_extension():
    with pytest.raises(ValueError, match=r"'data\.txt'.*\.csv, \.json, \.jsonl.*or give its format \(Format on the "
                                         r"upload form, file_format in the API\)$"):
        detect_format("data.txt")


@pytest.mark.parametrize(("source", "advice"), [
    (formats.WEB_UPLOAD, ", or give its format (Format on the upload form, file_format in the API)"),
    (formats.DataSource(entry=formats.Entry.VALIDATE_DATA), ", or give its format with --format"),
    (formats.DataSource(entry=formats.Entry.SPEC, key="data.eval"), " (data.eval's format is told by its extension)"),
    (formats.DataSource(entry=formats.Entry.EVAL), " (--data's format is told by its extension)"),
], ids=["upload", "validate-data", "spec", "eval"])
def test_an_unknown_extension_is_told_how_its_entry_point_gives_a_format(source, advice):
    """Session-33 audit: every entry point was told of the upload form's Format, the API's file_format and a
    --format that jaxengine train and eval do not have."""
    with pytest.raises(ValueError) as raised:
        detect_format("data.txt", source=source)
    assert str(raised.value).endswith(".parquet, .pq" + advice)


@pytest.mark.parametrize(("name", "inner"), [("rows.jsonl.gz", "rows.jsonl"), ("rows.csv.zip", "rows.csv"),
                                             ("rows.zst", "rows")])
def test_detect_format_says_to_decompress_a_compressed_file(name, inner):
    """'rows.jsonl.gz' was told to rename itself to a known extension, and renamed it failed again, as binary."""
    with pytest.raises(ValueError) as raised:
        detect_format(name)
    assert str(raised.value) == (f"'{name}' is a compressed file ({Path(name).suffix}), which Temper does not read: "
                                 f"decompress it and give the file it holds ('{inner}')")


def test_csv_quoting_mistakes_are_named(tmp_path):
    """An unclosed quote read the rest of the file as one cell ('this row has 1 cell but the header has 2
    columns'); text after a closing quote was silently joined to the cell."""
    path = tmp_path / "q.csv"
    path.write_text('prompt,completion\nq,a\n"unterminated,x\nmore,lines\n')
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.line) == ("csv", 3)
    assert issue.message == 'a quoted cell that opens on this line is never closed: add its closing " (a " inside a ' \
                            'quoted cell is written "")'
    path.write_text('prompt,completion\n"q"x,a\n')
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.line) == ("csv", 2) and issue.message.startswith('text follows the closing " of a quoted')


def test_a_string_left_open_is_named_without_jsons_dangling_words(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "broken\n')
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind="text")))
    assert issue.message == "broken JSON at column 10: Unterminated string; each line must be one JSON object"


# ---------------------------------------------------------------- valid files of every kind


def test_sft_pairs_and_chats_validate_with_statistics(tmp_path):
    path = write_jsonl(tmp_path / "sft.jsonl", [
        {"prompt": "Hi", "completion": "Hello!"},
        {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
    ])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=SFT)
    assert report.ok and report.row_count == 2
    fields = report.statistics["fields"]
    assert fields["prompt"]["max"] == 2 and fields["completion"]["max"] == 6
    assert fields["messages"]["max"] == 5  # "2+2?" + "4"
    assert fields["messages.turns"]["min"] == 2
    assert fields["total"]["min"] == 5 and fields["total"]["max"] == 8
    assert report.statistics["rows"] == 2


def test_text_kind(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "abc"}, {"text": "defgh"}])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind="text"))
    assert report.ok
    assert report.statistics["fields"]["text"]["mean"] == 4.0


def test_preference_with_prompt_and_with_whole_conversations(tmp_path):
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "q", "chosen": "good", "rejected": "bad"},
        {"chosen": chat, "rejected": chat},
    ])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind="preference"))
    assert report.ok, report.errors


def test_preference_needs_prompt_when_answers_are_strings(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"chosen": "good", "rejected": "bad"}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind="preference")))
    assert (issue.code, issue.field, issue.line) == ("missing_field", "prompt", 1)
    assert "whole conversations" in issue.message


def test_prompts_keep_reference_columns(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "1+1?", "answer": "2", "level": 1}])
    mapping = ColumnMapping(kind="prompts", columns={"prompt": "question"})
    assert validate_file(path, fmt=FileFormat.JSONL, mapping=mapping).ok
    assert list(iter_examples(path, fmt=FileFormat.JSONL, mapping=mapping)) == [
        {"prompt": "1+1?", "answer": "2", "level": 1}
    ]


def test_column_mapping_renames_fields(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [{"question": "q", "answer": "a"}])
    mapping = ColumnMapping(kind="sft", columns={"prompt": "question", "completion": "answer"})
    assert list(iter_examples(path, fmt=FileFormat.JSONL, mapping=mapping)) == [{"prompt": "q", "completion": "a"}]


@pytest.mark.parametrize(("kind", "row", "other"), [
    ("sft", {"prompt": "q", "chosen": "a", "rejected": "b"}, "preference"),
    ("preference", {"prompt": "q", "completion": "a"}, "sft"),
    ("text", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, "sft"),
])
def test_a_row_of_another_kind_is_named_as_that_kind(tmp_path, kind, row, other):
    """QA: preference pairs uploaded as sft were told to map a column to 'completion', which no column
    of theirs is; the kind was what was wrong."""
    path = write_jsonl(tmp_path / "rows.jsonl", [row])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind=kind))
    assert report.error_count >= 1
    for issue in report.errors:
        assert issue.message.endswith(f", the fields of the {other} kind: if the file holds {other} rows, upload it as "
                                      f"a dataset of kind {other} (Kind on the upload form, kind in the API)")
    checked = validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind=kind),
                            source=formats.DataSource(entry=formats.Entry.VALIDATE_DATA))
    assert checked.errors[0].message.endswith(f"if the file holds {other} rows, check it with --kind {other}")



@pytest.mark.parametrize(("kind", "where"), [
    ("sft", "a 'messages' column"),
    ("preference", "'chosen' and 'rejected' columns, each a whole conversation ending in its answer"),
    ("prompts", "a 'prompt' column"),
])
def test_a_file_of_one_turn_a_row_is_told_to_make_a_row_of_each_conversation(tmp_path, kind, where):
    """QA: a chat log exported one turn a row (conversation_id, role, content), as a spreadsheet or a
    database writes it, was told to map a column to 'prompt' and 'completion', which no column of it is."""
    path = tmp_path / "chats.csv"
    path.write_text("conversation_id,role,content\n1,user,What is 1 + 1?\n1,assistant,2\n")
    report = validate_file(path, fmt=FileFormat.CSV, mapping=ColumnMapping(kind=kind))
    assert report.error_count >= 2
    for issue in report.errors:
        assert "this row has columns 'conversation_id', 'role', 'content': one turn of a conversation" in issue.message
        assert issue.message.endswith(
            f"put each conversation's turns in {where}, as a JSON list "
            '([{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]), one row per '
            "conversation")
        assert "map a differently named column" not in issue.message

def test_column_mapping_names_the_column_in_missing_field_errors(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [{"query": "q", "answer": "a"}])
    mapping = ColumnMapping(kind="sft", columns={"prompt": "question", "completion": "answer"})
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=mapping))
    assert issue.field == "prompt"
    assert "'prompt' (column 'question')" in issue.message and "'query'" in issue.message


def test_a_mapping_to_a_missing_column_where_the_fields_own_column_is_there_says_to_clear_it(tmp_path):
    # A new version's form starts from the last version's mapping: a file whose columns are the fields' own
    # names then failed on every row with "map a differently named column to it", the opposite of the fix.
    path = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "q", "completion": "a"}])
    mapping = ColumnMapping(kind="sft", columns={"prompt": "question", "completion": "answer"})
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=mapping)
    assert [issue.field for issue in report.errors] == ["prompt", "completion"]
    message = report.errors[0].message
    assert "missing 'prompt' (column 'question')" in message
    assert "the row has a column 'prompt' itself: clear the mapping of 'prompt' to read it" in message
    assert "map a differently named column" not in message


@pytest.mark.parametrize(
    ("columns", "message"),
    [({"answer": "x"}, "'answer' is not a field of kind 'sft'"),
     ({"prompt": "x", "completion": "x"}, "column 'x' is mapped to both"),
     ({"prompt": "completion"}, "column 'completion' is mapped to both")],
)
def test_column_mapping_rejects_bad_mappings(columns, message):
    with pytest.raises(ValueError, match=message):
        ColumnMapping(kind="sft", columns=columns)


def test_blank_mapping_entries_mean_same_name():
    assert ColumnMapping(kind="sft", columns={"prompt": " ", "completion": "completion"}).columns == {}


# ---------------------------------------------------------------- each problem gets a clear message


def test_empty_file(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(b"")
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert issue.code == "empty_file" and "0 bytes" in issue.message


def test_file_with_only_blank_lines_has_no_rows(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(b"\n  \n\n")
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert issue.code == "empty_file" and "no rows" in issue.message


def test_wrong_encoding_names_line_and_byte_offset(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = orjson.dumps({"prompt": "a", "completion": "b"}) + b"\n"
    bad = '{"prompt": "café", "completion": "b"}\n'.encode("latin-1")
    path.write_bytes(good + bad)
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    offset_in_line = bad.index(b"\xe9")
    assert (issue.code, issue.line, issue.row) == ("encoding", 2, 2)
    assert f"byte offset {len(good) + offset_in_line} of the file (byte {offset_in_line} of the line)" in issue.message
    assert "UTF-8" in issue.message


def test_broken_json_line_is_reported_and_the_rest_still_checked(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_bytes(b'{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": \n\n{"prompt": 1, "completion": "b"}\n')
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=SFT)
    assert [(e.code, e.line, e.row) for e in report.errors] == [("json", 2, 2), ("wrong_type", 4, 3)]
    assert "broken JSON at column" in report.errors[0].message
    assert report.row_count == 3


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b""])
def test_broken_json_at_the_end_of_a_line_names_that_lines_last_column(tmp_path, line_end):
    # A line cut short: the parser runs out of text after its last character, so the error is
    # at column len(line) + 1 of that line, not at the start of the next one.
    truncated = b'{"prompt": "What is 12 plus 30?", "completion": "42", "id": 7'
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"prompt": "a", "completion": "b"}\n' + truncated + line_end)
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.line, issue.row) == ("json", 2, 2)
    assert f"broken JSON at column {len(truncated) + 1}:" in issue.message


def test_broken_json_inside_a_line_names_its_column(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"prompt": "a" "completion": "b"}\n')
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.line) == ("json", 1)
    assert "broken JSON at column 16: Expecting ',' delimiter" in issue.message


@pytest.mark.parametrize("depth", [1100, 100_000])
def test_json_nested_too_deeply_is_a_problem_of_its_line_not_a_crash(tmp_path, depth):
    # orjson refuses more than 1024 levels; the json module that words the message recursed until
    # RecursionError, which ended the whole check: the web app's version stayed "validating" for ever.
    deep = b"[" * depth + b"]" * depth
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "a", "completion": "b"}\n{"prompt": ' + deep + b', "completion": "b"}\n'
                     b'{"prompt": 1, "completion": "b"}\n')
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=SFT)
    assert [(e.code, e.line, e.row) for e in report.errors] == [("json", 2, 2), ("wrong_type", 3, 3)]
    assert "nested more than 1024 levels deep" in report.errors[0].message
    assert report.row_count == 3


def test_a_nul_character_in_a_value_is_refused_by_field(tmp_path):
    # A NUL written as the escape \u0000 passed (the raw byte is refused as binary): the web app then
    # failed to store the text on PostgreSQL, which holds no NUL (a review campaign's items, a run's samples).
    path = write_jsonl(tmp_path / "n.jsonl", [{"prompt": "a", "completion": "b\x00"}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field, issue.line) == ("binary", "completion", 1)
    assert "NUL character (\\u0000) at position 2" in issue.message
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\x00"}]
    path = write_jsonl(tmp_path / "p.jsonl", [{"chosen": chat, "rejected": [chat[0], {"role": "assistant", "content": "r"}]}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind="preference")))
    assert (issue.code, issue.field) == ("binary", "chosen[1].content")
    path = write_jsonl(tmp_path / "r.jsonl", [{"prompt": "q", "answer": "4\x002"}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind="prompts")))
    assert (issue.code, issue.field) == ("binary", "answer")
    table = pyarrow.table({"text": ["fine", "x\x00"]})
    pyarrow.parquet.write_table(table, tmp_path / "t.parquet")
    issue = only_error(validate_file(tmp_path / "t.parquet", fmt=FileFormat.PARQUET, mapping=ColumnMapping(kind="text")))
    assert (issue.code, issue.field, issue.row) == ("binary", "text", 2)


def test_missing_field(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "a"}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field, issue.line) == ("missing_field", "completion", 1)
    assert "'prompt' and 'completion', or 'messages'" in issue.message


def test_null_counts_as_missing(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [{"text": None}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind="text")))
    assert issue.code == "missing_field"
    # Said as null, not as a column the row lacks while listing it among the row's columns.
    path = write_jsonl(tmp_path / "n.jsonl", [{"prompt": None, "completion": "b"}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field) == ("missing_field", "prompt")
    assert issue.message.startswith("'prompt' is null: ") and issue.message.endswith("give it a value or drop the row")
    assert "this row has columns" not in issue.message


def test_wrongly_typed_field(tmp_path):
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": "a", "completion": 42}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field, issue.message) == ("wrong_type", "completion", "must be a string, got a number: "
                                                        'write it as text, in quotes ("42")')


def test_row_that_is_not_an_object(tmp_path):
    path = write_jsonl(tmp_path / "w.jsonl", [["prompt", "completion"]])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert issue.code == "wrong_type" and "got a list" in issue.message


def test_empty_string(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "a", "completion": "  "}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field) == ("empty_string", "completion")


def test_bad_role_and_empty_messages(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [
        {"messages": [{"role": "human", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {"messages": []},
    ])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=SFT)
    assert [(e.code, e.field, e.row) for e in report.errors] == [
        ("bad_role", "messages[0].role", 1), ("empty_messages", "messages", 2)
    ]
    assert "'human', another chat format's name; write it as 'user'" in report.errors[0].message


def test_messages_without_assistant_turn(tmp_path):
    path = write_jsonl(tmp_path / "n.jsonl", [{"messages": [{"role": "user", "content": "q"}]}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field) == ("no_assistant_turn", "messages")


def test_message_content_problems_name_the_turn(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [
        {"messages": [{"role": "user"}, {"role": "assistant", "content": ["x"]}, "hello"]},
    ])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=SFT)
    assert [(e.code, e.field) for e in report.errors] == [
        ("missing_field", "messages[0].content"), ("wrong_type", "messages[1].content"), ("wrong_type", "messages[2]")
    ]


def test_binary_data(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"prompt": "a", "completion": "b"}\n\x00\x01\x02\xff\x00')
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.line) == ("binary", 2)
    assert "NUL byte at byte offset 35" in issue.message


def test_binary_data_after_the_first_block(tmp_path):
    path = tmp_path / "x.jsonl"
    row = orjson.dumps({"prompt": "a", "completion": "b"}) + b"\n"
    path.write_bytes(row * 1000 + b"\x00\x00\n")
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.line) == ("binary", 1001)


def test_compressed_upload(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(gzip.compress(b'{"text": "a"}\n'))
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert issue.code == "binary" and "gzip" in issue.message


def test_utf16_text_is_named(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes('{"text": "a"}\n'.encode("utf-16"))
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert issue.code == "encoding" and "UTF-16" in issue.message


def test_oversize_file(tmp_path):
    path = write_jsonl(tmp_path / "big.jsonl", [{"text": "x" * 2000}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT, max_bytes=1024))
    assert issue.code == "too_large"
    assert "2.0 KB, over the 1.0 KB limit" in issue.message
    # Not "split it into smaller files": a run trains on one file.
    assert issue.message.endswith("; convert it to Parquet (.parquet: compressed, often several times smaller than "
                                  "JSON Lines or CSV), or ask an administrator to raise TEMPER_MAX_UPLOAD_BYTES")


def test_first_twenty_errors_shown_and_all_counted(tmp_path):
    path = write_jsonl(tmp_path / "many.jsonl", [{"prompt": "a"}] * 45)
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=SFT)
    assert report.error_count == 45
    assert [e.line for e in report.errors] == list(range(1, 21))
    assert report.statistics == {}


def test_bom_is_ignored(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + orjson.dumps({"text": "a"}) + b"\n")
    assert validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind="text")).ok


# ---------------------------------------------------------------- CSV


def test_csv_valid_with_quoted_multiline_cell(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('question,answer\n"line one\nline two",yes\nq2,"a, b"\n', encoding="utf-8")
    mapping = ColumnMapping(kind="sft", columns={"prompt": "question", "completion": "answer"})
    report = validate_file(path, fmt=FileFormat.CSV, mapping=mapping)
    assert report.ok and report.row_count == 2 and report.columns == ("question", "answer")
    assert list(iter_examples(path, fmt=FileFormat.CSV, mapping=mapping))[0]["prompt"] == "line one\nline two"


def test_csv_ragged_rows_name_their_first_line(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text('prompt,completion\n"a\nb",c\nonly one cell\nx,y,z\n', encoding="utf-8")
    report = validate_file(path, fmt=FileFormat.CSV, mapping=SFT)
    assert [(e.code, e.line, e.row) for e in report.errors] == [("ragged_row", 4, 2), ("ragged_row", 5, 3)]
    assert "this row has 1 cell but the header has 2 columns;" in report.errors[0].message
    assert "this row has 3 cells but the header has 2 columns;" in report.errors[1].message


def test_csv_ragged_row_against_a_one_column_header_says_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('text\n"a, b",c\n', encoding="utf-8")
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=ColumnMapping(kind="text")))
    assert "this row has 2 cells but the header has 1 column;" in issue.message


def test_csv_messages_cell_holds_json(tmp_path):
    chat = json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    path = tmp_path / "c.csv"
    path.write_text('messages\n"' + chat.replace('"', '""') + '"\n', encoding="utf-8")
    examples = list(iter_examples(path, fmt=FileFormat.CSV, mapping=SFT))
    assert examples[0]["messages"][1] == {"role": "assistant", "content": "a"}


def test_csv_empty_cell_is_an_empty_string(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("prompt,completion\nq,\n", encoding="utf-8")
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.field, issue.line) == ("empty_string", "completion", 2)


def test_csv_wrong_encoding(tmp_path):
    path = tmp_path / "c.csv"
    path.write_bytes(b"prompt,completion\nq,a\nq,caf\xe9\n")
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.line) == ("encoding", 3)
    assert "byte offset 27 of the file (byte 5 of the line)" in issue.message


def test_csv_header_without_rows_is_empty(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("prompt,completion\n", encoding="utf-8")
    assert only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT)).code == "empty_file"


def test_csv_duplicate_header(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("prompt,prompt\na,b\n", encoding="utf-8")
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert issue.code == "csv_header" and "'prompt' twice" in issue.message


@pytest.mark.parametrize("opening", ["[", '[{"text": "x"},\n'])
def test_a_broken_elements_column_counts_from_its_lines_start_past_the_first_chunk(tmp_path, opening):
    """The column was counted from the start of the reader's buffer once the line began in a chunk already
    dropped: a one-line 3 MB array reported column 953,981 for an element at column 3,051,036."""
    good = '{"text": "' + "a" * 1000 + '"}, '
    before = opening.rpartition("\n")[2] + good * 3000  # the broken element's line up to it, 3 MB
    path = tmp_path / "a.json"
    path.write_text(opening + good * 3000 + '{"text": "b" "c"}]', encoding="utf-8")
    issue = validate_file(path, fmt=FileFormat.JSON, mapping=ColumnMapping(kind="text")).errors[-1]
    assert issue.line == opening.count("\n") + 1
    assert f"broken JSON at column {len(before) + 14}:" in issue.message  # 14: as in test_json_broken_element


def test_json_array_element_nested_too_deeply_is_named(tmp_path):
    depth = 100_000
    path = tmp_path / "a.json"
    path.write_text('[{"text": "a"},\n{"text": ' + "[" * depth + "]" * depth + "}]", encoding="utf-8")
    issue = validate_file(path, fmt=FileFormat.JSON, mapping=ColumnMapping(kind="text")).errors[-1]
    assert (issue.code, issue.line, issue.row) == ("json", 2, 2)
    assert "nested more than 1024 levels deep" in issue.message


@pytest.mark.parametrize(
    ("content", "message"),
    [('{"text": ["a"]}', "whose first key, 'text', holds a list of strings, not of rows"),  # {"text": "a"}: one row
     ('[{"text": "a"}', "not closed"),
     ('[{"text": "a"}] []', "after the closing"),
     ('[{"text": "a"} {"text": "b"}]', "expected ',' or ']' after element 1")],
)
def test_json_structure_problems(tmp_path, content, message):
    path = tmp_path / "a.json"
    path.write_text(content, encoding="utf-8")
    issue = validate_file(path, fmt=FileFormat.JSON, mapping=ColumnMapping(kind="text")).errors[-1]
    assert issue.code == "json" and message in issue.message


def test_json_empty_array(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(" [ ] ", encoding="utf-8")
    assert only_error(validate_file(path, fmt=FileFormat.JSON, mapping=SFT)).code == "empty_file"


def test_json_wrong_encoding(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "_JSON_CHUNK_BYTES", 8)
    path = tmp_path / "a.json"
    path.write_bytes(b'[\n{"text": "ok"},\n{"text": "caf\xe9"}]')
    issue = validate_file(path, fmt=FileFormat.JSON, mapping=ColumnMapping(kind="text")).errors[-1]
    assert (issue.code, issue.line) == ("encoding", 3)
    assert "byte offset 31 of the file (byte 13 of the line)" in issue.message


# ---------------------------------------------------------------- Parquet


def test_parquet_with_chat_column(tmp_path):
    path = tmp_path / "d.parquet"
    table = pyarrow.table({
        "messages": [
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            [{"role": "user", "content": "q2"}],
        ]
    })
    pyarrow.parquet.write_table(table, path, row_group_size=1)
    report = validate_file(path, fmt=FileFormat.PARQUET, mapping=SFT)
    assert [(e.code, e.row, e.line) for e in report.errors] == [("no_assistant_turn", 2, None)]
    assert report.row_count == 2


def test_parquet_statistics(tmp_path):
    path = tmp_path / "d.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"text": ["ab", "abcd"]}), path)
    report = validate_file(path, fmt=FileFormat.PARQUET, mapping=ColumnMapping(kind="text"))
    assert report.ok and report.statistics["fields"]["text"]["mean"] == 3.0


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "d.parquet"
    path.write_text('{"text": "a"}\n')
    issue = only_error(validate_file(path, fmt=FileFormat.PARQUET, mapping=SFT))
    assert issue.code == "binary" and "not a Parquet file" in issue.message


# ---------------------------------------------------------------- statistics, paging, engine reading


def test_summarize_lengths_hand_computed():
    summary = summarize_lengths({1: 2, 3: 1, 10: 1}, bins=5)
    # raw width (10 - 1 + 1) / 5 = 2 -> bins [0,2) [2,4) [4,6) [6,8) [8,10) [10,12)
    assert summary["histogram"] == {"edges": [0, 2, 4, 6, 8, 10, 12], "counts": [2, 1, 0, 0, 0, 1]}
    assert (summary["count"], summary["min"], summary["max"], summary["mean"]) == (4, 1, 10, 3.75)
    assert (summary["p50"], summary["p90"], summary["p99"]) == (1, 10, 10)


def test_summarize_lengths_rounds_bin_width_up_to_a_nice_number():
    summary = summarize_lengths({0: 1, 299: 1}, bins=30)
    assert summary["histogram"]["edges"][:3] == [0, 10, 20]
    assert sum(summary["histogram"]["counts"]) == 2


def test_read_page(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"text": str(i)} for i in range(10)])
    page = read_page(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind="text"), offset=4, limit=3)
    assert page == [(5, {"text": "4"}), (6, {"text": "5"}), (7, {"text": "6"})]


def test_examples_numbered_gives_the_rows_asked_for_and_reads_no_further(tmp_path, monkeypatch):
    """A comparison of two versions shows a few rows of either, past the search index's reach read from the file:
    only those made examples, as the preview makes them, and the file not read past the last."""
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(1, 11)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    mapping = ColumnMapping(kind="sft", columns={"prompt": "question", "completion": "answer"})
    every = dict(formats.numbered_examples(path, fmt=FileFormat.JSONL, mapping=mapping))
    found = formats.examples_numbered(path, fmt=FileFormat.JSONL, mapping=mapping, numbers=[7, 2, 4])
    assert list(found) == [(number, every[number]) for number in (2, 4, 7)]
    assert every[7] == {"prompt": "q7", "completion": "a7"}
    read, checked = [], []
    reader, checker = formats.iter_rows, formats.check_record
    monkeypatch.setattr(formats, "iter_rows", lambda *args, **kwargs: (read.append(item.row) or item
                                                                       for item in reader(*args, **kwargs)))
    monkeypatch.setattr(formats, "check_record", lambda value, **kwargs: checked.append(value) or checker(value, **kwargs))
    assert [number for number, _ in formats.examples_numbered(path, fmt=FileFormat.JSONL, mapping=mapping,
                                                              numbers=[3, 5])] == [3, 5]
    assert read == [1, 2, 3, 4, 5] and checked == [rows[2], rows[4]]


def test_iter_examples_stops_at_first_bad_row(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"text": "a"}, {"text": ""}, {"text": 3}])
    examples = iter_examples(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind="text"))
    assert next(examples) == {"text": "a"}
    with pytest.raises(DatasetFormatError, match=r"line 2, row 2, field 'text': is an empty string"):
        next(examples)


def test_issue_round_trips_through_json():
    issue = formats.Issue(code="json", message="m", line=3, row=2, field="prompt")
    assert formats.Issue.from_dict(json.loads(json.dumps(issue.to_dict()))) == issue


def test_json_chunk_holding_only_part_of_a_character(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "_JSON_CHUNK_BYTES", 2)
    path = tmp_path / "a.json"
    path.write_text('[{"text": "日本"}]', encoding="utf-8")
    assert list(iter_examples(path, fmt=FileFormat.JSON, mapping=ColumnMapping(kind="text"))) == [{"text": "日本"}]


def test_csv_with_windows_line_endings_and_bom(tmp_path):
    path = tmp_path / "w.csv"
    path.write_bytes(b"\xef\xbb\xbfprompt,completion\r\nq,a\r\n\"multi\r\nline\",b\r\n")
    mapping = ColumnMapping(kind="sft")
    assert validate_file(path, fmt=FileFormat.CSV, mapping=mapping).ok
    assert list(iter_examples(path, fmt=FileFormat.CSV, mapping=mapping))[1]["prompt"] == "multi\r\nline"


def test_json_unterminated_string_stops_at_the_element_size_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "_JSON_CHUNK_BYTES", 8)
    monkeypatch.setattr(formats, "MAX_JSON_ELEMENT_CHARS", 40)
    reads = []
    original_read = formats._DecodedChunks.read
    monkeypatch.setattr(formats._DecodedChunks, "read", lambda self: reads.append(1) or original_read(self))
    path = tmp_path / "a.json"
    path.write_text('[{"text": "never closed' + "x" * 1000 + "]", encoding="utf-8")
    issue = validate_file(path, fmt=FileFormat.JSON, mapping=ColumnMapping(kind="text")).errors[-1]
    assert (issue.code, issue.line, issue.row) == ("json", 1, 1)
    assert "Unterminated string" in issue.message
    assert len(reads) < 10  # about 40 characters read, not the whole 1 KB


@pytest.mark.parametrize("use_dictionary", [True, False], ids=["dictionary", "compressed"])
def test_a_parquet_file_that_unpacks_to_far_more_than_its_size_is_refused(tmp_path, monkeypatch, use_dictionary):
    # A few kilobytes that unpack to 256 MiB: one long value repeated (a dictionary-encoded column keeps
    # it once) or compressed (zstd packs a run of one letter thousands of times over). Read as it came, a
    # file of 1 KiB could fill the validating worker's memory. The limits are lowered to keep the test light.
    monkeypatch.setattr(formats, "PARQUET_BATCH_BYTES", 1024 * 1024)
    monkeypatch.setattr(formats, "PARQUET_PACKED_BYTES", 1024 * 1024)
    long_text = "a" * (256 * 1024)
    table = pyarrow.table({"text": pyarrow.DictionaryArray.from_arrays(pyarrow.array([0] * 1024, pyarrow.int32()),
                                                                       pyarrow.array([long_text]))})
    path = tmp_path / "bomb.parquet"
    pyarrow.parquet.write_table(table, path, compression="zstd", use_dictionary=use_dictionary)
    assert path.stat().st_size < 64 * 1024
    issue = only_error(validate_file(path, fmt=FileFormat.PARQUET, mapping=ColumnMapping(kind="text")))
    assert issue.code == "parquet"
    assert "unpack" in issue.message and "as JSONL" in issue.message


def test_a_parquet_file_with_a_repeated_system_prompt_is_read(tmp_path):
    # The cap leaves room for the repeats real data has: a long instruction on every row, short answers.
    rows = 5000
    table = pyarrow.table({"prompt": [f"{'Answer as a careful tutor would. ' * 60}Q{index}" for index in range(rows)],
                           "completion": [f"A{index}" for index in range(rows)]})
    path = tmp_path / "repeats.parquet"
    pyarrow.parquet.write_table(table, path, compression="zstd")
    report = validate_file(path, fmt=FileFormat.PARQUET, mapping=SFT)
    assert report.ok and report.row_count == rows


def test_a_parquet_file_whose_rows_together_unpack_past_the_cap_is_refused(tmp_path, monkeypatch):
    # Each batch of rows fits, but 4,096 repeats of one 64 KiB value are 256 MiB from a file of a few
    # kilobytes: hours of row checks for a file that big would be minutes.
    monkeypatch.setattr(formats, "PARQUET_BATCH_BYTES", 4 * 1024 * 1024)
    table = pyarrow.table({"text": pyarrow.DictionaryArray.from_arrays(pyarrow.array([0] * 4096, pyarrow.int32()),
                                                                       pyarrow.array(["a" * 64 * 1024]))})
    path = tmp_path / "repeats.parquet"
    pyarrow.parquet.write_table(table, path, compression="zstd")
    issue = only_error(validate_file(path, fmt=FileFormat.PARQUET, mapping=ColumnMapping(kind="text")))
    assert issue.code == "parquet" and "times the file's size" in issue.message


def test_a_parquet_row_holding_millions_of_packed_values_is_refused_before_it_is_read(tmp_path):
    # A list of two million nulls is a few hundred bytes (its levels are run-length encoded); 2,000 million
    # would be no bigger on disk and gigabytes once read: the count in the file's metadata is checked first.
    values = 2_000_000
    column = pyarrow.ListArray.from_arrays(pyarrow.array([0, values], pyarrow.int32()),
                                           pyarrow.nulls(values, pyarrow.string()))
    path = tmp_path / "nulls.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"text": column}), path, compression="zstd")
    assert path.stat().st_size < 4096
    issue = only_error(validate_file(path, fmt=FileFormat.PARQUET, mapping=ColumnMapping(kind="text")))
    assert issue.code == "parquet" and "2,000,000 values in 1 row" in issue.message


def test_a_csv_cell_longer_than_the_csv_modules_default_limit_is_read(tmp_path):
    """QA: a text-kind CSV of long documents (a cell over 131,072 characters, the csv module's default field
    limit) was refused as "unreadable CSV: field larger than field limit (131072); check the quoting", though
    its quoting was right and the same rows as JSONL were read."""
    document = "word " * 60_000
    path = tmp_path / "long.csv"
    path.write_text('text\n"' + document + '"\nshort\n', encoding="utf-8")
    report = validate_file(path, fmt=FileFormat.CSV, mapping=ColumnMapping(kind="text"))
    assert report.ok and report.row_count == 2, report.errors
    assert next(iter_examples(path, fmt=FileFormat.CSV, mapping=ColumnMapping(kind="text")))["text"] == document


def test_a_csv_cell_past_the_element_limit_is_named_with_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "MAX_CSV_CELL_CHARS", 1000)
    path = tmp_path / "long.csv"
    path.write_text('text\nshort\n"' + "x" * 1001 + '"\n', encoding="utf-8")
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=ColumnMapping(kind="text")))
    assert (issue.code, issue.line) == ("csv", 3)
    assert issue.message == ("a cell of the row that starts on this line is over 1,000 characters, more than Temper "
                             "reads from one CSV cell: shorten it, or check for a quote (\") that is never closed")


def test_a_csv_line_of_only_spaces_is_a_blank_line(tmp_path):
    """QA: a CSV whose editor left '   ' on its last line failed with "this row has 1 cell but the header has 2
    columns; quote cells that contain commas or line breaks", about a row the user never wrote."""
    path = tmp_path / "rows.csv"
    path.write_text("prompt,completion\r\na,b\r\n   \r\n\t\r\n", encoding="utf-8")
    report = validate_file(path, fmt=FileFormat.CSV, mapping=SFT)
    assert report.ok and report.row_count == 1, report.errors


@pytest.mark.parametrize(("name", "data", "fmt"), [
    ("rows.csv", b"prompt,completion\ra,b\rc,d\r", FileFormat.CSV),
    ("rows.jsonl", b'{"prompt": "a", "completion": "b"}\r{"prompt": "c", "completion": "d"}\r', FileFormat.JSONL),
])
def test_a_file_with_old_mac_line_endings_is_named(tmp_path, name, data, fmt):
    """QA: lines ended by CR alone (Excel for Mac's "CSV (Macintosh)") read as one line: the CSV was "unreadable
    CSV: new-line character seen in unquoted field - do you need to open the file in universal-newline mode?",
    the JSONL "broken JSON at column 35: Extra data"; neither said what to change."""
    path = tmp_path / name
    path.write_bytes(data)
    issue = only_error(validate_file(path, fmt=fmt, mapping=SFT))
    assert issue.line == 1
    assert issue.message == ("the lines of this file end with a carriage return (CR) alone, an old Mac line ending: "
                             "save it again with LF (or CRLF) line endings")


def test_a_json_array_with_a_comma_after_its_last_element_says_so(tmp_path):
    """QA: `[{...},]`, as many editors and JavaScript write it, was "row 2: broken JSON at column 34: Expecting
    value", about a second row the file does not have."""
    path = tmp_path / "rows.json"
    path.write_text('[\n{"prompt": "a", "completion": "b"},\n]\n', encoding="utf-8")
    issue = only_error(validate_file(path, fmt=FileFormat.JSON, mapping=SFT))
    assert (issue.code, issue.line, issue.row) == ("json", 2, None)
    assert issue.message == ("a comma follows the last element of the JSON array (element 1), and JSON allows none "
                             "there: remove it")


def test_a_json_file_of_only_spaces_is_empty(tmp_path):
    """QA: it was "a .json dataset must be one array of objects ... but it starts with 'nothing'"."""
    path = tmp_path / "rows.json"
    path.write_text(" \n\n  \n", encoding="utf-8")
    issue = only_error(validate_file(path, fmt=FileFormat.JSON, mapping=SFT))
    assert (issue.code, issue.message) == ("empty_file", "the file holds only spaces and blank lines; give the file "
                                                         "that holds the rows")


def test_a_chat_saved_as_json_text_says_to_give_the_list_itself(tmp_path):
    """QA: a chat written as a JSON string (pandas' to_parquet of json.dumps'd messages, or a double-encoded JSONL
    value) was "must be a list of {role, content} messages, got a string", with no word that the string held
    one."""
    chat = json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    pyarrow.parquet.write_table(pyarrow.table({"messages": [chat]}), tmp_path / "chats.parquet")
    write_jsonl(tmp_path / "chats.jsonl", [{"messages": chat}])
    for name, fmt in (("chats.parquet", FileFormat.PARQUET), ("chats.jsonl", FileFormat.JSONL)):
        issue = only_error(validate_file(tmp_path / name, fmt=fmt, mapping=SFT))
        assert (issue.code, issue.field) == ("wrong_type", "messages")
        assert issue.message == ("must be a list of {role, content} messages, got a string that holds one as JSON "
                                 "text: store the list itself (decode it with json.loads before saving the file)")


def test_a_sharegpt_chat_is_named_with_the_change_it_needs(tmp_path):
    """QA: ShareGPT rows ({"from": "human", "value": ...}, mapped as messages) got two problems per turn, "role is
    missing" and "the message has no 'content'", with no word of the format they were in."""
    path = write_jsonl(tmp_path / "share.jsonl", [{"conversations": [{"from": "human", "value": "q"},
                                                                     {"from": "gpt", "value": "a"}]}])
    report = validate_file(path, fmt=FileFormat.JSONL,
                           mapping=ColumnMapping(kind="sft", columns={"messages": "conversations"}))
    assert [(issue.code, issue.field) for issue in report.errors] == [("bad_role", "messages[0]"),
                                                                       ("bad_role", "messages[1]")]
    assert report.errors[0].message == (
        "the message is ShareGPT's {from, value}, not {role, content}: a row in ShareGPT's layout ('conversations' of "
        "such turns, and for a preference row 'chosen' and 'rejected' as such turns) is read as LLaMA-Factory reads "
        "it where no column is mapped; give the rows so, without a column mapping, or write each message as "
        "{\"role\": ..., \"content\": ...} with the roles human → user, gpt → assistant, system → system")
    # Without the mapping, the row is read in ShareGPT's layout (tests/jaxengine/data/test_layouts.py).
    assert validate_file(path, fmt=FileFormat.JSONL, mapping=SFT).ok


def test_a_chat_written_as_a_python_list_says_to_write_json(tmp_path):
    """QA: pandas' to_csv writes a column of message lists as Python's repr, [{'role': 'user', ...}], which is not
    JSON: every row was "must be a list of {role, content} messages, got a string", with no word of why."""
    frame_cell = str([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    path = tmp_path / "chats.csv"
    path.write_text('messages\n"' + frame_cell.replace('"', '""') + '"\n', encoding="utf-8")
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.field, issue.line) == ("wrong_type", "messages", 2)
    assert issue.message == ("must be a list of {role, content} messages, got a string that holds one as Python "
                             "writes it (single quotes, as pandas' to_csv saves a list), not JSON: write the cell "
                             "with json.dumps, or save the file as JSONL or Parquet")


def test_a_csv_chat_cell_of_broken_json_says_where_it_breaks(tmp_path):
    """A CSV 'messages' cell of {role, content} messages whose JSON is broken was "must be a list of {role, content}
    messages, got a string", where a ShareGPT cell says where its JSON breaks (tests/jaxengine/data/test_layouts.py)."""
    chat = json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    path = tmp_path / "chats.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["messages"])
        writer.writerows([[chat], [chat[:-2]], [chat.replace("}, {", "} {")]])
    report = validate_file(path, fmt=FileFormat.CSV, mapping=SFT)
    assert [str(issue) for issue in report.errors] == [
        "line 3, row 2, field 'messages': broken JSON at character 72: unexpected end of data; write the chat as a "
        "JSON list of {role, content} messages",
        "line 4, row 3, field 'messages': broken JSON at character 35: unexpected character, expected ',' or ']'; "
        "write the chat as a JSON list of {role, content} messages"]
    with pytest.raises(DatasetFormatError, match=r"row 2, field 'messages': broken JSON at character 72"):
        list(iter_examples(path, fmt=FileFormat.CSV, mapping=SFT))


def test_a_message_whose_content_is_a_list_of_parts_says_to_give_the_text(tmp_path):
    """QA: OpenAI's content parts ([{"type": "text", "text": ...}]) got "must be a string, got a list"."""
    path = write_jsonl(tmp_path / "parts.jsonl", [{"messages": [
        {"role": "user", "content": [{"type": "text", "text": "q"}]}, {"role": "assistant", "content": "a"}]}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field) == ("wrong_type", "messages[0].content")
    assert issue.message == ("must be a string, got a list of content parts ([{\"type\": \"text\", \"text\": ...}]): "
                             "Temper reads text only; give the message's text as one string")


def test_a_line_of_only_spaces_is_blank_in_a_one_column_csv_too(tmp_path):
    """QA (live): a text-kind CSV whose last line held spaces failed with "is an empty string" about it."""
    path = tmp_path / "texts.csv"
    path.write_text('text\n"a long document"\n   \n', encoding="utf-8")
    report = validate_file(path, fmt=FileFormat.CSV, mapping=ColumnMapping(kind="text"))
    assert report.ok and report.row_count == 1, report.errors


def test_a_csv_row_that_repeats_the_header_is_named(tmp_path):
    """QA: two CSV exports joined with `cat` were taken with their second header as a row of data (a prompt
    'prompt' whose completion is 'completion'), without a word."""
    path = tmp_path / "joined.csv"
    path.write_text("prompt,completion\na,b\nprompt,completion\nc,d\n", encoding="utf-8")
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.line, issue.row) == ("csv_header", 3, 2)
    assert issue.message == ("this row repeats the header row: the file may be several CSV files joined together; "
                             "remove the repeated header")


def test_a_byte_order_mark_inside_a_jsonl_file_is_named(tmp_path):
    """QA: JSONL files joined with `cat`, the second saved with a BOM, failed on its first line with "broken JSON
    at column 1: Unexpected UTF-8 BOM (decode using utf-8-sig)"."""
    path = tmp_path / "joined.jsonl"
    path.write_bytes(b'{"prompt": "a", "completion": "b"}\n\xef\xbb\xbf{"prompt": "c", "completion": "d"}\n')
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.line, issue.row) == ("json", 2, 2)
    assert issue.message == ("this line starts with a byte order mark (BOM), which only a file's first line may "
                             "have: the file may be several files joined together; remove the BOM")


def test_a_header_ending_in_a_comma_says_so(tmp_path):
    """QA: a spreadsheet's export with a comma after the last column was told "column 3 of the header row has no
    name; name every column", though it has no third column to name."""
    path = tmp_path / "rows.csv"
    path.write_text("prompt,completion,\na,b,\n", encoding="utf-8")
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.line) == ("csv_header", 1)
    assert issue.message == ("the header row ends with a comma, which makes an empty column 3 with no name; remove "
                             "the commas at the ends of the lines (or name the column)")


def test_an_sft_prompt_given_as_a_chat_says_how_to_write_it(tmp_path):
    """QA: an sft row whose prompt was a message list (a system turn and the user's) was "must be a string, got a
    list", with no word of how sft takes a chat."""
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": [{"role": "system", "content": "s"},
                                                             {"role": "user", "content": "q"}], "completion": "a"}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field) == ("wrong_type", "prompt")
    assert issue.message == ("must be a string, got a list (a chat?); for a chat, give the whole conversation as "
                             "'messages', the completion as its last, assistant, turn")


def test_a_json_object_holding_the_rows_under_a_key_says_what_to_save(tmp_path):
    """QA: {"data": [...]}, as many exports write, was told "for one object per line use a .jsonl file", which
    would not help: its rows are a list under a key. An object of one key holding them is read now; one that holds
    other keys first is named by its first key."""
    path = tmp_path / "export.json"
    path.write_text('{"version": 1, "data": [{"prompt": "a", "completion": "b"}]}', encoding="utf-8")
    issue = only_error(validate_file(path, fmt=FileFormat.JSON, mapping=SFT))
    assert (issue.code, issue.line) == ("json", 1)
    assert issue.message == ("the file is an object whose first key, 'version', holds a number, not a list of rows; a "
                             ".json dataset is one array of rows ([{...}, {...}]), or an object whose one key holds "
                             "that array ({\"data\": [{...}, {...}]}): save the list of rows alone, or as JSON Lines "
                             "(.jsonl)")


@pytest.mark.parametrize("indent", [None, 2])
def test_a_json_object_whose_one_key_holds_the_rows_is_read_as_those_rows(tmp_path, indent):
    # Hugging Face's JSON loader reads such a file with field="data"; it was refused for starting with '{'.
    rows = [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}]
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"data": rows}, indent=indent), encoding="utf-8")
    report = validate_file(path, fmt=FileFormat.JSON, mapping=SFT)
    assert report.ok and report.row_count == 2, report.errors
    assert list(iter_examples(path, fmt=FileFormat.JSON, mapping=SFT)) == rows
    assert read_page(path, fmt=FileFormat.JSON, mapping=SFT, offset=1, limit=5) == [(2, rows[1])]


@pytest.mark.parametrize("document, says", [
    ({"data": [{"prompt": "a", "completion": "b"}], "version": 1}, "the object holds more keys after 'data'"),
    ({"data": ["a", "b"]}, "whose first key, 'data', holds a list of strings, not of rows (objects)"),
    # pandas' to_json() (orient="columns") and orient="split"
    ({"prompt": {"0": "a"}, "completion": {"0": "b"}}, "'prompt', holds an object, not a list of rows: if it is "
                                                       "pandas' to_json output, write it with orient='records'"),
    ({"columns": ["prompt", "completion"], "index": [0], "data": [["a", "b"]]}, "'columns', holds a list of strings"),
])
def test_a_json_object_that_does_not_hold_rows_under_one_key_says_what_it_holds(tmp_path, document, says):
    path = tmp_path / "export.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    issue = validate_file(path, fmt=FileFormat.JSON, mapping=SFT).errors[-1]
    assert issue.code == "json" and says in issue.message, issue.message
    assert "save the list of rows alone, or as JSON Lines" in issue.message


def test_a_json_file_holding_json_lines_is_read_as_json_lines(tmp_path):
    # Hugging Face's Dataset.to_json("rows.json") writes one object per line whatever the extension (and
    # pandas' to_json(lines=True)): it was refused for starting with '{'.
    path = write_jsonl(tmp_path / "rows.json", [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"},
                                                {"prompt": 3, "completion": "e"}])
    report = validate_file(path, fmt=FileFormat.JSON, mapping=SFT)
    assert (report.row_count, [(e.code, e.line, e.row, e.field) for e in report.errors]) == (
        3, [("wrong_type", 3, 3, "prompt")])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().rsplit(b"\n", 2)[0] + b"\n")
    report = validate_file(path, fmt=FileFormat.JSON, mapping=SFT)
    assert report.ok and report.row_count == 2, report.errors
    assert [row for _, row in read_page(path, fmt=FileFormat.JSON, mapping=SFT, offset=0, limit=5)] == [
        {"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}]


@pytest.mark.parametrize("name", ["rows.xlsx", "rows.XLS", "rows.ods"])
def test_a_spreadsheet_is_told_to_be_exported_as_csv(name):
    """QA: an Excel workbook was told to rename itself to a dataset extension; renamed .csv, it was then "a zip
    archive: extract the dataset file from it first", which no workbook holds."""
    with pytest.raises(ValueError) as raised:
        detect_format(name)
    assert str(raised.value) == (f"'{name}' is a spreadsheet workbook, which Temper does not read: export the sheet "
                                 "as CSV (UTF-8) and upload that file")


def test_a_workbook_renamed_csv_is_named_as_one(tmp_path):
    import zipfile

    path = tmp_path / "rows.csv"
    with zipfile.ZipFile(path, "w") as workbook:
        workbook.writestr("[Content_Types].xml", "<Types/>")
        workbook.writestr("xl/workbook.xml", "<workbook/>")
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.message) == ("binary", "this looks like a spreadsheet workbook (Excel or OpenDocument): "
                                                     "export the sheet as CSV (UTF-8) and upload that file")


def test_a_tab_separated_file_is_told_to_use_commas():
    """QA: rows.tsv was told to rename itself .csv, which then failed as "separated by tabs"."""
    with pytest.raises(ValueError) as raised:
        detect_format("rows.tsv")
    assert str(raised.value) == ("'rows.tsv' is separated by tabs, which Temper does not read: export it again as CSV "
                                 "(separated by commas) or as JSON Lines")


def test_exact_duplicates_are_counted_after_the_column_mapping(tmp_path):
    """Rows equal once mapped (the key order aside) are duplicates; each row's digest is kept in file order."""
    mapping = ColumnMapping(kind=DatasetKind.SFT, columns={"prompt": "q", "completion": "a"})
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "1", "a": "x"}, {"q": "2", "a": "x"}, {"a": "x", "q": "1"},
                                              {"q": "1", "a": "y"}, {"q": "1", "a": "x"}])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=mapping)
    assert report.ok and report.statistics["duplicates"] == {"count": 2, "rows": [[3, 1], [5, 1]]}
    digests = [int.from_bytes(report.row_digests[start:start + 8], sys.byteorder) for start in range(0, 40, 8)]
    assert digests[0] == digests[2] == digests[4] == formats.row_digest({"prompt": "1", "completion": "x"})
    assert len(set(digests)) == 3
    assert "no_assistant_turn" not in report.statistics  # a preference file's count only


def test_preference_chats_with_no_assistant_turn_are_counted_per_side(tmp_path):
    user_only = [{"role": "user", "content": "hi"}]
    answered = [*user_only, {"role": "assistant", "content": "hello"}]
    path = write_jsonl(tmp_path / "p.jsonl", [{"chosen": answered, "rejected": user_only},
                                              {"prompt": "p", "chosen": "a", "rejected": "b"},
                                              {"chosen": user_only, "rejected": user_only}])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind=DatasetKind.PREFERENCE))
    assert report.ok and report.statistics["no_assistant_turn"] == {"chosen": {"count": 1, "rows": [3]},
                                                                    "rejected": {"count": 2, "rows": [1, 3]}}


def test_a_failed_file_keeps_no_duplicate_counts_or_digests(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "1", "completion": "x"}, {"prompt": "1"}])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=SFT)
    assert not report.ok and report.statistics == {} and report.row_digests == b""


def test_duplicate_rows_match_a_first_seen_dictionary_on_many_rows():
    """The stable-sort count (16 bytes a row kept) against the plain reading of the rule: a row is a repeat when
    an earlier row had its digest, named against the first that did; the earliest repeats are shown."""
    import random

    rng = random.Random(7)
    found = formats.DuplicateRows()
    first_row, repeats = {}, []
    for row in range(1, 3001):
        example = {"prompt": str(rng.randrange(400)), "completion": "x"}
        found.add(formats.row_digest(example), row * 2)  # row numbers need not be positions (blank lines)
        first = first_row.setdefault(formats.row_digest(example), row * 2)
        if first != row * 2:
            repeats.append([row * 2, first])
    assert found.to_dict() == {"count": len(repeats), "rows": repeats[:formats.ROWS_SHOWN]}
    assert formats.DuplicateRows().to_dict() == {"count": 0, "rows": []}


@pytest.mark.parametrize(("name", "fmt", "head", "row", "where"), [
    ("one.jsonl", FileFormat.JSONL, b'{"text": "short"}\n', b'{"text": "%s"}\n', ("json", 2)),
    ("one.csv", FileFormat.CSV, b"text\nshort\n", b"%s\n", ("csv", 3)),
    # A .json file of JSON Lines (dataqa): telling it from an array read its second line whole first.
    ("lines.json", FileFormat.JSON, b'{"text": "short"}\n', b'{"text": "%s"}\n', ("json", 2)),
])
def test_a_line_past_the_line_limit_is_refused_before_it_is_read_whole(tmp_path, monkeypatch, name, fmt, head, row,
                                                                       where):
    """secqa: a JSONL or CSV line was read whole before it was parsed, so a 2 GB upload of one line (a member's,
    under the upload limit) took the validating worker's memory several times over; the JSON array reader stopped
    at 64 MB an element. The limit is lowered to 1 MB to keep the test light; the line is 32 MB."""
    monkeypatch.setattr(formats, "MAX_LINE_BYTES", 1024 * 1024, raising=False)  # raising: absent before the fix
    path = tmp_path / name
    path.write_bytes(head + row % (b"x" * 32 * 1024 * 1024))
    tracemalloc.start()
    try:
        issue = only_error(validate_file(path, fmt=fmt, mapping=ColumnMapping(kind="text")))
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (issue.code, issue.line) == where
    assert issue.message == ("this line is over 1.0 MB, more than Temper reads as one line: split it into rows "
                             "of their own, or check that the file's lines end with line breaks")
    assert peak < 8 * 1024 * 1024, f"{peak:,} bytes held while reading a file of one 32 MB line"


@pytest.mark.parametrize(("name", "fmt", "rows"), [
    ("rows.csv", FileFormat.CSV, b"prompt,completion\r" + b"a,b\r" * 400),
    ("rows.jsonl", FileFormat.JSONL, b'{"prompt": "a", "completion": "b"}\r' * 40),
])
def test_a_long_file_with_old_mac_line_endings_is_named_so_not_as_a_long_line(tmp_path, monkeypatch, name, fmt, rows):
    # Read by LF, such a file is one line, which the line limit meets first: its message says why.
    monkeypatch.setattr(formats, "MAX_LINE_BYTES", 1000)
    path = tmp_path / name
    path.write_bytes(rows)
    issue = only_error(validate_file(path, fmt=fmt, mapping=SFT))
    assert (issue.code, issue.line) == ("line_endings", 1)


@pytest.mark.parametrize("content", [b"\n\n\n", b"\r\n\r\n", b"  \n \n", b"\n"])
def test_a_csv_file_of_only_blank_lines_is_empty(tmp_path, content):
    # Two blank lines made the header row an empty list, and reading its first name raised IndexError: the
    # validating worker stopped with a traceback and the version stayed "validating".
    path = tmp_path / "blank.csv"
    path.write_bytes(content)
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert issue.code == "empty_file" and "only spaces and blank lines" in issue.message


def test_blank_lines_before_a_csv_header_are_skipped(tmp_path):
    path = tmp_path / "late-header.csv"
    path.write_bytes(b"\n \r\nprompt,completion\na,b\n")
    report = validate_file(path, fmt=FileFormat.CSV, mapping=SFT)
    assert report.ok and report.row_count == 1, report.errors
    assert list(iter_examples(path, fmt=FileFormat.CSV, mapping=SFT)) == [{"prompt": "a", "completion": "b"}]
    path.write_bytes(b"\n\nprompt,completion\na\n")
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.line, issue.row) == ("ragged_row", 4, 1)


@pytest.mark.parametrize("fmt, content", [
    (FileFormat.JSONL, b'{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": "b", "completion": "c"}\n'),
    (FileFormat.JSONL, b'{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion" : "b", "completion": "c"}\n'),
    (FileFormat.JSON, b'[{"prompt": "a", "completion": "b"},\n {"prompt": "a", "completion": "b", "completion": "c"}]'),
])
def test_a_key_given_twice_in_a_row_is_named_not_silently_dropped(tmp_path, fmt, content):
    # JSON readers keep the last of two equal keys: the row trained on "c" and nothing said that "b" was dropped.
    path = tmp_path / f"twice.{fmt.value}"
    path.write_bytes(content)
    issue = only_error(validate_file(path, fmt=fmt, mapping=SFT))
    assert (issue.code, issue.line, issue.row, issue.field) == ("duplicate_key", 2, 2, "completion")
    assert "'completion' twice" in issue.message and "remove" in issue.message


@pytest.mark.parametrize("fmt", [FileFormat.JSONL, FileFormat.JSON])
def test_a_key_given_twice_inside_a_message_names_the_turn(tmp_path, fmt):
    row = '{"messages": [{"role": "user", "content": "a", "content": "x"}, {"role": "assistant", "content": "b"}]}'
    path = tmp_path / f"twice.{fmt.value}"
    path.write_text(row + "\n" if fmt is FileFormat.JSONL else f"[{row}]", encoding="utf-8")
    issue = only_error(validate_file(path, fmt=fmt, mapping=SFT))
    assert (issue.code, issue.row, issue.field) == ("duplicate_key", 1, "messages[0]")
    assert "'content' twice" in issue.message


def test_rows_whose_text_holds_quoted_keys_are_not_duplicates(tmp_path):
    # The quick count of keys meets escaped quotes followed by a colon in text, and keys spaced from their colon.
    rows = [{"prompt": 'say "a": 1 and \\": 2', "completion": '{"completion": "b"}'}]
    path = write_jsonl(tmp_path / "quoted.jsonl", rows)
    path.write_bytes(path.read_bytes() + b'{"prompt" : "x",  "completion"\t:"y"}\n')
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=SFT)
    assert report.ok and report.row_count == 2, report.errors


@pytest.mark.parametrize("spacing", [b"\t", b"\r", b"\t\r"])
def test_a_key_given_twice_is_named_whatever_spaces_it_from_its_colon(tmp_path, spacing):
    # The quick count of keys looked for a space between a key and its colon, not for the tab or carriage return
    # JSON allows there too: the second 'completion' was kept and the first dropped without a word.
    path = tmp_path / "spaced.jsonl"
    path.write_bytes(b'{"prompt": "a", "completion"' + spacing + b': "b", "completion": "c"}\n')
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.line, issue.field) == ("duplicate_key", 1, "completion")


def test_json_held_in_a_text_is_not_parsed_again():
    # Escaped quotes followed by a colon, as every line of a file of tool calls has in its arguments, made each such
    # line one more parse, by Python's json with a hook on every object: several times the line's own check.
    row = {"messages": [{"role": "user", "content": 'call {"name": "weather", "arguments": {"city": "Oslo"}}'},
                        {"role": "assistant", "content": '{\\"q\\": 1, "path\\\\": 2}'}]}
    line = orjson.dumps(row) + b"\n"
    assert b'\\":' in line
    assert not formats._keys_repeat(line, row)
    assert formats._keys_repeat(line.replace(b'"role":"user",', b'"role":"user","role":"user",'), row)


class _Written:
    """An object as a file writes it: its (key, value) pairs in order, a key perhaps twice."""

    def __init__(self, pairs):
        self.pairs = pairs


def test_the_lines_that_give_a_key_twice_are_found_and_no_other(tmp_path):
    """Against the plain reading of the rule (json's object_pairs_hook, which sees every key as written): lines
    with each spacing JSON allows around a colon, keys and texts that hold quotes, colons and backslashes (escaped
    quotes followed by a colon, as JSON held in a text has), nested objects, and keys given twice at any depth."""
    rng = random.Random(7)
    keys = ["prompt", "completion", "a", "q\"", "b\\", ":", "x\\\"y", "\\\\"]
    texts = ["t", 'say "a": 1', "a\\", '\\": 2', '{"k": "v", "k": "w"}', 'c:\\path\\"', '\\\\"', "\"\":"]

    def space() -> str:
        return rng.choice(["", "", "", " ", "\t", "\r", " \t"])

    def made(depth: int):
        roll = rng.random()
        if depth < 3 and roll < 0.3:
            return _Written([(rng.choice(keys), made(depth + 1)) for _ in range(rng.randint(0, 3))])
        if depth < 3 and roll < 0.45:
            return [made(depth + 1) for _ in range(rng.randint(0, 3))]
        return rng.choice(texts)

    def written(value) -> str:
        if isinstance(value, _Written):
            return "{" + ",".join(f"{space()}{json.dumps(key)}{space()}:{space()}{written(child)}{space()}"
                                  for key, child in value.pairs) + "}"
        if isinstance(value, list):
            return "[" + ",".join(space() + written(child) + space() for child in value) + "]"
        return json.dumps(value)

    def gives_a_key_twice(line: bytes) -> bool:
        found = []
        json.loads(line, object_pairs_hook=lambda pairs: found.append(len(dict(pairs)) != len(pairs)) or dict(pairs))
        return any(found)

    lines = []
    for _ in range(3000):
        pairs = [("prompt", "p"), ("completion", "c")]
        pairs += [(rng.choice(keys), made(1)) for _ in range(rng.randint(0, 3))]
        rng.shuffle(pairs)
        lines.append(written(_Written(pairs)).encode() + b"\n")
    twice = [gives_a_key_twice(line) for line in lines]
    assert 500 < sum(twice) < 2500
    assert [formats._keys_repeat(line, orjson.loads(line)) for line in lines] == twice
    path = tmp_path / "keys.jsonl"
    path.write_bytes(b"".join(lines))
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=SFT, max_errors=len(lines) * 4)
    named = [issue.row for issue in report.errors if issue.code == "duplicate_key"]
    assert named == [row for row, is_twice in enumerate(twice, start=1) if is_twice]


@pytest.mark.parametrize("fmt, content, line, column, shown", [
    (FileFormat.JSONL, b'{"prompt": "a\tb", "completion": "c"}\n', 1, 14, "U+0009 (a tab), inside a string: JSON allows it there only as the escape \\t"),
    (FileFormat.JSON, b'[{"prompt": "a\nb", "completion": "c"}]', 1, 15, "U+000A (a line break), inside a string: JSON allows it there only as the escape \\n"),
    # Past the first 8 KB, where the whole-file check looks for NUL bytes.
    (FileFormat.JSON, b'[' + b'{"prompt": "x", "completion": "y"},\n' * 300 + b'{"prompt": "a\x00b", "completion": "c"}]',
     301, 14, None),
])
def test_a_control_character_inside_a_json_string_says_to_escape_it(tmp_path, fmt, content, line, column, shown):
    # It read "broken JSON at column 14: Invalid control character at", json's words cut short.
    path = tmp_path / f"control.{fmt.value}"
    path.write_bytes(content)
    issue = only_error(validate_file(path, fmt=fmt, mapping=SFT))
    assert (issue.code, issue.line) == ("json", line)
    expected = "a NUL character inside a string, which is binary data" if shown is None else f"a control character, {shown}"
    assert f"at column {column}: {expected}" in issue.message
    assert "Invalid control character at" not in issue.message


@pytest.mark.parametrize("role, says", [
    ("User", "write it as 'user' (roles are lower case"),
    (" assistant", "write it as 'assistant' (roles are lower case"),
    ("gpt", "write it as 'assistant'"),
    ("model", "write it as 'assistant'"),
    ("developer", "write it as 'system'"),
    ("tool", "a tool's result"),
    ("function", "a tool's result"),
    ("ipython", "a tool's result"),
    ("narrator", "use one of: system, user, assistant"),
])
def test_a_role_of_another_chat_format_says_what_to_write(tmp_path, role, says):
    path = write_jsonl(tmp_path / "roles.jsonl", [
        {"messages": [{"role": "user", "content": "q"}, {"role": role, "content": "x"},
                      {"role": "assistant", "content": "a"}]}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field) == ("bad_role", "messages[1].role")
    assert f"role is {role!r}" in issue.message and says in issue.message


@pytest.mark.parametrize("turn, code, field", [
    ({"role": "assistant", "content": ""}, "empty_string", "messages[1].content"),
    ({"role": "assistant", "content": " \n\u3000"}, "empty_string", "messages[1].content"),
    ({"role": "assistant", "content": "a\x00"}, "binary", "messages[1].content"),
    ({"role": "assistant", "content": 42}, "wrong_type", "messages[1].content"),
    ({"role": "assistant"}, "missing_field", "messages[1].content"),
    ({"role": "assistant", "content": "a", "tool_calls": []}, "tool_calls", "messages[1].tool_calls"),
    ({"role": "Assistant", "content": "a"}, "bad_role", "messages[1].role"),
])
def test_each_problem_of_a_turn_is_named_beside_turns_without_one(tmp_path, turn, code, field):
    # Turns of a role and a text alone are passed by a quicker test than the others: each problem still has its name.
    path = write_jsonl(tmp_path / "turns.jsonl", [
        {"messages": [{"role": "user", "content": "q"}, turn, {"role": "assistant", "content": "a", "weight": 1}]}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field) == (code, field)


def test_chat_shapes_are_found_as_their_descriptions_say():
    """Every chat of up to six turns against the plain reading of ``CHAT_SHAPES``: a system turn after the first
    turn, two turns of one role in a row, an assistant turn before any user turn."""
    for length in range(7):
        for roles in itertools.product(["system", "user", "assistant"], repeat=length):
            expected = set()
            if "system" in roles[1:]:
                expected.add("system_later")
            if any(first == second for first, second in zip(roles, roles[1:])):
                expected.add("same_role_twice")
            if "assistant" in roles and "user" not in roles[:roles.index("assistant")]:
                expected.add("assistant_first")
            assert formats.chat_shapes([{"role": role, "content": "x"} for role in roles]) == expected, roles


@pytest.mark.parametrize("role", [["user"], {"name": "user"}])
def test_a_role_given_as_a_list_or_an_object_is_named_not_a_crash(tmp_path, role):
    # Looked up among the roles, a list or an object raised TypeError (unhashable): the check stopped, the web
    # app's version failed as internal_error and the command line printed a traceback.
    path = write_jsonl(tmp_path / "roles.jsonl", [
        {"messages": [{"role": role, "content": "q"}, {"role": "assistant", "content": "a"}]}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field) == ("bad_role", "messages[0].role")
    assert issue.message == f"role is {role!r}; use one of: system, user, assistant"


@pytest.mark.parametrize("content", [None, "", "Let me look that up."])
def test_an_assistant_turn_calling_tools_is_refused_not_read_as_its_text(tmp_path, content):
    # OpenAI's and Hugging Face's chats write a call as the assistant turn's tool_calls: with text beside them the
    # calls were dropped without a word, and without text the turn was "missing content".
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}
    turn = {"role": "assistant", "tool_calls": [call]} | ({} if content is None else {"content": content})
    path = write_jsonl(tmp_path / "tools.jsonl", [
        {"messages": [{"role": "user", "content": "weather?"}, turn, {"role": "assistant", "content": "Sunny."}]}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field) == ("tool_calls", "messages[1].tool_calls")
    assert "tool calls" in issue.message and "remove" in issue.message


@pytest.mark.parametrize("fmt, content, column", [
    (FileFormat.CSV, b"Prompt,Completion\na,b\n", "Prompt"),
    (FileFormat.JSONL, b'{" prompt": "a", "completion": "b"}\n', " prompt"),
    (FileFormat.JSONL, b'{"PROMPT": "a", "completion": "b"}\n', "PROMPT"),
])
def test_a_column_named_as_a_field_but_for_case_or_spaces_is_named(tmp_path, fmt, content, column):
    # "this row has columns 'Prompt', 'Completion' (map a differently named column to it ...)" left the
    # difference to be spotted.
    path = tmp_path / f"case.{fmt.value}"
    path.write_bytes(content)
    report = validate_file(path, fmt=fmt, mapping=SFT)
    issue = report.errors[0]
    assert (issue.code, issue.field) == ("missing_field", "prompt")
    assert (f"this row has a column {column!r}, which differs from 'prompt' only in letter case or spaces: "
            "rename the column 'prompt'") in issue.message
    assert "Column mapping on the upload form" in issue.message


def test_preference_rows_whose_chosen_is_their_rejected_are_counted(tmp_path):
    # Valid (a tie, as some exports keep them), but a DPO or reward run learned nothing from them without a word.
    answer = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    path = write_jsonl(tmp_path / "ties.jsonl", [
        {"prompt": "p", "chosen": "a", "rejected": "b"},
        {"prompt": "p", "chosen": "same", "rejected": " same\n"},
        {"chosen": answer, "rejected": [*answer[:1], {"role": "assistant", "content": "hello "}]},
        {"chosen": answer, "rejected": [*answer[:1], {"role": "assistant", "content": "hi"}]},
    ])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind=DatasetKind.PREFERENCE))
    assert report.ok and report.statistics["identical_pairs"] == {"count": 2, "rows": [2, 3]}
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "p", "completion": "p"}])
    assert "identical_pairs" not in validate_file(sft, fmt=FileFormat.JSONL, mapping=SFT).statistics


@pytest.mark.parametrize("kind, row, says", [
    ("text", "a document", 'write each row as an object, e.g. {"text": "..."}'),
    ("sft", "a question", 'write each row as an object, e.g. {"prompt": "...", "completion": "..."}'),
    ("sft", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
     'a list of messages (a chat?): write it as {"messages": [...]}'),
    ("preference", ["a", "b"], 'write each row as an object, e.g. {"prompt": "...", "chosen": "...", "rejected": "..."}'),
    ("prompts", 42, 'write each row as an object, e.g. {"prompt": "..."}'),
])
def test_a_row_that_is_not_an_object_says_what_to_write(tmp_path, kind, row, says):
    # "each row must be a JSON object with named fields, got a string" named no fields and no fix.
    path = write_jsonl(tmp_path / "rows.jsonl", [row])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=ColumnMapping(kind=kind)))
    assert (issue.code, issue.row) == ("wrong_type", 1)
    assert says in issue.message, issue.message


@pytest.mark.parametrize("value, shown", [(42, '"42"'), (2.5, '"2.5"'), (True, '"true"')])
def test_a_number_or_boolean_where_text_is_expected_says_to_quote_it(tmp_path, value, shown):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "q", "completion": value}])
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.field) == ("wrong_type", "completion")
    assert issue.message.startswith(f"must be a string, got a {'boolean' if value is True else 'number'}: write it as "
                                    f"text, in quotes ({shown})")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("fmt", [FileFormat.JSONL, FileFormat.CSV, FileFormat.JSON])
def test_utf16_text_is_named_as_utf16_whatever_its_byte_order(tmp_path, fmt, encoding):
    # Without a byte order mark, big-endian UTF-16 (a NUL first) was "binary data" with no word of UTF-16.
    text = {FileFormat.JSONL: '{"text": "a"}\n', FileFormat.CSV: "text\na\n", FileFormat.JSON: '[{"text": "a"}]'}[fmt]
    path = tmp_path / f"x.{fmt.value}"
    path.write_bytes(text.encode(encoding))
    issue = only_error(validate_file(path, fmt=fmt, mapping=ColumnMapping(kind="text")))
    assert issue.code == "encoding"
    assert issue.message == ("the file is UTF-16 text, not UTF-8: save it as UTF-8 (a spreadsheet's \"CSV UTF-8\", or "
                             "an editor's Save As with the encoding UTF-8) and upload it again")


@pytest.mark.parametrize("fmt", [FileFormat.JSONL, FileFormat.JSON])
@pytest.mark.parametrize("kind, row, field", [
    ("prompts", {"prompt": "b", "tree": "DEEP"}, "tree"),
    ("sft", {"messages": [{"role": "user", "content": "q", "meta": "DEEP"}, {"role": "assistant", "content": "a"}]},
     "messages"),
])
def test_a_value_nested_too_deeply_to_keep_is_named_not_a_crash(tmp_path, fmt, kind, row, field):
    # orjson reads 1024 levels but writes 254: a prompts row's extra column, or a message's extra key, was kept as
    # read and its digest raised TypeError, which ended the check (the web app's version stayed "validating").
    first = {"prompts": {"prompt": "a", "answer": "1"}, "sft": {"prompt": "a", "completion": "b"}}[kind]

    def write(depth: int) -> Path:
        rows = [json.dumps(first), json.dumps(row).replace('"DEEP"', "[" * depth + "]" * depth)]
        path = tmp_path / f"deep-{depth}.{fmt.value}"
        path.write_text("\n".join(rows) + "\n" if fmt is FileFormat.JSONL else f"[{','.join(rows)}]", encoding="utf-8")
        return path

    issue = only_error(validate_file(write(300), fmt=fmt, mapping=ColumnMapping(kind=kind)))
    assert (issue.code, issue.row, issue.field) == ("too_deep", 2, field)
    assert issue.message == ("holds lists or objects nested more than 254 levels deep, which Temper does not keep; "
                             "flatten them, or store such a value as a JSON string")
    assert validate_file(write(200), fmt=fmt, mapping=ColumnMapping(kind=kind)).ok


@pytest.mark.parametrize("fmt", [FileFormat.JSONL, FileFormat.JSON])
@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused_alike_by_both_json_readers(tmp_path, fmt, constant):
    # The JSON array reader took NaN (Python's json does) where JSONL refused it as "unexpected character", and a
    # NaN kept as a reference could not be stored where the web app keeps samples (PostgreSQL's JSON has none).
    row = f'{{"prompt": "a", "answer": {constant}}}'
    path = tmp_path / f"nan.{fmt.value}"
    path.write_text(row + "\n" if fmt is FileFormat.JSONL else f"[{row}]", encoding="utf-8")
    issue = only_error(validate_file(path, fmt=fmt, mapping=ColumnMapping(kind="prompts")))
    assert (issue.code, issue.line, issue.row) == ("json", 1, 1)
    assert issue.message == (f"{constant} is not a JSON value (JSON has no NaN or Infinity): write null, or the "
                             "value as text in quotes")


def test_an_integer_past_64_bits_is_read_alike_by_both_json_readers(tmp_path):
    # The JSON array reader kept it exact, and the row's digest (orjson, 64-bit integers) raised TypeError, which
    # ended the check. JSONL's orjson reads it as a float.
    number = "1" * 30
    jsonl, array = tmp_path / "big.jsonl", tmp_path / "big.json"
    jsonl.write_text(f'{{"prompt": "a", "answer": {number}}}\n', encoding="utf-8")
    array.write_text(f'[{{"prompt": "a", "answer": {number}}}]', encoding="utf-8")
    prompts = ColumnMapping(kind="prompts")
    reports = [validate_file(path, fmt=detect_format(path.name), mapping=prompts) for path in (jsonl, array)]
    assert all(report.ok for report in reports), [report.errors for report in reports]
    assert reports[0].row_digests == reports[1].row_digests
    assert list(iter_examples(array, fmt=FileFormat.JSON, mapping=prompts)) == list(
        iter_examples(jsonl, fmt=FileFormat.JSONL, mapping=prompts))


@pytest.mark.parametrize("fmt", [FileFormat.JSONL, FileFormat.JSON])
def test_an_integer_past_what_a_number_holds_is_named_alike_by_both_json_readers(tmp_path, fmt):
    # Over 4,300 digits Python's int() raised ValueError in the JSON array reader, which ended the check; JSONL said
    # "broken JSON: number is infinity when parsed as double".
    row = f'{{"prompt": "a", "answer": {"1" * 5000}}}'
    path = tmp_path / f"huge.{fmt.value}"
    path.write_text(row + "\n" if fmt is FileFormat.JSONL else f"[{row}]", encoding="utf-8")
    issue = only_error(validate_file(path, fmt=fmt, mapping=ColumnMapping(kind="prompts")))
    assert (issue.code, issue.line, issue.row) == ("json", 1, 1)
    assert issue.message == "a number of 5,000 digits, past what a number can hold: write it as text in quotes"


def test_a_parquet_value_of_a_type_that_cannot_be_kept_is_named(tmp_path):
    import decimal

    path = tmp_path / "typed.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"prompt": ["a"], "price": pyarrow.array([decimal.Decimal("1.5")])}),
                                path)
    issue = only_error(validate_file(path, fmt=FileFormat.PARQUET, mapping=ColumnMapping(kind="prompts")))
    assert (issue.code, issue.row, issue.field) == ("wrong_type", 1, "price")
    assert issue.message == ("holds a value of a type Temper does not keep (Type is not JSON serializable: "
                             "decimal.Decimal): store it as text or a number")


@pytest.mark.parametrize("indent", [2, 4])
def test_a_jsonl_file_of_indented_objects_is_one_problem_that_says_so(tmp_path, indent):
    """Audit: rows written with json.dump(row, f, indent=2), each object spread over several lines, were a
    "broken JSON" problem for each line ("row 1: broken JSON at column 2: Expecting property name enclosed in
    double quotes", "row 2: ... Extra data", ...: 20 listed, each counted as a row of its own), and nothing said
    that the file held whole objects over several lines."""
    rows = [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row, indent=indent) + "\n" for row in rows), encoding="utf-8")
    issue = only_error(validate_file(path, fmt=FileFormat.JSONL, mapping=SFT))
    assert (issue.code, issue.line, issue.row) == ("json", 1, None)
    assert issue.message == (
        "this line holds only '{', the start of an object written over several lines (indented, as json.dump(row, "
        "file, indent=2) writes it): a JSON Lines file holds each row whole on one line; write each row with "
        "json.dumps(row) and a line break, with no indent, and upload it again")


def test_a_jsonl_file_whose_first_row_alone_is_indented_is_read_as_such(tmp_path):
    """The indented layout is told from the first row: a broken row further on is named as broken JSON."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n{\n"prompt": "c"}\n', encoding="utf-8")
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=SFT)
    assert report.errors[0].line == 2 and report.errors[0].message.startswith("broken JSON")


ULTRAFEEDBACK_ROW = {  # HuggingFaceH4/ultrafeedback_binarized's layout: chosen and rejected repeat the prompt's turn
    "prompt": "Name a prime.",
    "chosen": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"}],
    "rejected": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "8"}],
}


def test_preference_sides_that_repeat_the_prompt_are_read_with_the_prompt_once_as_trl_reads_them(tmp_path):
    """UltraFeedback's layout (a prompt, and chosen/rejected as whole conversations that begin with that prompt's
    turns) is read as TRL's maybe_extract_prompt reads it: the prompt is the run of turns both sides share from
    their start, the sides the rest, for every reader of the examples (training, preview, statistics). Commit
    89b691ae refused it as prompt_repeated (before, training put the prompt before each side: [user: prompt, user:
    prompt, assistant: answer]); a row where one side alone repeats the prompt is still refused, naming that side."""
    preference = ColumnMapping(kind=DatasetKind.PREFERENCE)
    system = {"role": "system", "content": "Be brief."}
    question, seven = ULTRAFEEDBACK_ROW["chosen"]
    multi_turn = {"prompt": "Name a prime.",  # the shared run goes past the prompt's turn: it is the prompt read
                  "chosen": [question, seven, {"role": "user", "content": "Another?"},
                             {"role": "assistant", "content": "11"}],
                  "rejected": [question, seven, {"role": "user", "content": "Another?"},
                               {"role": "assistant", "content": "12"}]}
    path = write_jsonl(tmp_path / "ultra.jsonl", [
        {"prompt": "fine", "chosen": "a", "rejected": "b"},
        ULTRAFEEDBACK_ROW,
        {"prompt": [system, question], "chosen": [system, *ULTRAFEEDBACK_ROW["chosen"]],
         "rejected": [system, *ULTRAFEEDBACK_ROW["rejected"]]},
        multi_turn,
    ])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=preference)
    assert report.ok, report.errors
    assert report.statistics["prompt_read_once"] == {"count": 3, "rows": [2, 3, 4]}
    # Read once, the chats training renders have no turn of one role twice in a row (they had [user, user, ...]).
    assert report.statistics["chat_shapes"]["same_role_twice"] == {"count": 0, "rows": []}
    # The statistics count the prompt once and each side without it (the whole conversations were up to 24).
    lengths = report.statistics["fields"]
    assert (lengths["prompt"]["max"], lengths["chosen"]["max"], lengths["rejected"]["max"]) == (22, 2, 2)
    examples = list(iter_examples(path, fmt=FileFormat.JSONL, mapping=preference))
    assert examples[1] == {"prompt": "Name a prime.", "chosen": [seven], "rejected": [ULTRAFEEDBACK_ROW["rejected"][1]]}
    assert examples[2] == {"prompt": [system, question], "chosen": [seven],
                           "rejected": [ULTRAFEEDBACK_ROW["rejected"][1]]}
    assert examples[3] == {"prompt": multi_turn["chosen"][:3], "chosen": multi_turn["chosen"][3:],
                           "rejected": multi_turn["rejected"][3:]}
    assert [example for _row, example in read_page(path, fmt=FileFormat.JSONL, mapping=preference, offset=1,
                                                   limit=1)] == [examples[1]]  # the preview shows it so
    assert [rendered_chats(example, DatasetKind.PREFERENCE)[0] for example in examples[1:3]] == [
        ULTRAFEEDBACK_ROW["chosen"], [system, *ULTRAFEEDBACK_ROW["chosen"]]]

    # One side alone repeating the prompt: that side is named, as it would read the prompt twice.
    write_jsonl(path, [{**ULTRAFEEDBACK_ROW, "rejected": [{"role": "assistant", "content": "8"}]},
                       {**ULTRAFEEDBACK_ROW, "chosen": "7"},
                       {**ULTRAFEEDBACK_ROW, "chosen": [question]}])
    report = validate_file(path, fmt=FileFormat.JSONL, mapping=preference)
    assert [(issue.code, issue.row, issue.field) for issue in report.errors] == [
        ("prompt_repeated", 1, "chosen"), ("prompt_repeated", 2, "rejected"), ("prompt_repeated", 3, "chosen")]
    assert report.errors[0].message == (
        "starts with the prompt's turn again and 'rejected' does not: training puts the prompt before each side, so "
        "the model would read it twice in 'chosen'; give 'chosen' without the prompt's turns, as 'rejected' is, or "
        "give both as whole conversations that begin with them (UltraFeedback's layout, read with the prompt once, "
        "as TRL does)")
    assert report.errors[2].message.startswith("is the prompt's turn again and nothing after it")
    # Left out, the prompt is not looked for: the rows are whole conversations, trained on their assistant turns.
    left_out = ColumnMapping(kind=DatasetKind.PREFERENCE, columns={"prompt": "no_such_column"})
    write_jsonl(path, [ULTRAFEEDBACK_ROW])
    assert validate_file(path, fmt=FileFormat.JSONL, mapping=left_out).statistics["prompt_read_once"]["count"] == 0
    assert list(iter_examples(path, fmt=FileFormat.JSONL, mapping=left_out)) == [
        {"prompt": None, "chosen": ULTRAFEEDBACK_ROW["chosen"], "rejected": ULTRAFEEDBACK_ROW["rejected"]}]


LONE_SURROGATE = ("half of a character (a lone UTF-16 surrogate: a \\ud800-\\udfff escape without its other half, as "
                  "text cut inside an emoji leaves): remove it, or write the whole character")


@pytest.mark.parametrize(("name", "data", "fmt", "where"), [
    ("rows.jsonl", b'{"prompt": "cut \\ud83d", "completion": "b"}\n', FileFormat.JSONL, (1, 1, "prompt")),
    ("rows.json", b'[{"prompt": "a", "completion": "b"}, {"prompt": "cut \\ud83d", "completion": "b"}]',
     FileFormat.JSON, (1, 2, "prompt")),
    # JSON Lines in a .json file, the escape in its first line: read as an array, the file was "missing 'prompt'"
    # in rows of 'role' and 'content' and "unexpected text after the closing ']'".
    ("lines.json", b'{"prompt": "cut \\ud83d", "completion": "b"}\n{"prompt": "a", "completion": "b"}\n',
     FileFormat.JSON, (1, 1, "prompt")),
    # A CSV messages cell: "must be a list of {role, content} messages, got a string".
    ("rows.csv", b'messages\n"[{""role"": ""user"", ""content"": ""cut \\ud83d""}, '
                 b'{""role"": ""assistant"", ""content"": ""b""}]"\n', FileFormat.CSV, (2, 1, "messages")),
])
def test_a_lone_surrogate_escape_is_named_as_half_a_character(tmp_path, name, data, fmt, where):
    """Audit: text cut inside an emoji written as two escapes ("\\ud83d\\ude00" cut after the first) was, in a
    .jsonl file, "broken JSON: no low surrogate in string: line 1 column 13 (char 12); each line must be one JSON
    object", and in a .json file "holds a value of a type Temper does not keep (str is not valid UTF-8: surrogates
    not allowed): store it as text or a number", advice that does not apply to a string."""
    path = tmp_path / name
    path.write_bytes(data)
    issue = only_error(validate_file(path, fmt=fmt, mapping=SFT))
    lines = name.startswith("lines") or fmt is FileFormat.JSONL
    assert (issue.code, issue.line, issue.row, issue.field) == ("json" if lines else "wrong_type", *where)
    assert issue.message.endswith(LONE_SURROGATE)
    if lines:
        assert issue.message == "broken JSON at column 17: " + LONE_SURROGATE
    if fmt is FileFormat.CSV:
        assert issue.message == "its JSON list holds " + LONE_SURROGATE


def _csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    import csv
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.mark.parametrize(("kind", "header", "cells"), [
    (DatasetKind.SFT, ["prompt", "completion"], ["List two fruits as a JSON array.", '["apple", "banana"]']),
    (DatasetKind.SFT, ["prompt", "completion"], ["Give the fruits as JSON objects.", '[{"name": "apple"}]']),
    (DatasetKind.SFT, ["prompt", "completion"], ["Return an empty JSON array.", "[]"]),
    (DatasetKind.TEXT, ["text"], ['["a", "b"]']),
    (DatasetKind.TEXT, ["text"], ['[{"id": 1}, {"id": 2}]']),
    (DatasetKind.PREFERENCE, ["prompt", "chosen", "rejected"], ["Sort 3, 1, 2 as a JSON array.", "[1, 2, 3]", "[3, 2, 1]"]),
    (DatasetKind.PROMPTS, ["prompt", "answer"], ["[1, 2]", "[1, 2]"]),
])
def test_a_csv_cell_of_json_that_is_no_chat_is_text(tmp_path, kind, header, cells):
    """Audit: every CSV cell that held a JSON list was read as a chat, in text fields too, so an sft answer that is a
    JSON array (structured output: '["apple", "banana"]') failed "must be a string, got a list (a chat?)", a text
    cell '[{"id": 1}]' "must be a string, got a list", and a prompt "[1, 2]" "must be an object with 'role' and
    'content', got a number". Only a list of messages (objects with a role) is a chat; any other cell is its text."""
    path = _csv(tmp_path / "rows.csv", header, [cells])
    mapping = ColumnMapping(kind=kind)
    report = validate_file(path, fmt=FileFormat.CSV, mapping=mapping)
    assert report.ok, report.errors
    example, = iter_examples(path, fmt=FileFormat.CSV, mapping=mapping)
    assert [example[name] for name in header] == cells


def test_a_csv_cell_holding_a_chat_is_still_read_as_one_where_a_text_is_expected(tmp_path):
    """A message list in an sft prompt cell is still named as a chat (the advice to give it as 'messages')."""
    chat = json.dumps([{"role": "user", "content": "q"}])
    issue = only_error(validate_file(_csv(tmp_path / "rows.csv", ["prompt", "completion"], [[chat, "a"]]),
                                     fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.field) == ("wrong_type", "prompt")
    assert "(a chat?)" in issue.message
    # And a preference side written as ShareGPT's turns is named as such, not kept as its JSON text.
    sharegpt = json.dumps([{"from": "gpt", "value": "a"}])
    issue = only_error(validate_file(_csv(tmp_path / "pairs.csv", ["prompt", "chosen", "rejected"],
                                          [["q", sharegpt, "b"]]),
                                     fmt=FileFormat.CSV, mapping=ColumnMapping(kind=DatasetKind.PREFERENCE)))
    assert (issue.code, issue.field) == ("bad_role", "chosen[0]") and "ShareGPT" in issue.message


def test_a_csv_row_of_only_commas_is_a_blank_line(tmp_path):
    """Audit: a spreadsheet saves the empty rows under its table (once formatted, or cleared) as lines of commas
    alone (',' or ', ,'): each was a row of empty strings, "row 2, field 'prompt': is an empty string; give it text or
    drop the row", for rows the user never wrote. Like a blank line, it is skipped (and still counts as a line)."""
    path = tmp_path / "rows.csv"
    path.write_bytes(b",,\r\nprompt,completion\r\na,b\r\n,\r\n , \r\nc,d\r\n,\r\n")  # above the table too
    report = validate_file(path, fmt=FileFormat.CSV, mapping=SFT)
    assert report.ok and report.row_count == 2, report.errors
    assert [(number, example["prompt"]) for number, example in read_page(
        path, fmt=FileFormat.CSV, mapping=SFT, offset=0, limit=5)] == [(1, "a"), (2, "c")]
    path.write_bytes(b"prompt,completion\r\na,b\r\n,\r\n,x\r\n")  # a row with one cell filled is a row
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.line, issue.row, issue.field) == ("empty_string", 4, 2, "prompt")


def test_a_csv_header_ending_with_several_commas_says_so(tmp_path):
    """Audit: 'prompt,completion,,' (a spreadsheet's empty columns at the table's right) was "column 3 of the header
    row has no name; name every column"; one comma there is named as such, and so are several now."""
    path = tmp_path / "rows.csv"
    path.write_bytes(b"prompt,completion,,\r\na,b,,\r\n")
    issue = only_error(validate_file(path, fmt=FileFormat.CSV, mapping=SFT))
    assert (issue.code, issue.line) == ("csv_header", 1)
    assert issue.message == ("the header row ends with 2 commas, which make empty columns 3 to 4 with no name; remove "
                             "the commas at the ends of the lines (or name the columns)")


@pytest.mark.parametrize(("kind", "row"), [
    (DatasetKind.SFT, {"prompt": "a", "completion": "b"}),
    (DatasetKind.SFT, {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
    (DatasetKind.PROMPTS, {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"}),
    (DatasetKind.TEXT, {"text": "Once upon a time."}),
])
def test_a_json_file_of_one_row_on_one_line_is_that_row(tmp_path, kind, row):
    """Audit: a .json file of one row, as json.dump(row, f) writes it (Hugging Face's to_json of a one-row dataset
    too, and its loader reads it as that row), was refused: "the file is an object whose first key, 'prompt', holds a
    string, not a list of rows; ... save the list of rows alone, or as JSON Lines (.jsonl)", which it already was."""
    path = tmp_path / "one.json"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    mapping = ColumnMapping(kind=kind)
    report = validate_file(path, fmt=FileFormat.JSON, mapping=mapping)
    assert report.ok and report.row_count == 1, report.errors
    example, = iter_examples(path, fmt=FileFormat.JSON, mapping=mapping)
    assert example == row if kind is not DatasetKind.PROMPTS else {"answer": "4", "prompt": row["prompt"]}


@pytest.mark.parametrize(("name", "fmt"), [("rows.jsonl", FileFormat.JSONL), ("rows.json", FileFormat.JSON)])
def test_a_csv_file_under_a_json_name_is_named_as_csv(tmp_path, name, fmt):
    """Audit: a CSV file saved under a .jsonl name was a "broken JSON at column 1: Expecting value; each line must
    be one JSON object" problem for each of its lines, and under a .json name "a .json dataset must be one array of
    objects ... but it starts with 'p'": neither said it is CSV (JSON under a .csv name is named as JSON)."""
    path = tmp_path / name
    path.write_text('"prompt","completion"\r\nq,a\r\n', encoding="utf-8")
    issue = only_error(validate_file(path, fmt=fmt, mapping=SFT))
    assert (issue.code, issue.line, issue.row) == ("json", 1, None)
    assert issue.message == ("the first line is not JSON but looks like the header row of a CSV file "
                             "('\"prompt\",\"completion\"'): choose the format CSV (Format on the upload form, file_format in "
                             "the API) or give the file the .csv extension, and upload it again")
