"""Deleting an uploaded model's folder with its registration (``services.basemodel_unregister(delete_files=True)``,
``removal``): an owner's act, on the model's page (the *Also delete its files* box) and in the REST API
(``DELETE ...?delete_files=true``). The folder goes once committed and its name is free for a new upload; a
registered directory, a folder no longer where the upload put it, or a model work still reads is refused with
nothing deleted; a link planted in the folder is removed, never followed."""
from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db.models.signals import post_delete
from django.test import Client

from tests.webapp.basemodels.test_uploads import zip_of
from tests.webapp.factories import form_token, make_ready_version, write_model_dir
from tests.webapp.runs.conftest import Catalog, sent_tasks, sft_spec  # noqa: F401 (a fixture)
from webapp.api.services import token_create
from webapp.basemodels import services
from webapp.basemodels.models import BaseModel
from webapp.basemodels.uploads import basemodel_upload
from webapp.core.bidi import isolated
from webapp.runs import services as run_services
from webapp.runs.models import Run, RunStatus, ServingCopy, ServingCopyStatus
from webapp.runs.serving_copies import base_model_copy_dir

# Committed for real: the folder goes once the unregistering commits, and the page and the API say how that went.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def archive(tmp_path) -> Path:
    return zip_of(tmp_path / "tiny.zip", write_model_dir(tmp_path / "source" / "tiny"))


@pytest.fixture
def uploaded(team, models_root, archive) -> BaseModel:
    """A model the owner uploaded into ``projects/alpha/uploaded/``, with a serving copy written."""
    model = basemodel_upload(project=team.project, name="uploaded", archive=archive, archive_name=archive.name,
                             user=team.owner)
    copy = base_model_copy_dir(model)
    copy.mkdir(parents=True)
    (copy / "quantization.json").write_text("{}")
    ServingCopy.objects.create(project=team.project, base_model=model, status=ServingCopyStatus.READY)
    return model


def page_url(model: BaseModel, suffix: str = "") -> str:
    return f"/p/alpha/models/{model.public_id}/{suffix}"


def delete_on_page(client: Client, model: BaseModel, *, delete_files: bool = True):
    page = client.get(page_url(model)).content.decode()
    fields = {"submission_token": form_token(page, after=page_url(model, "delete/"))}
    if delete_files:
        fields["delete_files"] = "1"
    return client.post(page_url(model, "delete/"), fields)


def api_delete(user, model: BaseModel, query: str = "?delete_files=true"):
    _token, secret = token_create(user=user, name="script")
    response = Client(HTTP_AUTHORIZATION=f"Bearer {secret}").delete(
        f"/api/v1/projects/alpha/base-models/{model.public_id}/{query}")
    return response.status_code, json.loads(response.content or b"null")


def test_an_owner_deletes_an_uploaded_models_folder_on_its_page_and_the_name_is_free_again(
        team, uploaded, archive, client_for):
    folder, copy = Path(uploaded.path), base_model_copy_dir(uploaded)
    assert uploaded.uploaded and (folder / "config.json").is_file()
    owner = client_for(team.owner)
    assert 'name="delete_files" value="1"' in owner.get(page_url(uploaded)).content.decode()
    response = delete_on_page(owner, uploaded)
    assert response.status_code == 302 and response["Location"] == "/p/alpha/models/"
    assert (f"Unregistered the base model {isolated('uploaded')} and deleted its folder {folder}; the name is free "
            "for a new upload." in owner.get("/p/alpha/models/").content.decode())
    assert not folder.exists() and folder.parent.is_dir()  # the project's own folder stays
    assert not BaseModel.objects.exists() and not ServingCopy.objects.exists() and not copy.exists()
    again = owner.post("/p/alpha/models/upload/",
                       {"name": "uploaded", "archive": SimpleUploadedFile("tiny.zip", archive.read_bytes())})
    assert again.status_code == 302, again.content.decode()
    assert BaseModel.objects.get(name="uploaded").path == str(folder) and (folder / "config.json").is_file()


def test_left_unticked_the_folder_stays(team, uploaded, client_for):
    owner = client_for(team.owner)
    response = delete_on_page(owner, uploaded, delete_files=False)
    assert response.status_code == 302 and not BaseModel.objects.exists()
    assert (Path(uploaded.path) / "config.json").is_file()
    assert "is left as it was." in owner.get("/p/alpha/models/").content.decode()


