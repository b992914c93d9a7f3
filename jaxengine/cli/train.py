"""``jaxengine train SPEC.yaml``: run a training job described by a job spec (see README, "Job spec").

The spec is validated before anything heavy is imported; an invalid one prints one line per problem
(``file:line: dotted.key: ...``) and exits 2. Running the same spec again on an ``output_dir`` that has
checkpoints resumes from the latest. Ctrl-C (SIGINT) or SIGTERM stops after the current step, saves
a checkpoint and exits 130. The run summary is printed as one JSON object; exit 0 when the run
succeeded, 1 when it failed (e.g. a non-finite loss).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_CANCELLED = 1, 2, 130


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="run a training job from a spec file",
                                   description=__doc__.split("\n\n")[0].strip("`"))
    parser.add_argument("spec", metavar="SPEC.yaml", help="job spec file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar even in a terminal")
    parser.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> int:
    from jaxengine.spec import SpecError, load_spec

    try:
        spec = load_spec(args.spec)
    except SpecError as error:
        print(str(error), file=sys.stderr)
        return EXIT_BAD_INPUT

    from jaxengine.data.pipeline import DataError
    from jaxengine.job import JobError, run_job
    from jaxengine.trainer import TrainingError

    stop_requested = []

    def request_stop(signum, _frame):
        stop_requested.append(signum)
        print(f"\nsignal {signum}: stopping after the current step (checkpoint kept)", file=sys.stderr)

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = run_job(spec, should_stop=lambda: bool(stop_requested),
                          progress_bar=False if args.no_progress else None)
    except (JobError, DataError, TrainingError) as error:
        print(f"{args.spec}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(json.dumps(summary))
    return {"succeeded": 0, "cancelled": EXIT_CANCELLED}.get(summary["status"], EXIT_FAILED)
