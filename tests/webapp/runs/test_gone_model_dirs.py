"""A run whose model folder was deleted on disk since (its base model's folder under the models root, the export of
the run it started from): Retry, Resume, Train further, Duplicate and the launch said nothing, queued it, and the train
worker failed it with the command line's advice. Each is refused up front now, naming the model as the project does;
the run page greys the buttons with the same words and lists an export whose folder is gone as deleted."""
from __future__ import annotations

import html
import json
import shutil

import pytest
from django.core.exceptions import ValidationError

from tests.webapp.factories import make_base_model
from tests.webapp.runs.conftest import sft_spec, with_checkpoint
from webapp.core.bidi import isolated
from webapp.runs import reporting, services
from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus


@pytest.fixture
def mine(team, models_root):
    """A base model registered from a real folder under the models root (what a launch reads of it: config.json)."""
    folder = models_root / "mine"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "max_position_embeddings": 2048}))
    return make_base_model(team.project, name="mine", path=str(folder))


def launched(team, catalog, model: str, *, name: str = "first", status: str = RunStatus.FAILED) -> Run:
    run = services.run_create(project=team.project, spec={**sft_spec(catalog), "model": model}, user=team.owner,
                              name=name)
    Run.objects.filter(pk=run.pk).update(status=status)
    run.refresh_from_db()
    return run


def succeeded_with_export(team, catalog, mine) -> tuple[Run, object]:
    """A run from ``mine`` that succeeded and exported its model (a copy of the base model's folder)."""
    run = launched(team, catalog, mine.public_id, status=RunStatus.RUNNING)
    export = run.output_dir / "export"
    shutil.copytree(mine.path, export)
    reporting.run_finish(run=run, summary={"status": "succeeded", "step": 10, "export": {"model": str(export)}})
    run.refresh_from_db()
    return run, export


def reward_run_with_export(team, catalog, mine) -> tuple[Run, object]:
    """A reward run "judge" from ``mine`` that succeeded and exported its model (a copy of the base model's folder)."""
    reward = services.run_create(project=team.project, user=team.owner, name="judge", spec={
        "task": "reward", "model": mine.public_id, "data": {"train": catalog.preference.public_id},
        "train": {"max_steps": 10, "batch_size": 2}})
    Run.objects.filter(pk=reward.pk).update(status=RunStatus.RUNNING)
    export = reward.output_dir / "export"
    shutil.copytree(mine.path, export)
    reporting.run_finish(run=Run.objects.get(pk=reward.pk),
                         summary={"status": "succeeded", "step": 10, "export": {"model": str(export)}})
    return reward, export


def ppo_spec(catalog, mine, reward: Run) -> dict:
    return {"task": "ppo", "model": mine.public_id, "data": {"train": catalog.prompts.public_id},
            "train": {"max_steps": 10, "batch_size": 2}, "ppo": {"reward_model": reward.public_id}}


def page_of(client, run: Run) -> str:
    return client.get(f"/p/alpha/runs/{run.public_id}/").content.decode()


def test_retry_and_resume_of_a_run_whose_base_models_folder_is_gone_are_refused_and_greyed(
        team, catalog, mine, client_for, sent_tasks):
    from django.test import Client

    from webapp.api.services import token_create

    run = launched(team, catalog, mine.public_id)
    queued = len(sent_tasks.calls)
    shutil.rmtree(mine.path)
    for act in (services.run_retry, services.run_resume):
        with pytest.raises(ValidationError) as refused:
            act(run=run, user=team.owner)
        message = refused.value.message_dict["model"][0]
        assert f"base model {isolated('mine')} ({mine.public_id}) is gone from disk" in message
        assert "register it again" in message and "demo-tiny" not in message and mine.path not in message
    assert len(sent_tasks.calls) == queued and Run.objects.count() == 1
    assert Run.objects.get(pk=run.pk).status == RunStatus.FAILED and Run.objects.get(pk=run.pk).attempt == run.attempt
    client = client_for(team.teammate)
    page = page_of(client, run)
    assert 'id="resume-refused">Resume</button>' in page and 'id="retry-refused">Retry</button>' in page
    assert f'action="/p/alpha/runs/{run.public_id}/retry/"' not in page
    assert html.escape(f"base model {isolated('mine')} ({mine.public_id}) is gone from disk") in page
    response = client.post(f"/p/alpha/runs/{run.public_id}/retry/")
    assert Run.objects.count() == 1 and len(sent_tasks.calls) == queued and response.status_code in (302, 400)
    # The page's words say Duplicate (its button); the REST API's name its duplicate/ address and the key to give.
    assert message.endswith("register it again and duplicate the run to choose it")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=team.teammate, name='t')[1]}")
    for action in ("retry", "resume"):
        response = api.post(f"/api/v1/projects/alpha/runs/{run.public_id}/{action}/", "{}",
                            content_type="application/json")
        [answer] = response.json()["errors"]["model"]
        page_words = message.replace("cannot be resumed", f"cannot be {({'retry': 'retried', 'resume': 'resumed'})[action]}")
        assert response.status_code == 400 and answer == page_words.replace(
            " and duplicate the run to choose it",
            f", or POST runs/{run.public_id}/duplicate/ with a new model in its spec"), (action, answer)
    assert Run.objects.count() == 1 and len(sent_tasks.calls) == queued


