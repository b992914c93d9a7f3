"""``jaxengine eval --model DIR --data FILE.jsonl --metric exact_match|rewards|loss [--map FIELD=COLUMN ...]``: score a model, print one JSON object.

``exact_match`` reads a ``prompts`` file with an ``answer`` column and compares greedy completions
(prompt rendered with the model's chat template) with the answers, as the ``exact_match`` reward
does (``evaluate.answers_match``); ``loss`` reads an ``sft`` file (or a ``prompts`` file with
answers) and reports the mean token loss on the completions. ``rewards`` scores the greedy completions of a
``prompts`` file with the reward functions of ``--rewards FILE`` (YAML or JSON: the list a GRPO spec gives as
``grpo.rewards``), reporting the mean weighted total and each function's mean. The object
holds ``metric``, ``value``, ``count`` and, for exact match, the first few generations; with ``--by
COLUMN``, ``groups`` holds the figure for each value of that column. ``--map`` reads a field from a
differently named column, as ``validate-data --map`` and a spec's ``data.columns`` do. DIR may be a
quantized serving copy (a run's ``export/quantized/``), scored as the chat serves it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from jaxengine.cli import command_description
from jaxengine.cli.model_dir import CliError, checked_model_dir, run_reporting_errors

if TYPE_CHECKING:
    from jaxengine.data.pipeline import DataError

# What each metric reads, said after a --data file it cannot use.
NEEDS = {"exact_match": "exact_match needs a prompts file with an 'answer' column",
         "rewards": "rewards needs a prompts file (with the columns its reward functions read)",
         "loss": "loss needs an sft file (prompt and completion) or a prompts file with an 'answer' column"}
# The kind whose fields --map may name, as said in a message: loss reads a prompts file too, but its one
# field is an sft field as well.
MAPPED_KIND = {"exact_match": ("prompts", "a prompts file"), "rewards": ("prompts", "a prompts file"),
               "loss": ("sft", "an sft file")}
# The metrics that score greedy completions (and so read --max-new-tokens and --by).
GENERATED = ("exact_match", "rewards")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="score a model on a dataset (exact match, reward functions or loss)",
                                   description=command_description(__doc__))
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="model directory (Hugging Face format), or a quantized serving copy")
    parser.add_argument("--data", required=True, metavar="FILE", help="dataset file (jsonl/json/csv/parquet)")
    parser.add_argument("--metric", required=True, choices=("exact_match", "rewards", "loss"))
    parser.add_argument("--rewards", metavar="FILE", help="rewards: a YAML or JSON file holding the list of reward "
                                                          "functions, as a GRPO spec's grpo.rewards")
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N rows")
    parser.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="exact_match and rewards budget (default 32)")
    parser.add_argument("--max-seq-len", type=int, default=512, metavar="N", help="loss: tokens per row (default 512)")
    parser.add_argument("--by", metavar="COLUMN",
                        help="exact_match, rewards: also the figure for each value of this column (e.g. the demo's task)")
    parser.add_argument("--map", dest="mappings", action="append", default=[], metavar="FIELD=COLUMN",
                        help="read FIELD from COLUMN, e.g. --map prompt=question (repeatable)")
    parser.add_argument("--answer-column", default="answer", metavar="COLUMN",
                        help="the prompts file's column of reference answers, as a reward's answer_column "
                             "(default answer)")
    parser.set_defaults(handler=lambda args: run_reporting_errors("eval", lambda: _eval(args)))


def _columns(args: argparse.Namespace) -> dict[str, str]:
    """The --map flags as a checked field -> column mapping of the kind the metric reads."""
    from jaxengine.cli.validate_data import parse_mappings
    from jaxengine.data import formats

    kind, file_of_kind = MAPPED_KIND[args.metric]
    try:
        columns = parse_mappings(args.mappings)
    except ValueError as error:
        raise CliError(str(error)) from None
    try:
        formats.ColumnMapping(kind=formats.DatasetKind(kind), columns=columns)
    except ValueError as error:
        raise CliError(f"--map: {error} ({args.metric} reads {file_of_kind})") from None
    return columns


def _source():
    """--data, whose problems' advice names eval's flags (--map), not an upload's or a job spec's settings."""
    from jaxengine.data import formats

    return formats.DataSource(entry=formats.Entry.EVAL, key="--data")


def _read_rows(path: str, metric: str, columns: dict[str, str], answer_column: str = "answer") -> list[dict]:
    """The rows ``metric`` scores, each prompts row with its reference under ``answer`` (read from
    ``answer_column``)."""
    from jaxengine.data import formats, pipeline

    if not set(columns) <= set(formats.KIND_FIELDS[formats.DatasetKind.PROMPTS]):
        return _sft_rows(path, columns)  # a completion or messages column was named: an sft file
    try:
        rows = list(pipeline.read_examples(path, kind="prompts", columns=columns, source=_source()))
    except pipeline.DataError as error:
        if metric in GENERATED:
            raise CliError(f"--data {error}; {NEEDS[metric]}") from None
        return _sft_rows(path, columns, prompts_error=error)
    if metric == "rewards":  # each reward function reads its own columns (its answer_column), checked before scoring
        return rows
    unanswered = next((number for number, row in enumerate(rows, 1)
                       if not isinstance(row.get(answer_column), str)), None)
    if unanswered is not None:
        if metric == "exact_match":
            row_columns = ", ".join(sorted(rows[unanswered - 1]))
            needs = ("exact_match needs a prompts file with an 'answer' column in every row, or --answer-column "
                     "naming another" if answer_column == "answer" else
                     f"exact_match needs the reference answers in column '{answer_column}' (--answer-column) of "
                     "every row")
            raise CliError(f"--data {path}: row {unanswered} has no '{answer_column}' string (its columns: "
                           f"{row_columns}); {needs}")
        return _sft_rows(path, columns)
    rows = [{**row, "answer": row[answer_column]} for row in rows]
    return [{**row, "completion": row["answer"]} for row in rows] if metric == "loss" else rows


def _sft_rows(path: str, columns: dict[str, str], prompts_error: DataError | None = None) -> list[dict]:
    """The sft rows of ``path``; ``prompts_error``: the error its reading as prompts stopped at, if it was read so
    first, named instead where that reading got further (the file is prompts rows, one of them bad)."""
    from jaxengine.data import pipeline

    try:
        return list(pipeline.read_examples(path, kind="sft", columns=columns, source=_source()))
    except pipeline.DataError as error:
        further = prompts_error is not None and (prompts_error.row or 0) > (error.row or 0)
        raise CliError(f"--data {prompts_error if further else error}; {NEEDS['loss']}") from None


def _reward_terms(args: argparse.Namespace) -> list:
    """The reward terms of ``--rewards`` (``[]`` for another metric), checked as a spec's ``grpo.rewards``."""
    if args.metric != "rewards":
        if args.rewards is not None:
            raise CliError(f"--rewards is read with --metric rewards only (not {args.metric}); leave it out")
        return []
    if args.rewards is None:
        raise CliError("--metric rewards needs --rewards FILE: a YAML or JSON list of reward functions, as a GRPO "
                       "spec's grpo.rewards, e.g. [{name: contains, args: {keywords: [Paris]}}]")
    if args.answer_column != "answer":
        raise CliError("--answer-column is read by exact_match only; with --metric rewards give each reward function "
                       "its answer_column in its args")
    import yaml

    from jaxengine import evaluate
    from jaxengine.spec import load_yaml

    path = Path(args.rewards)
    try:
        items = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"--rewards {path}: cannot be read ({getattr(error, 'strerror', None) or error})") from None
    except yaml.YAMLError as error:
        raise CliError(f"--rewards {path}: not YAML or JSON ({error})") from None
    terms, problems = evaluate.reward_term_problems(items)
    if problems:
        raise CliError(f"--rewards {path}: " + "; ".join(f"rewards.{key}: {message}" if key else f"rewards: {message}"
                                                         for key, message in problems.items()))
    return terms


