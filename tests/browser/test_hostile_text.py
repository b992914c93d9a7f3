"""Hostile text on the pages that show it: markup runs nowhere (no dialog opens) and becomes no element, a long unbroken
string wraps instead of widening the page, and a fenced code block in rendered markdown is readable
(it was light grey on light grey: the inline-code chip inside the dark block)."""
from __future__ import annotations

import pytest

from tests.browser.test_projects import log_in
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.api import services as api_tokens
from webapp.chat.models import Battle, Conversation, Message, Role
from webapp.review import services as review_services
from webapp.runs import services as run_services
from webapp.runs.models import Pipeline, Run, RunStatus

pytestmark = pytest.mark.browser

MARKUP = "<script>alert(1)</script><img src=x onerror=alert(2)>"
UNBROKEN = "W" * 1500
MARKDOWN = f"[click](javascript:alert(3)) {MARKUP}\n\n```\nprint('fenced')\n```\n"

PAGE_FACTS = """() => ({width: document.documentElement.scrollWidth, viewport: innerWidth,
    javascriptLinks: [...document.querySelectorAll('a[href]')].filter(a => /^\\s*javascript:/i.test(a.getAttribute('href'))).length,
    injected: document.querySelectorAll('img[src="x"], [onerror], script:not([src]):not([type="application/json"])').length})"""


def test_hostile_names_and_texts_neither_run_nor_widen_the_page(page, live_server):
    team = make_team()
    base_model = make_base_model(team.project, name="tiny")
    conversation = Conversation.objects.create(project=team.project, user=team.owner, model_ref=base_model.public_id,
                                               model_label="Base model: tiny", title=MARKUP + UNBROKEN[:190])
    Message.objects.create(conversation=conversation, role=Role.USER, content=MARKUP + UNBROKEN)
    Message.objects.create(conversation=conversation, role=Role.ASSISTANT, content=MARKDOWN + UNBROKEN)
    run = Run.objects.create(project=team.project, name=MARKUP + UNBROKEN[:60], task="sft", status=RunStatus.FAILED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(live_server.url)},
                             error_message=MARKUP + UNBROKEN, created_by=team.owner)
    run_services.run_tags_write(run=run, tags=[MARKUP])  # the run's list and the table's tag menu
    campaign = review_services.campaign_create(project=team.project, name="c" + MARKUP, guidelines=MARKDOWN + UNBROKEN,
                                               required_reviews=1, reviewers=[team.owner], source_version=None,
                                               user=team.owner)
    review_services.item_add(campaign=campaign, prompt=MARKUP, response_a=UNBROKEN, response_b=MARKDOWN, source="arena")
    # A voted battle between two models with long hostile names: the leaderboard and the arena's table
    # of battles were 2,900 px wide with a 128-character run name.
    sides = [Conversation.objects.create(project=team.project, user=team.owner, model_ref=f"run_{letter}", in_arena=True,
                                         model_label=f"Run: {letter}{MARKUP}{UNBROKEN[:120]}") for letter in "ab"]
    for side in sides:
        Message.objects.create(conversation=side, role=Role.USER, content=MARKUP)
        Message.objects.create(conversation=side, role=Role.ASSISTANT, content=MARKDOWN)
    Battle.objects.create(project=team.project, user=team.owner, prompt=MARKUP + UNBROKEN, side_a=sides[0],
                          side_b=sides[1], outcome="a")
    # secqa: the pages that show a dataset's rows, a model's config.json and an external run's config and samples,
    # and a campaign's items (each value a member or a model wrote).
    version = make_ready_version(team.project, name="d" + MARKUP, rows=[{"prompt": MARKUP, "completion": MARKDOWN}])
    hostile_model = make_base_model(team.project, name="m" + MARKUP, path="/models/hostile")
    hostile_model.config = {"architectures": [MARKUP], "model_type": MARKUP, MARKUP: MARKDOWN}
    hostile_model.save()
    external = run_services.run_create_external(project=team.project, name="e" + MARKUP, config={MARKUP: MARKUP},
                                                user=team.owner, tags=["<img src=x onerror=alert(4)>"])
    run_services.metrics_log(run=external, points=[{"step": step, "metrics": {"reward/" + MARKUP: 1.0}} for step in (1, 2)])
    run_services.samples_log(run=external, samples=[{"step": 1, "prompt": MARKUP, "text": MARKDOWN, "answer": MARKUP,
                                                     MARKUP: MARKUP}])
    dataset = f"datasets/{version.dataset.public_id}/"
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, live_server.url, team.owner.username)
    for path in (f"chat/{conversation.public_id}/", "chat/", "runs/", f"runs/{run.public_id}/",
                 f"review/{campaign.public_id}/", f"review/{campaign.public_id}/next/", "arena/", "arena/leaderboard/",
                 "datasets/", dataset, f"{dataset}v/1/", f"{dataset}v/1/?q=%3Cscript%3E", "models/",
                 f"models/{hostile_model.public_id}/", f"runs/{external.public_id}/",
                 f"runs/{external.public_id}/samples/?step=1", f"review/{campaign.public_id}/items/",
                 f"runs/compare/?runs={run.public_id}&runs={external.public_id}", "storage/"):
        page.goto(f"{live_server.url}/p/alpha/{path}")
        facts = page.evaluate(PAGE_FACTS)
        assert facts["width"] <= facts["viewport"], f"{path}: the page is {facts['width']} px wide"
        assert facts["javascriptLinks"] == 0, path
        assert facts["injected"] == 0, f"{path}: the hostile text became {facts['injected']} element(s)"
    page.goto(f"{live_server.url}/p/alpha/chat/{conversation.public_id}/")
    fenced = page.locator("pre code", has_text="print('fenced')")
    # The answer's raw HTML is text, shown as the model wrote it (it was sanitized away, words and all).
    assert MARKUP in page.locator(".chat-assistant .chat-text").inner_text()
    assert fenced.evaluate("code => getComputedStyle(code).backgroundColor") == "rgba(0, 0, 0, 0)"
    assert fenced.evaluate("code => getComputedStyle(code).color") == \
        page.locator("pre", has_text="print('fenced')").evaluate("pre => getComputedStyle(pre).color")
    assert dialogs == []