def test_train_further_of_a_run_whose_base_models_folder_is_gone_is_refused(team, catalog, mine, client_for,
                                                                           sent_tasks):
    run, _export = succeeded_with_export(team, catalog, mine)
    shutil.rmtree(mine.path)
    with pytest.raises(ValidationError) as refused:
        services.run_resume(run=run, user=team.owner, max_steps=20)
    assert f"base model {isolated('mine')} ({mine.public_id}) is gone from disk" in refused.value.message_dict["model"][0]
    assert Run.objects.get(pk=run.pk).status == RunStatus.SUCCEEDED
    assert 'id="resume-refused">Train further</button>' in page_of(client_for(team.teammate), run)


def test_the_launch_refuses_a_base_model_whose_folder_is_gone(team, catalog, mine, client_for, sent_tasks):
    shutil.rmtree(mine.path)
    with pytest.raises(ValidationError) as refused:
        services.run_create(project=team.project, spec={**sft_spec(catalog), "model": mine.public_id},
                            user=team.owner)
    message = refused.value.message_dict["model"][0]
    assert f"base model {isolated('mine')} ({mine.public_id}) is gone from disk" in message and "register it again" in message
    form = {"mode": "form", "task": "sft", "name": "lost", "model": mine.public_id,
            "data.train": catalog.sft.public_id, "train.max_steps": "5", "train.batch_size": "2"}
    response = client_for(team.teammate).post("/p/alpha/runs/new/", form)
    assert response.status_code == 400
    assert html.escape(f"base model {isolated('mine')} ({mine.public_id}) is gone from disk") in response.content.decode()
    assert Run.objects.count() == 0 and sent_tasks.calls == []


def test_runs_from_a_run_whose_export_folder_is_gone_are_refused(team, catalog, mine, client_for, sent_tasks):
    first, export = succeeded_with_export(team, catalog, mine)
    second = launched(team, catalog, first.public_id, name="second")
    shutil.rmtree(export)
    gone = f"the model run {isolated('first')} ({first.public_id}) exported is gone from disk"
    with pytest.raises(ValidationError) as refused:
        services.run_create(project=team.project, spec={**sft_spec(catalog), "model": first.public_id},
                            user=team.owner)
    assert gone in refused.value.message_dict["model"][0]
    for act in (services.run_retry, services.run_resume):
        with pytest.raises(ValidationError) as refused:
            act(run=second, user=team.owner)
        assert gone in refused.value.message_dict["model"][0] and str(export) not in str(refused.value)
    assert Run.objects.count() == 2
    # Duplicate: the launch form says it at the model field before anything is sent.
    page = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={second.public_id}").content.decode()
    assert html.escape(gone) in page


def test_the_run_page_lists_an_export_whose_folder_is_gone_as_deleted(team, catalog, mine, client_for, sent_tasks):
    run, export = succeeded_with_export(team, catalog, mine)
    client = client_for(team.viewer)
    download = f'href="/p/alpha/runs/{run.public_id}/artifacts/model/"'
    assert download in page_of(client, run)
    shutil.rmtree(export)
    page = page_of(client, run)
    assert download not in page
    listed = f'<li>Exported model at step 10 <code>{export.resolve()}</code> <span class="muted">(deleted since)</span></li>'
    assert listed in page  # no size, no "start runs from" and no link
    assert Artifact.objects.get(run=run, kind=ArtifactKind.MODEL).size_bytes > 0
    response = client.get(f"/p/alpha/runs/{run.public_id}/artifacts/model/")
    assert response.status_code == 404 and "Not found" in response.content.decode()


