"""Campaigns on two models' answers: creating one (scoped to the project, owners only), the prompts
it asks, its items made at once when the answers are in, failure with nothing half-made."""
import json
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from tests.webapp.factories import form_token, make_base_model, make_ready_version, thinking_model_dir
from tests.webapp.review.conftest import answer
from webapp.core.bidi import isolated
from webapp.review import services
from webapp.review.models import Campaign, CampaignStatus, Item, ItemSource, Review

SFT_ROWS = [
    {"prompt": "Name a colour.", "completion": "Blue."},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
                  {"role": "assistant", "content": "Bye."}]},
    {"prompt": "Spell cat", "completion": "c-a-t"},
]


@pytest.fixture
def models(team):
    return [make_base_model(team.project, name=name, path=f"/models/{name}") for name in ("falcon", "heron")]


@pytest.fixture
def prompts_version(team):
    return make_ready_version(team.project, name="chats", kind="sft", rows=SFT_ROWS, user=team.owner)


def generate(team, models, prompts_version, **overrides):
    arguments = dict(project=team.project, name="falcon vs heron", guidelines="", required_reviews=1,
                     reviewers=[team.teammate], model_a=models[0].public_id, model_b=models[1].public_id,
                     prompts_version=prompts_version, prompt_count=2,
                     sampling=services.GenerationSettings(max_new_tokens=16, temperature=0.0), user=team.owner)
    return services.campaign_generate(**{**arguments, **overrides})


@pytest.fixture
def generation_queued_in_redis(team, models, prompts_version, sent_tasks, redis_server, settings,
                               django_capture_on_commit_callbacks):
    """A generating campaign whose task's message waits in Redis as the real send leaves it, in a database no test
    worker listens on (the broker and ``settings.REDIS_URL`` for the test): (the campaign, that database's client)."""
    import redis
    from celery import Celery

    from tests.live import _use_broker
    from webapp.celery import app as celery_app

    url = f"redis://127.0.0.1:{redis_server.port}/9"
    settings.REDIS_URL = url
    broker = redis.Redis.from_url(url)
    broker.flushdb()
    previous = celery_app.conf.broker_url
    _use_broker(celery_app, url)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            campaign = generate(team, models, prompts_version)
        name, args, queue = sent_tasks[-1]
        Celery.send_task(celery_app, name, args=args, queue=queue)
        yield campaign, broker
    finally:
        _use_broker(celery_app, previous)


def test_it_queues_the_generation_on_the_serve_queue(team, models, prompts_version, sent_tasks,
                                                    django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        campaign = generate(team, models, prompts_version)
    assert sent_tasks == [(services.GENERATE_TASK, [campaign.pk], "serve")]
    assert campaign.status == CampaignStatus.GENERATING and not campaign.items.exists()
    generation = campaign.generation
    assert (generation["model_a"]["ref"], generation["model_a"]["path"]) == (models[0].public_id, "/models/falcon")
    assert generation["model_b"]["label"] == "Base model: heron"
    assert generation["prompts"] == {"version": prompts_version.public_id, "label": str(prompts_version), "count": 2}
    assert generation["sampling"] == {"max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0,
                                      "enable_thinking": None}
    assert services.queue_next_item(campaign=campaign, user=team.teammate) is None, "nothing to review yet"


def test_it_asks_the_first_prompts_of_the_version(team, models, prompts_version):
    campaign = generate(team, models, prompts_version, prompt_count=3)
    prompts = services.generation_prompts(campaign=campaign)
    assert [prompt.row for prompt in prompts] == [1, 2, 3]
    assert prompts[0].prompt == "Name a colour."
    # A conversation is asked for its last assistant turn.
    assert prompts[1].prompt == SFT_ROWS[1]["messages"][:4]
    assert len(services.generation_prompts(campaign=generate(team, models, prompts_version, name="two"))) == 2


def test_a_preference_conversation_without_an_assistant_turn_is_asked_whole(team, models):
    # Valid preference rows: whole conversations need no assistant turn; the prompt is then all of it.
    chat = [{"role": "user", "content": "Tell me a joke"}]
    version = make_ready_version(team.project, name="chat prefs", kind="preference", user=team.owner,
                                 rows=[{"chosen": chat, "rejected": chat}])
    campaign = generate(team, models, version, prompt_count=1)
    assert [(prompt.row, prompt.prompt) for prompt in services.generation_prompts(campaign=campaign)] == [(1, chat)]


def test_its_items_are_made_at_once_with_their_models(team, models, prompts_version):
    campaign = generate(team, models, prompts_version, prompt_count=3)
    prompts = services.generation_prompts(campaign=campaign)
    services.generation_progress(campaign_id=campaign.pk, answers=3)
    assert Campaign.objects.get(pk=campaign.pk).generated_answers == 3
    campaign = services.generation_finish(campaign_id=campaign.pk, prompts=prompts,
                                          answers_a=["Red.", "", "c a t"], answers_b=["Green.", "Bye!", "k-a-t"])
    assert campaign.status == CampaignStatus.READY and campaign.generation["empty_answers"] == 1
    items = list(campaign.items.order_by("sequence"))
    assert [(item.source_row, item.response_a, item.response_b) for item in items] == [
        (1, "Red.", "Green."), (3, "c a t", "k-a-t")]
    assert items[0].source == ItemSource.RUNS and items[0].prompt == "Name a colour." and items[0].original_label == ""
    assert items[0].metadata == {"model_a": models[0].public_id, "model_a_label": "Base model: falcon",
                                 "model_b": models[1].public_id, "model_b_label": "Base model: heron",
                                 "prompts_version": prompts_version.public_id}
    assert services.queue_next_item(campaign=campaign, user=team.teammate).sequence == 1
    again = services.generation_finish(campaign_id=campaign.pk, prompts=prompts, answers_a=["x"] * 3,
                                       answers_b=["y"] * 3)
    assert again.items.count() == 2, "a redelivered task finishing second adds nothing"


def test_it_fails_with_nothing_made_when_every_pair_is_empty(team, models, prompts_version):
    campaign = generate(team, models, prompts_version)
    prompts = services.generation_prompts(campaign=campaign)
    campaign = services.generation_finish(campaign_id=campaign.pk, prompts=prompts, answers_a=["", "a"],
                                          answers_b=["b", ""])
    assert campaign.status == CampaignStatus.FAILED and "empty answer" in campaign.load_error
    assert not campaign.items.exists()


def test_a_failed_generation_keeps_its_reason_and_no_items(team, models, prompts_version):
    campaign = generate(team, models, prompts_version)
    services.generation_fail(campaign_id=campaign.pk, reason="Base model: falcon cannot answer row 2")
    campaign.refresh_from_db()
    assert (campaign.status, campaign.load_error) == (CampaignStatus.FAILED, "Base model: falcon cannot answer row 2")
    prompts = services.generation_prompts(campaign=campaign)
    services.generation_finish(campaign_id=campaign.pk, prompts=prompts, answers_a=["a", "a"], answers_b=["b", "b"])
    assert not Item.objects.filter(campaign=campaign).exists(), "a late answer does not revive a failed campaign"


def test_a_deleted_prompts_version_is_named(team, models, prompts_version):
    campaign = generate(team, models, prompts_version)
    prompts_version.delete()
    with pytest.raises(ValidationError, match="has been deleted"):
        services.generation_prompts(campaign=campaign)


@pytest.mark.parametrize("overrides, field, message", [
    ({"model_b": "same"}, "model_b", "two different models"),
    ({"model_a": "bm_nope"}, "model_a", "not a model of alpha"),
    ({"prompt_count": 0}, "prompt_count", "1 to 5000"),
    ({"name": " "}, "name", "give the campaign a name"),
])
def test_it_rejects_bad_requests(team, models, prompts_version, overrides, field, message):
    if overrides.get("model_b") == "same":
        overrides = {"model_b": models[0].public_id}
    with pytest.raises(ValidationError) as error:
        generate(team, models, prompts_version, **overrides)
    assert message in " ".join(error.value.message_dict[field])
    assert not Campaign.objects.exists()


def test_it_rejects_another_projects_model_and_data(team, models, prompts_version):
    elsewhere = make_base_model(team.outsider_project, name="stranger", path="/models/stranger")
    with pytest.raises(ValidationError) as error:
        generate(team, models, prompts_version, model_b=elsewhere.public_id)
    assert "model_b" in error.value.message_dict
    foreign = make_ready_version(team.outsider_project, name="theirs", kind="prompts", rows=[{"prompt": "x"}])
    with pytest.raises(ValidationError, match="dataset version of this project"):
        generate(team, models, foreign)
    text = make_ready_version(team.project, name="books", kind="text", rows=[{"text": "x"}])
    with pytest.raises(ValidationError, match="which has no prompts"):
        generate(team, models, text)
    with pytest.raises(ValidationError, match="cannot review"):
        generate(team, models, prompts_version, reviewers=[team.viewer])


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("top_p", 0.0), ("top_k", -1),
                                          ("max_new_tokens", 0), ("seed", -1), ("enable_thinking", "off")])
