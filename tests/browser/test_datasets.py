"""A person's first session: log in, create a project, upload a dataset, read its preview and
statistics, and see what is wrong with a bad file."""
import json
import os
import re
from pathlib import Path

import pytest

from tests.browser.test_projects import log_in
from tests.webapp.factories import make_team, make_user
from webapp.datasets.models import Dataset, DatasetVersion

pytestmark = pytest.mark.browser

LONG_ANSWER = "This answer goes on for a while. " * 20
GOOD_ROWS = [
    {"prompt": "What is 2+2?", "completion": "4"},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello there!"}]},
    {"prompt": "<script>window.pwned = true</script>", "completion": "escaped, not run"},
    {"prompt": "Explain at length.", "completion": LONG_ANSWER},
] + [{"prompt": f"Question {i}?", "completion": "An answer " * (i % 7 + 1)} for i in range(30)]
SHAREGPT_ROWS = [
    {"conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "It is four."}],
     "system": "Be brief."},
    {"messages": [{"from": "human", "value": "Name a colour."}, {"from": "gpt", "value": "Teal."}]},
]
BAD_ROWS = b'{"prompt": "fine", "completion": "fine"}\n{"prompt": "no completion"}\n{"prompt": 3, "completion": "x"}\n'


def screenshot(page, name: str) -> None:
    """Keep a picture of the page when TEMPER_SCREENSHOT_DIR is set (to look at the pages)."""
    directory = os.environ.get("TEMPER_SCREENSHOT_DIR")
    if directory:
        page.screenshot(path=str(Path(directory) / f"{name}.png"), full_page=True)


def upload(page, *, name: str, path: Path) -> None:
    page.locator("nav.subnav").get_by_role("link", name="Datasets", exact=True).click()
    page.get_by_role("link", name="Upload a dataset").first.click()
    page.fill("#id_name", name)
    page.select_option("#id_kind", "sft")
    page.set_input_files("#id_file", str(path))
    screenshot(page, f"upload-{name}")
    page.get_by_role("button", name="Upload").click()


def test_upload_preview_statistics_and_errors(page, live_server, default_worker, tmp_path):
    make_user("ada")
    log_in(page, live_server.url, "ada")

    page.goto(f"{live_server.url}/projects/new/")
    page.fill("#id_name", "Chat tuning")
    page.fill("#id_slug", "chat-tuning")
    page.get_by_role("button", name="Create").click()
    page.wait_for_url("**/p/chat-tuning/")

    good = tmp_path / "chats.jsonl"
    good.write_text("".join(json.dumps(row) + "\n" for row in GOOD_ROWS), encoding="utf-8")
    upload(page, name="chats", path=good)
    page.locator(".page-head .status-ready").wait_for(timeout=30_000)  # the page refreshes itself

    preview = page.locator("table.preview")
    assert preview.locator("tbody tr").count() == 20
    assert "What is 2+2?" in preview.inner_text()
    script_cell = preview.get_by_text("<script>window.pwned = true</script>")
    assert script_cell.count() == 1
    assert page.evaluate("window.pwned") is None
    assert preview.locator("ol.chat .turn-assistant .text").inner_text() == "Hello there!"
    fold = preview.locator("details.fold").first
    assert not fold.evaluate("element => element.open")
    fold.locator("summary").click()
    assert fold.evaluate("element => element.open")
    page.locator(".plot .main-svg").nth(4).wait_for()  # completion, messages, turns, prompt, total
    captions = page.locator(".chart figcaption b").all_inner_texts()
    assert captions == ["completion", "messages", "messages.turns", "prompt", "total"]
    screenshot(page, "version-ready")

    page.get_by_role("link", name="Next →").click()
    page.wait_for_url("**/v/1/?page=2")
    assert page.locator("table.preview tbody tr").count() == 14

    bad = tmp_path / "broken.jsonl"
    bad.write_bytes(BAD_ROWS)
    upload(page, name="broken", path=bad)
    page.locator(".page-head .status-failed").wait_for(timeout=30_000)
    rows = page.locator("tr.error-row")
    assert rows.count() == 2
    first, second = rows.nth(0).inner_text(), rows.nth(1).inner_text()
    assert first.startswith("2\t2") and "missing 'completion'" in first
    assert second.startswith("3\t3") and "must be a string, got a number" in second
    screenshot(page, "version-failed")
    page.locator(".page-head h1 a").click()
    page.wait_for_url(re.compile(r"/datasets/ds_[^/]+/$"))
    assert page.locator("table.table tbody tr").inner_text().startswith("v1\tfailed\tbroken.jsonl")
    screenshot(page, "dataset-detail")
    page.locator("nav.subnav").get_by_role("link", name="Datasets", exact=True).click()
    page.wait_for_url("**/p/chat-tuning/datasets/")
    assert page.locator("table.table tbody tr").count() == 2
    screenshot(page, "dataset-list")

    # LLaMA-Factory's ShareGPT layout ({from, value} turns in 'conversations' or 'messages'), read as it reads it.
    sharegpt = tmp_path / "sharegpt.jsonl"
    sharegpt.write_text("".join(json.dumps(row) + "\n" for row in SHAREGPT_ROWS), encoding="utf-8")
    upload(page, name="sharegpt", path=sharegpt)
    page.locator(".page-head .status-ready").wait_for(timeout=30_000)
    assert "ShareGPT layout: read as LLaMA-Factory reads it (2 rows)." in page.locator(
        ".statistics-note").all_inner_texts()
    assert page.locator("table.preview ol.chat .turn-assistant .text").all_inner_texts() == ["It is four.", "Teal."]
    assert DatasetVersion.objects.get(dataset__name="sharegpt").statistics["layouts"] == {
        "sharegpt": {"count": 2, "rows": [1, 2]}}


