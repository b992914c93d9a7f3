"""What a newcomer met in their first hour (a QA pass in the browser): a project made from its name
alone, and pages whose sections sat against each other at a phone's width and a desktop's."""
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.browser.test_projects import log_in
from tests.webapp.factories import make_base_model, make_ready_version, make_team, make_user
from webapp.datasets import services as dataset_services
from webapp.projects.models import Project
from webapp.review import services as review_services
from webapp.runs import services as run_services
from webapp.runs.models import Run, RunStatus

pytestmark = pytest.mark.browser


def test_a_new_project_needs_only_a_name(page, live_server):
    make_user("nina")
    log_in(page, live_server.url, "nina")
    page.get_by_role("link", name="New project").click()
    page.fill("#id_name", "Chat tuning")
    page.get_by_role("button", name="Create project").click()
    page.wait_for_url(f"{live_server.url}/p/chat-tuning/")
    assert Project.objects.get(slug="chat-tuning").name == "Chat tuning"


def vertical_gap(page, upper: str, lower: str) -> float:
    """Pixels between the bottom of ``upper`` and the top of ``lower`` (CSS selectors)."""
    return page.evaluate(
        "([upper, lower]) => document.querySelector(lower).getBoundingClientRect().top"
        " - document.querySelector(upper).getBoundingClientRect().bottom",
        [upper, lower],
    )


@pytest.mark.parametrize("width", [390, 1440])
def test_the_arena_page_keeps_its_sections_apart(page_at, live_server, width):
    """The Battle button touched the "Your battles" heading below it, and the export form the Team
    review card (0 px between them)."""
    team = make_team()
    for name in ("falcon", "heron"):
        make_base_model(team.project, name=name, path=f"/models/{name}")
    page = page_at(width, 900)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/arena/")
    assert vertical_gap(page, "#new-battle button[type=submit]", "#new-battle + h2") >= 12
    assert vertical_gap(page, "#arena-export", "#to-review") >= 12


def test_a_failed_versions_problems_fit_a_phone(page_at, live_server, monkeypatch):
    """At 390 px the problems table ran 12 px past the page, its Problem column a word wide: one
    problem took a screen's height, and the page 13,000 px."""
    monkeypatch.setattr(dataset_services.celery_app, "send_task", lambda *args, **kwargs: None)
    team = make_team()
    rows = b"".join(b'{"question": "q%d", "answer": "a"}\n' % index for index in range(5))
    version = dataset_services.dataset_create_with_upload(
        project=team.project, name="wrong-columns", kind="sft", upload=SimpleUploadedFile("rows.jsonl", rows),
        file_format=None, column_mapping={}, user=team.owner)
    version = dataset_services.dataset_version_validate(version_id=version.pk)
    page = page_at(390, 800)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/{version.dataset.public_id}/v/1/")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    problem = page.locator(".errors-table tbody tr").first
    assert problem.locator("td").nth(3).bounding_box()["width"] >= 250
    assert problem.bounding_box()["height"] <= 320  # it was over 800
    assert problem.inner_text().startswith("lines 1, 2, 3, 4, 5")