def test_an_exported_checkpoint_whose_folder_is_gone_is_refused_and_listed_as_deleted(team, catalog, mine,
                                                                                      client_for, sent_tasks):
    run, _export = succeeded_with_export(team, catalog, mine)
    exported = run.output_dir / "export-step-5"
    shutil.copytree(mine.path, exported)
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=5, path=str(exported), size_bytes=10)
    client = client_for(team.teammate)
    assert f"?model={run.public_id}@5&amp;task=sft" in page_of(client, run)
    shutil.rmtree(exported)
    with pytest.raises(ValidationError) as refused:
        services.run_create(project=team.project, spec={**sft_spec(catalog), "model": f"{run.public_id}@5"},
                            user=team.owner)
    assert refused.value.message_dict["model"] == [
        f"checkpoint 5 of run {isolated('first')} ({run.public_id}), exported as a starting model, is gone from disk: "
        "its folder was deleted since; choose another starting model"]
    page = page_of(client, run)
    assert (f'<span class="muted">(deleted since): its folder is gone, so runs no longer start from '
            f'<code>{run.public_id}@5</code></span>') in page
    assert f"?model={run.public_id}@5&amp;task=sft" not in page and "artifacts/checkpoint/?step=5" not in page


def test_the_launch_forms_model_list_says_which_base_models_folder_is_gone(team, catalog, mine, client_for):
    """The list offered a base model whose folder was deleted as any other; choosing it was refused only at launch."""
    shutil.rmtree(mine.path)
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=sft").content.decode()
    assert f'<option value="{mine.public_id}" >{isolated("mine")} (base model, its folder is gone)</option>' in page
    # A path outside the roots is left to the load that reads it; the one model left to start from is chosen (a gone
    # one never is).
    assert (f'<option value="{catalog.base_model.public_id}" selected>{isolated(catalog.base_model.name)} (base model)'
            "</option>") in page


def exported_checkpoint(run: Run, mine, step: int):
    """``run``'s checkpoint ``step`` exported as a starting model (a copy of the base model's folder)."""
    exported = run.output_dir / f"export-step-{step}"
    shutil.copytree(mine.path, exported)
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=step, path=str(exported), size_bytes=10)
    return exported


def test_the_launch_forms_model_list_says_which_exports_and_checkpoints_folder_is_gone(team, catalog, mine,
                                                                                       client_for):
    """The list marked a gone base model only: a run's export or exported checkpoint whose folder was deleted was
    offered as any other, and choosing it was refused only at launch."""
    run, export = succeeded_with_export(team, catalog, mine)
    shutil.rmtree(exported_checkpoint(run, mine, 5))
    exported_checkpoint(run, mine, 6)
    shutil.rmtree(export)
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=sft").content.decode()
    first = isolated("first")
    assert (f'<option value="{run.public_id}" >{first} — sft model exported by {run.public_id} '
            "(its folder is gone)</option>") in page
    assert f'<option value="{run.public_id}@5" >{first} — checkpoint 5 (its folder is gone)</option>' in page
    assert f'<option value="{run.public_id}@6" data-positions="2048" >{first} — checkpoint 6</option>' in page


def test_the_launch_forms_model_list_looks_at_the_folders_once_per_recheck_period(team, catalog, mine, client_for,
                                                                                   settings):
    """Every model of the project is listed on each load of the form: whether its folder is there is the answer kept
    for TEMPER_MODEL_FILES_RECHECK_SECONDS, as the chat's pickers keep it (``model_dir_gone(listing=True)``); the
    launch itself looks again."""
    run, export = succeeded_with_export(team, catalog, mine)
    settings.TEMPER_MODEL_FILES_RECHECK_SECONDS = 3600
    client = client_for(team.teammate)
    assert "its folder is gone" not in client.get("/p/alpha/runs/new/?task=sft").content.decode()
    shutil.rmtree(export)
    shutil.rmtree(mine.path)
    assert "its folder is gone" not in client.get("/p/alpha/runs/new/?task=sft").content.decode()
    with pytest.raises(ValidationError):
        services.run_create(project=team.project, spec={**sft_spec(catalog), "model": run.public_id}, user=team.owner)
    settings.TEMPER_MODEL_FILES_RECHECK_SECONDS = 0
    page = client.get("/p/alpha/runs/new/?task=sft").content.decode()
    assert f"{isolated('mine')} (base model, its folder is gone)</option>" in page
    assert f"sft model exported by {run.public_id} (its folder is gone)</option>" in page


