"""Time of the arena leaderboard (``webapp/chat/leaderboard.py``: Bradley–Terry with bootstrap intervals).

Draws ``--votes`` blind votes among ``--models`` models of known strengths (each vote a random pair; a
tie or "both bad" one time in five, else the winner drawn by the Bradley–Terry odds), then times
``leaderboard(votes)`` (its default 200 bootstrap rounds) ``--repeats`` times and ``win_rates(votes)``
once; prints the median and best seconds, and the top ratings so that two versions can be compared.
The votes are the same for a given ``--seed``, so a before/after pair times the same input.

With ``--page`` it also builds a throwaway SQLite database (production settings, as ``bench/pages.py``)
holding those votes as the voted blind battles of one project (two arena conversations each, with
their answers), and times ``arena.project_leaderboard`` (the query, then the fit) and the leaderboard
page through Django's in-process test client, each ``--repeats`` times after one warm-up request.

    .venv/bin/python bench/leaderboard.py [--votes 10000] [--models 8] [--repeats 5] [--seed 0] [--page]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def drawn_votes(*, votes: int, models: int, seed: int) -> list[tuple[str, str, str]]:
    """(model A, model B, outcome) of each vote."""
    rng = np.random.default_rng(seed)
    strengths = np.exp(rng.normal(0.0, 0.8, models))
    names = [f"model-{index}" for index in range(models)]
    drawn = []
    for _ in range(votes):
        a, b = rng.choice(models, 2, replace=False)
        draw = rng.random()
        if draw < 0.2:
            outcome = "tie" if draw < 0.1 else "both_bad"
        else:
            outcome = "a" if rng.random() < strengths[a] / (strengths[a] + strengths[b]) else "b"
        drawn.append((names[a], names[b], outcome))
    return drawn


def timed(function, repeats: int) -> tuple[list[float], object]:
    seconds, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        seconds.append(time.perf_counter() - started)
    return seconds, result


def print_times(label: str, seconds: list[float]) -> None:
    print(f"{label:<20} median {statistics.median(seconds):.4f} s  best {min(seconds):.4f} s")


def bench_function(drawn, repeats: int) -> None:
    from webapp.chat.leaderboard import Vote, leaderboard, win_rates

    votes = [Vote(model_a=a, model_b=b, outcome=outcome) for a, b, outcome in drawn]
    seconds, board = timed(lambda: leaderboard(votes), repeats)
    print_times("leaderboard", seconds)
    print_times("win_rates", timed(lambda: win_rates(votes), 1)[0])
    for rating in board[:3]:
        print(f"  {rating.model}: {rating.rating:.2f} [{rating.low:.2f}, {rating.high:.2f}] {rating.votes} votes")


def bench_page(drawn, repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="temper-bench-leaderboard-") as data_root:
        os.environ["TEMPER_DATA"] = data_root
        os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings"
        for name in ("DATABASE_URL", "TEMPER_MODELS_ROOT"):
            os.environ.pop(name, None)
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command
        from django.test import Client

        from webapp.chat import arena
        from webapp.chat.models import Battle, Conversation, Message
        from webapp.projects.services import project_create

        call_command("migrate", "--noinput", verbosity=0)
        call_command("collectstatic", "--noinput", verbosity=0)  # the page names its files from the manifest
        owner = get_user_model().objects.create_user("bench-owner", password="unused-password")
        project = project_create(name="Bench", slug="bench", owner=owner)
        sides = Conversation.objects.bulk_create(
            [Conversation(project=project, user=owner, model_ref=model, model_label=f"Base model: {model}", in_arena=True)
             for a, b, _outcome in drawn for model in (a, b)], batch_size=2000)
        Message.objects.bulk_create([Message(conversation=side, role="assistant", content="An answer.") for side in sides],
                                    batch_size=2000)
        Battle.objects.bulk_create(
            [Battle(project=project, user=owner, prompt="A prompt.", side_a=sides[2 * index], side_b=sides[2 * index + 1],
                    outcome=outcome, blind=True) for index, (_a, _b, outcome) in enumerate(drawn)], batch_size=2000)
        print_times("project_leaderboard", timed(lambda: arena.project_leaderboard(project=project), repeats)[0])
        client = Client()
        client.force_login(owner)
        assert client.get("/p/bench/arena/leaderboard/").status_code == 200  # warm-up: templates, caches
        print_times("leaderboard page", timed(lambda: client.get("/p/bench/arena/leaderboard/"), repeats)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--votes", type=int, default=10_000)
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--page", action="store_true", help="also time project_leaderboard and the page over a database")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    drawn = drawn_votes(votes=args.votes, models=args.models, seed=args.seed)
    print(f"{args.votes} votes, {args.models} models, {args.repeats} repeats")
    bench_function(drawn, args.repeats)
    if args.page:
        bench_page(drawn, args.repeats)


if __name__ == "__main__":
    main()
