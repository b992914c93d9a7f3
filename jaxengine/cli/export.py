"""``jaxengine export --run DIR [--step N]``: export a run's checkpoint as a Hugging Face model.

Writes ``DIR/export/`` (LoRA/QLoRA merged into full-precision weights; ``export/adapter/`` in the
``peft`` format; ``reward_head.safetensors`` for reward runs) from the latest checkpoint, or from
checkpoint ``N`` — e.g. for a cancelled run, or the best by eval loss (``summary.json`` names it).
Prints ``{"step": ..., "export": {...}}``.
"""
from __future__ import annotations

import argparse
import json

from jaxengine.cli.model_dir import CliError, run_reporting_errors


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("export", help="export a run's checkpoint as a Hugging Face model",
                                   description=__doc__.split("\n\n")[0].strip("`"))
    parser.add_argument("--run", required=True, metavar="DIR", help="run directory (output_dir of a spec)")
    parser.add_argument("--step", type=int, metavar="N", help="checkpoint step (default: the latest)")
    parser.set_defaults(handler=lambda args: run_reporting_errors("export", lambda: _export(args)))


def _export(args: argparse.Namespace) -> int:
    from jaxengine.job import JobError, export_run
    from jaxengine.trainer import TrainingError

    try:
        result = export_run(args.run, step=args.step)
    except (JobError, TrainingError) as error:
        raise CliError(str(error)) from None
    print(json.dumps(result))
    return 0
