"""A deterministic synthetic corpus of small verifiable tasks, for the demo model and its datasets.

Design note: nothing may be downloaded, yet the platform needs a model that can visibly learn.
Each task below yields (prompt, answer) problems whose answers a program can check, so SFT, DPO
and GRPO on the demo all have an honest exact-match metric. A problem belongs to the held-out
split when the CRC32 of its prompt falls in the last tenth, which fixes the split independently
of generation order and seed; the pre-training text, SFT, preference and prompts datasets use
only the training split, and ``eval.jsonl`` only the held-out one.

Every random choice goes through one ``random.Random(seed)``, so the same seed gives the same
files byte for byte.
"""
from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

WORDS = (
    "apple banana cherry grape lemon mango melon peach pear plum berry olive onion carrot potato tomato "
    "garden forest river ocean island desert valley mountain meadow canyon harbor bridge castle tower "
    "window door table chair pencil paper letter number planet rocket engine wheel anchor button candle "
    "silver golden purple orange yellow green black white brown violet winter summer spring autumn "
    "morning evening thunder rainbow shadow mirror puzzle riddle secret signal bottle basket blanket "
    "jacket pocket ladder hammer needle kettle violin guitar piano trumpet dragon tiger rabbit turtle "
    "falcon parrot dolphin whale spider beetle monkey zebra camel horse sheep goat mouse lizard"
).split()

DIGITS_PER_LIST = 4

EVAL_FRACTION_PER_MILLE = 100

# The teacher of ``sft_teacher.jsonl`` gives the reference answer in this share of its demonstrations
# and the problem's plausible wrong answer in the rest (see ``teacher_completion``).
TEACHER_RIGHT_PER_MILLE = 400


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One verifiable task instance: ``answer`` is the exact expected completion."""

    task: str
    prompt: str
    answer: str
    wrong: str  # a plausible wrong answer (the rejected side of preference pairs)

    @property
    def held_out(self) -> bool:
        return zlib.crc32(self.prompt.encode()) % 1000 < EVAL_FRACTION_PER_MILLE


def teacher_completion(problem: Problem) -> str:
    """What an imperfect teacher demonstrates for ``problem``: the reference answer for 40 % of the
    prompts, its typical mistake (``problem.wrong``: the other extreme, 4 minus the count, off by one)
    for the rest, chosen by the prompt's CRC32 so that the choice is fixed whatever the seed and order.

    Why: SFT imitates its demonstrations, mistakes included, so after the demo SFT on these answers
    its greedy answer is the mistake while the right answer keeps part of its samples. A verifiable
    reward (the ``answer`` column of ``prompts.jsonl``) can then move the greedy answer, which is
    what RL from verifiable rewards is for (bench/RESULTS.md, "RL proof from the teacher's
    demonstrations": on the tiny demo model mostly to the best constant of a kind, reading on one
    build). On the clean ``sft.jsonl`` the tiny model learns the kinds in sudden turns at
    build-dependent steps, and RL's gain depended on catching one (bench/RESULTS.md, "RL proof from a fresh build: not reproduced")."""
    right = zlib.crc32(f"teacher:{problem.prompt}".encode()) % 1000 < TEACHER_RIGHT_PER_MILLE
    return problem.answer if right else problem.wrong


def _digits(rng: random.Random) -> list[int]:
    return [rng.randint(0, 9) for _ in range(DIGITS_PER_LIST)]


def _spelled(digits: list[int]) -> str:
    return " ".join(map(str, digits))


def _extreme_digit(rng: random.Random, *, task: str, pick: Callable[[list[int]], int],
                   other: Callable[[list[int]], int]) -> Problem:
    """The ``pick`` (max or min) digit of a list; the wrong answer is the ``other`` extreme, or the next digit."""
    digits = _digits(rng)
    answer = pick(digits)
    wrong = other(digits) if other(digits) != answer else (answer + 1) % 10
    return Problem(task=task, prompt=f"What is the {task} digit in {_spelled(digits)}?", answer=str(answer),
                   wrong=str(wrong))


def _largest_digit(rng: random.Random) -> Problem:
    return _extreme_digit(rng, task="largest", pick=max, other=min)


def _smallest_digit(rng: random.Random) -> Problem:
    return _extreme_digit(rng, task="smallest", pick=min, other=max)


