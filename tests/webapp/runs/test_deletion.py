"""Deleting a run: who may, what still needing it refuses it, its directory, and what the runs started
from it keep."""
import json

import pytest
from django.core.exceptions import ValidationError
from django.template.defaultfilters import filesizeformat
from django.test import Client

from tests.webapp.factories import du_bytes, form_token, make_ready_version
from tests.webapp.runs.conftest import sft_spec
from webapp.api.services import token_create
from webapp.core.bidi import isolated
from webapp.runs import services
from webapp.runs.models import Artifact, ArtifactKind, MetricPoint, Run, RunStatus, ServingCopy, ServingCopyStatus


def url(run, suffix=""):
    return f"/p/alpha/runs/{run.public_id}/{suffix}"


def finished_run(team, catalog, *, user, name="done", **spec_overrides):
    """A run that succeeded, with its exported model in its directory (what starts other runs)."""
    run = services.run_create(project=team.project, spec=sft_spec(catalog, **spec_overrides), user=user, name=name)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    export = services.run_output_dir(run.public_id) / "export"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(export))
    write_serving_copy(export)
    run.refresh_from_db()
    return run


def write_serving_copy(export):
    """The serving copy a serve worker writes when a run succeeds (``worker.tasks.serve.quantize_run``)."""
    (export / "quantized").mkdir()
    (export / "quantized" / "quantization.json").write_text(json.dumps({
        "scheme": "int8", "bits": 8, "model_bytes": 2**20, "bfloat16_bytes": 2**21, "ratio_to_bfloat16": 0.5}))


def delete_from_page(client, run, capture):
    page = client.get(url(run)).content.decode()
    with capture(execute=True):
        return client.post(url(run, "delete/"), {"submission_token": form_token(page, after=url(run, "delete/"))})


def test_a_run_is_deleted_with_its_files_and_the_runs_from_it_name_it_as_deleted(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    parent = finished_run(team, catalog, user=team.teammate, name="parent")
    directory = services.run_output_dir(parent.public_id)
    (directory / "checkpoints" / "10").mkdir(parents=True)
    (directory / "checkpoints" / "10" / "state").write_bytes(b"weights")
    MetricPoint.objects.create(run=parent, step=1, name="loss", value=2.0, wall_time=1.0)
    child = finished_run(team, catalog, user=team.teammate, name="child", model=parent.public_id)
    assert child.source_run == parent
    client = client_for(team.teammate)
    # The confirmation says what it frees: the disk the run's directory takes (the checkpoint, the export and its
    # serving copy written above), as du and the Storage page count it: blocks, not the few bytes written.
    assert f"and their files on the server ({filesizeformat(du_bytes(directory))})." in client.get(
        url(parent)).content.decode()
    response = delete_from_page(client, parent, django_capture_on_commit_callbacks)
    assert response.status_code == 302 and response["Location"] == "/p/alpha/runs/"
    assert f"Deleted the run {isolated('parent')} ({parent.public_id}) and its files." in client.get(
        "/p/alpha/runs/").content.decode()
    assert not Run.objects.filter(pk=parent.pk).exists() and not MetricPoint.objects.exists()
    assert not directory.exists()
    child.refresh_from_db()
    assert child.deleted_references() == [("model", parent.public_id)]
    assert (f"Starting model <code>{parent.public_id}</code> <span class=\"muted\">(deleted since)</span>"
            in client.get(url(child)).content.decode())
    assert client.get(url(parent)).status_code == 404


def test_who_may_delete_a_run(team, catalog, client_for, sent_tasks):
    """An owner any run; a member the runs they launched; a viewer none; an outsider gets 404."""
    owners = finished_run(team, catalog, user=team.owner, name="owners")
    teammate = client_for(team.teammate)
    assert 'id="delete-confirm"' not in teammate.get(url(owners)).content.decode()
    assert teammate.post(url(owners, "delete/")).status_code == 403
    assert client_for(team.viewer).post(url(owners, "delete/")).status_code == 403
    assert client_for(team.outsider).post(url(owners, "delete/")).status_code == 404
    assert 'id="delete-confirm"' in client_for(team.owner).get(url(owners)).content.decode()
    assert Run.objects.filter(pk=owners.pk).exists()


def test_what_still_needs_a_run_refuses_its_deletion(team, catalog, client_for, sent_tasks,
                                                     django_capture_on_commit_callbacks):
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="busy")
    client = client_for(team.owner)
    assert 'id="delete-confirm"' not in client.get(url(run)).content.decode()  # not offered while it runs
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url(run, "delete/"))
    assert response["Location"] == url(run)
    assert "Nothing was deleted: it is queued; cancel it and wait for it to stop." in client.get(
        url(run)).content.decode()

    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    export = services.run_output_dir(run.public_id) / "export"
    export.mkdir(parents=True)
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(export))
    child = services.run_create(project=team.project, spec=sft_spec(catalog, model=run.public_id), user=team.owner,
                                name="from it")
    ServingCopy.objects.create(project=team.project, run=run, status=ServingCopyStatus.WRITING)
    response = delete_from_page(client, run, django_capture_on_commit_callbacks)
    page = client.get(response["Location"]).content.decode()
    assert (f"Nothing was deleted: run \u2068from it\u2069 ({child.public_id}) is queued from its model; cancel it or wait for "
            "it to finish; a serving copy of its model is being written; wait until it is ready.") in page
    assert Run.objects.filter(pk=run.pk).exists()


