"""A project owner without shell access to the server uploads a model archive on the Base models page: it is
unpacked into the project's own folder and registered; a refused archive is told on the form, nothing kept. Unregistering
it, the owner may tick *Also delete its files*."""
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.test_accessibility import described_by
from tests.browser.test_projects import log_in
from tests.webapp.basemodels.test_uploads import tar_of
from tests.webapp.factories import make_team, write_model_dir
from webapp.basemodels.models import BaseModel
from webapp.core.bidi import FSI, PDI

pytestmark = pytest.mark.browser


def test_an_owner_uploads_a_model_archive_through_the_page(page, live_server, settings, tmp_path):
    settings.MODELS_ROOT = tmp_path / "models"
    team = make_team(slug="upload-page")
    archive = tar_of(tmp_path / "tiny.tar.gz", write_model_dir(tmp_path / "source" / "tiny"), prefix="tiny/")
    not_a_model = tmp_path / "weights.zip"
    not_a_model.write_bytes(b"<script>window.pwned = true</script>")
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/upload-page/models/")

    settings.TEMPER_MODEL_UPLOAD_MAX_BYTES = 100  # the page says so before it sends anything
    page.get_by_role("link", name="Upload a model").click()
    page.fill("#id_name", "uploaded")
    page.set_input_files("#id_archive", str(archive))
    page.get_by_role("button", name="Upload and register").click()
    field = page.get_by_label("Archive")
    expect(field).to_be_focused()  # and the message read with it (datasets.js, as on a dataset's upload page)
    assert (f"tiny.tar.gz is {archive.stat().st_size} bytes, over the upload limit of 100 bytes; ask an administrator "
            "to copy the model under the models root.") in described_by(field)
    settings.TEMPER_MODEL_UPLOAD_MAX_BYTES = 10**9
    page.reload()
    page.fill("#id_name", "uploaded")
    page.set_input_files("#id_archive", str(not_a_model))
    page.get_by_role("button", name="Upload and register").click()
    field = page.get_by_label("Archive")
    expect(field).to_have_attribute("aria-invalid", "true")
    assert ("weights.zip: not a readable zip archive (File is not a zip file); pack it again"
            in described_by(field))
    assert page.evaluate("window.pwned") is None
    assert not BaseModel.objects.filter(project=team.project).exists()
    assert list((settings.MODELS_ROOT / "projects" / "upload-page").iterdir()) == []

    page.set_input_files("#id_archive", str(archive))
    page.get_by_role("button", name="Upload and register").click()
    page.wait_for_url(f"{live_server.url}/p/upload-page/models/bm_*/")
    model = BaseModel.objects.get(project=team.project)
    folder = (settings.MODELS_ROOT / "projects" / "upload-page" / "uploaded").resolve()
    assert model.path == str(folder) and (folder / "config.json").is_file()
    assert (f"Unpacked {FSI}tiny.tar.gz{PDI} into {folder} and registered it as {FSI}uploaded{PDI}."
            in page.locator("body").inner_text())
    assert page.get_by_role("heading", name="uploaded").count() == 1


def test_an_owner_deletes_an_uploaded_models_files_with_its_registration(page, live_server, settings, tmp_path):
    """The confirmation's *Also delete its files* box: ticked, the folder goes with the registration and the name
    is free for a new upload; left unticked (the default), the folder stays."""
    from webapp.basemodels.uploads import basemodel_upload

    settings.MODELS_ROOT = tmp_path / "models"
    team = make_team(slug="upload-delete")
    archive = tar_of(tmp_path / "tiny.tar.gz", write_model_dir(tmp_path / "source" / "tiny"))
    kept, deleted = (basemodel_upload(project=team.project, name=name, archive=archive, archive_name=archive.name,
                                      user=team.owner) for name in ("kept", "deleted"))
    log_in(page, live_server.url, team.owner.username)

    page.goto(f"{live_server.url}/p/upload-delete/models/{kept.public_id}/")
    page.get_by_text("Unregister…").click()
    expect(page.get_by_label("Also delete its files")).not_to_be_checked()
    page.get_by_role("button", name="Unregister kept").click()
    page.wait_for_url(f"{live_server.url}/p/upload-delete/models/")
    assert (Path(kept.path) / "config.json").is_file()

    page.goto(f"{live_server.url}/p/upload-delete/models/{deleted.public_id}/")
    page.get_by_text("Unregister…").click()
    page.get_by_label("Also delete its files").check()
    page.get_by_role("button", name="Unregister deleted").click()
    page.wait_for_url(f"{live_server.url}/p/upload-delete/models/")
    assert (f"Unregistered the base model {FSI}deleted{PDI} and deleted its folder {deleted.path}; the name is free "
            "for a new upload." in page.locator("body").inner_text())
    assert not Path(deleted.path).exists() and not BaseModel.objects.filter(project=team.project).exists()
