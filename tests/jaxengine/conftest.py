"""Engine test fixtures: tiny random Hugging Face model directories, built once per session.

``tiny_hf_model_dir(kind)`` returns the directory of a tiny ``save_pretrained`` model of one
kind from ``tests.factories.TINY_KINDS`` (``llama``, ``llama-untied``, ``qwen2``, ``qwen3``,
``gemma3``); ``demo_dir`` a micro demo build (``MICRO``: model and datasets). Treat the
directories as read-only: they are shared by every test. ``reference_passes`` counts the RL tasks' reference
forward passes; ``read_jsonl`` reads a run's metrics.jsonl or samples.jsonl.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from jaxengine.demo.build import DemoSettings, build_demo
from tests import factories

# The demo build at a size that trains in seconds: 2 layers of width 32 over a 400-token vocabulary.
MICRO = DemoSettings(problems=400, vocab_size=400, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                     num_kv_heads=1, seq_len=64, batch_size=8, steps=3, max_eval=8)


@pytest.fixture(scope="session")
def tiny_hf_model_dir(tmp_path_factory) -> Callable[[str], Path]:
    """kind -> directory of a tiny random transformers model of that kind (created on first use)."""
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in built:
            built[kind] = factories.make_tiny_hf_model(kind, tmp_path_factory.mktemp(f"tiny-{kind}"))
        return built[kind]

    return get


@pytest.fixture(scope="session")
def sharded_tiny_hf_model_dir(tmp_path_factory) -> Path:
    """A tiny Qwen 2.5 model saved in several safetensors files with model.safetensors.index.json."""
    return factories.make_tiny_hf_model("qwen2", tmp_path_factory.mktemp("tiny-qwen2-sharded"), seed=1,
                                        max_shard_size="40KB")


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """A micro demo build (``MICRO``), made once for the session: each engine module that trains on it
    built its own (15-30 s each)."""
    out = tmp_path_factory.mktemp("demo")
    build_demo(out, MICRO, progress_bar=False)
    return out


# A prompt far past the 60 tokens that the GRPO and PPO test specs' data.max_seq_len (64) leaves before their
# max_new_tokens (4): a run leaves it out.
LONG_PROMPT = "What is the largest digit in 1 2 3 4? " * 40


def write_prompts(path: Path, prompts: list[str]) -> str:
    """A prompts file at ``path`` of ``prompts``, each with an answer for the reward functions; its path."""
    path.write_text("".join(json.dumps({"prompt": prompt, "answer": "1"}) + "\n" for prompt in prompts))
    return str(path)


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def reference_passes(monkeypatch) -> list:
    """Counts the reference forward passes (calls of the jitted reference function that GRPO and PPO share)."""
    from jaxengine import grpo

    calls = []
    original = grpo._reference_log_probs

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(grpo, "_reference_log_probs", counting)
    return calls
