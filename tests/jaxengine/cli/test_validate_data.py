"""``jaxengine validate-data``: exit codes, compiler-style problems, statistics, mapping."""
import json

from jaxengine.cli import main


def test_a_valid_file(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "q", "answer": "abc"}\n', encoding="utf-8")
    code = main(["validate-data", str(path), "--kind", "sft", "--map", "prompt=question", "--map", "completion=answer"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"{path}: ok, 1 row" in out and "  completion: mean 3.0, p50 3, p90 3, max 3 characters" in out


def test_problems_are_listed_with_file_and_line(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n' + '{"prompt": 1, "completion": "b"}\n' * 3,
                    encoding="utf-8")
    code = main(["validate-data", str(path), "--kind", "sft", "--max-errors", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert lines[0].startswith(f"{path}:2: row 2, field 'completion': missing 'completion'")
    assert lines[0].endswith("[missing_field]")
    assert lines[1] == (f"{path}:3: row 3, field 'prompt': must be a string, got a number: write it as text, in quotes "
                        '("1") [wrong_type]')
    assert lines[2] == f"{path}: 4 problems (first 2 shown)"


def test_json_output(tmp_path, capsys):
    path = tmp_path / "rows.csv"
    path.write_text("text\nhello\n", encoding="utf-8")
    assert main(["validate-data", str(path), "--kind", "text", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["ok"], result["rows"], result["format"]) == (True, 1, "csv")
    assert result["statistics"]["fields"]["text"]["max"] == 5


def test_usage_errors(tmp_path, capsys):
    path = tmp_path / "rows.txt"
    path.write_text("x", encoding="utf-8")
    assert main(["validate-data", str(path), "--kind", "sft"]) == 2
    assert "cannot tell the format of 'rows.txt'" in capsys.readouterr().err
    assert main(["validate-data", str(path), "--kind", "sft", "--format", "jsonl", "--map", "prompt"]) == 2
    assert "write FIELD=COLUMN" in capsys.readouterr().err
    assert main(["validate-data", str(tmp_path / "missing.jsonl"), "--kind", "sft"]) == 2
    assert "no such file" in capsys.readouterr().err
    # QA: a directory was said not to exist, as eval and train say it is one
    assert main(["validate-data", str(tmp_path), "--kind", "sft"]) == 2
    assert capsys.readouterr().err == f"jaxengine validate-data: error: {tmp_path}: is a directory, not a file\n"
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": 1}\n', encoding="utf-8")
    assert main(["validate-data", str(rows), "--kind", "sft", "--max-errors", "-1"]) == 2
    assert capsys.readouterr().err == "jaxengine validate-data: error: --max-errors must be 0 (count only) or more, got -1\n"


def test_whole_file_problems_are_told_in_words_that_fit_the_command_line(tmp_path, capsys):
    """QA: an empty file was told to 'upload a file with rows': the checks are the upload form's, but their
    messages reach the command line too."""
    empty, no_rows, parquet = tmp_path / "empty.jsonl", tmp_path / "none.json", tmp_path / "rows.jsonl"
    empty.write_bytes(b"")
    no_rows.write_text("[]", encoding="utf-8")
    parquet.write_bytes(b"PAR1" + b"\x00" * 16)
    expected = {
        empty: f"{empty}: the file is empty (0 bytes); give the file that holds the rows [empty_file]",
        no_rows: f"{no_rows}: the file has no rows; give a file with at least one record [empty_file]",
        parquet: f"{parquet}: this looks like a Parquet file: give it a .parquet extension [binary]",
    }
    for path, line in expected.items():
        assert main(["validate-data", str(path), "--kind", "sft"]) == 1
        assert capsys.readouterr().out.splitlines()[0] == line



def test_a_field_mapped_twice_is_refused_naming_both_columns(tmp_path, capsys):
    """QA: `--map prompt=a --map prompt=b` kept the last without a word, and the file was then checked against a
    column the user had not meant: the row problem named only 'b' (eval reads --map through the same parser)."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": "x", "completion": "y"}\n', encoding="utf-8")
    assert main(["validate-data", "--kind", "sft", str(path), "--map", "prompt=a", "--map", "prompt=b"]) == 2
    assert capsys.readouterr().err == ("jaxengine validate-data: error: --map maps 'prompt' twice ('a', then 'b'); a "
                                       "field is read from one column: keep the --map you mean\n")
    assert main(["validate-data", "--kind", "sft", str(path), "--map", "prompt=a", "--map", "prompt=a"]) == 0


def test_advice_names_the_flags_of_validate_data(tmp_path, capsys):
    """Session-33 audit: the advice listed the upload form's fields, the API's and a job spec's beside the flags."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "q", "answer": "a"}\n{"prompt": "q", "chosen": "a", "rejected": "b"}\n'
                    '[{"prompt": "q"}]\n', encoding="utf-8")
    assert main(["validate-data", str(path), "--kind", "sft"]) == 1
    out = capsys.readouterr().out
    assert "(map a differently named column to it: --map FIELD=COLUMN)" in out
    assert "if the file holds preference rows, check it with --kind preference" in out
    for elsewhere in ("upload", " API", "data.columns"):
        assert elsewhere not in out
    (tmp_path / "rows.txt").write_text('{"text": "a"}\n', encoding="utf-8")
    assert main(["validate-data", str(tmp_path / "rows.txt"), "--kind", "text"]) == 2
    assert capsys.readouterr().err.endswith(", or give its format with --format\n")


def test_a_lone_surrogate_escape_in_a_csv_messages_cell_is_named_by_file_line_and_field(tmp_path, capsys):
    """A CSV messages cell whose JSON held half of a character ("\\ud83d" cut from its "\\ude00") was called
    "must be a list of {role, content} messages, got a string", which it is, written as JSON."""
    path = tmp_path / "chats.csv"
    path.write_text('messages\n"[{""role"": ""user"", ""content"": ""cut \\ud83d""}, '
                    '{""role"": ""assistant"", ""content"": ""b""}]"\n', encoding="utf-8")
    assert main(["validate-data", str(path), "--kind", "sft"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{path}:2: row 1, field 'messages': its JSON list holds half of a character (a lone UTF-16 surrogate: a "
        "\\ud800-\\udfff escape without its other half, as text cut inside an emoji leaves): remove it, or write "
        "the whole character [wrong_type]")
