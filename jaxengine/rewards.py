"""Reward functions for RL (``task: grpo``): pure, registered by name, one float per completion.

Design note: a reward function is ``fn(completions, references, **args) -> list[float]`` where
``completions`` are the generated texts and ``references`` the dataset rows (``prompt`` and the
reference columns, e.g. ``{"prompt": "...", "answer": "42"}``), one mapping per completion. Functions are registered in ``REWARDS`` by the
name a job spec uses (``grpo.rewards[].name``); their keyword arguments are the spec's ``args``,
checked against the signature when the spec is validated (``check_args``), so a typo in an
argument fails before any work. ``score_rewards`` runs several with weights and never turns an
error into a zero: a function that raises, returns the wrong count or a non-finite value fails
with ``RewardError`` naming the function and the sample index.

This module is pure Python (no jax), so the job spec, and with it the web process, can import it.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import math
import multiprocessing
import pickle
import re
import signal
import threading
import types
import typing
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from jaxengine.words import counted

RewardFn = Callable[..., list[float]]

logger = logging.getLogger(__name__)

REWARDS: dict[str, RewardFn] = {}

# Argument types with a fixed set of values: as Literal annotations, they name their choices in
# ``reward_catalog`` (the launch form's selects) as well as in the code.
Extraction = Literal["full", "last_number", "answer_line", "boxed", "regex"]
LengthUnit = Literal["chars", "words"]
KeywordMode = Literal["all", "any", "fraction"]
NonNumeric = Literal["error", "zero"]
EXTRACTIONS: tuple[str, ...] = typing.get_args(Extraction)

# A number: optional sign (not when glued to a preceding word or digit, so "3-5" ends in 5, not -5),
# digits with optional thousands commas, optional decimals. \d is Unicode-aware (Arabic-Indic,
# full-width digits); float() reads those digits too. U+2212 is the typographic minus sign.
_NUMBER = re.compile(r"(?:(?<![\w.])[-+\u2212])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_ANSWER_LINE = re.compile(r"answer\s*[:：]\s*(.+)", re.IGNORECASE)


class RewardError(RuntimeError):
    """A reward function failed on a sample; the message names the function, the sample index and its prompt."""


# How long one term may take to score one batch. A pure function takes milliseconds; a regular
# expression with nested repetition takes time exponential in the text's length, and Python's re
# cannot be stopped from outside (a run hung in it never reached its cancel check). reward_model,
# which loads and runs a model, has no limit.
#
# On the main thread a SIGALRM timer interrupts the function (re's matching loop checks signals). SIGALRM
# is the main thread's alone, and re holds the GIL, so a thread cannot be interrupted nor even waited on
# with a timeout: off the main thread (a trainer called from a thread, a Celery thread pool), or while
# another timer runs, the term is scored in a helper process (forkserver: forked from a clean process, not
# from this one's JAX threads) that is killed at the limit. Its cost, a fork and the texts' pickling per
# term and batch, is paid only there. A function that cannot be sent to one (defined inside a function) is
# refused there, naming it: scored in place it would run with no limit (a thread cannot be interrupted).
REWARD_TIME_LIMIT_SECONDS = 60.0


class _TimeLimitExpired(BaseException):
    """Raised into a reward function by the timer: a BaseException, so the function's own
    ``except Exception`` does not swallow it."""


def _alarm_usable() -> bool:
    """Whether a SIGALRM timer can limit this thread: the main thread's, with no other timer running."""
    return threading.current_thread() is threading.main_thread() and signal.getitimer(signal.ITIMER_REAL)[0] == 0


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise ``_TimeLimitExpired`` in the block after ``seconds``; only where ``_alarm_usable``."""

    def expire(signum, frame):
        raise _TimeLimitExpired

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register ``fn`` under ``name`` in ``REWARDS``; names are unique."""

    def decorate(fn: RewardFn) -> RewardFn:
        if name in REWARDS:
            raise ValueError(f"reward {name!r} is registered twice ({REWARDS[name].__qualname__}, {fn.__qualname__})")
        REWARDS[name] = fn
        return fn

    return decorate


