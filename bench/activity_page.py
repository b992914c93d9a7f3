"""Server time of a project's Activity page and ``GET /api/v1/projects/<slug>/activity/`` with a long log.

Builds a throwaway SQLite database (production settings: DEBUG off, WAL) with one project whose log holds
``--entries`` entries by ``--people`` people (one of them rare: ``--rare`` entries) over every kind of object, about
one in ten naming a run that still exists (the rest name objects deleted since), one in ``--deleted-every`` a
deletion (of a run or a dataset: the rare ``?action=deleted``), plus another project's ``--entries`` entries (an index
that does not start with the project would read them too). Then requests, through Django's in-process
test client (middleware, session or token, access check, queries, template), the page's first page, a page deep in
the log (by its cursor), the page filtered to the rare person, to one kind, to the rare action (deleted), to a run's
deletions and to a common person's deletions, and the API's first page, its rare person, its rare action, a run's deletions and a common person's; prints each one's median and 95th percentile wall time over ``--requests`` requests after a warm-up, its
median CPU time and its number of SQL queries.

    .venv/bin/python bench/activity_page.py [--entries 100000] [--people 20] [--rare 30] [--deleted-every 1000]
        [--requests 20]
"""
from __future__ import annotations

import argparse
import datetime
import html
import re
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pages import bench_project, setup_django  # noqa: E402
from bench.runs_pages import timed  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--people", type=int, default=20)
    parser.add_argument("--rare", type=int, default=30, help="entries of the one rare person")
    parser.add_argument("--deleted-every", type=int, default=1000,
                        help="one entry in this many is a deletion (1000: 0.1%% of the log)")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    return parser.parse_args()


def populate(project, *, entries: int, people: int, rare: int, deleted_every: int, runs, prefix: str = "") -> None:
    from django.contrib.auth import get_user_model

    from webapp.activity.models import Activity, TargetKind, Verb

    users = [get_user_model().objects.create_user(f"{prefix}person-{index:02d}", password="unused-password")
             for index in range(people)]
    rare_person = get_user_model().objects.create_user(f"{prefix}rare-person", password="unused-password")
    verbs = [(Verb.RUN_LAUNCHED, TargetKind.RUN), (Verb.RUN_CANCELLED, TargetKind.RUN),
             (Verb.DATASET_VERSION_UPLOADED, TargetKind.DATASET_VERSION), (Verb.CHECKPOINT_DELETED, TargetKind.RUN),
             (Verb.BASE_MODEL_REGISTERED, TargetKind.BASE_MODEL), (Verb.MEMBER_ADDED, TargetKind.MEMBER),
             (Verb.CAMPAIGN_CREATED, TargetKind.CAMPAIGN), (Verb.PIPELINE_LAUNCHED, TargetKind.PIPELINE)]
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    deletions = [(Verb.RUN_DELETED, TargetKind.RUN), (Verb.DATASET_DELETED, TargetKind.DATASET)]
    rare_every = max(1, entries // max(rare, 1))
    rows = []
    for index in range(entries):
        verb, kind = verbs[index % len(verbs)]
        if index % deleted_every == deleted_every // 2:
            verb, kind = deletions[(index // deleted_every) % len(deletions)]
        actor = rare_person if index % rare_every == 0 and rare else users[index % people]
        if kind == TargetKind.RUN and index % 10 == 0:
            run = runs[index % len(runs)]
            target_id, label = run.public_id, run.name
        else:
            target_id, label = f"{kind}_{index:08x}", f"{kind} {index}"
        rows.append(Activity(project=project, actor=actor, actor_name=actor.username, verb=verb, target_kind=kind,
                             target_id=target_id, target_label=label, details={"n": index},
                             created_at=start + datetime.timedelta(seconds=index)))
    created_at = Activity._meta.get_field("created_at")
    created_at.auto_now_add = False  # keep the times given: a log written over ``entries`` seconds
    try:
        Activity.objects.bulk_create(rows, batch_size=5000)
    finally:
        created_at.auto_now_add = True


def main() -> None:
    args = parse_args()
    setup_django(Path(tempfile.mkdtemp(prefix="temper-bench-activity-")))
    from django.db import transaction
    from django.test import Client

    from webapp.activity.models import Activity
    from webapp.api.services import token_create
    from webapp.projects.services import project_create
    from webapp.runs import services as run_services

    owner, project, base_model, version = bench_project()
    spec = {"task": "sft", "model": base_model.public_id, "data": {"train": version.public_id},
            "train": {"max_steps": 1}}
    with transaction.atomic():
        runs = [run_services.run_create(project=project, spec=spec, user=owner, name=f"run {index}")
                for index in range(50)]
        populate(project, entries=args.entries, people=args.people, rare=args.rare,
                 deleted_every=args.deleted_every, runs=runs)
        other = project_create(name="Other", slug="other", owner=owner)
        populate(other, entries=args.entries, people=args.people, rare=args.rare,
                 deleted_every=args.deleted_every, runs=runs, prefix="other-")
    total = Activity.objects.count()
    page = Client()
    page.force_login(owner)
    api = Client(headers={"Authorization": f"Bearer {token_create(user=owner, name='bench')[1]}"})
    first = page.get("/p/bench/activity/")
    assert first.status_code == 200
    second = re.search(r'href="([^"]*cursor=[^"]*)"', first.content.decode())
    assert second, "the first page links no next page"
    deep = html.unescape(second.group(1))
    print(f"{total} entries ({args.entries} in the project, {args.people} people, one with {args.rare}, "
          f"one in {args.deleted_every} a deletion); "
          f"{args.requests} requests each after {args.warmup} warm-up\n")
    print(f"{'request':<44} {'median ms':>10} {'p95 ms':>8} {'cpu ms':>8} {'queries':>8}")
    for name, client, url in (
            ("page, newest", page, "/p/bench/activity/"),
            ("page, the next page (its cursor)", page, deep),
            ("page, the rare person", page, "/p/bench/activity/?actor=rare-person"),
            ("page, kind=member", page, "/p/bench/activity/?kind=member"),
            ("page, action=deleted", page, "/p/bench/activity/?action=deleted"),
            ("page, kind=run&action=deleted", page, "/p/bench/activity/?kind=run&action=deleted"),
            ("page, a common person's deletions", page, "/p/bench/activity/?actor=person-00&action=deleted"),
            ("API, newest 50", api, "/api/v1/projects/bench/activity/"),
            ("API, the rare person", api, "/api/v1/projects/bench/activity/?actor=rare-person"),
            ("API, action=deleted", api, "/api/v1/projects/bench/activity/?action=deleted"),
            ("API, kind=run&action=deleted", api, "/api/v1/projects/bench/activity/?kind=run&action=deleted"),
            ("API, a common person's deletions", api,
             "/api/v1/projects/bench/activity/?actor=person-00&action=deleted")):
        durations, cpu, _size, queries = timed(client, url, requests=args.requests, warmup=args.warmup)
        durations.sort()
        print(f"{name:<44} {statistics.median(durations) * 1e3:>10.1f} "
              f"{durations[int(0.95 * (len(durations) - 1))] * 1e3:>8.1f} {statistics.median(cpu) * 1e3:>8.1f} "
              f"{queries:>8}")


if __name__ == "__main__":
    main()
