"""``jaxengine demo-base``: build the demo model (preset ``demo-tiny``) and its datasets from nothing.

Steps, all deterministic for a seed: generate the task corpus (``jaxengine.demo.corpus``), write
the datasets to ``OUT/data/``, train the SentencePiece tokenizer on the pre-training text plus
chat-formatted SFT examples (so the chat markers and role names are whole pieces), pre-train a
small Llama-style model on the plain-text corpus with the one trainer (packed sequences, cosine
schedule), and save it with its tokenizer in Hugging Face format to ``OUT/model/``. The base model
never sees the chat format, so SFT on ``sft.jsonl`` has something to teach: answering in it.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxengine.demo import corpus
from jaxengine.demo import tokenizer as demo_tokenizer


@dataclass(frozen=True, kw_only=True)
class DemoSettings:
    """Sizes of the demo build; the defaults fit the 5-minute, 2-core budget."""

    seed: int = 0
    problems: int = 12_000
    vocab_size: int = 1024
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 300
    learning_rate: float = 3e-3
    max_eval: int = 500

    def __post_init__(self):
        if self.seed < 0:
            raise ValueError(f"DemoSettings.seed must be ≥ 0, got {self.seed}")
        if self.steps < 1:
            raise ValueError(f"DemoSettings.steps must be at least 1, got {self.steps}")


def demo_model_config(settings: DemoSettings, *, vocab_size: int, bos_id: int, eos_ids: list[int], pad_id: int):
    """The ``demo-tiny`` architecture: Llama-style, tied embeddings, grouped-query attention."""
    from jaxengine.models.config import ModelConfig

    return ModelConfig(
        family="llama", vocab_size=vocab_size, hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size, num_layers=settings.num_layers, num_heads=settings.num_heads,
        num_kv_heads=settings.num_kv_heads, head_dim=settings.hidden_size // settings.num_heads,
        rms_norm_eps=1e-5, max_position_embeddings=2048, rope_theta=10_000.0, tie_word_embeddings=True,
        bos_token_id=bos_id, eos_token_ids=tuple(eos_ids), pad_token_id=pad_id,
    )


def build_demo(out_dir: str | Path, settings: DemoSettings = DemoSettings(), *, progress_bar: bool | None = None
               ) -> dict[str, Any]:
    """Write ``out_dir/data/*.jsonl`` and ``out_dir/model/``; returns a summary (also ``out_dir/demo.json``)."""
    import jax
    from flax import nnx

    from jaxengine.checkpoint.hf import save_hf_model
    from jaxengine.data import pipeline
    from jaxengine.models import build_model
    from jaxengine.spec import OptimSpec
    from jaxengine.tasks import LanguageModelTask
    from jaxengine.tokenizer import load_tokenizer
    from jaxengine.trainer import TrainConfig, Trainer

    started = time.perf_counter()
    out_dir = Path(out_dir)
    model_dir = out_dir / "model"
    problems = corpus.generate_problems(seed=settings.seed, count=settings.problems)
    rows = corpus.dataset_rows(problems, max_eval=settings.max_eval)
    corpus.write_datasets(rows, out_dir / "data")
    documents = list(corpus.pretrain_documents(problems, seed=settings.seed))

    # Chat-formatted examples in the tokenizer's training text make role names and markers whole pieces.
    chat_texts = [
        f"<|im_start|>user\n{row['prompt']}<|im_end|>\n<|im_start|>assistant\n{row['completion']}<|im_end|>\n"
        for row in rows["sft"][:2000]
    ]
    proto = demo_tokenizer.train_sentencepiece(documents + chat_texts, vocab_size=settings.vocab_size)
    if model_dir.exists():
        shutil.rmtree(model_dir)
    demo_tokenizer.write_tokenizer_dir(proto, model_dir)
    tokenizer = load_tokenizer(model_dir)

    examples, stats = pipeline.encode_rows(({"text": text} for text in documents), task="pretrain",
                                           tokenizer=tokenizer, max_seq_len=settings.seq_len)
    config = demo_model_config(settings, vocab_size=tokenizer.vocab_size, bos_id=tokenizer.bos_id,
                               eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id)
    model = build_model(config, rngs=nnx.Rngs(settings.seed))
    train_config = TrainConfig(
        total_steps=settings.steps, batch_size=settings.batch_size, max_seq_len=settings.seq_len, packing=True,
        seed=settings.seed, keep_last=1,
        optim=OptimSpec(learning_rate=settings.learning_rate, schedule="cosine", warmup_steps=settings.steps // 20,
                        weight_decay=0.01, max_grad_norm=1.0),
    )
    run_dir = out_dir / "pretrain"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    trainer = Trainer(model=model, task=LanguageModelTask(name="pretrain"), config=train_config,
                      train_examples=examples, eval_examples=None, pad_id=tokenizer.pad_id, run_dir=run_dir)
    summary = trainer.fit(progress_bar=progress_bar)
    if summary["status"] != "succeeded":
        raise RuntimeError(f"demo pre-training {summary['status']}: {summary['message']}")
    save_hf_model(trainer.current_model(), config, model_dir, tokenizer=tokenizer)
    shutil.rmtree(run_dir / "checkpoints")  # the model is saved; keep only the pre-training metrics
    result = {
        "model_dir": str(model_dir),
        "data_dir": str(out_dir / "data"),
        "datasets": {name: len(dataset) for name, dataset in rows.items()},
        "pretrain_tokens": stats.tokens,
        "parameters": sum(int(leaf.size) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))),
        "final_loss": summary["final_metrics"]["loss"],
        "steps": summary["step"],
        "seconds": time.perf_counter() - started,
        "settings": settings.__dict__,
    }
    (out_dir / "demo.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
