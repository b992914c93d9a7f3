"""Scoring a model directory on a dataset: greedy exact match on ``prompts`` rows, or mean token loss.

Used by ``jaxengine eval`` and the benchmarks. Prompts are rendered by ``encode_prompt``, exactly as
SFT rendered them in training; a generation matches when its text, stripped of surrounding
whitespace, equals the row's ``answer`` stripped the same way.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def exact_match(model, tokenizer, rows: Sequence[dict], *, max_new_tokens: int = 32, batch_size: int = 64,
                by: str | None = None) -> dict[str, Any]:
    """Fraction of ``rows`` (each with ``prompt`` and ``answer``) whose greedy completion equals the answer.

    With ``by`` (a column every row has, e.g. the demo's ``task``), ``groups`` also gives the fraction
    and count for each of its values: one figure hides which kinds of prompt a model reads."""
    from jaxengine.data.pipeline import encode_prompt
    from jaxengine.sampler import Sampler, SamplingParams

    sampler = Sampler(model, tokenizer)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, seed=0)
    texts: list[str] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        texts += [g.text for g in sampler.generate([encode_prompt(tokenizer, row["prompt"]) for row in chunk], params)]
    matches = [text.strip() == str(row["answer"]).strip() for text, row in zip(texts, rows)]
    result = {"metric": "exact_match", "value": sum(matches) / max(len(matches), 1), "count": len(matches),
              "examples": [{"prompt": row["prompt"], "answer": row["answer"], "text": text}
                           for row, text in list(zip(rows, texts))[:5]]}
    if by is not None:
        result["by"] = by
        result["groups"] = match_rate_by(matches, [str(row[by]) for row in rows])
    return result


def match_rate_by(matches: Sequence[bool], keys: Sequence[str]) -> dict[str, dict[str, float | int]]:
    """``{key: {"value": fraction matched, "count": rows}}`` over the rows sharing each key, keys sorted."""
    groups: dict[str, list[bool]] = {}
    for key, matched in zip(keys, matches, strict=True):
        groups.setdefault(key, []).append(matched)
    return {key: {"value": sum(group) / len(group), "count": len(group)} for key, group in sorted(groups.items())}


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
        weighted, weight = eval_step(state, nnx.State({}), nnx.State({}), batch, graphdef=graphdef,
                                     task=LanguageModelTask())
        total += float(weighted["loss"])
        weight_total += float(weight)
    return {"metric": "loss", "value": total / max(weight_total, 1.0), "count": stats.examples,
            "loss_tokens": int(weight_total)}
