"""Installations for the backup and restore tests (tests/webapp/backup, tests/postgres): a seed that gives one what a
team's holds, a dump of the rows a restore must bring back, and its commands run in a process of its own with the
installation's settings, as a team runs them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Seeds an installation: what a team's holds, a file of each kind Temper keeps in its data directory, and the
# files a backup leaves out (compiled programs, collected static files, a dataset upload still being written).
# What every seed starts with: a migrated database whose tasks go nowhere (no worker here), and its owner's project.
SEED_START = """
import django, json, shutil
django.setup()
from pathlib import Path
from django.conf import settings
from django.core.management import call_command
call_command("migrate", "--noinput", verbosity=0)
from webapp.celery import app
app.send_task = lambda *args, **kwargs: None
from tests.webapp.factories import make_base_model, make_ready_version, make_user
from webapp.projects.services import project_create
from webapp.runs import services

owner = make_user("owner")
project = project_create(name="Backed up", slug="backed-up", owner=owner)
"""

SEED = SEED_START + """
from webapp.runs.models import Artifact

model_dir = Path(settings.MODELS_ROOT) / "projects" / "backed-up" / "tiny"
model_dir.mkdir(parents=True)
(model_dir / "model.safetensors").write_bytes(bytes(range(256)) * 64)
base_model = make_base_model(project, path=str(model_dir.resolve()))
version = make_ready_version(project, user=owner)
run = services.run_create(project=project, user=owner, spec={
    "task": "sft", "model": base_model.public_id, "data": {"train": version.public_id}, "train": {"max_steps": 10}})
checkpoint = run.output_dir / "checkpoints" / "10"
checkpoint.mkdir(parents=True)
(checkpoint / "state.bin").write_bytes(b"checkpoint-bytes" * 1000)
Artifact.objects.create(run=run, kind="checkpoint", path=str(checkpoint), step=10)
# The engine's summary, recorded as the run's (runs.reporting.run_finish): it names the run's folders.
type(run).objects.filter(pk=run.pk).update(summary={"model": base_model.path,
                                                     "export": {"model": str(run.output_dir / "export")}})
data = Path(settings.DATA_ROOT)
(data / "jax-cache").mkdir()
(data / "jax-cache" / "program.bin").write_bytes(b"compiled")
(data / "datasets" / ".upload.jsonl.abc.part").write_bytes(b"half an upload")
# A checkpoint being deleted (webapp.runs.services.checkpoint_delete), renamed out of checkpoints/ before its removal.
(run.output_dir / ".deleting-checkpoint-5-0a1b2c3d").mkdir()
(run.output_dir / ".deleting-checkpoint-5-0a1b2c3d" / "state.bin").write_bytes(b"deleted")
print(run.public_id)
"""

# Every row a restore must bring back, and the paths of the rows that name folders.
DUMP = """
import django, json
django.setup()
from django.contrib.auth import get_user_model
from webapp.activity.models import Activity
from webapp.basemodels.models import BaseModel
from webapp.datasets.models import DatasetVersion
from webapp.projects.models import Membership, Project
from webapp.runs.models import Artifact, Run
print(json.dumps({
    "users": sorted(get_user_model().objects.values_list("username", "password")),
    "projects": sorted(Project.objects.values_list("id", "slug", "name")),
    "memberships": sorted(Membership.objects.values_list("project__slug", "user__username", "role")),
    "versions": sorted(DatasetVersion.objects.values_list("public_id", "file_path", "size_bytes")),
    "runs": sorted((run.public_id, run.status, run.resolved_spec["output_dir"], json.dumps(run.summary, sort_keys=True))
                   for run in Run.objects.all()),
    "artifacts": sorted(Artifact.objects.values_list("run__public_id", "kind", "path")),
    "base_models": sorted(BaseModel.objects.values_list("public_id", "path")),
    "activity": sorted(Activity.objects.values_list("project__slug", "actor_name", "verb", "target_id")),
}))
"""


def installation(base: Path, *, database_url: str | None = None) -> dict[str, str]:
    """The environment of an installation whose data directory is ``base/data``, its database ``database_url``
    (by default a SQLite file in the data directory)."""
    data = base / "data"
    # No TEMPER_SECRET_KEY: the installation makes its key in its data directory, which the backup keeps.
    return {"TEMPER_DATA": str(data), "DATABASE_URL": database_url or f"sqlite:///{data / 'temper.sqlite3'}",
            "DJANGO_SETTINGS_MODULE": "webapp.settings", "TEMPER_MODELS_ROOT": "", "TEMPER_JAX_CACHE": "",
            "TEMPER_SECRET_KEY": ""}


def run_in(environment: dict[str, str], *command: str) -> subprocess.CompletedProcess:
    """``command`` (manage.py's arguments, or ``-c`` and a script) in a process of the installation's own."""
    env = {**os.environ, **environment}
    for name in [name for name, value in env.items() if value == ""]:
        env.pop(name)  # unset: the settings' defaults under TEMPER_DATA
    arguments = list(command) if command[0] == "-c" else ["manage.py", *command]
    return subprocess.run([sys.executable, *arguments], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def moved(rows, old: str, new: str):
    """``rows`` (the DUMP's JSON) with every path under ``old`` read under ``new``."""
    return json.loads(json.dumps(rows).replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1]))