def test_a_duplicate_of_a_run_whose_starting_checkpoints_folder_is_gone_says_so_at_the_model_field(
        team, catalog, mine, client_for, sent_tasks):
    first, _export = succeeded_with_export(team, catalog, mine)
    exported = exported_checkpoint(first, mine, 5)
    second = launched(team, catalog, f"{first.public_id}@5", name="second")
    shutil.rmtree(exported)
    page = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={second.public_id}").content.decode()
    gone = (f"checkpoint 5 of run {isolated('first')} ({first.public_id}), exported as a starting model, is gone from "
            "disk: its folder was deleted since; choose another model")
    assert f'<small class="error" id="spec-model-error-1">{html.escape(gone)}</small>' in page
    assert (f'<option value="{first.public_id}@5" selected>{isolated("first")} — checkpoint 5 (its folder is gone)'
            "</option>") in page


def test_the_pipeline_forms_example_starts_from_a_model_whose_folder_is_there(team, catalog, mine, client_for):
    """The example stages filled in the project's first starting model, a base model whose folder was deleted (the
    pipeline would be refused at its first stage) included."""
    client = client_for(team.teammate)
    assert f"model: {mine.public_id}\n" in client.get("/p/alpha/pipelines/new/").content.decode()  # "mine" < "tiny"
    shutil.rmtree(mine.path)
    page = client.get("/p/alpha/pipelines/new/").content.decode()
    assert f"model: {catalog.base_model.public_id}\n" in page and mine.public_id not in page


def test_the_api_says_which_base_models_and_exports_folder_is_gone(team, catalog, mine, client_for):
    """The API's base models (the bm_… a spec's model names) and a run's artifacts (run_…, run_…@step) said nothing of
    a folder deleted since: a client chose one, and its launch was refused."""
    from django.test import Client

    from webapp.api import schemas
    from webapp.api.services import token_create

    run, export = succeeded_with_export(team, catalog, mine)
    shutil.rmtree(exported_checkpoint(run, mine, 5))
    shutil.rmtree(mine.path)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=team.viewer, name='t')[1]}")
    response = api.get("/api/v1/projects/alpha/base-models/")
    schemas.BaseModelList.model_validate_json(response.content)  # as the OpenAPI document describes it
    listed = response.json()
    assert {model["id"]: model["folder_gone"] for model in listed["base_models"]} == {
        mine.public_id: True, catalog.base_model.public_id: False}
    assert api.get(f"/api/v1/projects/alpha/base-models/{mine.public_id}/").json()["folder_gone"] is True
    response = api.get(f"/api/v1/projects/alpha/runs/{run.public_id}/")
    schemas.RunDetail.model_validate_json(response.content)
    detail = response.json()
    assert {(artifact["kind"], artifact["step"]): artifact["folder_gone"] for artifact in detail["artifacts"]} == {
        ("model", 10): False, ("checkpoint", 5): True}


def test_the_run_page_says_its_export_is_gone_for_good_once_its_run_folder_is(team, catalog, mine, client_for,
                                                                              sent_tasks):
    """Its export and run folder deleted, the page still offered Chat with it and Launch a run from it (the chat and
    the launch refuse the model) and said nothing of why: the export cannot be made again, its checkpoints gone."""
    run, _export = succeeded_with_export(team, catalog, mine)
    with_checkpoint(run, 10)
    client = client_for(team.teammate)
    page = page_of(client, run)
    assert 'id="chat-with-run"' in page and 'id="launch-from-run"' in page and 'id="export-gone"' not in page
    assert f'href="/p/alpha/evaluations/new/?model={run.public_id}" id="evaluate-run"' in page
    shutil.rmtree(run.output_dir)
    page = page_of(client, run)
    assert 'id="chat-with-run"' not in page and 'id="launch-from-run"' not in page and 'id="evaluate-run"' not in page
    assert f"?model={run.public_id}&amp;" not in page and 'action="/p/alpha/runs/{run.public_id}/export/"' not in page
    gone = html.escape(f"The model run {isolated('first')} ({run.public_id}) exported is gone from disk: its export "
                       "folder was deleted since, so runs no longer start from it and the chat does not serve it. It "
                       "cannot be exported again: the run's folder, with the checkpoints it was exported from, is "
                       "gone too. Retry trains its spec again as a new run.")
    assert f'<p class="card run-message" id="export-gone">{gone}</p>' in page
    assert 'id="retry-refused"' not in page  # what the note offers works