class RewardArgumentError(ValueError):
    """A keyword argument a reward function cannot take; ``argument`` names it, the message says what
    is allowed (the job spec reports it under ``args.<argument>``)."""

    def __init__(self, argument: str, message: str):
        self.argument = argument
        super().__init__(message)


def check_args(name: str, args: Mapping[str, object]) -> None:
    """Raise ValueError when ``name`` is not registered, or ``RewardArgumentError`` naming the first
    argument of ``args`` that does not fit its signature (unknown, missing, or of the wrong kind)."""
    if name not in REWARDS:
        raise ValueError(f"{name!r} is not a reward function; registered: {', '.join(sorted(REWARDS))}")
    arguments = {argument.name: argument for argument in _describe_function(name).arguments}
    unknown = sorted(set(args) - set(arguments))
    if unknown:
        raise RewardArgumentError(unknown[0], f"unknown {'argument' if len(unknown) == 1 else 'arguments'} "
                                              f"{', '.join(unknown)}; allowed: {', '.join(sorted(arguments)) or 'none'}")
    missing = [key for key, argument in arguments.items() if argument.required and key not in args]
    if missing:
        raise RewardArgumentError(missing[0], f"required {'argument' if len(missing) == 1 else 'arguments'} missing: "
                                              + ", ".join(f"{key} ({_kind_phrase(arguments[key])})" for key in missing))
    for key, value in args.items():
        if not _fits_kind(arguments[key], value):
            raise RewardArgumentError(key, f"{key} must be {_kind_phrase(arguments[key])}, got {value!r}")
        if arguments[key].kind == "number" and isinstance(value, float) and not math.isfinite(value):
            raise RewardArgumentError(key, f"{key} must be a finite number, got {value!r}")


def _fits_kind(argument: RewardArgument, value: object) -> bool:
    if value is None:
        return argument.nullable
    if argument.kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if argument.kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if argument.kind == "boolean":
        return isinstance(value, bool)
    if argument.kind == "choice":
        return isinstance(value, str) and value in argument.choices
    if argument.kind == "text_list":
        return isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value)
    return isinstance(value, str)


def _kind_phrase(argument: RewardArgument) -> str:
    """What an argument takes, in words ("a whole number", "one of chars, words")."""
    if argument.kind == "choice":
        return f"one of {', '.join(argument.choices)}"
    return {"integer": "a whole number", "number": "a number", "boolean": "true or false",
            "text_list": "a list of texts", "text": "a text"}[argument.kind]


def _compiled(pattern: str, *, argument: str = "pattern") -> re.Pattern:
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error as error:
        raise RewardArgumentError(argument, f"{argument} {pattern!r} is not a regular expression ({error})") from None


def _check_extraction(extract: str, pattern: str | None, group: int) -> None:
    """The arguments of ``extract_answer``, checked before any completion is read, so that a spec
    with ``extract: regex`` and no (or a broken) ``pattern``, or a ``group`` the pattern lacks, fails at
    launch, not at the first rollout (or the first completion the pattern matches)."""
    if pattern is not None and extract != "regex":
        # Only regex extraction reads a pattern: with another the reward scored as if none were given.
        raise RewardArgumentError("pattern", f"pattern is read only with extract: regex (extract is {extract!r}); "
                                             "set extract to regex, or remove pattern")
    if extract == "regex":
        if pattern is None:
            raise RewardArgumentError("pattern", "extract 'regex' needs a pattern (a regular expression)")
        groups = _compiled(pattern).groups
        if not 0 <= group <= groups:
            raise RewardArgumentError("group", (
                f"group {group}: pattern {pattern!r} has no group (parentheses); give group 0 for the whole match, "
                "or put the answer in parentheses") if groups == 0 else (
                f"group {group}: pattern {pattern!r} has {groups} group{'s' if groups > 1 else ''}; give a group "
                f"from 0 (the whole match) to {groups}"))


