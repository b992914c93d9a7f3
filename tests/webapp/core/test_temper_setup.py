"""``manage.py temper_setup``: admin, demo project, demo base model; idempotent."""
import sys
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from tests.webapp.factories import write_model_dir
from webapp.basemodels.models import BaseModel
from webapp.core.management.commands import temper_setup
from webapp.projects.models import Membership, Project, Role


def run_setup(*args) -> str:
    out, err = StringIO(), StringIO()
    call_command("temper_setup", *args, stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


@pytest.fixture
def models_root(settings, tmp_path, monkeypatch):
    settings.MODELS_ROOT = tmp_path / "models"
    monkeypatch.setenv("TEMPER_ADMIN_USER", "boss")
    monkeypatch.setenv("TEMPER_ADMIN_PASSWORD", "s3cret-pass")
    return settings.MODELS_ROOT


def test_it_works_and_is_idempotent(db, models_root, monkeypatch):
    write_model_dir(models_root / "demo" / "model")
    output = run_setup()
    assert "demo project created" in output and "demo base model registered" in output
    admin = get_user_model().objects.get(username="boss")
    assert admin.is_superuser and admin.check_password("s3cret-pass")
    project = Project.objects.get(slug="demo")
    assert Membership.objects.get(project=project, user=admin).role == Role.OWNER
    assert BaseModel.objects.get(project=project).name == "demo-base"
    run_setup()
    assert (Project.objects.count(), Membership.objects.count(), BaseModel.objects.count()) == (1, 1, 1)


def test_it_builds_the_demo_model_with_the_engine_command(db, models_root, monkeypatch):
    # Stand-in for `jaxengine demo-base --out DIR`: writes DIR/model like the engine does.
    def fake_command(out_dir):
        script = (
            "import json, sys, numpy as np; from pathlib import Path; from safetensors.numpy import save_file;"
            "model = Path(sys.argv[1]) / 'model'; model.mkdir(parents=True);"
            "(model / 'config.json').write_text(json.dumps({'architectures': ['LlamaForCausalLM']}));"
            "(model / 'tokenizer.json').write_text('{}');"
            "save_file({'w': np.zeros((7, 3), np.float32)}, str(model / 'model.safetensors'))"
        )
        return [sys.executable, "-c", script, str(out_dir)]

    monkeypatch.setattr(temper_setup, "demo_base_command", fake_command)
    output = run_setup()
    assert "building into" in output
    assert BaseModel.objects.get(project__slug="demo").parameter_count == 21


def test_it_carries_on_without_the_engine_command(db, models_root, monkeypatch):
    monkeypatch.setattr(temper_setup, "demo_base_command", lambda out_dir: None)
    output = run_setup()
    assert "skipped" in output
    assert Project.objects.filter(slug="demo").exists()
    assert not BaseModel.objects.exists()


def test_it_reports_a_failing_engine_command(db, models_root, monkeypatch):
    monkeypatch.setattr(
        temper_setup, "demo_base_command", lambda out_dir: [sys.executable, "-c", "raise SystemExit('no luck')"]
    )
    output = run_setup()
    assert "failed with exit code 1" in output and "no luck" in output
    assert Project.objects.filter(slug="demo").exists()


def test_it_restores_the_admin_as_demo_owner(db, models_root):
    run_setup("--no-demo-model")
    admin = get_user_model().objects.get(username="boss")
    Membership.objects.filter(user=admin).delete()
    run_setup("--no-demo-model")
    assert Membership.objects.get(project__slug="demo", user=admin).role == Role.OWNER


def test_running_it_again_keeps_the_admins_sessions(db, models_root, monkeypatch, client):
    """`make up` runs setup at every start; setting the same password again (a new salt and hash) logged the
    admin out of every browser. A changed TEMPER_ADMIN_PASSWORD still applies."""
    run_setup("--no-demo-model")
    assert client.login(username="boss", password="s3cret-pass")
    assert client.get("/p/demo/").status_code == 200
    run_setup("--no-demo-model")
    assert client.get("/p/demo/").status_code == 200  # still logged in
    monkeypatch.setenv("TEMPER_ADMIN_PASSWORD", "an0ther-pass")
    run_setup("--no-demo-model")
    assert get_user_model().objects.get(username="boss").check_password("an0ther-pass")
    assert client.get("/p/demo/").status_code == 302  # a new password ends the old sessions, as Django does
