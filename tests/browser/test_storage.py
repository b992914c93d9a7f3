"""The disk features in a browser: the project's Storage page (its figures against the files written, its links, its
tab, hostile names and a narrow window), deleting one checkpoint and the others from the run page with the keyboard
alone, and the low-disk banner."""
from __future__ import annotations

import shutil

import pytest
from django.template.defaultfilters import filesizeformat
from django.utils import timezone
from playwright.sync_api import expect

from tests.browser.test_hostile_text import MARKUP, PAGE_FACTS
from tests.browser.test_projects import log_in
from tests.webapp.factories import du_bytes, make_team, write_bytes
from webapp.core import disk_free
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import run_output_dir

pytestmark = pytest.mark.browser

CHECKPOINT_BYTES = 64 * 1024


def run_with_checkpoints(team, name: str, *, steps=(3, 6, 9), status=RunStatus.FAILED) -> Run:
    """A run of ``team`` that trained here (its folder under the data directory) and saved ``steps``, each a
    checkpoint of ``CHECKPOINT_BYTES`` of random bytes."""
    run = Run(project=team.project, name=name, task="sft", spec={"task": "sft"}, status=status,
              started_at=timezone.now(), created_by=team.teammate, total_steps=max(steps), current_step=max(steps))
    run.resolved_spec = {"output_dir": str(run_output_dir(run.public_id))}
    run.save()
    for step in steps:
        write_bytes(run.output_dir / "checkpoints" / str(step) / "state" / "shard", CHECKPOINT_BYTES)
    write_bytes(run.output_dir / "train.log", 1000)
    return run


def console_errors(page) -> list[str]:
    """The page's console errors and uncaught exceptions, collected from now on (the list grows)."""
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def tab_to(page, target, *, most: int = 200) -> None:
    """Press Tab until ``target`` has the focus (fails after ``most`` presses): how a keyboard user reaches it."""
    for _ in range(most):
        page.keyboard.press("Tab")
        if target.evaluate("element => element === document.activeElement"):
            return
    pytest.fail(f"{most} presses of Tab never reached {target}")


def test_the_storage_page_shows_what_the_files_take_links_each_run_and_is_its_tab(page, live_server):
    team = make_team()
    big = run_with_checkpoints(team, "big sweep", steps=(3, 6, 9))
    hostile = run_with_checkpoints(team, MARKUP, steps=(3,))
    errors = console_errors(page)
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/alpha/storage/")

    for run in (big, hostile):
        row = page.locator(f"#storage-run-table tr[data-run='{run.public_id}']")
        cells = row.locator("td")
        for column, path in ((3, run.output_dir / "checkpoints"), (6, run.output_dir)):
            size = cells.nth(column).locator(".size")
            expect(size).to_have_attribute("data-bytes", str(du_bytes(path)))
            expect(size).to_have_text(filesizeformat(du_bytes(path)))
        expect(cells.nth(2)).to_have_text(str(len(list((run.output_dir / "checkpoints").iterdir()))))
    # Pruning the big run keeps its newest: steps 3 and 6 go, as its run page's Delete the others… says.
    freed = du_bytes(big.output_dir / "checkpoints" / "3", big.output_dir / "checkpoints" / "6")
    prunable = page.locator(f"tr[data-run='{big.public_id}'] .prunable .size")
    expect(prunable).to_have_attribute("data-bytes", str(freed))
    expect(page.locator("#storage-summary h2 .size")).to_have_attribute(
        "data-bytes", str(du_bytes(big.output_dir, hostile.output_dir)))

    facts = page.evaluate(PAGE_FACTS)
    assert facts["injected"] == 0 and facts["javascriptLinks"] == 0
    expect(page.locator("#storage-run-table").get_by_role("link", name=MARKUP, exact=True)).to_have_count(1)
    project_nav = page.get_by_role("navigation", name="Project")
    expect(project_nav.get_by_role("link", name="Storage")).to_have_attribute("aria-current", "page")
    expect(project_nav.locator("[aria-current]")).to_have_count(1)

    page.locator("#storage-run-table").get_by_role("link", name="big sweep").click()
    page.wait_for_url(f"**/p/alpha/runs/{big.public_id}/")
    expect(page.locator("#checkpoints li[data-step]")).to_have_count(3)
    expect(page.get_by_role("navigation", name="Project").get_by_role("link", name="Storage")).not_to_have_attribute(
        "aria-current", "page")
    assert errors == [] and dialogs == []


