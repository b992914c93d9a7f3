"""Bidi controls in people's text (U+202E RIGHT-TO-LEFT OVERRIDE, the U+2066-2069 isolates, U+200F)
stay inside that text: every piece of it on the main pages is shown in a bidi isolate of its own
(or alone in its block), so it cannot reorder the page's words around it."""
from __future__ import annotations

import pytest

from tests.browser.test_projects import log_in
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.chat.models import Conversation, Message, Role
from webapp.projects.models import Project
from webapp.review import services as review_services
from webapp.review.models import Campaign
from webapp.runs import pipelines
from webapp.runs import services as run_services
from webapp.runs.models import Pipeline, Run, RunStatus, Sample

pytestmark = pytest.mark.browser

RLO, LRI, PDI, RLM = "\u202e", "\u2066", "\u2069", "\u200f"
END = "\u00a7"  # every hostile value ends with it, so what follows one in the page is the page's text


def hostile(word: str) -> str:
    """A name that, if not isolated, writes everything after it on its line backwards."""
    return f"{word}{PDI}{RLO}{RLM}{LRI}{END}"  # a stray PDI, and an LRI left open, against the isolates


# Text nodes holding a bidi control whose isolate (the nearest ancestor with unicode-bidi isolate
# or plaintext, or a block, where a bidi paragraph ends) goes on after the hostile value: that
# text would be reordered.
LEAKS = """() => {
  const HOSTILE = /[\\u202a-\\u202e\\u2066-\\u2069\\u200f]/;
  const ISOLATING = new Set(["isolate", "plaintext", "isolate-override"]);
  const leaks = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const parent = node.parentElement;
    if (!HOSTILE.test(node.data) || parent.closest("script, style, template, textarea, select, [hidden]")) continue;
    if (!parent.getClientRects().length) continue;  // not shown
    let root = parent;
    while (root !== document.body) {
      const style = getComputedStyle(root);
      if (ISOLATING.has(style.unicodeBidi) || !style.display.startsWith("inline")) break;
      root = root.parentElement;
    }
    // The closers the server adds at a text's end (webapp/core/bidi.py) belong to it.
    if (!root.textContent.trim().replace(/[\u202a-\u202e\u2066-\u2069]+$/, "").endsWith("\u00a7")) {
      leaks.push(`<${root.tagName.toLowerCase()} class="${root.className}">${root.textContent.trim().slice(0, 80)}`);
    }
  }
  return leaks;
}"""