# --------------------------------------------------------------------------------------------
# Extraction and normalisation


def extract_answer(text: str, *, extract: str = "full", pattern: str | None = None, group: int = 1) -> str | None:
    """The final answer inside ``text``, or None when there is none.

    ``full``: the whole text, stripped. ``last_number``: the last number (see ``_NUMBER``).
    ``answer_line``: what follows the last "Answer:" (case-insensitive) up to the end of its line.
    ``boxed``: the content of the last ``\\boxed{...}`` (nested braces allowed). ``regex``: group
    ``group`` of the last match of ``pattern``.
    """
    if extract == "full":
        stripped = text.strip()
        return stripped or None
    if extract == "last_number":
        numbers = _NUMBER.findall(text)
        return numbers[-1] if numbers else None
    if extract == "answer_line":
        matches = _ANSWER_LINE.findall(text)
        return matches[-1].strip() or None if matches else None
    if extract == "boxed":
        return _last_boxed(text)
    if extract == "regex":
        if pattern is None:
            raise ValueError("extract 'regex' needs a pattern")
        matches = list(re.finditer(pattern, text))
        return matches[-1].group(group) if matches else None
    raise ValueError(f"extract {extract!r} is not one of {', '.join(EXTRACTIONS)}")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            if depth == 0:
                return text[begin:index].strip()
            depth -= 1
    return None  # unclosed brace: no answer


def parse_number(text: str | None) -> float | None:
    """The value of a number written with optional sign, thousands commas and Unicode digits; None if not one."""
    if text is None:
        return None
    cleaned = unicodedata.normalize("NFKC", text.strip()).replace("\u2212", "-").replace(",", "")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def normalize_answer(text: str) -> str:
    """Compare-ready form: NFKC, whitespace collapsed, and a number in canonical form ("1,000.0" -> "1000")."""
    text = " ".join(unicodedata.normalize("NFKC", text).split())
    number = parse_number(text)
    if number is not None:
        return str(int(number)) if number.is_integer() else repr(number)
    return text


def _reference(row: Mapping[str, object], column: str, index: int) -> str:
    if column not in row:
        raise KeyError(f"sample {index} has no reference column {column!r}; its columns: {', '.join(row) or 'none'}")
    if row[column] is None:  # str() made it "None", an answer a completion could match
        raise KeyError(f"sample {index}: reference column {column!r} is null; give the row its answer, or leave the "
                       "row out")
    return str(row[column])


def _nonempty_reference(row: Mapping[str, object], column: str, index: int) -> str:
    """The row's reference, which a text comparison needs to hold something: no completion's answer equals
    a blank one, so such a row would score 0 whatever the model wrote."""
    reference = _reference(row, column, index)
    if not reference.strip():
        raise ValueError(f"sample {index}: reference {column}={reference!r} is empty, so no completion can match it")
    return reference


# --------------------------------------------------------------------------------------------
# Reward functions


@register_reward("exact_match")
def exact_match(completions: Sequence[str], references: Sequence[Mapping[str, object]], *,
                answer_column: str = "answer", extract: Extraction = "full", pattern: str | None = None,
                group: int = 1, case_sensitive: bool = True) -> list[float]:
    """1.0 when the answer extracted from the completion equals the reference column after
    ``normalize_answer`` (so "1,000" matches "1000"), else 0.0; no answer found is 0.0."""
    _check_extraction(extract, pattern, group)
    scores = []
    for index, (text, row) in enumerate(zip(completions, references, strict=True)):
        want = normalize_answer(_nonempty_reference(row, answer_column, index))
        found = extract_answer(text, extract=extract, pattern=pattern, group=group)
        if found is None:
            scores.append(0.0)
            continue
        got = normalize_answer(found)
        if not case_sensitive:
            got, want = got.casefold(), want.casefold()
        scores.append(float(got == want))
    return scores