def test_the_storage_pages_tables_scroll_in_their_own_box_in_a_narrow_window(page_at, live_server):
    team = make_team()
    for name in ("lr 1e-3 warmup 10 cosine schedule, long descriptive name", "x"):
        run_with_checkpoints(team, name, steps=(3, 6))
    page = page_at(400, 800)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/storage/")
    facts = page.evaluate(PAGE_FACTS)
    assert facts["width"] <= facts["viewport"], f"the page is {facts['width']} px wide"
    table = page.locator("#storage-run-table")
    assert table.evaluate("table => table.scrollWidth") > 400, "the table is wider than the window: it must scroll"
    assert table.evaluate("t => getComputedStyle(t.parentElement).overflowX") == "auto"
    assert table.evaluate("t => t.parentElement.getBoundingClientRect().right") <= facts["viewport"]
    prune = page.locator("#storage-prune")
    expect(prune).to_be_visible()
    assert prune.evaluate("element => element.getBoundingClientRect().right") <= facts["viewport"]


def test_a_checkpoint_then_the_others_are_deleted_from_the_keyboard(page, live_server):
    """Tab to a checkpoint's Delete…, Enter to open it, Tab to its button, Enter: the checkpoint leaves the list and
    the message, saying the bytes freed, takes the focus (static/forms.js), as after any redirect. Then the same
    with Delete the others…: only the newest is left."""
    team = make_team()
    run = run_with_checkpoints(team, "long sft", steps=(3, 6, 9))
    checkpoints = run.output_dir / "checkpoints"
    freed_by_3, freed_by_6 = du_bytes(checkpoints / "3"), du_bytes(checkpoints / "6")
    errors = console_errors(page)
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/runs/{run.public_id}/")

    tab_to(page, page.locator("#checkpoint-3-delete summary"))
    page.keyboard.press("Enter")
    expect(page.locator("#checkpoint-3-delete")).to_have_attribute("open", "")
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Delete checkpoint 3")).to_be_focused()
    with page.expect_navigation():
        page.keyboard.press("Enter")
    messages = page.locator("#messages")
    expect(messages).to_have_text(f"Deleted checkpoint 3 of \u2068long sft\u2069: {filesizeformat(freed_by_3)} freed.")
    expect(messages).to_be_focused()
    expect(page.locator("#checkpoints li[data-step]")).to_have_count(2)
    assert sorted(path.name for path in checkpoints.iterdir()) == ["6", "9"]

    tab_to(page, page.locator("#checkpoints-prune summary"))
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Delete 1 checkpoint")).to_be_focused()
    with page.expect_navigation():
        page.keyboard.press("Enter")
    expect(messages).to_contain_text(f"Deleted 1 checkpoint of \u2068long sft\u2069 (steps 6): "
                                     f"{filesizeformat(freed_by_6)} freed. Kept: step 9")
    expect(messages).to_be_focused()
    expect(page.locator("#checkpoints li[data-step]")).to_have_count(1)
    expect(page.locator("#checkpoints li[data-step='9']")).to_be_visible()
    expect(page.locator("#checkpoints-prune")).to_have_count(0)
    assert sorted(path.name for path in checkpoints.iterdir()) == ["9"]
    assert errors == []


@pytest.fixture
def threshold_above_the_free_space(settings, monkeypatch):
    """The data directory's disk is short of room: the banner's threshold, ``TEMPER_DISK_WARN_FREE_BYTES``, set above
    its free space (a threshold set is taken as it is, above the automatic 5 % too: webapp.core.disk_free). The live
    server runs in this process and reads it."""
    disk_free.forget_kept()
    settings.TEMPER_DISK_WARN_FREE_BYTES = shutil.disk_usage(settings.DATA_ROOT).total
    yield
    disk_free.forget_kept()