def test_it_rejects_bad_sampling_settings(field, value):
    with pytest.raises(ValidationError) as error:
        services.GenerationSettings(**{field: value})
    assert list(error.value.message_dict) == [{"enable_thinking": "thinking"}.get(field, field)]


# --- Pages -----------------------------------------------------------------------------------------------

def test_the_owner_creates_one_from_the_form(team, client_for, models, prompts_version):
    url = reverse("review:generate", args=[team.project.slug])
    page = client_for(team.owner).get(url).content.decode()
    assert f"Base model: {isolated('falcon')}" in page and f"{isolated('chats')} v1 (sft, 3 rows)" in page
    response = client_for(team.owner).post(url, {
        "name": "pass 1", "model_a": models[0].public_id, "model_b": models[1].public_id,
        "prompts_version": prompts_version.public_id, "prompt_count": 2, "max_new_tokens": 32, "temperature": 0.5,
        "top_p": 0.9, "top_k": 40, "seed": 7, "guidelines": "", "required_reviews": 1, "reviewers": [team.teammate.pk]})
    campaign = Campaign.objects.get(name="pass 1")
    assert response.status_code == 302 and response.url == reverse("review:detail", args=[team.project.slug,
                                                                                          campaign.public_id])
    assert campaign.generation["sampling"] == {"max_new_tokens": 32, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
                                               "seed": 7, "enable_thinking": None}
    page = client_for(team.teammate).get(response.url).content.decode()
    assert "campaign-generating" in page and "0</b> of 4 answers" in page


def test_the_chats_thinking_switch_is_a_generation_setting_kept_and_shown(team, client_for, prompts_version,
                                                                           tmp_path):
    """A generated campaign had no Thinking switch: a Qwen3 model answered with thinking on (or as its run trained),
    whatever the campaign meant to compare. The form offers the chat's switch for both models where a model of the
    project reads enable_thinking; the campaign keeps it with its sampling settings (the serve worker renders each
    prompt with it: tests/integration/test_review_generation.py) and its page says it."""
    models = [make_base_model(team.project, name="thinker", path=str(thinking_model_dir(tmp_path / "thinker"))),
              make_base_model(team.project, name="heron", path="/models/heron")]
    url = reverse("review:generate", args=[team.project.slug])
    page = client_for(team.owner).get(url).content.decode()
    assert '<select name="thinking"' in page and "Each model&#x27;s default" in page
    fields = {"name": "pass 1", "model_a": models[0].public_id, "model_b": models[1].public_id,
              "prompts_version": prompts_version.public_id, "prompt_count": 2, "max_new_tokens": 32,
              "temperature": 0.5, "top_p": 0.9, "top_k": 0, "seed": 0, "required_reviews": 1,
              "reviewers": [team.teammate.pk]}
    response = client_for(team.owner).post(url, {**fields, "thinking": "maybe"})
    assert response.status_code == 400 and not Campaign.objects.filter(name="pass 1").exists()
    assert response.context["form"].errors["thinking"] == [
        "maybe is not a Thinking choice; choose on, off or each model's default."]
    response = client_for(team.owner).post(url, {**fields, "thinking": "off"})
    assert response.status_code == 302, response.content
    campaign = Campaign.objects.get(name="pass 1")
    assert campaign.generation["sampling"]["enable_thinking"] is False
    assert services.GenerationSettings(**campaign.generation["sampling"]).chat_template_kwargs == {
        "enable_thinking": False}
    page = client_for(team.teammate).get(response.url).content.decode()
    assert "seed 0, thinking off (enable_thinking false for the models whose chat template reads it)" in page
    client_for(team.owner).post(url, {**fields, "name": "pass 2", "thinking": ""})
    assert Campaign.objects.get(name="pass 2").generation["sampling"]["enable_thinking"] is None


def test_no_thinking_switch_where_no_model_reads_it(team, client_for, models, prompts_version):
    page = client_for(team.owner).get(reverse("review:generate", args=[team.project.slug])).content.decode()
    assert 'name="thinking"' not in page


def test_the_form_names_the_field_the_service_rejects(team, client_for, models, prompts_version):
    response = client_for(team.owner).post(reverse("review:generate", args=[team.project.slug]), {
        "name": "pass 1", "model_a": models[0].public_id, "model_b": models[0].public_id,
        "prompts_version": prompts_version.public_id, "prompt_count": 2, "max_new_tokens": 32, "temperature": 0.5,
        "top_p": 0.9, "top_k": 0, "seed": 0, "required_reviews": 1, "reviewers": [team.teammate.pk]})
    assert response.status_code == 400
    assert "choose two different models" in response.context["form"].errors["model_b"][0]


def test_only_owners_create_one(team, client_for, models, prompts_version):
    url = reverse("review:generate", args=[team.project.slug])
    assert client_for(team.teammate).get(url).status_code == 403
    assert client_for(team.viewer).get(url).status_code == 403
    assert client_for(team.outsider).get(url).status_code == 404


def test_the_models_names_are_escaped(team, client_for, prompts_version):
    evil = [make_base_model(team.project, name=name, path=f"/models/{index}")
            for index, name in enumerate(("<script>alert(1)</script>", "<img src=x onerror=alert(2)>"))]
    campaign = generate(team, evil, prompts_version)
    page = client_for(team.owner).get(reverse("review:detail", args=[team.project.slug, campaign.public_id]))
    text = page.content.decode()
    assert "<script>alert(1)" not in text and "<img src=x" not in text and "&lt;script&gt;alert(1)" in text


def generated_with_three_answers(team, models, prompts_version):
    """A campaign on the version's first 3 prompts whose models answered a1-a3 and b1-b3: its items made."""
    campaign = generate(team, models, prompts_version, prompt_count=3)
    prompts = services.generation_prompts(campaign=campaign)
    return services.generation_finish(campaign_id=campaign.pk, prompts=prompts, answers_a=["a1", "a2", "a3"],
                                      answers_b=["b1", "b2", "b3"])


