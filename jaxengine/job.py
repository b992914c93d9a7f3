"""A training job from a spec: load model and data, train, export — the entry point of ``jaxengine train``
and of the web app's train worker.

Design note: everything a run needs is derived from the ``JobSpec`` and the files it names, and
everything it produces lands in ``output_dir`` following the run-directory contract
(``spec.yaml``, ``metrics.jsonl``, ``samples.jsonl``, ``checkpoints/``, ``export/``,
``summary.json``). Running the same spec again on the same ``output_dir`` resumes it.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxengine.data.formats import Entry
from jaxengine.spec import JobSpec, batch_split_problem, best_metric_for, dump_spec, total_steps_for
from jaxengine.words import counted

logger = logging.getLogger(__name__)

DEMO_PRESET = "demo-tiny"


class JobError(RuntimeError):
    """A job that cannot start or finish; the message names the spec key or file at fault."""


def demo_model_candidates() -> list[Path]:
    """Where the ``demo-tiny`` preset is looked for, in order (``jaxengine demo-base --out DIR`` writes DIR/model)."""
    # As the web's settings read them (webapp.env.env_path): a variable set but empty counts as unset, not as
    # the current directory, and ~ is the home directory.
    data_root = Path(os.environ.get("TEMPER_DATA") or "var").expanduser()
    models_root = Path(os.environ.get("TEMPER_MODELS_ROOT") or data_root / "models").expanduser()
    candidates = [models_root / "demo" / "model"]
    if os.environ.get("TEMPER_DEMO_DIR"):
        candidates.insert(0, Path(os.environ["TEMPER_DEMO_DIR"]).expanduser() / "model")
    return candidates


def resolve_model_dir(model: str, *, entry: Entry = Entry.SPEC) -> Path:
    """The Hugging Face directory a spec's ``model`` names: a directory, or the ``demo-tiny`` preset. ``entry``: where
    the spec was given; a web launch's (``Entry.LAUNCH``) names a directory the web resolved from a base model or a
    run's export, so one missing is told in the web's terms, without the command line's presets (the web names the
    model: ``webapp.runs.reporting.in_project_terms``)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise JobError(f"model: {model!r} has no config.json; point it at a Hugging Face-format model directory")
        if (path / QUANTIZATION_FILE).is_file():
            raise JobError(f"model: {model!r} is a quantized serving copy ({QUANTIZATION_FILE}), which is for "
                           f"serving only; train from the model it was made from: {quantized_copy_source(path)}")
        return path
    if model == DEMO_PRESET:
        for candidate in demo_model_candidates():
            if (candidate / "config.json").is_file():
                return candidate
        looked = ", ".join(str(c) for c in demo_model_candidates())
        raise JobError(f"model: the {DEMO_PRESET} preset is not built (looked in {looked}); "
                       "run `jaxengine demo-base --out DIR` and set TEMPER_DEMO_DIR=DIR")
    problem = "a file, not a directory" if path.exists() else "no such directory"
    if entry is Entry.LAUNCH:
        raise JobError(f"model: {model}: {problem}; its folder was deleted or moved since the run was queued. Put "
                       "the model's files back in it, or duplicate the run on its page and choose another starting "
                       "model")
    raise JobError(f"model: {model!r}: {problem}; give a Hugging Face-format model directory (holding config.json) "
                   f"or the preset {DEMO_PRESET}")


# A serving copy's description (``jaxengine.quantize`` writes it; defined here, where no jax is imported).
QUANTIZATION_FILE = "quantization.json"


def quantized_copy_source(path: Path) -> str:
    """The model a quantized serving copy was made from, as its quantization.json records it. Its codes
    cannot be trained: loaded as a Hugging Face checkpoint, it was refused as one missing its kernels."""
    try:
        source = json.loads((path / QUANTIZATION_FILE).read_text(encoding="utf-8")).get("source")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        source = None
    return source if isinstance(source, str) and source else "its quantization.json does not say"


def spec_as_run(spec: JobSpec, model_dir: Path) -> JobSpec:
    """The spec a run directory keeps: the ``demo-tiny`` preset written as the directory it resolved to, so
    that ``jaxengine export`` (and a resume) find the model the run trained without TEMPER_DEMO_DIR, which
    may be set for the training only, and a relative path as an absolute one: read from another working
    directory, it named no model (export refused the run, and the same job was refused its own output_dir
    as another's). Job identities compare resolved directories, so this is the same job. The data files likewise:
    ``jaxengine export --quantize`` scores the copy on ``data.eval`` read from the run's spec.yaml, which from
    another working directory named no file (a FileNotFoundError). Resumes compare the spec they are given, not
    this file (``recorded_settings``, which records the data paths absolute too, so that a resume given this file
    reports no change of them). ``output_dir`` too, and the summary names the model as this file does
    (``run_model_path``): read from elsewhere, a relative one named nothing."""
    return with_absolute_data_paths(spec).model_copy(update={
        "model": run_model_path(spec, model_dir), "output_dir": str(Path(spec.output_dir).absolute())})


def run_model_path(spec: JobSpec, model_dir: Path) -> str:
    """The model a run of ``spec`` names in its spec.yaml and summary.json: the directory ``model_dir`` the
    ``demo-tiny`` preset resolved to, a relative path made absolute, an absolute one as written."""
    if spec.model == DEMO_PRESET:
        return str(model_dir.resolve())
    return spec.model if Path(spec.model).is_absolute() else str(model_dir.absolute())


def with_absolute_data_paths(spec: JobSpec) -> JobSpec:
    """``spec`` with a relative ``data.train`` or ``data.eval`` written as the absolute path it names from here."""
    data = {key: str(Path(path).absolute()) for key in ("train", "eval")
            if (path := getattr(spec.data, key)) is not None and not Path(path).is_absolute()}
    return spec.model_copy(update={"data": spec.data.model_copy(update=data)}) if data else spec


def resolve_dtypes(spec: JobSpec):
    """(param dtype, compute dtype) as jax dtypes; compute ``auto`` is bfloat16 except on CPU."""
    import jax
    import jax.numpy as jnp

    names = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
    compute = spec.train.compute_dtype
    if compute == "auto":
        compute = "float32" if jax.default_backend() == "cpu" else "bfloat16"
    return names[spec.train.param_dtype], names[compute]


