"""Comparing two versions of a dataset: rows unchanged, removed and added as multisets of their row digests
(``selectors.row_differences``), versions read with different column mappings compared as training reads them,
the rows a page shows read back by number, and the comparison page and its REST twin (``api:dataset_compare``)."""
import collections
import csv
import io
import json

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from webapp.api.services import token_create
from webapp.datasets import selectors, services
from webapp.datasets.models import VersionStatus


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue: None)


@pytest.fixture(autouse=True)
def fresh_cache():
    """Each test's versions are compared from their files, not from what an earlier test's left in the cache."""
    selectors._version_differences.cache_clear()
    yield
    selectors._version_differences.cache_clear()


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()


def upload(team, content: bytes, *, dataset=None, name="qa", kind="sft", filename="rows.jsonl", mapping=None,
           validate=True):
    """A version of ``dataset`` (a new dataset ``name`` when None) uploaded and, unless told not to, checked."""
    arguments = {"upload": SimpleUploadedFile(filename, content), "file_format": None,
                 "column_mapping": mapping or {}, "user": team.teammate}
    if dataset is None:
        version = services.dataset_create_with_upload(project=team.project, name=name, kind=kind, **arguments)
    else:
        version = services.dataset_version_create(dataset=dataset, **arguments)
    if not validate:
        return version
    version = services.dataset_version_validate(version_id=version.pk)
    assert version.status == VersionStatus.READY, version.errors
    return version


def pair(number: int) -> dict:
    return {"prompt": f"question {number}", "completion": f"answer {number}"}


def multiset_differences(a: list[int], b: list[int]) -> tuple[int, int, int]:
    """(unchanged, removed, added) counted the plain way, by Counter: what the numpy version must agree with."""
    count_a, count_b = collections.Counter(a), collections.Counter(b)
    return sum((count_a & count_b).values()), sum((count_a - count_b).values()), sum((count_b - count_a).values())


class TestRowDifferences:
    def test_duplicates_count_as_often_as_they_occur(self):
        # A: 1 once, 2 twice, 3 three times; B: 3 twice, 2 once, 4 once.
        differences = selectors.row_differences(np.array([1, 2, 2, 3, 3, 3], dtype=np.uint64),
                                                np.array([3, 2, 4, 3], dtype=np.uint64))
        assert differences.unchanged == 3  # one 2, two 3s
        assert differences.removed.tolist() == [1, 3, 6]  # the 1; the later 2; the third 3
        assert differences.added.tolist() == [3]  # the 4

    def test_a_row_twice_in_a_and_once_in_b_is_one_removed(self):
        differences = selectors.row_differences(np.array([7, 7], dtype=np.uint64), np.array([7], dtype=np.uint64))
        assert (differences.unchanged, differences.removed.tolist(), differences.added.tolist()) == (1, [2], [])

    def test_an_empty_version(self):
        empty, rows = np.zeros(0, dtype=np.uint64), np.array([5, 5, 9], dtype=np.uint64)
        assert selectors.row_differences(empty, rows).added.tolist() == [1, 2, 3]
        assert selectors.row_differences(rows, empty).removed.tolist() == [1, 2, 3]
        assert selectors.row_differences(empty, empty).unchanged == 0

    def test_it_agrees_with_counting_by_hand_on_many_rows(self):
        generator = np.random.default_rng(7)
        a = generator.integers(0, 300, size=5000).astype(np.uint64)
        b = generator.integers(100, 400, size=4000).astype(np.uint64)
        differences = selectors.row_differences(a, b)
        unchanged, removed, added = multiset_differences(a.tolist(), b.tolist())
        assert (differences.unchanged, len(differences.removed), len(differences.added)) == (unchanged, removed, added)
        # The rows named are those: what is left of A after the removed rows is what is left of B after the added.
        kept_a = np.delete(a, differences.removed - 1)
        kept_b = np.delete(b, differences.added - 1)
        assert sorted(kept_a.tolist()) == sorted(kept_b.tolist())


