"""``jaxengine inspect --model DIR [--json]``: what a Hugging Face model directory holds.

Architecture and family, parameter count (of the weights the safetensors files hold, from their headers:
no tensor is read; a config.json that does not describe them is refused, as generate and train refuse it), the dtype config.json declares and the dtypes stored in the safetensors files, context
length, main sizes, the tokenizer (backend, vocabulary, special ids, chat template), and the licence an export
of it carries (``jaxengine.licence.read_licence``: its README.md's front matter and licence files). A tokenizer
file that cannot be read is bad input, like a bad config.json; a directory without any tokenizer is described
(tokenizer: none), as one that states no licence is (licence: not stated).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from jaxengine.checkpoint.safetensors_header import INDEX_FILE, SINGLE_FILE
from jaxengine.checkpoint.weights_check import check_weights_match_config
from jaxengine.cli import command_description
from jaxengine.cli.model_dir import (CliError, checked_model_dir, read_model_config, run_reporting_errors,
                                     safetensors_summary)
from jaxengine.licence import read_licence, states_a_licence


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("inspect", help="describe a Hugging Face model directory",
                                   description=command_description(__doc__))
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory (config.json, safetensors, tokenizer)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(handler=lambda args: run_reporting_errors("inspect", lambda: _inspect(args)))


def human_count(count: int) -> str:
    """1234567 -> '1.23M'."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.2f}{unit}"
    return str(count)


def describe(model_dir: Path) -> dict[str, Any]:
    """The facts ``inspect`` prints, as a JSON-ready dict."""
    from jaxengine.job import QUANTIZATION_FILE
    from jaxengine.tokenizer import SENTENCEPIECE_FILE, TOKENIZER_JSON_FILE, load_tokenizer

    hf_config, config = read_model_config(model_dir)
    weights = safetensors_summary(model_dir)
    quantized = None
    if (model_dir / QUANTIZATION_FILE).is_file():  # a serving copy: its codes and scales, as load_quantized checks them
        from jaxengine.json_files import read_json_object
        from jaxengine.quantize import quantized_layout

        description = read_json_object(model_dir / QUANTIZATION_FILE, error=CliError,
                                       advice="export the serving copy again")
        quantized = quantized_layout(description, model_dir / QUANTIZATION_FILE)
    check_weights_match_config(model_dir, hf_config, config, error=CliError, quantized=quantized)
    if not any((model_dir / name).is_file() for name in (TOKENIZER_JSON_FILE, SENTENCEPIECE_FILE)):
        tokenizer_facts: dict[str, Any] = {
            "type": None, "problem": f"no {TOKENIZER_JSON_FILE} or {SENTENCEPIECE_FILE} in {model_dir}"}
    else:
        tokenizer = load_tokenizer(model_dir)  # one that cannot be read is a TokenizerError: bad input
        tokenizer_facts = {
            "type": tokenizer.kind,
            "vocab_size": tokenizer.vocab_size,
            "bos_id": tokenizer.bos_id,
            "eos_ids": tokenizer.eos_ids,
            "pad_id": tokenizer.pad_id,
            "chat_template": "model" if tokenizer.settings.chat_template else "default (ChatML)",
        }
    architectures = hf_config.get("architectures") or [hf_config.get("model_type")]
    return {
        "model_dir": str(model_dir),
        "architecture": architectures[0],
        "family": config.family,
        "parameters": weights["parameters"] if weights["files"] else None,
        "dtype": hf_config.get("dtype") or hf_config.get("torch_dtype"),
        "weights": weights,
        "context_length": config.max_position_embeddings,
        "layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "heads": config.num_heads,
        "kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "sliding_window": config.sliding_window,
        "tied_embeddings": config.tie_word_embeddings,
        "tokenizer": tokenizer_facts,
        "licence": read_licence(model_dir),
    }


def licence_text(licence: dict[str, Any]) -> str:
    """``read_licence``'s facts on one line: the licence named, then the files an export copies."""
    if not states_a_licence(licence):
        return "not stated (no license in README.md's front matter, no licence file): check its terms before sharing"
    named = [licence[key] for key in ("license", "license_name", "license_link") if licence.get(key)]
    files = licence.get("files") or []
    too_large = [entry["name"] for entry in licence.get("not_copied") or ()]
    return ((", ".join(named) if named else "not named in README.md")
            + (f"; files: {', '.join(files)}" if files else "; no licence file")
            + (f"; too large to copy: {', '.join(too_large)}" if too_large else ""))


def _as_text(facts: dict[str, Any]) -> str:
    weights, tokenizer = facts["weights"], facts["tokenizer"]
    weight_line = (f"{weights['files']} safetensors file(s), {weights['tensors']} tensors, "
                   f"{', '.join(weights['dtypes'])}" if weights["files"] else f"no {SINGLE_FILE} or {INDEX_FILE}")
    if tokenizer["type"] is None:
        tokenizer_line = f"none ({tokenizer['problem']})"
    else:
        tokenizer_line = (f"{tokenizer['type']}, vocab {tokenizer['vocab_size']}, bos {tokenizer['bos_id']}, "
                          f"eos {tokenizer['eos_ids']}, pad {tokenizer['pad_id']}, "
                          f"chat template: {tokenizer['chat_template']}")
    rows = [
        ("architecture", f"{facts['architecture']} (family {facts['family']})"),
        ("parameters", f"unknown (no {SINGLE_FILE} or {INDEX_FILE})" if facts["parameters"] is None
                       else f"{human_count(facts['parameters'])} ({facts['parameters']:,})"),
        ("dtype", f"{facts['dtype'] or 'not stated'} (config.json); weights: {weight_line}"),
        ("context length", str(facts["context_length"])),
        ("layers", f"{facts['layers']}, hidden {facts['hidden_size']}, heads {facts['heads']} "
                   f"(kv {facts['kv_heads']}, dim {facts['head_dim']}), vocab {facts['vocab_size']}"
                   + (f", sliding window {facts['sliding_window']}" if facts["sliding_window"] else "")
                   + (", tied embeddings" if facts["tied_embeddings"] else "")),
        ("tokenizer", tokenizer_line),
        ("licence", licence_text(facts["licence"])),
    ]
    return "\n".join(f"{name:<15}{value}" for name, value in rows)


def _inspect(args: argparse.Namespace) -> int:
    facts = describe(checked_model_dir(args.model))
    print(json.dumps(facts) if args.json else _as_text(facts))
    return 0