def job_placement(spec: JobSpec):
    """The ``MeshPlacement`` of the spec's ``parallel`` layout over every device of the job, or of the
    default layout (``jaxengine.sharding.default_layout``); None for the unsharded path."""
    import jax

    from jaxengine.sharding import MeshPlacement, batch_rows_multiple, default_layout, layout_mesh

    if spec.parallel is not None:
        layout = spec.parallel.model_dump()
    else:
        layout = default_layout(jax.device_count(), platform=jax.default_backend(),
                                process_count=jax.process_count())
    if layout is None:
        return None
    try:
        mesh = layout_mesh(layout)
    except ValueError as error:
        raise JobError(str(error)) from None
    if problem := batch_split_problem(spec, batch_rows_multiple(mesh)):
        raise JobError(problem)
    return MeshPlacement(mesh)


def canonical_model(model: str) -> str:
    """One spelling per model directory: the resolved absolute path a spec's ``model`` names (the
    ``demo-tiny`` preset, a relative path, a symlink or a trailing slash all give the directory's),
    or ``model`` as written when it names none (the job then fails on it anyway)."""
    try:
        return str(resolve_model_dir(model).resolve())
    except (JobError, OSError):
        return model


def job_identity(spec: JobSpec) -> str:
    """What a run's checkpoints are of — task, model (``canonical_model``) and PEFT settings — so a
    resume cannot mix jobs (training lengths, data and optimizer settings may change between resumes),
    and the same job spelled two ways is one."""
    return _identity(spec, canonical_model(spec.model))


def earlier_job_identities(spec: JobSpec) -> tuple[str, ...]:
    """The identity engines before ``canonical_model`` wrote into this job's checkpoints (its model as
    the spec spells it), when that differs: those checkpoints still resume."""
    written = _identity(spec, spec.model)
    return () if written == job_identity(spec) else (written,)


def _identity(spec: JobSpec, model: str) -> str:
    return json.dumps({"task": spec.task, "model": model, "peft": spec.peft.model_dump(mode="json")},
                      sort_keys=True)


def resume_settings(spec: JobSpec) -> dict[str, Any]:
    """The settings of ``spec``, by dotted key, that shape a run's saved state or give its data order its meaning,
    which a resume must keep (``trainer.changed_settings_problem``): ``data.max_seq_len`` (and ``data.packing``)
    decide which rows and prompts are kept, so a data position or a rollout block's prompt indices count in them;
    RL blocks draw ``train.batch_size`` × ``train.grad_accum`` prompts (times the dynamic sampling pool) each
    ``num_iterations`` steps, and a checkpoint inside a block keeps its rollouts, shaped by ``num_generations`` and
    ``max_new_tokens``. Training lengths, data files and optimizer settings may change between resumes."""
    settings: dict[str, Any] = {"data.max_seq_len": spec.data.max_seq_len, "data.packing": spec.data.packing}
    if spec.task in ("grpo", "ppo"):
        options = getattr(spec, spec.task)
        settings |= {"train.batch_size": spec.train.batch_size, "train.grad_accum": spec.train.grad_accum,
                     f"{spec.task}.num_iterations": options.num_iterations,
                     f"{spec.task}.max_new_tokens": options.max_new_tokens}
    if spec.task == "grpo":
        settings |= {"grpo.num_generations": spec.grpo.num_generations,
                     "grpo.dynamic_sampling": spec.grpo.dynamic_sampling}
        if spec.grpo.dynamic_sampling:
            settings["grpo.dynamic_sampling_pool"] = spec.grpo.dynamic_sampling_pool
    return settings


# Keys of a spec a resume neither compares nor reports with the other settings: what the checkpoints belong to
# (``job_identity``, checked on its own) and the run directory itself.
NOT_RECORDED = ("task", "model", "peft", "output_dir")


def recorded_settings(spec: JobSpec) -> dict[str, Any]:
    """The settings of ``spec`` a resume may change, nested as in the spec (``TrainConfig.recorded_settings``): its
    every section but the job's identity, so the optimizer, loss and reward settings, training lengths and data
    paths. A resume reports each change (``trainer.settings_changes``); those of ``resume_settings`` and the seed
    it refuses first. The data paths are recorded absolute: a run started with relative ones and resumed from its
    spec.yaml (``spec_as_run``, absolute) reported each as a changed setting, though it named the same file."""
    return {key: value for key, value in with_absolute_data_paths(spec).model_dump(mode="json").items()
            if key not in NOT_RECORDED}


def data_files(spec: JobSpec) -> dict[str, dict[str, str]]:
    """Each data file of ``spec`` by its key (``data.train``, ``data.eval``) with its path and the sha256 of its
    contents (``TrainConfig.data_files``): a resume refuses a training file whose contents changed since its
    checkpoint and reports a changed eval file; a path alone says nothing of a file replaced in place."""
    files = {}
    for key in ("train", "eval"):
        path = getattr(spec.data, key)
        if path is not None:
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
            files[f"data.{key}"] = {"path": str(path), "sha256": digest.hexdigest()}
    return files


def training_data_settings(spec: JobSpec) -> tuple[str, ...]:
    """The keys of ``spec``'s ``data`` section that decide what the run trains on in each row of its training file:
    ``columns`` (which of the file's columns are the task's fields) for every task, and ``loss_on`` (which tokens
    carry the loss) where the task reads it, sft. A resume under other values would go on training other examples
    than its checkpoint's, so it is refused (``changed_training_data_problem``)."""
    return ("columns", "loss_on") if spec.task == "sft" else ("columns",)


def changed_training_data_problem(saved_settings: dict[str, Any], spec: JobSpec, *, run_dir: Path,
                                  step: int) -> str | None:
    """What a resume of ``run_dir``'s checkpoint ``step``, saved with ``saved_settings`` (its
    ``recorded_settings``), would do under ``spec``'s other ``training_data_settings``, and what to do; None when
    they are the same, or when the checkpoint has no record of them (engines before ``recorded_settings``)."""
    saved, now = saved_settings.get("data") or {}, recorded_settings(spec)["data"]
    changed = [f"data.{key} {json.dumps(saved[key])} when checkpoint {step} was saved, {json.dumps(now[key])} in this "
               "spec" for key in training_data_settings(spec) if key in saved and saved[key] != now[key]]
    if not changed:
        return None
    one = len(changed) == 1
    return (f"{'; '.join(changed)}: {'it decides' if one else 'they decide'} what the run trains on in each row of "
            "the training file, so the resumed run would train on other examples than its checkpoint's; put "
            f"{'it' if one else 'them'} back as saved to resume, or train under the new "
            f"{'value' if one else 'values'} as a new run from checkpoint {step}: its Launch a run from it, under "
            "Checkpoints on the run's page, exports it first and opens the launch form with it"
            + command_line_export(run_dir, step))