def test_upload_form_follows_the_kind_and_refuses_a_file_over_the_limit(page, live_server, settings, tmp_path):
    settings.TEMPER_MAX_UPLOAD_BYTES = 1000
    make_team()
    log_in(page, live_server.url, "alpha-teammate")
    page.goto(f"{live_server.url}/p/alpha/datasets/new/")

    page.select_option("#id_kind", "preference")
    assert page.locator("#id_map_chosen").is_visible() and not page.locator("#id_map_completion").is_visible()
    page.select_option("#id_kind", "sft")
    assert page.locator("#id_map_completion").is_visible() and not page.locator("#id_map_chosen").is_visible()

    big = tmp_path / "big.jsonl"
    big.write_text('{"text": "%s"}\n' % ("x" * 2000), encoding="utf-8")
    page.fill("#id_name", "big")
    page.set_input_files("#id_file", str(big))
    page.get_by_role("button", name="Upload").click()
    assert page.locator(".client-error").inner_text() == (
        "big.jsonl is 2.0 KB, over the upload limit of 1000 bytes; convert it to Parquet (.parquet: compressed, often "
        "several times smaller than JSON Lines or CSV), or ask an administrator to raise TEMPER_MAX_UPLOAD_BYTES.")
    assert page.url.endswith("/p/alpha/datasets/new/")
    assert not Dataset.objects.exists()


def test_the_preview_shows_column_names_as_written(page, live_server):
    """Table headers are set in capitals; a column named 'Category' read 'CATEGORY', though the column
    mapping and data.eval_group_by need its exact name."""
    from tests.webapp.factories import make_ready_version

    team = make_team()
    version = make_ready_version(team.project, name="evals", kind="prompts",
                                 rows=[{"prompt": "2+2?", "answer": "4", "Category": "sums", "task_Kind": "x"}])
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/{version.dataset.public_id}/v/1/")
    headers = page.locator("table.preview thead th").all_inner_texts()
    assert headers == ["#", "prompt", "answer", "Category", "task_Kind"]


