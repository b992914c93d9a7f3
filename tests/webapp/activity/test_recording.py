"""Each action a person does in a project is logged once, by its own service, with who did it and to what, in the
action's transaction: an action refused (or rolled back) logs nothing. Driven through the real services, the run
page and the REST API."""
import json

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction

from tests.webapp.factories import du_bytes, make_user, write_model_dir
from tests.webapp.review.conftest import answer
from tests.webapp.runs.conftest import sft_spec
from tests.webapp.runs.test_pipelines import document
from webapp.activity.models import Activity, Verb
from webapp.activity.services import activity_record
from webapp.api.services import token_create
from webapp.basemodels import services as basemodel_services
from webapp.chat.tokens import project_token_create, project_token_revoke
from webapp.datasets import services as dataset_services
from webapp.projects import services as project_services
from webapp.projects.models import Membership, Role
from webapp.review import services as review_services
from webapp.review.models import Item
from webapp.runs import pipelines, serving_copies, services
from webapp.runs.models import Run, RunStatus, ServingCopy, ServingCopyStatus
from webapp.runs.sweeps import axes_from_mapping


def logged() -> list[tuple[str, str, str, str]]:
    """The log, oldest first: (actor name, verb, target kind, target id)."""
    return [(entry.actor_name, entry.verb, entry.target_kind, entry.target_id)
            for entry in Activity.objects.order_by("id")]


def write_checkpoint(run, step):
    shard = run.output_dir / "checkpoints" / str(step) / "state"
    shard.parent.mkdir(parents=True, exist_ok=True)
    shard.write_bytes(b"\0" * 100)


def ended(run, status=RunStatus.FAILED, steps=()):
    Run.objects.filter(pk=run.pk).update(status=status, current_step=(steps[-1] if steps else 0) + 5)
    for step in steps:
        write_checkpoint(run, step)
    run.refresh_from_db()
    return run


def test_a_run_launched_from_the_page_is_logged_once(team, catalog, client_for, sent_tasks):
    response = client_for(team.teammate).post("/p/alpha/runs/new/", {
        "mode": "yaml", "name": "from-page", "spec_yaml": services.spec_to_yaml(sft_spec(catalog))})
    assert response.status_code == 302
    run = Run.objects.get(name="from-page")
    assert logged() == [("alpha-teammate", Verb.RUN_LAUNCHED, "run", run.public_id)]
    assert Activity.objects.get().target_label == "from-page"


def test_a_run_launched_through_the_rest_api_is_logged_once(team, catalog, client, sent_tasks):
    _row, secret = token_create(user=team.teammate, name="ci")
    response = client.post("/api/v1/projects/alpha/runs/", json.dumps({"spec": sft_spec(catalog), "name": "api-run"}),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 201, response.content
    assert logged() == [("alpha-teammate", Verb.RUN_LAUNCHED, "run", response.json()["id"])]


def test_a_launch_refused_logs_nothing(team, catalog, client_for, sent_tasks):
    bad = client_for(team.teammate).post("/p/alpha/runs/new/", {"mode": "yaml", "spec_yaml": "task: sft\n"})
    assert bad.status_code == 400
    with pytest.raises(ValidationError):
        services.run_create(project=team.project, spec={**sft_spec(catalog), "model": "bm_gone"}, user=team.owner)
    assert logged() == []


def test_a_sweep_is_one_entry_with_its_run_count(team, catalog, sent_tasks):
    launched = services.sweep_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="lr",
                                     axes=axes_from_mapping({"optim.learning_rate": [0.001, 0.002, 0.003]}))
    assert logged() == [("alpha-teammate", Verb.SWEEP_LAUNCHED, "sweep", launched.tag)]
    assert Activity.objects.get().details == {"runs": 3}


def test_cancel_resume_train_further_retry_archive_and_delete_are_each_logged(team, catalog, sent_tasks):
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="one")
    Activity.objects.all().delete()
    services.run_cancel(run=run, user=team.owner)
    services.run_resume(run=run, user=team.teammate)
    run = ended(run, RunStatus.SUCCEEDED)
    services.run_resume(run=run, user=team.teammate, max_steps=50)
    run = ended(run, RunStatus.FAILED)
    retry = services.run_retry(run=run, user=team.owner)
    services.run_set_archived(runs=[run, retry.__class__.objects.get(pk=retry.pk)], archived=False, actor=team.owner)
    ended(retry, RunStatus.CANCELLED)
    services.run_set_archived(runs=[run, retry], archived=True, actor=team.owner)
    services.run_set_archived(runs=[run], archived=False, actor=team.teammate)
    services.run_delete(run=retry, actor=team.owner)
    assert logged() == [
        ("alpha-owner", Verb.RUN_CANCELLED, "run", run.public_id),
        ("alpha-teammate", Verb.RUN_RESUMED, "run", run.public_id),
        ("alpha-teammate", Verb.RUN_TRAINED_FURTHER, "run", run.public_id),
        ("alpha-owner", Verb.RUN_RETRIED, "run", run.public_id),  # one entry: the retry's launch is not another
        ("alpha-owner", Verb.RUN_ARCHIVED, "run", run.public_id),  # not unarchiving what was not archived
        ("alpha-owner", Verb.RUN_ARCHIVED, "run", retry.public_id),
        ("alpha-teammate", Verb.RUN_UNARCHIVED, "run", run.public_id),
        ("alpha-owner", Verb.RUN_DELETED, "run", retry.public_id),
    ]
    entries = list(Activity.objects.order_by("id"))
    assert entries[2].details == {"max_steps": 50} and entries[3].details == {"as": retry.public_id}
    assert entries[-1].target_label == retry.name  # kept: the run is gone


