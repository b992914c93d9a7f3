"""What the low-disk banner (``webapp.core.disk_free``, asked by base.html on every signed-in page) costs a page load.

Builds a throwaway data directory and SQLite database (production settings) with the page benchmarks' project, then
times its overview page (``/p/bench/``) through Django's in-process test client, in rounds that alternate four ways:
the banner turned off (``TEMPER_DISK_WARN_FREE_BYTES=0``: no ``statvfs``, as before the banner), on with the free
space kept ``KEPT_SECONDS`` per process (the default), on with ``statvfs`` asked on every request (``KEPT_SECONDS``
0), and shown (a threshold above the disk's free space, its 5 % cap lifted). Prints each way's median and 95th percentile wall time, and
``low_filesystems()`` alone, kept and not.

    .venv/bin/python bench/disk_banner.py [--requests 200] [--rounds 5]
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests of each way, over all rounds")
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    setup_django(Path(tempfile.mkdtemp(prefix="temper-bench-disk-")))
    from django.conf import settings
    from django.test import Client

    from webapp.core import disk_free

    owner, project, _model, _version = bench_project()
    client = Client()
    client.force_login(owner)
    url = f"/p/{project.slug}/"
    kept_seconds = disk_free.KEPT_SECONDS
    ways = {"banner off (no statvfs, as before)": (0, kept_seconds),
            f"on, free space kept {kept_seconds:g} s": (5 * 1024**3, kept_seconds),
            "on, statvfs every request": (5 * 1024**3, 0.0),
            "shown (threshold above the free space)": (10**18, kept_seconds)}
    durations = {way: [] for way in ways}
    for _ in range(args.rounds):
        for way, (threshold, kept) in ways.items():
            settings.TEMPER_DISK_WARN_FREE_BYTES, disk_free.KEPT_SECONDS = threshold, kept
            disk_free.WARN_FRACTION = 1.0 if threshold == 10**18 else 0.05
            disk_free.forget_kept()
            for _ in range(3):  # warm-up
                assert client.get(url).status_code == 200
            for _ in range(args.requests // args.rounds):
                started = time.perf_counter()
                page = client.get(url).content
                durations[way].append(time.perf_counter() - started)
            assert (b'id="disk-low"' in page) == (threshold == 10**18), way
    for way, times in durations.items():
        times.sort()
        print(f"{way}: median {statistics.median(times) * 1000:.2f} ms, "
              f"p95 {times[max(0, round(0.95 * len(times)) - 1)] * 1000:.2f} ms ({len(times)} requests)")
    settings.TEMPER_DISK_WARN_FREE_BYTES, disk_free.WARN_FRACTION = 5 * 1024**3, 0.05
    for kept in (kept_seconds, 0.0):
        disk_free.KEPT_SECONDS = kept
        disk_free.forget_kept()
        started = time.perf_counter()
        for _ in range(10_000):
            disk_free.low_filesystems()
        print(f"low_filesystems(), KEPT_SECONDS {kept:g}: {(time.perf_counter() - started) / 10_000 * 1e6:.1f} µs")


if __name__ == "__main__":
    main()