def test_reviews_give_the_model_preference_and_the_export_names_the_models(team, client_for, models,
                                                                          prompts_version):
    campaign = generated_with_three_answers(team, models, prompts_version)
    for item, label in zip(campaign.items.order_by("sequence"), ["b", "b", "a"]):
        answer(item, team.teammate, label)
    page = client_for(team.owner).get(reverse("review:detail", args=[team.project.slug, campaign.public_id]))
    [row] = page.context["model_preferences"]
    # The pair is in the order of the models' refs; falcon (a) won once, heron (b) twice.
    falcon_first = models[0].public_id < models[1].public_id
    assert (row.first, row.second) == (("Base model: falcon", "Base model: heron") if falcon_first
                                       else ("Base model: heron", "Base model: falcon"))
    preference = row.preference.preferred_first
    assert (preference.successes, preference.trials) == ((1 if falcon_first else 2), 3)
    assert "Model preference" in page.content.decode()
    export = services.export_create(campaign=campaign, options=services.ExportOptions(dataset_name="judged"),
                                    user=team.owner)
    export = services.export_write(export_id=export.pk)
    rows = [json.loads(line) for line in export.version.absolute_path.read_text().splitlines()]
    assert [(row["chosen"], row["review"]["chosen_model"], row["review"]["rejected_model"]) for row in rows] == [
        ("b1", models[1].public_id, models[0].public_id), ("b2", models[1].public_id, models[0].public_id),
        ("a3", models[0].public_id, models[1].public_id)]
    assert rows[0]["review"]["prompts_version"] == prompts_version.public_id
    assert export.agreement["model_preferences"][0]["preferred_first"]["trials"] == 3


def test_the_conflicts_page_names_the_models_and_the_reviewing_page_does_not(team, carol, client_for,
                                                                            prompts_version):
    """The conflicts page named no model: an owner settling a disagreement between reviewers could not tell which
    models wrote the answers without reading the item's export. It is the owners' page, its items are served to no
    reviewer (their reviews are in), and a generated campaign's page names its model A and B to the whole project:
    the page names them, as recorded by the generation. The reviewing page stays blind: first and second, no names."""
    models = [make_base_model(team.project, name=name, path=f"/models/{index}")
              for index, name in enumerate(("falcon <b>", "heron"))]
    campaign = generate(team, models, prompts_version, name="pass 1", required_reviews=2,
                        reviewers=[team.teammate, carol], prompt_count=3)
    campaign = services.generation_finish(campaign_id=campaign.pk, prompts=services.generation_prompts(campaign=campaign),
                                          answers_a=["a1", "a2", "a3"], answers_b=["b1", "b2", "b3"])
    first, *others = campaign.items.order_by("sequence")
    answer(first, team.teammate, "a")
    answer(first, carol, "b")
    page = client_for(team.owner).get(reverse("review:conflicts", args=[team.project.slug, campaign.public_id]))
    text = page.content.decode()
    assert '<h3>A · <bdi class="model">Base model: falcon &lt;b&gt;</bdi></h3>' in text
    assert '<h3>B · <bdi class="model">Base model: heron</bdi></h3>' in text
    reviewing = client_for(team.teammate).get(reverse("review:next", args=[team.project.slug, campaign.public_id]))
    assert reviewing.context["item"] in others
    assert "falcon" not in reviewing.content.decode() and "heron" not in reviewing.content.decode()


def test_the_reviewing_page_says_the_items_are_coming_or_why_there_are_none(team, client_for, models,
                                                                            prompts_version):
    campaign = generate(team, models, prompts_version)
    url = reverse("review:next", args=[team.project.slug, campaign.public_id])
    assert "still being generated" in client_for(team.teammate).get(url).content.decode()
    services.generation_fail(campaign_id=campaign.pk, reason="Base model: falcon cannot answer row 1 <of>")
    page = client_for(team.teammate).get(url).content.decode()
    assert "This campaign has no items: Base model: falcon cannot answer row 1 &lt;of&gt;" in page


def test_the_owner_queues_a_stuck_generation_again(team, client_for, models, prompts_version, sent_tasks,
                                                  django_capture_on_commit_callbacks):
    campaign = generate(team, models, prompts_version)
    sent_tasks.clear()
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(team.owner).post(reverse("review:load", args=[team.project.slug, campaign.public_id]))
    assert response.status_code == 302 and sent_tasks == [(services.GENERATE_TASK, [campaign.pk], "serve")]
    assert client_for(team.teammate).post(reverse("review:load", args=[team.project.slug,
                                                                      campaign.public_id])).status_code == 403


def test_the_owner_cancels_a_generation(team, client_for, models, prompts_version):
    """QA: a big mistaken generation could not be stopped: it ran to its end, in the way of chats."""
    campaign = generate(team, models, prompts_version)
    services.generation_progress(campaign_id=campaign.pk, answers=1)
    detail = reverse("review:detail", args=[team.project.slug, campaign.public_id])
    cancel = reverse("review:cancel", args=[team.project.slug, campaign.public_id])
    owner = client_for(team.owner)
    page = owner.get(detail).content.decode()
    assert 'id="cancel-confirm"' in page and "No items are made from what was generated" in page
    assert client_for(team.teammate).post(cancel).status_code == 403
    response = owner.post(cancel, {"submission_token": form_token(page, after=cancel)}, follow=True)
    page = response.content.decode()
    assert response.redirect_chain == [(detail, 302)]
    assert f"Cancelled the generation of {isolated('falcon vs heron')}" in page
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.CANCELLED and not campaign.items.exists()
    assert campaign.load_error == (f"{isolated('alpha-owner')} cancelled the generation after 1 of 4 answers; no "
                                   "items were made, as each pair needs both models' answers")
    assert "The generation was cancelled" in page and 'http-equiv="refresh"' not in page
    assert 'id="cancel-confirm"' not in page and 'id="delete-confirm"' in page
    reviewing = client_for(team.teammate).get(reverse("review:next", args=[team.project.slug, campaign.public_id]))
    assert "This campaign has no items: " in reviewing.content.decode(), "not 'nothing left for you to review'"
    # The serve worker, told after its slice, stops; its finish and a redelivery make nothing.
    assert services.generation_progress(campaign_id=campaign.pk, answers=2) is False
    prompts = services.generation_prompts(campaign=campaign)
    services.generation_finish(campaign_id=campaign.pk, prompts=prompts, answers_a=["a", "b"], answers_b=["c", "d"])
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.CANCELLED and not campaign.items.exists()
    with pytest.raises(ValidationError, match="not generating: there is no generation to cancel"):
        services.generation_cancel(campaign=campaign, user=team.owner)


def test_deleting_a_generating_campaign_stops_its_generation(team, client_for, models, prompts_version,
                                                             django_capture_on_commit_callbacks):
    """QA: its page offered "Delete…", which was then refused ("its answers are being generated"); it now says it
    stops the generation, and does."""
    campaign = generate(team, models, prompts_version)
    detail = reverse("review:detail", args=[team.project.slug, campaign.public_id])
    delete = reverse("review:delete", args=[team.project.slug, campaign.public_id])
    owner = client_for(team.owner)
    page = owner.get(detail).content.decode()
    assert "Stops the generation of its answers" in page and "Stop and delete" in page
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.post(delete, {"submission_token": form_token(page, after=delete)}, follow=True)
    assert f"Deleted the review campaign {isolated('falcon vs heron')}, stopping its generation," in (
        response.content.decode())
    assert not Campaign.objects.filter(pk=campaign.pk).exists()
    assert services.generation_progress(campaign_id=campaign.pk, answers=2) is False
    prompts = [services.GenerationPrompt(row=1, prompt="Name a colour.")]
    assert services.generation_finish(campaign_id=campaign.pk, prompts=prompts, answers_a=["a"],
                                      answers_b=["b"]) is None


