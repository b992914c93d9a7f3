"""Scoring a model directory on a dataset: greedy exact match on ``prompts`` rows, or mean token loss.

Used by ``jaxengine eval``, an SFT run's ``eval/exact_match`` and the benchmarks. Prompts are rendered
by ``encode_prompt``, exactly as SFT rendered them in training. A generation matches its row's
``answer`` as the ``exact_match`` reward compares them (``answers_match``), so that a model gets the
same figure from ``jaxengine eval`` as from the reward that scored the same completions in training.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
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
    from jaxengine.data.pipeline import encode_prompt
    from jaxengine.models.transformer import inference_layout
    from jaxengine.sampler import Sampler, SamplingParams

    sampler = Sampler(inference_layout(model), tokenizer)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, seed=0)
    texts: list[str] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        texts += [g.text for g in sampler.generate([encode_prompt(tokenizer, row["prompt"]) for row in chunk], params)]
    return score_exact_match(texts, rows, by=by)


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
