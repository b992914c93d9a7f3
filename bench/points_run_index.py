"""What the run foreign key's own index on the metric points costs and saves, on SQLite: a copy of a bench
database (``bench/runs_pages.py`` leaves its ``temper.sqlite3`` in ``/tmp/temper-bench-runs-*``) vacuumed, its
size, and two reads of the run with the most points timed (10 each) with the index and then without it.

    python3 bench/points_run_index.py /tmp/temper-bench-runs-XXXX/temper.sqlite3
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import tempfile
import time


def main() -> None:
    copy = os.path.join(tempfile.mkdtemp(prefix="temper-bench-run-index-"), "copy.sqlite3")
    shutil.copy(sys.argv[1], copy)
    db = sqlite3.connect(copy)
    db.execute("VACUUM")
    index = db.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                       "AND name LIKE 'runs_metricpoint_run_id%'").fetchone()[0]
    run_id, newest = db.execute("SELECT run_id, MAX(id) FROM runs_metricpoint GROUP BY run_id "
                                "ORDER BY COUNT(*) DESC LIMIT 1").fetchone()
    reads = {
        "points since stored buckets (id > through_id)":
            f"SELECT name, step, value FROM runs_metricpoint WHERE run_id = {run_id} AND id > {newest - 4000}",
        "the run's newest point id": f"SELECT MAX(id) FROM runs_metricpoint WHERE run_id = {run_id}",
    }

    def measure(label: str) -> None:
        points = db.execute("SELECT COUNT(*) FROM runs_metricpoint").fetchone()[0]
        print(f"{label}: database {os.path.getsize(copy) / 2**20:.1f} MiB, {points} points")
        for name, sql in reads.items():
            plan = db.execute("EXPLAIN QUERY PLAN " + sql).fetchall()[-1][-1]
            started = time.perf_counter()
            for _ in range(10):
                db.execute(sql).fetchall()
            print(f"  {name}: {(time.perf_counter() - started) * 100:.2f} ms  [{plan}]")

    measure(f"with {index}")
    db.execute(f"DROP INDEX {index}")
    db.execute("VACUUM")
    measure("without it")
    shutil.rmtree(os.path.dirname(copy))


if __name__ == "__main__":
    main()