DOUBLE_CLICK = """() => { const button = document.querySelector('#launch-form button[type=submit]');
    button.click(); setTimeout(() => button.click(), 80); }"""


def test_a_double_click_on_launch_queues_one_run_and_back_can_launch_again(page, live_server, monkeypatch, recwarn):
    """A double click sends once; Back and Launch unchanged lands on that run (the server's one-time
    token, put back by forms.js on a page fetched again); Back, change, Launch is a new run."""
    from tests.webapp.factories import make_ready_version

    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)  # queued, not trained
    team = make_team()
    base_model = make_base_model(team.project, name="tiny")
    version = make_ready_version(team.project, name="chats", kind="sft")
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    page.select_option("#spec-model", base_model.public_id)
    page.select_option("select[name='data.train']", version.public_id)
    page.fill("input[name='train.max_steps']", "3")
    page.evaluate(DOUBLE_CLICK)
    page.wait_for_url("**/runs/run_*/")
    page.wait_for_timeout(500)  # a second request, had one gone out, would have landed by now
    assert Run.objects.count() == 1
    page.go_back()
    page.wait_for_url("**/runs/new/**")
    assert page.locator("#launch-form button[type=submit]").is_enabled()
    # Launch again unchanged: the server answers with the run the first press made.
    page.locator("#launch-form button[type=submit]").click()
    page.wait_for_url("**/runs/run_*/")
    assert Run.objects.count() == 1 and "already sent" in page.content()
    # Back, change the form, Launch: that is a new run.
    page.go_back()
    page.wait_for_url("**/runs/new/**")
    page.fill("input[name='train.max_steps']", "4")
    page.locator("#launch-form button[type=submit]").click()
    page.wait_for_url("**/runs/run_*/")
    assert sorted(Run.objects.values_list("total_steps", flat=True)) == [3, 4]
    # The run page's event stream, served by the (WSGI) live server, was collected to its end first.
    assert [str(warning.message) for warning in recwarn if "StreamingHttpResponse" in str(warning.message)] == []


