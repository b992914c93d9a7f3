"""``jaxengine train SPEC.yaml``: run a training job described by a job spec (see README, "Job spec").

The spec is validated before anything heavy is imported; an invalid one prints one line per problem
(``file:line: dotted.key: ...``) and exits 2; settings that work against each other (a warmup as long as
the run) are named on stderr as ``SPEC.yaml: warning: ...`` and the job runs. A model whose chat template writes
the day it renders (Llama 3.2's) gets that day fixed in ``data.chat_template_kwargs.date_string`` where neither the
spec nor the model sets it (``jaxengine.job.with_fixed_template_date``: today's, or a resume's first attempt's), named
on stderr, so every attempt renders one date. Running the same spec again on an ``output_dir`` that has
checkpoints resumes from the latest, naming on stderr each setting the spec changed since
(``SPEC.yaml: resumed from step N with a changed setting: optim.learning_rate 0.0001 -> 5e-05``); a training
file whose contents changed since, or another ``data.columns`` or ``data.loss_on``, is refused (exit 2). Ctrl-C (SIGINT) or SIGTERM stops after the current step, saves
a checkpoint and exits 130. The run summary is printed as one JSON object; exit 0 when the run
succeeded, 1 when it failed (e.g. a non-finite loss, a reward function that raised), its message
then also on stderr.

A spec with ``hosts: N`` runs as N processes, one per host, each started with the same spec and
``--coordinator HOST:PORT --num-processes N --process-id I`` (process 0's host; see
``jaxengine.distributed``); the web app's host pools do this for you.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys

from jaxengine.cli import command_description
from jaxengine.words import counted

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_CANCELLED = 1, 2, 130


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="run a training job from a spec file",
                                   description=command_description(__doc__))
    parser.add_argument("spec", metavar="SPEC.yaml", help="job spec file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar even in a terminal")
    parser.add_argument("--coordinator", metavar="HOST:PORT", help="multi-host job: process 0's address and a free port")
    parser.add_argument("--num-processes", type=int, metavar="N", help="multi-host job: processes (the spec's hosts)")
    parser.add_argument("--process-id", type=int, metavar="I", help="multi-host job: this process's index, 0..N-1")
    parser.set_defaults(handler=_train)


def steps_past_max(summary: dict, max_steps: int | None) -> int | None:
    """The step an output_dir resumed at (or had finished at) when it is past the spec's ``max_steps``, else
    None: run again with a lower max_steps, a job trains nothing and keeps the later model, which the
    summary alone did not point out."""
    step = summary.get("step")
    return step if max_steps is not None and isinstance(step, int) and step > max_steps else None


def _model_chat_template(spec) -> str | None:
    """The chat template of the spec's model, for the warnings on its ``data.chat_template_kwargs``; None when
    it gives none, or the model cannot be read (the job then says what is wrong with it)."""
    if not spec.data.chat_template_kwargs:
        return None
    from jaxengine.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplateError
    from jaxengine.job import JobError, resolve_model_dir
    from jaxengine.tokenizer import TokenizerError, read_tokenizer_settings

    try:
        settings = read_tokenizer_settings(resolve_model_dir(spec.model),
                                           run_spec_variables=spec.data.run_spec_template_kwargs)
        return settings.chat_template or DEFAULT_CHAT_TEMPLATE
    except (JobError, TokenizerError, ChatTemplateError, OSError):
        return None


def _train(args: argparse.Namespace) -> int:
    from jaxengine.spec import SpecError, load_spec, spec_warnings

    try:
        spec = load_spec(args.spec)
    except SpecError as error:
        print(str(error), file=sys.stderr)
        return EXIT_BAD_INPUT
    from jaxengine.job import with_fixed_template_date

    loaded = spec
    spec, fixed_date = with_fixed_template_date(spec)
    if args.process_id in (None, 0):  # once per job, not once per host
        if fixed_date is not None:
            print(f"{args.spec}: {fixed_date}", file=sys.stderr)
        for warning in spec_warnings(spec, chat_template=_model_chat_template(spec)):
            print(f"{args.spec}: warning: {warning}", file=sys.stderr)

    group_arguments = (args.coordinator, args.num_processes, args.process_id)
    if spec.hosts > 1 or any(value is not None for value in group_arguments):
        from jaxengine import distributed

        if any(value is None for value in group_arguments):
            print(f"{args.spec}: hosts: {spec.hosts}: give --coordinator, --num-processes and --process-id "
                  "to each process", file=sys.stderr)
            return EXIT_BAD_INPUT
        if args.num_processes != spec.hosts:
            # Checked before joining: process 0 would otherwise wait for peers that never come (up to
            # jax.distributed's initialization timeout) before the job could say the counts differ.
            print(f"{args.spec}: hosts: {spec.hosts}, but --num-processes is {args.num_processes}; start one "
                  f"process per host with --num-processes {spec.hosts} (or set hosts: {args.num_processes} "
                  "in the spec)", file=sys.stderr)
            return EXIT_BAD_INPUT
        try:
            distributed.initialize(distributed.ProcessGroup(
                coordinator_address=args.coordinator, num_processes=args.num_processes, process_id=args.process_id))
        except distributed.DistributedError as error:
            print(f"{args.spec}: {error}", file=sys.stderr)
            return EXIT_BAD_INPUT
        from jaxengine.job import JobError, with_process_zeros_template_date

        try:  # every process renders the day process 0 fixed (and named above), not its own clock's
            spec = with_process_zeros_template_date(loaded, spec)
        except JobError as error:
            print(f"{args.spec}: {error}", file=sys.stderr)
            return EXIT_BAD_INPUT

    from jaxengine.chat_template import ChatTemplateError
    from jaxengine.data.pipeline import DataError
    from jaxengine.job import JobError, RunLogWarning, run_job
    from jaxengine.trainer import TrainingError

    stop_requested = []

    def request_stop(signum, _frame):
        stop_requested.append(signum)
        print(f"\nsignal {signum}: stopping after the current step (checkpoint kept)", file=sys.stderr)

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = run_job(spec, should_stop=lambda: bool(stop_requested),
                          progress_bar=False if args.no_progress else None,
                          on_log=lambda line: print(f"{args.spec}: {'warning: ' if isinstance(line, RunLogWarning) else ''}"
                                                    f"{line}", file=sys.stderr))
    # A chat template that raises where no row is named (a prompt of grpo's, an eval sample's) is the
    # model's to fix too, not a traceback.
    except (JobError, DataError, TrainingError, ChatTemplateError) as error:
        print(f"{args.spec}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(json.dumps(summary))
    past = steps_past_max(summary, spec.train.max_steps)
    if past is not None and args.process_id in (None, 0):
        print(f"{args.spec}: warning: output_dir {spec.output_dir} is at step {past}, past train.max_steps "
              f"{spec.train.max_steps}: nothing was trained and its model is the step-{past} one; use a new "
              f"output_dir to train {counted(spec.train.max_steps, 'step')}", file=sys.stderr)
    if summary["status"] == "failed":  # the why, where a terminal user reads errors, besides the summary's message
        print(f"{args.spec}: failed: {summary['message']}", file=sys.stderr)
    return {"succeeded": 0, "cancelled": EXIT_CANCELLED}.get(summary["status"], EXIT_FAILED)
