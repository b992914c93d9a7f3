"""Time of a run page's Evaluations section (``webapp.runs.views._evaluations_context``: the newest, the curves across
checkpoints, the counts) and of the whole page, for a run evaluated ``--evaluations`` times, each result holding
``--examples`` completions of ``--example-bytes`` bytes (``jaxengine eval`` keeps the first few as examples).

Builds a throwaway data directory and SQLite database (production settings, as ``bench/pages.py``) with one project,
a succeeded run and its evaluations (succeeded, one per checkpoint step, across two figures), then measures
``--repeats`` times, after a warm-up: the section's wall time (its queries with their rows read and decoded: a
query's own ``time`` in ``CaptureQueriesContext`` stops before SQLite hands the rows over, so it is not used), a GET
of the run's page, and, side by side in the same process, the run's evaluations loaded as the page loaded them before
(``evaluation_list``: every result whole) and as it loads them now (``run_page_evaluations``: the values alone).
Prints the median and best of each, and how many queries the section makes.

    .venv/bin/python bench/run_page_evaluations.py [--evaluations 200] [--examples 5] [--example-bytes 2048]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.timing import timed  # noqa: E402
from bench.pages import bench_project, setup_django  # noqa: E402


def populate(*, project, owner, version, evaluations: int, examples: int, example_bytes: int):
    from webapp.evals.models import Evaluation, EvaluationStatus
    from webapp.runs.models import Run, RunStatus

    run = Run.objects.create(project=project, name="evaluated", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": "/nonexistent/bench-run"},
                             created_by=owner, current_step=evaluations * 10, total_steps=evaluations * 10)
    text = "x" * example_bytes
    Evaluation.objects.bulk_create([Evaluation(
        project=project, model_ref=f"{run.public_id}:step-{(index // 2 + 1) * 10}",
        model_label=f"evaluated step {(index // 2 + 1) * 10}", dataset_version=version, version_label=str(version),
        metric="exact_match", row_limit=100 + index % 2, max_new_tokens=32, status=EvaluationStatus.SUCCEEDED,
        result={"metric": "exact_match", "value": index / evaluations, "count": 100,
                "examples": [{"prompt": text, "completion": text[: example_bytes // 2], "answer": "1", "correct": True}
                             for _ in range(examples)]},
        created_by=owner) for index in range(evaluations)])
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=200)
    parser.add_argument("--examples", type=int, default=5)
    parser.add_argument("--example-bytes", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="temper-bench-run-evaluations-") as data_root:
        setup_django(Path(data_root))
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        from webapp.evals import selectors
        from webapp.projects.models import Membership
        from webapp.runs import views

        owner, project, _model, version = bench_project()
        run = populate(project=project, owner=owner, version=version, evaluations=args.evaluations,
                       examples=args.examples, example_bytes=args.example_bytes)
        membership = Membership.objects.get(project=project, user=owner)
        client = Client()
        client.force_login(owner)
        page = f"/p/{project.slug}/runs/{run.public_id}/"

        def section():
            return views._evaluations_context(project, run, membership)

        assert client.get(page).status_code == 200
        print(f"{args.evaluations} evaluations, {args.examples} examples of {args.example_bytes:,} bytes each, "
              f"{args.repeats} repeats")
        steps = {
            "section": section, "page GET": lambda: client.get(page),
            "loaded whole": lambda: list(selectors.evaluation_list(project=project, model_id=run.public_id)),
            "values alone": lambda: selectors.run_page_evaluations(project=project, run_id=run.public_id)}
        for name, step in steps.items():
            step()  # warm-up
            seconds = timed(step, args.repeats)
            print(f"{name:<12} median {statistics.median(seconds) * 1000:6.1f} ms  best {min(seconds) * 1000:6.1f} ms")
        with CaptureQueriesContext(connection) as queries:
            section()
        print(f"section's queries: {len(queries.captured_queries)}")


if __name__ == "__main__":
    main()
