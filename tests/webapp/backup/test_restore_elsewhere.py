"""What a team sees after a restore into another data directory: an installation with a succeeded LoRA SFT run of a
tiny model (its final export with its adapter and its serving copy, an exported checkpoint, the engine's summary), backed up and restored
under another ``TEMPER_DATA``, the old one gone. There the chat's picker offers the export and the checkpoint, the
engine loads the restored export and its serving copy from their new folders, a run started from the run passes its launch checks, and the run page and the
Storage page mark nothing gone. Each step in a process of the installation's own (``installations.run_in``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.factories import build_tiny_model_dir
from tests.webapp.backup.installations import SEED_START, installation, ok, run_in


# A succeeded LoRA SFT run from a base model kept in the data directory, its folders as the engine leaves them: the
# export (the base model's files, as a merged export is a whole model) with its adapter naming its base, checkpoint 5
# exported likewise, and summary.json, also recorded as the run's as ``runs.reporting.run_finish`` records it.
SEED = """
from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus, ServingCopy, ServingCopyStatus

model_dir = Path(settings.MODELS_ROOT) / "projects" / "backed-up" / "demo"
shutil.copytree({demo!r}, model_dir)
base_model = make_base_model(project, name="demo", path=str(model_dir.resolve()))
version = make_ready_version(project, user=owner)
run = services.run_create(project=project, user=owner, spec={{
    "task": "sft", "model": base_model.public_id, "data": {{"train": version.public_id, "max_seq_len": 128}},
    "peft": {{"method": "lora"}}, "train": {{"max_steps": 10}}}})
output = run.output_dir
for export in ("export", "export-step-5"):
    shutil.copytree(model_dir, output / export)
    (output / export / "adapter").mkdir()
    (output / export / "adapter" / "adapter_config.json").write_text(json.dumps(
        {{"peft_type": "LORA", "base_model_name_or_path": str(model_dir.resolve()), "r": 8}}, indent=2))
# The export's serving copy, written by the engine, as the serve worker writes it on request.
from jaxengine.quantize import quantize_model_dir
quantize_model_dir(output / "export", output / "export" / "quantized", scheme_name="int8")
ServingCopy.objects.create(project=project, run=run, scheme="int8", status=ServingCopyStatus.READY, requested_by=owner)
summary = {{"status": "succeeded", "step": 10, "task": "sft", "model": run.resolved_spec["model"], "peft": "lora",
           "export": {{"model": str(output / "export"), "adapter": str(output / "export" / "adapter")}}}}
(output / "summary.json").write_text(json.dumps(summary, indent=2))
Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=10, summary=summary)
for kind, step, path in ((ArtifactKind.MODEL, 10, output / "export"), (ArtifactKind.ADAPTER, 10, output / "export" / "adapter"),
                         (ArtifactKind.CHECKPOINT, 5, output / "export-step-5")):
    Artifact.objects.create(run=run, kind=kind, step=step, path=str(path.resolve()))
print(json.dumps({{"run": run.public_id, "version": version.public_id}}))
"""

# In the restored installation: what the pickers, a launch and the pages make of the restored run.
CHECK = """
import django, json
django.setup()
from django.conf import settings
from django.test import Client, override_settings
from django.test.utils import setup_test_environment
setup_test_environment()
from django.contrib.auth import get_user_model
from django.urls import reverse
from webapp.celery import app
app.send_task = lambda *args, **kwargs: None
from webapp.chat.selectors import model_choices
from webapp.projects.models import Project
from webapp.runs import services
from webapp.runs.models import Run

project = Project.objects.get(slug="backed-up")
owner = get_user_model().objects.get(username="owner")
choices = {{choice.ref: {{"gone": bool(choice.gone), "refused": choice.refused or "", "path": choice.path,
                         "quantization": choice.quantization}}
           for choice in model_choices(project=project)}}
launched = services.run_create(project=project, user=owner, spec={{
    "task": "sft", "model": {run!r}, "data": {{"train": {version!r}, "max_seq_len": 128}}, "train": {{"max_steps": 2}}}})
