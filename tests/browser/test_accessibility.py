"""A keyboard-only or screen-reader user on the main pages: a form's errors are tied to their fields
and take the focus, the current page is named as such in the navigation, and the chat announces an
answer once it is written (not token by token) and keeps the focus on a control that still exists."""
import pytest
from playwright.sync_api import expect

from tests.browser.test_projects import log_in, log_out
from tests.browser.test_runs import asgi_server  # noqa: F401  (the module's uvicorn fixture)
from tests.webapp.factories import make_base_model, make_team, make_user

pytestmark = pytest.mark.browser


def test_a_refused_form_ties_each_error_to_its_field_and_focuses_the_first(page, live_server):
    """Django marks a refused field aria-invalid and points its aria-describedby at ids ending in
    _helptext and _error, but the shared field template gave neither id to its help and error text:
    a screen reader read the field as invalid with no reason, and the focus stayed at the top of the page."""
    make_user("olga")
    log_in(page, live_server.url, "olga")
    page.goto(f"{live_server.url}/projects/new/")
    page.get_by_role("textbox", name="Name").fill("Reward models")
    page.get_by_role("textbox", name="Slug").fill("Not a slug!")
    page.get_by_role("button", name="Create project").click()
    slug = page.get_by_role("textbox", name="Slug")
    expect(slug).to_have_attribute("aria-invalid", "true")
    error = page.locator(".field.has-error .error").inner_text()
    assert error
    assert error in described_by(slug)
    expect(slug).to_be_focused()


def test_a_refused_upload_ties_the_error_to_the_file_field(page, live_server, tmp_path):
    """The upload form is written field by field, and its help and errors carried no ids either."""
    team = make_team()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/new/")
    page.get_by_role("textbox", name="Name").fill("chats")
    page.get_by_label("File").set_input_files(str(empty))
    page.get_by_role("button", name="Upload").click()
    file = page.get_by_label("File")
    expect(file).to_have_attribute("aria-invalid", "true")
    description = described_by(file)
    assert any("empty.jsonl" in text and "empty" in text for text in description), description
    assert any("Up to" in text for text in description), "the help text is read too"
    expect(file).to_be_focused()


def described_by(locator) -> list[str]:
    """The texts of the elements that ``locator``'s aria-describedby names; fails on an id that names none."""
    texts = locator.evaluate(
        "element => element.getAttribute('aria-describedby').split(' ')"
        ".map(id => document.getElementById(id)).map(found => found ? found.textContent.trim() : null)")
    assert None not in texts, f"every id in aria-describedby names an element on the page: {texts}"
    return texts


def test_the_navigation_names_the_current_page(page, live_server):
    """The current tab was shown by colour alone (class "active"): a screen reader heard no difference."""
    team = make_team()
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/runs/")
    project_nav = page.get_by_role("navigation", name="Project")
    expect(project_nav.get_by_role("link", name="Runs")).to_have_attribute("aria-current", "page")
    expect(project_nav.locator("[aria-current]")).to_have_count(1)
    page.goto(f"{live_server.url}/")
    expect(page.get_by_role("navigation", name="Main").get_by_role("link", name="Projects")).to_have_attribute(
        "aria-current", "page")


def _chat_with_an_answer_streaming(page, base_url, redis_url, settings):
    """(answer, redis client) of a teammate's conversation whose answer is being written, its page open."""
    from tests.browser.test_chat import conversation_with_an_answer
    from tests.browser.test_runs import log_in as log_in_at
    from webapp.chat.models import MessageStatus
    from webapp.runs.channels import redis_client

    settings.REDIS_URL = redis_url
    team, conversation = conversation_with_an_answer(status=MessageStatus.STREAMING)
    log_in_at(page, base_url, team.teammate.username)
    page.goto(f"{base_url}/p/{team.project.slug}/chat/{conversation.public_id}/")
    page.wait_for_load_state("load")
    return conversation.messages.get(role="assistant"), redis_client()


def test_the_chat_announces_the_finished_answer_not_each_token(page, asgi_server, redis_url, transactional_db,  # noqa: F811
                                                             settings):
    """Nothing on the chat page was live: a screen-reader user who sent a message heard nothing, neither
    that the model was writing nor its answer. A live region says the first, then reads the finished answer
    once (the streaming text itself is not live: each token would be read out)."""
    from webapp.chat import channels, services

    answer, client = _chat_with_an_answer_streaming(page, asgi_server, redis_url, settings)
    status = page.get_by_role("status").filter(has_text="The model")
    expect(status).to_have_text("The model is writing its answer.")
    channels.emit(client, answer.public_id, {"seq": 0, "type": "token", "text": "Hel"})
    page.locator(".chat-streaming").filter(has_text="Hel").wait_for()
    expect(status).to_have_text("The model is writing its answer.")
    services.message_finish(message_id=answer.public_id, text="Hello **there**", finish_reason="stop")
    channels.emit(client, answer.public_id, {"seq": 1, "type": "done", "text": "Hello **there**",
                                             "finish_reason": "stop"})
    expect(status).to_have_text("The model answered: Hello there")
    assert page.locator("#chat-log [aria-live], #chat-log[aria-live]").count() == 0, "tokens are not read out"