@register_reward("numeric_match")
def numeric_match(completions: Sequence[str], references: Sequence[Mapping[str, object]], *,
                  answer_column: str = "answer", extract: Extraction = "last_number", pattern: str | None = None,
                  group: int = 1, tolerance: float = 1e-6, relative: bool = False) -> list[float]:
    """1.0 when the extracted number is within ``tolerance`` of the reference number (absolute, or
    relative to the reference's magnitude), else 0.0; no number in the completion is 0.0. A reference
    that is not a number is an error (the data, not the completion, is wrong)."""
    if tolerance < 0:
        raise RewardArgumentError("tolerance", f"tolerance must be 0 or more, got {tolerance}")
    _check_extraction(extract, pattern, group)
    scores = []
    for index, (text, row) in enumerate(zip(completions, references, strict=True)):
        want = parse_number(_reference(row, answer_column, index))
        if want is None:
            raise ValueError(f"sample {index}: reference {answer_column}={row[answer_column]!r} is not a number")
        got = parse_number(extract_answer(text, extract=extract, pattern=pattern, group=group))
        if got is None:
            scores.append(0.0)
            continue
        bound = tolerance * max(abs(want), 1e-12) if relative else tolerance
        scores.append(float(abs(got - want) <= bound))
    return scores


@register_reward("numeric_closeness")
def numeric_closeness(completions: Sequence[str], references: Sequence[Mapping[str, object]], *,
                      answer_column: str = "answer", extract: Extraction = "last_number", pattern: str | None = None,
                      group: int = 1, scale: float = 10.0, non_numeric_reference: NonNumeric = "error") -> list[float]:
    """Partial credit for a near miss: exp(-|got - want| / ``scale``) for the extracted number, so 1.0
    when exact and falling off with the distance; no number in the completion is 0.0. Meant as a
    shaping term next to ``exact_match`` (a sparse reward gives most groups no variance at all), with
    exact match kept as the eval metric. A reference that is not a number is an error, or scores 0.0
    with ``non_numeric_reference: zero`` (datasets that mix numeric and other answers)."""
    if not scale > 0:
        raise RewardArgumentError("scale", f"scale must be > 0, got {scale}")
    _check_extraction(extract, pattern, group)
    scores = []
    for index, (text, row) in enumerate(zip(completions, references, strict=True)):
        want = parse_number(_reference(row, answer_column, index))
        if want is None:
            if non_numeric_reference == "zero":
                scores.append(0.0)
                continue
            raise ValueError(f"sample {index}: reference {answer_column}={row[answer_column]!r} is not a number "
                             "(non_numeric_reference: zero scores such rows 0)")
        got = parse_number(extract_answer(text, extract=extract, pattern=pattern, group=group))
        scores.append(0.0 if got is None else math.exp(-abs(got - want) / scale))
    return scores


@register_reward("format_regex")
def format_regex(completions: Sequence[str], references: Sequence[Mapping[str, object]], *,
                 pattern: str, full_match: bool = False) -> list[float]:
    """1.0 when ``pattern`` is found in the completion (``full_match``: matches all of it), else 0.0."""
    compiled = _compiled(pattern)
    match = compiled.fullmatch if full_match else compiled.search
    return [float(match(text) is not None) for text in completions]


def _length(text: str, unit: str) -> int:
    if unit == "chars":
        return len(text)
    if unit == "words":
        return len(text.split())
    raise ValueError(f"unit {unit!r} is not one of chars, words")


@register_reward("length_penalty")
def length_penalty(completions: Sequence[str], references: Sequence[Mapping[str, object]], *,
                   max_length: int, unit: LengthUnit = "chars") -> list[float]:
    """0.0 up to ``max_length``, then -(excess / max_length): longer completions are penalised linearly."""
    if max_length <= 0:
        raise RewardArgumentError("max_length", f"max_length must be positive, got {max_length}")
    return [-max(0, _length(text, unit) - max_length) / max_length for text in completions]


