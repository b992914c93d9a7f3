"""Deleting a project: owners only, its slug typed to confirm; everything in it goes with the files of its
datasets, runs and base models' serving copies (never a base model's own directory); refused while work in
it is in flight."""
from pathlib import Path

from django.utils.html import escape

from tests.webapp.factories import form_token, make_base_model, make_ready_version
from webapp.core.bidi import isolated
from webapp.datasets.models import Dataset
from webapp.projects.models import Membership, Project
from webapp.review.models import Campaign, CampaignStatus
from webapp.runs import services as run_services
from webapp.runs.models import Run, RunStatus, ServingCopy, ServingCopyStatus
from webapp.runs.serving_copies import base_model_copy_dir

# The deletion lives in the danger zone of the settings page, and a refusal comes back there.
PAGE, ACTION = "/p/alpha/settings/", "/p/alpha/delete/"


def delete_from_page(client, capture, *, typed="alpha"):
    page = client.get(PAGE).content.decode()
    with capture(execute=True):
        return client.post(ACTION, {"submission_token": form_token(page, after=ACTION), "confirm_slug": typed})


def finished_run(team, spec, *, name):
    """A succeeded run of the teammate's (its directory where the train worker writes it)."""
    public_id = run_services.new_run_id()
    resolved = {**spec, "output_dir": str(run_services.run_output_dir(public_id))}
    return Run.objects.create(public_id=public_id, project=team.project, name=name, task="sft", spec=spec,
                              resolved_spec=resolved, status=RunStatus.SUCCEEDED, created_by=team.teammate)


def filled_project(team, tmp_path):
    """The team's project with a dataset file, a finished run's directory and a base model's serving copy;
    the base model's own directory is the user's, outside DATA_ROOT."""
    own_directory = tmp_path / "models" / "tiny"
    own_directory.mkdir(parents=True)
    (own_directory / "config.json").write_text("{}")
    base_model = make_base_model(team.project, path=str(own_directory))
    copy = base_model_copy_dir(base_model)
    copy.mkdir(parents=True)
    version = make_ready_version(team.project, user=team.teammate)
    spec = {"task": "sft", "model": base_model.public_id, "data": {"train": version.public_id}}
    run = finished_run(team, spec, name="done")
    run_directory = run_services.run_output_dir(run.public_id)
    run_directory.mkdir(parents=True)
    (run_directory / "state").write_bytes(b"weights")
    return {"dataset file": version.absolute_path, "run directory": run_directory, "serving copy": copy,
            "own directory": own_directory}


def test_an_owner_deletes_a_project_with_its_files_but_not_a_models_own_directory(
        team, client_for, tmp_path, django_capture_on_commit_callbacks):
    paths = filled_project(team, tmp_path)
    client = client_for(team.owner)
    response = delete_from_page(client, django_capture_on_commit_callbacks)
    assert response.status_code == 302 and response["Location"] == "/"
    assert (f"Deleted the project {isolated('Project alpha')} (alpha) with everything in it."
            in client.get("/").content.decode())
    assert not Project.objects.filter(slug="alpha").exists()
    assert not Run.objects.exists() and not Dataset.objects.filter(project__slug="alpha").exists()
    assert not Membership.objects.filter(user=team.teammate).exists()
    for what in ("dataset file", "run directory", "serving copy"):
        assert not paths[what].exists(), what
    assert (paths["own directory"] / "config.json").is_file()
    assert client.get(PAGE).status_code == 404
    assert Project.objects.filter(slug="alpha-elsewhere").exists()


def test_the_form_sent_again_lands_where_the_first_sending_did(team, client_for, django_capture_on_commit_callbacks):
    client = client_for(team.owner)
    fields = {"submission_token": form_token(client.get(PAGE).content.decode(), after=ACTION), "confirm_slug": "alpha"}
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(ACTION, fields)
        second = client.post(ACTION, fields)
    assert first["Location"] == second["Location"] == "/"