def test_the_preview_jumps_to_a_page(page, live_server):
    from tests.webapp.factories import make_ready_version

    team = make_team()
    version = make_ready_version(team.project, rows=[{"prompt": f"p{i}", "completion": "c"} for i in range(1, 46)])
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/{version.dataset.public_id}/v/1/")
    page.get_by_label("Go to page").fill("3")
    page.get_by_role("button", name="Go", exact=True).click()
    page.wait_for_url("**/v/1/?page=3")
    assert page.locator("table.preview tbody td.num").all_inner_texts() == ["41", "42", "43", "44", "45"]
    assert page.get_by_label("Go to page").input_value() == "3"
    page.get_by_label("Go to page").fill("9")  # past the end: the browser holds the form back and says why
    page.get_by_role("button", name="Go", exact=True).click()
    assert page.get_by_label("Go to page").evaluate("input => input.validity.rangeOverflow")
    assert page.url.endswith("?page=3")
    # In a phone-wide window the pager wraps its parts instead of breaking 'page 3 of 3' and '← Previous'.
    line_height = page.locator(".pager .button").first.evaluate("button => button.getBoundingClientRect().height")
    page.set_viewport_size({"width": 400, "height": 800})
    for part in (".pager > span", ".pager .button", ".pager .page-jump"):
        assert page.locator(part).first.evaluate("part => part.getBoundingClientRect().height") <= line_height, part
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 400


def test_an_owner_deletes_a_version_then_the_dataset_from_their_pages(page, live_server):
    """The confirmations open, the buttons delete, the pages say what went; the numbers are not given again."""
    from tests.webapp.factories import make_ready_version

    team = make_team()
    first = make_ready_version(team.project, name="mistake", rows=[{"prompt": "secret", "completion": "x"}])
    second = make_ready_version(team.project, name="mistake", rows=[{"prompt": "fixed", "completion": "x"}])
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/{first.dataset.public_id}/v/2/")
    page.get_by_text("Delete…").click()
    page.get_by_role("button", name="Delete v2").click()
    page.wait_for_url(f"**/p/alpha/datasets/{first.dataset.public_id}/")
    assert "Deleted \u2068mistake v2\u2069 and its file." in page.locator(".messages").inner_text()
    assert page.locator("tr.version").count() == 1
    assert "a new upload becomes version 3" in page.locator("main").inner_text()
    assert not second.absolute_path.exists() and first.absolute_path.exists()
    page.get_by_text("Delete this dataset…").click()
    page.get_by_role("button", name="Delete mistake").click()
    page.wait_for_url("**/p/alpha/datasets/")
    assert ("Deleted the dataset \u2068mistake\u2069 with its 1 version and their files."
            in page.locator(".messages").inner_text())
    assert not Dataset.objects.filter(name="mistake").exists() and not first.absolute_path.exists()


def test_a_file_name_holding_double_quotes_is_shown_as_uploaded(page, live_server, tmp_path):
    """Chromium sends a '"' in a file's name as %22 (the HTML standard's escape in multipart): the version page
    showed 'my %22best%22 rows.jsonl'. The name is stored as it was on the uploader's disk."""
    from webapp.datasets.models import DatasetVersion

    make_team()
    log_in(page, live_server.url, "alpha-teammate")
    page.goto(f"{live_server.url}/p/alpha/")
    path = tmp_path / 'my "best" rows.jsonl'
    path.write_text('{"prompt": "Hi", "completion": "Hello"}\n', encoding="utf-8")
    upload(page, name="quoted", path=path)
    page.wait_for_url("**/datasets/ds_*/v/1/")
    assert DatasetVersion.objects.get().original_filename == 'my "best" rows.jsonl'
    body = page.locator("main").inner_text()
    assert 'my "best" rows.jsonl' in body and "%22" not in body