def command_line_export(run_dir: Path, step: int) -> str:
    """The command-line way to a new run from checkpoint ``step`` of ``run_dir``, as said after the web's in a
    refusal; the web app leaves it out of what it shows (``webapp.runs.reporting.in_project_terms``), as its users
    have the page's action and no shell on the server."""
    return f" (or jaxengine export --run {run_dir} --step {step}, then a run from the exported model)"


def refuse_changed_training_data(spec: JobSpec, run_dir: Path, files: dict[str, dict[str, str]]) -> None:
    """A JobError, before the model loads and anything is written, when ``run_dir``'s latest checkpoint was saved
    over other training data than ``spec``'s: a training file with other contents than ``files`` (``spec``'s
    ``data_files``) give (``trainer.changed_training_file_problem``; the trainer refuses it too, from the same
    record, but only after spec.yaml had been overwritten with this spec's), or other ``training_data_settings``
    (``changed_training_data_problem``; the trainer, given encoded examples, knows nothing of them)."""
    from jaxengine.trainer import Checkpoints, changed_training_file_problem

    directory = run_dir / "checkpoints"
    if not directory.is_dir() or not any(entry.name.isdigit() for entry in directory.iterdir()):
        return
    checkpoints = Checkpoints(directory, keep_last=spec.train.keep_last)
    try:
        steps = checkpoints.steps()
        meta = checkpoints.meta(steps[-1]) if steps else {}
    finally:
        checkpoints.close()
    if not steps:
        return
    if problem := changed_training_file_problem(meta.get("data_files") or {}, files, step=steps[-1]):
        raise JobError(problem)
    if problem := changed_training_data_problem(meta.get("settings") or {}, spec, run_dir=run_dir, step=steps[-1]):
        raise JobError(problem)


def _checkpointed_spec(run_dir: Path) -> JobSpec | None:
    """The spec.yaml of ``run_dir`` when the directory holds checkpoints, else None (None too for a spec.yaml
    this engine cannot read: the trainer's checks on the checkpoints decide)."""
    from jaxengine.spec import SpecError, load_spec

    written = run_dir / "spec.yaml"
    checkpoints = run_dir / "checkpoints"
    if not written.is_file() or not checkpoints.is_dir() or not any(checkpoints.iterdir()):
        return None
    try:
        return load_spec(written)
    except SpecError:
        return None


def with_fixed_template_date(spec: JobSpec) -> tuple[JobSpec, str | None]:
    """``spec`` with ``data.chat_template_kwargs.date_string`` fixed where its model's chat template writes the day
    it renders when that is unset (Llama 3.2's; ``chat_template.date_to_fix``, as the web app's launch fixes it), so
    that every attempt, evaluation and export renders one day: the date ``output_dir``'s checkpointed spec holds when
    the job resumes there (the first attempt's), else today's. With it, the line that says so for the job's log;
    ``(spec, None)`` where nothing is fixed: pretraining, a date the spec or the model's own variables give, a
    template that stamps no day, a model that cannot be read (the job says what is wrong with it)."""
    from jaxengine.chat_template import DATE_VARIABLE, ChatTemplateError, date_to_fix
    from jaxengine.tokenizer import TokenizerError, read_tokenizer_settings

    if spec.task == "pretrain":
        return spec, None
    try:
        settings = read_tokenizer_settings(resolve_model_dir(spec.model),
                                           run_spec_variables=spec.data.run_spec_template_kwargs)
    except (JobError, TokenizerError, ChatTemplateError, OSError):
        return spec, None
    variables = spec.data.chat_template_kwargs
    date = date_to_fix(settings.chat_template, variables=variables, model_variables=settings.template_kwargs)
    if date is None:
        return spec, None
    previous = _checkpointed_spec(Path(spec.output_dir))
    earlier = previous.data.chat_template_kwargs.get(DATE_VARIABLE) if previous is not None else None
    if earlier is not None:
        date = earlier
    fixed = spec.model_copy(update={"data": spec.data.model_copy(
        update={"chat_template_kwargs": {**variables, DATE_VARIABLE: date}})})
    return fixed, (f"data.chat_template_kwargs.{DATE_VARIABLE}: {date!r} fixed for every chat the job renders "
                   f"({'the date its first attempt in output_dir rendered' if earlier is not None else 'today'}; the "
                   "model's chat template writes the day it renders when it is unset); set it in the spec to render "
                   "another day")


# Room for process 0's template date, JSON-encoded, in the array ``with_process_zeros_template_date`` broadcasts: a
# date a strftime format writes is some tens of bytes.
_TEMPLATE_DATE_BYTES = 1024


def with_process_zeros_template_date(loaded: JobSpec, fixed: JobSpec) -> JobSpec:
    """The spec every process of a multi-host job runs, from ``loaded`` (the spec as given) and ``fixed`` (this
    process's ``with_fixed_template_date`` of it): ``loaded`` with the date process 0 fixed, or as it is where process
    0 fixed none. Each process fixes today's date by its own clock, so processes started either side of midnight (or
    in hosts of other time zones) rendered their rows with different days; process 0's date is the one its messages
    name and its run directory's spec.yaml keeps. Call after ``distributed.initialize`` in every process (a collective:
    ``multihost_utils.broadcast_one_to_all``); a job of one process gets ``fixed`` back."""
    import json

    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from jaxengine.chat_template import DATE_VARIABLE

    if jax.process_count() == 1:
        return fixed
    own = fixed.data.chat_template_kwargs.get(DATE_VARIABLE) if DATE_VARIABLE not in loaded.data.chat_template_kwargs \
        else None
    payload = json.dumps(own).encode("utf-8")
    if len(payload) > _TEMPLATE_DATE_BYTES:
        raise JobError(f"data.chat_template_kwargs.{DATE_VARIABLE}: the date fixed, {own!r}, is longer than "
                       f"{_TEMPLATE_DATE_BYTES} bytes; set a shorter one in the spec")
    sent = np.zeros(_TEMPLATE_DATE_BYTES, dtype=np.uint8)
    sent[:len(payload)] = np.frombuffer(payload, dtype=np.uint8)
    received = np.asarray(multihost_utils.broadcast_one_to_all(sent), dtype=np.uint8)
    date = json.loads(received.tobytes().rstrip(b"\0").decode("utf-8"))
    if date is None:
        return loaded
    return loaded.model_copy(update={"data": loaded.data.model_copy(
        update={"chat_template_kwargs": {**loaded.data.chat_template_kwargs, DATE_VARIABLE: date}})})