def test_the_export_gone_note_advises_no_retry_that_is_greyed(team, catalog, mine, client_for, sent_tasks):
    """QA: the note said "Retry trains its spec again as a new run" beside a Retry greyed for what the run trains on
    (its data deleted since). It advises Retry by the judgement that greys it (``services.retry_refusal``)."""
    from webapp.datasets import services as dataset_services

    run, _export = succeeded_with_export(team, catalog, mine)
    shutil.rmtree(run.output_dir)
    dataset_services.dataset_version_delete(version=catalog.sft)
    page = page_of(client_for(team.teammate), run)
    gone = html.escape(f"The model run {isolated('first')} ({run.public_id}) exported is gone from disk: its export "
                       "folder was deleted since, so runs no longer start from it and the chat does not serve it. It "
                       "cannot be exported again: the run's folder, with the checkpoints it was exported from, is "
                       "gone too.")
    assert f'<p class="card run-message" id="export-gone">{gone}</p>' in page
    assert 'id="retry-refused">Retry</button>' in page
    assert html.escape(f"what run {run.public_id} trains on was deleted since (its training data "
                       f"{catalog.sft.public_id}): duplicate it to choose another") in page


def test_a_run_whose_export_alone_is_gone_offers_its_final_checkpoint_for_export(
        team, catalog, mine, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """The checkpoint of the final step was shown as the final model (start runs from it, its launch refused) and
    its export refused as one made already: with that export's folder deleted, it is the way to the model again."""
    run, export = succeeded_with_export(team, catalog, mine)
    with_checkpoint(run, 10)
    client = client_for(team.teammate)
    assert '<span class="badge badge-ok">final model</span>' in page_of(client, run)
    shutil.rmtree(export)
    page = page_of(client, run)
    assert '<span class="badge badge-ok">final model</span>' not in page
    assert f'action="/p/alpha/runs/{run.public_id}/export/"' in page and 'name="step" value="10"' in page
    assert html.escape(f"Export its checkpoint 10 under Checkpoints (the same weights) to start runs from "
                       f"{run.public_id}@10.") in page
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_export_request(run=run, step=10, user=team.teammate)
    assert sent_tasks.calls[-1] == (services.EXPORT_CHECKPOINT_TASK, [run.pk, 10], "train")


def test_train_further_of_a_run_whose_run_folder_is_gone_is_refused_on_the_page_and_in_the_api(
        team, catalog, mine, client_for, sent_tasks):
    """Its run folder deleted (the checkpoints with it), Train further was offered and queued: the engine found no
    checkpoint and trained it from step 0 again while its step history went on from step 10."""
    from django.test import Client

    from webapp.api.services import token_create

    run, _export = succeeded_with_export(team, catalog, mine)
    with_checkpoint(run, 10)
    shutil.rmtree(run.output_dir)
    queued = len(sent_tasks.calls)
    refusal = (f"run {run.public_id} cannot be resumed: its run folder, with the checkpoints it saved, was deleted "
               "from disk since, so it would train again from step 0 while its step history goes on from step 10. "
               "Duplicate it to train its spec again as a new run")
    with pytest.raises(ValidationError) as refused:
        services.run_resume(run=run, user=team.owner, max_steps=20)
    assert refused.value.message_dict == {"__all__": [refusal]}
    page = page_of(client_for(team.teammate), run)
    assert 'id="resume-refused">Train further</button>' in page
    assert f'action="/p/alpha/runs/{run.public_id}/resume/"' not in page
    assert f'<p class="card run-message" id="resume-refusal">Train further: {html.escape(refusal)}</p>' in page
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=team.teammate, name='t')[1]}")
    response = api.post(f"/api/v1/projects/alpha/runs/{run.public_id}/resume/", json.dumps({"max_steps": 20}),
                        content_type="application/json")
    # The API has no Duplicate button: its answer names the address that does what the button does.
    api_refusal = refusal.replace("Duplicate it", f"POST runs/{run.public_id}/duplicate/")
    assert response.status_code == 400 and response.json()["errors"]["__all__"] == [api_refusal]
    run.refresh_from_db()
    assert (run.status, run.attempt, run.total_steps, run.resolved_spec["train"]["max_steps"]) == (
        RunStatus.SUCCEEDED, 1, 10, 10)
    assert len(sent_tasks.calls) == queued


