"""The validator's quicker paths (bench/RESULTS.md, "Dataset validation") against the code they replaced: random and
hostile rows and files read both ways give identical reports, every error's line, row, field and words alike.

The replaced code is kept here, as it was (c51fc74), only where a reader or a statistic was restructured; each test
puts it back into ``formats`` for the "before" reading (``monkeypatch``), so everything else is shared."""
import codecs
import csv
import json
import random
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from jaxengine.data import formats
from jaxengine.data.formats import (
    ColumnMapping,
    DatasetFormatError,
    DatasetKind,
    FileFormat,
    Issue,
    RawRow,
    validate_file,
)

# --------------------------------------------------------------------------------------------
# The code as it was


def _bounded_lines_before(handle, *, code: str) -> Iterator[bytes]:
    number = 0
    while raw := handle.readline(formats.MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > formats.MAX_LINE_BYTES:
            raise formats._line_too_long(raw, number, code=code)
        yield raw


def _decoded_lines_before(handle, on_line) -> Iterator[str]:
    offset = 0
    number = 0
    for raw in _bounded_lines_before(handle, code="csv"):
        number += 1
        on_line(number, offset)
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8):]
            offset += len(codecs.BOM_UTF8)
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetFormatError(
                formats._encoding_issue(line=number, line_offset=exc.start, file_offset=offset + exc.start)
            ) from None
        offset += len(raw)


def _iter_csv_before(path: Path) -> Iterator[RawRow | Issue]:
    position = {"line": 0}

    def on_line(number: int, _offset: int) -> None:
        position["line"] = number

    first_line = 1
    previous_limit = csv.field_size_limit(formats.MAX_CSV_CELL_CHARS)
    with open(path, "rb") as handle:
        reader = csv.reader(_decoded_lines_before(handle, on_line), strict=True)
        try:
            header = None
            while header is None or formats._blank_csv_row(header):
                header = next(reader, None)
                if header is None:
                    raise DatasetFormatError(Issue(code="empty_file", message="the CSV file holds only spaces and "
                                                   "blank lines: give the file that holds the header row and rows"))
            header_line = position["line"]
            header = [name.strip() for name in header]
            if header[0].startswith(("{", "[")):
                raise DatasetFormatError(Issue(
                    code="csv_header", line=header_line,
                    message="the first line is JSON, not a CSV header row: the file looks like JSON Lines (or a "
                            "JSON array); give it the .jsonl (or .json) extension and upload it again"))
            formats._check_other_separator(header, line=header_line)
            formats._check_csv_header(header, line=header_line)
            row = 0
            while True:
                first_line = position["line"] + 1
                cells = next(reader, None)
                if cells is None:
                    return
                if formats._blank_csv_row(cells):
                    continue
                row += 1
                if len(cells) != len(header):
                    yield Issue(
                        code="ragged_row",
                        message=f"this row has {formats._counted(len(cells), 'cell')} but the header has "
                        f"{formats._counted(len(header), 'column')}; "
                        "quote cells that contain commas or line breaks",
                        line=first_line,
                        row=row,
                    )
                    continue
                if [cell.strip() for cell in cells] == header:
                    yield Issue(code="csv_header", line=first_line, row=row,
                                message="this row repeats the header row: the file may be several CSV files joined "
                                        "together; remove the repeated header")
                    continue
                yield RawRow(row=row, line=first_line, value=dict(zip(header, cells)))
        except csv.Error as exc:
            raise DatasetFormatError(formats._csv_issue(exc, first_line=first_line, line=position["line"])) from None
        finally:
            csv.field_size_limit(previous_limit)


def _skip_whitespace_before(self) -> None:
    while True:
        end = formats._WHITESPACE.match(self._buffer, self._position).end()
        self._line += self._buffer.count("\n", self._position, end)
        self._position = end
        if end < len(self._buffer) or not self._fill():
            return


def _array_pairs_to_object_before(self, pairs):
    value = formats._pairs_to_object(pairs)
    self._keys_repeated |= type(value) is formats._KeysRepeated
    return value