def test_the_focus_stays_on_the_chat_controls_as_an_answer_starts_and_ends(page, asgi_server, redis_url,  # noqa: F811
                                                                          transactional_db, settings):
    """Stop is hidden when the answer ends, and Send and Regenerate are disabled while it is written: a
    keyboard user who pressed one of them was left on the page's body, with Tab starting again from the top."""
    from webapp.chat import channels, services

    answer, client = _chat_with_an_answer_streaming(page, asgi_server, redis_url, settings)
    stop = page.get_by_role("button", name="Stop")
    stop.focus()
    services.message_finish(message_id=answer.public_id, text="Hello", finish_reason="stop")
    channels.emit(client, answer.public_id, {"seq": 0, "type": "done", "text": "Hello", "finish_reason": "stop"})
    page.locator(".chat-markdown").filter(has_text="Hello").wait_for()
    expect(page.get_by_role("textbox", name="Message")).to_be_focused()

    page.get_by_role("button", name="Regenerate").focus()
    page.keyboard.press("Enter")
    expect(stop).to_be_visible()
    expect(stop).to_be_focused()


def test_a_run_chart_says_its_numbers_in_words(page, live_server, tmp_path):
    """A run's charts were plotly SVGs with nothing for a screen reader but tick labels: each figure is now
    named by a caption of its numbers (points, latest, lowest, highest), and the SVG is hidden from it. The caption
    writes a value as the chart's hover and axis do, to 4 significant digits (it wrote 5: "1.1235" beside "1.123")."""
    from webapp.runs.models import MetricPoint, Run, RunStatus

    team = make_team()
    run = Run.objects.create(project=team.project, name="sft", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner,
                             total_steps=3, current_step=3)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=value, wall_time=float(step),
                                                 tokens=step) for step, value in ((1, 2.0), (2, 1.123456), (3, 1.5))])
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/alpha/runs/{run.public_id}/")
    expect(page.get_by_role("figure", name="loss by step: 3 points, steps 1 to 3; latest 1.5 at step 3; "
                                            "lowest 1.123, highest 2.", exact=True)).to_have_count(1)
    page.locator("#charts .plot .main-svg").first.wait_for()
    assert page.locator("#charts .plot").aria_snapshot() == ""  # a chart without a legend: nothing to read


def test_a_running_runs_chart_caption_follows_it_and_its_steps_are_not_read_out(page, asgi_server, redis_url,  # noqa: F811
                                                                               transactional_db, settings):
    """The progress card was a live region: each step's numbers (step, tokens, elapsed, ETA) were read out as
    they came. A chart's caption follows the points that arrive, without being live either."""
    from tests.browser.test_runs import log_in as log_in_at
    from webapp.runs import reporting
    from webapp.runs.models import Run, RunStatus

    settings.REDIS_URL = redis_url
    team = make_team()
    run = Run.objects.create(project=team.project, name="live", task="sft", status=RunStatus.RUNNING,
                             spec={"task": "sft"}, resolved_spec={"output_dir": "/nowhere"}, created_by=team.owner,
                             total_steps=400, current_step=0)
    log_in_at(page, asgi_server, team.viewer.username)
    page.goto(f"{asgi_server}/p/alpha/runs/{run.public_id}/")
    page.locator("#live-state", has_text="live").wait_for()
    reporting.publish_event(run.public_id, {"type": "metrics", "points": [
        {"name": "loss", "step": 1, "value": 3.0}, {"name": "loss", "step": 2, "value": 2.5}]})
    expect(page.get_by_role("figure", name="loss by step: 2 points, steps 1 to 2; latest 2.5 at step 2; "
                                            "lowest 2.5, highest 3.", exact=True)).to_have_count(1)
    assert page.locator("[aria-live]:has(#progress-step), [role=status]:has(#progress-step)").count() == 0


# The contrast ratio (WCAG 2) of an element's text colour against the first opaque background behind it.
CONTRAST = """element => {
  const rgb = text => text.match(/[\\d.]+/g).map(Number);
  const luminance = colour => {
    const [r, g, b] = colour.slice(0, 3).map(value => value / 255)
      .map(value => value <= 0.03928 ? value / 12.92 : Math.pow((value + 0.055) / 1.055, 2.4));
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  let behind = element, background = [255, 255, 255];
  while (behind) {
    const colour = rgb(getComputedStyle(behind).backgroundColor);
    if (colour.length < 4 || colour[3] > 0.5) { background = colour; break; }
    behind = behind.parentElement;
  }
  const [light, dark] = [luminance(rgb(getComputedStyle(element).color)), luminance(background)].sort((a, b) => b - a);
  return (light + 0.05) / (dark + 0.05);
}"""


