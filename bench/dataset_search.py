"""Benchmark: the dataset preview's search (``webapp.datasets.selectors.version_search``) on the demo's data sets.

Each of the demo build's 10,838-row files (``bench/out/demo/data``: sft, preference, prompts; build it with
``make demo`` first) is copied into a throwaway data root as a ready version, then searched for a few texts
(a common one that fills every page, a rare one, one found nowhere), first page and a later one, each
``--repeats`` times. The first search of a version is timed apart: it is the one that builds the search index
(``webapp.datasets.search``), where there is one. No database is used: the version is not saved.

    PYTHONPATH=$PWD .venv/bin/python bench/dataset_search.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO_DATA = ROOT / "bench" / "out" / "demo" / "data"
SEARCHES = (("what is", 1), ("what is", 40), ("sheep", 1), ("no such text", 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    data_root = Path(tempfile.mkdtemp(prefix="temper-search-bench-"))
    os.environ["TEMPER_DATA"] = str(data_root)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from webapp.datasets.models import Dataset, DatasetVersion
    from webapp.datasets.selectors import version_search

    try:
        for name, kind in (("sft", "sft"), ("preference", "preference"), ("prompts", "prompts")):
            stored = data_root / "datasets" / f"{name}.jsonl"
            stored.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(DEMO_DATA / f"{name}.jsonl", stored)
            rows = sum(1 for _ in stored.open("rb"))
            version = DatasetVersion(dataset=Dataset(kind=kind, name=name), number=1, format="jsonl",
                                     file_path=str(stored.relative_to(data_root)), size_bytes=stored.stat().st_size,
                                     row_count=rows, column_mapping={})
            started = time.perf_counter()
            first = version_search(version=version, text="what is", page=1)
            print(f"{name} ({rows} rows): first search {1000 * (time.perf_counter() - started):.0f} ms "
                  f"({first.match_count} matches)")
            for text, page in SEARCHES:
                times = []
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    found = version_search(version=version, text=text, page=page)
                    times.append(1000 * (time.perf_counter() - started))
                print(f"  {text!r} page {page}: median {statistics.median(times):.1f} ms, "
                      f"min {min(times):.1f} ms ({found.match_count} matches, {len(found.rows)} rows shown)")
    finally:
        shutil.rmtree(data_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
