"""Server time and SQL queries of the pages no other bench measured, as a team's project grows.

Builds a throwaway SQLite database (production settings, as ``bench/pages.py``) holding two projects of the
same make, one ``--small`` times the other's size, and requests each page of both through Django's in-process
test client (the whole server path: middleware, session or token, access check, queries, template). A page
whose query count differs between the two reads rows one at a time (N+1); a page whose time grows with the
project reads more than it shows.

At ``--scale 1`` the large project holds 40 members, 100 base models (30 serving copies), 2,000 runs (one with
200 checkpoints; the compare page of 16 of them), 2,000 chat conversations of the owner, 5,000 voted arena battles among 12 models, and a
review campaign of 3,000 items with 2-3 reviews each (about 3 in 10 left in conflict). Rows that a service per row
would take minutes to write are made in bulk, with what the services derive from them written too: the
items' review counts and statuses from their reviews, the runs' tag and metric-name indexes, the battles'
arena conversations with their answers.

Prints, for each page, the median and 95th percentile wall time and the median CPU time of this process over
``--requests`` requests after a warm-up (SQLite runs in process: the CPU counts the queries' work), and the
query count of one request, of the large project and of the small one; then the time and queries of the review
export (the worker's ``export_write``) of each project's campaign.

    .venv/bin/python bench/pages_at_scale.py [--scale 1] [--small 0.1] [--requests 10]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pages import setup_django  # noqa: E402
from bench.runs_pages import timed  # noqa: E402
from bench.runs_table import write_indexes  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="the large project's size, 1 as described above")
    parser.add_argument("--small", type=float, default=0.1, help="the small project's size against the large one")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--only", default="", help="measure only the pages whose label holds this text")
    return parser.parse_args()


def populate(*, slug: str, scale: float, owner) -> tuple[dict[str, str], str, str]:
    """A project ``slug`` of ``owner`` at ``scale``: its pages by label, an API token's secret and a chat token's."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from tests.webapp.factories import make_base_model, make_ready_version
    from webapp.api.services import token_create
    from webapp.chat.models import Battle, Conversation, Message
    from webapp.chat.tokens import project_token_create
    from webapp.projects import services as project_services
    from webapp.projects.models import Membership, Role
    from webapp.review import services as review_services
    from webapp.review.models import Item, Review
    from webapp.runs.models import Artifact, Run, ServingCopy

    def count(full: int) -> int:
        return max(2, round(full * scale))

    rng = random.Random(slug)
    users = get_user_model().objects
    project = project_services.project_create(name=slug.title(), slug=slug, owner=owner)
    members = users.bulk_create([users.model(username=f"{slug}-member-{index:03d}") for index in range(count(40))])
    Membership.objects.bulk_create([Membership(project=project, user=member, role=Role.MEMBER) for member in members])
    models = [make_base_model(project, name=f"model {index}", path=f"/models/{slug}/{index}", user=owner)
              for index in range(count(100))]
    ServingCopy.objects.bulk_create([ServingCopy(project=project, base_model=model, status="ready")
                                     for model in models[:count(30)]])
    data = make_ready_version(project, name="chats", user=owner)
    prefs = make_ready_version(project, name="prefs", kind="preference", user=owner,
                               rows=[{"prompt": f"p{index}", "chosen": "a", "rejected": "b"}
                                     for index in range(count(3000))])

    runs = Run.objects.bulk_create([Run(
        project=project, name=f"run {index}", task="sft", status="succeeded", created_by=owner,
        spec={"task": "sft", "model": models[index % len(models)].public_id, "data": {"train": data.public_id}},
        resolved_spec={"output_dir": f"/nonexistent/{slug}/{index}"}, base_model=models[index % len(models)],
        total_steps=200, current_step=200, train_seconds=60.0, tags=[f"sweep-{index // 16}"],
        final_metrics={"loss": {"last": rng.random(), "min": 0.5, "max": 3.0, "step": 200}},
    ) for index in range(count(2000))], batch_size=500)
    Run.dataset_versions.through.objects.bulk_create(
        [Run.dataset_versions.through(run_id=run.pk, datasetversion_id=data.pk) for run in runs], batch_size=1000)
    write_indexes(project)
    checkpointed = runs[0]
    Artifact.objects.bulk_create(
        [Artifact(run=checkpointed, kind="checkpoint", step=step, path=f"/nonexistent/{slug}/ckpt/{step}",
                  size_bytes=1) for step in range(1, count(200) + 1)]
        + [Artifact(run=run, kind="model", path=f"/nonexistent/{slug}/{run.pk}/model", size_bytes=1)
           for run in runs[:count(200)]])

    conversations = Conversation.objects.bulk_create([
        Conversation(project=project, user=owner, title=f"chat {index}", model_ref=models[index % len(models)].public_id,
                     model_label=f"Base model: model {index % len(models)}") for index in range(count(2000))],
        batch_size=1000)
    Message.objects.bulk_create([Message(conversation=conversation, role=role, content="Hello there.", has_text=True)
                                 for conversation in conversations for role in ("user", "assistant")], batch_size=2000)
    arena_models = models[:12]
    pairs = [rng.sample(arena_models, 2) for _ in range(count(5000))]
    sides = Conversation.objects.bulk_create([
        Conversation(project=project, user=owner, model_ref=model.public_id, model_label=f"Base model: {model.name}",
                     in_arena=True) for pair in pairs for model in pair], batch_size=2000)
    Message.objects.bulk_create([Message(conversation=side, role=role, content="An answer.", has_text=True)
                                 for side in sides for role in ("user", "assistant")], batch_size=2000)
    now = timezone.now()
    Battle.objects.bulk_create([
        Battle(project=project, user=owner, prompt="A prompt.", side_a=sides[2 * index], side_b=sides[2 * index + 1],
               outcome=rng.choice(["a", "a", "b", "tie", "both_bad"]), voted_at=now) for index in range(len(pairs))],
        batch_size=2000)

    reviewers = members[:10]
    campaign = review_services.campaign_create(project=project, name="Preferences", guidelines="", required_reviews=2,
                                               reviewers=reviewers, source_version=prefs, user=owner)
    campaign = review_services.campaign_load_items(campaign_id=campaign.pk)
    items = list(Item.objects.filter(campaign=campaign).order_by("sequence"))
    reviews, labels_by_item = [], {}
    for item in items:
        labels = ["a", "b"] if item.sequence % 10 == 0 else ["a", rng.choice(["a", "a", "tie"])]
        if item.sequence % 3 == 0:
            labels.append("a")
        for number, label in enumerate(labels):
            reviews.append(Review(item=item, campaign=campaign, reviewer=reviewers[(item.sequence + number) % len(reviewers)],
                                  shown_first="a", choice="first" if label == "a" else label, label=label))
        labels_by_item[item.pk] = labels
    Review.objects.bulk_create(reviews, batch_size=2000)
    for item in items:  # as review_submit leaves each item
        item.review_count = len(labels_by_item[item.pk])
        item.status = review_services.item_status(labels_by_item[item.pk], required=2, resolved_label="")
    Item.objects.bulk_update(items, ["review_count", "status"], batch_size=2000)

    base, review = f"/p/{slug}", f"/p/{slug}/review/{campaign.public_id}"
    pages = {
        "review campaigns": f"{base}/review/",
        "review campaign": f"{review}/",
        "review items": f"{review}/items/",
        "review conflicts": f"{review}/conflicts/",
        "arena": f"{base}/arena/",
        "arena leaderboard": f"{base}/arena/leaderboard/",
        "chat list": f"{base}/chat/",
        "conversation": f"{base}/chat/{conversations[-1].public_id}/",
        "base models": f"{base}/models/",
        "base model": f"{base}/models/{models[0].public_id}/",
        "checkpoints": f"{base}/runs/{checkpointed.public_id}/checkpoints/",
        "compare (16 runs)": f"{base}/runs/compare/?" + "&".join(f"runs={run.public_id}" for run in runs[:count(16)]),
        "members": f"{base}/members/",
        "api runs": f"/api/v1/projects/{slug}/runs/",
        "api datasets": f"/api/v1/projects/{slug}/datasets/",
        "api base models": f"/api/v1/projects/{slug}/base-models/",
        "api pipelines": f"/api/v1/projects/{slug}/pipelines/",
        "/v1/models": "/v1/models",
    }
    _token, chat_secret = project_token_create(user=owner, project=project, name="bench")
    return pages, token_create(user=owner, name=f"bench {slug}")[1], chat_secret