def test_muted_and_warning_text_is_readable(page, live_server, tmp_path):
    """Muted text on the code background (the workers page's start command) read at 4.36:1 and the amber
    of a queued or running run's badge at 4.47:1, under the 4.5:1 that small text needs."""
    from webapp.runs.models import Run, RunStatus

    team = make_team()
    Run.objects.create(project=team.project, name="live", task="sft", status=RunStatus.RUNNING, spec={"task": "sft"},
                       resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner, total_steps=9)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/runs/")
    badge = page.locator(".badge-warn").first
    expect(badge).to_have_text("running")
    assert badge.evaluate(CONTRAST) >= 4.5
    page.goto(f"{live_server.url}/workers/")
    # The start command is shown whether or not a worker has reported (a session-wide Celery worker of an
    # integration test in this process may have).
    command = page.locator("#start-worker code").first
    assert command.evaluate(CONTRAST) >= 4.5


def test_the_arena_says_when_its_vote_opens(page, asgi_server, redis_url, transactional_db, settings,  # noqa: F811
                                             monkeypatch):
    """The vote buttons open in place once both answers are done; the wait note was only hidden, so a
    screen-reader user heard nothing and had to look for the buttons to learn that they could vote."""
    from tests.browser.test_runs import log_in as log_in_at
    from webapp.chat import arena, channels, selectors, services
    from webapp.runs.channels import redis_client

    settings.REDIS_URL = redis_url
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue, **options: None)
    team = make_team()
    for name in ("falcon", "heron"):
        make_base_model(team.project, name=name, path=f"/models/{name}")
    battle = arena.battle_create(project=team.project, user=team.teammate, prompt="Name a colour.",
                                 choices=selectors.model_choices(project=team.project))
    log_in_at(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/alpha/arena/{battle.public_id}/")
    page.wait_for_load_state("load")
    status = page.get_by_role("status").filter(has_text="vote")
    expect(status).to_have_text("The vote opens when both answers are done.")
    for side, text in ((battle.side_a, "Blue."), (battle.side_b, "Red.")):
        answer = arena.battle_answer(side)
        services.message_finish(message_id=answer.public_id, text=text, finish_reason="stop")
        channels.emit(redis_client(), answer.public_id, {"seq": 0, "type": "done", "text": text, "finish_reason": "stop"})
    expect(status).to_have_text("Both answers are done: the vote is open.")
    expect(page.get_by_role("button", name="A is better")).to_be_enabled()


def test_plotlys_text_measuring_svg_is_no_unnamed_image(page, live_server, tmp_path):
    """Plotly measures text in an off-screen SVG it adds to the body: a screen reader met an unnamed image
    at the end of the run page."""
    from webapp.runs.models import MetricPoint, Run, RunStatus

    team = make_team()
    run = Run.objects.create(project=team.project, name="sft", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner,
                             total_steps=2, current_step=2)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=1.0 / step,
                                                 wall_time=float(step), tokens=step) for step in (1, 2)])
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/alpha/runs/{run.public_id}/")
    page.locator("#charts .plot .main-svg").first.wait_for()
    assert page.locator("#js-plotly-tester").count() == 1
    expect(page.get_by_role("img")).to_have_count(0)


def test_a_compare_chart_names_itself_and_where_its_numbers_are(page, live_server, monkeypatch):
    """The compare page's plotly charts had no name, and their SVG read as tick labels: each figure is now
    named by its metric and axis and points to the Final metrics table, which gives every run's numbers."""
    from tests.browser.test_runs import open_a_sweeps_comparison

    open_a_sweeps_comparison(page, live_server, monkeypatch, slug="alpha")
    name = "loss by step: each run's last, lowest and highest value are in the Final metrics table"
    expect(page.get_by_role("figure", name=name, exact=True)).to_have_count(1)
    # Of its SVG a screen reader meets the legend alone, a toolbar of buttons (static/plot_legend.js).
    page.locator("#compare-charts .plot .legend .traces").nth(2).wait_for()
    snapshot = page.locator("#compare-charts .plot").aria_snapshot().splitlines()
    assert snapshot[0] == '- toolbar "Legend of loss":', snapshot
    assert len(snapshot) == 4 and all(line.startswith('  - button "Show lr-sweep') for line in snapshot[1:]), snapshot
    expect(page.get_by_role("heading", name="Final metrics")).to_be_visible()
    page.get_by_label("x axis").select_option("tokens")
    expect(page.get_by_role("figure", name=name.replace("by step", "by tokens"), exact=True)).to_have_count(1)


