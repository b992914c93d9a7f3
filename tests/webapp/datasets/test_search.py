"""The preview's search read from a version's search index (``webapp.datasets.search``): the same results as
reading the file row by row, which a search did for every query and page; the index built once per version and
built again when what it was built from changes; its files deleted with their version."""
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from jaxengine.data import formats
from webapp.core.name_case import name_key
from webapp.datasets import search, selectors, services


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue: None)


def ready_version(team, rows: list[dict], *, name="searched", kind="sft", filename="rows.jsonl", content=None):
    content = content if content is not None else "".join(json.dumps(row, ensure_ascii=False) + "\n"
                                                          for row in rows).encode()
    version = services.dataset_create_with_upload(project=team.project, name=name, kind=kind,
                                                  upload=SimpleUploadedFile(filename, content), file_format=None,
                                                  column_mapping={}, user=team.teammate)
    version = services.dataset_version_validate(version_id=version.pk)
    assert version.status == "ready", version.errors
    return version


def search_by_reading_the_file(version, text: str, page: int, page_size: int = selectors.PREVIEW_PAGE_SIZE):
    """What a search found before the index: every row of the file read and checked, its values' text compared."""
    mapping = formats.ColumnMapping(kind=formats.DatasetKind(version.dataset.kind), columns=version.column_mapping)
    rows_shown = min(version.row_count, selectors.PREVIEW_MAX_ROW)
    needle = name_key(text)
    matches = [(number, example) for number, example in
               list(formats.numbered_examples(version.absolute_path, fmt=formats.FileFormat(version.format),
                                              mapping=mapping))[:rows_shown]
               if needle in search.searchable_text(example)]
    page_count = max(1, -(-len(matches) // page_size))
    page = min(max(page, 1), page_count)
    kept = matches[(page - 1) * page_size: page * page_size]
    columns = selectors._preview_columns(formats.DatasetKind(version.dataset.kind), [example for _, example in kept])
    rows = tuple((number, tuple(selectors._cell(example.get(column)) for column in columns)) for number, example in kept)
    return selectors.PreviewPage(columns=columns, rows=rows, page=page, page_count=page_count,
                                 rows_previewed=rows_shown, search=text, match_count=len(matches))


SFT_ROWS = [
    *({"prompt": f"Question {number}: what is {number} + {number}?", "completion": str(2 * number)}
      for number in range(1, 60)),
    {"messages": [{"role": "system", "content": "Sei kurz."}, {"role": "user", "content": "Wo ist die STRASSE?"},
                  {"role": "assistant", "content": "Dort drüben."}]},
    {"prompt": "un caf\u00e9 noir", "completion": "voil\u00e0"},
    {"prompt": "line one\nline two", "completion": "tab\there \"quoted\" back\\slash"},
    {"prompt": "x" * 3000 + " needle at the end", "completion": "long"},
    {"prompt": "\u03a3\u039f\u03a6\u0399\u0391", "completion": "\U0001f600 emoji"},
    *({"prompt": f"tail {number}", "completion": "what is left"} for number in range(30)),
]
SEARCHES = ["what is", "QUESTION 1", "1 + 1", "straße", "CAFE\u0301", "line one\nline two", "\"quoted\"",
            "back\\slash", "needle", "x" * 50, "σοφια", "\U0001f600", "?\n2", "2?", "left", "nowhere at all", "t",
            "4\n", "sei kurz.\nwo"]


@pytest.mark.parametrize("chunk_chars", [search.CHUNK_CHARS, 40, 1])
def test_a_search_finds_what_reading_the_file_found(team, monkeypatch, chunk_chars):
    """Differential: for texts that match many rows, one, none, across a value's lines or none but across two rows'
    texts (which must not match), in every letter case and Unicode form, on every page and past the last, the index
    gives the rows, counts and cells the file's rows gave; with chunks of any size (a row longer than a chunk)."""
    monkeypatch.setattr(search, "CHUNK_CHARS", chunk_chars)
    version = ready_version(team, SFT_ROWS)
    for text in SEARCHES:
        for page in (1, 2, 3, 5, 99):
            assert selectors.version_search(version=version, text=text, page=page) == search_by_reading_the_file(
                version, text, page), (text, page)
    # Two rows' texts side by side ("...2\n" of a completion, then "question 3...") hold no match between them.
    assert selectors.version_search(version=version, text="2question", page=1).match_count == 0


def test_other_kinds_and_formats_find_what_reading_the_file_found(team):
    preference = ready_version(team, [{"prompt": f"p{number}", "chosen": f"good {number}", "rejected": "bad"}
                                      for number in range(45)], name="pairs", kind="preference")
    prompts = ready_version(team, [{"prompt": f"What is {number}?", "answer": str(number), "source": "Gen"}
                                   for number in range(45)], name="prompts", kind="prompts")
    table = ready_version(team, [], name="table", filename="rows.csv",
                          content=b'prompt,completion\n"a, b",c\n"multi\nline",GEN\nplain,gen\n')
    for version, texts in ((preference, ["good 1", "bad", "P4"]), (prompts, ["what is 4", "gen", "4?"]),
                           (table, ["a, b", "multi\nline", "gen"])):
        for text in texts:
            for page in (1, 2, 3):
                assert selectors.version_search(version=version, text=text, page=page) == \
                    search_by_reading_the_file(version, text, page), (version.dataset.name, text, page)


def test_the_index_is_built_once_and_again_when_its_row_limit_changes(team, monkeypatch):
    version = ready_version(team, SFT_ROWS)
    assert not version.search_index_path.exists()
    selectors.version_search(version=version, text="what is", page=1)
    built = version.search_index_path.stat().st_mtime_ns, version.search_index_path.stat().st_ino
    read, real = [], formats.numbered_examples
    monkeypatch.setattr(formats, "numbered_examples",
                        lambda *args, **kwargs: read.append(args) or real(*args, **kwargs))
    assert selectors.version_search(version=version, text="tail", page=2).match_count == 30
    assert read == []  # answered from the index: the file is not read again
    assert (version.search_index_path.stat().st_mtime_ns, version.search_index_path.stat().st_ino) == built
    monkeypatch.setattr(selectors, "PREVIEW_MAX_ROW", 10)
    limited = selectors.version_search(version=version, text="what is", page=1)
    assert limited.match_count == 10 and limited.rows_previewed == 10 and len(read) == 1
    assert limited == search_by_reading_the_file(version, "what is", 1)


def test_values_json_cannot_give_back_are_searched_in_the_file(team, monkeypatch):
    """A row whose example does not come back from JSON as it was (here a tuple, as a Parquet file's values may be
    dates or bytes) would be shown otherwise from the index: the version's searches read its file, as before."""
    version = ready_version(team, SFT_ROWS[:5])
    real = formats.numbered_examples

    def with_a_tuple(*args, **kwargs):
        for number, example in real(*args, **kwargs):
            yield number, ({**example, "completion": ("as", "tuple")} if number == 2 else example)

    monkeypatch.setattr(formats, "numbered_examples", with_a_tuple)
    found = selectors.version_search(version=version, text="tuple", page=1)
    assert [number for number, _ in found.rows] == [2] and found.rows[0][1][1].type == "json"
    assert json.loads(version.search_index_path.read_text().splitlines()[0])["exact"] is False
    assert selectors.version_search(version=version, text="question 1", page=1).match_count == 1


def test_the_index_goes_with_its_version_and_dataset(team, django_capture_on_commit_callbacks):
    version = ready_version(team, SFT_ROWS)
    selectors.version_search(version=version, text="what is", page=1)
    paths = [version.search_index_path, version.search_rows_path]
    assert all(path.is_file() for path in paths)
    folder = version.absolute_path.parent
    with django_capture_on_commit_callbacks(execute=True):
        services.dataset_delete(dataset=version.dataset)
    assert not any(path.exists() for path in paths) and not folder.exists()