@pytest.mark.parametrize("page_of", ["dataset", "review items"])
def test_tables_scroll_inside_a_phones_page(page_at, live_server, monkeypatch, page_of):
    """At 390 px a dataset's versions table made the page 623 px wide and a campaign's items table
    529 px: the whole page scrolled sideways, its top bar ending half-way."""
    monkeypatch.setattr(review_services.celery_app, "send_task", lambda *args, **kwargs: None)
    team = make_team()
    version = make_ready_version(team.project, name="preferences-of-the-spring-campaign", kind="preference",
                                 rows=[{"prompt": f"q{i}", "chosen": "a", "rejected": "b"} for i in range(3)],
                                 user=team.owner)
    campaign = review_services.campaign_create(project=team.project, name="pass 1", guidelines="", required_reviews=1,
                                               reviewers=[team.owner], source_version=version, user=team.owner)
    review_services.campaign_load_items(campaign_id=campaign.pk)
    address = {"dataset": f"/p/alpha/datasets/{version.dataset.public_id}/",
               "review items": f"/p/alpha/review/{campaign.public_id}/items/"}[page_of]
    page = page_at(390, 800)
    log_in(page, live_server.url, team.owner.username)
    page.goto(live_server.url + address)
    assert page.locator("table.table").count() == 1
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def test_a_base_models_serving_copy_form_fits_a_phone(page_at, live_server):
    """At 390 px the "Measure on" select, as wide as its longest option, made the page 426 px wide."""
    team = make_team()
    base_model = make_base_model(team.project, name="falcon", path="/models/falcon")
    make_ready_version(team.project, name="held-out-prompts-of-the-spring-campaign", kind="prompts",
                       rows=[{"prompt": "q"}], user=team.owner)
    page = page_at(390, 800)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/models/{base_model.public_id}/")
    assert "held-out-prompts-of-the-spring-campaign" in page.locator("select[name=eval_version]").inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def test_dataset_names_and_dates_keep_whole_beside_a_long_problem(page_at, live_server, monkeypatch):
    """At 1440 px, beside a failed version's first problem, the Datasets table cut names inside their
    words ("demo-prompt|s", "wrongc|ols") and dates after their month ("2026-12-|05")."""
    monkeypatch.setattr(dataset_services.celery_app, "send_task", lambda *args, **kwargs: None)
    team = make_team()
    for name in ("demo-preference", "prompts"):
        make_ready_version(team.project, name=name, user=team.owner)
    rows = b"".join(b'{"question": "q%d", "answer": "a"}\n' % index for index in range(5))
    failed = dataset_services.dataset_create_with_upload(
        project=team.project, name="wrongcols", kind="sft", upload=SimpleUploadedFile("rows.jsonl", rows),
        file_format=None, column_mapping={}, user=team.owner)
    dataset_services.dataset_version_validate(version_id=failed.pk)
    page = page_at(1440, 900)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/")
    lines = page.evaluate("""() => [...document.querySelectorAll('table.table tbody tr')].map(row => {
        const name = row.cells[0].querySelector('a'), date = row.cells[row.cells.length - 1];
        const range = document.createRange(); range.selectNodeContents(date);
        return [name.textContent, name.getClientRects().length, range.getClientRects().length]; })""")
    assert lines == [["demo-preference", 1, 1], ["prompts", 1, 1], ["wrongcols", 1, 1]]


def test_the_keyboard_skips_the_menus_to_the_page(page, live_server):
    """QA: on a project's pages 14 Tab presses (the top bar, the project menu) came before a page's first
    field; the first Tab now offers to skip them."""
    team = make_team()
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/new/")
    page.keyboard.press("Tab")
    skip = page.evaluate("document.activeElement.textContent.trim()")
    assert skip == "Skip to the page"
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "id_name"


def test_an_exported_checkpoint_leads_to_a_chat_with_it(page, live_server, monkeypatch, tmp_path):
    """An exported checkpoint's row offered its spec reference and a download; a newcomer who wanted to talk
    to it had to find the chat and pick it from the list. It links to a new conversation with it chosen."""
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team()
    run = Run.objects.create(project=team.project, name="checkpointed", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner,
                             total_steps=6, current_step=6)
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    run_services.checkpoint_export_request(run=run, step=3, user=team.teammate)
    (tmp_path / "export-step-3").mkdir()
    run_services.checkpoint_export_finish(run=run, step=3, export_dir=tmp_path / "export-step-3")
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/runs/{run.public_id}/")
    page.locator("#checkpoints li[data-step='3']").get_by_role("link", name="Chat with it").click()
    page.wait_for_url("**/p/alpha/chat/**")
    chosen = page.eval_on_selector("select[name=model]", "select => select.options[select.selectedIndex].text")
    assert chosen == "Run: \u2068checkpointed\u2069, checkpoint 3"


def test_the_reviewing_page_keeps_its_guidelines_readable_on_a_phone(page_at, live_server, monkeypatch):
    """At 400 px the guidelines stayed a quarter of the page beside the item, 80 px wide: "Guid|elin|es" and
    the rules a word or a syllable a line. There they go below the item, the page's width."""
    monkeypatch.setattr(review_services.celery_app, "send_task", lambda *args, **kwargs: None)
    team = make_team()
    version = make_ready_version(team.project, name="prefs", kind="preference",
                                 rows=[{"prompt": "What is 36 + 41?", "chosen": "77", "rejected": "78"}],
                                 user=team.owner)
    campaign = review_services.campaign_create(
        project=team.project, name="pass 1", guidelines="Prefer the **correct** sum. If both are wrong, pick the "
        "closer one.", required_reviews=1, reviewers=[team.owner], source_version=version, user=team.owner)
    review_services.campaign_load_items(campaign_id=campaign.pk)
    page = page_at(400, 800)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/next/")
    guidelines = page.locator(".reviewing .guidelines").bounding_box()
    item = page.locator(".reviewing .review-main").bounding_box()
    assert guidelines["width"] >= 300
    assert guidelines["y"] >= item["y"] + item["height"]