def test_a_file_over_the_upload_limit_is_refused_at_its_field(page, live_server, settings, tmp_path):
    """The page refuses a file over the limit before sending it, but only showed the message: the focus stayed
    on Upload and nothing tied the message to the file field, so a screen-reader user heard nothing happen.
    The upload's progress bar had no name either."""
    settings.TEMPER_MAX_UPLOAD_BYTES = 1000
    team = make_team()
    big = tmp_path / "big.jsonl"
    big.write_text('{"text": "%s"}\n' % ("x" * 2000), encoding="utf-8")
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/new/")
    page.get_by_role("textbox", name="Name").fill("big")
    page.get_by_label("File").set_input_files(str(big))
    page.get_by_role("button", name="Upload").focus()
    page.keyboard.press("Enter")
    file = page.get_by_label("File")
    expect(file).to_be_focused()
    expect(file).to_have_attribute("aria-invalid", "true")
    assert ("big.jsonl is 2.0 KB, over the upload limit of 1000 bytes; convert it to Parquet (.parquet: compressed, "
            "often several times smaller than JSON Lines or CSV), or ask an administrator to raise "
            "TEMPER_MAX_UPLOAD_BYTES.") in described_by(file)
    progress = page.locator("progress.upload-progress")
    progress.evaluate("element => { element.hidden = false; }")  # as the upload shows it
    expect(progress).to_have_accessible_name("Upload progress")


def test_a_workers_failed_device_probe_can_be_read_from_the_keyboard(page, live_server):
    """'probe failed' kept its reason in a title attribute: shown on mouse hover only, never to the keyboard
    or on a touch screen, and left out by some screen readers."""
    from django.utils import timezone

    from webapp.workers.models import Worker

    team = make_team()
    now = timezone.now()
    Worker.objects.create(name="train@h0", host="h0", pid=1, queues=["train"], started_at=now, last_seen=now,
                          devices={"error": "jax.devices() raised: no TPU found"})
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/workers/")
    reason = page.get_by_text("jax.devices() raised: no TPU found")
    expect(reason).to_be_hidden()
    page.get_by_text("probe failed").focus()
    page.keyboard.press("Enter")
    expect(reason).to_be_visible()


def test_the_launch_forms_tabs_say_which_is_chosen(page, live_server):
    """The task, preset and editor tabs marked the chosen one by colour alone."""
    team = make_team()
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=dpo")
    tasks = page.get_by_role("navigation", name="Task")
    expect(tasks.get_by_role("link", name="dpo", exact=True)).to_have_attribute("aria-current", "page")
    expect(tasks.locator("[aria-current]")).to_have_count(1)
    expect(page.locator(".presets [aria-current=true]")).to_have_count(page.locator(".presets a.active").count())
    editor = page.get_by_role("navigation", name="Editor")
    expect(editor.get_by_role("link", name="Form")).to_have_attribute("aria-current", "true")
    editor.get_by_role("link", name="YAML (advanced)").click()
    expect(editor.get_by_role("link", name="YAML (advanced)")).to_have_attribute("aria-current", "true")
    expect(editor.locator("[aria-current]")).to_have_count(1)


def test_a_campaigns_item_filter_says_which_is_chosen(page, live_server):
    """The status filter above a campaign's items was an unnamed navigation whose chosen status was shown
    by colour alone."""
    from webapp.review import services as review_services

    team = make_team()
    campaign = review_services.campaign_create(project=team.project, name="pass", guidelines="", source_version=None,
                                               required_reviews=1, reviewers=[team.owner], user=team.owner)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/items/")
    statuses = page.get_by_role("navigation", name="Item status")
    expect(statuses.get_by_role("link", name="all", exact=True)).to_have_attribute("aria-current", "page")
    statuses.get_by_role("link", name="conflict").click()
    expect(statuses.get_by_role("link", name="conflict")).to_have_attribute("aria-current", "page")
    expect(statuses.locator("[aria-current]")).to_have_count(1)


def test_the_account_link_says_where_it_leads(page, live_server):
    """The link to change one's password read as one's username alone; what it does was in its title,
    shown on mouse hover only."""
    from webapp.core.bidi import isolated

    make_user("olga")
    log_in(page, live_server.url, "olga")
    page.get_by_role("banner").get_by_role("link", name=f"{isolated('olga')}: change password", exact=True).click()
    page.wait_for_url("**/accounts/password/")


def test_each_presets_description_is_shown_and_read_with_it(page, live_server):
    """A preset's description was its title attribute: shown on mouse hover only, so a keyboard or touch
    user never saw what QLoRA or SimPO would set, and some screen readers left it out. Each description is
    on the page, and its preset's button is described by it."""
    from webapp.runs.presets import PRESETS

    team = make_team()
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    presets = page.get_by_role("group", name="Presets")
    for preset in PRESETS["sft"]:
        link = presets.get_by_role("link", name=preset["name"], exact=True)
        expect(link).to_have_accessible_description(preset["description"])
        expect(presets.get_by_text(preset["description"], exact=True)).to_be_visible()


