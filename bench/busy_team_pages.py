"""Queries and server time of every list and detail page of a busy team's project.

Builds a throwaway SQLite database (production settings) holding the project a team reaches in a few months:
20 members, 50 base models and 20 serving copies, 100 datasets of 3 versions, 500 runs of every task and
state (3 metrics of 50 points each, eval samples on 50 of them), 1,000 chat conversations, 300 arena battles,
3 review campaigns of 700 items with 2 reviews each. With ``--series-cache``, each finished run holds the
series_cache a run of 10 metrics over 5,000 steps leaves (about 0.9 MB), each other run its running buckets
(0.7 MB), and each succeeded run an exported model and two checkpoints, as a real project's runs do. Each page
is requested through Django's in-process test client (middleware, session, access check, queries, template);
prints its status, SQL query count and the median of ``--requests`` requests after one warm-up.

    .venv/bin/python bench/busy_team_pages.py [--series-cache] [--requests 5]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from pages import setup_django  # bench/pages.py: a data root, migrations



def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series-cache", action="store_true", help="finished and running runs' series_cache filled")
    parser.add_argument("--requests", type=int, default=5)
    return parser.parse_args()


def populate(*, series_cache: bool) -> tuple[object, dict[str, str], str]:
    from tests.webapp.factories import make_base_model, make_ready_version, make_user
    from webapp.api.services import token_create
    from webapp.chat.models import Battle, Conversation, Message
    from webapp.projects import services as project_services
    from webapp.projects.models import Role
    from webapp.review import services as review_services
    from webapp.review.models import Item, Review
    from webapp.runs import selectors as run_selectors
    from webapp.runs.models import Artifact, MetricPoint, Run, RunStatus, Sample, ServingCopy

    rnd = random.Random(0)
    owner = make_user("owner")
    project = project_services.project_create(name="Busy", slug="busy", owner=owner)
    users = [owner]
    for index in range(19):
        user = make_user(f"member-{index:02d}")
        project_services.membership_add(project=project, user=user, role=Role.MEMBER)
        users.append(user)
    models = [make_base_model(project, name=f"model {index}", path=f"/models/{index}", user=users[index % 20])
              for index in range(50)]
    ServingCopy.objects.bulk_create([ServingCopy(project=project, base_model=models[index], status="ready")
                                     for index in range(20)])
    versions = [make_ready_version(project, name=f"data {index}", user=users[index % 20])
                for index in range(100) for _ in range(3)]
    prefs = make_ready_version(project, name="prefs", kind="preference", user=owner,
                               rows=[{"prompt": f"p{index}", "chosen": "a", "rejected": "b"} for index in range(700)])
    states = [status.value for status in RunStatus]
    runs = Run.objects.bulk_create([Run(
        project=project, name=f"run {index}", task=["sft", "dpo", "grpo", "ppo", "reward"][index % 5],
        spec={"task": "sft", "model": models[index % 50].public_id, "data": {"train": versions[index % 300].public_id}},
        resolved_spec={"output_dir": f"/nonexistent/{index}"}, status=states[index % len(states)],
        created_by=users[index % 20], base_model=models[index % 50], total_steps=200, current_step=200,
        tags=[f"sweep{index // 16}"], final_metrics={"loss": {"last": 1.0, "min": 0.5, "max": 3.0, "step": 200}},
    ) for index in range(500)])
    Run.dataset_versions.through.objects.bulk_create([
        Run.dataset_versions.through(run_id=run.pk, datasetversion_id=versions[index % 300].pk)
        for index, run in enumerate(runs)])
    MetricPoint.objects.bulk_create([
        MetricPoint(run=run, step=step, name=name, value=rnd.random(), wall_time=float(step), tokens=step * 100)
        for run in runs for step in range(1, 201, 4) for name in ("loss", "lr", "grad_norm")], batch_size=5000)
    Sample.objects.bulk_create([Sample(run=run, step=step, position=position, prompt=f"prompt {position}", text="answer")
                                for run in runs[:50] for step in (100, 200) for position in range(8)])
    finished = ("succeeded", "failed", "cancelled")
    if series_cache:
        long_run = runs[-1]
        MetricPoint.objects.filter(run=long_run).delete()
        MetricPoint.objects.bulk_create([
            MetricPoint(run=long_run, step=step, name=f"metric {metric}", value=rnd.random(), wall_time=float(step),
                        tokens=step) for step in range(1, 5001) for metric in range(10)], batch_size=5000)
        Run.objects.filter(pk=long_run.pk).update(current_step=5000, status="succeeded")
        long_run.refresh_from_db()
        cache = run_selectors.series_cache_for(long_run)
        print(f"series_cache of a finished run: {len(json.dumps(cache)) / 1e6:.2f} MB")
        Run.objects.filter(project=project, status__in=finished).update(series_cache=cache)
        Run.objects.filter(project=project).exclude(status__in=finished).update(
            series_cache={"buckets": cache["buckets"]})
        succeeded = list(Run.objects.filter(project=project, status="succeeded"))
        Artifact.objects.bulk_create(
            [Artifact(run=run, kind="model", path=f"/nonexistent/{run.pk}/model", size_bytes=1) for run in succeeded]
            + [Artifact(run=run, kind="checkpoint", step=step, path=f"/nonexistent/{run.pk}/{step}", size_bytes=1)
               for run in succeeded for step in (100, 200)])
    conversations = Conversation.objects.bulk_create([
        Conversation(project=project, user=users[index % 4], title=f"chat {index}",
                     model_ref=models[index % 50].public_id, model_label=f"model {index % 50}") for index in range(1000)])
    Message.objects.bulk_create([Message(conversation=conversation, role=role, content="hello there")
                                 for conversation in conversations for role in ("user", "assistant")])
    sides = Conversation.objects.bulk_create([
        Conversation(project=project, user=users[index // 2 % 20], model_ref=models[index % 10].public_id,
                     model_label="m", in_arena=True) for index in range(600)])
    Battle.objects.bulk_create([
        Battle(project=project, user=users[index % 20], prompt="x", side_a=sides[2 * index], side_b=sides[2 * index + 1],
               outcome=["a", "b", "tie"][index % 3], voted_at=sides[0].created_at) for index in range(300)])
    campaigns = []
    for index in range(3):
        campaign = review_services.campaign_create(project=project, name=f"campaign {index}", guidelines="",
                                                   required_reviews=2, reviewers=users[1:11], source_version=prefs,
                                                   user=owner)
        campaigns.append(review_services.campaign_load_items(campaign_id=campaign.pk))
    Review.objects.bulk_create([
        Review(item=item, campaign=item.campaign, reviewer=reviewer, shown_first="a", choice="first", label="a")
        for number, item in enumerate(Item.objects.filter(campaign__project=project).select_related("campaign"))
        for reviewer in (users[1 + number % 10], users[1 + (number + 1) % 10])], batch_size=5000)
    Run.objects.filter(pk__in=[run.pk for run in runs[:8]]).update(status="succeeded")
    dataset = versions[0].dataset.public_id
    pages = {
        "projects": "/", "project home": "/p/busy/", "runs": "/p/busy/runs/", "run": f"/p/busy/runs/{runs[0].public_id}/",
        "compare 8 runs": "/p/busy/runs/compare/?" + "&".join(f"runs={run.public_id}" for run in runs[:8]),
        "launch form": "/p/busy/runs/new/", "datasets": "/p/busy/datasets/", "dataset": f"/p/busy/datasets/{dataset}/",
        "dataset version": f"/p/busy/datasets/{dataset}/v/1/", "models": "/p/busy/models/",
        "model": f"/p/busy/models/{models[0].public_id}/", "chat list": "/p/busy/chat/",
        "conversation": f"/p/busy/chat/{conversations[0].public_id}/", "arena": "/p/busy/arena/",
        "leaderboard": "/p/busy/arena/leaderboard/", "review campaigns": "/p/busy/review/",
        "review campaign": f"/p/busy/review/{campaigns[0].public_id}/",
        "review items": f"/p/busy/review/{campaigns[0].public_id}/items/", "workers": "/workers/",
        "members": "/p/busy/members/",
        "api runs": "/api/v1/projects/busy/runs/", "api datasets": "/api/v1/projects/busy/datasets/",
        "api base models": "/api/v1/projects/busy/base-models/", "api pipelines": "/api/v1/projects/busy/pipelines/",
        "api run": f"/api/v1/projects/busy/runs/{runs[0].public_id}/",
    }
    return owner, pages, token_create(user=owner, name="bench")[1]


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="temper-bench-busy-") as data_root:
        os.environ.setdefault("TEMPER_SECRET_KEY", "bench-busy-team-pages-signing-key-not-for-any-deployment")
        setup_django(Path(data_root))
        from webapp.celery import app as celery_app

        celery_app.send_task = lambda *args, **kwargs: None  # no broker: what would be queued is not the point here
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        owner, pages, secret = populate(series_cache=args.series_cache)
        browser, api = Client(), Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
        browser.force_login(owner)
        print(f"| page | status | queries | median ms of {args.requests} |\n| --- | --- | --- | --- |")
        for label, url in pages.items():
            client = api if url.startswith("/api/") else browser
            client.get(url)  # warm-up
            timings = []
            for _ in range(args.requests):
                with CaptureQueriesContext(connection) as queries:
                    started = time.perf_counter()
                    response = client.get(url)
                    timings.append((time.perf_counter() - started) * 1000)
            print(f"| {label} | {response.status_code} | {len(queries)} | {statistics.median(timings):.0f} |")


if __name__ == "__main__":
    main()
