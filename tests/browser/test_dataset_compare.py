"""A team uploads a dataset, fixes rows, uploads it again, and sees what changed between the two versions."""
import json

import pytest

from tests.browser.test_datasets import screenshot
from tests.browser.test_projects import log_in
from tests.webapp.factories import make_team

pytestmark = pytest.mark.browser

FIRST = [{"prompt": "What is 2+2?", "completion": "5"}, {"prompt": "Capital of France?", "completion": "Paris"},
         {"prompt": "Capital of France?", "completion": "Paris"}, {"prompt": "Say hi", "completion": "hi"}]
SECOND = [{"prompt": "Capital of France?", "completion": "Paris"}, {"prompt": "What is 2+2?", "completion": "4"},
          {"prompt": "Say hi", "completion": "hi"}, {"prompt": "<script>window.pwned = true</script>",
                                                     "completion": "escaped, not run"}]


def upload_file(page, path) -> None:
    page.set_input_files("#id_file", str(path))
    page.get_by_role("button", name="Upload").click()
    page.locator(".page-head .status-ready").wait_for(timeout=30_000)  # the version page refreshes itself


def cells(page, side: str) -> list[list[str]]:
    """The rows of the comparison's ``side`` (removed, added) as their cells' text, row number first."""
    rows = page.locator(f"#{side}-rows table.preview tbody tr")
    return [row.locator("td").all_inner_texts() for row in rows.all()]


def test_two_uploads_compared(page, live_server, default_worker, tmp_path):
    team = make_team()
    first, second = tmp_path / "v1.jsonl", tmp_path / "v2.jsonl"
    for path, rows in ((first, FIRST), (second, SECOND)):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/new/")
    page.fill("#id_name", "facts")
    page.select_option("#id_kind", "sft")
    upload_file(page, first)
    page.locator(".page-head h1 a").click()
    page.get_by_role("link", name="Upload a new version").click()
    upload_file(page, second)

    page.get_by_role("link", name="Compare with v1").click()
    page.wait_for_url("**/compare/?a=1&b=2")
    assert page.locator("#unchanged-count").inner_text() == "2 rows in both"
    assert page.locator("#removed-count").inner_text() == "2 rows of v1 (4 in all) not in v2"
    assert page.locator("#added-count").inner_text() == "2 rows of v2 (4 in all) not in v1"
    assert cells(page, "removed") == [["1", "What is 2+2?", "5"], ["3", "Capital of France?", "Paris"]]  # a repeat
    assert cells(page, "added") == [["2", "What is 2+2?", "4"],
                                    ["4", "<script>window.pwned = true</script>", "escaped, not run"]]
    assert page.evaluate("window.pwned") is None
    screenshot(page, "dataset-compare")

    # The same comparison from the dataset page's version list, and the other way round with the form.
    page.get_by_role("link", name="facts").click()
    page.get_by_role("link", name="compare with v1").click()
    page.wait_for_url("**/compare/?a=1&b=2")
    page.select_option("#compare-a", "2")
    page.select_option("#compare-b", "1")
    page.get_by_role("button", name="Compare").click()
    page.wait_for_url("**/compare/?a=2&b=1")
    assert page.locator("#removed-rows table.preview tbody td.num").all_inner_texts() == ["2", "4"]