@register_reward("length_target")
def length_target(completions: Sequence[str], references: Sequence[Mapping[str, object]], *,
                  target: int, unit: LengthUnit = "chars") -> list[float]:
    """1 - |length - target| / target, floored at 0: 1.0 exactly at the target length."""
    if target <= 0:
        raise RewardArgumentError("target", f"target must be positive, got {target}")
    return [max(0.0, 1.0 - abs(_length(text, unit) - target) / target) for text in completions]


_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.DOTALL)


@register_reward("valid_json")
def valid_json(completions: Sequence[str], references: Sequence[Mapping[str, object]], *,
               require_object: bool = False, allow_fence: bool = True) -> list[float]:
    """1.0 when the completion (stripped; inside a ```json fence if ``allow_fence``) parses as JSON
    (and is an object when ``require_object``), else 0.0."""
    scores = []
    for text in completions:
        text = text.strip()
        fenced = _FENCE.match(text) if allow_fence else None
        try:
            value = json.loads(fenced.group(1) if fenced else text)
        except ValueError:
            scores.append(0.0)
            continue
        scores.append(float(isinstance(value, dict) or not require_object))
    return scores


def _check_keywords(keywords: Sequence[str]) -> None:
    if not keywords:
        raise RewardArgumentError("keywords", "keywords must name at least one keyword")
    if any(not keyword.strip() for keyword in keywords):
        # "" is in every text, and a blank one in nearly every: the term would score all completions alike.
        raise RewardArgumentError("keywords", "keywords must not hold an empty keyword (one occurs in every "
                                              "completion); remove it")


def _keyword_hits(text: str, keywords: Sequence[str], case_sensitive: bool) -> list[bool]:
    if not case_sensitive:
        text, keywords = text.casefold(), [keyword.casefold() for keyword in keywords]
    return [keyword in text for keyword in keywords]


@register_reward("contains")
def contains(completions: Sequence[str], references: Sequence[Mapping[str, object]], *,
             keywords: Sequence[str], mode: KeywordMode = "all", case_sensitive: bool = False) -> list[float]:
    """``mode`` all: 1.0 when every keyword occurs; any: when at least one does; fraction: the share that do."""
    _check_keywords(keywords)
    reducers = {"all": lambda hits: float(all(hits)), "any": lambda hits: float(any(hits)),
                "fraction": lambda hits: sum(hits) / len(hits)}
    if mode not in reducers:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(reducers)}")
    return [reducers[mode](_keyword_hits(text, keywords, case_sensitive)) for text in completions]


@register_reward("excludes")
def excludes(completions: Sequence[str], references: Sequence[Mapping[str, object]], *,
             keywords: Sequence[str], case_sensitive: bool = False) -> list[float]:
    """1.0 when none of ``keywords`` occurs, else 0.0."""
    _check_keywords(keywords)
    return [float(not any(_keyword_hits(text, keywords, case_sensitive))) for text in completions]


@register_reward("reward_model")
def reward_model(completions: Sequence[str], references: Sequence[Mapping[str, object]], *,
                 model: str, max_seq_len: int = 512, batch_size: int = 16) -> list[float]:
    """The score of a reward model trained with ``task: reward`` (``model``: its run directory or its
    ``export/``) for each row's ``prompt`` followed by the completion."""
    for argument, value in (("max_seq_len", max_seq_len), ("batch_size", batch_size)):
        if value < 1:
            raise RewardArgumentError(argument, f"{argument} must be at least 1, got {value}")
    if not completions:
        return []
    # jax only here: the spec (imported by the web process) checks arguments by scoring nothing.
    from jaxengine.reward_scoring import score_texts

    missing = [index for index, row in enumerate(references) if "prompt" not in row]
    if missing:
        raise KeyError(f"sample {missing[0]} has no 'prompt' for the reward model to read")
    prompts = [row["prompt"] for row in references]
    return score_texts(model, prompts, completions, max_seq_len=max_seq_len, batch_size=batch_size)