def test_stop_and_delete_while_the_serve_worker_answers_deletes_the_campaign_once_it_stops(
        team, client_for, models, prompts_version, django_capture_on_commit_callbacks):
    """QA: "Stop and delete" removed the campaign at once while the serve worker was still answering its prompts,
    and with it the record that held its models: either could then be deleted under the worker. The campaign is
    kept, cancelled, its page saying it is being deleted, until the worker stops and deletes it."""
    campaign = generate(team, models, prompts_version)
    assert services.generation_begin(campaign_id=campaign.pk) is not None  # a serve worker takes it up
    detail = reverse("review:detail", args=[team.project.slug, campaign.public_id])
    delete = reverse("review:delete", args=[team.project.slug, campaign.public_id])
    owner = client_for(team.owner)
    page = owner.get(detail).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.post(delete, {"submission_token": form_token(page, after=delete)}, follow=True)
    assert (f"Stopping the generation of {isolated('falcon vs heron')}: the serve worker stops after the prompts it "
            "is answering now, and the campaign is then deleted by itself, in a moment.") in response.content.decode()
    kept = Campaign.objects.get(pk=campaign.pk)
    assert kept.status == CampaignStatus.CANCELLED and kept.delete_when_stopped
    assert services.generation_progress(campaign_id=campaign.pk, answers=2) is False  # the worker's cue to stop
    page = owner.get(detail).content.decode()
    assert ("<h2>Being deleted</h2><p>The generation was stopped and it is being deleted: it goes once the serve "
            "worker has answered the prompts under way, in a moment.</p>") in page
    services.generation_end(campaign_id=campaign.pk)
    assert not Campaign.objects.filter(pk=campaign.pk).exists()


def test_two_checkpoints_of_a_run_on_its_eval_set(team, client_for, prompts_version):
    from webapp.runs.models import Artifact, Run, RunStatus

    eval_set = make_ready_version(team.project, name="held out", kind="preference",
                                  rows=[{"prompt": "Best colour?", "chosen": "Blue.", "rejected": "Seven."}])
    run = Run.objects.create(project=team.project, name="dpo-1", task="dpo", status=RunStatus.SUCCEEDED,
                             spec={"data": {"train": prompts_version.public_id, "eval": eval_set.public_id}},
                             resolved_spec={"output_dir": "/runs/dpo-1"})
    for step in (100, 200):
        Artifact.objects.create(run=run, kind="checkpoint", step=step, path=f"/runs/dpo-1/export-step-{step}")
    form = client_for(team.owner).get(reverse("review:generate", args=[team.project.slug])).context["form"]
    assert dict(form.fields["prompts_version"].choices)[eval_set.public_id] == f"Eval set of run {isolated('dpo-1')}: {isolated('held out')} v1 (preference, 1 row)"
    assert {f"{run.public_id}:step-100", f"{run.public_id}:step-200"} <= set(dict(form.fields["model_a"].choices))
    campaign = services.campaign_generate(
        project=team.project, name="100 vs 200", guidelines="", required_reviews=1, reviewers=[team.teammate],
        model_a=f"{run.public_id}:step-100", model_b=f"{run.public_id}:step-200", prompts_version=eval_set,
        prompt_count=10, sampling=services.GenerationSettings(), user=team.owner)
    assert campaign.generation["model_b"]["path"] == "/runs/dpo-1/export-step-200"
    assert campaign.generation["prompts"]["count"] == 1, "no more prompts than the version has"
    assert [prompt.prompt for prompt in services.generation_prompts(campaign=campaign)] == ["Best colour?"]


def test_queue_the_generation_again_is_offered_once_redis_no_longer_holds_its_message(
        team, client_for, sent_tasks, settings, django_capture_on_commit_callbacks, generation_queued_in_redis):
    """The button was there while the answers were being generated: pressed, the serve worker answered
    every prompt twice, in the way of chats. It is offered once Redis holds the message nowhere (the
    worker stopped, or Redis lost it) or cannot be asked, and refused while the message is held."""
    campaign, broker = generation_queued_in_redis
    owner = client_for(team.owner)
    detail = reverse("review:detail", args=[team.project.slug, campaign.public_id])
    again = reverse("review:load", args=[team.project.slug, campaign.public_id])
    page = owner.get(detail).content.decode()
    assert "campaign-generating" in page and "Queue the generation again" not in page
    page = owner.post(again, follow=True).content.decode()
    assert f"the generation of {isolated('falcon vs heron')} is queued or under way" in page and len(sent_tasks) == 1

    broker.delete("serve")  # the worker stopped, the message with it
    answers_stop(campaign)
    page = owner.get(detail).content.decode()
    assert "Its message is no longer queued" in page and "Queue the generation again" in page
    with django_capture_on_commit_callbacks(execute=True):
        page = owner.post(again, follow=True).content.decode()
    assert "Generating the answers again." in page
    assert sent_tasks[-1] == (services.GENERATE_TASK, [campaign.pk], "serve") and len(sent_tasks) == 2
    assert "Queue the generation again" not in client_for(team.teammate).get(detail).content.decode()

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # Redis cannot be asked: offered, without a reason
    answers_stop(campaign)
    page = owner.get(detail).content.decode()
    assert "Queue the generation again" in page and "Its message is no longer queued" not in page


def answers_stop(campaign):
    """The generation reported its last answers longer ago than the page takes on trust."""
    Campaign.objects.filter(pk=campaign.pk).update(
        generation_progress_at=timezone.now() - timedelta(seconds=services.GENERATION_QUIET_SECONDS + 1))


def test_the_page_asks_redis_only_once_the_answers_stop_coming(team, client_for, models, prompts_version,
                                                                 sent_tasks, settings):
    """The campaign page (reloaded every 3 s) asked Redis on every load whether the generation's
    message was still queued, reading the serve queue and every unacknowledged message. While the worker
    reports answers its message is held (acknowledged at the end), so the page asks only once the
    answers have stopped for GENERATION_QUIET_SECONDS. Redis is unreachable here: asking it would
    offer the button."""
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    campaign = generate(team, models, prompts_version)
    owner = client_for(team.owner)
    detail = reverse("review:detail", args=[team.project.slug, campaign.public_id])
    assert "Queue the generation again" not in owner.get(detail).content.decode()  # just asked for
    answers_stop(campaign)
    services.generation_progress(campaign_id=campaign.pk, answers=1)
    assert "Queue the generation again" not in owner.get(detail).content.decode()  # an answer came
    answers_stop(campaign)
    assert "Queue the generation again" in owner.get(detail).content.decode()


def test_the_page_says_what_the_project_lacks_for_a_campaign_on_answers(team, client_for):
    """In a project without two models or prompts, the form offered empty lists and said nothing."""
    url = reverse("review:generate", args=[team.project.slug])
    page = client_for(team.owner).get(url).content.decode()
    card = page.split('id="missing-inputs">')[1].split("</p>")[0]
    assert " ".join(card.split()) == (
        f"A campaign on two models' answers needs two models, and {isolated(team.project.name)} has none: "
        f'<a href="/p/alpha/models/register/">register a base model</a> or finish a run; and it needs prompts: '
        f'<a href="/p/alpha/datasets/new/">upload a dataset</a> of kind <b>prompts</b> or <b>sft</b>.')
    make_base_model(team.project, name="falcon", path="/models/falcon")
    make_ready_version(team.project, name="chats", kind="sft", rows=SFT_ROWS, user=team.owner)
    card = client_for(team.owner).get(url).content.decode().split('id="missing-inputs">')[1].split("</p>")[0]
    assert " ".join(card.split()) == (
        f"A campaign on two models' answers needs two models, and {isolated(team.project.name)} has 1: "
        f'<a href="/p/alpha/models/register/">register a base model</a> or finish a run.')