def test_a_reviewer_turns_the_single_key_shortcuts_off_and_letters_then_do_nothing(page, live_server, monkeypatch):
    """WCAG 2.1.4: the reviewing page answered an item on a bare 1, 2, t, b or s, which a speech-input user
    (or a stray key press) sends by accident, and nothing turned them off. The reviewer's setting, kept on
    the server, turns them off on every campaign's page, and on again."""
    from tests.webapp.factories import make_ready_version
    from webapp.celery import app as celery_app
    from webapp.review import services as review_services
    from webapp.review.models import Review

    monkeypatch.setattr(celery_app, "send_task", lambda *args, **kwargs: None)
    team = make_team()
    rows = [{"prompt": f"Question {number}?", "chosen": "right", "rejected": "wrong"} for number in (1, 2)]
    version = make_ready_version(team.project, name="prefs", kind="preference", rows=rows, user=team.owner)
    campaign = review_services.campaign_create(project=team.project, name="pass", guidelines="", source_version=version,
                                               required_reviews=1, reviewers=[team.teammate], user=team.owner)
    review_services.campaign_load_items(campaign_id=campaign.pk)
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/next/")
    with page.expect_navigation():
        page.get_by_role("button", name="Turn the single-key shortcuts off").click()
    expect(page.get_by_role("button", name="Turn the single-key shortcuts on")).to_be_visible()
    prompt = page.locator(".prompt .text").inner_text()
    for key in ("1", "2", "t", "b", "s", "e"):
        page.keyboard.press(key)
    page.wait_for_timeout(500)  # a shortcut would have sent the form by now
    assert not Review.objects.filter(reviewer=team.teammate).exists()
    assert page.locator(".prompt .text").inner_text() == prompt
    expect(page.locator("textarea.edit").first).to_be_hidden()
    expect(page.locator(".choices kbd").first).to_be_hidden()
    # The buttons still answer, and the setting holds on the next item.
    with page.expect_navigation():
        page.get_by_role("button", name="Tie").click()
    assert Review.objects.filter(reviewer=team.teammate).count() == 1
    expect(page.get_by_role("button", name="Turn the single-key shortcuts on")).to_be_visible()
    with page.expect_navigation():
        page.get_by_role("button", name="Turn the single-key shortcuts on").click()
    with page.expect_navigation():
        page.keyboard.press("t")
    assert Review.objects.filter(reviewer=team.teammate).count() == 2



def test_a_runs_status_change_is_shown_in_place_and_announced(page, asgi_server, redis_url, transactional_db,  # noqa: F811
                                                             settings, monkeypatch):
    """A status change loaded the whole run page again: a reader scrolled down to the notes was taken back to
    the top, the focus went back to the start of the page, and a screen reader heard the page load, not what
    changed. The status, actions and messages change in place, and a live region says the new status."""
    from tests.browser.test_runs import log_in as log_in_at
    from tests.browser.test_runs import queued_run
    from webapp.runs import reporting
    from webapp.runs.models import Run

    settings.REDIS_URL = redis_url
    team = make_team(slug="inplace")
    run = queued_run(monkeypatch, team, name="changes")
    log_in_at(page, asgi_server, "inplace-teammate")
    page.goto(f"{asgi_server}/p/inplace/runs/{run.public_id}/")
    page.locator("#live-state", has_text="live").wait_for()
    page.evaluate("window.notLoadedAgain = true")
    cancel = page.locator("#cancel-confirm summary")
    cancel.focus()
    reporting.run_start(run_pk=run.pk, attempt=run.attempt, worker_name="train@host-7")
    expect(page.locator("#run-status")).to_have_text("running")
    expect(page.locator("#run-status-announcement")).to_have_text("Run status: running.")
    expect(page.locator("#progress")).to_contain_text("train@host-7")
    expect(page.locator("#cancel-confirm summary")).to_be_focused()  # the same control, in the page as it is now
    edit = page.locator("#edit-form").locator("xpath=..").locator("summary")
    edit.scroll_into_view_if_needed()
    edit.focus()
    reporting.run_fail(run=Run.objects.get(pk=run.pk), error=RuntimeError("out of memory"))
    expect(page.locator("#run-status")).to_have_text("failed")
    expect(page.locator("#run-status-announcement")).to_have_text("Run status: failed.")
    expect(page.locator(".run-message.failed")).to_contain_text("out of memory")
    expect(page.get_by_role("button", name="Retry")).to_be_visible()
    expect(page.locator("#cancel-confirm")).to_have_count(0)
    expect(edit).to_be_focused()
    expect(edit).to_be_in_viewport()
    assert page.evaluate("window.notLoadedAgain === true"), "the page was loaded again"
    expect(page.locator("#live-state")).to_have_text("")  # a finished run's page stops listening
    expect(page.get_by_role("status").filter(has_text="Run status: failed.")).to_have_count(1)