def test_the_low_disk_banner_says_the_free_space_links_the_storage_page_and_is_announced_once(
        page, live_server, settings, threshold_above_the_free_space):
    """The banner was a live region (role=status) holding its text as the page loaded, which no screen reader
    announces: a screen-reader user heard nothing of it. It is a region named for what it is, and its words are put
    in a live region empty at load once the page has loaded, as the messages after a redirect are when the focus is
    placed (static/forms.js): announced without taking the focus, once a browsing session, not on every page."""
    team = make_team()
    errors = console_errors(page)
    log_in(page, live_server.url, team.viewer.username)  # the first page signed in: the projects list
    said = page.locator("#disk-low-said")
    expect(said).to_contain_text("The server's disk is running low: ")
    expect(said).to_contain_text("Each project's Storage page shows what its runs, datasets and models take")
    assert page.evaluate("document.activeElement === document.body"), "the focus stays where the page starts"

    response = page.goto(f"{live_server.url}/p/alpha/runs/")
    banner = page.get_by_role("region", name="Low disk space")
    expect(banner).to_be_visible()
    free = shutil.disk_usage(settings.DATA_ROOT).free
    shown = int(banner.locator(".size").first.get_attribute("data-bytes"))
    assert abs(shown - free) < 100 * 1024**2, (shown, free)  # what others wrote meanwhile
    assert f"{filesizeformat(shown)} free of" in banner.inner_text()
    assert '<p id="disk-low-said" class="visually-hidden" role="status"></p>' in response.text(), (
        "the live region is empty as the page loads: content there at load is not announced")
    assert page.locator("[role=status]:has(#disk-low), #disk-low[role=status], #disk-low [aria-live]").count() == 0
    page.wait_for_timeout(500)  # it would have been said again by now
    expect(said).to_be_empty()

    banner.get_by_role("link", name="This project's Storage page").click()
    page.wait_for_url("**/p/alpha/storage/")
    expect(page.get_by_role("region", name="Low disk space")).to_be_visible()
    page.set_viewport_size({"width": 400, "height": 800})
    facts = page.evaluate(PAGE_FACTS)
    assert facts["width"] <= facts["viewport"], f"with the banner the page is {facts['width']} px wide at 400 px"
    assert errors == []


def test_no_low_disk_banner_above_the_threshold(page, live_server, settings):
    disk_free.forget_kept()
    settings.TEMPER_DISK_WARN_FREE_BYTES = 1024**2  # 1 MB: this machine has more free
    team = make_team()
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/alpha/runs/")
    expect(page.locator("#disk-low")).to_have_count(0)
    expect(page.locator("#disk-low-said")).to_have_count(0)


def test_the_storage_pages_prune_is_sent_from_the_keyboard_and_run_by_the_worker(page, live_server, default_worker):
    """Prune checkpoints of ended runs… from the keyboard alone, run by a real default worker over Redis: the
    messages (queued; the active run skipped) take the focus, and the page loaded again shows the disk freed."""
    from tests.live import wait_for
    from webapp.runs.services import checkpoint_steps

    team = make_team()
    ended = run_with_checkpoints(team, "ended", steps=(3, 6, 9))
    running = run_with_checkpoints(team, "running", steps=(3, 6), status=RunStatus.RUNNING)
    freed = du_bytes(ended.output_dir / "checkpoints" / "3", ended.output_dir / "checkpoints" / "6")
    errors = console_errors(page)
    page.add_init_script("window.TemperCopyPollMs = 200;")
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/storage/")
    tab_to(page, page.locator("#storage-prune summary"))
    page.keyboard.press("Enter")
    expect(page.locator("#storage-prune .prune-skipped")).to_have_text(
        f"Skipped, still active: running ({running.public_id}).")
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Delete 2 checkpoints")).to_be_focused()
    with page.expect_navigation():
        page.keyboard.press("Enter")
    messages = page.locator("#messages")
    expect(messages).to_contain_text("Pruning the checkpoints of this project's ended runs in the background")
    expect(messages).to_contain_text(f"Skipped, still active: \u2068running\u2069 ({running.public_id}).")
    expect(messages).to_be_focused()
    wait_for(lambda: checkpoint_steps(ended) == [9], timeout=30, workers=default_worker,
             what="the worker to prune the ended run")
    assert checkpoint_steps(running) == [3, 6]
    # The page it came back to follows the prune to its end, no reload: what it freed, and the run it left.
    state = page.locator("#storage-prune-state")
    expect(state.locator(".prune-result")).to_contain_text(
        f"Last prune of ended runs' checkpoints: {filesizeformat(freed)} freed, 2 checkpoints deleted over 2 runs "
        "weighed, finished ")
    expect(state.locator(".prune-result .size")).to_have_attribute("data-bytes", str(freed))
    expect(state.locator(".prune-result")).to_contain_text(f"asked by {team.owner.username}.")
    expect(state.locator(".prune-failures li")).to_contain_text(f"Left running ({running.public_id}): run "
                                                                  f"{running.public_id} is running")
    page.reload()
    row = page.locator(f"#storage-run-table tr[data-run='{ended.public_id}'] td")
    expect(row.nth(2)).to_have_text("1")
    expect(row.nth(3).locator(".size")).to_have_attribute("data-bytes", str(du_bytes(ended.output_dir / "checkpoints")))
    expect(row.nth(4)).to_have_text("—")
    expect(page.locator("#storage-prune")).to_have_count(0)
    assert errors == []