def test_the_api_deletes_an_uploaded_models_folder_and_the_name_is_free_again(
        team, uploaded, archive):
    folder = Path(uploaded.path)
    _token, secret = token_create(user=team.owner, name="script")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.get(f"/api/v1/projects/alpha/base-models/{uploaded.public_id}/").json()["uploaded"] is True
    assert api_delete(team.owner, uploaded, "?delete_files=yes") == (
        400, {"errors": {"delete_files": ['"yes" is not true or false; send delete_files=true or leave it out']}})
    assert api_delete(team.owner, uploaded, "?delete_file=true")[0] == 400
    assert BaseModel.objects.exists() and folder.is_dir()
    assert api_delete(team.owner, uploaded) == (204, None)
    assert not folder.exists() and not BaseModel.objects.exists()
    again = api.post("/api/v1/projects/alpha/base-models/",
                     {"name": "uploaded", "archive": SimpleUploadedFile("tiny.zip", archive.read_bytes())})
    assert again.status_code == 201, again.content.decode()
    assert again.json()["uploaded"] is True and (folder / "config.json").is_file()


def test_a_link_planted_in_the_folder_is_removed_not_followed(team, uploaded, tmp_path):
    folder = Path(uploaded.path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "inside").mkdir(parents=True)
    (elsewhere / "inside" / "precious.bin").write_bytes(b"keep me")
    (elsewhere / "file.txt").write_text("keep me too")
    (folder / "linked-folder").symlink_to(elsewhere / "inside", target_is_directory=True)
    (folder / "nested").mkdir()
    (folder / "nested" / "linked-file").symlink_to(elsewhere / "file.txt")
    assert api_delete(team.owner, uploaded) == (204, None)
    assert not folder.exists()
    assert (elsewhere / "inside" / "precious.bin").read_bytes() == b"keep me"
    assert (elsewhere / "file.txt").read_text() == "keep me too"


def test_a_registered_directory_is_never_deleted(team, models_root, client_for):
    """Even one in the project's own folder, where an upload would have put it: Temper did not unpack it."""
    directory = write_model_dir(models_root / "projects" / "alpha" / "mine")
    model = services.basemodel_register(project=team.project, name="mine", path=str(directory), user=team.owner)
    assert not model.uploaded
    owner = client_for(team.owner)
    assert 'name="delete_files"' not in owner.get(page_url(model)).content.decode()
    response = delete_on_page(owner, model)
    assert response["Location"] == page_url(model)
    assert (f"Nothing was deleted: {directory} was registered where it lay, not uploaded: Temper deletes only the "
            "folders it unpacked itself; unregister the model without its files."
            in owner.get(page_url(model)).content.decode())
    assert api_delete(team.owner, model) == (400, {"errors": {"delete_files": [
        f"{directory} was registered where it lay, not uploaded: Temper deletes only the folders it unpacked itself; "
        "unregister the model without its files"]}})
    assert BaseModel.objects.filter(pk=model.pk).exists() and (directory / "config.json").is_file()


def test_work_that_reads_it_refuses_it_and_nothing_is_deleted(team, uploaded, client_for):
    spec = {"task": "sft", "model": uploaded.public_id}
    run = Run.objects.create(project=team.project, name="busy", task="sft", spec=spec, resolved_spec=spec,
                             base_model=uploaded, status=RunStatus.QUEUED, created_by=team.owner)
    owner = client_for(team.owner)
    delete_on_page(owner, uploaded)
    assert (f"Nothing was deleted: run {isolated('busy')} ({run.public_id}) is queued from it; cancel it or wait for "
            "it to finish." in owner.get(page_url(uploaded)).content.decode())
    assert api_delete(team.owner, uploaded)[0] == 400
    assert BaseModel.objects.filter(pk=uploaded.pk).exists() and (Path(uploaded.path) / "config.json").is_file()
    assert base_model_copy_dir(uploaded).is_dir()