# --------------------------------------------------------------------------------------------
# Weighted combination


@dataclass(frozen=True, kw_only=True)
class WeightedReward:
    """One term of the total reward: a registered function, its weight and its keyword arguments.

    ``label`` names its metrics (``rewards/<label>/mean``); it defaults to the function's name.
    """

    name: str
    weight: float = 1.0
    args: Mapping[str, object] | None = None
    label: str | None = None

    @property
    def key(self) -> str:
        return self.label or self.name


def score_rewards(terms: Sequence[WeightedReward], completions: Sequence[str],
                  references: Sequence[Mapping[str, object]]) -> tuple[list[float], dict[str, list[float]]]:
    """(weighted total per completion, each term's own scores by ``key``).

    Raises RewardError naming the function and the sample when a function raises, returns the
    wrong number of scores or a non-finite one.
    """
    if len(completions) != len(references):
        raise ValueError(f"{counted(len(completions), 'completion')} but {counted(len(references), 'reference row')}")
    totals = [0.0] * len(completions)
    by_key: dict[str, list[float]] = {}
    for term in terms:
        scores = _call_reward(term, completions, references)
        by_key[term.key] = scores
        totals = [total + term.weight * score for total, score in zip(totals, scores)]
    return totals, by_key


def reference_answer(terms: Sequence[WeightedReward], row: Mapping[str, object]) -> str | None:
    """The row's reference answer as the reward read it, for the samples log (the samples browser's
    Reference column): the column of the first term whose function takes ``answer_column`` (its
    default when the spec leaves it out), else ``answer``; None when the row has no value there."""
    columns = (_answer_column(term) for term in terms)
    value = row.get(next((column for column in columns if column is not None), "answer"))
    return None if value is None else str(value)


def missing_reference_column(terms: Sequence[WeightedReward], rows: Sequence[Mapping[str, object]]
                             ) -> tuple[str, str, int] | None:
    """(reward name, column, 1-based row) of the first row that lacks a column a term reads its reference
    from (``answer_column``), else None: checked before a run starts, where it otherwise failed mid-step."""
    for term in terms:
        column = _answer_column(term)
        if column is None:
            continue
        for number, row in enumerate(rows, 1):
            if row.get(column) is None:
                return term.name, column, number
    return None


def unscorable_reference(terms: Sequence[WeightedReward], rows: Sequence[Mapping[str, object]]
                         ) -> tuple[str, int, str] | None:
    """(reward name, 1-based row, what is wrong) of the first row a term cannot score whatever the
    completion (numeric_match on a reference that is no number), found by scoring an empty completion
    for every row; None when every row scores. Checked before a run starts, where it otherwise failed the
    step or the evaluation (hours in) that drew the row. ``reward_model`` terms score with a model, so
    they are not run here."""
    for term in terms:
        if term.name == "reward_model":
            continue
        fn, args = REWARDS[term.name], dict(term.args or {})
        try:
            fn([""] * len(rows), rows, **args)
            continue
        except Exception:
            pass
        for number, row in enumerate(rows, 1):
            try:
                fn([""], [row], **args)
            except Exception as error:
                # Scored alone, the row is every function's "sample 0": the row number says which it is.
                return term.name, number, str(error).removeprefix("sample 0: ")
    return None


def _answer_column(term: WeightedReward) -> str | None:
    default = _default_answer_column(term.name)
    if default is None:
        return None
    return str((term.args or {}).get("answer_column", default))


@functools.cache
def _default_answer_column(name: str) -> str | None:
    """The default of reward ``name``'s ``answer_column`` (None: it takes none); asked once per samples
    record, so the signature is read once per function."""
    parameter = inspect.signature(REWARDS[name]).parameters.get("answer_column")
    return None if parameter is None else parameter.default


