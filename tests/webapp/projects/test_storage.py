"""The Storage page and GET /api/v1/projects/<slug>/storage/: what a project's files take on disk, checked against
``du`` on real folders written in a throwaway data directory."""
from __future__ import annotations

import html
import os
import re

import pytest
from django.utils import timezone

from tests.webapp.factories import du_bytes, make_base_model, make_ready_version, write_bytes
from webapp.api.services import token_create
from webapp.projects.storage import run_parts
from webapp.runs.models import Run, RunStatus
from webapp.runs.serving_copies import base_model_copy_dir
from webapp.runs.services import run_output_dir


@pytest.fixture
def data_root(settings, tmp_path):
    root = settings.DATA_ROOT = (tmp_path / "data").resolve()
    settings.MODELS_ROOT = root / "models"
    settings.MODELS_ROOT.mkdir(parents=True)
    return root


def make_run(team, *, name: str, status: str = RunStatus.SUCCEEDED, started: bool = True) -> Run:
    run = Run(project=team.project, name=name, task="sft", spec={}, status=status,
              started_at=timezone.now() if started else None)
    run.resolved_spec = {"output_dir": str(run_output_dir(run.public_id))}
    run.save()
    return run


@pytest.fixture
def stored(team, data_root, tmp_path):
    """A project whose runs, datasets and base models have files on disk, and the folders each should count."""
    big = make_run(team, name="big")
    folder = run_output_dir(big.public_id)
    weights = write_bytes(folder / "checkpoints" / "10" / "state" / "weights", 300_000)
    write_bytes(folder / "checkpoints" / "20" / "state" / "weights", 300_000)
    write_bytes(folder / "export" / "model.safetensors", 200_000)
    write_bytes(folder / "export" / "quantized" / "model.safetensors", 60_000)  # the serving copy
    write_bytes(folder / "export-step-10" / "model.safetensors", 200_000)
    write_bytes(folder / "log.jsonl", 5_000)
    hostile = make_run(team, name="<script>alert(1)</script>", status=RunStatus.FAILED)
    write_bytes(run_output_dir(hostile.public_id) / "log.jsonl", 40_000)
    os.link(weights, run_output_dir(hostile.public_id) / "linked-weights")  # counted once, with big's
    gone = make_run(team, name="deleted from disk")
    queued = make_run(team, name="waiting", status=RunStatus.QUEUED, started=False)
    version = make_ready_version(team.project, name="chats")
    make_ready_version(team.project, name="chats")
    inside = data_root / "models" / "alpha" / "tiny"
    write_bytes(inside / "model.safetensors", 120_000)
    model = make_base_model(team.project, name="tiny", path=str(inside))
    write_bytes(base_model_copy_dir(model) / "model.safetensors", 30_000)
    outside = (tmp_path / "shared-mount" / "huge").resolve()
    write_bytes(outside / "model.safetensors", 900_000)
    far = make_base_model(team.project, name="far", path=str(outside))
    return {"big": big, "hostile": hostile, "gone": gone, "queued": queued, "dataset": version.dataset,
            "model": model, "far": far, "outside": outside, "inside": inside}


def api_get(client, user, path: str):
    secret = token_create(user=user, name="storage")[1]
    return client.get(path, HTTP_AUTHORIZATION=f"Bearer {secret}")


def test_the_api_gives_what_du_counts_for_each_folder(stored, team, client, data_root):
    big, hostile = run_output_dir(stored["big"].public_id), run_output_dir(stored["hostile"].public_id)
    response = api_get(client, team.viewer, "/api/v1/projects/alpha/storage/")
    assert response.status_code == 200
    body = response.json()
    runs = {row["name"]: row for row in body["runs"]}
    assert [row["name"] for row in body["runs"]][:2] == ["big", "<script>alert(1)</script>"]  # largest first
    assert runs["big"] | {"id": None} == {
        "id": None, "name": "big", "status": "succeeded", "archived": False, "checkpoints": 2,
        "checkpoint_bytes": du_bytes(big / "checkpoints"),
        "export_bytes": du_bytes(big / "export", big / "export-step-10"),
        "other_bytes": du_bytes(big) - du_bytes(big / "checkpoints", big / "export", big / "export-step-10"),
        "total_bytes": du_bytes(big), "folder_gone": False,
        # Pruning keeps the newest (20) and frees 10's folder (its export stays); the spec ranks nothing.
        "prunable_bytes": du_bytes(big / "checkpoints" / "10")}
    # The hard-linked weights were counted with big's checkpoint: the failed run's folder takes its log only.
    assert runs["<script>alert(1)</script>"]["total_bytes"] == du_bytes(big, hostile) - du_bytes(big)
    assert runs["deleted from disk"]["folder_gone"] and runs["deleted from disk"]["total_bytes"] == 0
    assert not runs["waiting"]["folder_gone"] and runs["waiting"]["total_bytes"] == 0
    datasets = data_root / "datasets" / stored["dataset"].public_id
    assert body["datasets"] == [{"id": stored["dataset"].public_id, "name": "chats", "versions": 2,
                                 "bytes": du_bytes(datasets), "folder_gone": False}]
    models = {row["name"]: row for row in body["base_models"]}
    assert models["tiny"]["bytes"] == du_bytes(stored["inside"]) and not models["tiny"]["outside_data_directory"]
    assert models["tiny"]["serving_copy_bytes"] == du_bytes(base_model_copy_dir(stored["model"]))
    assert models["far"]["outside_data_directory"] and models["far"]["bytes"] == du_bytes(stored["outside"])
    counted = (big, hostile, datasets, stored["inside"], base_model_copy_dir(stored["model"]))
    assert body["total_bytes"] == du_bytes(*counted)  # the model outside the data directory left out
    assert body["by_kind"]["outside_bytes"] == du_bytes(stored["outside"])
    assert body["by_kind"]["dataset_bytes"] == du_bytes(datasets)
    assert body["by_kind"]["run_bytes"] == du_bytes(big, hostile)