def test_deleting_the_files_is_an_owners_act(team, uploaded, client_for):
    """The member who registered it may unregister it (an owner since demoted, here), not delete its files; a
    viewer neither; an outsider is told nothing is there."""
    BaseModel.objects.filter(pk=uploaded.pk).update(registered_by=team.teammate)
    teammate = client_for(team.teammate)
    page = teammate.get(page_url(uploaded)).content.decode()
    assert 'id="delete-confirm"' in page and 'name="delete_files"' not in page
    assert "an owner may delete it with the registration" in page
    assert delete_on_page(teammate, uploaded).status_code == 403
    assert api_delete(team.teammate, uploaded) == (403, {"detail": (
        "only an owner may delete an uploaded model's files (they are under the models root); unregister it without "
        "them, or ask an owner")})
    assert client_for(team.viewer).post(page_url(uploaded, "delete/"), {"delete_files": "1"}).status_code == 403
    assert api_delete(team.viewer, uploaded)[0] == 403
    assert client_for(team.outsider).post(page_url(uploaded, "delete/"), {"delete_files": "1"}).status_code == 404
    assert client_for(team.outsider).get(page_url(uploaded)).status_code == 404
    assert api_delete(team.outsider, uploaded)[0] == 404
    assert BaseModel.objects.filter(pk=uploaded.pk).exists() and (Path(uploaded.path) / "config.json").is_file()


def refused_keeping(model: BaseModel) -> str:
    with pytest.raises(ValidationError) as refused:
        services.basemodel_unregister(base_model=model, delete_files=True)
    assert BaseModel.objects.filter(pk=model.pk).exists()
    [message] = refused.value.message_dict["delete_files"]
    return message


def test_a_project_folder_replaced_by_a_link_is_not_followed(team, uploaded, models_root, tmp_path):
    own = models_root / "projects" / "alpha"
    moved = tmp_path / "moved-alpha"
    own.rename(moved)
    own.symlink_to(moved, target_is_directory=True)
    assert refused_keeping(uploaded) == (
        f"{uploaded.path}: {own}: a link or not a folder now, so Temper keeps its files; unregister the model without "
        "them and ask an administrator to look at it")
    assert (moved / "uploaded" / "config.json").is_file()


def test_a_model_folder_replaced_by_a_link_is_not_followed(team, uploaded, tmp_path):
    folder = Path(uploaded.path)
    moved = tmp_path / "moved-model"
    folder.rename(moved)
    folder.symlink_to(moved, target_is_directory=True)
    assert refused_keeping(uploaded).startswith(
        f"{folder} is a link now, not the folder the upload made, so Temper keeps it;")
    assert (moved / "config.json").is_file() and folder.is_symlink()


def test_a_folder_no_longer_in_the_projects_own_folder_is_kept(team, uploaded, models_root, tmp_path):
    """A row whose path was changed since (by an administrator), out of the project's folder."""
    elsewhere = write_model_dir(models_root / "shared" / "other")
    BaseModel.objects.filter(pk=uploaded.pk).update(path=str(elsewhere))
    uploaded.refresh_from_db()
    assert refused_keeping(uploaded).startswith(
        f"{elsewhere} is not a folder directly in this project's own folder {models_root / 'projects' / 'alpha'}")
    assert (elsewhere / "config.json").is_file()


@contextmanager
def link_swapped_in_once_checked(folder: Path, moved: Path):
    """Whoever may write there swaps ``folder`` (the model's, or the project's on the way to it) for a link to it
    moved elsewhere between the check and the removal: as the row is deleted, inside the unregistering's transaction
    (``post_delete``)."""
    def swap(sender, instance, **kwargs):
        folder.rename(moved)
        folder.symlink_to(moved, target_is_directory=True)

    post_delete.connect(swap, sender=BaseModel, dispatch_uid="swap-in-a-link")
    try:
        yield
    finally:
        post_delete.disconnect(sender=BaseModel, dispatch_uid="swap-in-a-link")


def test_a_link_swapped_in_after_the_check_is_not_followed_and_the_page_says_the_files_stayed(
        team, uploaded, tmp_path, client_for):
    folder, moved = Path(uploaded.path), tmp_path / "moved-model"
    owner = client_for(team.owner)
    with link_swapped_in_once_checked(folder, moved):
        response = delete_on_page(owner, uploaded)
    assert response.status_code == 302 and not BaseModel.objects.exists()
    assert (f"Unregistered the base model {isolated('uploaded')}, but its folder {folder} could not be deleted ("
            f"{folder}: a link now, not the folder the upload made); ask an administrator to remove it."
            in owner.get("/p/alpha/models/").content.decode())
    assert (moved / "config.json").is_file() and folder.is_symlink()