def refuse_another_jobs_directory(spec: JobSpec, run_dir: Path) -> None:
    """A JobError, before anything is written, when ``run_dir`` holds checkpoints of another job (see
    ``job_identity``), or of this job under other ``resume_settings``. The trainer refused it too, but only after
    spec.yaml had been overwritten with this job's, and the directory's own run could then no longer be exported
    (or resumed as it was)."""
    from jaxengine.trainer import changed_settings_problem

    previous = _checkpointed_spec(run_dir)
    if previous is None:
        return
    if job_identity(previous) not in (job_identity(spec), *earlier_job_identities(spec)):
        raise JobError(f"output_dir: {run_dir} holds the checkpoints of another job ({job_identity(previous)}), "
                       f"not this one ({job_identity(spec)}); use a new output_dir")
    if problem := changed_settings_problem(resume_settings(previous), resume_settings(spec)):
        raise JobError(f"output_dir: {run_dir} holds checkpoints {problem}")


def _finished_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary of a run that succeeded in ``run_dir`` before, if any."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("status") == "succeeded" else None


def _read_eval_rows(path: str, task: str, columns: dict[str, str], *, entry: Entry = Entry.SPEC) -> list[dict]:
    """Eval rows of the task's kind; for sft a ``prompts`` file with an ``answer`` column also works
    (the answer is the completion), so one held-out file serves loss and exact match. ``entry``: where the spec came
    from, whose settings a data problem's advice names (``run_job``)."""
    from jaxengine.data import pipeline

    source = pipeline.spec_source("data.eval", task, entry)
    try:
        return list(pipeline.read_examples(path, kind=pipeline.TASK_KINDS[task], columns=columns, source=source))
    except pipeline.DataError as first_error:
        if task != "sft":
            raise
        prompt_column = {field: name for field, name in columns.items() if field == "prompt"}
        try:
            rows = list(pipeline.read_examples(path, kind="prompts", columns=prompt_column, source=source))
        except pipeline.DataError as prompts_error:
            # The file is of the kind whose reading got further: chats with a bad third row were told the prompts
            # reading's error, that their first row lacked a 'prompt'.
            raise (prompts_error if (prompts_error.row or 0) > (first_error.row or 0) else first_error) from None
        if not all(isinstance(row.get("answer"), str) for row in rows):
            raise first_error from None
        return [{**row, "completion": row["answer"]} for row in rows]


def eval_group_labels(spec: JobSpec, rows: list[dict]) -> list[str] | None:
    """The ``data.eval_group_by`` label of each eval row (None when the spec groups nothing); a JobError
    naming the file and row when a row has no usable label."""
    from jaxengine.evaluate import group_labels

    if spec.data.eval_group_by is None:
        return None
    try:
        return group_labels(rows, spec.data.eval_group_by, source=str(spec.data.eval))
    except ValueError as error:
        raise JobError(str(error)) from None


def make_sample_hook(*, tokenizer, rows: list[dict], samples_path: Path, max_new_tokens: int,
                     group_labels: list[str] | None = None):
    """After each evaluation: greedy generations for ``rows`` go to samples.jsonl; when the rows have an
    ``answer``, ``eval/exact_match`` is the fraction whose text matches it (``evaluate.answers_match``, as
    ``jaxengine eval`` scores), and with ``group_labels`` (one per row, ``data.eval_group_by``)
    ``eval/exact_match/<label>`` that of each group. A preference row's chosen answer is recorded as
    ``chosen``, and an sft row's completion as ``completion``: the reference a reader compares the generation with
    (no answer to score: many fit)."""
    from jaxengine.data.pipeline import encode_prompt
    from jaxengine.evaluate import answers_match, grouped_metrics
    from jaxengine.sampler import Sampler, SamplingParams

    prompt_ids = [encode_prompt(tokenizer, row["prompt"]) for row in rows]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, seed=0)
    answered = [isinstance(row.get("answer"), str) for row in rows]
    answered_labels = None if group_labels is None else [
        label for label, has_answer in zip(group_labels, answered, strict=True) if has_answer]

    def hook(model, step: int) -> dict[str, float]:
        sampler = Sampler(model, tokenizer)
        # A preview longer than the context has left after the longest prompt is cut to fit (it stopped
        # the run at its first evaluation); only a prompt that fills the context alone is still an error.
        room = sampler.config.max_position_embeddings - max(map(len, prompt_ids))
        fitted = dataclasses.replace(params, max_new_tokens=min(params.max_new_tokens, room)) if room >= 1 else params
        generations = sampler.generate(prompt_ids, fitted)
        answered_rows, answered_texts = [], []
        with samples_path.open("a") as handle:
            for row, has_answer, generation in zip(rows, answered, generations):
                record = {"step": step, "prompt": row["prompt"], "text": generation.text}
                if has_answer:
                    record["answer"] = row["answer"]
                    answered_rows.append(row)
                    answered_texts.append(generation.text)
                elif (chosen := _chosen_text(row.get("chosen"))) is not None:
                    record["chosen"] = chosen
                elif isinstance(row.get("completion"), str):
                    record["completion"] = row["completion"]
                handle.write(json.dumps(record) + "\n")
        if not answered_rows:
            return {}
        matches = answers_match(answered_texts, answered_rows)
        return {"eval/exact_match": sum(matches) / len(matches),
                **grouped_metrics("eval/exact_match", matches, answered_labels)}

    return hook


def _chosen_text(chosen: Any) -> str | None:
    # A preference pair's chosen answer: its text, or a chat's last assistant turn.
    if isinstance(chosen, str):
        return chosen
    if isinstance(chosen, list):
        turns = [turn.get("content") for turn in chosen if isinstance(turn, dict) and turn.get("role") == "assistant"]
        return turns[-1] if turns and isinstance(turns[-1], str) else None
    return None


@dataclass(kw_only=True)
class JobModel:
    """The model a spec trains, ready for the trainer: PEFT applied, task head attached."""

    model: Any
    config: Any
    tokenizer: Any
    model_dir: Path
    trainable: Any
    quantization: dict[str, float] | None
    # The model's own template variables its chat template never reads, left out of every chat this job renders and
    # of its exports (``_without_unread_own_variables``), for the run's log to name once.
    unread_variables_left_out: tuple[str, ...] = ()