def _chars_before(value):
    if type(value) is str:
        return len(value)
    if type(value) is list:
        return sum(len(message["content"]) for message in value)
    return 0


def _has_assistant_turn_before(chat: list) -> bool:
    return any(type(message) is dict and message.get("role") == "assistant" for message in chat)


def _is_same_response_before(first, second) -> bool:
    def comparable(response):
        if isinstance(response, list):
            return [(turn.get("role"), str(turn.get("content") or "").strip()) for turn in response]
        return str(response or "").strip()

    return comparable(first) == comparable(second)


def _as_chat_before(value, role: str) -> list[dict]:
    return [{"role": role, "content": value}] if type(value) is str else list(value)


def _chat_shapes_add_before(self, example, row: int) -> None:
    found: set[str] = set()
    for chat in formats.rendered_chats(example, self.kind):
        found |= formats.chat_shapes(chat)
    for shape in found:
        self.counts[shape] += 1
        if len(self.rows[shape]) < formats.ROWS_SHOWN:
            self.rows[shape].append(row)


def _prompts_example_before(value: dict, prompt, prompt_column: str) -> tuple[dict, list]:
    """check_record's end for the prompts kind, after its prompt's checks."""
    problems: list = []
    for key, item in value.items():
        if type(item) is str and key != prompt_column:
            formats._check_no_nul(item, key, problems)
    if problems:
        return None, problems
    example = {key: item for key, item in value.items() if key != prompt_column}
    example["prompt"] = prompt
    return example, problems


def put_back_the_code_before(monkeypatch) -> None:
    # The reader now takes the source its advice is worded for (a JSON file read as CSV); the old one had none.
    monkeypatch.setattr(formats, "_iter_csv", lambda path, source: _iter_csv_before(path))
    monkeypatch.setattr(formats._JsonArrayReader, "_skip_whitespace", _skip_whitespace_before)
    monkeypatch.setattr(formats._JsonArrayReader, "_pairs_to_object", _array_pairs_to_object_before)
    monkeypatch.setattr(formats, "_chars", _chars_before)
    monkeypatch.setattr(formats, "_has_assistant_turn", _has_assistant_turn_before)
    monkeypatch.setattr(formats, "is_same_response", _is_same_response_before)
    monkeypatch.setattr(formats, "_as_chat", _as_chat_before)
    monkeypatch.setattr(formats.ChatShapes, "add", _chat_shapes_add_before)


# --------------------------------------------------------------------------------------------
# Random and hostile rows

TEXTS = ["a", " a ", "a\n", "", " ", "\t", "x\x00y", "same", " same", "same ", "he said \"hi\", then left",
         "two\nlines", "back\\slash", "日本語", "comma, inside", "{\"k\": 1}", "'quoted'", "\r"]
ROLES = ["user", "assistant", "system", "User", "gpt", "tool", None, 3]


def a_text(rng: random.Random) -> str:
    return rng.choice(TEXTS) if rng.random() < 0.5 else " ".join(rng.choices(["w", "v", "u"], k=rng.randint(1, 6)))


def a_turn(rng: random.Random, role=None):
    roll = rng.random()
    if roll < 0.04:
        return rng.choice(["a turn", 7, None, ["user", "x"]])
    turn = {"role": role if role is not None else rng.choice(ROLES), "content": a_text(rng)}
    if roll < 0.1:
        del turn[rng.choice(["role", "content"])]
    elif roll < 0.14:
        turn["content"] = rng.choice([None, 5, [{"type": "text", "text": "x"}]])
    elif roll < 0.17:
        turn["tool_calls"] = [{"name": "f"}]
    return turn


def a_chat(rng: random.Random) -> list:
    if rng.random() < 0.6:  # the usual shapes, and the one-sided one, most often
        roles = rng.choice([["user", "assistant"], ["system", "user", "assistant"], ["user"],
                            ["user", "assistant", "user", "assistant"], ["assistant", "user", "assistant"],
                            ["user", "system", "assistant"], ["user", "user", "assistant"]])
        return [{"role": role, "content": a_text(rng)} for role in roles]
    return [a_turn(rng) for _ in range(rng.randint(0, 4))]