def test_the_upload_forms_name_is_described_by_its_help(page, live_server):
    """The dataset name's aria-describedby (Django's, from its help text) named id_name_helptext, which the
    upload form, written field by field, never rendered: a reference to nothing, and the help unseen."""
    team = make_team()
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/datasets/new/")
    name = page.get_by_role("textbox", name="Name")
    assert described_by(name) == ["A name for the dataset within this project."]
    for field in page.locator("main [aria-describedby]").all():
        described_by(field)


def test_a_focused_fields_outline_stands_out_from_the_page(page, live_server):
    """A focused text box, list or text area was ringed in a pale indigo (#c7d2fe) at 1.5:1 against the white
    card: under the 3:1 that a focus indicator needs (WCAG 1.4.11), so a keyboard user could lose the field."""
    team = make_team()
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    for field in (page.get_by_role("textbox", name="Name"), page.get_by_label("Model"),
                  page.locator("#id_spec_yaml")):
        field.evaluate("element => { element.closest('form').hidden = false; element.focus(); }")
        assert field.evaluate("element => getComputedStyle(element).outlineStyle") != "none"
        assert field.evaluate(CONTRAST.replace("getComputedStyle(element).color", "getComputedStyle(element).outlineColor")
                              .replace("let behind = element", "let behind = element.parentElement")) >= 3


def test_a_refused_launch_ties_each_fields_problem_to_it(page, live_server):
    """The launch form listed its problems above the editor and again under each field, but no field was
    marked invalid or pointed at its problem and help: a screen reader tabbing on to the Model list or to
    train.max_steps heard nothing wrong with it."""
    team = make_team()
    make_base_model(team.project, name="tiny")
    make_base_model(team.project, name="small", path="/models/small")  # two: the form leaves Model to be chosen
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    page.fill("#spec-train-max_steps", "-5")
    page.get_by_role("button", name="Launch").first.click()
    page.locator("#launch-errors").wait_for()
    model = page.get_by_label("Model")
    expect(model).to_have_attribute("aria-invalid", "true")
    description = described_by(model)
    assert any(text.startswith("A registered base model") for text in description), description
    assert any(text.startswith("choose a starting model") for text in description), description
    expect(page.get_by_label("Training data")).to_have_attribute("aria-invalid", "true")
    max_steps = page.locator("#spec-train-max_steps")
    expect(max_steps).to_have_attribute("aria-invalid", "true")
    error = page.locator('[data-key="train.max_steps"] .error').first.inner_text()
    assert error in described_by(max_steps)
    expect(page.get_by_role("textbox", name="Name")).not_to_have_attribute("aria-invalid", "true")
    for field in page.locator("main [aria-describedby]").all():
        described_by(field)