def test_the_page_shows_the_same_figures_human_sized_with_exact_bytes(stored, team, client_for, data_root):
    page = client_for(team.viewer).get("/p/alpha/storage/").content.decode()
    total = api_get(client_for(team.viewer), team.viewer, "/api/v1/projects/alpha/storage/").json()["total_bytes"]
    summary = page[page.index('id="storage-summary"'):page.index("</section>")]
    assert f'data-bytes="{total}" title="{total:,} bytes"' in summary
    big = run_output_dir(stored["big"].public_id)
    row = re.search(rf'<tr data-run="{stored["big"].public_id}">(.*?)</tr>', page, re.S).group(1)
    assert f'href="/p/alpha/runs/{stored["big"].public_id}/"' in row and ">big</a>" in row
    cells = re.findall(r'data-bytes="(\d+)"', row)
    assert list(map(int, cells)) == [du_bytes(big / "checkpoints"), du_bytes(big / "checkpoints" / "10"),
                                     du_bytes(big / "export", big / "export-step-10"), du_bytes(big)]
    assert re.search(r'<td class="num">2</td>', row)  # its checkpoints
    assert re.findall(r'<tr data-run="(run_\w+)"', page)[0] == stored["big"].public_id  # largest first
    gone = re.search(rf'<tr data-run="{stored["gone"].public_id}">(.*?)</tr>', page, re.S).group(1)
    assert ">gone</span>" in gone
    far = re.search(rf'<tr data-base-model="{stored["far"].public_id}">(.*?)</tr>', page, re.S).group(1)
    assert "outside Temper&#x27;s data directory" in far or "outside Temper's data directory" in far
    assert 'class="active" aria-current="page">Storage</a>' in page


def test_names_are_escaped(stored, team, client_for):
    page = client_for(team.viewer).get("/p/alpha/storage/").content.decode()
    assert "<script>alert(1)</script>" not in page
    assert html.escape("<script>alert(1)</script>", quote=False) in page


def test_it_requires_membership(stored, team, client_for, client):
    assert client_for(team.outsider).get("/p/alpha/storage/").status_code == 404
    assert api_get(client, team.outsider, "/api/v1/projects/alpha/storage/").status_code == 404
    assert client_for(team.viewer).get("/p/alpha/storage/").status_code == 200


def test_an_empty_project_takes_nothing(team, client_for, data_root):
    page = client_for(team.owner).get("/p/alpha/storage/")
    assert page.status_code == 200 and "No runs." in page.content.decode()


def test_a_run_directory_is_split_into_checkpoints_exports_and_the_rest():
    assert run_parts({"checkpoints": 7, "export": 5, "export-step-10": 3, ".export.replaced-ab12": 2,
                      ".export-step-10.replaced-x": 1, "log.jsonl": 11, "exports-notes.txt": 13,
                      "spec.yaml": 17}) == (7, 11, 41)


def test_an_uploaded_model_counts_wherever_the_models_root_is(team, client, data_root, tmp_path):
    """TEMPER_MODELS_ROOT outside the data directory: a model Temper unpacked there is still its disk to count."""
    folder = (tmp_path / "models-mount" / "alpha" / "mine").resolve()
    write_bytes(folder / "model.safetensors", 250_000)
    mine = make_base_model(team.project, name="mine", path=str(folder))
    type(mine).objects.filter(pk=mine.pk).update(uploaded=True)
    body = api_get(client, team.viewer, "/api/v1/projects/alpha/storage/").json()
    assert not body["base_models"][0]["outside_data_directory"] and body["base_models"][0]["bytes"] == du_bytes(folder)
    assert body["total_bytes"] == body["by_kind"]["base_model_bytes"] == du_bytes(folder)