class TestVersionDifferences:
    def test_versions_read_from_other_columns_compare_as_training_reads_them(self, team):
        """v1 is JSONL with question/answer mapped to prompt/completion; v2 a CSV of prompt/completion: the same
        rows, told apart only by what changed."""
        first = upload(team, jsonl([{"question": f"question {n}", "answer": f"answer {n}"} for n in (1, 2, 3, 3)]),
                       mapping={"prompt": "question", "completion": "answer"})
        text = io.StringIO()
        writer = csv.writer(text)
        writer.writerow(["prompt", "completion"])
        writer.writerows([[f"question {n}", f"answer {n}"] for n in (2, 3, 4)])
        second = upload(team, text.getvalue().encode(), dataset=first.dataset, filename="rows.csv")
        differences = selectors.version_differences(a=first, b=second)
        assert differences.unchanged == 2  # 2 and one 3
        assert differences.removed.tolist() == [1, 4]  # 1, and the second 3
        assert differences.added.tolist() == [3]  # 4

    def test_a_version_validated_before_digests_were_kept_is_read_from_its_file(self, team):
        first = upload(team, jsonl([pair(1), pair(2)]))
        second = upload(team, jsonl([pair(2), pair(3)]), dataset=first.dataset)
        first.row_digests_path.unlink()
        differences = selectors.version_differences(a=first, b=second)
        assert (differences.unchanged, differences.removed.tolist(), differences.added.tolist()) == (1, [1], [2])

    def test_rows_are_read_back_by_number_from_the_index_and_past_it(self, team, monkeypatch):
        rows = [pair(number) for number in range(1, 31)]
        version = upload(team, jsonl(rows))
        monkeypatch.setattr(selectors, "PREVIEW_MAX_ROW", 10)  # rows 11 on are past the search index
        found = selectors.rows_by_number(version=version, numbers=[2, 9, 10, 11, 25, 30])
        assert found == [(number, rows[number - 1]) for number in (2, 9, 10, 11, 25, 30)]
        assert version.search_index_path.exists()  # the first rows came from the index

    def test_a_page_of_differences_renders_as_the_preview_does(self, team):
        first = upload(team, jsonl([pair(1), pair(2)]))
        second = upload(team, jsonl([pair(1), {"prompt": "<script>x</script>", "completion": "y"}]),
                        dataset=first.dataset)
        differences = selectors.version_differences(a=first, b=second)
        page = selectors.difference_page(version=second, rows=differences.added, page=5)
        assert page.page == page.page_count == 1 and page.columns == ("prompt", "completion")
        number, cells = page.rows[0]
        assert number == 2 and cells[0].text == "<script>x</script>"


class TestComparisonVersions:
    def test_by_default_the_latest_ready_version_against_the_ready_one_before_it(self, team):
        first = upload(team, jsonl([pair(1)]))
        second = upload(team, jsonl([pair(2)]), dataset=first.dataset)
        upload(team, b'{"prompt": 5}\n', dataset=first.dataset, validate=False)  # v3: waiting for its check
        third = upload(team, jsonl([pair(3)]), dataset=first.dataset)
        dataset = first.dataset
        assert selectors.comparison_versions(dataset=dataset, a=None, b=None) == (second, third)
        assert selectors.comparison_versions(dataset=dataset, a=None, b="2") == (first, second)
        assert selectors.comparison_versions(dataset=dataset, a="1", b=None) == (first, third)

    def test_it_rejects_what_cannot_be_compared(self, team):
        from django.core.exceptions import ValidationError
        from django.http import Http404

        first = upload(team, jsonl([pair(1)]))
        waiting = upload(team, jsonl([pair(2)]), dataset=first.dataset, validate=False)
        dataset = first.dataset
        dataset.refresh_from_db()  # its last version number, as a request reads it

        def refusal(a, b):
            with pytest.raises((ValidationError, Http404)) as caught:
                selectors.comparison_versions(dataset=dataset, a=a, b=b)
            return caught.value

        assert refusal("abc", None).message_dict == {
            "a": ["\u2068abc\u2069 is not a version number; give a as a number such as a=1 for v1"]}
        assert refusal("1", "1").message_dict == {"b": ["a and b are both v1: choose two different versions"]}
        assert refusal("1", str(waiting.number)).message_dict == {
            "b": ["v2 is waiting for its check: only ready versions can be compared; wait for its check to end"]}
        assert refusal(None, None).message_dict == {
            "a": ["\u2068qa\u2069 has no ready version before v1 to compare it with; upload another version, or "
                  "choose a with b"]}
        services.dataset_version_delete(version=waiting)
        dataset.refresh_from_db()
        assert str(refusal("1", "2")) == (
            "\u2068qa\u2069 has no version 2 (it was deleted); compare two of its ready versions")
        missing = refusal("1", "9")
        assert isinstance(missing, Http404) and str(missing) == (
            "\u2068qa\u2069 has no version 9 (its versions go up to v2); compare two of its ready versions")