def a_value(rng: random.Random):
    roll = rng.random()
    if roll < 0.55:
        return a_text(rng)
    if roll < 0.85:
        return a_chat(rng)
    return rng.choice([None, 1, 2.5, True, {"role": "user"}, []])


def a_preference_row(rng: random.Random) -> dict:
    row = {}
    prompt = rng.random()
    if prompt < 0.6:
        row["prompt"] = a_text(rng) if rng.random() < 0.8 else a_chat(rng)
    elif prompt < 0.65:
        row["prompt"] = None
    chosen = a_value(rng)
    # A pair that says the same, or differs by spaces or in a turn other than the last, often enough.
    roll = rng.random()
    if roll < 0.2:
        rejected = json.loads(json.dumps(chosen))
    elif roll < 0.3 and type(chosen) is str:
        rejected = f" {chosen}\n"
    elif roll < 0.45 and type(chosen) is list and chosen and all(type(turn) is dict for turn in chosen):
        rejected = json.loads(json.dumps(chosen))
        rejected[rng.randrange(len(rejected))]["content"] = rng.choice(["other", " same", None])
    else:
        rejected = a_value(rng)
    row["chosen"], row["rejected"] = chosen, rejected
    for side in ("chosen", "rejected"):
        if rng.random() < 0.05:
            del row[side]
    return row


def a_prompts_row(rng: random.Random) -> dict:
    row = {}
    for key in rng.sample(["prompt", "question", "answer", "id", "source", "notes"], k=rng.randint(1, 5)):
        row[key] = rng.choice([a_text(rng), a_text(rng), rng.randint(0, 9), None, a_chat(rng), ["a", "b"]])
    return row