def test_a_member_splits_a_version_then_removes_the_held_out_rows_from_it(page, live_server, default_worker):
    """"Split into train and held-out" on a ready version's page: the worker writes both sides and checks them; the
    training side's page says where it came from and links the held-out side, which is ready too. Then "Remove rows
    shared with another version" on the source: its next version, without the held-out rows, links the comparison
    that shows them removed."""
    from tests.webapp.factories import make_ready_version

    team = make_team()
    rows = [{"prompt": f"question {i}", "completion": f"answer {i}", "task": "math" if i % 4 else "chat"}
            for i in range(40)]
    version = make_ready_version(team.project, name="mixed", rows=rows)
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/{version.dataset.public_id}/v/1/")
    page.get_by_text("Split into train and held-out…").click()
    page.get_by_label("Hold out").fill("25%")
    page.get_by_label("Stratify by").select_option("task")
    assert page.get_by_label("Held-out dataset").input_value() == "mixed held-out"
    screenshot(page, "version-split-form")
    page.get_by_role("button", name="Split", exact=True).click()
    page.wait_for_url(re.compile(r"/datasets/ds_[^/]+/v/1/$"))
    page.locator(".page-head .status-ready").wait_for(timeout=30_000)  # the page refreshes itself
    assert page.locator(".page-head h1").inner_text().startswith("mixed train")
    screenshot(page, "version-split-train")
    origin = page.locator(".derivation-origin").inner_text()
    assert "Split from mixed v1, seed 0, 25% held out, stratified by task: the training side" in origin
    page.locator("a.split-partner").click()
    page.locator(".page-head .status-ready").wait_for(timeout=30_000)
    assert page.locator(".page-head h1").inner_text().startswith("mixed held-out")
    assert "of 10" in page.locator(".section-head .muted").last.inner_text()  # 10 rows: a quarter of 40
    # The source shares those 10 rows with the held-out side: removed, as a new version of the source's dataset.
    page.goto(f"{live_server.url}/p/alpha/datasets/{version.dataset.public_id}/v/1/")
    page.get_by_text("Remove rows shared with another version…").click()
    page.get_by_label("Remove the rows shared with").select_option(label="mixed held-out v1")
    screenshot(page, "version-decontaminate-form")
    page.get_by_role("button", name="Remove the shared rows").click()
    page.wait_for_url(re.compile(rf"/datasets/{version.dataset.public_id}/v/2/$"))
    page.locator(".page-head .status-ready").wait_for(timeout=30_000)
    assert "Derived from v1: 10 rows shared with mixed held-out v1 removed" in (
        page.locator(".derivation-origin").inner_text())
    page.locator("a.derivation-compare").click()
    assert page.locator("#removed-count").inner_text().startswith("10 rows of v1 (40 in all) not in v2")


def test_a_version_page_following_a_count_keeps_what_is_typed_in_its_forms(page, live_server):
    """The version page reads itself again every 2 s while its tokens are counted: a reload wiped what a member was
    typing into its split form. It now holds back while a field is changed, saying so, and reloads again once the
    form is reset; left alone, it follows the count."""
    from tests.webapp.factories import make_ready_version

    team = make_team()
    version = make_ready_version(team.project, name="mixed", rows=[{"prompt": f"q{i}", "completion": "a"}
                                                                   for i in range(4)])
    counting = {"status": "computing", "base_model": "tiny"}
    DatasetVersion.objects.filter(pk=version.pk).update(token_statistics=counting)
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/{version.dataset.public_id}/v/1/")
    with page.expect_navigation():  # untouched, it reads itself again
        pass
    page.get_by_text("Split into train and held-out…").click()
    page.get_by_label("Hold out").fill("25%")
    page.get_by_text("Split into train and held-out…").click()  # closed, the focus out of the field: the text holds it
    page.evaluate("window.loadedOnce = true")
    page.wait_for_timeout(4_500)  # past two of its refresh periods
    assert page.evaluate("window.loadedOnce === true"), "the page reloaded over what was typed"
    assert page.get_by_label("Hold out").input_value() == "25%"
    assert page.get_by_role("status").filter(has_text="Updates paused").inner_text() == (
        "Updates paused while you edit — reload to see them")
    screenshot(page, "version-refresh-paused")

    DatasetVersion.objects.filter(pk=version.pk).update(
        token_statistics={**counting, "status": "failed", "error": "the <b>tokenizer</b> was not found"})
    with page.expect_navigation():
        page.get_by_label("Hold out").evaluate("field => field.form.reset()")
    page.locator("p.error").wait_for()
    assert page.locator("p.error").inner_text() == (
        "Counting tokens with tiny failed: the <b>tokenizer</b> was not found")
    assert page.get_by_label("Hold out").input_value() == "0.1"