def test_a_new_project_token_is_in_view_once_made(page_at, live_server):
    """The chat page's token form is below the new-conversation form; the page answering it opened at its
    top, the new token 600 px below a 1280x800 window, where nothing said to look."""
    team = make_team()
    make_base_model(team.project, name="falcon", path="/models/falcon")
    page = page_at(1280, 800)
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/chat/")
    page.get_by_placeholder("token name").fill("notebook")
    page.get_by_role("button", name="Create token").click()
    page.locator("#new-token").wait_for()
    box = page.locator("#new-token").bounding_box()
    assert 0 <= box["y"] and box["y"] + box["height"] <= 800


@pytest.mark.parametrize("width", [400, 1280])
def test_the_chat_page_keeps_its_start_button_apart_from_the_tokens(page_at, live_server, width):
    """The new conversation's Start button touched the "API tokens for this project" heading below it (0 px
    between them), as if it started a token."""
    team = make_team()
    make_base_model(team.project, name="falcon", path="/models/falcon")
    page = page_at(width, 800)
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/chat/")
    assert vertical_gap(page, "#new-conversation button[type=submit]", "#api-tokens h2") >= 24


def test_the_launch_pages_preset_names_keep_whole_on_a_phone(page_at, live_server):
    """At 390 px the preset buttons shrank beside their descriptions until their names broke inside words
    ("LoR|A", "LoRA, demo mode|l", "QLo|RA")."""
    team = make_team()
    page = page_at(390, 844)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    # Each word of each name on one line: a range over it has one box.
    names = page.evaluate("""() => [...document.querySelectorAll('.presets .button')].map(button => {
        const text = button.firstChild, broken = [];
        for (const match of text.textContent.matchAll(/\\S+/g)) {
            const range = document.createRange();
            range.setStart(text, match.index); range.setEnd(text, match.index + match[0].length);
            if (range.getClientRects().length > 1) broken.push(match[0]);
        }
        return [text.textContent, broken]; })""")
    assert len(names) >= 3
    assert all(not broken for _, broken in names), names
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


@pytest.mark.parametrize("width", [390, 1280])
def test_the_evaluation_forms_reward_functions_are_a_card_apart_from_evaluate(page_at, live_server, width):
    """Scoring by reward functions showed a bare grey browser frame whose bottom touched the Evaluate button (0 px
    between them), as if the button belonged to the reward rows."""
    team = make_team()
    make_base_model(team.project, name="falcon", path="/models/falcon")
    make_ready_version(team.project, name="held-out", kind="prompts", rows=[{"prompt": "2+2?", "answer": "4"}],
                       user=team.owner)
    page = page_at(width, 900)
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/evaluations/new/")
    page.get_by_label("reward functions", exact=True).check()
    assert vertical_gap(page, "#reward-functions", "#new-evaluation > button[type=submit]") >= 12
    border = page.eval_on_selector("#reward-functions", "box => getComputedStyle(box).borderTopStyle")
    assert border == "solid"
    assert page.evaluate("document.documentElement.scrollWidth") <= width


@pytest.mark.parametrize("width", [390, 1280])
def test_the_project_pages_dates_keep_whole(page_at, live_server, width):
    """The project page's Data list broke its dates at their hyphens ("2026-|12-07 17:30 UTC")."""
    team = make_team()
    for name in ("held-out-prompts", "preferences-of-the-spring-campaign", "demo-sft-teacher"):
        make_ready_version(team.project, name=name, kind="prompts", rows=[{"prompt": "q"}] * 10_838, user=team.owner)
    page = page_at(width, 900)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/")
    # The boxes of each date's text, "2026-12-07 17:30 UTC", wherever in the line's elements it is.
    lines = page.evaluate("""() => [...document.querySelectorAll('.overview-versions li .muted')].map(muted => {
        const walker = document.createTreeWalker(muted, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            const at = node.textContent.search(/\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d/);
            if (at < 0) continue;
            const range = document.createRange();
            range.setStart(node, at); range.setEnd(node, at + 16);
            return range.getClientRects().length;
        }
        return 0; })""")
    assert len(lines) == 3 and lines == [1, 1, 1], lines


