"""``jaxengine demo-base --out DIR``: build the demo model (``model: demo-tiny`` in a spec) and the demo datasets.

Writes ``DIR/model/`` (Hugging Face format: config.json, model.safetensors, SentencePiece tokenizer
with a chat template) and ``DIR/data/sft.jsonl``, ``sft_teacher.jsonl`` (an imperfect teacher's
answers), ``preference.jsonl``, ``prompts.jsonl`` (with an ``answer`` column) and ``eval.jsonl``
(held-out prompts with answers). Deterministic for a seed.
Point ``TEMPER_DEMO_DIR`` at DIR (or build into ``$TEMPER_MODELS_ROOT/demo``) so that specs can say
``model: demo-tiny``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxengine.cli import command_description
from jaxengine.cli.model_dir import EXIT_BAD_INPUT


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo-base", help="build the demo model and datasets",
                                   description=command_description(__doc__))
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (model/ and data/ go here)")
    parser.add_argument("--seed", type=int, default=0, help="corpus, tokenizer and initialisation seed (default 0)")
    parser.add_argument("--steps", type=int, help="pre-training steps (default: 300, about 5 minutes on 2 cores)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar even in a terminal")
    parser.set_defaults(handler=_demo_base)


def _demo_base(args: argparse.Namespace) -> int:
    import dataclasses

    from jaxengine.demo.build import DemoSettings, build_demo

    try:
        settings = DemoSettings(seed=args.seed)
        if args.steps is not None:
            settings = dataclasses.replace(settings, steps=args.steps)
    except ValueError as error:
        print(f"jaxengine demo-base: error: {str(error).replace('DemoSettings.', '--')}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"jaxengine demo-base: error: --out {args.out} is a file; give a directory (it is made if missing)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    # A file further up the path: the build made its corpus and tokenizer, then its mkdir raised
    # NotADirectoryError (a traceback). The nearest existing ancestor decides, as job.check_output_dir does.
    if (above := next((path for path in Path(args.out).parents if path.exists()), None)) and not above.is_dir():
        print(f"jaxengine demo-base: error: --out {args.out}: {above} is a file, not a directory; give a directory "
              "(it is made if missing)", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = build_demo(args.out, settings, progress_bar=False if args.no_progress else None)
    print(json.dumps(result))
    return 0