def _call_reward(term: WeightedReward, completions: Sequence[str],
                 references: Sequence[Mapping[str, object]]) -> list[float]:
    limit = REWARD_TIME_LIMIT_SECONDS
    try:
        if term.name == "reward_model":
            return _score_checked(term, completions, references)
        if _alarm_usable():
            with _time_limit(limit):
                return _score_checked(term, completions, references)
        return _score_in_helper_process(term, completions, references, seconds=limit)
    except _TimeLimitExpired:
        raise RewardError(f"reward {term.name!r} took more than {limit:g} s to score {counted(len(completions), 'completion')}; "
                          "a regular expression with nested repetition, such as (\\w+\\s?)*, takes time exponential "
                          "in a completion's length: simplify its pattern") from None


def unsendable_reward(terms: Sequence[WeightedReward]) -> tuple[int, str] | None:
    """(position in ``terms``, why) of the first term this thread could not score, or None: off the main thread
    (or while another timer runs) each term is scored in a helper process (see ``REWARD_TIME_LIMIT_SECONDS``),
    and a function that cannot be pickled cannot be sent to one. Checked when a job starts, before its model is
    loaded: the first scoring found it, after the model was loaded and the step compiled."""
    if _alarm_usable():
        return None
    for position, term in enumerate(terms):
        if term.name != "reward_model" and (problem := _unsendable(term, seconds=REWARD_TIME_LIMIT_SECONDS)):
            return position, problem
    return None


def _unsendable(term: WeightedReward, *, seconds: float) -> str | None:
    """Why ``term``'s function cannot be sent to a helper process (it cannot be pickled), or None."""
    fn = REWARDS[term.name]
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError):
        return (f"reward {term.name!r}: its function ({fn.__qualname__}) cannot be scored within its {seconds:g} s "
                f"time limit off the main thread ({threading.current_thread().name}): there the limit scores it in a "
                "helper process, and the function cannot be sent to one; define it at the top level of a module, or "
                "run the trainer on the main thread")
    return None


_helper_process_warned = threading.local()  # .done on a thread once it was told (one warning per thread)


