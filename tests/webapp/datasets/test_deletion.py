"""Deleting dataset versions and datasets: who may, what still reading them refuses it, what runs and
campaigns keep, the files, numbers never given twice, and workers that meet a version deleted under them."""
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.webapp.factories import form_token, make_ready_version
from tests.webapp.runs.conftest import catalog, sent_tasks, sft_spec  # noqa: F401 (fixtures)
from webapp.core.bidi import isolated
from webapp.datasets import services
from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus
from webapp.review import services as review_services
from webapp.review.models import Campaign, CampaignStatus
from webapp.runs import services as run_services
from webapp.runs.models import Run, RunStatus

ROWS = b'{"prompt": "Hi", "completion": "Hello!"}\n{"prompt": "2+2?", "completion": "4"}\n'


def upload(team, *, user, name="chats", dataset=None):
    """A version uploaded by ``user`` (a new dataset ``name``, or the next version of ``dataset``), checked."""
    file = SimpleUploadedFile(f"{name}.jsonl", ROWS)
    if dataset is None:
        version = services.dataset_create_with_upload(project=team.project, name=name, kind="sft", upload=file,
                                                      file_format=None, column_mapping={}, user=user)
    else:
        version = services.dataset_version_create(dataset=dataset, upload=file, file_format=None, column_mapping={},
                                                  user=user)
    return services.dataset_version_validate(version_id=version.pk)


def version_url(version, suffix=""):
    return f"/p/alpha/datasets/{version.dataset.public_id}/v/{version.number}/{suffix}"


def post_form(client, page_url: str, action: str, capture):
    """Send the confirmation form ``action`` of the page at ``page_url`` as a person would (its one-time
    token included), running what the transaction leaves for its commit (the files' removal)."""
    page = client.get(page_url).content.decode()
    with capture(execute=True):
        return client.post(action, {"submission_token": form_token(page, after=action)})


def test_an_owner_deletes_a_version_and_its_file_and_the_runs_on_it_keep_their_history(
        team, client_for, catalog, sent_tasks, django_capture_on_commit_callbacks):  # noqa: F811
    run = run_services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="trained")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    version = catalog.sft
    path = version.absolute_path
    assert path.is_file()
    client = client_for(team.owner)
    response = post_form(client, version_url(version), version_url(version, "delete/"),
                         django_capture_on_commit_callbacks)
    assert response.status_code == 302 and response["Location"] == f"/p/alpha/datasets/{version.dataset.public_id}/"
    assert not DatasetVersion.objects.filter(pk=version.pk).exists()
    assert not path.exists()
    run.refresh_from_db()
    assert run.deleted_references() == [("train", version.public_id)]
    page = client.get(response["Location"]).content.decode()
    assert f"Deleted {isolated('chats v1')} and its file." in page
    assert "a new upload becomes version 2" in page  # its number is not given again


def test_version_numbers_are_not_given_again_after_the_newest_is_deleted(team, sent_tasks):  # noqa: F811
    first = upload(team, user=team.teammate)
    second = upload(team, user=team.teammate, dataset=first.dataset)
    assert second.number == 2
    services.dataset_version_delete(version=second)
    third = upload(team, user=team.teammate, dataset=first.dataset)
    assert third.number == 3
    assert services.next_version_number(dataset=first.dataset) == 4


def test_who_may_delete_a_version(team, client_for, sent_tasks, django_capture_on_commit_callbacks):  # noqa: F811
    """An owner any; a member only what they uploaded; a viewer nothing; an outsider gets 404."""
    mine = upload(team, user=team.teammate)
    owners = upload(team, user=team.owner, dataset=mine.dataset)
    teammate = client_for(team.teammate)
    assert "Delete v2" not in teammate.get(version_url(owners)).content.decode()
    assert teammate.post(version_url(owners, "delete/")).status_code == 403
    assert client_for(team.viewer).post(version_url(mine, "delete/")).status_code == 403
    assert "Delete v1" not in client_for(team.viewer).get(version_url(mine)).content.decode()
    assert client_for(team.outsider).post(version_url(mine, "delete/")).status_code == 404
    assert DatasetVersion.objects.count() == 2
    response = post_form(teammate, version_url(mine), version_url(mine, "delete/"), django_capture_on_commit_callbacks)
    assert response.status_code == 302
    assert list(DatasetVersion.objects.values_list("number", flat=True)) == [2]
    # the dataset is not all theirs now (v2 is the owner's): the teammate is not offered its deletion
    dataset_page = f"/p/alpha/datasets/{mine.dataset.public_id}/"
    assert "Delete this dataset" not in teammate.get(dataset_page).content.decode()
    assert teammate.post(dataset_page + "delete/").status_code == 403
    assert "Delete this dataset" in client_for(team.owner).get(dataset_page).content.decode()


