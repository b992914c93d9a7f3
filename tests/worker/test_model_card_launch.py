"""A run launched in the web app, trained and exported for real: its export's model card names what only the web app
knows (project, run, author, the dataset versions with their rows), an exported checkpoint's card too; the run page
links each card, which shows the names as text, and the tar download holds the card."""
import io
import re
import tarfile
from pathlib import Path

import pytest
import yaml
from django.test import Client

from jaxengine.model_card import CARD_FILE, inline_text
from tests import factories
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.runs import services
from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus
from worker.tasks import train

HOSTILE = "chats --- # <script>alert('x')</script>"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-model-card"))


def _front_matter(card: str) -> dict:
    return yaml.safe_load(re.fullmatch(r"---\n(.*?)\n---\n.*", card, flags=re.DOTALL).group(1))


def _tar_names(response) -> list[str]:
    body = b"".join(response)
    with tarfile.open(fileobj=io.BytesIO(body)) as archive:
        return archive.getnames()


def test_a_web_runs_exports_carry_cards_with_its_provenance_linked_from_its_page(
        transactional_db, settings, redis_url, model_dir, monkeypatch):
    settings.REDIS_URL = redis_url  # the run's reporter publishes to a real Redis
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team()
    base = make_base_model(team.project, path=str(model_dir))
    rows = [{"prompt": f"{n} + {n}?", "completion": f" {2 * n}"} for n in range(6)]
    version = make_ready_version(team.project, name=HOSTILE, rows=rows)
    spec = {"task": "sft", "model": base.public_id, "data": {"train": version.public_id, "max_seq_len": 64},
            "peft": {"method": "lora", "rank": 4, "alpha": 8},
            "train": {"max_steps": 2, "batch_size": 2, "save_every": 1}}
    run = services.run_create(project=team.project, spec=spec, user=team.owner, name="card <b>run</b>")

    train.train_run(run.pk, run.attempt)

    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    card = (run.output_dir / "export" / CARD_FILE).read_text()
    assert _front_matter(card)["model_name"] == "card <b>run</b>"
    assert f"- train: {inline_text(HOSTILE)}, version 1 (`{version.public_id}`), 6 rows" in card
    assert f"- project: {inline_text(team.project.name)}" in card and f"(`{run.public_id}`)" in card
    assert f"- launched by: {inline_text(team.owner.get_username())}" in card and "- exported step: 2" in card
    # The tiny model's config.json names no hub id: the card names the base model as the project registered it.
    assert f"post-trained from the base model {inline_text(base.name)} (`{base.public_id}`)" in card
    assert (run.output_dir / "export" / "adapter" / CARD_FILE).is_file()

    services.checkpoint_export_request(run=run, step=1, user=team.owner)
    train.export_checkpoint(run.pk, 1)
    checkpoint = Artifact.objects.get(run=run, kind=ArtifactKind.CHECKPOINT, step=1)
    checkpoint_card = (Path(checkpoint.path) / CARD_FILE).read_text()
    assert "- exported step: 1" in checkpoint_card and f"- train: {inline_text(HOSTILE)}, version 1" in checkpoint_card

    client = Client()
    client.force_login(team.owner)
    base_url = f"/p/{team.project.slug}/runs/{run.public_id}"
    page = client.get(f"{base_url}/").content.decode()
    for link in (f"{base_url}/artifacts/model/card/", f"{base_url}/artifacts/adapter/card/",
                 f"{base_url}/artifacts/checkpoint/card/?step=1"):
        assert f'href="{link}"' in page.replace("&amp;", "&"), link
    assert f'href="{base_url}/artifacts/checkpoint/card/?step=1"' in client.get(f"{base_url}/checkpoints/").content.decode()
    shown = client.get(f"{base_url}/artifacts/checkpoint/card/?step=1")
    text = shown.content.decode()
    assert shown.status_code == 200 and "<script>alert" not in text and "&lt;script&gt;alert" in text
    assert "<h2>Training</h2>" in text and "<b>run</b>" not in text
    assert f"export-step-1/{CARD_FILE}" in _tar_names(client.get(f"{base_url}/artifacts/checkpoint/?step=1"))
    assert f"export/{CARD_FILE}" in _tar_names(client.get(f"{base_url}/artifacts/model/"))
    assert _tar_names(client.get(f"{base_url}/artifacts/adapter/"))[0] == f"adapter/{CARD_FILE}"

    outsider = Client()
    outsider.force_login(team.outsider)
    assert outsider.get(f"{base_url}/artifacts/model/card/").status_code == 404
