"""The review generation task in this process with two tiny models: both models' answers are the
ones the sampler gives, made into items at once; a prompt a model cannot take fails the campaign
with the model and row named and no items."""
import html

import pytest
from django.core.exceptions import ValidationError

from jaxengine.data.pipeline import encode_prompt
from jaxengine.sampler import Sampler, SamplingParams
from jaxengine.serving import load_serving_model
from tests import factories
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.basemodels.models import BaseModel
from webapp.basemodels.services import basemodel_unregister
from webapp.celery import app as celery_app
from webapp.core.bidi import isolated
from webapp.review import services
from webapp.review.models import Campaign, CampaignStatus
from worker.tasks import review

PROMPTS = [{"prompt": "Name a colour."}, {"prompt": [{"role": "user", "content": "Say hi"}]}, {"prompt": "Count."}]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return [factories.build_tiny_model_dir(tmp_path_factory.mktemp(f"tiny-review-{seed}"), seed=seed)
            for seed in (0, 1)]


@pytest.fixture
def campaign_for(db, model_dirs, monkeypatch):
    monkeypatch.setattr(celery_app, "send_task", lambda *args, **kwargs: None)
    team = make_team()
    models = [make_base_model(team.project, name=f"tiny-{index}", path=str(path)) for index, path in enumerate(model_dirs)]
    version = make_ready_version(team.project, name="questions", kind="prompts", rows=PROMPTS, user=team.owner)

    def campaign_for(**sampling) -> Campaign:
        return services.campaign_generate(
            project=team.project, name=f"tiny {len(Campaign.objects.all())}", guidelines="", required_reviews=1,
            reviewers=[team.teammate], model_a=models[0].public_id, model_b=models[1].public_id,
            prompts_version=version, prompt_count=3, sampling=services.GenerationSettings(**sampling),
            user=team.owner)

    return campaign_for


def greedy_answers(model_dir, max_new_tokens):
    loaded = load_serving_model(model_dir)
    generations = Sampler(loaded.model, loaded.tokenizer).generate(
        [encode_prompt(loaded.tokenizer, row["prompt"]) for row in PROMPTS],
        SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
    return [generation.text for generation in generations]


def test_both_models_answers_become_the_items(campaign_for, model_dirs, monkeypatch):
    campaign = campaign_for(max_new_tokens=8, temperature=0.0)
    progress = []
    record = services.generation_progress
    monkeypatch.setattr(services, "generation_progress",
                        lambda **kwargs: (progress.append(kwargs["answers"]), record(**kwargs)))
    review.generate_campaign_answers(campaign.pk)
    assert progress == [3, 6], "answers counted after each slice: all of model A's, then B's"
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.READY, campaign.load_error
    assert campaign.generated_answers == 6
    items = list(campaign.items.order_by("sequence"))
    assert [item.prompt for item in items] == [row["prompt"] for row in PROMPTS]
    assert [item.response_a for item in items] == greedy_answers(model_dirs[0], 8)
    assert [item.response_b for item in items] == greedy_answers(model_dirs[1], 8)
    assert items[0].response_a != items[0].response_b, "two different models"


def test_a_runs_model_renders_its_prompts_with_its_run_rows_variables(db, model_dirs, monkeypatch, tmp_path):
    """A run's export made before exports kept chat_template_kwargs.json had its variables from the run directory's
    spec.yaml alone: the campaign keeps the Run row's with the model, and each prompt is rendered with them, the
    campaign's Thinking switch over them."""
    import jaxengine.data.pipeline
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    monkeypatch.setattr(celery_app, "send_task", lambda *args, **kwargs: None)
    rendered = []
    encode = jaxengine.data.pipeline.encode_prompt
    monkeypatch.setattr(jaxengine.data.pipeline, "encode_prompt",
                        lambda tokenizer, prompt, **variables: (rendered.append(variables), encode(tokenizer, prompt,
                                                                                                   **variables))[1])
    team = make_team()
    variables = {"enable_thinking": False, "date_string": "01 Jan 2030"}
    run = Run.objects.create(project=team.project, name="trained off", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, created_by=team.owner,
                             resolved_spec={"output_dir": str(tmp_path), "data": {"chat_template_kwargs": variables}})
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(model_dirs[0]))
    other = make_base_model(team.project, name="tiny-1", path=str(model_dirs[1]))
    version = make_ready_version(team.project, name="questions", kind="prompts", rows=PROMPTS, user=team.owner)
    campaign = services.campaign_generate(
        project=team.project, name="run vs base", guidelines="", required_reviews=1, reviewers=[team.teammate],
        model_a=run.public_id, model_b=other.public_id, prompts_version=version, prompt_count=3,
        sampling=services.GenerationSettings(max_new_tokens=2, temperature=0.0, enable_thinking=True), user=team.owner)
    assert campaign.generation["model_a"]["template_kwargs"] == variables
    review.generate_campaign_answers(campaign.pk)
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.READY, campaign.load_error
    assert rendered == 3 * [{"enable_thinking": True, "date_string": "01 Jan 2030"}] + 3 * [{"enable_thinking": True}]