@pytest.mark.parametrize("width", [390, 1280])
def test_a_campaigns_export_options_read_box_label_then_help(page_at, live_server, monkeypatch, width):
    """The export's third option drew its help text first, then its box and label at the card's right edge, where the
    two above it drew box then label at the left."""
    monkeypatch.setattr(review_services.celery_app, "send_task", lambda *args, **kwargs: None)
    team = make_team()
    version = make_ready_version(team.project, name="prefs", kind="preference",
                                 rows=[{"prompt": "What is 36 + 41?", "chosen": "77", "rejected": "78"}],
                                 user=team.owner)
    campaign = review_services.campaign_create(project=team.project, name="pass 1", guidelines="", required_reviews=1,
                                               reviewers=[team.owner], source_version=version, user=team.owner)
    review_services.campaign_load_items(campaign_id=campaign.pk)
    page = page_at(width, 900)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/")
    form = page.locator(".export-form").bounding_box()
    for name in ("drop_ties", "drop_both_bad", "apply_edits"):
        box = page.locator(f"#id_{name}").bounding_box()
        label = page.locator(f"label[for=id_{name}]").bounding_box()
        assert box["x"] - form["x"] < 8 and label["x"] > box["x"] + box["width"], name  # the box first, at the left
    box = page.locator("#id_apply_edits").bounding_box()
    help_text = page.locator("#id_apply_edits_helptext").bounding_box()
    assert help_text["y"] >= box["y"] + box["height"]  # its help below the option it explains


def test_the_upload_form_starts_on_sft_and_names_the_dataset_after_its_file(page, live_server, tmp_path):
    """First-hour walk: the upload form's Kind started on text (a post-training team's rarest kind), and the Name
    stayed blank after a file was chosen. Kind starts on sft; choosing a file fills in a name from it, but never over a
    name typed."""
    make_team()
    log_in(page, live_server.url, "alpha-teammate")
    page.goto(f"{live_server.url}/p/alpha/datasets/new/")
    assert page.locator("#id_kind").input_value() == "sft"
    first, second = tmp_path / "arith_train-v2.jsonl", tmp_path / "other.jsonl"
    for path in (first, second):
        path.write_text('{"prompt": "2+2?", "completion": "4"}\n', encoding="utf-8")
    page.set_input_files("#id_file", str(first))
    assert page.locator("#id_name").input_value() == "arith train-v2"
    page.set_input_files("#id_file", str(second))
    assert page.locator("#id_name").input_value() == "other"  # a name it filled in follows the file
    page.fill("#id_name", "my chats")
    page.set_input_files("#id_file", str(first))
    assert page.locator("#id_name").input_value() == "my chats"


def test_the_evaluations_side_by_side_reads_whole_on_a_phone(page_at, live_server):
    """First-hour walk at 390 px: a side-by-side table cut its model's name a word per line ("Run: / arith / lora /
    eval") and scrolled its When column out of view."""
    from webapp.evals.models import Evaluation, EvaluationStatus

    team = make_team()
    version = make_ready_version(team.project, name="arith-prompts held-out", kind="prompts",
                                 rows=[{"prompt": "2+2?", "answer": "4"}], user=team.owner)
    for name, value in (("arith lora eval", 0.5), ("arith full eval", 0.25)):
        Evaluation.objects.create(
            project=team.project, model_ref=f"run_{name.split()[1]}", model_label=f"Run: {name}",
            dataset_version=version, version_label=str(version), metric="exact_match", row_limit=200,
            max_new_tokens=32, status=EvaluationStatus.SUCCEEDED, result={"metric": "exact_match", "value": value,
                                                                          "count": 1}, created_by=team.teammate)
    page = page_at(390, 844)
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/evaluations/")
    table = page.locator("section.comparison")
    model = table.get_by_role("link", name="Run: arith lora eval")
    line = float(model.evaluate("link => parseFloat(getComputedStyle(link).lineHeight)"))
    assert model.bounding_box()["height"] <= 2 * line + 1  # two lines at most, not a word a line
    when = table.locator("tbody tr").first.locator(".when:visible")
    box = when.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390 and box["height"] <= line + 1  # in view, whole
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
