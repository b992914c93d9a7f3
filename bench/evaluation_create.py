"""Time of ``webapp.evals.services.evaluation_create`` on a prompts version of ``--rows`` rows (its checks read every
row it will score in the request: the reference answers and the group-by column's labels, so that a refusal shows on
the form), and of its two reading steps alone (``version_rows``, ``_check_group_by``).

Builds a throwaway data directory and SQLite database (production settings, as ``bench/pages.py``) with one project,
a base model and a ready prompts version whose rows are a prompt of ``--sentences`` sentences of 39 characters (8:
about 330 characters), an answer and a ``task`` label of 8 values; then calls the service ``--repeats`` times (each
creates an evaluation of every row, grouped by ``task``; nothing is sent to a worker) and prints the median and best
wall time of each step. ``--profile`` prints the top of cProfile's cumulative list for one call.

    .venv/bin/python bench/evaluation_create.py [--rows 5000] [--sentences 8] [--repeats 7] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.timing import timed  # noqa: E402
from bench.pages import bench_project, setup_django  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--sentences", type=int, default=8, help="the length of each prompt")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="temper-bench-evaluation-") as data_root:
        setup_django(Path(data_root))
        from tests.webapp.factories import make_ready_version
        from webapp.evals import services

        owner, project, model, _version = bench_project()
        rows = [{"prompt": f"Question {index}: " + "what follows from the sentence before? " * args.sentences,
                 "answer": str(index % 97), "task": f"task-{index % 8}"} for index in range(args.rows)]
        version = make_ready_version(project, name="questions", kind="prompts", rows=rows, user=owner)
        settings = services.EvaluationSettings(row_limit=args.rows, group_by="task")

        def create():
            services.evaluation_create(project=project, model_ref=model.public_id, version=version, settings=settings,
                                       user=owner)

        def read():
            return services.version_rows(version=version, metric="exact_match", row_limit=args.rows)

        read_rows = read()
        steps = {"evaluation_create": create, "version_rows": read,
                 "_check_group_by": lambda: services._check_group_by(read_rows, group_by="task", metric="exact_match",
                                                                     version=version)}
        print(f"{args.rows:,} rows ({version.size_bytes / 1e6:.1f} MB), {args.repeats} repeats")
        for name, step in steps.items():
            step()  # warm-up
            seconds = timed(step, args.repeats)
            print(f"{name:<18} median {statistics.median(seconds):.4f} s  best {min(seconds):.4f} s")
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(create)
            pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