def test_bidi_controls_in_names_and_texts_reorder_nothing_around_them(page, live_server):
    team = make_team()
    Project.objects.filter(pk=team.project.pk).update(name=hostile("proj"), description=hostile("description"))
    base_model = make_base_model(team.project, name=hostile("model"))
    version = make_ready_version(team.project, name=hostile("data"), kind="sft",
                                 rows=[{"prompt": hostile("prompt"), "completion": hostile("answer")}])
    run = Run.objects.create(project=team.project, name=hostile("run"), task="sft", status=RunStatus.FAILED,
                             spec={"task": "sft", "model": base_model.public_id}, base_model=base_model,
                             resolved_spec={"output_dir": str(live_server.url)}, error_message=hostile("error"),
                             created_by=team.owner, notes=hostile("notes"))
    run_services.run_tags_write(run=run, tags=[hostile("tag")])  # the run's list and the table's tag menu
    version.original_filename = hostile("file")
    version.save(update_fields=["original_filename"])
    run.dataset_versions.set([version])
    Sample.objects.create(run=run, step=1, position=0, prompt=hostile("sample prompt"), text=hostile("sample"))
    conversation = Conversation.objects.create(project=team.project, user=team.owner, model_ref=base_model.public_id,
                                               model_label=hostile("label"), title=hostile("title"))
    Message.objects.create(conversation=conversation, role=Role.USER, content=hostile("question"))
    Message.objects.create(conversation=conversation, role=Role.ASSISTANT, content=hostile("reply"))
    campaign = review_services.campaign_create(project=team.project, name="campaign",
                                               guidelines=hostile("guidelines"), required_reviews=1,
                                               reviewers=[team.owner], source_version=None, user=team.owner)
    Campaign.objects.filter(pk=campaign.pk).update(name=hostile("campaign"))  # stored before names refused them
    review_services.item_add(campaign=campaign, prompt=hostile("item"), response_a=hostile("a"),
                             response_b=hostile("b"), source="arena")
    log_in(page, live_server.url, team.owner.username)
    leaks = {}
    for path in ("/", "/p/alpha/", "/p/alpha/runs/", f"/p/alpha/runs/{run.public_id}/", "/p/alpha/datasets/",
                 f"/p/alpha/datasets/{version.dataset.public_id}/", f"/p/alpha/datasets/{version.dataset.public_id}/v/1/",
                 "/p/alpha/models/", f"/p/alpha/models/{base_model.public_id}/", "/p/alpha/chat/",
                 f"/p/alpha/chat/{conversation.public_id}/", "/p/alpha/review/", f"/p/alpha/review/{campaign.public_id}/",
                 f"/p/alpha/review/{campaign.public_id}/next/", f"/p/alpha/review/{campaign.public_id}/items/",
                 f"/p/alpha/runs/compare/?runs={run.public_id}", "/p/alpha/runs/new/", "/p/alpha/members/",
                 "/p/alpha/arena/", "/p/alpha/arena/leaderboard/", "/p/alpha/storage/", "/p/alpha/settings/"):
        response = page.goto(live_server.url + path)
        assert response.status == 200, path
        if found := page.evaluate(LEAKS):
            leaks[path] = found
    assert leaks == {}
    # As drawn: the run's id, after its name in the heading, is still to the right of it.
    page.goto(f"{live_server.url}/p/alpha/runs/{run.public_id}/")
    name, run_id = (page.locator(selector).bounding_box() for selector in ("h1 bdi", "h1 .run-id"))
    assert run_id["x"] >= name["x"] + name["width"] - 0.5


# The left edge, as drawn on one line, of each of ``parts`` (in order) within the shown text equal to ``text``.
PART_LEFTS = """([text, parts]) => {
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.data.trim() !== text || !node.parentElement.getClientRects().length) continue;
    node.parentElement.style.whiteSpace = "nowrap";  // a narrow column wraps it: a part on the next line starts left
    let from = 0;
    return parts.map((part) => {
      const start = node.data.indexOf(part, from);
      from = start + part.length;
      const range = document.createRange();
      range.setStart(node, start);
      range.setEnd(node, from);
      return range.getBoundingClientRect().left;
    });
  }
  return null;
}"""


def test_a_pipeline_stages_run_name_reads_in_order_beside_right_to_left_names(page, live_server):
    """A stage's run is named after its pipeline and its stage. Read as "<pipeline> · 1. <stage>", a pipeline
    name ending in right-to-left letters took the stage's number (and a right-to-left stage name) into its
    right-to-left run: "Qwen עברית · 2. שלב" was drawn "Qwen בלש .2 · תירבע", the stage before the pipeline.
    A run name may hold no bidi isolate (``core.text.checked_name``), so the word "stage" keeps them apart."""
    team = make_team()
    pipeline = Pipeline.objects.create(project=team.project, name="Qwen עברית", created_by=team.owner,
                                       stages=[{"name": "sft", "spec": {}}, {"name": "שלב", "spec": {}}])
    names = [pipelines._stage_run_name(pipeline, index) for index in (0, 1)]
    for name in names:
        Run.objects.create(project=team.project, name=name, task="sft", spec={}, resolved_spec={}, pipeline=pipeline,
                           created_by=team.owner)
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/runs/")
    for name, number, stage in zip(names, "12", ("sft", "שלב")):
        lefts = page.evaluate(PART_LEFTS, [name, ["עברית", number, stage]])
        assert lefts is not None and lefts == sorted(lefts), (name, lefts)