def test_the_campaigns_template_variables_reach_the_prompts_of_the_model_whose_template_reads_them(
        db, model_dirs, monkeypatch, tmp_path):
    """The chat panel's template variables, kept on the campaign with each model whose template reads them, are in
    every prompt that model answers, as the serve worker encodes it (the other model's prompts go without)."""
    import shutil

    import jaxengine.data.pipeline
    from tests.webapp.chat.test_template_variables import PERSONA_TEMPLATE

    monkeypatch.setattr(celery_app, "send_task", lambda *args, **kwargs: None)
    encoded = []
    encode = jaxengine.data.pipeline.encode_prompt
    monkeypatch.setattr(jaxengine.data.pipeline, "encode_prompt", lambda tokenizer, prompt, **variables: (
        encoded.append(tokenizer.decode(ids := encode(tokenizer, prompt, **variables), skip_special_tokens=False)),
        ids)[1])
    persona_dir = shutil.copytree(model_dirs[0], tmp_path / "persona")
    (persona_dir / "chat_template.jinja").write_text(PERSONA_TEMPLATE)
    team = make_team()
    persona = make_base_model(team.project, name="persona", path=str(persona_dir))
    other = make_base_model(team.project, name="tiny-1", path=str(model_dirs[1]))
    version = make_ready_version(team.project, name="questions", kind="prompts", rows=PROMPTS, user=team.owner)
    campaign = services.campaign_generate(
        project=team.project, name="a poet", guidelines="", required_reviews=1, reviewers=[team.teammate],
        model_a=persona.public_id, model_b=other.public_id, prompts_version=version, prompt_count=3,
        sampling=services.GenerationSettings(max_new_tokens=2, temperature=0.0), user=team.owner,
        template_variables={"persona": "a poet", "terse": "true"})
    review.generate_campaign_answers(campaign.pk)
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.READY, campaign.load_error
    assert encoded[:3] == [
        "<|im_start|>system\nYou are a poet.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n"
        "<|im_start|>assistant\nBriefly: ",
        "<|im_start|>system\nYou are a poet.<|im_end|>\n<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"
        "Briefly: ",
        "<|im_start|>system\nYou are a poet.<|im_end|>\n<|im_start|>user\nCount.<|im_end|>\n<|im_start|>assistant\n"
        "Briefly: "]
    assert len(encoded) == 6 and not any("poet" in prompt for prompt in encoded[3:])


def test_a_prompt_a_model_cannot_take_fails_the_campaign(campaign_for):
    campaign = campaign_for(max_new_tokens=1000, temperature=0.0)  # the tiny models' context is 256 tokens
    review.generate_campaign_answers(campaign.pk)
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.FAILED and not campaign.items.exists()
    assert campaign.load_error.startswith("Base model: tiny-0 cannot answer row 1 of the prompts:")
    assert "context length (256)" in campaign.load_error


