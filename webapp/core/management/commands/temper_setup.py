"""First-run setup used by ``make up``: the admin account, the demo project (slug
``demo``, the admin as owner), the demo base model and its datasets. Running it twice
is safe: each step only creates what is missing.

The demo base model is built by the engine (``jaxengine demo-base --out DIR``
writes ``DIR/model/`` and ``DIR/data/*.jsonl``) into ``$TEMPER_MODELS_ROOT/demo``.
Building it imports jax, so it runs as a subprocess; when the installed engine has
no such sub-command yet, or building fails, setup says so and carries on. Each
``DIR/data`` file that exists becomes a dataset of the demo project (``DEMO_DATASETS``),
validated by the ``default`` worker like an upload; one already there by name is kept.

Each of the demo's things is made once per database (``SetupStep`` records it): setup runs at every
start, and what the team deleted since (a demo dataset, the base model, the project) stays deleted.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.files import File
from django.core.management.base import BaseCommand

from webapp.basemodels.models import BaseModel
from webapp.basemodels.selectors import demo_dir
from webapp.basemodels.services import basemodel_register
from webapp.core.models import SetupStep
from webapp.datasets.models import Dataset
from webapp.datasets.services import dataset_create_with_upload
from webapp.projects.models import Membership, Project, Role
from webapp.projects.services import membership_add, membership_set_role, project_create

DEMO_SLUG = "demo"
DEMO_BASE_MODEL_NAME = "demo-base"
# (dataset name, file in DIR/data, kind): eval.jsonl holds held-out prompts with their answers,
# the evaluation data of SFT (exact match) and of GRPO/PPO; sft_teacher.jsonl an imperfect teacher's
# answers, the SFT that the RL proof starts from (jaxengine/demo/corpus.py, teacher_completion).
DEMO_DATASETS = (
    ("demo-sft", "sft.jsonl", "sft"),
    ("demo-sft-teacher", "sft_teacher.jsonl", "sft"),
    ("demo-preference", "preference.jsonl", "preference"),
    ("demo-prompts", "prompts.jsonl", "prompts"),
    ("demo-eval", "eval.jsonl", "prompts"),
)
DEMO_PROJECT_STEP = "demo-project"
DEMO_BASE_MODEL_STEP = "demo-base-model"


def demo_dataset_step(name: str) -> str:
    return f"demo-dataset:{name}"


def step_done(name: str) -> bool:
    return SetupStep.objects.filter(name=name).exists()


def record_step(name: str) -> None:
    """Note that ``name`` is made (also when an earlier setup, from before the steps were recorded, made it)."""
    SetupStep.objects.get_or_create(name=name)


def demo_base_command(out_dir: Path) -> list[str] | None:
    """The command that builds the demo model into ``out_dir``, or None when the
    installed engine does not offer ``demo-base``."""
    from jaxengine.cli import SUBCOMMANDS  # jax-free: sub-command modules load lazily

    if "demo-base" not in SUBCOMMANDS:
        return None
    return [sys.executable, "-m", "jaxengine", "demo-base", "--out", str(out_dir)]


class Command(BaseCommand):
    help = "Create the admin account, the demo project, the demo base model and its datasets if missing (idempotent)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--no-demo-model", action="store_true",
            help="skip building and registering the demo base model and importing its datasets",
        )

    def handle(self, *args, **options) -> None:
        admin = self._ensure_admin()
        project = self._ensure_demo_project(admin)
        if project is None:
            self.stdout.write("demo project: deleted since setup made it; not made again")
            return
        # TEMPER_DEMO_MODEL=0 lets scripts and tests skip the engine build (it imports jax).
        if not options["no_demo_model"] and os.environ.get("TEMPER_DEMO_MODEL", "1") != "0":
            self._ensure_demo_base_model(project, admin)
            self._ensure_demo_datasets(project, admin)

    def _ensure_admin(self):
        username = os.environ.get("TEMPER_ADMIN_USER", "admin")
        password = os.environ.get("TEMPER_ADMIN_PASSWORD")
        user_model = get_user_model()
        user = user_model.objects.filter(username=username).first()
        if user is None:
            password = password or secrets.token_urlsafe(12)
            user = user_model.objects.create_superuser(username=username, email="", password=password)
            self.stdout.write(f"admin account created: {username} / {password}")
        elif password:
            # Only a changed password is set again: a new hash would log the admin out of every session.
            if not user.check_password(password):
                user.set_password(password)
                user.save(update_fields=["password"])
            self.stdout.write(f"admin account: {username} / {password}")
        else:
            # The random password was printed once, among the migrations' lines: say how to get a known one.
            self.stdout.write(f"admin account: {username} (password unchanged; forgot it? run again with "
                              "TEMPER_ADMIN_PASSWORD=... to set one)")
        return user

    def _ensure_demo_project(self, admin) -> Project | None:
        """The demo project, made if it never was; None when the team deleted it since."""
        project = Project.objects.filter(slug=DEMO_SLUG).first()
        if project is None:
            if step_done(DEMO_PROJECT_STEP):
                return None
            project = project_create(name="Demo", slug=DEMO_SLUG, owner=admin)
            record_step(DEMO_PROJECT_STEP)
            self.stdout.write(f"demo project created: /p/{DEMO_SLUG}/")
            return project
        record_step(DEMO_PROJECT_STEP)
        membership = Membership.objects.filter(project=project, user=admin).first()
        if membership is None:
            membership_add(project=project, user=admin, role=Role.OWNER)
        elif membership.role != Role.OWNER:
            membership_set_role(membership=membership, role=Role.OWNER)
        return project

    def _ensure_demo_base_model(self, project: Project, admin) -> None:
        if BaseModel.objects.filter(project=project, name=DEMO_BASE_MODEL_NAME).exists():
            record_step(DEMO_BASE_MODEL_STEP)
            return
        if step_done(DEMO_BASE_MODEL_STEP):  # unregistered since
            return
        out_dir = demo_dir()
        model_dir = out_dir / "model"
        if not (model_dir / "config.json").is_file():
            command = demo_base_command(out_dir)
            if command is None:
                self.stdout.write("demo base model: skipped (this engine has no `jaxengine demo-base` yet)")
                return
            # The build prints nothing while it runs (its progress bar needs a terminal): say what to expect.
            self.stdout.write(f"demo base model: building into {out_dir} (once; about 5 minutes on 2 idle CPU cores, "
                              "with no output meanwhile; TEMPER_DEMO_MODEL=0 skips it) ...")
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                self.stderr.write(
                    f"demo base model: `{' '.join(command)}` failed with exit code {result.returncode}; "
                    f"setup continues without it. Its last output:\n{result.stderr[-2000:]}"
                )
                return
        try:
            base_model = basemodel_register(
                project=project, name=DEMO_BASE_MODEL_NAME, path=str(model_dir), user=admin
            )
        except ValidationError as error:
            self.stderr.write(f"demo base model: not registered: {'; '.join(error.messages)}")
            return
        record_step(DEMO_BASE_MODEL_STEP)
        self.stdout.write(f"demo base model registered: {base_model.name} ({base_model.parameter_count} parameters)")

    def _ensure_demo_datasets(self, project: Project, admin) -> None:
        data_dir = demo_dir() / "data"
        for name, filename, kind in DEMO_DATASETS:
            path = data_dir / filename
            if Dataset.objects.filter(project=project, name=name).exists():
                record_step(demo_dataset_step(name))
                continue
            if not path.is_file() or step_done(demo_dataset_step(name)):  # not written yet, or deleted since
                continue
            try:
                with path.open("rb") as handle:
                    dataset_create_with_upload(
                        project=project, name=name, kind=kind, upload=File(handle, name=filename),
                        file_format="jsonl", column_mapping={}, user=admin,
                    )
            except ValidationError as error:
                self.stderr.write(f"demo dataset {name}: not imported: {'; '.join(error.messages)}")
                continue
            record_step(demo_dataset_step(name))
            self.stdout.write(f"demo dataset imported: {name} ({kind}), from {path}")