def test_the_api_says_when_the_folder_could_not_be_deleted(team, uploaded, tmp_path):
    folder, moved = Path(uploaded.path), tmp_path / "moved-model"
    with link_swapped_in_once_checked(folder, moved):
        assert api_delete(team.owner, uploaded) == (500, {"detail": (
            f"unregistered the base model, but its folder {folder} could not be deleted ({folder}: a link now, not "
            "the folder the upload made); ask an administrator to remove it")})
    assert (moved / "config.json").is_file() and not BaseModel.objects.exists()


def test_a_project_folder_swapped_for_a_link_after_the_check_is_not_followed(team, uploaded, models_root, tmp_path):
    """``shutil.rmtree(path)`` would follow the link on the way and delete the model where it was moved to."""
    own, moved = models_root / "projects" / "alpha", tmp_path / "moved-alpha"
    with link_swapped_in_once_checked(own, moved):
        assert api_delete(team.owner, uploaded) == (500, {"detail": (
            f"unregistered the base model, but its folder {uploaded.path} could not be deleted ({own}: a link or not "
            "a folder now); ask an administrator to remove it")})
    assert (moved / "uploaded" / "config.json").is_file() and not BaseModel.objects.exists()


def test_a_folder_removed_by_hand_already_is_no_refusal(team, uploaded):
    shutil.rmtree(uploaded.path)
    removal = services.basemodel_unregister(base_model=uploaded, delete_files=True)
    assert removal.removed and not BaseModel.objects.exists()


def unregistered_under_a_stopped_run(catalog: Catalog, status: str, *, delete_files: bool) -> Run:
    """A run from ``catalog``'s model, stopped (``status``) after the model was unregistered (with its folder when
    ``delete_files``): unregistering is refused while such a run may go on, so it succeeded then and was stopped
    since (trained further, then cancelled or failed), or the model went before that refusal was made."""
    run = run_services.run_create(project=catalog.base_model.project, user=catalog.base_model.registered_by,
                                  name="from-upload", spec=sft_spec(catalog, data={"train": catalog.sft.public_id,
                                                                                   "max_seq_len": 128}))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    services.basemodel_unregister(base_model=catalog.base_model, delete_files=delete_files)
    Run.objects.filter(pk=run.pk).update(status=status)
    run.refresh_from_db()
    return run


@pytest.mark.parametrize("delete_files", [True, False])
def test_a_run_stopped_short_that_may_go_on_keeps_its_model_registered(team, uploaded, client_for, sent_tasks,  # noqa: F811
                                                                        delete_files):
    """QA: a model was unregistered (its folder deleted with it) under a cancelled run, whose Resume was then
    refused, or, pressed as the model went, queued to fail in the train worker on the missing folder. Runs stopped
    short that may still be resumed or retried from it now refuse it, named (three, then counted), archived ones
    too (an archived run may still be resumed); a succeeded run and one whose
    Resume and Retry are both refused already (its data deleted since) do not. Deleted, they free it."""
    from webapp.datasets import services as dataset_services

    chats = make_ready_version(team.project, name="chats", kind="sft")
    catalog = Catalog(base_model=uploaded, sft=chats, preference=None, prompts=None)

    def run(name: str, status: str, **fields) -> Run:
        made = run_services.run_create(project=team.project, user=team.owner, name=name,
                                       spec=sft_spec(catalog, data={"train": chats.public_id, "max_seq_len": 128}))
        Run.objects.filter(pk=made.pk).update(status=status, **fields)
        return made

    stopped = [run("first", RunStatus.FAILED), run("second", RunStatus.CANCELLED),
               run("third", RunStatus.CANCELLED, archived=True), run("fourth", RunStatus.FAILED)]
    run("done", RunStatus.SUCCEEDED)
    gone_data = make_ready_version(team.project, name="gone", kind="sft")
    stranded = run_services.run_create(project=team.project, user=team.owner, name="stranded",
                                       spec=sft_spec(catalog, data={"train": gone_data.public_id, "max_seq_len": 128}))
    Run.objects.filter(pk=stranded.pk).update(status=RunStatus.FAILED)
    dataset_services.dataset_version_delete(version=gone_data)
    words = (f"runs {isolated('first')} ({stopped[0].public_id}), {isolated('second')} ({stopped[1].public_id}), "
             f"{isolated('third')} ({stopped[2].public_id}) and 1 more stopped short (cancelled or failed) and may "
             "still be resumed or retried from it; delete them first (archived, a run may still be resumed), or keep "
             "the model")
    owner = client_for(team.owner)
    assert delete_on_page(owner, uploaded, delete_files=delete_files)["Location"] == page_url(uploaded)
    assert f"Nothing was deleted: {words}." in owner.get(page_url(uploaded)).content.decode()
    query = "?delete_files=true" if delete_files else ""
    assert api_delete(team.owner, uploaded, query) == (400, {"errors": {"delete": [words]}})
    assert BaseModel.objects.filter(pk=uploaded.pk).exists() and (Path(uploaded.path) / "config.json").is_file()
    for gone in stopped[:3]:
        run_services.run_delete(run=gone)
    assert api_delete(team.owner, uploaded, query)[1]["errors"]["delete"] == [
        f"run {isolated('fourth')} ({stopped[3].public_id}) stopped short (cancelled or failed) and may still be "
        "resumed or retried from it; delete it first (archived, a run may still be resumed), or keep the model"]
    run_services.run_delete(run=stopped[3])
    assert api_delete(team.owner, uploaded, query) == (204, None)
    assert Path(uploaded.path).is_dir() is not delete_files