def _score_in_helper_process(term: WeightedReward, completions: Sequence[str],
                             references: Sequence[Mapping[str, object]], *, seconds: float) -> list[float]:
    """``_score_checked`` in a helper process killed after ``seconds`` (``_TimeLimitExpired``), for a thread
    that SIGALRM cannot interrupt (see ``REWARD_TIME_LIMIT_SECONDS``). Its RewardError is raised here."""
    fn = REWARDS[term.name]
    if problem := _unsendable(term, seconds=seconds):
        # Scored here it would have no limit at all, which is what a run hung in a regular expression for hours had.
        raise RewardError(problem)
    if not getattr(_helper_process_warned, "done", False):
        _helper_process_warned.done = True
        logger.warning("reward functions are scored off the main thread (%s), where a SIGALRM timer cannot stop "
                       "them: each is scored in a helper process instead, killed after %g s",
                       threading.current_thread().name, seconds)
    context = multiprocessing.get_context("forkserver")
    receiver, sender = context.Pipe(duplex=False)
    sent = WeightedReward(name=term.name, weight=term.weight, args=dict(term.args or {}), label=term.label)
    process = context.Process(target=_score_to_pipe, args=(sender, fn, sent, list(completions),
                                                           [dict(row) for row in references]),
                              name=f"reward-{term.name}", daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(seconds):
            raise _TimeLimitExpired
        scored, outcome = receiver.recv()
    except EOFError:
        process.join()
        raise RewardError(f"reward {term.name!r}: the helper process scoring it ended without a result (exit code "
                          f"{process.exitcode}); it may have run out of memory") from None
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receiver.close()
    if not scored:
        raise outcome
    return outcome


def _score_to_pipe(sender, fn: RewardFn, term: WeightedReward, completions: list[str],
                   references: list[dict]) -> None:
    """The helper process's body: (True, scores) or (False, the RewardError) to ``sender``."""
    REWARDS.setdefault(term.name, fn)  # a function registered at run time is not in a fresh process's registry
    try:
        sender.send((True, _score_checked(term, completions, references)))
    except RewardError as error:
        sender.send((False, RewardError(str(error))))


def _score_checked(term: WeightedReward, completions: Sequence[str],
                   references: Sequence[Mapping[str, object]]) -> list[float]:
    fn = REWARDS[term.name]
    args = dict(term.args or {})
    try:
        scores = fn(completions, references, **args)
    except Exception as batch_error:
        # Find the sample at fault by scoring one at a time; the first failure is reported.
        for index in range(len(completions)):
            try:
                fn(completions[index:index + 1], references[index:index + 1], **args)
            except Exception as error:
                prompt = references[index].get("prompt")
                shown = f"prompt {prompt[:80]!r}, " if isinstance(prompt, str) else ""
                # The batch's own error when it is this one: a message that numbers samples counts them in
                # the batch, where the retry's, scoring one alone, calls every sample 0.
                cause = batch_error if type(batch_error) is type(error) else error
                raise RewardError(f"reward {term.name!r} failed on sample {index} ({shown}"
                                  f"completion {completions[index][:80]!r}): {type(cause).__name__}: {cause}"
                                  ) from error
        raise RewardError(f"reward {term.name!r} failed on the batch: {type(batch_error).__name__}: "
                          f"{batch_error}") from batch_error
    scores = list(scores)
    if len(scores) != len(completions):
        raise RewardError(f"reward {term.name!r} returned {counted(len(scores), 'score')} for "
                          f"{counted(len(completions), 'completion')}")
    for index, score in enumerate(scores):
        if not isinstance(score, (int, float)) or not math.isfinite(score):
            raise RewardError(f"reward {term.name!r} returned {score!r} for sample {index}; rewards must be "
                              "finite numbers")
    return [float(score) for score in scores]


# --------------------------------------------------------------------------------------------
# The registry described for forms (jax-free, so the web process can build its reward widget)


ArgumentKind = Literal["text", "integer", "number", "boolean", "text_list", "choice"]


@dataclass(frozen=True, kw_only=True)
class RewardArgument:
    """One keyword argument of a reward function, as its signature declares it."""

    name: str
    kind: ArgumentKind
    required: bool
    default: Any = None
    nullable: bool = False
    choices: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RewardDescription:
    name: str
    summary: str
    arguments: tuple[RewardArgument, ...]


def _argument_kind(annotation: Any) -> tuple[ArgumentKind, bool, tuple[str, ...]]:
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    nullable = type(None) in members
    if nullable:
        rest = [member for member in members if member is not type(None)]
        annotation = rest[0] if len(rest) == 1 else annotation
    if typing.get_origin(annotation) is Literal:
        return "choice", nullable, tuple(str(choice) for choice in typing.get_args(annotation))
    if typing.get_origin(annotation) in (Sequence, list, tuple):
        return "text_list", nullable, ()
    kinds = {bool: "boolean", int: "integer", float: "number", str: "text"}
    if annotation not in kinds:
        raise TypeError(f"reward argument type {annotation!r} has no form kind; use str, int, float, bool, "
                        "a Literal or Sequence[str]")
    return kinds[annotation], nullable, ()


def _describe_function(name: str) -> RewardDescription:
    fn = REWARDS[name]
    hints = typing.get_type_hints(fn)
    arguments = []
    for key, parameter in inspect.signature(fn).parameters.items():
        if parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        kind, nullable, choices = _argument_kind(hints[key])
        required = parameter.default is inspect.Parameter.empty
        arguments.append(RewardArgument(name=key, kind=kind, required=required, nullable=nullable,
                                        default=None if required else parameter.default, choices=choices))
    summary = " ".join((inspect.getdoc(fn) or name).split("\n\n")[0].split())
    return RewardDescription(name=name, summary=summary, arguments=tuple(arguments))


def reward_catalog() -> tuple[RewardDescription, ...]:
    """Every registered reward function with its keyword arguments (kind, default, choices), by name."""
    return tuple(_describe_function(name) for name in sorted(REWARDS))