def _without_unread_own_variables(tokenizer: Any, spec: JobSpec) -> tuple[str, ...]:
    """Take out of ``tokenizer.template_kwargs`` the model's own variables (its ``chat_template_kwargs.json``, or an
    old export's run ``spec.yaml``) that its chat template never reads, and name them: they render nothing, and
    written into the export they were carried on to every export made from it (an export from before launches left
    such a name out of a new run's variables held them). The spec's own variables stay, read or not: its author was
    warned at the launch (``spec_warnings``). A template that cannot be read drops nothing (rendering says why)."""
    from jaxengine.chat_template import unread_variables

    unread = unread_variables(set(tokenizer.template_kwargs) - set(spec.data.chat_template_kwargs),
                              tokenizer.chat_template)
    for name in unread:
        del tokenizer.template_kwargs[name]
    return unread


def unread_variables_note(job_model: JobModel) -> str | None:
    """The line that names the model's own variables ``job_model`` left out (``_without_unread_own_variables``),
    or None: said once by each job that writes an export (a run, ``jaxengine export``)."""
    left_out = job_model.unread_variables_left_out
    if not left_out:
        return None
    return (f"chat_template_kwargs: {', '.join(left_out)} of {job_model.model_dir}'s own variables (its "
            "chat_template_kwargs.json) left out of this run's exports: the model's chat template never reads "
            f"{'it' if len(left_out) == 1 else 'them'}")


def build_job_model(spec: JobSpec, *, mesh=None) -> JobModel:
    """Load the spec's model and tokenizer, quantize (qlora), attach LoRA, and wrap a reward head (reward)
    or a value head (ppo). With ``mesh``, the weights are read straight into their sharded places."""
    from flax import nnx

    from jaxengine.checkpoint.hf import load_hf_model
    from jaxengine.tasks import HeadParam, RewardModel
    from jaxengine.tokenizer import load_tokenizer

    from safetensors import SafetensorError

    from jaxengine.tokenizer import TokenizerError

    model_dir = resolve_model_dir(spec.model)
    param_dtype, compute_dtype = resolve_dtypes(spec)
    try:  # the model's own files: a broken one is named, not a traceback (`jaxengine generate` does the same)
        tokenizer = load_tokenizer(model_dir, run_spec_variables=spec.data.run_spec_template_kwargs)
        model, config = load_hf_model(model_dir, param_dtype=param_dtype, compute_dtype=compute_dtype, mesh=mesh)
    except (ValueError, TypeError, KeyError, OSError, TokenizerError, SafetensorError) as error:
        raise JobError(f"model: {model_dir}: {error}") from None
    # Every chat this job renders (training rows, eval, RL prompts, samples) and the export's
    # chat_template_kwargs.json, so the model is chatted with as it was trained.
    unread_left_out = _without_unread_own_variables(tokenizer, spec)
    tokenizer.template_kwargs.update(spec.data.chat_template_kwargs)
    model.remat = spec.train.remat
    trainable: Any = nnx.Param
    quantization = None
    if spec.peft.method == "qlora":
        from jaxengine.peft.quant import quantize_model

        try:
            quantization = quantize_model(model, bits=spec.peft.quant_bits, group_size=spec.peft.group_size)
        except ValueError as error:
            raise JobError(str(error)) from None
    if spec.peft.method in ("lora", "qlora"):
        from jaxengine.peft.lora import LoraParam, apply_lora

        apply_lora(model, targets=spec.peft.targets, rank=spec.peft.rank, alpha=spec.peft.alpha,
                   dropout=spec.peft.dropout, seed=spec.train.seed)
        trainable = LoraParam
    if spec.task == "reward":
        model = RewardModel(model, seed=spec.train.seed)
        trainable = nnx.Param if spec.peft.method == "none" else nnx.Any(trainable, HeadParam)
    elif spec.task == "ppo":
        from jaxengine.ppo import PolicyWithValueHead

        model = PolicyWithValueHead(model)
        trainable = nnx.Param if spec.peft.method == "none" else nnx.Any(trainable, HeadParam)
    return JobModel(model=model, config=config, tokenizer=tokenizer, model_dir=model_dir,
                    trainable=trainable, quantization=quantization, unread_variables_left_out=unread_left_out)