def _even_count(rng: random.Random) -> Problem:
    digits = _digits(rng)
    count = sum(digit % 2 == 0 for digit in digits)
    return Problem(task="even", prompt=f"How many even digits are in {_spelled(digits)}?", answer=str(count),
                   wrong=str(DIGITS_PER_LIST - count if DIGITS_PER_LIST - count != count else count + 1))


def _sum_of_three(rng: random.Random) -> Problem:
    a, b, c = rng.randint(0, 9), rng.randint(0, 9), rng.randint(0, 9)
    total = a + b + c
    return Problem(task="add", prompt=f"What is {a} + {b} + {c}?", answer=str(total),
                   wrong=str(total + rng.choice([-2, -1, 1, 2]) if total > 1 else total + 1))


def _count_letter(rng: random.Random) -> Problem:
    word = rng.choice(WORDS)
    letter = rng.choice(sorted(set(word)))
    count = word.count(letter)
    return Problem(task="count", prompt=f"How many times does {letter} appear in {word}?", answer=str(count),
                   wrong=str(count + 1))


# Every task is answerable from which tokens the prompt holds, not from their order (max, min, a count,
# a sum), with a one- or two-token answer: the kind of skill the few-million-parameter demo model picks
# up within its pre-training and SFT budget, partly, so that sampled answers vary in correctness and
# RL has something to sharpen. Order-dependent skills (comparing or copying multi-digit numbers) stayed
# at a constant answer per task after 300 pre-training and 1,500 SFT steps (bench/RESULTS.md).
TASKS: dict[str, Callable[[random.Random], Problem]] = {
    "largest": _largest_digit,
    "smallest": _smallest_digit,
    "even": _even_count,
    "add": _sum_of_three,
    "count": _count_letter,
}


def generate_problems(*, seed: int, count: int) -> list[Problem]:
    """``count`` distinct problems cycling through the tasks (duplicates of a prompt are skipped)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    problems: list[Problem] = []
    names = list(TASKS)
    attempts = 0
    while len(problems) < count and attempts < count * 50:
        problem = TASKS[names[attempts % len(names)]](rng)
        attempts += 1
        if problem.prompt not in seen:
            seen.add(problem.prompt)
            problems.append(problem)
    return problems


def pretrain_text(problem: Problem, rng: random.Random) -> str:
    """A plain-text statement of a solved problem, in one of a few phrasings."""
    phrasings = [
        f"Question: {problem.prompt}\nAnswer: {problem.answer}",
        f"Q: {problem.prompt} A: {problem.answer}",
        f"{problem.prompt} The answer is {problem.answer}.",
    ]
    return rng.choice(phrasings)


def pretrain_documents(problems: list[Problem], *, seed: int, per_document: int = 8) -> Iterator[str]:
    """Documents of ``per_document`` solved training problems each (held-out problems never appear)."""
    rng = random.Random(seed)
    training = [problem for problem in problems if not problem.held_out]
    for start in range(0, len(training), per_document):
        yield "\n".join(pretrain_text(problem, rng) for problem in training[start : start + per_document])


def dataset_rows(problems: list[Problem], *, max_eval: int = 500) -> dict[str, list[dict]]:
    """The demo datasets: ``sft``, ``sft_teacher`` (an imperfect teacher's answers, ``teacher_completion``),
    ``preference``, ``prompts`` (training split) and ``eval`` (held out, at most ``max_eval`` rows so
    that a greedy exact-match pass stays quick on CPU)."""
    training = [problem for problem in problems if not problem.held_out]
    held_out = [problem for problem in problems if problem.held_out][:max_eval]
    return {
        "sft": [{"prompt": p.prompt, "completion": p.answer} for p in training],
        "sft_teacher": [{"prompt": p.prompt, "completion": teacher_completion(p)} for p in training],
        "preference": [{"prompt": p.prompt, "chosen": p.answer, "rejected": p.wrong} for p in training],
        "prompts": [{"prompt": p.prompt, "answer": p.answer, "task": p.task} for p in training],
        "eval": [{"prompt": p.prompt, "answer": p.answer, "task": p.task} for p in held_out],
    }


def write_datasets(rows: dict[str, list[dict]], data_dir: str | Path) -> dict[str, Path]:
    """Write each dataset as ``<data_dir>/<name>.jsonl`` (one JSON object per line); returns the paths."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, dataset in rows.items():
        paths[name] = data_dir / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in dataset), encoding="utf-8")
    return paths