def test_the_page_has_no_such_note_once_the_project_has_two_models_and_prompts(team, client_for, models,
                                                                               prompts_version):
    assert 'id="missing-inputs"' not in client_for(team.owner).get(
        reverse("review:generate", args=[team.project.slug])).content.decode()


def test_a_whitespace_only_answer_is_left_out_and_counted_as_empty(team, client_for, models, prompts_version):
    """QA: an answer of only newlines ('\\n\\n\\n') became an item, and the export of the reviewed pairs then
    failed whole: its validator read 'chosen: is an empty string'."""
    campaign = generate(team, models, prompts_version, prompt_count=3)
    prompts = services.generation_prompts(campaign=campaign)
    campaign = services.generation_finish(campaign_id=campaign.pk, prompts=prompts,
                                          answers_a=["Red.", "\n\n\n", "c a t"], answers_b=["Green.", "Bye!", " \t "])
    assert campaign.generation["empty_answers"] == 2
    assert [item.source_row for item in campaign.items.order_by("sequence")] == [1]
    page = client_for(team.owner).get(reverse("review:detail", args=[team.project.slug, campaign.public_id]))
    assert "(2 left out: an empty answer)" in page.content.decode()


def test_a_pair_of_identical_answers_is_left_out_and_counted(team, client_for, models, prompts_version):
    """QA: both models gave the same text and the pair became an item, which could be exported as a preference
    pair whose chosen and rejected are one answer; nothing can be preferred in it."""
    campaign = generate(team, models, prompts_version, prompt_count=3)
    prompts = services.generation_prompts(campaign=campaign)
    campaign = services.generation_finish(campaign_id=campaign.pk, prompts=prompts,
                                          answers_a=["Red.", "Bye.", "c-a-t"], answers_b=["Red.", "Bye!", "c-a-t\n"])
    assert (campaign.generation["identical_answers"], campaign.generation["empty_answers"]) == (2, 0)
    assert [item.source_row for item in campaign.items.order_by("sequence")] == [2]
    page = client_for(team.owner).get(reverse("review:detail", args=[team.project.slug, campaign.public_id]))
    assert "(2 left out: both models gave the same answer)" in page.content.decode()


def test_it_fails_with_nothing_made_when_every_pair_is_identical_or_empty(team, models, prompts_version):
    campaign = generate(team, models, prompts_version)
    prompts = services.generation_prompts(campaign=campaign)
    campaign = services.generation_finish(campaign_id=campaign.pk, prompts=prompts, answers_a=["same", ""],
                                          answers_b=["same", "b"])
    assert campaign.status == CampaignStatus.FAILED and not campaign.items.exists()
    assert campaign.load_error == ("none of the 2 prompts left a pair to review: 1 got an empty answer from at least "
                                   "one model, 1 the same answer from both; allow more new tokens, raise the "
                                   "temperature, or choose models that differ more")


def test_an_export_leaves_out_an_item_whose_responses_are_the_same(team, client_for, models, prompts_version):
    """An item stored before identical answers were left out (or made identical by a reviewer's edits) would
    be written as chosen == rejected: a preference pair that teaches nothing."""
    campaign = generated_with_three_answers(team, models, prompts_version)
    Item.objects.filter(campaign=campaign, sequence=2).update(response_b="a2")  # as an older campaign stored it
    for item in campaign.items.order_by("sequence"):
        answer(item, team.teammate, "a")
    Review.objects.filter(item__sequence=3, item__campaign=campaign).update(edited_b=" a3")
    export = services.export_write(export_id=services.export_create(
        campaign=campaign, options=services.ExportOptions(dataset_name="judged"), user=team.owner).pk)
    assert (export.counts["written"], export.counts["identical"]) == (1, 2)
    rows = [json.loads(line) for line in export.version.absolute_path.read_text().splitlines()]
    assert [(row["chosen"], row["rejected"]) for row in rows] == [("a1", "b1")]
    page = client_for(team.owner).get(reverse("review:detail", args=[team.project.slug, campaign.public_id]))
    assert "same answer twice 2" in page.content.decode()


def test_an_export_leaves_out_a_stored_blank_answer_and_says_how_many(team, client_for, models, prompts_version):
    """A campaign generated before blank answers were left out holds such items; one of them failed the
    whole export, so none of the reviewed pairs became a dataset."""
    from webapp.datasets import services as dataset_services
    from webapp.datasets.models import VersionStatus

    campaign = generated_with_three_answers(team, models, prompts_version)
    Item.objects.filter(campaign=campaign, sequence=2).update(response_a="\n\n\n")  # as an older campaign stored it
    for item in campaign.items.order_by("sequence"):
        answer(item, team.teammate, "b" if item.sequence == 2 else "a")
    export = services.export_create(campaign=campaign, options=services.ExportOptions(dataset_name="judged"),
                                    user=team.owner)
    export = services.export_write(export_id=export.pk)
    assert export.counts["written"] == 2 and export.counts["empty_response"] == 1
    rows = [json.loads(line) for line in export.version.absolute_path.read_text().splitlines()]
    assert [row["chosen"] for row in rows] == ["a1", "a3"]
    assert dataset_services.dataset_version_validate(version_id=export.version.pk).status == VersionStatus.READY
    page = client_for(team.owner).get(reverse("review:detail", args=[team.project.slug, campaign.public_id]))
    assert "empty answer 1" in page.content.decode()


def test_an_edit_to_nothing_leaves_the_item_out_of_the_export(team, models, prompts_version):
    """A reviewer's edit that blanked a response, stored before such edits were refused, would fail the
    export's validation as a blank answer does."""
    campaign = generate(team, models, prompts_version, prompt_count=2)
    prompts = services.generation_prompts(campaign=campaign)
    campaign = services.generation_finish(campaign_id=campaign.pk, prompts=prompts, answers_a=["a1", "a2"],
                                          answers_b=["b1", "b2"])
    first, second = campaign.items.order_by("sequence")
    answer(first, team.teammate, "a")
    Review.objects.filter(item=first).update(edited_a="  \n", edited_b="  \n")
    answer(second, team.teammate, "a")
    export = services.export_write(export_id=services.export_create(
        campaign=campaign, options=services.ExportOptions(dataset_name="judged"), user=team.owner).pk)
    assert (export.status, export.counts["written"], export.counts["empty_response"]) == ("validating", 1, 1)


def test_a_models_nul_is_stored_as_the_replacement_character(team, models, prompts_version):
    """PostgreSQL stores no NUL; a model's answer cannot be refused, so its NUL is shown as U+FFFD."""
    campaign = generate(team, models, prompts_version, prompt_count=1)
    prompts = services.generation_prompts(campaign=campaign)
    campaign = services.generation_finish(campaign_id=campaign.pk, prompts=prompts, answers_a=["a\x00b"],
                                          answers_b=["ok"])
    item = campaign.items.get()
    assert (item.response_a, item.response_b) == ("a\ufffdb", "ok")


