"""Server time of the project and dataset pages with a realistically full project.

Builds a throwaway SQLite database (production settings: DEBUG off, WAL) holding
one project with 1,000 datasets (one ready version each), 30 members and 20 base
models, plus 50 other projects of the same user, then requests each page through
Django's in-process test client, which runs the whole server path (middleware,
session, access check, queries, template) without the network. Prints the median,
95th percentile and maximum over ``--requests`` requests per page, after a warm-up.

    .venv/bin/python bench/pages.py [--datasets 1000] [--requests 200]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    return parser.parse_args()


def setup_django(data_root: Path) -> None:
    os.environ["TEMPER_DATA"] = str(data_root)
    os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings"
    for name in ("DATABASE_URL", "TEMPER_MODELS_ROOT"):
        os.environ.pop(name, None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
    # The pages name their static files from collectstatic's manifest, and WhiteNoise serves STATIC_ROOT.
    call_command("collectstatic", "--noinput", verbosity=0)


@contextlib.contextmanager
def logged_in_server(user) -> Iterator[tuple[str, str]]:
    """A live server thread on a free port serving the default setup (WhiteNoise over collectstatic's files) and a
    session of ``user`` for a browser's cookie: ``(base URL, session id)``; the server stops on leaving."""
    from django.test import Client
    from django.test.testcases import LiveServerThread

    client = Client()
    client.force_login(user)
    server = LiveServerThread("127.0.0.1", lambda application: application, connections_override={}, port=0)
    server.daemon = True
    server.start()
    server.is_ready.wait()
    if server.error:
        raise server.error
    try:
        yield f"http://127.0.0.1:{server.port}", client.cookies["sessionid"].value
    finally:
        server.terminate()

def bench_project():
    """The page benchmarks' project: its owner ``bench-owner``, the project ``bench``, a base model and a ready sft
    version (``tests.webapp.factories``); tasks are sent nowhere (no worker trains what a benchmark launches)."""
    from django.contrib.auth import get_user_model

    from tests.webapp.factories import make_base_model, make_ready_version
    from webapp.celery import app
    from webapp.projects.services import project_create

    app.send_task = lambda *a, **k: None
    owner = get_user_model().objects.create_user("bench-owner", password="unused-password")
    project = project_create(name="Bench", slug="bench", owner=owner)
    return owner, project, make_base_model(project), make_ready_version(project)


def populate(*, dataset_count: int):
    from django.apps import apps
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from webapp.basemodels.models import BaseModel
    from webapp.core.name_case import name_key
    from webapp.projects.models import Membership, Role
    from webapp.projects.services import project_create

    users = get_user_model().objects
    owner = users.create_user("bench-owner", password="unused-password")
    project = project_create(name="Bench", slug="bench", owner=owner)
    for index in range(50):
        project_create(name=f"Other {index:02d}", slug=f"other-{index:02d}", owner=owner)
    members = users.bulk_create([users.model(username=f"member-{index:02d}") for index in range(30)])
    Membership.objects.bulk_create(
        [Membership(project=project, user=member, role=Role.MEMBER) for member in members]
    )
    BaseModel.objects.bulk_create(
        [
            BaseModel(
                project=project, name=f"model-{index:02d}", name_key=name_key(f"model-{index:02d}"),
                path=f"/models/m{index}", architecture="LlamaForCausalLM",
                model_type="llama", parameter_count=1_235_814_400, context_length=131072, vocab_size=128256,
                tokenizer_type="tokenizer.json", dtype="BF16", size_bytes=2_471_645_608, registered_by=owner,
            )
            for index in range(20)
        ]
    )
    pages = {
        "project list (/ , 51 projects)": "/",
        "project overview": "/p/bench/",
        "members (31)": "/p/bench/members/",
        "base models (20)": "/p/bench/models/",
    }
    if apps.is_installed("webapp.datasets"):
        from webapp.datasets.models import Dataset, DatasetVersion

        datasets = Dataset.objects.bulk_create(
            [Dataset(project=project, name=f"dataset-{index:04d}", name_key=name_key(f"dataset-{index:04d}"), kind="sft",
                     created_by=owner) for index in range(dataset_count)]
        )
        DatasetVersion.objects.bulk_create(
            [
                DatasetVersion(
                    dataset=dataset, number=1, file_path=f"datasets/{dataset.public_id}/1.jsonl",
                    original_filename="train.jsonl", format="jsonl", size_bytes=1_048_576, status="ready",
                    row_count=10_000, created_by=owner, validated_at=timezone.now(),
                )
                for dataset in datasets
            ]
        )
        pages[f"dataset list ({dataset_count})"] = "/p/bench/datasets/"
        pages["dataset detail"] = f"/p/bench/datasets/{datasets[0].public_id}/"
    return owner, pages


def measure(client, url: str, *, requests: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        response = client.get(url)
        assert response.status_code == 200, f"{url} answered {response.status_code}"
    timings = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url)
        timings.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    return timings


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="temper-bench-pages-") as data_root:
        setup_django(Path(data_root))
        from django.test import Client

        owner, pages = populate(dataset_count=args.datasets)
        client = Client()
        client.force_login(owner)
        print(f"{'page':34} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'KiB':>6}")
        for label, url in pages.items():
            timings = sorted(measure(client, url, requests=args.requests, warmup=args.warmup))
            p95 = timings[int(0.95 * len(timings)) - 1]
            size = len(client.get(url).content) / 1024
            print(f"{label:34} {statistics.median(timings):8.1f} {p95:8.1f} {timings[-1]:8.1f} {size:6.0f}")


if __name__ == "__main__":
    main()