def main() -> None:
    args = parse_args()
    os.environ.setdefault("TEMPER_SECRET_KEY", "bench-pages-at-scale-signing-key-not-for-any-deployment")
    setup_django(Path(tempfile.mkdtemp(prefix="temper-bench-pages-at-scale-")))
    from django.contrib.auth import get_user_model
    from django.test import Client

    from webapp.celery import app

    app.send_task = lambda *a, **k: None  # no broker: what would be queued is not measured here
    owner = get_user_model().objects.create_user("bench-owner", password="unused-password")
    started = time.perf_counter()
    large = populate(slug="large", scale=args.scale, owner=owner)
    small = populate(slug="small", scale=args.scale * args.small, owner=owner)
    print(f"populated the projects at scales {args.scale} and {args.scale * args.small:g} "
          f"in {time.perf_counter() - started:.0f} s")
    browser = Client()
    browser.force_login(owner)
    print(f"{'page':22} {'p50 ms':>8} {'p95 ms':>8} {'cpu ms':>8} {'queries':>7} {'small: queries':>14} {'cpu ms':>8}")
    for label in large[0]:
        if args.only not in label:
            continue
        figures = []
        for pages, api_secret, chat_secret in (large, small):
            secret = chat_secret if label == "/v1/models" else api_secret
            client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}") if pages[label].startswith(("/api/", "/v1/")) \
                else browser
            figures.append(timed(client, pages[label], requests=args.requests, warmup=args.warmup))
        (durations, cpu, _size, queries), (_small_durations, small_cpu, _small_size, small_queries) = figures
        durations.sort()
        p95 = durations[min(len(durations) - 1, int(round(0.95 * (len(durations) - 1))))]
        print(f"{label:22} {1e3 * statistics.median(durations):8.1f} {1e3 * p95:8.1f} {1e3 * statistics.median(cpu):8.1f}"
              f" {queries:7d} {small_queries:14d} {1e3 * statistics.median(small_cpu):8.1f}")
    if args.only in "review export":
        measure_export(owner)


def measure_export(owner) -> None:
    """The review export (``export_write``, the worker's task: the complete items as a preference dataset version) of
    each project's campaign, once: its wall time and queries."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from webapp.review import services
    from webapp.review.models import Campaign

    for slug in ("large", "small"):
        campaign = Campaign.objects.get(project__slug=slug)
        export = services.export_create(campaign=campaign, options=services.ExportOptions(dataset_name="reviewed"),
                                        user=owner)
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            services.export_write(export_id=export.pk)
            seconds = time.perf_counter() - started
        print(f"review export of {slug}'s {campaign.items.count()} items: {1e3 * seconds:.0f} ms, {len(queries)} queries")


if __name__ == "__main__":
    main()