def test_a_skipped_runs_bidi_controls_reorder_nothing_in_the_prune_confirmation(page, live_server):
    """The Storage page's prune names the active runs it skips, each run's name beside its id in one sentence: a
    name's right-to-left override, not isolated, wrote its id and the rest of the sentence backwards."""
    from tests.browser.test_bidi import LEAKS, hostile

    team = make_team()
    run_with_checkpoints(team, "ended", steps=(3, 6))
    run_with_checkpoints(team, hostile("running"), steps=(3, 6), status=RunStatus.RUNNING)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/storage/")
    page.locator("#storage-prune summary").click()
    expect(page.locator("#storage-prune .prune-skipped")).to_be_visible()
    assert page.evaluate(LEAKS) == []


def test_the_storage_page_says_how_far_a_prune_has_gone_and_its_outcome_as_it_changes(page, live_server):
    """While a project-wide prune runs, the Storage page says "Pruning… N of M runs", following it without a
    reload (static/serving_copy.js asks for its partial again), offers no second prune, and shows the outcome once
    the task has written it."""
    from webapp.runs import services
    from webapp.runs.models import ProjectCheckpointPrune

    team = make_team()
    run_with_checkpoints(team, "ended", steps=(3, 6))
    prune = ProjectCheckpointPrune.objects.create(project=team.project, requested_by=team.owner, runs_total=2)
    errors = console_errors(page)
    page.add_init_script("window.TemperCopyPollMs = 200;")
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/storage/")
    state = page.locator("#storage-prune-state")
    expect(state).to_contain_text("Pruning… 0 of 2 runs")
    expect(page.locator("#storage-prune")).to_have_count(0)
    services._prune_recorded(prune, runs_done=1, checkpoints_deleted=1, bytes_freed=CHECKPOINT_BYTES)
    expect(state).to_contain_text("Pruning… 1 of 2 runs")
    expect(state).to_contain_text(f"{filesizeformat(CHECKPOINT_BYTES)} freed so far (asked by {team.owner.username} ")
    services._prune_recorded(prune, runs_done=2, finished_at=timezone.now())
    expect(state.locator(".prune-result")).to_contain_text(
        f"{filesizeformat(CHECKPOINT_BYTES)} freed, 1 checkpoint deleted over 2 runs weighed")
    expect(state.locator("[data-in-progress]")).to_have_count(0)
    assert errors == []


def test_the_storage_pages_words_for_a_cell_are_explained_in_visible_text(page_at, live_server):
    """*active*, *gone*, *no files* and *Pruning frees* were explained in title attributes only, which a keyboard or
    touch user never sees: a legend under the table says each in words on the page (only the words the table uses),
    and no cell keeps an explanation in a title (a size's title is its exact bytes, also in data-bytes)."""
    team = make_team()
    run_with_checkpoints(team, "ended", steps=(3, 6))
    run_with_checkpoints(team, "running", steps=(3, 6), status=RunStatus.RUNNING)
    gone = run_with_checkpoints(team, "deleted from disk", steps=(3,))
    shutil.rmtree(gone.output_dir)
    Run.objects.create(project=team.project, name="queued", task="sft", spec={"task": "sft"},
                       resolved_spec={}, status=RunStatus.QUEUED, created_by=team.teammate)
    page = page_at(400, 800)  # a phone's width: nothing to hover there
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/alpha/storage/")
    legend = page.locator("#storage-run-legend")
    for words in ("Pruning frees: what deleting every checkpoint of the run but its newest and its best would free",
                  "active: still training: its engine saves and rotates its checkpoints itself",
                  "gone: its folder is no longer on disk",
                  "no files: it has written no folder on this server"):
        item = legend.locator("li", has_text=words)
        expect(item).to_be_visible()
        assert item.evaluate("element => element.getBoundingClientRect().right") <= 400
    assert page.locator("main [title]:not(.size)").count() == 0, page.locator("main [title]:not(.size)").all()
    # A project with nothing gone, nothing active, nothing never written: the legend says only what its table shows.
    Run.objects.exclude(pk__in=Run.objects.filter(name="ended").values("pk")).delete()
    page.reload()
    expect(legend.locator("li")).to_have_count(1)
    expect(legend).to_contain_text("Pruning frees: ")
