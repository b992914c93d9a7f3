"""Scoring a model directory on a dataset: greedy exact match on ``prompts`` rows, the reward functions
of ``jaxengine.rewards`` on the same greedy completions, or mean token loss.

Used by ``jaxengine eval``, an SFT run's ``eval/exact_match``, the web app's evaluations and the benchmarks.
Prompts are rendered by ``encode_prompt``, exactly as SFT rendered them in training. A generation matches its
row's ``answer`` as the ``exact_match`` reward compares them (``answers_match``), so that a model gets the
same figure from ``jaxengine eval`` as from the reward that scored the same completions in training; and
``reward_scores`` scores with a GRPO/PPO run's own reward terms (``grpo.rewards``), so that a base model, an
SFT run and an RL checkpoint are compared by what the RL run optimised.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from jaxengine import rewards


def load_for_scoring(model_dir):
    """``(model, tokenizer)`` of a model directory as ``jaxengine eval`` and the web app's evaluations score it:
    in float32, a quantized serving copy (a run's ``export/quantized/``) as the chat serves it."""
    import jax.numpy as jnp

    from jaxengine.serving import load_serving_weights
    from jaxengine.tokenizer import load_tokenizer

    return load_serving_weights(model_dir, compute_dtype=jnp.float32), load_tokenizer(model_dir)


def exact_match(model, tokenizer, rows: Sequence[dict], *, max_new_tokens: int = 32, batch_size: int = 64,
                by: str | None = None) -> dict[str, Any]:
    """``score_exact_match`` of the greedy completions of ``rows`` (each with ``prompt`` and ``answer``)."""
    texts = greedy_completions(model, tokenizer, rows, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return score_exact_match(texts, rows, by=by)


def greedy_completions(model, tokenizer, rows: Sequence[dict], *, max_new_tokens: int, batch_size: int = 64
                       ) -> list[str]:
    """The greedy completion of each row's ``prompt`` (``greedy_prompt``), ``batch_size`` at a time."""
    from jaxengine.models.transformer import inference_layout
    from jaxengine.sampler import Sampler

    sampler = Sampler(inference_layout(model), tokenizer)
    params = greedy_params(max_new_tokens)
    texts: list[str] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        texts += [g.text for g in sampler.generate([greedy_prompt(tokenizer, row) for row in chunk], params)]
    return texts


def greedy_prompt(tokenizer, row: Mapping[str, Any]) -> list[int]:
    """The token ids a row's ``prompt`` is completed from: rendered as SFT rendered it in training. The web app's
    evaluations, generating through the serve worker's batching server, render theirs by this too, so that their
    figure is ``jaxengine eval``'s."""
    from jaxengine.data.pipeline import encode_prompt

    return encode_prompt(tokenizer, row["prompt"])


def greedy_params(max_new_tokens: int):
    """The ``SamplingParams`` of every scored completion: greedy (the seed unread, fixed all the same)."""
    from jaxengine.sampler import SamplingParams

    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, seed=0)


def reward_term_problems(items: Any) -> tuple[list[rewards.WeightedReward], dict[str, str]]:
    """A list of reward terms written as a spec's ``grpo.rewards`` (``{name, weight, args}`` each), checked as the
    spec checks them (``spec.RewardTermSpec``: a registered function, arguments that fit it), each function
    once: (the terms, {} ) or ([], problems by key: ``""`` for the list, ``"<index>.<key>"`` for a term's, e.g.
    ``"0.args.pattern"``)."""
    from pydantic import ValidationError

    from jaxengine.spec import RewardTermSpec

    if not isinstance(items, (list, tuple)) or not items:
        return [], {"": "give a list of reward functions, each {name, weight, args}, e.g. [{name: exact_match}]"}
    terms, problems = [], {}
    for index, item in enumerate(items):
        try:
            term = RewardTermSpec.model_validate(item)
        except ValidationError as error:
            problems.update(_term_problem(index, error))
            continue
        terms.append(rewards.WeightedReward(name=term.name, weight=term.weight, args=dict(term.args)))
    names = [term.name for term in terms]
    if not problems and len(set(names)) != len(names):
        repeated = next(name for name in names if names.count(name) > 1)
        problems[""] = f"{repeated} is given twice; give each reward function once, with its weight"
    return ([], problems) if problems else (terms, {})


def _term_problem(index: int, error) -> dict[str, str]:
    """The first problem of a term's ``RewardTermSpec`` error under ``"<index>.<key>"``: the spec's own validator
    says ``"args.<argument>: ..."`` in its message, a field's error names it in its location."""
    first = error.errors(include_url=False)[0]
    message = {"extra_forbidden": "unknown key; a reward term has name, weight and args",
               "model_type": "give a mapping {name, weight, args}"}.get(first["type"],
                                                                        str(first["msg"]).removeprefix("Value error, "))
    location = ".".join(str(part) for part in first["loc"])
    if not location:
        key, separator, rest = message.partition(": ")
        if separator and key.replace(".", "").replace("_", "").isalnum():
            location, message = key, rest
    return {f"{index}.{location}" if location else str(index): message}


def unscorable_row(terms: Sequence[rewards.WeightedReward], rows: Sequence[Mapping[str, object]]) -> str | None:
    """Why a row of ``rows`` cannot be scored by ``terms`` whatever the completion (its reference column missing,
    or one the function cannot read), naming the row and the function; None when every row can be."""
    if missing := rewards.missing_reference_column(terms, rows):
        name, column, number = missing
        return (f"row {number} has no '{column}' value, where {name} reads the reference answer (its "
                "answer_column); give the column that holds the answers, or other data")
    if unscorable := rewards.unscorable_reference(terms, rows):
        name, number, problem = unscorable
        return f"{name} cannot score row {number}: {problem}; correct the row, or give another answer_column"
    return None


def reward_scores(model, tokenizer, rows: Sequence[dict], terms: Sequence[rewards.WeightedReward], *,
                  max_new_tokens: int, by: str | None = None, batch_size: int = 64) -> dict[str, Any]:
    """``score_reward_terms`` of the greedy completions of ``rows`` (as ``exact_match`` generates them) by
    ``terms``. A row no term can score is refused (ValueError naming it) before anything is generated: found
    after, it cost the whole generation."""
    if problem := unscorable_row(terms, rows):
        raise ValueError(problem)
    texts = greedy_completions(model, tokenizer, rows, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return score_reward_terms(texts, rows, terms, by=by)


def score_reward_terms(texts: Sequence[str], rows: Sequence[dict], terms: Sequence[rewards.WeightedReward], *,
                       by: str | None = None) -> dict[str, Any]:
    """The mean weighted total of ``terms`` over the completions ``texts`` of ``rows`` (``value``), each term's own
    mean (``terms``, by function name, unweighted), the count, and the first five completions with their scores
    (``examples``). With ``by``, ``groups`` gives the mean total, count and term means for each of its values."""
    totals, by_term = rewards.score_rewards(terms, texts, rows)
    result: dict[str, Any] = {
        "metric": "rewards", "value": sum(totals) / max(len(totals), 1), "count": len(totals),
        "terms": {name: sum(scores) / max(len(scores), 1) for name, scores in by_term.items()},
        "examples": [{"prompt": row["prompt"], "answer": rewards.reference_answer(terms, row) or "", "text": text,
                      "total": totals[index], "scores": {name: scores[index] for name, scores in by_term.items()}}
                     for index, (row, text) in enumerate(list(zip(rows, texts))[:5])]}
    if by is not None:
        labels = [str(row[by]) for row in rows]
        groups = mean_by(totals, labels)
        for name, scores in by_term.items():
            for label, group in mean_by(scores, labels).items():
                groups[label].setdefault("terms", {})[name] = group["value"]
        result["by"] = by
        result["groups"] = groups
    return result


def score_exact_match(texts: Sequence[str], rows: Sequence[dict], *, by: str | None = None) -> dict[str, Any]:
    """The fraction of ``rows`` whose completion in ``texts`` matches the answer (``answers_match``), the
    count, and the first five completions as ``examples``.

    With ``by`` (a column every row has, e.g. the demo's ``task``), ``groups`` also gives the fraction
    and count for each of its values: one figure hides which kinds of prompt a model reads."""
    matches = answers_match(texts, rows)
    result = {"metric": "exact_match", "value": sum(matches) / max(len(matches), 1), "count": len(matches),
              "examples": [{"prompt": row["prompt"], "answer": row["answer"], "text": text}
                           for row, text in list(zip(rows, texts))[:5]]}
    if by is not None:
        result["by"] = by
        result["groups"] = mean_by(matches, [str(row[by]) for row in rows])
    return result


def answers_match(texts: Sequence[str], rows: Sequence[dict]) -> list[bool]:
    """Whether each completion is its row's ``answer``, compared by the ``exact_match`` reward on the whole
    text: NFKC, whitespace collapsed, numbers canonical ("1,000" is "1000"); a blank completion is no answer,
    and a blank reference is matched by none (the reward refuses one: an RL run cannot learn from it)."""
    answerable = [index for index, row in enumerate(rows) if str(row["answer"]).strip()]
    scores = rewards.exact_match([texts[index] for index in answerable], [rows[index] for index in answerable],
                                 extract="full")
    matches = [False] * len(rows)
    for index, score in zip(answerable, scores, strict=True):
        matches[index] = score == 1.0
    return matches


def mean_by(values: Sequence[float], keys: Sequence[str]) -> dict[str, dict[str, float | int]]:
    """``{key: {"value": mean of its values, "count": rows}}`` over the rows sharing each key, keys
    sorted (with booleans, the value is the fraction that are true)."""
    groups: dict[str, list[float]] = {}
    for key, value in zip(keys, values, strict=True):
        groups.setdefault(key, []).append(float(value))
    return {key: {"value": sum(group) / len(group), "count": len(group)} for key, group in sorted(groups.items())}


MAX_EVAL_GROUPS = 32
_GROUP_LABEL = re.compile(r"[\w.+-]{1,40}")


def group_labels(rows: Sequence[dict], column: str, *, source: str) -> list[str]:
    """Each row's value of ``column`` (``data.eval_group_by``) as a metric-name label; a ``ValueError``
    naming the row when one lacks it or is not a short label, or when there are over ``MAX_EVAL_GROUPS``
    values (eval metrics are logged once per value: a column of free text is not a grouping)."""
    labels = []
    for number, row in enumerate(rows, 1):
        value = row.get(column)
        if value is None or isinstance(value, (dict, list)):
            raise ValueError(f"data.eval_group_by: row {number} of {source} has no '{column}' value to group by")
        label = str(value)
        if not _GROUP_LABEL.fullmatch(label):
            raise ValueError(f"data.eval_group_by: row {number} of {source} has '{column}' {label[:60]!r}; group "
                             "labels are 1-40 letters, digits or . _ + - (they become metric names)")
        labels.append(label)
    if len(set(labels)) > MAX_EVAL_GROUPS:
        raise ValueError(f"data.eval_group_by: '{column}' has {len(set(labels))} values in {source}; at most "
                         f"{MAX_EVAL_GROUPS} groups are logged, so group by a coarser column")
    return labels


def grouped_metrics(name: str, values: Sequence[float], labels: Sequence[str] | None) -> dict[str, float]:
    """``{f"{name}/{label}": mean}`` for each label (nothing when ``labels`` is None)."""
    if labels is None:
        return {}
    return {f"{name}/{label}": group["value"] for label, group in mean_by(values, labels).items()}


def mean_loss(model, tokenizer, rows: Sequence[dict], *, max_seq_len: int = 512, batch_size: int = 16
              ) -> dict[str, Any]:
    """Mean next-token loss over the completion tokens of ``sft`` rows (prompt/completion or messages)."""
    from flax import nnx

    from jaxengine.data import pipeline
    from jaxengine.tasks import LanguageModelTask
    from jaxengine.trainer import eval_step

    examples, stats = pipeline.encode_rows(rows, task="sft", tokenizer=tokenizer, max_seq_len=max_seq_len)
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else (tokenizer.eos_ids or [0])[0]
    model.eval()
    graphdef, state = nnx.split(model)
    total, weight_total = 0.0, 0.0
    for batch in pipeline.eval_batches(examples, batch_size=batch_size, max_seq_len=max_seq_len, pad_id=pad_id):
        weighted, weight = eval_step(state, nnx.State({}), {}, nnx.State({}), batch, graphdef=graphdef,
                                     task=LanguageModelTask())
        total += float(weighted["loss"])
        weight_total += float(weight)
    return {"metric": "loss", "value": total / max(weight_total, 1.0), "count": stats.examples,
            "loss_tokens": int(weight_total)}