def test_refused_actions_log_nothing(team, catalog, sent_tasks):
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="queued")
    Activity.objects.all().delete()
    with pytest.raises(ValidationError):
        services.run_delete(run=run, actor=team.owner)  # still queued
    with pytest.raises(ValidationError):
        services.run_set_archived(runs=[run], archived=True, actor=team.owner)
    with pytest.raises(ValidationError):
        services.run_resume(run=run, user=team.owner)
    with pytest.raises(ValidationError):
        project_services.membership_remove(membership=Membership.objects.get(user=team.owner), actor=team.owner)
    assert logged() == []


def test_an_action_rolled_back_after_its_service_leaves_no_entry(team, catalog, sent_tasks):
    with pytest.raises(RuntimeError), transaction.atomic():
        services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate)
        raise RuntimeError("the request failed after the launch")
    assert logged() == [] and not Run.objects.exists()


def test_recording_outside_a_transaction_is_refused(team, transactional_db):
    with pytest.raises(RuntimeError, match="inside the transaction"):
        activity_record(project=team.project, actor=team.owner, verb=Verb.RUN_LAUNCHED)


def test_checkpoint_deletion_and_pruning_are_logged_once_each(team, catalog, sent_tasks,
                                                             django_capture_on_commit_callbacks):
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="ck")
    run = ended(run, steps=(10, 20, 30, 40))
    other = ended(services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="ck2"),
                  steps=(10, 20))
    Activity.objects.all().delete()
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_delete(run=run, step=10, user=team.teammate)
        services.checkpoints_prune(run=run, user=team.owner)
        services.project_checkpoints_prune(project=team.project, user=team.owner)
    assert logged() == [
        ("alpha-teammate", Verb.CHECKPOINT_DELETED, "run", run.public_id),
        ("alpha-owner", Verb.CHECKPOINTS_PRUNED, "run", run.public_id),
        ("alpha-owner", Verb.CHECKPOINTS_PRUNED, "run", other.public_id),  # the project-wide prune: one per run
    ]
    deleted, pruned, _other = Activity.objects.order_by("id")
    assert deleted.details == {"step": 10, "bytes_freed": du_bytes(run.output_dir / "checkpoints" / "40")}
    assert pruned.details["steps"] == [20, 30] and pruned.details["bytes_freed"] == 2 * deleted.details["bytes_freed"]
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    with pytest.raises(ValidationError):  # refused while it runs: nothing logged
        services.checkpoint_delete(run=Run.objects.get(pk=run.pk), step=40, user=team.owner)
    assert Activity.objects.count() == 3


def test_a_pipeline_launched_and_cancelled(team, catalog, sent_tasks):
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog), user=team.teammate)
    assert logged() == [("alpha-teammate", Verb.PIPELINE_LAUNCHED, "pipeline", pipeline.public_id)]
    stage_run = Run.objects.get(pipeline=pipeline)
    pipelines.pipeline_cancel(pipeline=pipeline, user=team.owner)
    # The pipeline's cancel cancels its stage's run, by the same person: both are said.
    assert logged()[1:] == [("alpha-owner", Verb.PIPELINE_CANCELLED, "pipeline", pipeline.public_id),
                            ("alpha-owner", Verb.RUN_CANCELLED, "run", stage_run.public_id)]
    with pytest.raises(ValidationError):
        pipelines.pipeline_cancel(pipeline=pipeline, user=team.owner)
    assert len(logged()) == 3


def test_datasets_created_uploaded_and_deleted(team, sent_tasks):
    rows = b'{"prompt": "a", "completion": "b"}\n'
    version = dataset_services.dataset_create_with_upload(
        project=team.project, name="chats", kind="sft", upload=SimpleUploadedFile("c.jsonl", rows), file_format=None,
        column_mapping={}, user=team.teammate)
    dataset = version.dataset
    second = dataset_services.dataset_version_create(dataset=dataset, upload=SimpleUploadedFile("d.jsonl", rows),
                                                     file_format=None, column_mapping={}, user=team.owner)
    with pytest.raises(ValidationError):
        dataset_services.dataset_create(project=team.project, name="CHATS", kind="sft", user=team.owner)
    dataset_services.dataset_version_delete(version=second, actor=team.owner)
    dataset_services.dataset_delete(dataset=dataset, actor=team.teammate)
    assert logged() == [
        ("alpha-teammate", Verb.DATASET_CREATED, "dataset", dataset.public_id),  # its first version with it
        ("alpha-owner", Verb.DATASET_VERSION_UPLOADED, "dataset_version", second.public_id),
        ("alpha-owner", Verb.DATASET_VERSION_DELETED, "dataset_version", second.public_id),
        ("alpha-teammate", Verb.DATASET_DELETED, "dataset", dataset.public_id),
    ]
    assert Activity.objects.get(verb=Verb.DATASET_VERSION_UPLOADED).target_label == "chats v2"


