"""Reviewer queue speed: the next item served from a campaign of 100,000 items.

Builds a throwaway SQLite database (production settings: DEBUG off, WAL, as bench/pages.py) with one
campaign of ``--items`` items (prompt and responses of a few hundred characters each), 2 reviews
required per item and ``--reviewers`` reviewers, of which the first ``--reviewed`` items are already
complete (two reviews each, by rotating pairs of reviewers: ``2 * --reviewed`` review rows). Then:

1. first call: each reviewer's first ``queue_next_item`` (their cursor starts at 0 with the first
   ``--reviewed`` items finished);
2. steady state: ``--requests`` rounds of (next item for a reviewer, chosen in turn; then their answer),
   timing ``queue_next_item`` and ``review_submit`` separately;
3. the reviewing page: ``GET /p/<slug>/review/<id>/next/`` through Django's in-process test client (the
   whole server path: session, access check, queue, template), each followed by the answer's POST;
4. the campaign page (progress counts and every agreement figure over all reviews): the first request
   computes the agreement, the next 20 find it cached.

    .venv/bin/python bench/review_queue.py [--items 100000] [--reviewed 60000] [--reviewers 8] [--requests 300]
"""
from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

from pages import measure, setup_django

TEXT = "A response of a realistic length for a preference pair, repeated to a few hundred characters. " * 4


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--reviewed", type=int, default=60_000, help="items already complete")
    parser.add_argument("--reviewers", type=int, default=8)
    parser.add_argument("--requests", type=int, default=300)
    return parser.parse_args()


def populate(*, items: int, reviewed: int, reviewer_count: int):
    from django.contrib.auth import get_user_model

    from webapp.projects.models import Membership, Role
    from webapp.projects.services import project_create
    from webapp.review.models import Campaign, CampaignReviewer, Item, ItemStatus, Review
    from webapp.review.services import shown_first_for

    users = get_user_model().objects
    owner = users.create_user("bench-owner", password="unused-password")
    project = project_create(name="Bench", slug="bench", owner=owner)
    reviewers = [users.create_user(f"reviewer-{index}", password="unused-password") for index in range(reviewer_count)]
    Membership.objects.bulk_create(Membership(project=project, user=user, role=Role.MEMBER) for user in reviewers)
    campaign = Campaign.objects.create(project=project, name="bench", guidelines="Prefer **correct** answers.",
                                       required_reviews=2, next_sequence=items + 1, created_by=owner)
    CampaignReviewer.objects.bulk_create(CampaignReviewer(campaign=campaign, user=user) for user in reviewers)
    started = time.perf_counter()
    for start in range(0, items, 5000):
        batch = [Item(campaign=campaign, sequence=sequence, source="dataset", source_row=sequence,
                      prompt=f"Question {sequence}: {TEXT[:120]}", response_a=f"A{sequence} {TEXT}",
                      response_b=f"B{sequence} {TEXT}", original_label="a",
                      status=ItemStatus.COMPLETE if sequence <= reviewed else ItemStatus.PENDING,
                      review_count=2 if sequence <= reviewed else 0)
                 for sequence in range(start + 1, min(start + 5000, items) + 1)]
        Item.objects.bulk_create(batch)
    item_rows = Item.objects.filter(campaign=campaign, sequence__lte=reviewed).values_list("pk", "public_id", "sequence")
    reviews = []
    for pk, public_id, sequence in item_rows.iterator(chunk_size=5000):
        for user in (reviewers[sequence % reviewer_count], reviewers[(sequence + 1) % reviewer_count]):
            shown_first = shown_first_for(item_public_id=public_id, user_id=user.pk)
            reviews.append(Review(item_id=pk, campaign=campaign, reviewer=user, shown_first=shown_first,
                                  choice="first", label=shown_first))
        if len(reviews) >= 10_000:
            Review.objects.bulk_create(reviews)
            reviews = []
    Review.objects.bulk_create(reviews)
    print(f"populated {items} items and {2 * reviewed} reviews in {time.perf_counter() - started:.0f} s")
    return campaign, reviewers


def summary(label: str, timings_ms: list[float]) -> None:
    ordered = sorted(timings_ms)
    p95 = ordered[max(0, int(0.95 * len(ordered)) - 1)]
    print(f"{label:62} {len(ordered):5d} {statistics.median(ordered):8.2f} {p95:8.2f} {ordered[-1]:8.2f}")


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="temper-bench-review-") as data_root:
        setup_django(Path(data_root))
        from django.db import connection
        from django.test import Client

        from webapp.review import services
        from webapp.review.models import Item

        campaign, reviewers = populate(items=args.items, reviewed=args.reviewed, reviewer_count=args.reviewers)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        print(f"{'what':62} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")

        first_calls = []
        for user in reviewers:
            started = time.perf_counter()
            item = services.queue_next_item(campaign=campaign, user=user)
            first_calls.append((time.perf_counter() - started) * 1000)
            assert item is not None and item.sequence > args.reviewed
        summary(f"first call per reviewer ({args.reviewed} done before)", first_calls)

        next_times, submit_times, served = [], [], set()
        for round_number in range(args.requests):
            user = reviewers[round_number % len(reviewers)]
            started = time.perf_counter()
            item = services.queue_next_item(campaign=campaign, user=user)
            next_times.append((time.perf_counter() - started) * 1000)
            assert (item.pk, user.pk) not in served, "the queue served an item twice to one reviewer"
            served.add((item.pk, user.pk))
            started = time.perf_counter()
            services.review_submit(item=item, user=user, choice="first")
            submit_times.append((time.perf_counter() - started) * 1000)
        summary("queue_next_item (steady state)", next_times)
        summary("review_submit", submit_times)

        page_times = []
        clients = []
        for user in reviewers:
            client = Client()
            client.force_login(user)
            clients.append(client)
        url = f"/p/bench/review/{campaign.public_id}/next/"
        for round_number in range(args.requests):
            client = clients[round_number % len(clients)]
            started = time.perf_counter()
            response = client.get(url)
            page_times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
            # response.context is only filled under Django's test runner; the form names the item.
            item_id = re.search(rb'data-item="([^"]+)"', response.content).group(1).decode()
            assert client.post(url, {"item": item_id, "choice": "second"}).status_code == 302
        summary("GET reviewing page (whole server path)", page_times)
        owner = Client()
        owner.force_login(campaign.created_by)
        detail_url = f"/p/bench/review/{campaign.public_id}/"
        summary(f"GET campaign page, agreement computed ({2 * args.reviewed + 2 * args.requests} reviews)",
                measure(owner, detail_url, requests=1, warmup=0))
        summary("GET campaign page, agreement cached", measure(owner, detail_url, requests=20, warmup=0))
        walk = (Item.objects.filter(campaign=campaign, status="pending", sequence__gt=0).order_by("sequence")
                .values("sequence")[:1])
        sql, params = walk.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            print("plan of the walk:", "; ".join(row[-1] for row in cursor.fetchall()))


if __name__ == "__main__":
    main()
