"""``manage.py temper_setup``: admin, demo project, demo base model; idempotent."""
import json
import sys
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from jaxengine.demo import corpus
from tests.webapp.factories import TINY_LLAMA_PARAMETERS, TINY_LLAMA_SHAPES, write_model_dir
from webapp.basemodels.models import BaseModel
from webapp.core.management.commands import temper_setup
from webapp.datasets import services as dataset_services
from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus
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


def write_demo_data(data_dir):
    """DIR/data/*.jsonl as `jaxengine demo-base` writes them (the engine's own writer, on a few problems)."""
    return corpus.write_datasets(corpus.dataset_rows(corpus.generate_problems(seed=0, count=60), max_eval=6), data_dir)


def test_it_imports_the_demo_datasets_once_and_they_validate_as_their_kinds(db, models_root, monkeypatch,
                                                                            django_capture_on_commit_callbacks):
    queued = []
    monkeypatch.setattr(dataset_services.celery_app, "send_task", lambda name, args, queue: queued.append(args[0]))
    write_model_dir(models_root / "demo" / "model")
    run_setup()  # a setup from before the data was there: the model alone
    assert not Dataset.objects.exists()
    written = write_demo_data(models_root / "demo" / "data")
    with django_capture_on_commit_callbacks(execute=True):
        output = run_setup()
    assert "demo dataset imported: demo-sft (sft)" in output
    datasets = {dataset.name: dataset for dataset in Dataset.objects.filter(project__slug="demo")}
    assert {name: dataset.kind for name, dataset in datasets.items()} == {
        "demo-sft": "sft", "demo-sft-teacher": "sft", "demo-preference": "preference", "demo-prompts": "prompts",
        "demo-eval": "prompts"}
    assert all(dataset.created_by.username == "boss" for dataset in datasets.values())
    assert sorted(queued) == sorted(DatasetVersion.objects.values_list("pk", flat=True))  # validation queued
    for name, source in (("demo-sft", "sft"), ("demo-sft-teacher", "sft_teacher"), ("demo-preference", "preference"),
                         ("demo-prompts", "prompts"), ("demo-eval", "eval")):
        version = dataset_services.dataset_version_validate(version_id=datasets[name].versions.get().pk)
        assert version.status == VersionStatus.READY, version.errors
        assert version.row_count == len(written[source].read_text().splitlines())
        assert version.absolute_path.read_bytes() == written[source].read_bytes()
    run_setup()
    assert (Dataset.objects.count(), DatasetVersion.objects.count()) == (5, 5)


def test_it_imports_only_the_demo_datasets_that_exist(db, models_root):
    write_model_dir(models_root / "demo" / "model")
    data_dir = models_root / "demo" / "data"
    for path in write_demo_data(data_dir).values():
        if path.name != "sft.jsonl":
            path.unlink()
    run_setup()
    assert list(Dataset.objects.values_list("name", flat=True)) == ["demo-sft"]


def test_it_builds_the_demo_model_with_the_engine_command(db, models_root, monkeypatch):
    # Stand-in for `jaxengine demo-base --out DIR`: writes DIR/model like the engine does.
    def fake_command(out_dir):
        script = (
            "import json, sys, numpy as np; from pathlib import Path; from safetensors.numpy import save_file;"
            "model = Path(sys.argv[1]) / 'model'; model.mkdir(parents=True);"
            "(model / 'config.json').write_text(json.dumps({'architectures': ['LlamaForCausalLM'], 'vocab_size': 64,"
            " 'hidden_size': 8, 'intermediate_size': 16, 'num_hidden_layers': 1, 'num_attention_heads': 2,"
            " 'tie_word_embeddings': True}));"
            "(model / 'tokenizer.json').write_text('{}');"
            "save_file({name: np.zeros(shape, np.float32) for name, shape in json.loads(sys.argv[2]).items()},"
            " str(model / 'model.safetensors'))"
        )
        return [sys.executable, "-c", script, str(out_dir), json.dumps(TINY_LLAMA_SHAPES)]

    monkeypatch.setattr(temper_setup, "demo_base_command", fake_command)
    output = run_setup()
    assert "building into" in output
    assert "about 5 minutes on 2 idle CPU cores, with no output meanwhile; TEMPER_DEMO_MODEL=0 skips it" in output
    assert BaseModel.objects.get(project__slug="demo").parameter_count == TINY_LLAMA_PARAMETERS


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


def test_a_second_run_says_how_to_set_a_forgotten_random_password(db, models_root, monkeypatch):
    """The random password is printed once, among forty lines of migrations; the next run said only
    '(password unchanged)', which left a newcomer who missed it with no way in that the output named."""
    monkeypatch.delenv("TEMPER_ADMIN_PASSWORD")
    assert "admin account created: boss / " in run_setup("--no-demo-model")
    output = run_setup("--no-demo-model")
    assert "admin account: boss (password unchanged; forgot it? run again with TEMPER_ADMIN_PASSWORD=... to set one)" \
        in output


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


def test_what_a_team_deleted_of_the_demo_is_not_made_again_by_the_next_setup(db, models_root, monkeypatch):
    """``make up`` runs setup at every start: a demo dataset, the demo base model or the whole demo project
    that the team had deleted came back, the project with the admin as its owner."""
    monkeypatch.setattr(dataset_services.celery_app, "send_task", lambda *args, **kwargs: None)
    write_model_dir(models_root / "demo" / "model")
    write_demo_data(models_root / "demo" / "data")
    run_setup()
    assert Dataset.objects.count() == 5 and BaseModel.objects.count() == 1
    Dataset.objects.get(name="demo-eval").delete()
    BaseModel.objects.get(name="demo-base").delete()
    run_setup()
    assert not Dataset.objects.filter(name="demo-eval").exists() and not BaseModel.objects.exists()
    Project.objects.get(slug="demo").delete()
    output = run_setup()
    assert not Project.objects.exists() and not Dataset.objects.exists()
    assert "demo project created" not in output