def test_wide_tables_scroll_in_their_place_in_a_narrow_window(page, live_server):
    """At 800 px the runs table (twelve columns), the base models table and the workers table (a worker
    and pool named with underscores, which do not break a line) were wider than the window: the whole page
    scrolled sideways, the author column beyond the edge, and a run's tags broke mid-word ('wal/k').
    They scroll inside their own box now, and a tag stays whole."""
    from django.utils import timezone

    from webapp.workers.services import worker_heartbeat_record

    team = make_team()
    pool = "h100_reserved_for_research_long_jobs"
    worker_heartbeat_record(name=f"train_{pool}@gpu017.rack4.useast2.internal", host="gpu017.rack4.useast2.internal",
                            pid=4242, queues=[f"train-{pool}"], current_jobs=[], started_at=timezone.now(), pool=pool,
                            devices={"platform": "gpu", "count": 8, "kinds": ["NVIDIA H100 80GB HBM3"]})
    make_base_model(team.project, name="a-base-model-with-a-long-name")
    for name, tags in (("lr 1e-3 warmup 10 cosine schedule", ["walk", "ünïcode-sweep"]), ("x", ["a"])):
        Run.objects.create(project=team.project, name=name, task="sft", status=RunStatus.SUCCEEDED, spec={"task": "sft"},
                           resolved_spec={"output_dir": str(live_server.url)}, created_by=team.owner, tags=tags,
                           total_steps=30, current_step=30, train_seconds=12.0,
                           final_metrics={"loss": {"last": 4.3377, "min": 4.3377, "max": 12.1, "step": 30},
                                          "eval/loss": {"last": 4.6962, "min": 4.6962, "max": 8.4, "step": 30}})
    page.set_viewport_size({"width": 800, "height": 900})
    log_in(page, live_server.url, team.owner.username)
    for path, table in (("p/alpha/runs/", "table.runs-table"), ("p/alpha/models/", "table.table"),
                        ("workers/", "table#workers")):
        page.goto(f"{live_server.url}/{path}")
        facts = page.evaluate(PAGE_FACTS)
        assert facts["width"] <= facts["viewport"], f"{path}: the page is {facts['width']} px wide"
        box = page.locator(table).evaluate("table => table.parentElement.getBoundingClientRect().right")
        assert box <= facts["viewport"], path
        assert page.locator(table).evaluate("t => getComputedStyle(t.parentElement).overflowX") == "auto", path
    page.goto(f"{live_server.url}/p/alpha/runs/")
    heights = [tag.evaluate("element => element.getBoundingClientRect().height")
               for tag in page.locator(".runs-table .tag").all()]
    assert len(heights) == 3 and len(set(heights)) == 1, f"a tag broke over lines: {heights}"


# A heading's lines and words: more lines than words means its words are broken to fit.
HEADING_LINES = """h => { const style = getComputedStyle(h);
    const line = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.2;
    return [Math.round(h.getBoundingClientRect().height / line), h.textContent.trim().split(/\\s+/).length]; }"""