def _eval(args: argparse.Namespace) -> int:
    for flag, value in (("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens),
                        ("--max-seq-len", args.max_seq_len)):
        if value is not None and value < 1:
            raise CliError(f"{flag} must be at least 1, got {value}")
    model_dir = checked_model_dir(args.model)
    columns = _columns(args)
    if not Path(args.data).is_file():
        raise CliError(f"--data {args.data}: " + ("is a directory, not a file" if Path(args.data).is_dir()
                                                  else "no such file"))
    if Path(args.data).stat().st_size == 0:
        raise CliError(f"--data {args.data}: the file is empty (0 bytes); {NEEDS[args.metric]}")
    rows = _read_rows(args.data, args.metric, columns, args.answer_column)[: args.limit]
    if not rows:
        raise CliError(f"--data {args.data}: no rows to score; {NEEDS[args.metric]}")
    terms = _reward_terms(args)
    if args.by is not None:
        if args.metric not in GENERATED:
            raise CliError("--by groups exact_match and rewards only; leave it out for --metric loss")
        missing = next((number for number, row in enumerate(rows, 1) if row.get(args.by) is None), None)
        if missing is not None:
            raise CliError(f"--data {args.data}: row {missing} has no '{args.by}' column to group --by")

    from jaxengine import evaluate

    if terms and (problem := evaluate.unscorable_row(terms, rows)):  # before the model is loaded
        raise CliError(f"--data {args.data}: {problem}")
    # A quantized serving copy (export/quantized/) is scored as the chat serves it, as generate reads it;
    # loaded as a plain checkpoint it was refused as one missing its kernels.
    model, tokenizer = evaluate.load_for_scoring(model_dir)
    if args.metric == "exact_match":
        result = evaluate.exact_match(model, tokenizer, rows, max_new_tokens=args.max_new_tokens, by=args.by)
    elif args.metric == "rewards":
        result = evaluate.reward_scores(model, tokenizer, rows, terms, max_new_tokens=args.max_new_tokens, by=args.by)
    else:
        result = evaluate.mean_loss(model, tokenizer, rows, max_seq_len=args.max_seq_len)
    print(json.dumps(result))
    sys.stdout.flush()
    return 0