@pytest.mark.parametrize("uploaded_again", [False, True])
def test_a_run_from_a_model_whose_folder_was_deleted_is_not_resumed(team, uploaded, archive, sent_tasks,  # noqa: F811
                                                                     uploaded_again):
    """A resume reads the unregistered base model's directory: gone, or another upload's under the same name since,
    it would fail on the worker, or train on other weights without a word."""
    catalog = Catalog(base_model=uploaded, sft=make_ready_version(team.project, name="chats", kind="sft"),
                      preference=None, prompts=None)
    run = unregistered_under_a_stopped_run(catalog, RunStatus.FAILED, delete_files=True)
    if uploaded_again:
        basemodel_upload(project=team.project, name="uploaded", archive=archive, archive_name=archive.name,
                         user=team.owner)
    run.refresh_from_db()
    with pytest.raises(ValidationError) as caught:
        run_services.run_resume(run=run, user=team.owner)
    assert caught.value.messages == [f"what run {run.public_id} trains on was deleted since (its starting model "
                                     f"{uploaded.public_id}): duplicate it to choose another"]


def test_a_run_from_a_model_unregistered_without_its_files_is_resumed(team, uploaded, sent_tasks):  # noqa: F811
    catalog = Catalog(base_model=uploaded, sft=make_ready_version(team.project, name="chats", kind="sft"),
                      preference=None, prompts=None)
    run = unregistered_under_a_stopped_run(catalog, RunStatus.FAILED, delete_files=False)
    assert run_services.run_resume(run=run, user=team.owner).status == RunStatus.QUEUED


@pytest.mark.parametrize("delete_files", [True, False])
def test_the_run_page_greys_what_a_deleted_model_refuses_saying_why(team, uploaded, sent_tasks,  # noqa: F811
                                                                     client_for, delete_files):
    """Resume and Retry of a run whose model was unregistered were offered, and refused once pressed: both when its
    folder went with it, Retry alone when it stayed (a resume reads the folder the run trained from; a retry launches
    the spec's bm_ id, which is gone). Greyed now, with the words a press is refused in; what is allowed stays."""
    import html

    catalog = Catalog(base_model=uploaded, sft=make_ready_version(team.project, name="chats", kind="sft"),
                      preference=None, prompts=None)
    run = unregistered_under_a_stopped_run(catalog, RunStatus.CANCELLED, delete_files=delete_files)
    page = client_for(team.teammate).get(f"/p/alpha/runs/{run.public_id}/").content.decode()
    words = (f"what run {run.public_id} trains on was deleted since (its starting model {uploaded.public_id}): "
             "duplicate it to choose another")
    assert 'id="retry-refused">' in page and f'action="/p/alpha/runs/{run.public_id}/retry/"' not in page
    if delete_files:
        assert f'<p class="card run-message" id="resume-refusal">Resume and Retry: {html.escape(words)}</p>' in page
        assert 'id="resume-refused">' in page and f'action="/p/alpha/runs/{run.public_id}/resume/"' not in page
        assert 'id="retry-refusal"' not in page  # one reason, said once, described for both buttons
        assert page.count('aria-describedby="resume-refusal"') == 2
    else:
        assert f'<p class="card run-message" id="retry-refusal">Retry: {html.escape(words)}</p>' in page
        assert 'id="resume-refus' not in page and f'action="/p/alpha/runs/{run.public_id}/resume/"' in page