def compare_url(version, query=""):
    return f"/p/alpha/datasets/{version.dataset.public_id}/compare/{query}"


class TestComparePage:
    def test_it_shows_counts_and_the_removed_and_added_rows_escaped(self, team, client_for):
        first = upload(team, jsonl([pair(1), pair(2), pair(2), {"prompt": "<b>gone</b>", "completion": "old"}]))
        second = upload(team, jsonl([pair(2), {"prompt": "<script>alert(1)</script>", "completion": "new"},
                                     {"messages": [{"role": "user", "content": "Hi"},
                                                   {"role": "assistant", "content": "Hello <i>there</i>"}]}]),
                        dataset=first.dataset)
        response = client_for(team.viewer).get(compare_url(second))
        assert response.status_code == 200
        page = response.content.decode()
        assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "&lt;b&gt;gone&lt;/b&gt;" in page and "Hello &lt;i&gt;there&lt;/i&gt;" in page
        assert '<dd id="unchanged-count">1 row in both</dd>' in page
        assert '<dd id="removed-count">3 rows of v1 (4 in all) not in v2</dd>' in page
        assert '<dd id="added-count">2 rows of v2 (3 in all) not in v1</dd>' in page
        removed, added = page.split('id="removed-rows"')[1].split('id="added-rows"')
        assert [int(number) for number in _row_numbers(removed)] == [1, 3, 4]  # pair 1, the second pair 2, <b>
        assert [int(number) for number in _row_numbers(added)] == [2, 3]
        assert '<li class="turn turn-assistant">' in added  # a chat as a chat

    def test_preference_rows_show_both_sides(self, team, client_for):
        rows = [{"prompt": "p1", "chosen": "good one", "rejected": "bad one"}]
        first = upload(team, jsonl(rows), kind="preference")
        second = upload(team, jsonl([{"prompt": "p2", "chosen": "better", "rejected": "worse"}]),
                        dataset=first.dataset)
        page = client_for(team.viewer).get(compare_url(second)).content.decode()
        removed, added = page.split('id="removed-rows"')[1].split('id="added-rows"')
        assert "good one" in removed and "bad one" in removed and "better" in added and "worse" in added

    def test_removed_and_added_rows_page_on_their_own(self, team, client_for):
        first = upload(team, jsonl([pair(number) for number in range(1, 46)]))
        second = upload(team, jsonl([pair(number) for number in range(100, 105)]), dataset=first.dataset)
        page = client_for(team.viewer).get(compare_url(second, "?a=1&b=2&removed_page=3")).content.decode()
        removed, added = page.split('id="removed-rows"')[1].split('id="added-rows"')
        assert [int(number) for number in _row_numbers(removed)] == [41, 42, 43, 44, 45]
        assert "page 3 of 3" in removed and 'href="?a=1&amp;b=2&amp;removed_page=2"' in removed
        assert len(_row_numbers(added)) == 5

    def test_it_requires_access(self, team, client_for):
        first = upload(team, jsonl([pair(1)]))
        upload(team, jsonl([pair(2)]), dataset=first.dataset)
        assert client_for(team.outsider).get(compare_url(first, "?a=1&b=2")).status_code == 404
        assert Client().get(compare_url(first)).status_code == 302
        assert client_for(team.viewer).get(compare_url(first, "?a=1&b=2")).status_code == 200

    @pytest.mark.parametrize(("query", "status", "message"), [
        ("?a=abc&b=2", 200, "\u2068abc\u2069 is not a version number; give a as a number such as a=1 for v1"),
        ("?a=2&b=2", 200, "a and b are both v2: choose two different versions"),
        ("?a=1&b=7", 404, "\u2068qa\u2069 has no version 7 (its versions go up to v3)"),
        ("?a=1&b=3", 200, "v3 failed its check: only ready versions can be compared; it keeps no rows"),
    ])
    def test_it_rejects_bad_parameters_on_the_page(self, team, client_for, query, status, message):
        first = upload(team, jsonl([pair(1)]))
        upload(team, jsonl([pair(2)]), dataset=first.dataset)
        failed = services.dataset_version_validate(version_id=upload(
            team, b'{"prompt": 5}\n', dataset=first.dataset, validate=False).pk)
        assert failed.status == VersionStatus.FAILED
        response = client_for(team.viewer).get(compare_url(first, query))
        assert response.status_code == status
        refusal = response.content.decode().split('<p class="error comparison-refused" role="alert">')[1]
        assert refusal.startswith(message.replace("'", "&#x27;"))
        assert 'id="removed-rows"' not in response.content.decode()

    def test_the_dataset_and_version_pages_link_to_it(self, team, client_for):
        first = upload(team, jsonl([pair(1)]))
        second = upload(team, jsonl([pair(2)]), dataset=first.dataset)
        client = client_for(team.viewer)
        listing = client.get(f"/p/alpha/datasets/{first.dataset.public_id}/").content.decode()
        assert f'href="{compare_url(first)}?a=1&amp;b=2"' in listing and ">compare with v1</a>" in listing
        assert listing.count('class="compare-previous"') == 1  # v1 has no version before it
        version_page = client.get(f"/p/alpha/datasets/{first.dataset.public_id}/v/{second.number}/").content.decode()
        assert f'href="{compare_url(first)}?a=1&amp;b=2">Compare with v1</a>' in version_page
        first_page = client.get(f"/p/alpha/datasets/{first.dataset.public_id}/v/1/").content.decode()
        assert f'href="{compare_url(first)}?a=1&amp;b=2">Compare with v2</a>' in first_page