def test_a_cancelled_generation_stops_after_the_slice_under_way(campaign_for, monkeypatch):
    """QA: a big mistaken generation could not be stopped. An owner cancelling it while model A answers its
    slice: the worker reads so when it reports the slice, and model B is never asked."""
    campaign = campaign_for(max_new_tokens=4, temperature=0.0)
    reported = []
    record = services.generation_progress

    def cancel_during_the_first_slice(**kwargs):
        if not reported:
            services.generation_cancel(campaign=campaign, user=campaign.created_by)
        reported.append(kwargs["answers"])
        return record(**kwargs)

    monkeypatch.setattr(services, "generation_progress", cancel_during_the_first_slice)
    review.generate_campaign_answers(campaign.pk)
    assert reported == [3], "model B was asked after the cancel"
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.CANCELLED and not campaign.items.exists()
    assert campaign.generated_answers == 0 and "cancelled the generation after 0 of 6 answers" in campaign.load_error


def test_a_model_is_not_deleted_while_a_cancelled_generation_still_answers_with_it(campaign_for, monkeypatch):
    """QA: once an owner cancelled a generation, either model could be unregistered (or its run deleted) at once,
    while the serve worker was still answering the slice of prompts under way with it: the model's files went
    from under it. A deletion is refused, naming the campaign, until the worker has stopped."""
    campaign = campaign_for(max_new_tokens=4, temperature=0.0)
    model_a = BaseModel.objects.get(public_id=campaign.generation["model_a"]["ref"])
    refusals = []
    record = services.generation_progress

    def cancel_and_delete_while_the_slice_is_answered(**kwargs):
        services.generation_cancel(campaign=campaign, user=campaign.created_by)
        with pytest.raises(ValidationError) as refused:
            basemodel_unregister(base_model=model_a)
        refusals.append(refused.value.messages)
        return record(**kwargs)

    monkeypatch.setattr(services, "generation_progress", cancel_and_delete_while_the_slice_is_answered)
    review.generate_campaign_answers(campaign.pk)
    assert refusals == [[f"review campaign {isolated(campaign.name)} was cancelled, but the serve worker is still "
                         "answering the prompts under way with it; try again in a moment, once it has stopped"]]
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.CANCELLED and not campaign.generation_running
    basemodel_unregister(base_model=model_a)  # the worker has stopped
    assert not BaseModel.objects.filter(pk=model_a.pk).exists()


@pytest.mark.parametrize("cancelled_first", [False, True])
def test_a_campaign_deleted_while_its_generation_answers_holds_its_models_until_the_worker_stops(
        campaign_for, monkeypatch, cancelled_first):
    """QA: the campaign page's "Stop and delete" (or Delete once cancelled) removed the campaign at once, while the
    serve worker was still answering the slice of prompts under way: with it went the record that held its models
    (``generation_readers``), so either could be unregistered under the worker. The campaign is kept, cancelled and
    marked, until the worker stops, which then deletes it."""
    campaign = campaign_for(max_new_tokens=4, temperature=0.0)
    model_a = BaseModel.objects.get(public_id=campaign.generation["model_a"]["ref"])
    seen = []
    record = services.generation_progress

    def delete_while_the_slice_is_answered(**kwargs):
        if cancelled_first:
            services.generation_cancel(campaign=campaign, user=campaign.created_by)
        assert services.campaign_delete(campaign=campaign, stop_generation=True) is False, "deleted under the worker"
        kept = Campaign.objects.get(pk=campaign.pk)
        with pytest.raises(ValidationError) as refused:
            basemodel_unregister(base_model=model_a)
        seen.append((kept.status, kept.delete_when_stopped, refused.value.messages))
        return record(**kwargs)

    monkeypatch.setattr(services, "generation_progress", delete_while_the_slice_is_answered)
    review.generate_campaign_answers(campaign.pk)
    assert seen == [(CampaignStatus.CANCELLED, True, [
        f"review campaign {isolated(campaign.name)} was cancelled, but the serve worker is still answering the "
        "prompts under way with it; try again in a moment, once it has stopped"])]
    assert not Campaign.objects.filter(pk=campaign.pk).exists(), "the worker deletes it as it stops"
    basemodel_unregister(base_model=model_a)
    assert not BaseModel.objects.filter(pk=model_a.pk).exists()