def cancelled_at_step_6(team, catalog, mine) -> Run:
    """A run from ``mine`` cancelled at step 6 as it ran: the engine saved its checkpoint 4 and, as it stopped, 6."""
    run = launched(team, catalog, mine.public_id, status=RunStatus.RUNNING)
    for step in (4, 6):
        with_checkpoint(run, step)
    return reporting.run_finish(run=run, summary={"status": "cancelled", "step": 6})


def resume_refused_everywhere(run: Run, client_for, team, refusal: str, *, api_refusal: str | None = None) -> None:
    """Resume greyed on the run page with ``refusal``, refused by the service in those words and in the REST API in
    ``api_refusal`` (the same words where none is given), and nothing queued."""
    from django.test import Client

    from webapp.api.services import token_create

    page = page_of(client_for(team.teammate), run)
    assert 'id="resume-refused">Resume</button>' in page and f'action="/p/alpha/runs/{run.public_id}/resume/"' not in page
    assert f'<p class="card run-message" id="resume-refusal">Resume: {html.escape(refusal)}</p>' in page
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=team.teammate, name='t')[1]}")
    response = api.post(f"/api/v1/projects/alpha/runs/{run.public_id}/resume/", "{}", content_type="application/json")
    assert response.status_code == 400 and response.json()["errors"]["__all__"] == [api_refusal or refusal]
    with pytest.raises(ValidationError) as refused:
        services.run_resume(run=run, user=team.owner)
    assert refused.value.message_dict == {"__all__": [refusal]}
    run.refresh_from_db()
    assert (run.status, run.attempt) == (RunStatus.CANCELLED, 1)


@pytest.mark.parametrize("removed", ["checkpoints", "step folders"])
def test_resume_of_a_run_whose_checkpoints_were_removed_from_its_folder_is_refused(team, catalog, mine, client_for,
                                                                                   sent_tasks, removed):
    """QA: its checkpoints/ emptied (or its step folders removed by hand), the run folder still there, Resume was
    offered as if it restored one: the engine found none and trained it again from step 0 while its step history
    went on from step 6, as a run whose whole folder was deleted, which is refused."""
    run = cancelled_at_step_6(team, catalog, mine)
    directory = run.output_dir / "checkpoints"
    if removed == "checkpoints":
        shutil.rmtree(directory)
    else:
        for step in ("4", "6"):
            shutil.rmtree(directory / step)
    queued = len(sent_tasks.calls)
    lost = (f"run {run.public_id} cannot be resumed: the checkpoints it saved were deleted from {directory} since, so "
            "it would train again from step 0 while its step history goes on from step 6. ")
    resume_refused_everywhere(run, client_for, team, lost + "Duplicate it to train its spec again as a new run",
                              api_refusal=lost + f"POST runs/{run.public_id}/duplicate/ to train its spec again as a "
                                                 "new run")
    assert len(sent_tasks.calls) == queued


def test_resume_of_a_run_whose_newest_checkpoint_is_incomplete_names_the_one_it_would_go_on_from(
        team, catalog, mine, client_for, sent_tasks):
    """QA: its newest step folder left incomplete (a copy that stopped part way), Resume was offered and queued, and
    the engine failed on it ("checkpoint 6 cannot be read"). An incomplete one is not counted: Resume is greyed with
    the newest whole checkpoint to go on from once it is moved out, and then resumes from that one; with none whole,
    the run would train again from step 0, which is refused."""
    run = cancelled_at_step_6(team, catalog, mine)
    directory = run.output_dir / "checkpoints"
    (directory / "6" / "state").unlink()  # left empty, as in the engine's own test of it
    resume_refused_everywhere(run, client_for, team, (
        f"run {run.public_id} cannot be resumed yet: checkpoint 6 is incomplete in {directory} (a save or a copy that "
        "stopped part way), and the engine restores the newest checkpoint, so it would fail in the train worker. Move "
        "it out of checkpoints/ to resume from checkpoint 4, the newest whole one"))
    (directory / "4" / "state").unlink()
    none_whole = (f"run {run.public_id} cannot be resumed: checkpoints 4, 6 are incomplete in {directory} (a save or a "
                  "copy that stopped part way), and it has no whole one, so it could only start over from step 0 "
                  "while its step history goes on from step 6. ")
    resume_refused_everywhere(run, client_for, team, none_whole + "Duplicate it to train its spec again as a new run",
                              api_refusal=none_whole + f"POST runs/{run.public_id}/duplicate/ to train its spec "
                                                       "again as a new run")
    with_checkpoint(run, 4)
    (directory / "6").rename(run.output_dir / "checkpoint-6-incomplete")
    resumed = services.run_resume(run=run, user=team.owner)
    assert resumed.status == RunStatus.QUEUED
    assert resumed.log_lines.order_by("-pk").first().message.endswith("; continuing from checkpoint 4")


