"""Test doubles, in one place: tiny random Hugging Face models written with ``save_pretrained``.

``make_tiny_hf_model(kind, out_dir)`` builds a tiny random model of one family with
``transformers`` (torch on CPU) and saves it like a real checkpoint (config.json +
safetensors), so engine code loads it exactly as it would a downloaded model. Session-scoped
pytest fixtures over these live in ``tests/jaxengine/conftest.py``.

Weights are drawn with a wider spread than transformers' default (std 0.1 instead of 0.02) and
norm weights and biases are perturbed away from their neutral init, so that logits are peaked
(greedy decoding has clear winners) and every parameter visibly matters.
"""
from __future__ import annotations

import functools
import io
import json
import random
import threading
from pathlib import Path
from typing import Any

# Tiny sizes (2 layers, width 64, vocabulary 256) per style.md; each kind exercises its family's
# special features.
TINY_HF_CONFIGS: dict[str, dict[str, Any]] = {
    # Llama 3.2 style: llama3 rope scaling (short original context so scaling changes frequencies), tied embeddings.
    "llama": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=256, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    ),
    # Llama 3.1 8B style: separate lm_head.
    "llama-untied": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=256, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    ),
    # Qwen 2.5: qkv bias, untied head.
    "qwen2": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=256, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, use_sliding_window=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    ),
    # Qwen 3: q/k norm, explicit head_dim different from hidden / heads, tied head.
    "qwen3": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=256, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, use_sliding_window=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    ),
    # Gemma 3 text: a sliding layer (window 4, shorter than any test sequence) and a global one, each with its
    # own rope base (global with linear scaling), query_pre_attn_scalar different from head_dim.
    "gemma3": dict(
        architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=256, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=True, query_pre_attn_scalar=24,
        sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0}},
        hidden_activation="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=1, pad_token_id=0,
    ),
}
TINY_KINDS = tuple(TINY_HF_CONFIGS)


def tiny_hf_config(kind: str):
    """The ``transformers`` config object of a tiny model kind (see ``TINY_HF_CONFIGS``)."""
    from transformers import AutoConfig

    if kind not in TINY_HF_CONFIGS:
        raise ValueError(f"unknown tiny model kind {kind!r}; known: {TINY_KINDS}")
    fields = dict(TINY_HF_CONFIGS[kind])
    model_type = fields.pop("model_type")
    return AutoConfig.for_model(model_type, initializer_range=0.1, **fields)


def make_tiny_hf_model(kind: str, out_dir: str | Path, *, seed: int = 0, max_shard_size: str | None = None) -> Path:
    """Create a tiny random ``transformers`` model of ``kind`` and ``save_pretrained`` it (float32 safetensors).

    ``max_shard_size`` (e.g. ``"20KB"``) forces a sharded save with ``model.safetensors.index.json``.
    Returns ``out_dir``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_hf_config(kind), dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                parameter.add_(0.1 * torch.randn_like(parameter))
    out_dir = Path(out_dir)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(out_dir, **kwargs)
    return out_dir


def load_hf_reference(model_dir: str | Path):
    """The saved tiny model loaded back with ``transformers`` (float32, eager attention, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


# --- Tokenizers -------------------------------------------------------------------------------------
# Real (tiny) tokenizers trained with the same libraries the model hubs use, laid out exactly as a
# downloaded model directory, so that both jaxengine and transformers.AutoTokenizer load them.

# A corpus with enough variety for merges to form: English words, digits, punctuation, accents,
# CJK, emoji, tabs and newlines. Seeded so that the trained vocabularies are the same every run.
_CORPUS_WORDS = (
    "the quick brown fox jumps over the lazy dog . hello world , model training tokens and "
    "language data are good ; a an is of to in it that for on with as was he she they you we "
    "running jumped Hello World The Model 2024 12 345 6789 café naïve résumé über straße "
    "你好 世界 日本語 テスト 한국어 🙂 🚀 ✨ ( ) [ ] { } : ' \" ! ? - _ / = + *"
).split()

# Chat templates written after the real ones (Llama 3.x, Qwen 2.5 ChatML, Gemma 3), text-only.
LLAMA3_CHAT_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.metadata is defined %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message.metadata | tojson + '<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

CHATML_CHAT_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

GEMMA_CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {{ message['content'] | trim }}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# Chat templates a model directory may hold that break or attack their renderer, each with what the error must say.
# Every place that renders a model's template must answer each with that message (and the file holding it), in
# seconds: never a traceback, a hung request or a dead worker. The last two meet the renderer's bounds
# (chat_template.MAX_RENDERED_CHARS, MAX_RENDER_SECONDS).
HOSTILE_CHAT_TEMPLATES = {
    "syntax error": ("{% for message in messages %}{{ message.content }", "line 1: unexpected '}'"),
    "raise_exception": ("{{ raise_exception('This template takes turns of user and assistant only') }}",
                        "This template takes turns of user and assistant only"),
    "division by zero": ("{{ messages | length / 0 }}", "division by zero (ZeroDivisionError)"),
    "type error": ("{{ messages + 1 }}", "can only concatenate list"),
    "undefined function": ("{{ format_turns(messages) }}", "'format_turns' is undefined"),
    "sandbox escape": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "access to attribute '__class__'"),
    "range too big": ("{% for i in range(10**9) %}x{% endfor %}", "Range too big"),
    "recursion": ("{% macro turn(n) %}{{ turn(n + 1) }}{% endmacro %}{{ turn(0) }}",
                  "maximum recursion depth exceeded"),
    "nested too deep": ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "cannot be read: maximum recursion depth"),
    "huge text": ("{{ messages[0].content * 10**10 }}", "more than 16,000,000 characters"),
    "endless loop": ("{% set steps = range(100000) | list %}{% for i in steps %}{% for j in steps %}{% endfor %}"
                     "{% endfor %}", "renders for more than 2 seconds"),
}

