"""What the chat list and the arena pay per load for their models' files and their decisive vote count, at
``bench/pages_at_scale.py``'s scale 1 (its large project alone: 300 models, 5,000 voted battles).

Prints the ``stat`` calls of one load of the model menus (``model_choices``, ``thinking_defaults`` and each model's
``chat_template_variables``, as the arena asks them) after a first load, their median CPU time over 30 loads, and the
median CPU time of the arena's count of decisive votes (SQLite in process: the CPU counts the query's work).

    .venv/bin/python bench/model_files_per_load.py
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pages import setup_django  # noqa: E402


def cpu_ms(function, *, times: int = 30) -> float:
    function()
    spent = []
    for _ in range(times):
        started = time.process_time()
        function()
        spent.append(time.process_time() - started)
    return 1e3 * statistics.median(spent)


def main() -> None:
    os.environ.setdefault("TEMPER_SECRET_KEY", "bench-model-files-signing-key-not-for-any-deployment")
    setup_django(Path(tempfile.mkdtemp(prefix="temper-bench-model-files-")))
    from django.contrib.auth import get_user_model

    from bench.pages_at_scale import populate
    from webapp.celery import app
    from webapp.chat import arena, selectors
    from webapp.projects.models import Project

    app.send_task = lambda *a, **k: None  # no broker
    owner = get_user_model().objects.create_user("bench-owner", password="unused-password")
    populate(slug="large", scale=1.0, owner=owner)
    project = Project.objects.get(slug="large")

    def menus() -> None:
        choices = selectors.model_choices(project=project)
        selectors.thinking_defaults(choices)
        for choice in choices:
            selectors.chat_template_variables(choice)

    real_stat, calls = os.stat, []

    def counted_stat(path, *args, **kwargs):
        calls.append(path)
        return real_stat(path, *args, **kwargs)

    menus()
    os.stat = counted_stat
    menus()
    os.stat = real_stat
    print(f"{len(selectors.model_choices(project=project))} models: {len(calls)} stat calls a load, "
          f"{cpu_ms(menus):.1f} ms CPU a load")
    decisive = arena.decisive_battles(project=project)
    print(f"decisive votes ({decisive.count()} of {project.battles.count()} battles): "
          f"{cpu_ms(decisive.count):.2f} ms CPU a count")


if __name__ == "__main__":
    main()
