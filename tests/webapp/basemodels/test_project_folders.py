"""The models root split between projects: ``projects/<slug>/`` is that project's alone, everything else every
project's. Team A's private fine-tune copied under the root was listed on team B's register page and registered
(so loaded) by B."""
import shutil
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from tests.webapp.factories import PASSWORD, write_model_dir
from webapp.basemodels.inspection import ModelDirError, read_model_facts, resolve_model_dir
from webapp.basemodels.models import BaseModel
from webapp.basemodels.selectors import candidate_model_dirs
from webapp.basemodels.services import basemodel_register

URL = "/p/alpha/models/register/"


@pytest.fixture
def models_root(settings, tmp_path):
    """alpha's own folder, the other team's (alpha-elsewhere's), shared/ and a top-level model as installs had
    them, with links from shared/ and from alpha's folder into the other team's, and one of the other team's out
    of the root."""
    root = settings.MODELS_ROOT = tmp_path / "models"
    write_model_dir(root / "tiny")
    write_model_dir(root / "shared" / "base")
    write_model_dir(root / "projects" / "alpha" / "own-ft")
    write_model_dir(root / "projects" / "alpha-elsewhere" / "secret-ft")
    write_model_dir(tmp_path / "outside" / "model")
    (root / "projects" / "alpha-elsewhere" / "escape").symlink_to(tmp_path / "outside" / "model")
    (root / "shared" / "peek").symlink_to(root / "projects" / "alpha-elsewhere" / "secret-ft")
    (root / "projects" / "alpha" / "borrowed").symlink_to(root / "projects" / "alpha-elsewhere" / "secret-ft")
    (root / "elsewhere").symlink_to(root / "projects" / "alpha-elsewhere")
    return root


def path_refusal(project, path: str) -> str:
    with pytest.raises(ValidationError) as excinfo:
        basemodel_register(project=project, name="x", path=path, user=None)
    [message] = excinfo.value.message_dict["path"]
    return message


def test_each_project_is_offered_its_own_folder_and_the_shared_models_only(team, models_root):
    assert candidate_model_dirs(models_root=models_root, project_slug="alpha") == [
        "projects/alpha/own-ft", "tiny", "shared/base"]
    assert candidate_model_dirs(models_root=models_root, project_slug="alpha-elsewhere") == [
        "projects/alpha-elsewhere/secret-ft", "tiny", "elsewhere/secret-ft", "shared/base", "shared/peek"]
    assert candidate_model_dirs(models_root=models_root, project_slug="gamma") == ["tiny", "shared/base"]


def test_the_register_page_lists_no_other_projects_models(team, models_root, client_for):
    page = client_for(team.teammate).get(URL).content.decode()
    for listed in ("projects/alpha/own-ft", "tiny", "shared/base"):
        assert f"<code>{listed}</code>" in page
    for hidden in ("secret-ft", "peek", "borrowed", "escape", "alpha-elsewhere"):
        assert hidden not in page
    assert f"<code>{models_root.resolve() / 'projects' / 'alpha'}</code>" in page, "it says where its own models go"


@pytest.mark.parametrize("path", ["projects/alpha/own-ft", "shared/base", "tiny"])
def test_a_project_registers_its_own_and_the_shared_models(team, models_root, client_for, path):
    response = client_for(team.teammate).post(URL, {"name": "m", "path": path})
    assert response.status_code == 302
    assert BaseModel.objects.get(project=team.project).path == str((models_root / path).resolve())


@pytest.mark.parametrize("path", [
    "projects/alpha-elsewhere/secret-ft", "projects/alpha-elsewhere/secret-ft/config.json",
    "projects/alpha-elsewhere/escape", "projects/alpha-elsewhere", "shared/peek", "projects/alpha/borrowed",
    "elsewhere/secret-ft", "{root}/projects/alpha-elsewhere/secret-ft"])