def test_an_answer_past_its_deadline_fails_the_campaign_saying_what_to_do(campaign_for, settings, client):
    """QA: a generation's requests to the serve worker had no deadline, so one slice of prompts could hold it
    (and the chats behind it) unboundedly. Each answer now has TEMPER_REVIEW_ANSWER_TIMEOUT_SECONDS; a cut one
    fails the campaign, its page naming the model, the row and what to do."""
    # 0: the deadline has passed when the server first looks at the request (it reads its clock after taking
    # it), so the timeout is certain without a test bound to how fast this machine decodes.
    settings.TEMPER_REVIEW_ANSWER_TIMEOUT_SECONDS = 0
    campaign = campaign_for(max_new_tokens=4, temperature=0.0)
    review.generate_campaign_answers(campaign.pk)
    campaign.refresh_from_db()
    reason = ("tiny-0 took longer than 0 s (TEMPER_REVIEW_ANSWER_TIMEOUT_SECONDS) to answer row 1 of the prompts, "
              "and its answer was cut; allow fewer new tokens, choose fewer prompts or a smaller model, or give the "
              "serve worker a larger TEMPER_REVIEW_ANSWER_TIMEOUT_SECONDS")
    assert campaign.status == CampaignStatus.FAILED and not campaign.items.exists()
    assert campaign.load_error.endswith(reason), campaign.load_error
    client.force_login(campaign.created_by)
    page = client.get(f"/p/{campaign.project.slug}/review/{campaign.public_id}/").content.decode()
    assert "<h2>The items could not be generated</h2>" in page and html.escape(reason) in page


def test_a_prompt_a_models_chat_template_fails_on_fails_the_campaign_naming_the_model_row_and_file(
        db, model_dirs, monkeypatch, tmp_path):
    """A template's own error (here 1/0) failed the campaign as 'the generation failed: ...', naming neither the
    model nor the row, as a prompt too long for the context does. The campaign's creation checks its prompts against
    the templates too; this template was changed after the campaign was made (its model's files edited), so only the
    worker meets it."""
    import json
    import shutil

    monkeypatch.setattr(celery_app, "send_task", lambda *args, **kwargs: None)
    hostile = tmp_path / "hostile"
    shutil.copytree(model_dirs[0], hostile)
    team = make_team()
    models = [make_base_model(team.project, name=name, path=str(path))
              for name, path in (("hostile", hostile), ("tiny-1", model_dirs[1]))]
    version = make_ready_version(team.project, name="questions", kind="prompts", rows=PROMPTS, user=team.owner)
    campaign = services.campaign_generate(
        project=team.project, name="hostile vs tiny", guidelines="", required_reviews=1, reviewers=[team.teammate],
        model_a=models[0].public_id, model_b=models[1].public_id, prompts_version=version, prompt_count=3,
        sampling=services.GenerationSettings(max_new_tokens=2, temperature=0.0), user=team.owner)
    template, message = factories.HOSTILE_CHAT_TEMPLATES["division by zero"]
    config = json.loads((hostile / "tokenizer_config.json").read_text())
    (hostile / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    review.generate_campaign_answers(campaign.pk)
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.FAILED and not campaign.items.exists()
    assert campaign.load_error.startswith(
        f"Base model: hostile cannot answer row 1 of the prompts: {hostile / 'tokenizer_config.json'}: chat template "
        "line 1: ")
    assert message in campaign.load_error
