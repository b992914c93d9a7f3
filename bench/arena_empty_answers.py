"""Time of the arena page's decisive vote count (``webapp.chat.arena.decisive_votes``) as the arena grows.

Builds a throwaway SQLite database (production settings, as ``bench/leaderboard.py``) holding one project with
``--battles`` voted battles (two arena conversations each, a user turn and an answer: 10,000 battles are 20,000 arena
answers), one answer in ``--empty-every`` empty (each message recording whether it has text, as the services write
it), then times ``decisive_votes`` and the query that finds the empty
answers' conversations alone, ``--repeats`` times each after a warm-up; prints the median and best milliseconds of
wall and CPU time (SQLite runs in process: the CPU counts the queries' work).

    .venv/bin/python bench/arena_empty_answers.py [--battles 10000] [--empty-every 500] [--repeats 20]
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

from bench.pages import setup_django  # noqa: E402


def timed(function, repeats: int) -> tuple[list[float], list[float]]:
    function()  # warm-up: the connection, the query compiler
    wall, cpu = [], []
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        function()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return wall, cpu


def print_times(label: str, wall: list[float], cpu: list[float]) -> None:
    print(f"{label:<28} wall median {1e3 * statistics.median(wall):7.1f} ms  best {1e3 * min(wall):7.1f} ms  "
          f"cpu median {1e3 * statistics.median(cpu):7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--battles", type=int, default=10_000)
    parser.add_argument("--empty-every", type=int, default=500, help="one answer in this many is empty")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="temper-bench-arena-empty-") as data_root:
        setup_django(Path(data_root))
        from django.contrib.auth import get_user_model

        from webapp.chat import arena
        from webapp.chat.models import Battle, Conversation, Message
        from webapp.chat.services import has_text
        from webapp.projects.services import project_create

        owner = get_user_model().objects.create_user("bench-owner", password="unused-password")
        project = project_create(name="Bench", slug="bench", owner=owner)
        sides = Conversation.objects.bulk_create(
            [Conversation(project=project, user=owner, model_ref=f"model-{index % 8}", in_arena=True)
             for index in range(2 * args.battles)], batch_size=2000)
        texts = [(side, role, " \n" if role == "assistant" and index % args.empty_every == 0
                  else "An answer, of a few words as answers go.")
                 for index, side in enumerate(sides) for role in ("user", "assistant")]
        Message.objects.bulk_create([Message(conversation=side, role=role, content=text, has_text=has_text(text))
                                     for side, role, text in texts], batch_size=2000)
        Battle.objects.bulk_create(
            [Battle(project=project, user=owner, prompt="A prompt.", side_a=sides[2 * index], side_b=sides[2 * index + 1],
                    outcome=("a", "b", "tie", "both_bad")[index % 4], blind=True) for index in range(args.battles)],
            batch_size=2000)
        votes = arena.decisive_votes(project=project)
        print(f"{args.battles} battles, {2 * args.battles} arena answers; decisive votes: {votes.pairs} pairs, "
              f"{votes.left_out} left out")
        print_times("empty answers' conversations",
                    *timed(lambda: list(arena.empty_answer_conversations()), args.repeats))
        print_times("decisive_votes", *timed(lambda: arena.decisive_votes(project=project), args.repeats))


if __name__ == "__main__":
    main()