def export_trained(trained, spec: JobSpec, job_model: JobModel, export_dir: Path, *, step: int,
                   data_summary: dict[str, Any] | None = None, provenance: dict[str, Any] | None = None
                   ) -> dict[str, str]:
    """Write the merged Hugging Face model of checkpoint ``step`` to ``export_dir``, a folder of the run directory
    (plus the PEFT adapter and the reward head; a PPO run's value head is for training only and is not exported),
    each with its model card (``README.md``, ``jaxengine.model_card``) from the run directory's records,
    ``data_summary`` (default: ``summary.json``'s) and ``provenance`` (default: the run's ``provenance.json``), and
    with the base model's licence files (``jaxengine.licence``), which its licence asks a derivative to carry.

    It is written into a new directory beside ``export_dir`` and renamed into place when whole
    (``replace_directory``): an export that fails part way (a full disk, Ctrl-C) leaves the earlier one as
    it was, not a config.json beside no weights, and the earlier export's serving copy (``quantized/``, a
    copy of another checkpoint) goes with it rather than serving on beside this one."""
    from jaxengine.checkpoint import hf

    from jaxengine import model_card
    from jaxengine.licence import copy_licence_files

    export_dir.parent.mkdir(parents=True, exist_ok=True)
    facts = model_card.card_facts(run_dir=export_dir.parent, spec=spec, step=step, base_model_dir=job_model.model_dir,
                                  adapter=False, data_summary=data_summary, provenance=provenance)
    staging = Path(tempfile.mkdtemp(prefix=f".{export_dir.name}.writing-", dir=export_dir.parent))
    try:
        written = _write_export(trained, spec, job_model, staging)
        model_card.write_model_card(staging, model_card.build_model_card(facts))
        copy_licence_files(job_model.model_dir, staging, facts["licence"])
        if "adapter" in written:
            model_card.write_model_card(written["adapter"], model_card.build_model_card({**facts, "kind": "adapter"}))
            copy_licence_files(job_model.model_dir, written["adapter"], facts["licence"])
        hf.replace_directory(staging, export_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already once renamed into place
    return {name: str(export_dir / Path(path).relative_to(staging)) for name, path in written.items()}


def _write_export(trained, spec: JobSpec, job_model: JobModel, export_dir: Path) -> dict[str, str]:
    """``export_trained``'s files, written into ``export_dir``; returns their paths by kind."""
    from jaxengine.checkpoint import hf
    from jaxengine.tasks import save_reward_head

    exported = {}
    if spec.task == "reward":
        save_reward_head(trained, export_dir)
        exported["reward_head"] = str(export_dir / "reward_head.safetensors")
        trained = trained.backbone
    elif spec.task == "ppo":
        trained = trained.backbone
    if spec.peft.method == "qlora":
        from jaxengine.peft.quant import dequantize_model

        dequantize_model(trained)  # the merged export is full precision
    if spec.peft.method in ("lora", "qlora"):
        from jaxengine.peft.lora import merge_lora, save_peft_adapter

        save_peft_adapter(trained, export_dir / "adapter", base_model=str(job_model.model_dir), rank=spec.peft.rank,
                          alpha=spec.peft.alpha, dropout=spec.peft.dropout, targets=spec.peft.targets)
        exported["adapter"] = str(export_dir / "adapter")
        merge_lora(trained)
    # In the base checkpoint's own dtype when it is a 16-bit one, as transformers saves a model loaded
    # in its stored dtype: a bfloat16 base trained in float32 would otherwise export at twice its size.
    # The PEFT adapter above keeps the float32 update (a small one may round away in bfloat16).
    hf.save_hf_model(trained, job_model.config, export_dir, tokenizer=job_model.tokenizer,
                     dtype=hf.stored_half_dtype(job_model.model_dir))
    exported["model"] = str(export_dir)
    return exported


def export_run(run_dir: str | Path, *, step: int | None = None, best: bool = False,
               on_log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Export a run's checkpoint (``step``, the best by the run's ``best_metric_for`` when ``best``, default
    the latest) to ``<run_dir>/export`` (``jaxengine export``). ``on_log`` (default: this module's logger, at info)
    hears of the model's own variables left out of the export (``unread_variables_note``), once."""
    from jaxengine.spec import load_spec
    from jaxengine.trainer import Checkpoints, restore_trained_model

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        problem = "a file, not a directory" if run_dir.exists() else "no such directory"
        raise JobError(f"--run {run_dir}: {problem}; give the output_dir of a `jaxengine train` spec")
    if not (run_dir / "spec.yaml").is_file():
        raise JobError(f"--run {run_dir}: no spec.yaml; give a run directory written by `jaxengine train`")
    spec = load_spec(run_dir / "spec.yaml")
    # Checked before the model is built: a run that saved nothing has nothing to export, whatever its model.
    checkpoint_dir = run_dir / "checkpoints"
    if not checkpoint_dir.is_dir() or not any(entry.name.isdigit() for entry in checkpoint_dir.iterdir()):
        raise JobError(f"--run {run_dir}: no checkpoint in {checkpoint_dir}; train the run first "
                       f"(`jaxengine train {run_dir / 'spec.yaml'}`) and export it once it has saved one")
    kept = sorted(int(entry.name) for entry in checkpoint_dir.iterdir() if entry.name.isdigit())
    if step is not None and not best and step not in kept:
        # Found only after the model was built, and said as "there are [2]" without the flag it was about.
        raise JobError(f"--step {step}: {run_dir} kept no checkpoint of that step; its checkpoints are at step"
                       f"{'s' if len(kept) > 1 else ''} {', '.join(map(str, kept))}: give one of them, or leave "
                       f"--step out for the latest ({kept[-1]})")
    if best:
        if step is not None:
            raise JobError("give --step or --best, not both")
        metric, higher_is_better = best_metric_for(spec)
        checkpoints = Checkpoints(run_dir / "checkpoints", keep_last=1, higher_is_better=higher_is_better)
        try:
            step = checkpoints.best_step()
        finally:
            checkpoints.close()
        if step is None:
            raise JobError(f"--best: no checkpoint of {run_dir} has a {metric} score (the run never evaluated)")
    try:
        job_model = build_job_model(spec)
    except JobError as error:  # the model's key is the run's spec.yaml's, not a spec the user has at hand
        raise JobError(f"{run_dir / 'spec.yaml'}: {error}") from None
    if note := unread_variables_note(job_model):
        (on_log or logger.info)(note)
    trained, meta = restore_trained_model(job_model.model, trainable=job_model.trainable, optim=spec.optim,
                                          checkpoint_dir=run_dir / "checkpoints", step=step)
    exported = export_trained(trained, spec, job_model, run_dir / "export", step=meta["step"])
    return {"step": meta["step"], "export": exported}


def check_data_files(spec: JobSpec) -> None:
    """JobError naming the ``data`` key whose file is missing, before a model is loaded or a directory made."""
    for key in ("train", "eval"):
        path = getattr(spec.data, key)
        if path is not None and not Path(path).is_file():
            problem = "is a directory, not a file" if Path(path).is_dir() else "no such file"
            raise JobError(f"data.{key}: {path}: {problem}")


def check_output_dir(run_dir: Path) -> None:
    """JobError when ``run_dir`` is a file or lies below one, before a model is loaded: the trainer's mkdir
    would fail there only after the model and the data had been read, as a FileExistsError traceback."""
    for path in (run_dir, *run_dir.parents):
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                raise JobError(f"output_dir: {run_dir}: {path} is a file, not a directory; give a directory for "
                               "the run (a new path is made)")
            return


def check_model_positions(spec: JobSpec, model_dir: Path) -> None:
    """JobError when ``data.max_seq_len`` is past the positions the model's config.json gives it
    (``max_position_embeddings``, or the range its RoPE scaling extends that to), before the model is
    loaded: the run trained there with no word, on positions the model never saw. The web's launch
    check says the same (``webapp.runs.services``)."""
    from jaxengine.models.config import max_seq_len_problem, read_position_limit

    if problem := max_seq_len_problem(spec.data.max_seq_len, read_position_limit(model_dir)):
        raise JobError(f"data.max_seq_len: {problem}")


def check_reward_functions(spec: JobSpec) -> None:
    """JobError naming the key of a GRPO or PPO reward function that this thread could not score
    (``rewards.unsendable_reward``: off the main thread, one that cannot be pickled), before the model is
    loaded; the first scoring found it, after the model was loaded and the step compiled."""
    from jaxengine.rewards import WeightedReward, unsendable_reward

    if spec.task not in ("grpo", "ppo"):
        return
    options = getattr(spec, spec.task)
    for key in ("rewards", "eval_metrics"):
        terms = [WeightedReward(name=term.name, args=term.args) for term in getattr(options, key)]
        if found := unsendable_reward(terms):
            position, problem = found
            raise JobError(f"{spec.task}.{key}.{position}.name: {problem}")


class RunLogOnce(str):
    """A line for the run's log (``run_job``'s ``on_log``) about the run's data, which every attempt of the run reads
    again and says again: the train worker logs it once in a run, however many attempts say it."""


class RunLogWarning(RunLogOnce):
    """A ``RunLogOnce`` line that warns: the train worker logs it as a warning; ``jaxengine train`` prints it as
    one."""


def _share(count: int, rows: int) -> str:
    share = 100 * count / rows
    return f"{share:.0f}%" if share >= 1 else "under 1%"


def data_cut_warnings(data: Any, *, max_seq_len: int, section: str | None = None) -> list[RunLogWarning]:
    """What the encoding cut to ``max_seq_len`` or left out of ``data.train`` and ``data.eval`` (``data``: the summary's
    ``data``, ``EncodeStats.to_dict()`` by use), a line for each. Said through ``on_log`` once the data is encoded: in
    the summary alone, a run whose every row was cut to a too small ``data.max_seq_len`` said so after its last
    step. A GRPO or PPO run (``section``: its task) leaves out the prompts longer than the room ``data.max_seq_len``
    leaves them before ``<section>.max_new_tokens`` (``grpo.read_rl_prompts``' counts: ``dropped_long_prompts``, and
    that room as ``max_prompt_tokens``)."""
    warnings = []
    for use, purpose in (("train", "train on"), ("eval", "score")):
        stats = data.get(use) if isinstance(data, dict) else None
        if not isinstance(stats, dict) or not stats.get("rows"):
            continue
        rows, truncated, dropped, too_long = (int(stats.get(key) or 0) for key in (
            "rows", "truncated", "dropped", "dropped_long_prompts"))
        if truncated:
            was, them = ("was", "it") if truncated == 1 else ("were", "those rows")
            warnings.append(RunLogWarning(
                f"data.{use}: {truncated} of {counted(rows, 'row')} ({_share(truncated, rows)}) {was} longer than "
                f"data.max_seq_len {max_seq_len} tokens and {was} cut to it: raise data.max_seq_len, or shorten {them}"))
        if too_long:
            was, them = ("was", "it") if too_long == 1 else ("were", "those prompts")
            warnings.append(RunLogWarning(
                f"data.{use}: {too_long} of {counted(rows, 'row')} ({_share(too_long, rows)}) had a prompt longer than "
                f"the {data.get('max_prompt_tokens')} tokens data.max_seq_len {max_seq_len} leaves before "
                f"{section}.max_new_tokens, and {was} left out: raise data.max_seq_len, lower "
                f"{section}.max_new_tokens, or shorten {them}"))
        if dropped:
            # The cut keeps part of every completion (jaxengine.data.pipeline): a row is dropped for having none.
            warnings.append(RunLogWarning(
                f"data.{use}: {dropped} of {counted(rows, 'row')} {'was' if dropped == 1 else 'were'} left out, with "
                f"no token to {purpose} (an empty completion, or no assistant turn): fill or remove them"))
    return warnings


def run_job(
    spec: JobSpec,
    *,
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[Any], None] | None = None,
    progress_bar: bool | None = None,
    placement: Any = None,
    on_evaluation: Callable[[Any], None] | None = None,
    on_log: Callable[[str], None] | None = None,
    entry: Entry = Entry.SPEC,
    provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``spec`` to completion (or cancel/failure); writes the run directory and returns the summary.
    ``provenance``: what the engine cannot know of the run for its exports' model cards (the web app's project, run,
    datasets, author, ``jaxengine.model_card``), written to ``<output_dir>/provenance.json``.
    ``on_log`` hears of each line for the run's log: rows cut or left out by the encoding (``data_cut_warnings``,
    ``RunLogWarning`` lines, before the first step), conversations trained one assistant turn per example
    (``pipeline.split_by_turn_note``, a ``RunLogOnce`` line), a resume's changed settings (``Trainer.fit``). ``entry``: where the spec was
    given, whose settings the advice of a problem in its data files names: ``Entry.SPEC`` (jaxengine train:
    data.columns, the task) or ``Entry.LAUNCH`` (the web app's worker: the launch form's dataset versions and the
    Column mapping they were uploaded with).

    In a multi-host job (``jaxengine.distributed.initialize`` called first) every process calls this;
    the arrays are then global over all processes' devices (``placement``, default ``job_placement``)
    and process 0 writes the files."""
    import jax

    started = time.perf_counter()
    if jax.process_count() != spec.hosts:
        raise JobError(f"hosts: the spec asks for {spec.hosts} processes, this job has "
                       f"{jax.process_count()}; start one process per host (jaxengine train --coordinator)")
    check_data_files(spec)
    check_output_dir(Path(spec.output_dir))
    check_reward_functions(spec)
    # Named as not found before output_dir is compared with it (another job?).
    model_dir = resolve_model_dir(spec.model, entry=entry)
    check_model_positions(spec, model_dir)
    if placement is None:
        placement = job_placement(spec)
    writes_files = jax.process_index() == 0
    run_dir = Path(spec.output_dir)
    refuse_another_jobs_directory(spec, run_dir)
    # Hashed once, here: the early refusal and the trainer's checkpoint record read the same fingerprints (a large
    # training file took seconds per hashing).
    files = data_files(spec)
    refuse_changed_training_data(spec, run_dir, files)
    previous_summary = _finished_summary(run_dir)
    # run_dir is made by the Trainer, once the model and the data are read: a job refused for either
    # leaves no directory behind.
    job_model = build_job_model(spec, mesh=getattr(placement, "mesh", None))
    if spec.task == "grpo":
        from jaxengine.grpo import make_grpo_trainer

        trainer, data_summary = make_grpo_trainer(spec, job_model, run_dir, placement=placement, files=files,
                                                  entry=entry)
    elif spec.task == "ppo":
        from jaxengine.ppo import make_ppo_trainer

        trainer, data_summary = make_ppo_trainer(spec, job_model, run_dir, placement=placement, files=files,
                                                 entry=entry)
    else:
        trainer, data_summary = _dataset_trainer(spec, job_model, run_dir, placement=placement, files=files,
                                                 entry=entry, on_log=on_log if writes_files else None)
    run_spec = spec_as_run(spec, job_model.model_dir)
    if writes_files:  # once the model and the data are read: a job that cannot start leaves no spec behind
        (run_dir / "spec.yaml").write_text(dump_spec(run_spec))
        if provenance is not None:  # for the model cards of this run's exports, `jaxengine export`'s too
            from jaxengine.model_card import write_provenance

            write_provenance(run_dir, provenance)
    if writes_files and on_log is not None:
        from jaxengine.data.pipeline import split_by_turn_note

        # A web launch named them in the run's log when it was queued (``runs.services.plan_run``), with the
        # variables of its Run row it left out: said here too, each was named twice.
        if entry is not Entry.LAUNCH and (note := unread_variables_note(job_model)):
            on_log(note)
        if spec.task in ("grpo", "ppo"):  # a dataset trainer said its cuts as soon as its data was encoded
            for warning in data_cut_warnings(data_summary, max_seq_len=spec.data.max_seq_len, section=spec.task):
                on_log(warning)
        for use in ("train", "eval"):
            stats = data_summary.get(use)
            if isinstance(stats, dict) and (note := split_by_turn_note(stats, use=use)):
                on_log(RunLogOnce(note))
    summary = trainer.fit(should_stop=should_stop, on_progress=on_progress, progress_bar=progress_bar,
                          on_evaluation=on_evaluation, on_log=on_log)
    if (previous_summary is not None and summary["status"] == "succeeded"
            and summary["step"] == summary["resumed_from_step"] == previous_summary.get("step")):
        return previous_summary  # run again once done: nothing trained, and its summary says what was
    exported = {}
    if summary["status"] == "succeeded":
        trained = trainer.current_model()  # every process: gathering global arrays may be collective
        if writes_files:
            exported = export_trained(trained, spec, job_model, Path(run_spec.output_dir) / "export",
                                      step=summary["step"], data_summary=data_summary, provenance=provenance)
    summary.update(
        task=spec.task,
        model=run_spec.model,
        peft=spec.peft.method,
        quantization=job_model.quantization,
        data=data_summary,
        export=exported,
        total_seconds=time.perf_counter() - started,
        hosts=spec.hosts,
    )
    if writes_files:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _dataset_trainer(spec: JobSpec, job_model: JobModel, run_dir: Path, *, placement: Any = None,
                     files: dict[str, dict[str, str]], entry: Entry = Entry.SPEC,
                     on_log: Callable[[str], None] | None = None):
    """The Trainer of a task that trains on a fixed dataset (pretrain, sft, reward, dpo) and the data summary;
    ``files`` is ``data_files(spec)``, as ``run_job`` hashed them; ``entry`` as ``run_job`` takes it; ``on_log`` hears
    what the encoding cut or left out (``data_cut_warnings``) as soon as it is done, before the first step (a DPO's
    reference pass, or a refusal of data with no usable row, comes after)."""
    from jaxengine.data import pipeline
    from jaxengine.tasks import (
        REFERENCE_FREE,
        LanguageModelTask,
        PreferenceTask,
        RewardTask,
        with_reference_log_probs,
    )
    from jaxengine.trainer import TrainConfig, Trainer

    model, tokenizer = job_model.model, job_model.tokenizer

    encode = dict(task=spec.task, tokenizer=tokenizer, max_seq_len=spec.data.max_seq_len, loss_on=spec.data.loss_on,
                  vocab_size=job_model.config.vocab_size)
    train_rows = pipeline.read_examples(spec.data.train, kind=pipeline.TASK_KINDS[spec.task],
                                        columns=spec.data.columns,
                                        source=pipeline.spec_source("data.train", spec.task, entry))
    train_examples, train_stats = pipeline.encode_rows(train_rows, **encode, source=spec.data.train)
    eval_rows = _read_eval_rows(spec.data.eval, spec.task, spec.data.columns, entry=entry) if spec.data.eval else []
    eval_examples, eval_stats = pipeline.encode_rows(eval_rows, **encode, source=spec.data.eval)
    if on_log is not None:
        for warning in data_cut_warnings({"train": train_stats.to_dict(), "eval": eval_stats.to_dict()},
                                         max_seq_len=spec.data.max_seq_len):
            on_log(warning)
    if not train_examples:
        raise JobError(f"data.train: {spec.data.train} has no usable rows ({train_stats.to_dict()})")
    rows_per_epoch = pipeline.count_rows_per_epoch(train_examples, max_seq_len=spec.data.max_seq_len,
                                                   packing=spec.data.packing, seed=spec.train.seed)
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else (tokenizer.eos_ids or [0])[0]
    train_config = TrainConfig(
        total_steps=total_steps_for(spec, rows_per_epoch), batch_size=spec.train.batch_size,
        grad_accum=spec.train.grad_accum, max_seq_len=spec.data.max_seq_len, packing=spec.data.packing,
        eval_every=spec.train.eval_every, save_every=spec.train.save_every, keep_last=spec.train.keep_last,
        seed=spec.train.seed, optim=spec.optim, identity=job_identity(spec),
        identity_aliases=earlier_job_identities(spec), resume_settings=resume_settings(spec),
        recorded_settings=recorded_settings(spec), data_files=files,
    )
    if spec.task == "dpo":
        task: Any = PreferenceTask.from_spec(spec.dpo)
        if spec.dpo.loss not in REFERENCE_FREE:
            # The initial model is the reference: the base itself under LoRA (fresh adapters add zero).
            # Only for the pairs the run's steps will read: a run of max_steps over part of a large
            # preference set would otherwise spend most of its time on references it never uses.
            reference = dict(batch_size=spec.train.batch_size, max_seq_len=spec.data.max_seq_len, pad_id=pad_id)
            drawn = pipeline.examples_drawn(len(train_examples), seed=spec.train.seed, draws=(
                train_config.total_steps * spec.train.batch_size * spec.train.grad_accum))
            train_examples = with_reference_log_probs(model, train_examples, only=drawn, **reference)
            eval_examples = with_reference_log_probs(model, eval_examples, **reference)
    elif spec.task == "reward":
        task = RewardTask(center_rewards_coefficient=spec.reward.center_rewards_coefficient)
    else:
        task = LanguageModelTask(name=spec.task, unpacked=not spec.data.packing,
                                 logits_memory_budget=spec.train.logits_memory_mb << 20)
    generates = spec.task != "reward"
    sample_rows = [row for row in eval_rows if generates and isinstance(row.get("prompt"), (str, list))]
    sample_rows = sample_rows[: spec.train.eval_samples]
    eval_hook = make_sample_hook(tokenizer=tokenizer, rows=sample_rows, samples_path=run_dir / "samples.jsonl",
                                 max_new_tokens=spec.train.sample_max_new_tokens,
                                 group_labels=eval_group_labels(spec, sample_rows)) if sample_rows else None
    trainer = Trainer(model=model, task=task, config=train_config,
                      train_examples=train_examples, eval_examples=eval_examples, pad_id=pad_id, run_dir=run_dir,
                      trainable=job_model.trainable, eval_hook=eval_hook, placement=placement)
    return trainer, {"train": train_stats.to_dict(), "eval": eval_stats.to_dict(), "rows_per_epoch": rows_per_epoch}
