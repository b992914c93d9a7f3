"""Scores of a trained reward model (``task: reward``) for prompt + completion texts, for the
``reward_model`` reward function.

Design note: texts are encoded exactly as the reward task encoded its preference pairs (the same
prompt/completion rendering, chat template included, EOS after the completion), and the model reads
its scalar head at the last real token, as in training. A loaded model is kept per directory (two at
most), so scoring every step does not reload it; the scoring forward is one jitted function per
model structure.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from jaxengine.tasks import REWARD_HEAD_FILE


def reward_model_dir(path: str | Path) -> Path:
    """The directory holding the reward model: ``path`` itself, or ``path/export`` for a run directory."""
    path = Path(path)
    for candidate in (path, path / "export"):
        if (candidate / REWARD_HEAD_FILE).is_file():
            return candidate
    raise FileNotFoundError(f"{path}: no {REWARD_HEAD_FILE} here or in {path / 'export'}; give the run directory "
                            "(or its export/) of a finished task: reward run")


@functools.lru_cache(maxsize=2)
def _load(model_dir: str):
    from jaxengine.tasks import load_reward_model
    from jaxengine.tokenizer import load_tokenizer

    model = load_reward_model(model_dir)
    model.eval()
    graphdef, state = nnx.split(model)
    return graphdef, state, load_tokenizer(model_dir)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _scores(state, batch, *, graphdef):
    return nnx.merge(graphdef, state)(batch)


def score_texts(path: str | Path, prompts: Sequence, completions: Sequence[str], *, max_seq_len: int = 512,
                batch_size: int = 16) -> list[float]:
    """The reward model at ``path`` (see ``reward_model_dir``) scoring each prompt + completion, one float each.

    Prompts are cut from the left when a pair is longer than ``max_seq_len``, as in training.
    """
    from jaxengine.data import pipeline

    graphdef, state, tokenizer = _load(str(reward_model_dir(path)))
    rows = [{"prompt": prompt, "completion": completion} for prompt, completion in zip(prompts, completions,
                                                                                        strict=True)]
    # loss_on "all" marks every token as trained, so an empty completion is scored (on its EOS) instead of dropped.
    examples, stats = pipeline.encode_rows(rows, task="sft", tokenizer=tokenizer, max_seq_len=max_seq_len,
                                           loss_on="all")
    if len(examples) != len(rows):
        raise ValueError(f"{len(rows) - len(examples)} of {len(rows)} texts could not be encoded ({stats.to_dict()})")
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else (tokenizer.eos_ids or [0])[0]
    scores: list[float] = []
    for start in range(0, len(examples), batch_size):
        batch = pipeline.make_batch(examples[start:start + batch_size], max_seq_len=max_seq_len, pad_id=pad_id)
        scores += [float(value) for value in np.asarray(_scores(state, batch, graphdef=graphdef))]
    return scores
