"""A stand-in Tokenizer for benchmarks on random token ids (shared by the bench scripts)."""
from __future__ import annotations

from pathlib import Path


def ids_tokenizer(vocab_size: int):
    """Encodes "12 34" as [12, 34]; no special tokens, so nothing stops generation early."""
    from jaxengine.tokenizer import Tokenizer, TokenizerSettings

    class IdsTokenizer(Tokenizer):
        kind = "ids"

        def encode(self, text, *, add_special_tokens=False):
            return [int(piece) for piece in text.split()]

        def decode(self, ids, *, skip_special_tokens=True):
            return " ".join(map(str, ids))

        def token_to_id(self, token):
            return None

        @property
        def vocab_size(self):
            return vocab_size

        @property
        def special_ids(self):
            return frozenset()

    settings = TokenizerSettings(named_tokens={}, extra_special_tokens=(), added_tokens=(), add_bos_token=False,
                                 add_eos_token=False, legacy=False, add_prefix_space=None, chat_template=None,
                                 generation_eos_ids=(), generation_bos_id=None, generation_pad_id=None)
    return IdsTokenizer(model_dir=Path(__file__).parent, settings=settings)