def test_a_version_a_run_still_trains_on_is_not_deleted(team, client_for, catalog, sent_tasks,  # noqa: F811
                                                         django_capture_on_commit_callbacks):
    run = run_services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="busy")
    version = catalog.sft
    client = client_for(team.owner)
    response = post_form(client, version_url(version), version_url(version, "delete/"),
                         django_capture_on_commit_callbacks)
    assert response.status_code == 302 and response["Location"] == version_url(version)
    page = client.get(response["Location"]).content.decode()
    assert (f"Nothing was deleted: run \u2068busy\u2069 ({run.public_id}) is queued with it; cancel it or wait for it to "
            "finish.") in page
    assert DatasetVersion.objects.filter(pk=version.pk).exists() and version.absolute_path.is_file()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED)
    response = post_form(client, version_url(version), version_url(version, "delete/"),
                         django_capture_on_commit_callbacks)
    assert not DatasetVersion.objects.filter(pk=version.pk).exists()


def test_a_dataset_is_deleted_whole_unless_a_campaign_still_loads_from_it(
        team, client_for, django_capture_on_commit_callbacks, sent_tasks):  # noqa: F811 (no worker: it stays loading)
    prefs = make_ready_version(team.project, name="prefs", kind="preference",
                               rows=[{"prompt": "p", "chosen": "a", "rejected": "b"}])
    newer = make_ready_version(team.project, name="prefs", kind="preference",
                               rows=[{"prompt": "q", "chosen": "c", "rejected": "d"}])
    campaign = review_services.campaign_create(project=team.project, name="judge", guidelines="", required_reviews=1,
                                               reviewers=[team.owner], source_version=prefs, user=team.owner)
    assert campaign.status == CampaignStatus.LOADING
    client = client_for(team.owner)
    dataset_page = f"/p/alpha/datasets/{prefs.dataset.public_id}/"
    response = post_form(client, dataset_page, dataset_page + "delete/", django_capture_on_commit_callbacks)
    assert "review campaign \u2068judge\u2069 is loading its items from \u2068prefs v1\u2069; wait until it is ready" in client.get(
        response["Location"]).content.decode()
    assert Dataset.objects.filter(pk=prefs.dataset.pk).exists()

    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.READY)
    folder = prefs.absolute_path.parent
    response = post_form(client, dataset_page, dataset_page + "delete/", django_capture_on_commit_callbacks)
    assert response["Location"] == "/p/alpha/datasets/"
    assert f"Deleted the dataset {isolated('prefs')} with its 2 versions and their files." in client.get(
        response["Location"]).content.decode()
    assert not Dataset.objects.filter(name="prefs").exists() and not DatasetVersion.objects.filter(
        pk__in=[prefs.pk, newer.pk]).exists()
    assert not folder.exists()
    campaign.refresh_from_db()
    assert campaign.source_version is None and campaign.source_label == "prefs v1"  # the campaign still names it
    make_ready_version(team.project, name="prefs", kind="preference")  # the name is free again


def test_a_second_click_on_delete_lands_where_the_first_did(team, client_for, sent_tasks,  # noqa: F811
                                                            django_capture_on_commit_callbacks):
    version = upload(team, user=team.owner)
    client = client_for(team.owner)
    page = client.get(version_url(version)).content.decode()
    fields = {"submission_token": form_token(page, after=version_url(version, "delete/"))}
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(version_url(version, "delete/"), fields)
        second = client.post(version_url(version, "delete/"), fields)
    assert first.status_code == second.status_code == 302 and first["Location"] == second["Location"]


