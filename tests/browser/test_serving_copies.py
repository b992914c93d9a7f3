"""Serving copies asked for in a browser: the button on an exported checkpoint (run page) and on a base
model's page queues the copy, the card says it is being written, and shows the figures or the reason it
failed without a reload once the worker (here the test) records the outcome."""
from __future__ import annotations

import json

import pytest

from tests.browser.test_projects import log_in
from tests.webapp.factories import make_base_model, make_team
from webapp.runs import serving_copies
from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus, ServingCopy

pytestmark = pytest.mark.browser


def write_copy(directory, scheme):
    directory.mkdir(parents=True)
    (directory / "quantization.json").write_text(json.dumps({
        "scheme": scheme, "bits": 4, "group_size": 64, "model_bytes": 350 * 2**20, "bfloat16_bytes": 1000 * 2**20,
        "ratio_to_bfloat16": 0.35, "perplexity_reference": 4.0, "perplexity_quantized": 4.1,
        "perplexity_increase": 0.025, "eval_sequences": 12, "greedy_agreement": 0.96, "eval_prompts": 12}))


def test_a_checkpoints_copy_is_asked_for_and_shows_its_figures_without_a_reload(page, live_server, monkeypatch,
                                                                                 tmp_path):
    sent = []
    monkeypatch.setattr("webapp.celery.app.send_task", lambda name, args=None, **kwargs: sent.append((name, args)))
    team = make_team(slug="copies1")
    run = Run.objects.create(project=team.project, name="tuned", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner,
                             total_steps=6, current_step=6)
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    (tmp_path / "export-step-3").mkdir()
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=3, path=str(tmp_path / "export-step-3"))
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/copies1/runs/{run.public_id}/")
    checkpoint = page.locator("#checkpoints li[data-step='3']")
    checkpoint.get_by_label("Quantization").select_option("int4")
    checkpoint.get_by_role("button", name="Make serving copy").click()
    checkpoint.locator(".badge", has_text="int4 serving copy being written").wait_for()
    copy = ServingCopy.objects.get(run=run, step=3)
    assert sent == [(serving_copies.MAKE_COPY_TASK, [copy.pk])] and copy.scheme == "int4"
    assert checkpoint.get_by_role("button", name="Make serving copy").count() == 0
    page.evaluate("() => { window.notReloaded = true; }")

    write_copy(tmp_path / "export-step-3" / "quantized", "int4")
    serving_copies.serving_copy_finish(copy_pk=copy.pk)
    checkpoint.locator(".badge-ok", has_text="int4 serving copy").wait_for(timeout=20_000)
    text = checkpoint.inner_text()
    assert "35% of the bfloat16 model's 1000.0 MiB" in text and "96% of greedy tokens" in text
    assert checkpoint.get_by_role("button", name="Make it again").is_visible()
    assert page.evaluate("() => window.notReloaded") is True


def test_a_base_models_copy_that_fails_shows_why_without_a_reload(page, live_server, monkeypatch, tmp_path):
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team(slug="copies2")
    (tmp_path / "tiny").mkdir()  # a model whose files are gone gets no copy (tests/webapp/runs/test_serving_copies.py)
    base_model = make_base_model(team.project, name="tiny", path=str(tmp_path / "tiny"))
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/copies2/models/{base_model.public_id}/")
    card = page.locator("#serving-copy")
    assert "need eval prompts" in card.inner_text()
    card.get_by_role("button", name="Make serving copy").click()
    card.locator(".badge", has_text="int8 serving copy being written").wait_for()
    page.evaluate("() => { window.notReloaded = true; }")

    copy = ServingCopy.objects.get(base_model=base_model)
    serving_copies.serving_copy_finish(copy_pk=copy.pk, error=MemoryError("<b>the host ran out of memory</b>"))
    card.locator(".badge-error", has_text="int8 serving copy failed").wait_for(timeout=20_000)
    assert "MemoryError: <b>the host ran out of memory</b>" in card.inner_text()
    assert "serve this model unquantized" in card.inner_text()
    assert page.evaluate("() => window.notReloaded") is True