def test_the_api_deletes_a_finished_run(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    run = finished_run(team, catalog, user=team.teammate)
    running = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="running")

    def call(user, method, path):
        _token, secret = token_create(user=user, name="script")
        with django_capture_on_commit_callbacks(execute=True):
            response = getattr(Client(HTTP_AUTHORIZATION=f"Bearer {secret}"), method)(f"/api/v1/projects/alpha/{path}")
        return response.status_code, json.loads(response.content or b"null")

    assert call(team.viewer, "delete", f"runs/{run.public_id}/")[0] == 403
    assert call(team.teammate, "delete", f"runs/{running.public_id}/") == (
        400, {"errors": {"delete": ["it is queued; cancel it and wait for it to stop"]}})
    assert call(team.teammate, "delete", f"runs/{run.public_id}/") == (204, None)
    assert call(team.teammate, "get", f"runs/{run.public_id}/")[0] == 404


def test_a_reward_run_that_active_runs_or_a_running_pipeline_score_with_is_not_deleted(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    """A PPO run's ``ppo.reward_model`` and a GRPO run's ``reward_model`` reward function read the reward
    run's exported model from its directory, as a running pipeline's stage will: deleting it failed them."""
    from webapp.runs import pipelines

    judge = finished_run(team, catalog, user=team.owner, name="judge", task="reward",
                         data={"train": catalog.preference.public_id})
    ppo = services.run_create(project=team.project, user=team.owner, name="ppo-run", spec={
        "task": "ppo", "model": catalog.base_model.public_id, "data": {"train": catalog.prompts.public_id},
        "train": {"max_steps": 10, "batch_size": 2}, "ppo": {"reward_model": judge.public_id}})
    grpo_spec = {"task": "grpo", "model": catalog.base_model.public_id, "data": {"train": catalog.prompts.public_id},
                 "train": {"max_steps": 10, "batch_size": 2}, "grpo": {"num_generations": 2, "rewards": [
                     {"name": "reward_model", "weight": 1.0, "args": {"model": judge.public_id}}]}}
    grpo = services.run_create(project=team.project, user=team.owner, name="grpo-run", spec=grpo_spec)
    client = Client()
    client.force_login(team.owner)
    response = delete_from_page(client, judge, django_capture_on_commit_callbacks)
    page = client.get(response["Location"]).content.decode()
    assert (f"Nothing was deleted: run \u2068ppo-run\u2069 ({ppo.public_id}) is queued, scored by its model; cancel it or wait "
            f"for it to finish; run \u2068grpo-run\u2069 ({grpo.public_id}) is queued, scored by its model; cancel it or wait for "
            "it to finish.") in page

    Run.objects.filter(pk__in=[ppo.pk, grpo.pk]).update(status=RunStatus.CANCELLED)
    later_stage = {key: value for key, value in grpo_spec.items() if key != "model"}
    pipeline = pipelines.pipeline_create(project=team.project, user=team.owner, document={"name": "later", "stages": [
        {"name": "sft", "spec": sft_spec(catalog)}, {"name": "grpo", "spec": later_stage}]})
    with django_capture_on_commit_callbacks(execute=True):
        response = Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=team.owner, name='s')[1]}").delete(
            f"/api/v1/projects/alpha/runs/{judge.public_id}/")
    assert json.loads(response.content) == {"errors": {"delete": [
        f"pipeline {isolated(pipeline.name)} is running, and its stages name it; cancel it or wait for it to finish"]}}
    assert Run.objects.filter(pk=judge.pk).exists()