def _row_numbers(section: str) -> list[str]:
    import re

    return re.findall(r'<tr><td class="num muted">(\d+)</td>', section)


class TestCompareApi:
    def api(self, user):
        client = Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=user, name='cli')[1]}")
        return client

    def test_it_gives_counts_and_pages_of_row_numbers(self, team):
        first = upload(team, jsonl([pair(number) for number in range(1, 8)]))
        second = upload(team, jsonl([pair(number) for number in (1, 2, 20, 21, 22)]), dataset=first.dataset)
        api = self.api(team.viewer)
        url = f"/api/v1/projects/alpha/datasets/{first.dataset.public_id}/compare/"
        body = api.get(url, {"limit": 2}).json()
        assert {key: body[key] for key in ("unchanged", "removed", "added", "removed_rows", "added_rows")} == {
            "unchanged": 2, "removed": 5, "added": 3, "removed_rows": [3, 4], "added_rows": [3, 4]}
        assert body["a"] == {"id": first.public_id, "number": 1, "row_count": 7}
        assert body["b"]["number"] == second.number
        rest = api.get(body["next"]).json()
        assert (rest["removed_rows"], rest["added_rows"]) == ([5, 6], [5])
        last = api.get(rest["next"]).json()
        assert (last["removed_rows"], last["added_rows"], last["next"]) == ([7], [], None)

    def test_it_requires_access_and_names_bad_values(self, team):
        first = upload(team, jsonl([pair(1)]))
        upload(team, jsonl([pair(2)]), dataset=first.dataset)
        url = f"/api/v1/projects/alpha/datasets/{first.dataset.public_id}/compare/"
        assert self.api(team.outsider).get(url).status_code == 404
        response = self.api(team.viewer).get(url, {"a": "x1"})
        assert response.status_code == 400 and list(response.json()["errors"]) == ["a"]
        response = self.api(team.viewer).get(url, {"a": "1", "b": "5"})
        assert response.status_code == 404 and "has no version 5" in response.json()["detail"]
        response = self.api(team.viewer).get(url, {"side": "a"})
        assert response.status_code == 400 and list(response.json()["errors"]) == ["side"]