def test_every_page_fits_a_phone_wide_window(page, live_server):
    """At 400 px the top bar pushed Log out past the edge and the project bar its last tabs (Members and
    the role), so every page scrolled sideways; the projects and API tokens tables, a run page's
    actions and samples table, the launch page's task tabs and the campaign page's agreement figures
    did too, and so did the datasets, pipeline and leaderboard tables and the arena's export and review
    forms. The bars and inline forms wrap, wide tables scroll in their own box and facts stack under
    their terms."""
    team = make_team()
    run = Run.objects.create(project=team.project, name="sft-lora", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(live_server.url)},
                             created_by=team.owner, total_steps=30, current_step=30)
    run.samples.create(step=30, position=0, prompt="What is 2 + 3?", text="5", answer="5")
    campaign = review_services.campaign_create(project=team.project, name="c", guidelines="", required_reviews=1,
                                               reviewers=[team.owner], source_version=None, user=team.owner)
    make_ready_version(team.project, name="chats")
    pipeline = Pipeline.objects.create(project=team.project, name="sft-more", created_by=team.owner, stages=[
        {"name": "sft", "spec": {"task": "sft"}}, {"name": "sft-more", "spec": {"task": "sft"},
                                                   "guard": {"metric": "eval/loss", "max_drop_percent": 5}}])
    page.set_viewport_size({"width": 400, "height": 800})
    log_in(page, live_server.url, team.owner.username)
    api_tokens.token_create(user=team.owner, name="laptop")
    for path in ("", "p/alpha/", "p/alpha/members/", "accounts/tokens/", "p/alpha/datasets/", "p/alpha/runs/new/",
                 f"p/alpha/runs/{run.public_id}/", f"p/alpha/pipelines/{pipeline.public_id}/",
                 f"p/alpha/review/{campaign.public_id}/", "p/alpha/arena/", "p/alpha/arena/leaderboard/",
                 "p/alpha/review/", "p/alpha/runs/", "p/alpha/storage/"):
        page.goto(f"{live_server.url}/{path}")
        facts = page.evaluate(PAGE_FACTS)
        assert facts["width"] <= facts["viewport"], f"/{path}: the page is {facts['width']} px wide"
        # The heading keeps the width of its words: beside two buttons, 'Review campaigns' was squeezed
        # to a column of one letter a line.
        lines, words = page.locator("main h1").first.evaluate(HEADING_LINES)
        assert lines <= words, f"/{path}: the heading's {words} words take {lines} lines"
        links = [page.get_by_role("button", name="Log out")]
        if path.startswith("p/"):
            links.append(page.locator("nav.subnav").get_by_role("link", name="Members"))
        for link in links:
            assert link.evaluate("element => element.getBoundingClientRect().right") <= 400, f"/{path}"
    for width in (500, 600, 700):
        page.set_viewport_size({"width": width, "height": 800})
        page.goto(f"{live_server.url}/p/alpha/review/")
        lines, words = page.locator("main h1").first.evaluate(HEADING_LINES)
        assert lines <= words, f"at {width} px the review list's heading's {words} words take {lines} lines"


def test_long_names_in_the_launch_forms_selects_stay_inside_the_form(page, live_server):
    """A select is as wide as its longest option, and a fieldset at least as wide as its content: a
    120-character run name among the starting models pushed 'Start from' (and the page) past the window."""
    from tests.webapp.factories import make_ready_version

    team = make_team()
    make_base_model(team.project, name="tiny")
    Run.objects.create(project=team.project, name="lora sweep " + "with a long descriptive name " * 4, task="sft",
                       status=RunStatus.SUCCEEDED, spec={"task": "sft"}, resolved_spec={"output_dir": "/nowhere"},
                       created_by=team.owner)
    make_ready_version(team.project, name="chats " + "from the support desk, cleaned " * 3, kind="sft")
    log_in(page, live_server.url, team.teammate.username)
    for width in (1280, 800):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
        facts = page.evaluate(PAGE_FACTS)
        assert facts["width"] <= facts["viewport"], f"at {width} px the page is {facts['width']} px wide"
        form_right = page.locator("#launch-form").evaluate("form => form.getBoundingClientRect().right")
        for select in ("#spec-model", "select[name='data.train']", "select[name='data.eval']"):
            assert page.locator(select).evaluate("s => s.getBoundingClientRect().right") <= form_right, (width, select)


def test_the_launch_forms_defaults_read_as_a_spec_writes_them_and_stay_in_their_field(page, live_server):
    """peft.targets' help ended 'Default: ['q_proj', 'k_proj', ...].' on one unbreakable line that ran
    over the next field's help at 800 px; booleans read 'Default: False.'"""
    team = make_team()
    log_in(page, live_server.url, team.teammate.username)
    page.set_viewport_size({"width": 800, "height": 900})
    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    targets = page.locator(".spec-field[data-key='peft.targets'] .default")
    assert targets.inner_text() == "Default: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj."
    field = page.locator(".spec-field[data-key='peft.targets']").bounding_box()
    text = targets.bounding_box()
    assert text["x"] + text["width"] <= field["x"] + field["width"], "the default ends inside its field"
    assert page.locator(".spec-field[data-key='data.packing'] .default").inner_text() == "Default: false."
    assert page.locator(".spec-field[data-key='train.max_steps'] .default").count() == 0  # no default: none shown
    assert page.locator(".spec-field[data-key='optim.warmup_steps'] .default").inner_text() == "Default: 0."