def test_a_run_that_saved_no_whole_checkpoint_is_told_to_move_the_incomplete_one_out(team, catalog, mine, sent_tasks):
    """Failed at step 3 with no checkpoint recorded, but an incomplete step folder in its run folder: the engine would
    fail on it; moved out, the run starts from step 0 as one that saved none always did."""
    run = launched(team, catalog, mine.public_id)
    Run.objects.filter(pk=run.pk).update(current_step=3)
    run.refresh_from_db()
    (run.output_dir / "checkpoints" / "3").mkdir(parents=True)
    with pytest.raises(ValidationError) as refused:
        services.run_resume(run=run, user=team.owner)
    assert refused.value.messages == [
        f"run {run.public_id} cannot be resumed yet: checkpoint 3 is incomplete in {run.output_dir / 'checkpoints'} (a "
        "save or a copy that stopped part way), and the engine restores the newest checkpoint, so it would fail in the "
        "train worker. Move it out of checkpoints/ to start it over from step 0, as it saved no whole checkpoint"]
    (run.output_dir / "checkpoints" / "3").rmdir()
    assert services.run_resume(run=run, user=team.owner).status == RunStatus.QUEUED


def test_a_run_that_saved_no_checkpoint_is_resumed_from_step_0_without_its_run_folder(team, catalog, mine,
                                                                                      sent_tasks):
    """A run failed before its first save (no summary, no artifact) never had a run folder worth keeping: its resume
    starts from step 0 as it always did."""
    run = launched(team, catalog, mine.public_id)
    Run.objects.filter(pk=run.pk).update(current_step=3)
    run.refresh_from_db()
    assert not run.output_dir.exists()
    assert services.run_resume(run=run, user=team.owner).status == RunStatus.QUEUED


def test_a_reward_run_whose_export_folder_is_gone_is_marked_in_the_form_and_refused_as_ppo_reward_model(
        team, catalog, mine, client_for, sent_tasks):
    """The PPO form offered a reward run whose export folder was deleted as any other, and the launch queued it: the
    run failed in the train worker on the missing folder."""
    reward, export = reward_run_with_export(team, catalog, mine)
    client = client_for(team.teammate)
    option = f'<option value="{reward.public_id}" >{isolated("judge")} — reward model of {reward.public_id}'
    assert f"{option}</option>" in client.get("/p/alpha/runs/new/?task=ppo").content.decode()
    shutil.rmtree(export)
    assert f"{option} (its folder is gone)</option>" in client.get("/p/alpha/runs/new/?task=ppo").content.decode()
    queued = len(sent_tasks.calls)
    with pytest.raises(ValidationError) as refused:
        services.run_create(project=team.project, user=team.owner, spec=ppo_spec(catalog, mine, reward))
    assert refused.value.message_dict["ppo.reward_model"] == [
        f"the model run {isolated('judge')} ({reward.public_id}) exported is gone from disk: its export folder was "
        "deleted since; choose another reward run of this project, or train this one again as a new run (Retry on its "
        "page)"]
    assert not Run.objects.filter(task="ppo").exists() and len(sent_tasks.calls) == queued