def a_sft_row(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        return {"messages": a_chat(rng)}
    return {key: a_value(rng) for key in rng.sample(["prompt", "completion", "Prompt", "text"], k=rng.randint(1, 3))}


ROWS = {DatasetKind.PREFERENCE: a_preference_row, DatasetKind.PROMPTS: a_prompts_row, DatasetKind.SFT: a_sft_row}


def reports_before_and_after(monkeypatch, path: Path, fmt: FileFormat, mapping: ColumnMapping):
    def read() -> dict:
        report = validate_file(path, fmt=fmt, mapping=mapping, max_errors=10_000)
        return {"rows": report.row_count, "error_count": report.error_count,
                "errors": [issue.to_dict() for issue in report.errors], "statistics": report.statistics,
                "columns": report.columns, "digests": report.row_digests}

    after = read()
    with monkeypatch.context() as before:
        put_back_the_code_before(before)
        return read(), after


# --------------------------------------------------------------------------------------------
# The tests


@pytest.mark.parametrize("kind", [DatasetKind.PREFERENCE, DatasetKind.PROMPTS, DatasetKind.SFT])
@pytest.mark.parametrize("valid", [True, False])
def test_jsonl_files_of_random_rows_get_the_same_report(tmp_path, monkeypatch, kind, valid):
    """Statistics (lengths, one-sided chats, identical pairs, chat shapes) are kept only for a file with no error:
    ``valid`` keeps the rows check_record passes, so that they are compared too."""
    rng = random.Random(f"{kind}{valid}")
    mapping = ColumnMapping(kind=kind, columns={"prompt": "question"} if kind is DatasetKind.PROMPTS and valid else {})
    rows = []
    while len(rows) < 3000:
        row = ROWS[kind](rng)
        if not valid or formats.check_record(row, mapping=mapping)[0] is not None:
            rows.append(row)
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    before, after = reports_before_and_after(monkeypatch, path, FileFormat.JSONL, mapping)
    assert after == before
    assert after["error_count"] == 0 if valid else after["error_count"] > 500


def test_prompts_examples_are_built_as_before():
    """Their reference columns (all but the prompt's) in the row's order, the prompt last as 'prompt'; a NUL in a
    reference text is named, and a mapped prompt column beside a column named 'prompt' is kept apart."""
    rng = random.Random(11)
    for columns in ({}, {"prompt": "question"}):
        mapping = ColumnMapping(kind="prompts", columns=columns)
        prompt_column = mapping.column_for("prompt")
        for _ in range(3000):
            row = a_prompts_row(rng)
            if row.get(prompt_column) is None:
                continue  # a missing prompt's problem is told before any of this
            problems = []
            formats._check_text_or_messages(row[prompt_column], "prompt", problems)
            example, more = _prompts_example_before(row, row[prompt_column], prompt_column)
            expected = (None if problems or more else example), problems + more
            found = formats.check_record(row, mapping=mapping)
            assert found == expected and list(found[0] or ()) == list(expected[0] or ()), row


def test_is_same_response_answers_as_before_for_any_pair():
    """The review campaigns ask it of two models' answers, texts or chats, as well as of datasets' rows."""
    rng = random.Random(5)
    answered = []
    for _ in range(5000):
        row = a_preference_row(rng)
        first, second = row.get("chosen"), row.get("rejected")
        try:
            expected = _is_same_response_before(first, second)
        except AttributeError:  # a list of something other than turns: only checked rows' chats reach it
            continue
        assert formats.is_same_response(first, second) == expected, (first, second)
        answered.append(expected)
    assert 300 < sum(answered) < len(answered) - 300


def hostile_csv_lines(rng: random.Random, header: list[str]) -> bytes:
    text_cells = ["a", " a ", "", " ", "a,b", 'he said "hi"', "two\nlines", "日本語", "x\r\ny",
                  '[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]', "[not json", "\t"]
    out = []
    if rng.random() < 0.1:
        out.append(codecs.BOM_UTF8.decode())
    if rng.random() < 0.2:
        out.append(rng.choice(["\n", " \n", "\r\n"]))
    spaced = [f" {name}" if rng.random() < 0.1 else name for name in header]
    out.append(",".join(spaced) + rng.choice(["\n", "\r\n"]))
    lines = []
    for _ in range(rng.randint(1, 60)):
        roll = rng.random()
        if roll < 0.04:
            lines.append(rng.choice(["\n", "  \n", "\r\n", ",".join(header) + "\n", ", ".join(header) + "\n", f" {header[0]}," + ",".join(header[1:]) + "\n",
                                     '"unclosed,' + "x\n", '"a"b,c\n', "a\rb,c\n", "a,b,c,d,e\n", "only\n"]))
            continue
        cells = [rng.choice(text_cells) for _ in header]
        if roll < 0.08:
            cells = cells[:-1]
        if roll < 0.1 and cells:
            cells[0] = header[0]
        buffer = _CsvLine()
        csv.writer(buffer, lineterminator=rng.choice(["\n", "\r\n"])).writerow(cells)
        lines.append(buffer.text)
    out.extend(lines)
    data = "".join(out).encode()
    if rng.random() < 0.05:
        cut = rng.randrange(len(data))
        data = data[:cut] + b"\xff" + data[cut:]
    return data


class _CsvLine:
    text = ""

    def write(self, text: str) -> None:
        self.text += text


@pytest.mark.parametrize("kind", [DatasetKind.SFT, DatasetKind.PREFERENCE, DatasetKind.PROMPTS])
def test_csv_files_of_hostile_lines_get_the_same_report(tmp_path, monkeypatch, kind):
    """Line numbers, now the csv reader's line_num, against the reader that kept them from a callback on each line:
    quoted line breaks, blank lines, repeated headers, ragged rows, quoting mistakes, bad bytes, a BOM."""
    rng = random.Random(str(kind))
    header = {DatasetKind.SFT: ["prompt", "completion"], DatasetKind.PREFERENCE: ["prompt", "chosen", "rejected"],
              DatasetKind.PROMPTS: ["prompt", "answer"]}[kind]
    codes = set()
    for number in range(250):
        path = tmp_path / f"rows{number}.csv"
        path.write_bytes(hostile_csv_lines(rng, header))
        before, after = reports_before_and_after(monkeypatch, path, FileFormat.CSV, ColumnMapping(kind=kind))
        assert after == before, path.read_bytes()
        codes |= {error["code"] for error in after["errors"]}
    assert {"csv", "ragged_row", "csv_header", "encoding", "empty_string"} <= codes


def hostile_json_array(rng: random.Random, kind: DatasetKind) -> bytes:
    def space() -> str:
        return rng.choice(["", "", " ", "\n", "\n  ", "\r\n", "\t"])

    elements = []
    for _ in range(rng.randint(1, 40)):
        text = json.dumps(ROWS[kind](rng), ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2]))
        roll = rng.random()
        if roll < 0.03 and text.startswith("{"):  # a key given twice
            text = '{"k": 1, "k": 2' + (", " if text != "{}" else "") + text[1:]
        elif roll < 0.05:
            text = text[:-1]  # cut short
        elif roll < 0.06:
            text = text.replace(": ", ": NaN, \"x\": ", 1)
        elements.append(space() + text + space())
    body = "[" + ",".join(elements) + rng.choice(["]", "]\n", ",]", "", "] x"])
    if rng.random() < 0.2:
        body = '{"data": ' + body + "}"
    return body.encode()