def test_a_run_whose_starting_run_data_or_reward_model_was_deleted_is_neither_resumed_nor_retried(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    """Resume trains on what the run started from: queued, it failed on the deleted run's missing
    directory (an error naming the base model at the root of the chain); Retry said only that the id is no
    run of the project. Both say what is gone and point to Duplicate, and queue nothing."""
    from webapp.datasets.services import dataset_version_delete

    parent = finished_run(team, catalog, user=team.owner, name="parent")
    child = finished_run(team, catalog, user=team.owner, name="child", model=parent.public_id,
                         data={"train": catalog.sft.public_id, "eval": catalog.prompts.public_id})
    Run.objects.filter(pk=child.pk).update(status=RunStatus.FAILED)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_delete(run=parent)
        dataset_version_delete(version=catalog.prompts)
    child.refresh_from_db()
    for act in (lambda: services.run_resume(run=child, user=team.owner),
                lambda: services.run_retry(run=child, user=team.owner)):
        with pytest.raises(ValidationError) as caught:
            act()
        assert caught.value.messages == [
            f"what run {child.public_id} trains on was deleted since (its starting model {parent.public_id}, its "
            f"evaluation data {catalog.prompts.public_id}): duplicate it to choose another"]
    child.refresh_from_db()
    assert child.status == RunStatus.FAILED and Run.objects.count() == 1

    judge = finished_run(team, catalog, user=team.owner, name="judge", task="reward",
                         data={"train": catalog.preference.public_id})
    prompts = make_ready_version(team.project, name="more questions", kind="prompts", rows=[{"prompt": "1+1?"}])
    ppo = services.run_create(project=team.project, user=team.owner, name="ppo-run", spec={
        "task": "ppo", "model": catalog.base_model.public_id, "data": {"train": prompts.public_id},
        "train": {"max_steps": 10, "batch_size": 2}, "ppo": {"reward_model": judge.public_id}})
    Run.objects.filter(pk=ppo.pk).update(status=RunStatus.CANCELLED)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_delete(run=judge)
    ppo.refresh_from_db()
    with pytest.raises(ValidationError) as caught:
        services.run_resume(run=ppo, user=team.owner)
    assert caught.value.messages == [f"what run {ppo.public_id} trains on was deleted since (its reward model "
                                     f"{judge.public_id}): duplicate it to choose another"]


def test_a_pipeline_whose_stage_runs_were_deleted_says_so_rather_than_that_they_never_started(
        team, catalog, sent_tasks, tmp_path, client_for, django_capture_on_commit_callbacks):
    """The page of a pipeline whose every stage succeeded said "not started" for each deleted stage's run
    and "Result: none: no stage succeeded and passed its guard", beside its message "all 3 stages
    succeeded"."""
    from tests.webapp.runs.test_pipelines import finish
    from webapp.runs import pipelines

    sft = {"task": "sft", "model": catalog.base_model.public_id, "data": {"train": catalog.sft.public_id},
           "train": {"max_steps": 10}}
    dpo = {"task": "dpo", "data": {"train": catalog.preference.public_id}, "train": {"max_steps": 5}}
    pipeline = pipelines.pipeline_create(project=team.project, user=team.owner, document={"name": "chain", "stages": [
        {"name": "sft", "spec": sft}, {"name": "dpo", "spec": dpo}, {"name": "serve", "export": {"quantize": "int8"}}]})
    with django_capture_on_commit_callbacks(execute=True):
        pipelines.pipeline_advance(run=finish(pipeline.runs.get(), tmp_path=tmp_path))
        pipelines.pipeline_advance(run=finish(pipeline.runs.get(pipeline_stage=1), tmp_path=tmp_path))
    pipelines.export_stage_finish(pipeline_pk=pipeline.pk, stage=2, description={
        "scheme": "int8", "bits": 8, "model_bytes": 2**20, "bfloat16_bytes": 2**21, "ratio_to_bfloat16": 0.5})
    with django_capture_on_commit_callbacks(execute=True):
        for run in pipeline.runs.order_by("-pipeline_stage"):
            services.run_delete(run=run)
    page = client_for(team.viewer).get(f"/p/alpha/pipelines/{pipeline.public_id}/").content.decode()
    assert "not started" not in page and "no stage succeeded" not in page
    assert 'Result: <span class="muted">its run was deleted since</span>' in page
    assert page.count('<span class="muted">deleted since</span>') == 2
    assert '<span class="muted">serving copy of a run deleted since</span>' in page


def test_the_runs_table_does_not_give_the_base_model_of_the_chain_as_the_start_of_a_run_whose_start_was_deleted(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """A run started from a deleted run showed "tiny deleted starting model": the base model at the root of
    the chain, as if the run had started from it."""
    parent = finished_run(team, catalog, user=team.owner, name="parent")
    child = finished_run(team, catalog, user=team.owner, name="child", model=parent.public_id)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_delete(run=parent)
    table = client_for(team.viewer).get("/p/alpha/runs/").content.decode()
    row = table.split(f'data-run="{child.public_id}"')[1].split("</tr>")[0]
    start_cell = row.split("<td")[4]
    assert catalog.base_model.name not in start_cell and "deleted starting model" in start_cell


def test_a_comparison_left_with_one_run_by_a_deletion_names_the_run_that_is_gone(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """A saved comparison of two runs, one deleted since, sent back to the table saying only "choose between 2
    and 16 runs of this project to compare", as if the link were wrong."""
    kept = finished_run(team, catalog, user=team.owner, name="kept")
    gone = finished_run(team, catalog, user=team.owner, name="gone")
    with django_capture_on_commit_callbacks(execute=True):
        services.run_delete(run=gone)
    client = client_for(team.viewer)
    response = client.get(f"/p/alpha/runs/compare/?runs={kept.public_id}&runs={gone.public_id}")
    assert response.status_code == 302
    page = client.get(response["Location"]).content.decode()
    assert (f"choose between 2 and 16 runs of this project to compare: {gone.public_id} is not a run of this project "
            "(deleted since, or mistyped)") in page


def test_a_second_person_deleting_what_was_just_deleted_lands_on_the_list_told_so(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """Two owners on the same run's page both click Delete: the second got a bare "Not found" page for
    their click, as if the site had lost their data."""
    run = finished_run(team, catalog, user=team.owner, name="shared")
    first, second = client_for(team.owner), client_for(team.owner)
    second_page = second.get(url(run)).content.decode()
    assert delete_from_page(first, run, django_capture_on_commit_callbacks)["Location"] == "/p/alpha/runs/"
    response = second.post(url(run, "delete/"),
                           {"submission_token": form_token(second_page, after=url(run, "delete/"))})
    assert response.status_code == 302 and response["Location"] == "/p/alpha/runs/"
    assert "Nothing to delete: it is gone already (deleted meanwhile, perhaps by someone else)." in second.get(
        "/p/alpha/runs/").content.decode()


def test_duplicating_a_run_whose_reward_run_was_deleted_says_so_at_that_field(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """Duplicate named a deleted starting model or dataset at its field, but a deleted reward model left the
    PPO form's reward model on "none" without a word (and the launch then asked for a reward)."""
    judge = finished_run(team, catalog, user=team.owner, name="judge", task="reward",
                         data={"train": catalog.preference.public_id})
    ppo = services.run_create(project=team.project, user=team.owner, name="ppo-run", spec={
        "task": "ppo", "model": catalog.base_model.public_id, "data": {"train": catalog.prompts.public_id},
        "train": {"max_steps": 10, "batch_size": 2}, "ppo": {"reward_model": judge.public_id}})
    Run.objects.filter(pk=ppo.pk).update(status=RunStatus.CANCELLED)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_delete(run=judge)
    form = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={ppo.public_id}").content.decode()
    assert "Some of what the run used is gone" in form
    assert f"{judge.public_id}, which ppo-run used, was deleted since; choose another" in form


def test_a_run_whose_automatic_serving_copy_is_being_written_is_not_deleted(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """When a run succeeds a serve worker writes its serving copy (no row says so, its page does): deleted
    meanwhile, the worker wrote the copy into a run directory made again for it, files nothing refers to."""
    from webapp.runs import reporting

    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="just done")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    export = services.run_output_dir(run.public_id) / "export"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    run = reporting.run_finish(run=Run.objects.get(pk=run.pk), summary={
        "status": "succeeded", "step": 10, "export": {"model": str(export)}})
    client = client_for(team.owner)
    response = delete_from_page(client, run, django_capture_on_commit_callbacks)
    assert "Nothing was deleted: a serving copy of its model is being written; wait until it is ready." in client.get(
        response["Location"]).content.decode()
    assert Run.objects.filter(pk=run.pk).exists()
    write_serving_copy(export)
    assert delete_from_page(client, run, django_capture_on_commit_callbacks)["Location"] == "/p/alpha/runs/"


def test_a_run_whose_model_is_answering_in_a_chat_or_the_arena_is_deleted_only_once_the_answers_end(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """A run was deleted while a chat or arena answer was being written with its model or a checkpoint of it,
    and the serve worker went on answering with the weights it had. The deletion now waits for those answers,
    naming their conversations (by author and id: a title is private to its author); an answer no worker will
    finish holds nothing. A turn sent after the deletion, from a page still open, is refused."""
    from django.utils import timezone

    from webapp.chat import selectors as chat_selectors, services as chat_services
    from webapp.chat.models import Battle, Conversation, Message, MessageStatus, Role

    run = finished_run(team, catalog, user=team.teammate, name="answering")
    model = chat_selectors.model_choice(project=team.project, ref=run.public_id)
    chat = chat_services.conversation_create(project=team.project, user=team.owner, model=model)
    answer = chat_services.message_send(conversation=chat, model=model, content="Hello")

    def side(user, ref, **message):
        conversation = Conversation.objects.create(project=team.project, user=user, model_ref=ref, model_label=ref,
                                                   in_arena=True)
        Message.objects.create(conversation=conversation, role=Role.ASSISTANT, status=MessageStatus.STREAMING,
                               **message)
        return conversation

    battle = Battle.objects.create(project=team.project, user=team.teammate, prompt="Hi",
                                   side_a=side(team.teammate, f"{run.public_id}:step-10"),
                                   side_b=side(team.teammate, catalog.base_model.public_id))
    lost = side(team.viewer, run.public_id)
    Message.objects.filter(conversation=lost).update(created_at=timezone.now() - timezone.timedelta(days=1))
    with pytest.raises(ValidationError) as refused:
        services.run_delete(run=run)
    assert refused.value.message_dict == {"delete": [
        f"{isolated('alpha-owner')}'s chat conversation {chat.public_id} is being answered by its model; wait for "
        "the answer to finish (its author can stop it)",
        f"{isolated('alpha-teammate')}'s arena battle {battle.public_id} is being answered by its model; wait for "
        "the answers to finish"]}
    page = client_for(team.teammate).post(url(run, "delete/"))
    assert page["Location"] == url(run) and Run.objects.filter(pk=run.pk).exists()

    chat_services.message_finish(message_id=answer.public_id, text="Hi", finish_reason="stop")
    Message.objects.filter(conversation=battle.side_a).update(status=MessageStatus.COMPLETE)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_delete(run=run)
    assert not Run.objects.filter(pk=run.pk).exists()
    with pytest.raises(chat_services.ChatError, match="was deleted as the message was being sent"):
        chat_services.message_send(conversation=chat, model=model, content="Still there?")
    with pytest.raises(chat_services.ChatError, match="was deleted as the message was being sent"):
        chat_services.message_regenerate(conversation=chat, model=model)
    assert list(chat.messages.values_list("content", flat=True)) == ["Hello", "Hi"]