def test_a_refused_run_edit_ties_the_problem_to_its_field(page, live_server, tmp_path):
    """The run page's Edit form showed 'a run needs a name' under the name, which nothing tied to the field."""
    from webapp.runs.models import Run, RunStatus

    team = make_team()
    run = Run.objects.create(project=team.project, name="sft", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/runs/{run.public_id}/")
    page.locator("#edit-form").locator("xpath=..").locator("summary").click()
    page.locator("#edit-name").fill(" ")
    page.locator("#edit-form").get_by_role("button", name="Save").click()
    name = page.locator("#edit-name")
    expect(name).to_have_attribute("aria-invalid", "true")
    assert any(text.startswith("a run needs a name") for text in described_by(name))
    expect(name).to_be_focused()
    expect(page.locator("#edit-notes")).not_to_have_attribute("aria-invalid", "true")


def test_a_refused_api_token_ties_the_problem_to_its_name(page, live_server):
    """The API tokens page said why a token was refused in a paragraph after the form, tied to nothing, with
    the focus left at the top of the page."""
    make_user("olga")
    log_in(page, live_server.url, "olga")
    page.goto(f"{live_server.url}/accounts/tokens/")
    page.get_by_role("button", name="Create token").click()
    name = page.get_by_role("textbox", name="Name")
    expect(name).to_have_attribute("aria-invalid", "true")
    error = page.locator("main .error").inner_text()
    assert error and error in described_by(name)
    expect(name).to_be_focused()


def test_a_refused_pipeline_ties_its_problems_to_the_stages_and_focuses_them(page, live_server):
    """The pipeline form listed its problems above the form, neither focused nor tied to the Stages box:
    a keyboard or screen-reader user was left at the top of the page, the box not marked as refused."""
    team = make_team()
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/pipelines/new/")
    page.get_by_role("textbox", name="Stages").fill("stages: 3")
    page.get_by_role("button", name="Start pipeline").click()
    stages = page.get_by_role("textbox", name="Stages")
    expect(stages).to_have_attribute("aria-invalid", "true")
    problems = page.locator("#pipeline-errors li").all_inner_texts()
    assert problems and all(problem in " ".join(described_by(stages)) for problem in problems), problems
    expect(stages).to_be_focused()


def test_a_refused_chat_message_marks_the_message_box(page, live_server, monkeypatch):
    """A message the server refused (blank once trimmed) was said in an alert beside the buttons, but the
    message box was not marked as refused nor tied to why: a screen-reader user back in it heard nothing."""
    from tests.browser.test_chat import conversation_with_an_answer
    from webapp.chat import services
    from webapp.chat.models import MessageStatus

    monkeypatch.setattr(services.celery_app, "send_task", lambda *args, **kwargs: None)
    team, conversation = conversation_with_an_answer(status=MessageStatus.COMPLETE, content="Hi")
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/chat/{conversation.public_id}/")
    message = page.get_by_role("textbox", name="Message")
    message.evaluate("element => { element.required = false; element.value = '   '; }")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#chat-error")).not_to_be_empty()
    expect(message).to_have_attribute("aria-invalid", "true")
    assert page.locator("#chat-error").inner_text() in described_by(message)
    expect(message).to_be_focused()
    message.fill("Hello again")
    page.get_by_role("button", name="Send").click()
    expect(page.locator(".chat-user").last).to_contain_text("Hello again")
    expect(message).not_to_have_attribute("aria-invalid", "true")


def test_every_column_of_a_table_has_a_header_that_says_something(page, live_server, tmp_path):
    """The columns of the runs table's checkboxes and of the Revoke…, Remove… and role controls had an empty
    header: a screen reader moving down such a column heard no header at all."""
    from webapp.api.services import token_create
    from webapp.chat.tokens import project_token_create
    from webapp.runs.models import Run, RunStatus

    team = make_team()
    make_base_model(team.project, name="tiny")
    Run.objects.create(project=team.project, name="sft", task="sft", status=RunStatus.SUCCEEDED, spec={"task": "sft"},
                       resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner)
    token_create(user=team.owner, name="laptop")
    project_token_create(user=team.owner, project=team.project, name="script")
    log_in(page, live_server.url, team.owner.username)
    for path in ("/p/alpha/runs/", "/p/alpha/members/", "/p/alpha/chat/", "/accounts/tokens/"):
        page.goto(f"{live_server.url}{path}")
        headers = page.locator("main table th")
        assert headers.count(), path
        assert "" not in [header.strip() for header in headers.all_text_contents()], path


def test_the_focus_on_a_control_a_status_change_takes_away_goes_to_the_status(page, asgi_server, redis_url,  # noqa: F811
                                                                              transactional_db, settings, monkeypatch):
    """A keyboard user on Cancel… when the run ended was left on a control no longer there, the next Tab
    starting again from the top of the page: the focus goes to the new status instead."""
    from tests.browser.test_runs import log_in as log_in_at
    from tests.browser.test_runs import queued_run
    from webapp.runs import reporting
    from webapp.runs.models import Run

    settings.REDIS_URL = redis_url
    team = make_team(slug="gone")
    run = queued_run(monkeypatch, team, name="ends")
    reporting.run_start(run_pk=run.pk, attempt=run.attempt, worker_name="train@host-7")
    log_in_at(page, asgi_server, "gone-teammate")
    page.goto(f"{asgi_server}/p/gone/runs/{run.public_id}/")
    page.locator("#live-state", has_text="live").wait_for()
    page.locator("#cancel-confirm summary").focus()
    reporting.run_fail(run=Run.objects.get(pk=run.pk), error=RuntimeError("out of memory"))
    expect(page.locator("#run-status")).to_have_text("failed")
    expect(page.locator("#cancel-confirm")).to_have_count(0)
    expect(page.locator("#run-status")).to_be_focused()


def test_a_message_after_a_redirect_takes_the_focus_so_it_is_read_and_tab_goes_on_from_it(page, live_server):
    """QA: a message shown after a redirect ("tom added as viewer", "Run queued", "Deleted ...") was in the page
    as it loaded, which no screen reader announces, and the focus started at the top of the page: a screen-reader
    user never heard it. As the GOV.UK design system does with its notification banner, the focus moves to the
    messages, and they are read; they are no tab stop after, and Tab goes on into the page after them."""
    team = make_team()
    make_user("tom")
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/members/")
    expect(page.locator("#messages")).to_have_count(0)
    page.fill("#id_username", "tom")
    page.select_option("#id_role", "viewer")
    page.get_by_role("button", name="Add member").click()
    messages = page.locator("#messages")
    expect(messages).to_contain_text("\u2068tom\u2069 added as viewer")
    expect(messages).to_be_focused()
    page.keyboard.press("Tab")
    expect(messages).not_to_be_focused()
    expect(messages).not_to_have_attribute("tabindex", "-1")
    assert page.evaluate("""() => {
        const messages = document.getElementById("messages"), focused = document.activeElement;
        return document.querySelector("main").contains(focused)
            && Boolean(messages.compareDocumentPosition(focused) & Node.DOCUMENT_POSITION_FOLLOWING);
    }"""), "Tab goes on to the first control after the messages"
    page.keyboard.press("Shift+Tab")
    expect(messages).not_to_be_focused()
    expect(page.locator("#messages-said")).to_be_empty()  # read once, by the focus


def test_a_message_on_a_page_that_places_the_focus_itself_is_announced_without_taking_it(page, live_server):
    """A page that comes back with a refused field focuses it (forms.js): the messages shown with it are put into
    a live region (role=status) after the page has loaded, which a screen reader announces, and the focus stays
    on the field."""
    team = make_team()
    make_user("tom")
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/members/")
    csrf = next(cookie["value"] for cookie in page.context.cookies() if cookie["name"] == "csrftoken")
    added = page.request.post(f"{live_server.url}/p/alpha/members/", form={"username": "tom", "role": "viewer"},
                              headers={"X-CSRFToken": csrf}, max_redirects=0)
    assert added.status == 302  # its message waits for the next page shown
    page.fill("#id_username", "nobody")
    with page.expect_navigation() as navigation:
        page.get_by_role("button", name="Add member").click()
    username = page.get_by_role("textbox", name="Username")
    expect(username).to_have_attribute("aria-invalid", "true")
    expect(page.locator(".messages")).to_contain_text("\u2068tom\u2069 added as viewer")
    said = page.locator("#messages-said")
    expect(said).to_have_attribute("role", "status")
    assert '<p id="messages-said" class="visually-hidden" role="status"></p>' in navigation.value.text(), (
        "the live region is empty as the page loads: content there at load is not announced")
    expect(said).to_have_text("\u2068tom\u2069 added as viewer.")
    expect(username).to_be_focused()
    expect(page.locator("#messages")).not_to_have_attribute("tabindex", "-1")


def test_the_chart_downloads_and_show_hidden_buttons_work_from_the_keyboard(page, live_server, monkeypatch):
    """The run and compare pages' chart controls from the keyboard: Tab reaches the CSV link and each chart's PNG
    button, each named for what it downloads, and Enter downloads. "Show the N hidden runs" (or groups) hid itself as it
    showed them, and the focus fell to the page's start: a keyboard user was sent back past the whole page. It goes to
    the charts the button showed again."""
    from tests.browser.test_runs import eval_grouped_by_task_spec, open_a_sweeps_comparison
    from webapp.runs import services
    from webapp.runs.models import MetricPoint, Run, RunStatus

    runs = open_a_sweeps_comparison(page, live_server, monkeypatch, slug="keyboard")
    page.goto(page.url + f"&hide={runs[0].public_id}")
    show = page.get_by_role("button", name="Show the 1 hidden run")
    show.focus()
    page.keyboard.press("Enter")
    expect(show).to_be_hidden()
    expect(page.locator("#compare-charts")).to_be_focused()
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team(slug="keyboardrun")
    run = services.run_create(project=team.project, spec=eval_grouped_by_task_spec(team.project), user=team.owner,
                              name="grouped")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    MetricPoint.objects.bulk_create([
        MetricPoint(run=run, step=step, name=name, value=value * step, wall_time=float(step), tokens=step)
        for step in (10, 20) for name, value in (("loss", 1.0), ("eval/loss/sum", 0.5), ("eval/loss/difference", 0.25))])
    log_out(page)
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/keyboardrun/runs/{run.public_id}/?hidegroups=sum")
    page.locator("#run-ema").focus()
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Download metrics (CSV)")).to_be_focused()
    page.keyboard.press("Tab")
    show = page.get_by_role("button", name="Show the 1 hidden group")
    expect(show).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Download the loss chart as PNG")).to_be_focused()
    page.keyboard.press("Tab")  # the chart by group's legend: one Tab stop, at its first entry (static/plot_legend.js)
    expect(page.get_by_role("button", name="Show difference")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Download the eval/loss by task chart as PNG")).to_be_focused()
    with page.expect_download() as download:
        page.keyboard.press("Enter")
    assert download.value.suggested_filename == f"keyboardrun-{run.public_id}-eval_loss_by_task.png"
    show.focus()
    page.keyboard.press("Enter")
    expect(show).to_be_hidden()
    expect(page.locator("#charts")).to_be_focused()
    assert "hidegroups=" not in page.url