def test_a_cancelled_generation_whose_worker_died_holds_its_models_only_while_redis_holds_its_message(
        team, models, generation_queued_in_redis):
    """A cancelled campaign's models (and its project) may not be deleted while the serve worker still answers
    its prompts (tests/worker/test_review_generation.py). A worker that died meanwhile never says it stopped
    (``generation_end``): once no answer has come for GENERATION_QUIET_SECONDS, the campaign holds them only
    while Redis holds its message, which the task acknowledges at its end."""
    from webapp.basemodels.selectors import base_model_readers
    from webapp.projects.selectors import project_readers

    campaign, broker = generation_queued_in_redis
    assert services.generation_begin(campaign_id=campaign.pk) is not None  # a serve worker takes it up
    services.generation_cancel(campaign=campaign, user=team.owner)
    answers_stop(campaign)
    assert base_model_readers(base_model=models[1]) == [
        f"review campaign {isolated('falcon vs heron')} was cancelled, but the serve worker is still answering the "
        "prompts under way with it; try again in a moment, once it has stopped"]
    assert project_readers(project=team.project) == [
        f"review campaign {isolated('falcon vs heron')} was cancelled, but the serve worker is still answering the "
        "prompts under way; try again in a moment, once it has stopped"]
    broker.delete("serve")  # the worker died, and its message went with it
    assert base_model_readers(base_model=models[1]) == [] and project_readers(project=team.project) == []
    assert services.generation_begin(campaign_id=campaign.pk) is None, "a cancelled campaign is not taken up"


def taken_up_then_silent(campaign):
    """A serve worker took the generation up, reported 3 answers and was heard from no more."""
    services.generation_begin(campaign_id=campaign.pk)
    services.generation_progress(campaign_id=campaign.pk, answers=3)
    Campaign.objects.filter(pk=campaign.pk).update(generation_progress_at=timezone.now() - timedelta(minutes=5))
    return Campaign.objects.get(pk=campaign.pk)


def test_a_generation_whose_worker_died_says_when_and_is_queued_again(team, client_for, models, prompts_version):
    """A serve worker killed while answering never ended its generation (``generation_end``): the campaign said it
    was being answered, holding its models, and nothing said why no answers came."""
    campaign = taken_up_then_silent(generate(team, models, prompts_version))
    heard_at = campaign.generation_progress_at
    settled = services.generation_lost(campaign_id=campaign.pk, heard_at=heard_at, again=False, queued=True)
    assert settled.status == CampaignStatus.GENERATING and not settled.generation_running
    stopped = timezone.localtime(heard_at)
    # A notice, not its load_error: the generation has not failed, and a failure later is told as one alone.
    assert settled.load_error == "" and settled.notice == (
        f"the serve worker answering it stopped answering at {stopped:%Y-%m-%d %H:%M} {stopped.tzname()} (killed, out "
        "of memory, or its host lost), after 3 of 4 answers; its prompts were queued again, and are answered from the "
        "first")
    page = client_for(team.owner).get(reverse("review:detail", args=[team.project.slug, campaign.public_id]))
    assert f'<p class="generation-note">The serve worker answering it stopped answering at {stopped:%Y-%m-%d %H:%M}' in (
        page.content.decode())
    services.generation_fail(campaign_id=campaign.pk, reason="Base model: falcon cannot answer row 2")
    failed = Campaign.objects.get(pk=campaign.pk)
    assert (failed.status, failed.load_error, failed.notice) == (
        CampaignStatus.FAILED, "Base model: falcon cannot answer row 2", "")
    page = client_for(team.owner).get(reverse("review:detail", args=[team.project.slug, campaign.public_id]))
    assert "campaign-failed" in page.content.decode() and "stopped answering" not in page.content.decode()


def test_a_generation_whose_workers_died_twice_fails_with_the_reason(team, client_for, models, prompts_version):
    campaign = taken_up_then_silent(generate(team, models, prompts_version))
    settled = services.generation_lost(campaign_id=campaign.pk, heard_at=campaign.generation_progress_at, again=True,
                                       queued=True)
    assert settled.status == CampaignStatus.FAILED and not settled.generation_running and not settled.items.exists()
    assert settled.notice == "" and settled.load_error.endswith("after 3 of 4 answers, and so had the worker answering it before; no items "
                                       "were made. Its prompts may be what stops them (out of memory): start another "
                                       "campaign with fewer prompts, fewer new tokens or smaller models")
    page = client_for(team.owner).get(reverse("review:detail", args=[team.project.slug, campaign.public_id]))
    assert "campaign-failed" in page.content.decode() and "Delete…" in page.content.decode()


def test_a_lost_generation_queued_again_by_hand_loses_its_note(team, models, prompts_version,
                                                               django_capture_on_commit_callbacks, sent_tasks):
    campaign = taken_up_then_silent(generate(team, models, prompts_version))
    settled = services.generation_lost(campaign_id=campaign.pk, heard_at=campaign.generation_progress_at, again=False,
                                       queued=False)
    assert settled.load_error == "" and settled.notice.endswith(
        "after 3 of 4 answers, and Redis holds its message nowhere")
    with django_capture_on_commit_callbacks(execute=True):
        services.campaign_load_request(campaign=settled)
    assert Campaign.objects.get(pk=campaign.pk).notice == ""
    assert sent_tasks[-1] == (services.GENERATE_TASK, [campaign.pk], "serve")


def test_a_campaign_being_deleted_goes_once_its_worker_is_found_dead(team, models, prompts_version):
    campaign = taken_up_then_silent(generate(team, models, prompts_version))
    assert services.campaign_delete(campaign=campaign, stop_generation=True) is False
    services.generation_lost(campaign_id=campaign.pk, heard_at=campaign.generation_progress_at, again=False,
                             queued=True)
    assert not Campaign.objects.filter(pk=campaign.pk).exists()


def test_a_cancelled_generation_whose_worker_died_releases_its_models(team, models, prompts_version):
    campaign = taken_up_then_silent(generate(team, models, prompts_version))
    cancelled = services.generation_cancel(campaign=campaign, user=team.owner)
    settled = services.generation_lost(campaign_id=campaign.pk, heard_at=campaign.generation_progress_at, again=False,
                                       queued=False)
    assert settled.status == CampaignStatus.CANCELLED and not settled.generation_running
    assert settled.load_error == cancelled.load_error and settled.notice == ""


def test_a_generation_heard_from_since_it_was_read_is_left_alone(team, models, prompts_version):
    campaign = taken_up_then_silent(generate(team, models, prompts_version))
    services.generation_progress(campaign_id=campaign.pk, answers=4)  # its worker is alive after all
    assert services.generation_lost(campaign_id=campaign.pk, heard_at=campaign.generation_progress_at, again=True,
                                    queued=True) is None
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.GENERATING and campaign.generation_running and not campaign.load_error
    assert not campaign.notice


def test_a_checkpoint_is_taken_as_its_run_page_names_it(team, client_for, models, prompts_version, tmp_path):
    """A run's checkpoint row names it run_…@N, the pickers run_…:step-N: the form takes either."""
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    run = Run.objects.create(project=team.project, name="tuned", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner)
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=10, path=str(tmp_path / "export-step-10"))
    response = client_for(team.owner).post(reverse("review:generate", args=[team.project.slug]), {
        "name": "pass 1", "model_a": f"{run.public_id}@10", "model_b": models[0].public_id,
        "prompts_version": prompts_version.public_id, "prompt_count": 2, "max_new_tokens": 32, "temperature": 0.5,
        "top_p": 0.9, "top_k": 0, "seed": 0, "required_reviews": 1, "reviewers": [team.teammate.pk]})
    assert response.status_code == 302, response.context["form"].errors
    assert Campaign.objects.get(name="pass 1").generation["model_a"]["ref"] == f"{run.public_id}:step-10"


