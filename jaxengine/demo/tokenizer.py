"""Train the demo model's SentencePiece tokenizer and lay it out as a Hugging Face tokenizer directory.

Digits are split into single tokens (arithmetic is learnable digit by digit) and byte fallback
keeps any unseen character encodable. The chat markers ``<|im_start|>``/``<|im_end|>`` are
user-defined pieces, so they are single ids; ``<|im_end|>`` ends an assistant turn and is listed as
an end-of-sequence id in ``generation_config.json`` next to ``</s>``.
"""
from __future__ import annotations

import io
import json
from collections.abc import Iterable
from pathlib import Path

# ChatML, as the platform's default template, minus the system-prompt branch the demo never uses.
DEMO_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")


def train_sentencepiece(texts: Iterable[str], *, vocab_size: int, seed_sentences: int = 200_000) -> bytes:
    """A serialized SentencePiece BPE model trained on ``texts`` (ids: 0 pad, 1 unk, 2 <s>, 3 </s>)."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        user_defined_symbols=list(CHAT_TOKENS),
        pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        pad_piece=PAD, unk_piece=UNK, bos_piece=BOS, eos_piece=EOS,
        input_sentence_size=seed_sentences,
        shuffle_input_sentence=False,
        num_threads=1,  # one thread: the merges, hence the vocabulary, are then identical on every run
        minloglevel=2,
    )
    return model.getvalue()


def write_tokenizer_dir(model_proto: bytes, out_dir: str | Path) -> Path:
    """Write ``tokenizer.model``, ``tokenizer_config.json``, ``special_tokens_map.json`` and
    ``generation_config.json`` into ``out_dir`` (created)."""
    import sentencepiece

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.model").write_bytes(model_proto)
    processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
    ids = {piece: processor.piece_to_id(piece) for piece in (PAD, UNK, BOS, EOS, *CHAT_TOKENS)}
    special = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD}
    added = {
        str(token_id): {"content": piece, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True}
        for piece, token_id in sorted(ids.items(), key=lambda item: item[1])
    }
    config = {
        "tokenizer_class": "LlamaTokenizer",
        **special,
        "additional_special_tokens": list(CHAT_TOKENS),
        "added_tokens_decoder": added,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "legacy": False,
        "model_max_length": 2048,
        "chat_template": DEMO_CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special_map = {**special, "additional_special_tokens": list(CHAT_TOKENS)}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    generation = {"bos_token_id": ids[BOS], "eos_token_id": [ids[EOS], ids["<|im_end|>"]], "pad_token_id": ids[PAD]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out_dir
