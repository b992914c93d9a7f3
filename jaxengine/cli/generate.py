"""``jaxengine generate --model DIR --prompt TEXT ...``: complete one prompt with a model directory.

DIR is a Hugging Face model directory or a quantized serving copy (a run's ``export/quantized/``), which
answers as the chat serves it.

Prints the completion as it is generated; with ``--json`` prints one JSON object
``{"text": ..., "token_ids": [...], "prompt_token_ids": [...]}`` at the end instead. ``--chat`` wraps
the prompt in the model's chat template as a single user turn (after an optional ``--system`` turn)
with the generation prompt, rendered as training and the chat render it (``encode_prompt``: BOS first when
the tokenizer has one and the template did not write it), with the model's own template variables
(``chat_template_kwargs.json``, which a Temper run's export holds) and ``--template-var NAME=VALUE`` over them
(VALUE read as JSON when it is a JSON scalar, ``enable_thinking=false``, else as text); otherwise the text is encoded as transformers'
``tokenizer(text)`` encodes it (BOS only where the tokenizer adds one: a tokenizer.json's post-processor, or
``add_bos_token: true`` beside a tokenizer.model).
Sampling settings left out come from the model's generation_config.json (``do_sample: false`` there
means greedy), else temperature 1, no top-k, top-p 1. ``--temperature 0`` is greedy.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from jaxengine.cli import command_description
from jaxengine.cli.model_dir import CliError, checked_model_dir, read_model_config, run_reporting_errors
from jaxengine.json_files import read_json_object

DTYPES = ("float32", "bfloat16")


# Without --max-new-tokens: this many, or fewer where the prompt leaves less room in the context (the demo
# model's is 256 tokens, so a fixed 256 refused every prompt by default).
DEFAULT_MAX_NEW_TOKENS = 256


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="generate a completion from a model directory",
                                   description=command_description(__doc__))
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory (config.json, safetensors, tokenizer), or a quantized serving copy")
    parser.add_argument("--prompt", required=True, metavar="TEXT", help="the prompt (the user turn with --chat)")
    parser.add_argument("--chat", action="store_true", help="apply the chat template to the prompt as one user turn")
    parser.add_argument("--system", metavar="TEXT", help="system turn before the prompt (with --chat)")
    parser.add_argument("--template-var", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable for the chat template, e.g. enable_thinking=false (with --chat; repeatable)")
    parser.add_argument("--max-new-tokens", type=int, metavar="N",
                        help=f"default {DEFAULT_MAX_NEW_TOKENS}, or what the model's context leaves after the prompt")
    parser.add_argument("--temperature", type=float, metavar="T", help="0 = greedy")
    parser.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling mass (1 = off)")
    parser.add_argument("--top-k", type=int, metavar="K", help="keep the K most likely tokens (0 = off)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="parameter and compute dtype (default float32)")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming text")
    parser.set_defaults(handler=lambda args: run_reporting_errors("generate", lambda: _generate(args)))


# Sampling without generation_config.json's say: plain sampling, or its greedy equivalent under do_sample: false.
SAMPLED_DEFAULTS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
GREEDY_DEFAULTS = {"temperature": 0.0, "top_k": 0, "top_p": 1.0}


def sampling_settings(args: argparse.Namespace, generation_config: dict[str, Any], *,
                      source: str = "generation_config.json") -> dict[str, Any]:
    """temperature/top_k/top_p from the flags, falling back to generation_config.json, then to plain sampling.

    A null in the file is unset (transformers writes null for fields it leaves at their default). A value the
    file gives that is used here and is of the wrong type or out of range is a CliError naming ``source`` and
    the field: it was a TypeError traceback, or an error blaming a flag that was not given.
    """
    sampled = generation_config.get("do_sample")
    if sampled is None:
        sampled = True
    elif not isinstance(sampled, bool):
        raise CliError(f"{source}: do_sample = {sampled!r}: expected true or false")
    flags = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    from_file = {name: generation_config.get(name) for name in flags
                 if sampled and flags[name] is None and generation_config.get(name) is not None}
    for name, value in from_file.items():
        whole = name == "top_k"
        if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
            raise CliError(f"{source}: {name} = {value!r}: expected {'a whole number' if whole else 'a number'}")
    from jaxengine.sampler import SamplingParams

    try:
        SamplingParams(max_new_tokens=1, **from_file)
    except ValueError as error:
        flag = "--" + str(error).split()[0].removeprefix("SamplingParams.").replace("_", "-")
        raise CliError(f"{source}: {str(error).removeprefix('SamplingParams.')}; fix the file or give {flag}") from None
    defaults = SAMPLED_DEFAULTS if sampled else GREEDY_DEFAULTS
    return {name: flags[name] if flags[name] is not None else from_file.get(name, defaults[name]) for name in flags}


def _read_generation_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return {}
    # worded as the tokenizer words it for the same file, read for its stop ids
    return read_json_object(path, error=CliError, advice="fix or remove the file")


def template_variables(given: list[str]) -> dict[str, Any]:
    """``--template-var NAME=VALUE`` arguments as template variables: VALUE as JSON where it is a JSON scalar
    (false, 3, null, "quoted"), else the text itself."""
    from jaxengine.chat_template import template_variable_problem

    variables = {}
    for item in given:
        name, sep, text = item.partition("=")
        if not sep:
            raise CliError(f"--template-var {item!r}: give NAME=VALUE, e.g. enable_thinking=false")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        if isinstance(value, (list, dict)):
            value = text  # a template variable is a scalar: JSON that is not one is taken as its text
        if problem := template_variable_problem(name, value):
            raise CliError(f"--template-var {item!r}: {problem}")
        variables[name] = value
    return variables


def _generate(args: argparse.Namespace) -> int:
    model_dir = checked_model_dir(args.model)
    if args.system is not None and not args.chat:
        raise CliError("--system needs --chat (it is a turn of the chat template)")
    if args.template_var and not args.chat:
        raise CliError("--template-var needs --chat (it is a variable of the chat template)")
    variables = template_variables(args.template_var)
    from jaxengine.sampler import SamplingParams

    try:
        params = SamplingParams(max_new_tokens=DEFAULT_MAX_NEW_TOKENS if args.max_new_tokens is None else args.max_new_tokens, seed=args.seed,
                                **sampling_settings(args, _read_generation_config(model_dir),
                                                    source=str(model_dir / "generation_config.json")))
    except ValueError as error:
        raise CliError(str(error).replace("SamplingParams.", "--").replace("_", "-")) from None

    import jax.numpy as jnp

    from jaxengine.sampler import Sampler
    from jaxengine.serving import load_serving_weights
    from jaxengine.tokenizer import load_tokenizer

    _, config = read_model_config(model_dir)  # a bad config.json is reported before the weights are read
    tokenizer = load_tokenizer(model_dir)
    if args.chat:
        from jaxengine.data.pipeline import encode_prompt

        messages = ([{"role": "system", "content": args.system}] if args.system is not None else [])
        messages.append({"role": "user", "content": args.prompt})
        from jaxengine.spec import unread_template_variables_problem

        if problem := unread_template_variables_problem(variables, tokenizer.chat_template, key="--template-var"):
            print(f"warning: {problem}", file=sys.stderr)
        # As training, eval and the chat render it (a BOS before a template that writes none): a model trained
        # here answers the same prompt here as in the chat.
        prompt_ids = encode_prompt(tokenizer, messages, **variables)
    else:
        prompt_ids = tokenizer.encode(args.prompt, add_special_tokens=True)
    if not prompt_ids:  # checked here: the sampler would name it "prompt 0", a batch row this command never shows
        raise CliError(f"--prompt {args.prompt!r} encodes to no tokens (this model's tokenizer adds no start token), "
                       "so there is nothing to continue; give some text to complete")
    if max(prompt_ids) >= config.vocab_size:  # the sampler would name it "prompt 0", as above
        raise CliError(f"--prompt {args.prompt!r} encodes to token id {max(prompt_ids)}, outside the model's "
                       f"vocabulary (vocab_size={config.vocab_size} in {model_dir / 'config.json'}): the tokenizer "
                       "is not the model's own; give the model directory its own tokenizer files")
    room = config.max_position_embeddings - len(prompt_ids)
    if args.max_new_tokens is None and room >= 1:
        params = dataclasses.replace(params, max_new_tokens=min(DEFAULT_MAX_NEW_TOKENS, room))
    elif len(prompt_ids) + params.max_new_tokens > config.max_position_embeddings:  # the sampler names no flags
        given = (f"--max-new-tokens {params.max_new_tokens}" if args.max_new_tokens is not None
                 else "at least one new token")
        raise CliError(f"--prompt is {len(prompt_ids)} tokens and {given}: together past the model's context length "
                       f"({config.max_position_embeddings}, max_position_embeddings in {model_dir / 'config.json'}); "
                       "shorten the prompt or lower --max-new-tokens")
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    # A quantized serving copy (export/quantized/) loads as the chat serves it.
    sampler = Sampler(load_serving_weights(model_dir, compute_dtype=dtype), tokenizer)

    def print_delta(row: int, token_id: int, delta: str) -> None:
        sys.stdout.write(delta)
        sys.stdout.flush()

    [generation] = sampler.generate([prompt_ids], params, on_token=None if args.json else print_delta)
    if args.json:
        print(json.dumps({"text": generation.text, "token_ids": generation.token_ids,
                          "prompt_token_ids": generation.prompt_token_ids}, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
    return 0