# The pre-tokenizer regex of Qwen 2 / 2.5 / 3 (identical to transformers' Qwen2Tokenizer).
_QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# The pre-tokenizer regex of Llama 3's tokenizer.json.
_LLAMA3_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _corpus_lines(*, line_count: int = 3000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    separators = [" ", " ", " ", " ", "  ", "\n", "\t", ""]
    lines = []
    for _ in range(line_count):
        words = [rng.choice(_CORPUS_WORDS) for _ in range(rng.randint(3, 14))]
        lines.append("".join(word + rng.choice(separators) for word in words))
    return lines


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False), encoding="utf-8")


@functools.lru_cache(maxsize=None)
def _sentencepiece_model_bytes(vocab_size: int) -> bytes:
    import sentencepiece

    # Llama-2-style settings: BPE with byte fallback, no normalisation, spaces kept as they are,
    # a dummy "▁" prefix, digits split; ids 0/1/2 are <unk>/<s>/</s>.
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus_lines()),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def build_sentencepiece_tokenizer_dir(
    out_dir: str | Path,
    *,
    vocab_size: int = 480,
    chat_template: str | None = GEMMA_CHAT_TEMPLATE,
    with_generation_config: bool = True,
) -> Path:
    """Writes a Llama-2-style SentencePiece tokenizer directory into ``out_dir``.

    ``tokenizer.model`` (BPE with byte fallback, ``vocab_size`` pieces) plus a ``tokenizer_config.json``
    with ``tokenizer_class: LlamaTokenizer``, two added special tokens after the pieces
    (``<start_of_turn>``, ``<end_of_turn>``, listed in ``added_tokens_decoder``) and, optionally,
    a chat template and a ``generation_config.json`` whose ``eos_token_id`` is a list.
    The full vocabulary is ``vocab_size + 2`` ids. Returns ``out_dir``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.model").write_bytes(_sentencepiece_model_bytes(vocab_size))

    def added(content: str) -> dict:
        return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False, "special": True}

    config = {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": None,
        "added_tokens_decoder": {
            "0": added("<unk>"),
            "1": added("<s>"),
            "2": added("</s>"),
            str(vocab_size): added("<start_of_turn>"),
            str(vocab_size + 1): added("<end_of_turn>"),
        },
        "extra_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
        "model_max_length": 2048,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    _write_json(out_dir / "tokenizer_config.json", config)
    if with_generation_config:
        _write_json(out_dir / "generation_config.json",
                    {"bos_token_id": 1, "eos_token_id": [2, vocab_size + 1], "pad_token_id": 0})
    return out_dir


_BPE_SPECIAL_TOKENS = {
    "qwen": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "llama3": ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
}


@functools.lru_cache(maxsize=None)
def _byte_level_bpe_json(style: str, vocab_size: int) -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    regex = _QWEN_PRETOKENIZE_REGEX if style == "qwen" else _LLAMA3_PRETOKENIZE_REGEX
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    if style == "qwen":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus_lines(), trainer=trainer)
    # Special tokens come after the learned vocabulary, as in Qwen and Llama 3.
    tokenizer.add_special_tokens(list(_BPE_SPECIAL_TOKENS[style]))
    if style == "qwen":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        bos = "<|begin_of_text|>"
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, tokenizer.token_to_id(bos))],
        )
    return tokenizer.to_str()


def tokenizer_json_id(tokenizer_json: dict, content: str) -> int:
    """The id of added token ``content`` in a parsed ``tokenizer.json``."""
    return next(token["id"] for token in tokenizer_json["added_tokens"] if token["content"] == content)


def build_bpe_tokenizer_dir(
    out_dir: str | Path,
    *,
    style: str = "qwen",
    vocab_size: int = 400,
    chat_template: str | None = None,
    template_file: bool = False,
) -> Path:
    """Writes a byte-level BPE ``tokenizer.json`` directory into ``out_dir``; returns ``out_dir``.

    ``style="qwen"``: Qwen 2.5-like (NFC, Qwen's regex, no BOS, ``<|endoftext|>``/``<|im_start|>``/
    ``<|im_end|>``, ``tokenizer_class: Qwen2Tokenizer``, ChatML template by default).
    ``style="llama3"``: Llama 3-like (Llama 3's regex, ``<|begin_of_text|>`` added by the post-processor,
    header/eot tokens, ``tokenizer_class: PreTrainedTokenizerFast``, Llama 3 template by default).
    ``template_file=True`` writes the template to ``chat_template.jinja`` instead of the config.
    The learned vocabulary has ``vocab_size`` ids; the special tokens follow it.
    """
    if style not in _BPE_SPECIAL_TOKENS:
        raise ValueError(f"style={style!r}: expected one of {sorted(_BPE_SPECIAL_TOKENS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_json = json.loads(_byte_level_bpe_json(style, vocab_size))
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False), encoding="utf-8")
    added_tokens_decoder = {
        str(token["id"]): {key: token[key] for key in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
        for token in tokenizer_json["added_tokens"]
    }

    def token_id(content: str) -> int:
        return tokenizer_json_id(tokenizer_json, content)

    if style == "qwen":
        template = CHATML_CHAT_TEMPLATE if chat_template is None else chat_template
        config = {
            "tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>", "unk_token": None, "add_prefix_space": False, "errors": "replace",
            "split_special_tokens": False, "clean_up_tokenization_spaces": False, "model_max_length": 32768,
        }
        generation_config = {"bos_token_id": None, "eos_token_id": [token_id("<|im_end|>"), token_id("<|endoftext|>")],
                             "pad_token_id": token_id("<|endoftext|>")}
    else:
        template = LLAMA3_CHAT_TEMPLATE if chat_template is None else chat_template
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
            "clean_up_tokenization_spaces": True, "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 131072,
        }
        generation_config = {"bos_token_id": token_id("<|begin_of_text|>"),
                             "eos_token_id": [token_id("<|end_of_text|>"), token_id("<|eot_id|>")]}
    config["added_tokens_decoder"] = added_tokens_decoder
    if template_file:
        (out_dir / "chat_template.jinja").write_text(template, encoding="utf-8")
    else:
        config["chat_template"] = template
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(out_dir / "generation_config.json", generation_config)
    return out_dir


def build_tiny_model_dir(out_dir: str | Path, *, preset_name: str = "tiny-qwen3", tokenizer_style: str = "qwen",
                         seed: int = 0, context: int | None = None) -> Path:
    """A complete tiny model directory (config.json, safetensors, tokenizer files) saved by jaxengine.

    The model is ``preset_name`` with its vocabulary resized to the tokenizer's (``tokenizer_style``:
    ``qwen``/``llama3`` byte-level BPE, or ``sentencepiece``), its context ``context`` tokens where given (the
    preset's otherwise), and random weights scaled up four times so that greedy output is varied rather than
    one repeated token. Returns ``out_dir``.
    """
    import jax
    from flax import nnx

    from jaxengine.checkpoint.hf import save_hf_model
    from jaxengine.models import build_model, preset
    from jaxengine.tokenizer import load_tokenizer

    out_dir = Path(out_dir)
    tokenizer_dir = out_dir / "tokenizer-source"
    if tokenizer_style == "sentencepiece":
        build_sentencepiece_tokenizer_dir(tokenizer_dir)
    else:
        build_bpe_tokenizer_dir(tokenizer_dir, style=tokenizer_style)
    tokenizer = load_tokenizer(tokenizer_dir)
    config = preset(preset_name).replace(vocab_size=tokenizer.vocab_size, bos_token_id=tokenizer.bos_id,
                                         eos_token_ids=tuple(tokenizer.eos_ids), pad_token_id=tokenizer.pad_id)
    if context is not None:
        config = config.replace(max_position_embeddings=context)
    model = build_model(config, rngs=nnx.Rngs(seed))
    nnx.update(model, jax.tree.map(lambda value: value * 4, nnx.state(model, nnx.Param)))
    save_hf_model(model, config, out_dir, tokenizer=tokenizer)
    for path in sorted(tokenizer_dir.iterdir()):
        path.unlink()
    tokenizer_dir.rmdir()
    return out_dir


def on_a_thread(call) -> dict[str, Any]:
    """What ``call()`` returns (``value``) or raises (``error``), called on a thread of its own named
    ``trainer-thread``: not the main thread, where reward functions are scored in helper processes."""
    outcome: dict[str, Any] = {}

    def body():
        try:
            outcome["value"] = call()
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=body, name="trainer-thread")
    thread.start()
    thread.join()
    return outcome