def test_base_models_registered_copied_and_deleted(team, settings, tmp_path, sent_tasks):
    settings.MODELS_ROOT = tmp_path / "models"
    write_model_dir(settings.MODELS_ROOT / "mine")
    base_model = basemodel_services.basemodel_register(project=team.project, name="mine", path="mine",
                                                       user=team.teammate)
    with pytest.raises(ValidationError):
        basemodel_services.basemodel_register(project=team.project, name="Mine", path="mine", user=team.owner)
    serving_copies.serving_copy_request(project=team.project, user=team.owner, base_model=base_model)
    ServingCopy.objects.update(status=ServingCopyStatus.READY)  # as its worker leaves it
    basemodel_services.basemodel_unregister(base_model=base_model, actor=team.owner)
    assert logged() == [
        ("alpha-teammate", Verb.BASE_MODEL_REGISTERED, "base_model", base_model.public_id),
        ("alpha-owner", Verb.SERVING_COPY_REQUESTED, "base_model", base_model.public_id),
        ("alpha-owner", Verb.BASE_MODEL_DELETED, "base_model", base_model.public_id),
    ]
    assert Activity.objects.get(verb=Verb.SERVING_COPY_REQUESTED).details == {"scheme": "int8"}


def test_members_added_changed_and_removed_from_the_members_page(team, client_for):
    carol = make_user("carol")
    client = client_for(team.owner)
    assert client.post("/p/alpha/members/", {"username": "carol", "role": "member"}).status_code == 302
    assert client.post("/p/alpha/members/role/", {"username": "carol", "role": "owner"}).status_code == 302
    assert client.post("/p/alpha/members/remove/", {"username": "carol"}).status_code == 302
    assert logged() == [("alpha-owner", Verb.MEMBER_ADDED, "member", "carol"),
                        ("alpha-owner", Verb.MEMBER_ROLE_CHANGED, "member", "carol"),
                        ("alpha-owner", Verb.MEMBER_REMOVED, "member", "carol")]
    assert [entry.details for entry in Activity.objects.order_by("id")][:2] == [
        {"role": "member"}, {"from": "member", "to": "owner"}]
    project_services.membership_add(project=team.project, user=carol, role=Role.VIEWER)  # manage.py's temper_setup
    assert Activity.objects.order_by("id").last().actor_name == "" and Activity.objects.last().actor is None


def test_project_tokens_created_and_revoked(team):
    token, _secret = project_token_create(user=team.teammate, project=team.project, name="laptop")
    assert project_token_revoke(user=team.teammate, project=team.project, token_id=token.pk) is not None
    assert project_token_revoke(user=team.teammate, project=team.project, token_id=token.pk) is None  # nothing
    with pytest.raises(PermissionError):
        project_token_create(user=team.viewer, project=team.project, name="no")
    assert logged() == [("alpha-teammate", Verb.CHAT_TOKEN_CREATED, "chat_token", f"{token.prefix}…"),
                        ("alpha-teammate", Verb.CHAT_TOKEN_REVOKED, "chat_token", f"{token.prefix}…")]


def test_review_campaigns_created_exported_and_deleted(team, carol, preference_version, sent_tasks):
    Activity.objects.all().delete()  # carol's joining
    campaign = review_services.campaign_create(
        project=team.project, name="pass 1", guidelines="", required_reviews=2, reviewers=[team.teammate, carol],
        source_version=preference_version, user=team.owner)
    review_services.campaign_load_items(campaign_id=campaign.pk)
    first = Item.objects.get(campaign=campaign, sequence=1)
    for reviewer in (team.teammate, carol):
        answer(first, reviewer, "a")
    export = review_services.export_create(campaign=campaign, user=team.teammate,
                                           options=review_services.ExportOptions(dataset_name="reviewed"))
    review_services.export_write(export_id=export.pk)  # the worker's: it makes the dataset, logging nothing more
    review_services.campaign_delete(campaign=campaign, actor=team.owner)
    assert logged() == [("alpha-owner", Verb.CAMPAIGN_CREATED, "campaign", campaign.public_id),
                        ("alpha-teammate", Verb.CAMPAIGN_EXPORTED, "campaign", campaign.public_id),
                        ("alpha-owner", Verb.CAMPAIGN_DELETED, "campaign", campaign.public_id)]