def test_its_page_claims_no_agreement_with_an_original_label_it_never_had(team, client_for, models, prompts_version):
    """QA (second first-use pass): with both reviewers' votes in, a campaign on two models' answers still read
    "Agreement with the original label (the dataset's chosen, the arena voter's pick): no votes yet": its items
    come with no label to agree with, and the votes were there."""
    campaign = generate(team, models, prompts_version, prompt_count=3)
    campaign = services.generation_finish(campaign_id=campaign.pk, prompts=services.generation_prompts(campaign=campaign),
                                          answers_a=["Red.", "Hi.", "c a t"], answers_b=["Green.", "Bye!", "k-a-t"])
    for item in campaign.items.all():
        answer(item, team.teammate, "a")
    page = client_for(team.owner).get(reverse("review:detail", args=["alpha", campaign.public_id])).content.decode()
    assert "Position bias" in page and "Agreement with the original label" not in page
    # A campaign on a dataset's pairs still compares with the label each row came with.
    version = make_ready_version(team.project, name="pairs", kind="preference", user=team.owner,
                                 rows=[{"prompt": "q", "chosen": "a", "rejected": "b"}])
    loaded = services.campaign_create(project=team.project, name="pairs", guidelines="", required_reviews=1,
                                      reviewers=[team.teammate], source_version=version, user=team.owner)
    services.campaign_load_items(campaign_id=loaded.pk)
    page = client_for(team.owner).get(reverse("review:detail", args=["alpha", loaded.public_id])).content.decode()
    assert "Agreement with the original label" in page


