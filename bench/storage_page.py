"""Server time of a project's Storage page and ``GET /api/v1/projects/<slug>/storage/``, which walk the project's
folders on every request (``webapp.projects.storage``), as its runs grow.

Builds a throwaway data directory and SQLite database (production settings: DEBUG off, WAL) with one project of
``--runs`` finished runs, each with a run directory laid out as the engine writes one: ``--checkpoints`` checkpoint
folders of ``--files`` files in three subfolders (orbax's metadata, its state and its ocdbt data), an export with a
quantized serving copy, and a log, metrics, samples and spec; plus ``--datasets`` datasets of three versions and a
few base models with serving copies. Files are small (a few KB): the walk's cost is the number of entries, not their
bytes. Then requests the page and the API through Django's in-process test client (middleware, session or token,
access check, queries, the walk, template) and prints the median and 95th percentile wall time over ``--requests``
requests after a warm-up (the page cache warm, as on a server whose pages are read; the sums of checkpoints and exports
kept, as after a first load), the median CPU time and the number of SQL queries of one request, and the number of
entries in the run directories; and the first walk, every file read, alone.

    .venv/bin/python bench/storage_page.py [--runs 300] [--checkpoints 5] [--files 8] [--requests 20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pages import bench_project, setup_django  # noqa: E402
from bench.runs_pages import timed  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--checkpoints", type=int, default=5)
    parser.add_argument("--files", type=int, default=8, help="files in each checkpoint folder")
    parser.add_argument("--datasets", type=int, default=20)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    return parser.parse_args()


def write_run_directory(folder: Path, *, checkpoints: int, files: int) -> int:
    """A run directory as the engine lays one out; the number of entries written."""
    entries = 0
    for step in range(1, checkpoints + 1):
        for number in range(files):
            part = ("state", "state/ocdbt.process_0", "state/ocdbt.process_0/d")[number % 3]
            path = folder / "checkpoints" / str(step * 100) / part / f"file-{number}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * 4096)
            entries += 1
        entries += 4  # the step's folder and its three subfolders
    for name in ("export/config.json", "export/model.safetensors", "export/tokenizer.json",
                 "export/tokenizer_config.json", "export/quantized/model.safetensors",
                 "export/quantized/quantization.json", "log.jsonl", "metrics.jsonl", "samples.jsonl", "spec.yaml"):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 4096)
        entries += 1
    return entries + 3  # checkpoints/, export/, export/quantized/


def populate(args: argparse.Namespace):
    from django.utils import timezone

    from tests.webapp.factories import make_base_model, make_ready_version, write_bytes
    from webapp.runs.models import Run, RunStatus
    from webapp.runs.serving_copies import base_model_copy_dir
    from webapp.runs.services import run_output_dir

    owner, project, _model, _version = bench_project()
    now = timezone.now()
    runs = [Run(project=project, name=f"run {number:04d}", task="sft", spec={}, status=RunStatus.SUCCEEDED,
                started_at=now, created_by=owner) for number in range(args.runs)]
    for run in runs:
        run.resolved_spec = {"output_dir": str(run_output_dir(run.public_id))}
    Run.objects.bulk_create(runs)
    entries = sum(write_run_directory(run_output_dir(run.public_id), checkpoints=args.checkpoints, files=args.files)
                  for run in runs)
    for number in range(args.datasets):
        for _version in range(3):
            make_ready_version(project, name=f"data {number}")
    for number in range(5):
        model = make_base_model(project, name=f"model {number}", path=f"/models/model-{number}")
        write_bytes(base_model_copy_dir(model) / "model.safetensors", 4096)
    return owner, project, entries


def report(label: str, durations: list[float], cpu: list[float], queries: int) -> None:
    durations = sorted(durations)
    p95 = durations[max(0, round(0.95 * len(durations)) - 1)]
    print(f"{label}: median {statistics.median(durations) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
          f"CPU {statistics.median(cpu) * 1000:.0f} ms, {queries} queries")


def main() -> None:
    args = parse_args()
    setup_django(Path(tempfile.mkdtemp(prefix="temper-bench-storage-")))
    from django.test import Client

    from webapp.api.services import token_create
    from webapp.projects.storage import project_storage

    started = time.perf_counter()
    owner, project, entries = populate(args)
    print(f"populated {args.runs} runs x {args.checkpoints} checkpoints of {args.files} files "
          f"({entries:,} entries in run directories) in {time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    project_storage(project=project)
    print(f"project_storage, first (every file walked, the checkpoints' and exports' sums kept): "
          f"{(time.perf_counter() - started) * 1000:.0f} ms")
    walks = []
    for _ in range(args.requests):
        started = time.perf_counter()
        storage = project_storage(project=project)
        walks.append(time.perf_counter() - started)
    print(f"project_storage alone, sums kept: median {statistics.median(walks) * 1000:.0f} ms "
          f"(total {storage.total_bytes:,} bytes)")
    client = Client()
    client.force_login(owner)
    durations, cpu, size, queries = timed(client, f"/p/{project.slug}/storage/", requests=args.requests,
                                          warmup=args.warmup)
    report(f"Storage page ({size:,} bytes of HTML)", durations, cpu, queries)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=owner, name='bench')[1]}")
    durations, cpu, size, queries = timed(api, f"/api/v1/projects/{project.slug}/storage/", requests=args.requests,
                                          warmup=args.warmup)
    report(f"API ({size:,} bytes of JSON)", durations, cpu, queries)


if __name__ == "__main__":
    main()
