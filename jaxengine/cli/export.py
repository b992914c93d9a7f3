"""``jaxengine export --run DIR [--step N | --best] [--quantize int8|int4]``: export a run's checkpoint as a Hugging Face model.

Writes ``DIR/export/`` (LoRA/QLoRA merged into full-precision weights, written in the base's dtype when
that is bfloat16 or float16; ``export/adapter/`` in the
``peft`` format; ``reward_head.safetensors`` for reward runs) from the latest checkpoint, or from
checkpoint ``N`` — e.g. for a cancelled run — or with ``--best`` from the best one (by eval loss; for
``task: grpo`` by the first eval metric; ``summary.json`` names it as ``best_checkpoint``).
With ``--quantize`` it also writes the serving copy ``DIR/export/quantized/`` (``jaxengine.quantize``),
scored against the merged model on up to ``--eval-limit`` rows of the run's ``data.eval``.
Prints ``{"step": ..., "export": {...}, "quantized": {...}}``; the model's own template variables its chat template
never reads, left out of the export, are named on stderr.
"""
from __future__ import annotations

import argparse
import json
import sys

from jaxengine.cli import command_description
from jaxengine.cli.model_dir import CliError, run_reporting_errors


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("export", help="export a run's checkpoint as a Hugging Face model",
                                   description=command_description(__doc__))
    parser.add_argument("--run", required=True, metavar="DIR", help="run directory (output_dir of a spec)")
    parser.add_argument("--step", type=int, metavar="N", help="checkpoint step (default: the latest)")
    parser.add_argument("--best", action="store_true",
                        help="export the best checkpoint (eval loss; grpo and ppo: the first eval metric)")
    parser.add_argument("--quantize", choices=("int8", "int4"),
                        help="also write export/quantized/: int8 per output channel, or int4 per group")
    parser.add_argument("--group-size", type=int, metavar="G",
                        help="input rows per scale (int4 default 64; int8 default: the whole channel)")
    parser.add_argument("--eval-limit", type=int, default=64, metavar="N",
                        help="eval rows scoring the quantized copy (default 64; 0: no scoring)")
    parser.set_defaults(handler=lambda args: run_reporting_errors("export", lambda: _export(args)))


def _export(args: argparse.Namespace) -> int:
    if args.quantize is None and args.group_size is not None:
        raise CliError("--group-size sets the quantized copy's groups; give --quantize int8 or int4 with it")
    if args.eval_limit < 0:
        raise CliError(f"--eval-limit must be 0 (no scoring) or more, got {args.eval_limit}")
    from jaxengine.job import JobError, export_run
    from jaxengine.trainer import TrainingError

    from jaxengine.quantize import GroupSizeError, quantize_run_export

    try:
        result = export_run(args.run, step=args.step, best=args.best,
                            on_log=lambda line: print(f"{args.run}: {line}", file=sys.stderr))
        if args.quantize:
            result["quantized"] = quantize_run_export(args.run, scheme_name=args.quantize,
                                                      group_size=args.group_size, eval_limit=args.eval_limit)
    except GroupSizeError as error:
        # In the flag's words: the model's widths were refused as "quantize group_size", which the command line
        # does not have, even where int4's default was used.
        size = str(error.group) if args.group_size is not None else (
            f"{args.quantize}'s default of {error.group} (no --group-size was given)")
        raise CliError(f"--group-size: {size} does not divide a projection's input width {error.in_features}; give "
                       "--group-size with a size that divides every hidden and intermediate size") from None
    except (JobError, TrainingError, ValueError) as error:
        raise CliError(str(error)) from None
    print(json.dumps(result))
    return 0