def test_another_projects_folder_is_refused_as_if_it_were_missing(team, models_root, path):
    """What the refusal says is what it says once the directory is gone: the form tells nothing of another
    project's folder, not even that it exists (nor where its links point)."""
    path = path.format(root=models_root)
    refused = path_refusal(team.project, path)
    shown = path if path.startswith("/") else str(models_root.resolve() / path)
    assert refused == (f"{shown} does not exist; copy the model under {models_root.resolve() / 'shared'} (every "
                       f"project's) or {models_root.resolve() / 'projects' / 'alpha'} (this project's alone) first")
    shutil.rmtree(models_root / "projects" / "alpha-elsewhere")
    (models_root / "projects" / "alpha" / "borrowed").unlink()
    (models_root / "shared" / "peek").unlink()
    (models_root / "elsewhere").unlink()
    assert path_refusal(team.project, path) == refused
    assert not BaseModel.objects.exists()


def test_the_register_form_refuses_another_projects_model(team, models_root, client_for):
    response = client_for(team.owner).post(URL, {"name": "x", "path": "projects/alpha-elsewhere/secret-ft"})
    assert response.status_code == 400
    assert b"secret-ft does not exist; copy the model under" in response.content
    assert not BaseModel.objects.exists()
    other = client_for(team.outsider).post("/p/alpha-elsewhere/models/register/", {"name": "x",
                                                                                   "path": "projects/alpha/own-ft"})
    assert other.status_code == 400 and b"own-ft does not exist" in other.content
    assert client_for(team.outsider).post("/p/alpha-elsewhere/models/register/", {
        "name": "x", "path": "projects/alpha-elsewhere/secret-ft"}).status_code == 302


def test_a_file_linked_into_another_projects_folder_is_refused(team, models_root):
    """The directory is alpha's, but its config.json is the other team's: read, it would be shown on alpha's page."""
    model_dir = write_model_dir(models_root / "projects" / "alpha" / "mixed")
    (model_dir / "config.json").unlink()
    (model_dir / "config.json").symlink_to(models_root / "projects" / "alpha-elsewhere" / "secret-ft" / "config.json")
    resolved = resolve_model_dir("projects/alpha/mixed", models_root=models_root, project_slug="alpha")
    with pytest.raises(ModelDirError) as excinfo:
        read_model_facts(resolved, models_root=models_root, project_slug="alpha")
    assert str(excinfo.value) == (
        f"{resolved / 'config.json'} links out of the folders this project may read ({models_root.resolve() / 'shared'}, "
        f"{models_root.resolve() / 'projects' / 'alpha'}); copy the file into the model's directory")
    (model_dir / "config.json").unlink()
    (model_dir / "config.json").symlink_to(models_root / "shared" / "base" / "config.json")
    assert read_model_facts(resolved, models_root=models_root, project_slug="alpha").architecture == "LlamaForCausalLM"


def test_a_projects_slug_cannot_change_so_its_folder_and_models_stay_its_own(team, models_root, client_for):
    """A slug names the project's folder, where its registered models' stored paths point: changed in the admin
    site, the folder would keep the old name, and the next project given that slug would see its models."""
    model = basemodel_register(project=team.project, name="own", path="projects/alpha/own-ft", user=team.owner)
    admin = get_user_model().objects.create_superuser("root", password=PASSWORD)
    client = client_for(admin)
    page = client.get(f"/admin/projects/project/{team.project.pk}/change/").content.decode()
    assert 'name="slug"' not in page and "alpha" in page
    response = client.post(f"/admin/projects/project/{team.project.pk}/change/", {
        "name": "Renamed", "slug": "gamma", "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"})
    assert response.status_code == 302
    team.project.refresh_from_db()
    assert (team.project.name, team.project.slug) == ("Project alpha", "alpha")  # both read-only there
    assert resolve_model_dir("projects/alpha/own-ft", models_root=models_root,
                             project_slug=team.project.slug) == Path(model.path)