def test_the_slug_must_be_typed_to_confirm(team, client_for, tmp_path, django_capture_on_commit_callbacks):
    paths = filled_project(team, tmp_path)
    client = client_for(team.owner)
    for typed, says in (("", "type the project's slug, alpha, to confirm"),
                        ("Alpha", "'Alpha' is not the project's slug; type alpha to confirm")):
        response = delete_from_page(client, django_capture_on_commit_callbacks, typed=typed)
        assert response["Location"] == PAGE
        assert escape(f"Nothing was deleted: {says}.") in client.get(PAGE).content.decode()
    assert Project.objects.filter(slug="alpha").exists() and paths["run directory"].is_dir()


def test_only_an_owner_may_delete_a_project(team, client_for):
    for user in (team.teammate, team.viewer):
        client = client_for(user)
        assert 'id="delete-project"' not in client.get(PAGE).content.decode()
        assert client.post(ACTION, {"confirm_slug": "alpha"}).status_code == 403
    assert client_for(team.outsider).post(ACTION, {"confirm_slug": "alpha"}).status_code == 404
    assert 'id="delete-project"' in client_for(team.owner).get(PAGE).content.decode()
    assert 'id="delete-project"' not in client_for(team.owner).get("/p/alpha/").content.decode()
    assert Project.objects.filter(slug="alpha").exists()


def test_work_in_flight_refuses_the_deletion(team, client_for, tmp_path, django_capture_on_commit_callbacks):
    filled_project(team, tmp_path)
    run = Run.objects.get()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    Campaign.objects.create(project=team.project, name="pass 1", status=CampaignStatus.LOADING)
    ServingCopy.objects.create(project=team.project, base_model=team.project.base_models.get(),
                               status=ServingCopyStatus.WRITING)
    client = client_for(team.owner)
    response = delete_from_page(client, django_capture_on_commit_callbacks)
    assert response["Location"] == PAGE
    assert (f"Nothing was deleted: run \u2068done\u2069 ({run.public_id}) is running; cancel it and wait for it to stop; "
            "review campaign \u2068pass 1\u2069 is loading items; wait until it is ready; "
            "a serving copy is being written; wait until it is ready.") in client.get(PAGE).content.decode()
    assert Project.objects.filter(slug="alpha").exists() and Path(run_services.run_output_dir(run.public_id)).is_dir()


def test_a_project_whose_runs_automatic_serving_copy_is_being_written_is_not_deleted(
        team, client_for, tmp_path, django_capture_on_commit_callbacks):
    """A run that has just succeeded gets its serving copy from a serve worker, with no row to say so: the
    project deleted meanwhile, the worker wrote the copy into a run directory made again for it."""
    version = make_ready_version(team.project, user=team.teammate)
    spec = {"task": "sft", "model": make_base_model(team.project).public_id, "data": {"train": version.public_id}}
    run = finished_run(team, spec, name="just done")
    (run_services.run_output_dir(run.public_id) / "export").mkdir(parents=True)
    client = client_for(team.owner)
    assert delete_from_page(client, django_capture_on_commit_callbacks)["Location"] == PAGE
    assert (f"Nothing was deleted: the serving copy of run \u2068just done\u2069 ({run.public_id}) is being written; wait until "
            "it is ready.") in client.get(PAGE).content.decode()
    assert Project.objects.filter(pk=team.project.pk).exists()


def test_the_serve_workers_are_told_which_models_went_with_the_project(
        team, client_for, tmp_path, redis_server, settings, django_capture_on_commit_callbacks):
    """A serve worker kept a deleted project's models in memory until evicted: it is now told, once the deletion
    commits, which runs and base models went (``webapp.chat.channels.deleted_models``), and drops them."""
    from webapp.chat import channels
    from webapp.runs.channels import redis_client

    settings.REDIS_URL = redis_server.url
    client = redis_client()
    client.flushdb()
    filled_project(team, tmp_path)
    refs = {*Run.objects.values_list("public_id", flat=True),
            *team.project.base_models.values_list("public_id", flat=True)}
    assert len(refs) == 2
    assert delete_from_page(client_for(team.owner), django_capture_on_commit_callbacks).status_code == 302
    assert channels.deleted_models(client) == refs