@pytest.mark.parametrize("kind", [DatasetKind.SFT, DatasetKind.PREFERENCE, DatasetKind.PROMPTS])
def test_json_arrays_of_hostile_elements_get_the_same_report(tmp_path, monkeypatch, kind):
    rng = random.Random(f"array {kind}")
    codes = set()
    for number in range(150):
        path = tmp_path / f"rows{number}.json"
        path.write_bytes(hostile_json_array(rng, kind))
        before, after = reports_before_and_after(monkeypatch, path, FileFormat.JSON, ColumnMapping(kind=kind))
        assert after == before, path.read_bytes()
        codes |= {error["code"] for error in after["errors"]}
    assert {"json", "duplicate_key"} <= codes


def test_a_json_array_past_its_first_chunk_gets_the_same_report(tmp_path, monkeypatch):
    """Elements that run past the reader's 1 MB chunk, on one line and on many, with a broken one after them:
    its line and column are counted across chunks as before."""
    rng = random.Random(3)
    for indent in (None, 2):
        rows = [{"prompt": "日本語 " * rng.randint(1, 500), "completion": "c" * rng.randint(1, 5000)} for _ in range(1000)]
        text = json.dumps(rows, indent=indent)
        path = tmp_path / f"long{indent}.json"
        path.write_text(text[:-1] + ', {"prompt": "a", "completion": "b",}]', encoding="utf-8")
        before, after = reports_before_and_after(monkeypatch, path, FileFormat.JSON, ColumnMapping(kind="sft"))
        assert path.stat().st_size > 2 * 1024 * 1024 and after == before and after["error_count"] == 1


@pytest.mark.parametrize("kind", [DatasetKind.SFT, DatasetKind.PREFERENCE])
@pytest.mark.parametrize("cells_are_strings", [False, True])
def test_rows_of_plain_texts_pass_as_the_full_checks_pass_them(monkeypatch, kind, cells_are_strings):
    """A pair (sft) or a triple (preference) of texts is passed without the checks' loop when none of its texts is
    empty, only spaces or holds a NUL: with that quick path shut, every row gets the same example and problems."""
    rng = random.Random(f"plain {kind} {cells_are_strings}")
    rows = [ROWS[kind](rng) for _ in range(4000)]
    if cells_are_strings:  # a CSV row: every cell a text, a chat as its JSON
        rows = [{key: value if type(value) is str else json.dumps(value) for key, value in row.items()} for row in rows]
    mapping = ColumnMapping(kind=kind)
    quick = [formats.check_record(row, mapping=mapping, cells_are_strings=cells_are_strings) for row in rows]
    monkeypatch.setattr(formats, "_is_plain_text", lambda value: False)
    assert [formats.check_record(row, mapping=mapping, cells_are_strings=cells_are_strings) for row in rows] == quick
    passed = [example for example, _problems in quick if example is not None]
    assert len(passed) > 200 and len(passed) < len(rows) - 1000