def test_a_worker_meeting_a_version_deleted_under_it_drops_its_result(team, sent_tasks, monkeypatch):  # noqa: F811
    """Validation and token counting read a version's file on a worker while a person may delete it: the
    worker's save then found no row, and the task failed with a DatabaseError."""
    from jaxengine.data import formats

    waiting = services.dataset_create_with_upload(project=team.project, name="racing", kind="sft",
                                                  upload=SimpleUploadedFile("racing.jsonl", ROWS), file_format=None,
                                                  column_mapping={}, user=team.owner)
    real_validate = formats.validate_file

    def deleted_while_read(path, **kwargs):
        report = real_validate(path, **kwargs)
        DatasetVersion.objects.filter(pk=waiting.pk).delete()  # a person deleting it meanwhile
        return report

    monkeypatch.setattr(formats, "validate_file", deleted_while_read)
    assert services.dataset_version_validate(version_id=waiting.pk) is None
    assert services.dataset_version_validate(version_id=waiting.pk) is None  # a redelivery after the deletion
    assert not DatasetVersion.objects.filter(status=VersionStatus.READY, pk=waiting.pk).exists()


def test_the_api_deletes_a_version_and_a_dataset(team, catalog, sent_tasks, django_capture_on_commit_callbacks):  # noqa: F811
    """DELETE through the REST API, with the pages' rules: 403 for a viewer's token, a 400 naming a run that
    still trains on it, 204 once nothing does; the version's address answers GET until then."""
    import json

    from django.test import Client

    from webapp.api.services import token_create

    def api(user):
        _token, secret = token_create(user=user, name="script")
        client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")

        def call(method, path):
            with django_capture_on_commit_callbacks(execute=True):
                response = getattr(client, method)(f"/api/v1/projects/alpha/{path}")
            return response.status_code, json.loads(response.content or b"null")
        return call

    version = catalog.sft
    path = f"datasets/{version.dataset.public_id}/versions/{version.number}/"
    owner = api(team.owner)
    status, body = owner("get", path)
    assert status == 200 and body["id"] == version.public_id and body["status"] == "ready"
    assert api(team.viewer)("delete", path)[0] == 403
    run = run_services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="busy")
    assert owner("delete", path) == (400, {"errors": {"delete": [
        f"run \u2068busy\u2069 ({run.public_id}) is queued with it; cancel it or wait for it to finish"]}})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    assert owner("delete", path) == (204, None)
    assert owner("get", path)[0] == 404 and not version.absolute_path.exists()
    pairs = catalog.preference.dataset
    assert owner("delete", f"datasets/{pairs.public_id}/") == (204, None)
    assert not Dataset.objects.filter(pk=pairs.pk).exists()


def test_a_dataset_whose_versions_were_deleted_or_failed_leaves_no_folder(team, sent_tasks, settings,  # noqa: F811
                                                                          django_capture_on_commit_callbacks):
    """The folder datasets/<ds id>/ was removed only as the parent of a file being deleted: a dataset whose
    last version was deleted before it (or whose uploads all failed, which keep no file) left it behind,
    and so did the project's deletion."""
    from webapp.projects.services import project_delete

    emptied = upload(team, user=team.owner, name="emptied")
    folder = emptied.absolute_path.parent
    with django_capture_on_commit_callbacks(execute=True):
        services.dataset_version_delete(version=emptied)
    assert folder.is_dir() and not any(folder.iterdir())
    with django_capture_on_commit_callbacks(execute=True):
        services.dataset_delete(dataset=emptied.dataset)
    assert not folder.exists()

    failed = services.dataset_create_with_upload(
        project=team.project, name="broken", kind="sft", upload=SimpleUploadedFile("broken.jsonl", b"not json\n"),
        file_format=None, column_mapping={}, user=team.owner)
    failed = services.dataset_version_validate(version_id=failed.pk)
    assert failed.status == VersionStatus.FAILED and not failed.absolute_path.exists()
    with django_capture_on_commit_callbacks(execute=True):
        project_delete(project=team.project, confirmation="alpha")
    assert not failed.absolute_path.parent.exists()