def test_the_api_refuses_a_reward_run_whose_export_is_gone_in_its_own_words(team, catalog, mine, sent_tasks):
    """An API caller was told to "Retry on its page", a button it has not: launched through POST runs/ (one run or a
    sweep) or a duplicate/, the refusal names the API's retry/ of the reward run instead; nothing is saved."""
    from django.test import Client

    from webapp.api.services import token_create

    reward, export = reward_run_with_export(team, catalog, mine)
    ppo = services.run_create(project=team.project, user=team.owner, name="policy",
                              spec=ppo_spec(catalog, mine, reward))
    shutil.rmtree(export)
    _token, secret = token_create(user=team.owner, name="script")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    words = (f"the model run {isolated('judge')} ({reward.public_id}) exported is gone from disk: its export folder "
             "was deleted since; choose another reward run of this project, or train this one again as a new run "
             f"(POST runs/{reward.public_id}/retry/)")
    runs_before, queued = Run.objects.count(), len(sent_tasks.calls)
    for path, body in (("runs/", {"spec": ppo_spec(catalog, mine, reward)}),
                       ("runs/", {"spec": ppo_spec(catalog, mine, reward), "sweep": {"train.batch_size": [2, 4]}}),
                       (f"runs/{ppo.public_id}/duplicate/", {})):
        response = client.post(f"/api/v1/projects/alpha/{path}", json.dumps(body), content_type="application/json")
        assert response.status_code == 400, (path, response.content)
        errors = response.json()["errors"]
        said = errors.get("ppo.reward_model") or errors["sweep"]
        assert any(words in message for message in said), (path, said)
    assert Run.objects.count() == runs_before and len(sent_tasks.calls) == queued


def test_a_ppo_run_whose_reward_runs_export_folder_is_gone_is_not_resumed_nor_retried(team, catalog, mine, client_for,
                                                                                       sent_tasks):
    """A launch refuses a reward run whose export folder is gone; a resume or a retry of a PPO run that scores with one
    was queued, and failed in the train worker on the missing folder. Refused with nothing queued, and the page greys
    both buttons with the words (rerun_refusals)."""
    reward, export = reward_run_with_export(team, catalog, mine)
    ppo = services.run_create(project=team.project, user=team.owner, name="policy",
                              spec=ppo_spec(catalog, mine, reward))
    Run.objects.filter(pk=ppo.pk).update(status=RunStatus.FAILED, current_step=0)
    ppo.refresh_from_db()
    assert services.rerun_refusals(ppo) == {"resume": "", "retry": ""}
    shutil.rmtree(export)
    refusal = (f"what run {ppo.public_id} trains on was deleted since (the exported model of its reward run "
               f"{reward.public_id}, whose folder is gone from disk): duplicate it to choose another")
    assert services.rerun_refusals(ppo) == {"resume": refusal, "retry": refusal}
    queued = len(sent_tasks.calls)
    for rerun in (services.run_resume, services.run_retry):
        with pytest.raises(ValidationError) as refused:
            rerun(run=Run.objects.get(pk=ppo.pk), user=team.owner)
        assert refused.value.message_dict["__all__"] == [refusal]
    assert len(sent_tasks.calls) == queued and Run.objects.filter(task="ppo").count() == 1
    assert Run.objects.get(pk=ppo.pk).status == RunStatus.FAILED


def test_a_viewer_is_told_what_of_the_export_is_gone_without_advice_it_cannot_act_on(team, catalog, mine,
                                                                                    client_for):
    """#export-gone told every role to export a checkpoint or to Retry: a viewer's page offers neither."""
    run, export = succeeded_with_export(team, catalog, mine)
    with_checkpoint(run, 10)
    shutil.rmtree(export)
    viewer, teammate = client_for(team.viewer), client_for(team.teammate)
    gone = html.escape(f"The model run {isolated('first')} ({run.public_id}) exported is gone from disk: its export "
                       "folder was deleted since, so runs no longer start from it and the chat does not serve it.")
    advice = html.escape(f"Export its checkpoint 10 under Checkpoints (the same weights) to start runs from "
                         f"{run.public_id}@10.")
    assert f'<p class="card run-message" id="export-gone">{gone}</p>' in page_of(viewer, run)
    assert f'<p class="card run-message" id="export-gone">{gone} {advice}</p>' in page_of(teammate, run)
    shutil.rmtree(run.output_dir)
    lost = html.escape(" It cannot be exported again: the run's folder, with the checkpoints it was exported from, is "
                       "gone too.")
    assert f'<p class="card run-message" id="export-gone">{gone}{lost}</p>' in page_of(viewer, run)
    assert (f'<p class="card run-message" id="export-gone">{gone}{lost} Retry trains its spec again as a new run.</p>'
            in page_of(teammate, run))