client = Client()
client.force_login(owner)
# No collectstatic here: the pages name their static files unhashed.
with override_settings(STORAGES={{**settings.STORAGES, "staticfiles": {{
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}}}):
    pages = {{name: client.get(url) for name, url in (
        ("run", reverse("runs:detail", args=[project.slug, {run!r}])),
        ("storage", reverse("projects:storage", args=[project.slug])))}}
print(json.dumps({{
    "choices": choices,
    "launched": {{"status": launched.status, "error": launched.error_message, "model": launched.resolved_spec["model"]}},
    "pages": {{name: {{"status": page.status_code, "html": page.content.decode()}} for name, page in pages.items()}},
    "export": Run.objects.get(public_id={run!r}).artifacts.get(kind="model").path,
}}))
"""

LOAD = """
import sys
from jaxengine.checkpoint.hf import load_hf_model
from jaxengine.quantize import load_quantized
load_hf_model(sys.argv[1])
load_quantized(sys.argv[1] + "/quantized")
print("loaded both")
"""


@pytest.fixture(scope="module")
def restored(tmp_path_factory):
    """(the source's data directory, the target's environment, the seeded ids, the target's CHECK answer)."""
    # A tiny model the suite builds (config.json, safetensors, tokenizer files, as jaxengine saves a model): the
    # demo model is built by scripts/bench only, which a CI machine never runs.
    model = build_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"))
    source = installation(tmp_path_factory.mktemp("source"))
    ids = json.loads(ok(run_in(source, "-c", SEED_START + SEED.format(demo=str(model)))).strip().splitlines()[-1])
    backup = tmp_path_factory.mktemp("backup") / "temper.tar"
    ok(run_in(source, "temper_backup", "--quiet", str(backup)))
    # The old data directory is gone, as on the machine restored onto: whatever still named it would fail.
    old_data = Path(source["TEMPER_DATA"])
    old_data.rename(old_data.with_name("data-of-the-old-machine"))
    target = installation(tmp_path_factory.mktemp("target"))
    ok(run_in(target, "temper_restore", str(backup)))
    checked = json.loads(ok(run_in(target, "-c", CHECK.format(**ids))).strip().splitlines()[-1])
    return source["TEMPER_DATA"], target, ids, checked


def test_the_chat_picker_offers_the_restored_export_and_checkpoint(restored):
    _old, _target, ids, checked = restored
    run = ids["run"]
    export = Path(checked["export"])
    assert checked["choices"][run] == {"gone": False, "refused": "", "path": str(export / "quantized"),
                                       "quantization": "int8"}
    assert checked["choices"][f"{run}:step-5"] == {"gone": False, "refused": "",
                                                   "path": str(export.with_name("export-step-5")), "quantization": ""}


def test_the_engine_loads_the_restored_export_from_its_new_folder(restored):
    old_data, target, _ids, checked = restored
    export = Path(checked["export"])
    assert export.is_relative_to(Path(target["TEMPER_DATA"]).resolve()) and not export.is_relative_to(old_data)
    assert "loaded both" in ok(run_in(target, "-c", LOAD, str(export)))
    serving_copy = json.loads((export / "quantized" / "quantization.json").read_text())
    assert serving_copy["source"] == str(export)
    adapter = json.loads((export / "adapter" / "adapter_config.json").read_text())
    assert Path(adapter["base_model_name_or_path"]).is_dir()
    assert not adapter["base_model_name_or_path"].startswith(old_data)


def test_a_run_started_from_the_restored_run_passes_its_launch_checks(restored):
    old_data, target, _ids, checked = restored
    launched = checked["launched"]
    assert launched["status"] == "queued" and launched["error"] == "", launched
    assert Path(launched["model"]).is_dir() and not launched["model"].startswith(old_data)


def test_the_run_page_and_the_storage_page_mark_nothing_gone(restored):
    old_data, _target, _ids, checked = restored
    for name, page in checked["pages"].items():
        assert page["status"] == 200, name
        html = page["html"]
        for gone in ("its folder is gone", "(deleted since)", "is gone from disk", ">gone</span>", 'id="export-gone"'):
            assert gone not in html, (name, gone)
        assert old_data not in html, name