def test_the_prompt_choices_say_an_eval_sets_size_and_read_no_runs_charts(team, prompts_version):
    """QA (second first-use pass): among "demo-prompts v1 (prompts, 10,838 rows)" the run's eval set read "Eval set of
    run grpo-numeric: demo-eval v1", with no kind or size to choose a prompt count by; and to name it, every
    succeeded run's whole row was read, its series cache (a megabyte a finished run) included."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from webapp.review import selectors
    from webapp.runs.models import Run, RunStatus

    eval_set = make_ready_version(team.project, name="held out", kind="prompts",
                                  rows=[{"prompt": f"q{i}", "answer": "a"} for i in range(1200)])
    Run.objects.create(project=team.project, name="grpo-1", task="grpo", status=RunStatus.SUCCEEDED,
                       spec={"data": {"train": prompts_version.public_id, "eval": eval_set.public_id}},
                       resolved_spec={}, series_cache={"loss": {"x": list(range(1000))}})
    with CaptureQueriesContext(connection) as queries:
        labels = dict((version.public_id, label) for version, label in selectors.prompt_sources(project=team.project))
    assert labels[eval_set.public_id] == f"Eval set of run {isolated('grpo-1')}: {isolated('held out')} v1 (prompts, 1,200 rows)"
    assert not any("series_cache" in query["sql"] for query in queries.captured_queries)


@pytest.fixture
def persona_and_plain(team, tmp_path):
    """A model whose chat template reads persona, terse and style (the chat's test template), and one reading none."""
    from tests.factories import build_bpe_tokenizer_dir
    from tests.webapp.chat.test_template_variables import PERSONA_TEMPLATE

    return [make_base_model(team.project, name="persona", path=str(
                build_bpe_tokenizer_dir(tmp_path / "persona", chat_template=PERSONA_TEMPLATE))),
            make_base_model(team.project, name="plain", path=str(build_bpe_tokenizer_dir(tmp_path / "plain")))]


def test_the_chats_template_variables_are_kept_for_each_model_whose_template_reads_them(team, persona_and_plain,
                                                                                      prompts_version):
    """A generated campaign's prompts are rendered with the chat panel's template variables too: kept with each model
    whose template reads them, typed as its form types them (the serve worker renders every prompt with them:
    tests/worker/test_review_generation.py); a name neither reads, or a value the template fails on, is refused with
    nothing made."""
    campaign = generate(team, persona_and_plain, prompts_version,
                        template_variables={"persona": "a poet <b>", "terse": "true", "style": ""})
    assert campaign.generation["model_a"]["template_variables"] == {"persona": "a poet <b>", "terse": True}
    assert campaign.generation["model_b"]["template_variables"] == {}
    for variables, message in (({"colour": "red"}, "colour: neither model's chat template reads it"),
                               ({"style": "jazz"}, "chat template line 5: style must be plain or rhyme, not jazz"),
                               ({"persona": "x" * 4_001}, "persona: 4,001 characters; at most 4,000")):
        with pytest.raises(ValidationError) as refused:
            generate(team, persona_and_plain, prompts_version, name="refused", template_variables=variables)
        assert message in " ".join(refused.value.message_dict["template_variables"]).replace("\u2068", "").replace(
            "\u2069", "")
    assert list(Campaign.objects.values_list("name", flat=True)) == ["falcon vs heron"]


# A switch that refuses system turns: a first "Hello" renders with it, the second prompt of SFT_ROWS does not.
STRICT_TEMPLATE = ("{% for message in messages %}{% if strict and message.role == 'system' %}"
                   "{{ raise_exception('strict takes no system turn') }}{% endif %}"
                   "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_the_variables_are_checked_against_the_campaigns_own_prompts(team, client_for, prompts_version, tmp_path):
    """QA: the variables were checked on a "Hello" turn only, so one that a prompt of the campaign fails on was found
    by the serve worker once it had loaded both models, and the campaign failed. Every prompt the campaign asks is
    rendered with them at creation: a refusal names the prompt's row and the template's line, and nothing is made."""
    from tests.factories import build_bpe_tokenizer_dir

    strict = make_base_model(team.project, name="strict", path=str(
        build_bpe_tokenizer_dir(tmp_path / "strict", chat_template=STRICT_TEMPLATE)))
    plain = make_base_model(team.project, name="plain", path=str(build_bpe_tokenizer_dir(tmp_path / "plain")))
    with pytest.raises(ValidationError) as refused:
        generate(team, [plain, strict], prompts_version, prompt_count=3, template_variables={"strict": "true"})
    message = " ".join(refused.value.message_dict["template_variables"]).replace("\u2068", "").replace("\u2069", "")
    assert message.startswith("row 2 of the prompts chats v1: the chat template of Base model: strict fails on it "
                              "with the template variables strict = true: chat template line 1: strict takes no "
                              "system turn")
    assert not Campaign.objects.exists()

    url = reverse("review:generate", args=[team.project.slug])
    fields = {"name": "strict pass", "model_a": plain.public_id, "model_b": strict.public_id,
              "prompts_version": prompts_version.public_id, "prompt_count": 3, "max_new_tokens": 32,
              "temperature": 0.5, "top_p": 0.9, "top_k": 0, "seed": 0, "required_reviews": 1,
              "reviewers": [team.teammate.pk], "var_strict": "true"}
    response = client_for(team.owner).post(url, fields)
    assert response.status_code == 400 and not Campaign.objects.exists()
    assert "row 2 of the prompts" in " ".join(response.context["form"].non_field_errors())
    response = client_for(team.owner).post(url, {**fields, "prompt_count": 1})  # the first prompt alone renders
    assert response.status_code == 302, response.content
    assert Campaign.objects.get(name="strict pass").generation["model_b"]["template_variables"] == {"strict": True}


NO_SYSTEM_TEMPLATE = ("{% for message in messages %}{% if message.role == 'system' %}"
                      "{{ raise_exception('this model takes no system turn') }}{% endif %}"
                      "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_the_prompts_are_checked_against_the_chat_templates_with_no_variables_set(team, client_for, prompts_version,
                                                                                 tmp_path):
    """Follow-up: the prompts were rendered at creation only when template variables were set, so a prompt that a
    model's chat template itself refuses (a role order it raises on) was found once the serve worker had loaded the
    models. The same first prompts are rendered with no variables too: a refusal keyed prompts_version names the row,
    the model and the template's line, without a word of template variables, and nothing is made."""
    from pathlib import Path

    from tests.factories import build_bpe_tokenizer_dir

    no_system = make_base_model(team.project, name="no-system", path=str(
        build_bpe_tokenizer_dir(tmp_path / "no-system", chat_template=NO_SYSTEM_TEMPLATE)))
    plain = make_base_model(team.project, name="plain", path=str(build_bpe_tokenizer_dir(tmp_path / "plain")))
    with pytest.raises(ValidationError) as refused:
        generate(team, [plain, no_system], prompts_version, prompt_count=3)
    message = " ".join(refused.value.message_dict["prompts_version"]).replace("\u2068", "").replace("\u2069", "")
    assert message.startswith("row 2 of the prompts chats v1: the chat template of Base model: no-system fails on "
                              "it: chat template line 1: this model takes no system turn. Nothing was made;")
    assert "variables" not in message
    assert not Campaign.objects.exists()

    url = reverse("review:generate", args=[team.project.slug])
    fields = {"name": "no system", "model_a": no_system.public_id, "model_b": plain.public_id,
              "prompts_version": prompts_version.public_id, "prompt_count": 3, "max_new_tokens": 32,
              "temperature": 0.5, "top_p": 0.9, "top_k": 0, "seed": 0, "required_reviews": 1,
              "reviewers": [team.teammate.pk]}
    response = client_for(team.owner).post(url, fields)
    assert response.status_code == 400 and not Campaign.objects.exists()
    assert "row 2 of the prompts" in " ".join(response.context["form"].errors["prompts_version"])
    response = client_for(team.owner).post(url, {**fields, "prompt_count": 1})  # the first prompt alone renders
    assert response.status_code == 302, response.content
    assert Campaign.objects.filter(name="no system").exists()

    Path(prompts_version.absolute_path).unlink()  # nothing to check against: said so, in the same words
    with pytest.raises(ValidationError) as refused:
        generate(team, [plain, no_system], prompts_version, name="gone")
    assert "cannot be read to check the models' chat templates against them" in refused.value.messages[0]


def test_only_the_first_prompts_are_checked_and_the_form_says_how_many(team, client_for, prompts_version, tmp_path,
                                                                      monkeypatch):
    """The check renders ``TEMPLATE_CHECKED_PROMPTS`` prompts at most, so that the owner's request stays short; the
    form says how many, and a later prompt the template fails on is left to the generation, which names its row."""
    from tests.factories import build_bpe_tokenizer_dir

    strict = make_base_model(team.project, name="strict", path=str(
        build_bpe_tokenizer_dir(tmp_path / "strict", chat_template=STRICT_TEMPLATE)))
    plain = make_base_model(team.project, name="plain", path=str(build_bpe_tokenizer_dir(tmp_path / "plain")))
    page = client_for(team.owner).get(reverse("review:generate", args=[team.project.slug])).content.decode()
    assert "The first 1,000 prompts (all, for fewer) are rendered with it as the campaign is created" in page
    monkeypatch.setattr(services, "TEMPLATE_CHECKED_PROMPTS", 1)
    campaign = generate(team, [plain, strict], prompts_version, prompt_count=3, template_variables={"strict": "true"})
    assert campaign.generation["prompts"]["count"] == 3


def test_prompts_whose_file_is_gone_are_named_not_a_traceback(team, prompts_version, tmp_path):
    """The check reads the prompts' file as the campaign is made: a file gone from the data directory is a refusal
    keyed prompts_version, with nothing made."""
    from pathlib import Path

    from tests.factories import build_bpe_tokenizer_dir

    strict = make_base_model(team.project, name="strict", path=str(
        build_bpe_tokenizer_dir(tmp_path / "strict", chat_template=STRICT_TEMPLATE)))
    plain = make_base_model(team.project, name="plain", path=str(build_bpe_tokenizer_dir(tmp_path / "plain")))
    Path(prompts_version.absolute_path).unlink()
    with pytest.raises(ValidationError) as refused:
        generate(team, [plain, strict], prompts_version, template_variables={"strict": "true"})
    assert "cannot be read to check the template variables" in refused.value.message_dict["prompts_version"][0]
    assert not Campaign.objects.exists()


def test_the_forms_switch_is_the_chat_panels_select(team, client_for, persona_and_plain, prompts_version):
    """QA: terse, which the template only asks whether it holds, was a text box here and a true/false select in the
    chat panel; it is the chat panel's field (webapp.chat.forms.template_variable_field), and what it sends is typed
    as the chat's."""
    from tests.webapp.chat.test_template_variables import field_tag

    url = reverse("review:generate", args=[team.project.slug])
    page = client_for(team.owner).get(url).content.decode()
    assert field_tag(page, "terse").startswith("<select") and field_tag(page, "persona").startswith("<input")
    fields = {"name": "pass 1", "model_a": persona_and_plain[0].public_id, "model_b": persona_and_plain[1].public_id,
              "prompts_version": prompts_version.public_id, "prompt_count": 2, "max_new_tokens": 32,
              "temperature": 0.5, "top_p": 0.9, "top_k": 0, "seed": 0, "required_reviews": 1,
              "reviewers": [team.teammate.pk]}
    response = client_for(team.owner).post(url, {**fields, "var_terse": "maybe"})
    assert response.status_code == 400 and not Campaign.objects.filter(name="pass 1").exists()
    assert "Select a valid choice" in " ".join(response.context["form"].errors["var_terse"])
    response = client_for(team.owner).post(url, {**fields, "var_terse": "false"})
    assert response.status_code == 302, response.content
    assert Campaign.objects.get(name="pass 1").generation["model_a"]["template_variables"] == {"terse": False}


def test_the_form_offers_the_variables_and_the_page_shows_them_escaped(team, client_for, persona_and_plain,
                                                                      prompts_version):
    url = reverse("review:generate", args=[team.project.slug])
    page = client_for(team.owner).get(url).content.decode()
    assert 'name="var_persona"' in page and 'name="var_bos_token"' not in page
    fields = {"name": "pass 1", "model_a": persona_and_plain[0].public_id, "model_b": persona_and_plain[1].public_id,
              "prompts_version": prompts_version.public_id, "prompt_count": 2, "max_new_tokens": 32,
              "temperature": 0.5, "top_p": 0.9, "top_k": 0, "seed": 0, "required_reviews": 1,
              "reviewers": [team.teammate.pk]}
    response = client_for(team.owner).post(url, {**fields, "var_style": "jazz"})
    assert response.status_code == 400 and not Campaign.objects.filter(name="pass 1").exists()
    assert "style must be plain or rhyme, not jazz" in " ".join(response.context["form"].non_field_errors())
    response = client_for(team.owner).post(url, {**fields, "var_persona": "a poet <b>bold</b>"})
    assert response.status_code == 302, response.content
    assert Campaign.objects.get(name="pass 1").generation["model_a"]["template_variables"] == {
        "persona": "a poet <b>bold</b>"}
    page = client_for(team.teammate).get(response.url).content.decode()
    assert "<b>bold</b>" not in page
    assert "persona = <bdi>&quot;a poet &lt;b&gt;bold&lt;/b&gt;&quot;</bdi>" in page
