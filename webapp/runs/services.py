"""Writes to runs: create (validate, save, enqueue), cancel, resume, retry, notes and tags, archive,
and the reaping of runs whose worker went silent and of checkpoint exports whose worker was lost. Callers check access first
(``webapp.runs.access.get_run_for_user`` / ``get_project_for_user`` with the member role).

A spec as people write it names its starting model and datasets by public id — ``model: bm_…`` (a
registered base model) or ``model: run_…`` (the exported model of a succeeded run, so runs chain:
SFT → DPO → …), ``data.train: dv_…`` (a ready dataset version of the task's kind), ``ppo.reward_model:
run_…`` (a succeeded reward run, whose exported reward model scores PPO's rollouts) — and has no
``output_dir``: Temper gives every run ``DATA_ROOT/runs/<run id>``. ``plan_run`` maps those ids to
paths and validates the result with ``jaxengine.spec.parse_spec``, so the web accepts exactly what
the engine will run, and every problem comes back under the key it concerns.
"""
from __future__ import annotations

import ast
import copy
import functools
import hashlib
import itertools
import json
import logging
import os
import re
import secrets
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
import yaml
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.http import Http404
from django.template.defaultfilters import filesizeformat
from django.utils import timezone

from jaxengine.checkpoint.step_folders import checkpoint_folder_incomplete
from jaxengine.spec import (TASK_DATASET_KINDS, JobSpec, SpecError, duplicate_key_problems, in_schema_order, parse_spec,
                            parse_spec_text, spec_warnings)
from jaxengine.spec import load_yaml as load_spec_yaml
from jaxengine.words import counted, with_article
from webapp.activity.models import TargetKind, Verb
from webapp.activity.services import activity_record
from webapp.basemodels.models import BaseModel
from webapp.basemodels.selectors import (REGISTER_AGAIN, base_model_refusal, gone_model_words, load_refusal,
                                        model_dir_gone, named_model)
from webapp.celery import app as celery_app
from webapp.core.bidi import isolated
from webapp.core.model_refs import spec_ref
from webapp.core.numbers import MAX_STORED_INT, whole_number
from webapp.core.templatetags.temper import when
from webapp.core.text import LONG_TEXT_MAX_CHARS, checked_json, checked_name, checked_text
from webapp.core.warnings import warning_action
from webapp.datasets import selectors as dataset_selectors
from webapp.datasets.models import DatasetVersion, VersionStatus
from webapp.projects.models import Project
from webapp.projects.services import project_lock
from webapp.runs import channels, sweeps
from webapp.runs.models import (ACTIVE_STATUSES, Artifact, ArtifactKind, CheckpointExport, CheckpointExportStatus, LogLevel,
                                ProjectCheckpointPrune, ProjectMetricName, Run, RunLogLine, RunStatus, RunTag, ServingCopy,
                                ServingCopyStatus, fold_tag, new_run_id)
from webapp.runs.specform import SET_BY_TEMPER, merge_spec, spec_initial, tasks, without_rivals
from webapp.webhooks import services as webhooks
from webapp.workers.deliveries import KOMBU_PRIORITY_SEP, KOMBU_UNACKED_KEY, LostWorker, abandoned_tags
from webapp.workers.models import Worker
from webapp.workers.selectors import pool_offers

if TYPE_CHECKING:
    from jaxengine.tokenizer import TokenizerSettings

logger = logging.getLogger(__name__)

TRAIN_TASK = "worker.tasks.train.train_run"
# The task of a run trained elsewhere and logged into Temper through the API.
EXTERNAL_TASK = "external"
# An sft eval file may also be a prompts file with an ``answer`` column (exact-match scoring).
EVAL_KINDS: dict[str, tuple[str, ...]] = {"sft": ("sft", "prompts")}
MAX_TAGS = 20
MAX_TAG_LENGTH = 40
RUNS_DIRECTORY = "runs"
CHECKPOINTS_DIRECTORY = "checkpoints"  # under a run directory: one folder per saved step (orbax)


def train_kinds(task: str) -> tuple[str, ...]:
    """The dataset kind a task trains on, as the engine's spec says (``TASK_DATASET_KINDS``)."""
    kind = TASK_DATASET_KINDS.get(task)
    return (kind,) if kind else ()


def eval_kinds(task: str) -> tuple[str, ...]:
    return EVAL_KINDS.get(task, train_kinds(task))


def run_output_dir(public_id: str) -> Path:
    return Path(settings.DATA_ROOT) / RUNS_DIRECTORY / public_id


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """A validated spec: as written (``spec``, ids) and as the engine runs it (``resolved``, paths, and
    ``job``, parsed)."""

    task: str
    spec: dict[str, Any]
    resolved: dict[str, Any]
    job: JobSpec
    base_model: BaseModel | None
    source_run: Run | None
    dataset_versions: list[DatasetVersion] = field(default_factory=list)
    # The base model of ``ppo.reward_model``'s reward run: the memory estimate counts that model.
    reward_base_model: BaseModel | None = None
    # The model's tokenizer settings (its chat template and variables), read once for every check of the plan;
    # None when its files cannot be read (the run's start says what is wrong with them).
    tokenizer: TokenizerSettings | None = None
    # The data.chat_template_kwargs.date_string the plan fixed itself (``_fix_template_date``); None if none.
    stamped_template_date: str | None = None
    # Variables its model's chat template never reads, left out of what the run renders and exports: its source
    # run's Run row's (``_without_unread_inherited``) and its model directory's own (``_models_own_unread``), for the
    # run's log to say once.
    dropped_template_variables: tuple[str, ...] = ()


def _add(errors: dict[str, list[str]], key: str, message: str) -> None:
    # Once: a problem both Temper's checks and the engine's schema find (an unknown task) was told twice.
    if message not in errors.setdefault(key, []):
        errors[key].append(message)


# The largest step count a run records (Run.total_steps and the step columns are PositiveIntegerFields).
# The engine's schema has no upper bound on max_steps, and a larger one failed the INSERT (a 500 page)
# instead of naming the field.
MAX_RUN_STEPS = MAX_STORED_INT


def _steps_problem(max_steps: int | None) -> str | None:
    if max_steps is not None and max_steps > MAX_RUN_STEPS:
        return f"{max_steps} steps is more than a run can record; give at most {MAX_RUN_STEPS:,}"
    return None


def gone_model(*, path: str, base_model: BaseModel | None, source_run: Run | None, step: int | None = None) -> str:
    """What the model directory ``path`` a run would load is, named as the project names it (a run's export, one of
    its exported checkpoints ``step``, a base model: ``gone_model_words``), when it was deleted from disk since
    (``model_dir_gone``); "" while it is there. The train worker, given it, failed the run naming the path and the
    command line's presets."""
    if not model_dir_gone(path):
        return ""
    return gone_model_words(
        run=named_model(source_run.name, source_run.public_id) if source_run is not None else "", step=step,
        base_model=named_model(base_model.name, base_model.public_id) if base_model is not None else "")


def starting_model_gone(run: Run) -> str:
    """``gone_model`` of the directory ``run`` starts from (its resolved spec's ``model``), named by its spec's
    reference: a resume trains on it again, a retry and a copy launch from it."""
    path = (run.resolved_spec or {}).get("model")
    if not isinstance(path, str) or not path:
        return ""
    reference = run.spec.get("model") if isinstance(run.spec, dict) else None
    _run_id, at, step = reference.partition("@") if isinstance(reference, str) else ("", "", "")
    return gone_model(path=path, base_model=run.base_model, source_run=run.source_run,
                      step=whole_number(step) if at else None)


def _resolve_model(project: Project, reference: Any, errors) -> tuple[str, BaseModel | None, Run | None]:
    if not isinstance(reference, str) or not reference.strip():
        _add(errors, "model", "choose a starting model: a base model (bm_…) or a succeeded run's export (run_…)")
        return "", None, None
    reference = reference.strip()
    if reference.startswith("bm_"):
        base_model = BaseModel.objects.filter(project=project, public_id=reference).first()
        if base_model is None:
            _add(errors, "model", f"{reference!r} is not a base model of {project.slug}")
            return "", None, None
        if refusal := base_model_refusal(base_model=base_model):  # registered before it lay in another project's folder
            _add(errors, "model", refusal)
            return "", None, None
        if gone := gone_model(path=base_model.path, base_model=base_model, source_run=None):
            _add(errors, "model", f"{gone}; {REGISTER_AGAIN} and choose it, or choose another model")
            return "", None, None
        return base_model.path, base_model, None
    if reference.startswith("run_"):
        run_id, at, step = reference.partition("@")
        source = Run.objects.filter(project=project, public_id=run_id).first()
        if source is None:
            _add(errors, "model", f"{run_id!r} is not a run of {project.slug}")
            return "", None, None
        if at:
            # run_…@N: the exported checkpoint N of a run (see checkpoint_export_request).
            step_number = whole_number(step)
            exported = (source.artifacts.filter(kind=ArtifactKind.CHECKPOINT, step=step_number).first()
                        if step_number is not None else None)
            if exported is None:
                _add(errors, "model", f"checkpoint {step} of {run_id} is not exported; export it on the run's page")
                return "", None, None
            if gone := gone_model(path=exported.path, base_model=source.base_model, source_run=source,
                                  step=step_number):
                _add(errors, "model", f"{gone}; choose another starting model")
                return "", None, None
            return exported.path, source.base_model, source
        exported = source.artifacts.filter(kind=ArtifactKind.MODEL).first()
        if source.status != RunStatus.SUCCEEDED or exported is None:
            _add(errors, "model", f"run {reference} has no exported model (it {source.status_phrase}); "
                                  "start from a succeeded run or a base model")
            return "", None, None
        if gone := gone_model(path=exported.path, base_model=source.base_model, source_run=source):
            _add(errors, "model", f"{gone}; choose another starting model")
            return "", None, None
        return exported.path, source.base_model, source
    _add(errors, "model", f"{reference!r} is neither a base model id (bm_…) nor a run id (run_…)")
    return "", None, None


def _resolve_reward_run(project: Project, reference: Any, errors, *, key: str = "ppo.reward_model",
                        for_api: bool = False) -> str:
    """The exported reward model of a succeeded ``task: reward`` run of ``project`` (``ppo.reward_model:
    run_…``, or the ``model`` argument of a ``reward_model`` reward function); a server path is refused,
    so a spec reads no model outside its project. ``for_api``: the REST API's words for training it again."""
    if not isinstance(reference, str) or not reference.strip().startswith("run_"):
        _add(errors, key, "choose a succeeded reward run of this project (run_…)")
        return ""
    reference = reference.strip()
    source = Run.objects.filter(project=project, public_id=reference).first()
    if source is None:
        _add(errors, key, f"{reference!r} is not a run of {project.slug}")
        return ""
    if source.task != "reward":
        _add(errors, key, f"run {reference} is {with_article(source.task)} run; choose a task: reward run")
        return ""
    exported = source.artifacts.filter(kind=ArtifactKind.MODEL).first()
    if source.status != RunStatus.SUCCEEDED or exported is None:
        _add(errors, key, f"run {reference} has no exported reward model (it {source.status_phrase})")
        return ""
    # Queued, the run failed in the train worker on the missing folder.
    if gone := gone_model(path=exported.path, base_model=None, source_run=source):
        retry = f"POST runs/{source.public_id}/retry/" if for_api else "Retry on its page"
        _add(errors, key, f"{gone}; choose another reward run of this project, or train this one again as a new "
                          f"run ({retry})")
        return ""
    return exported.path


def reward_run_path(*, project: Project, reference: Any, key: str) -> str:
    """The exported model of the reward run ``reference`` of ``project`` (a ``reward_model`` reward function's
    ``model``), checked as a launch checks it; a ``ValidationError`` keyed ``key`` otherwise (an evaluation's)."""
    errors: dict[str, list[str]] = {}
    path = _resolve_reward_run(project, reference, errors, key=key)
    if errors:
        raise ValidationError(errors)
    return path


def _resolve_dataset(project: Project, key: str, reference: Any, kinds: tuple[str, ...], task: str,
                     errors) -> DatasetVersion | None:
    if not isinstance(reference, str) or not reference.startswith("dv_"):
        _add(errors, key, f"choose a ready dataset version (dv_…) of kind {' or '.join(kinds) or '—'}")
        return None
    version = (DatasetVersion.objects.select_related("dataset")
               .filter(dataset__project=project, public_id=reference).first())
    if version is None:
        _add(errors, key, f"{reference!r} is not a dataset version of {project.slug}")
        return None
    if version.status != VersionStatus.READY:
        remedy = ("fix the file and upload it again" if version.status == VersionStatus.FAILED
                  else "wait for its check to end")
        _add(errors, key, f"{version} {version.status_phrase}: a run trains on a ready version only; {remedy}")
        return None
    if version.dataset.kind not in kinds:
        _add(errors, key, f"{version} is {with_article(version.dataset.kind)} dataset; {task} needs {' or '.join(kinds)}")
        return None
    return version


REWARD_LIST_KEYS = ("rewards", "eval_metrics")


def _reward_model_terms(spec: dict[str, Any]):
    """(key, term) for every ``reward_model`` reward function of the task's section (``grpo`` or
    ``ppo``): their ``args.model`` is a run id in a written spec and a path in the engine's."""
    task = spec.get("task")
    section = spec.get(task) if task in ("grpo", "ppo") and isinstance(spec.get(task), dict) else {}
    for list_key in REWARD_LIST_KEYS:
        terms = section.get(list_key)
        if not isinstance(terms, list):
            continue
        for index, term in enumerate(terms):
            if isinstance(term, dict) and term.get("name") == "reward_model" and isinstance(term.get("args"), dict):
                yield f"{task}.{list_key}.{index}.args.model", term


def reward_references(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """``(key, run id)`` for each reward run a written spec scores with (``ppo.reward_model`` and the
    ``model`` of its ``reward_model`` reward functions): their exported models are read from their
    directories while it trains."""
    if not isinstance(spec, dict):  # an external run's
        return []
    ppo = spec.get("ppo") if spec.get("task") == "ppo" and isinstance(spec.get("ppo"), dict) else {}
    references = [("ppo.reward_model", ppo.get("reward_model"))] + [
        (key, term["args"].get("model")) for key, term in _reward_model_terms(spec)]
    return [(key, reference.strip()) for key, reference in references
            if isinstance(reference, str) and reference.strip()]


def reward_run_ids(spec: dict[str, Any]) -> set[str]:
    """The reward runs a written spec scores with (``reward_references``)."""
    return {reference for _key, reference in reward_references(spec)}


def deleted_reward_models(run: Run) -> list[tuple[str, str]]:
    """``reward_references`` of ``run``'s spec whose run was deleted since."""
    references = reward_references(run.spec)
    present = set(Run.objects.filter(project=run.project_id, public_id__in=[ref for _key, ref in references])
                  .values_list("public_id", flat=True))
    return [(key, reference) for key, reference in references if reference not in present]


def gone_reward_exports(run: Run) -> list[str]:
    """The reward runs ``run``'s spec scores with (``reward_references``) that are still there but whose exported
    model's folder was deleted from disk since (``model_dir_gone``, as a launch judges it in ``_resolve_reward_run``):
    a resume or a retry reads it again, and queued, failed in the train worker on the missing folder."""
    references = {reference for _key, reference in reward_references(run.spec)}
    if not references:
        return []
    exports = Artifact.objects.filter(run__project=run.project_id, run__public_id__in=references,
                                      kind=ArtifactKind.MODEL).values_list("run__public_id", "path")
    return sorted({reference for reference, path in exports if model_dir_gone(path)})


def _columns(data: dict[str, Any], train: DatasetVersion | None, evaluation: DatasetVersion | None,
             errors) -> dict[str, str]:
    """``data.columns`` for the engine: the training version's column mapping (the stored file keeps
    its own column names). The engine reads the evaluation file with the same mapping, so its version must
    have been mapped the same way: an unmapped one under a mapped training set has none of the columns."""
    columns = dict(train.column_mapping) if train is not None else {}
    if evaluation is not None and dict(evaluation.column_mapping or {}) != columns:
        _add(errors, "data.eval", f"{evaluation} maps its columns as {evaluation.column_mapping or 'given'}, the "
                                  f"training data as {columns or 'given'}; one run reads both with one mapping")
    given = data.get("columns")
    if given not in (None, {}) and given != columns:
        _add(errors, "data.columns", SET_BY_TEMPER["data.columns"])
    return columns


def without_temper_keys(problem: str) -> str:
    """An engine problem as the web says it: its list of allowed keys without those Temper sets (the
    list offered output_dir, which the launch then refused)."""
    head, marker, allowed = problem.partition("allowed keys here: ")
    if not marker:
        return problem
    # "spec:3: data.colums: unknown key; ..." lists the keys of the section holding the unknown one
    dotted = head.rsplit(": unknown key", 1)[0].rsplit(": ", 1)[-1]
    section = dotted.rsplit(".", 1)[0] + "." if "." in dotted else ""
    keys = [key for key in allowed.split(", ") if section + key not in SET_BY_TEMPER]
    return f"{head}{marker}{', '.join(keys)}"


def _spec_problems(problems: list[str], errors) -> None:
    # parse_spec without a source gives "dotted.key: message" per problem.
    for problem in map(without_temper_keys, problems):
        key, sep, message = problem.partition(": ")
        if sep and " " not in key:
            _add(errors, key, message)
        else:
            _add(errors, "__all__", problem)


def plan_run(*, project: Project, spec: Any, output_dir: Path, for_api: bool = False) -> RunPlan:
    """Map a written spec's ids to paths and validate it with the engine's schema.

    Raises ``ValidationError`` with one entry per wrong key (``model``, ``data.train``,
    ``optim.learning_rate``, ...); ``for_api``: a way out in the REST API's words rather than the pages'."""
    errors: dict[str, list[str]] = {}
    if not isinstance(spec, dict):
        raise ValidationError({"__all__": ["the spec must be a mapping of keys (task, model, data, ...)"]})
    spec = copy.deepcopy(spec)
    if "model" in spec:
        spec["model"] = spec_ref(spec["model"])  # a checkpoint as the chat and /v1 name it, run_…:step-N, too
    if "output_dir" in spec:
        _add(errors, "output_dir", SET_BY_TEMPER["output_dir"])
        spec.pop("output_dir")
    task = spec.get("task")
    if task not in tasks():
        _add(errors, "task", f"{task!r} is not one of {', '.join(tasks())}")
    model_path, base_model, source_run = _resolve_model(project, spec.get("model"), errors)
    data = spec.get("data") if isinstance(spec.get("data"), dict) else {}
    versions = []
    resolved_data = dict(data)
    train = _resolve_dataset(project, "data.train", data.get("train"), train_kinds(task), task, errors)
    if train is not None:
        versions.append(train)
        resolved_data["train"] = str(train.absolute_path)
    evaluation = None
    if data.get("eval") not in (None, ""):
        evaluation = _resolve_dataset(project, "data.eval", data.get("eval"), eval_kinds(task), task, errors)
        if evaluation is not None:
            versions.append(evaluation)
            resolved_data["eval"] = str(evaluation.absolute_path)
    else:
        resolved_data.pop("eval", None)
    columns = _columns(data, train, evaluation, errors)
    if columns:
        resolved_data["columns"] = columns
    else:
        resolved_data.pop("columns", None)
    # The variables a run's model trained with, from its Run row alone: the engine and this launch's checks read none
    # from its directory's spec.yaml (an export made before exports kept chat_template_kwargs.json had them there).
    own_variables = data.get("chat_template_kwargs") or {}
    model_variables = trained_template_kwargs(source_run) if source_run is not None else {}
    if model_variables and isinstance(own_variables, dict):
        resolved_data["chat_template_kwargs"] = {**model_variables, **own_variables}
    if data.get("run_spec_template_kwargs") is not None:
        _add(errors, "data.run_spec_template_kwargs", SET_BY_TEMPER["data.run_spec_template_kwargs"])
    resolved_data.pop("run_spec_template_kwargs", None)
    if source_run is not None:
        resolved_data["run_spec_template_kwargs"] = False
    # Unresolved references stay as placeholders so that the schema still checks every other key.
    resolved = {**spec, "model": model_path or "unresolved", "output_dir": str(output_dir),
                "data": {**resolved_data, "train": resolved_data.get("train") or "unresolved"}}
    ppo = spec.get("ppo") if task == "ppo" and isinstance(spec.get("ppo"), dict) else {}
    if ppo.get("reward_model") not in (None, ""):
        resolved["ppo"] = {**ppo, "reward_model": _resolve_reward_run(project, ppo["reward_model"], errors,
                                                                      for_api=for_api) or "unresolved"}
    # A reward_model function reads a model from disk: only a reward run of this project may name it.
    resolved = copy.deepcopy(resolved)
    for key, term in _reward_model_terms(resolved):
        term["args"]["model"] = _resolve_reward_run(project, term["args"].get("model"), errors, key=key,
                                                    for_api=for_api) or "unresolved"
    tokenizer = _model_tokenizer_settings(model_path, run_spec_variables=source_run is None) if model_path else None
    dropped = ()
    if tokenizer is not None and model_variables and isinstance(own_variables, dict):
        dropped = _without_unread_inherited(tokenizer, resolved, inherited=model_variables.keys() - own_variables.keys())
    stamped_date = None
    if tokenizer is not None and task in tasks() and task != "pretrain":
        stamped_date = _fix_template_date(tokenizer, resolved)
    if tokenizer is not None:
        dropped = tuple(sorted({*dropped, *_models_own_unread(tokenizer, resolved)}))
    try:
        job = parse_spec(resolved)
    except SpecError as error:
        _spec_problems(error.problems, errors)
        job = None
    if job is not None:
        _check_layout(job, errors)
        if problem := _steps_problem(job.train.max_steps):
            _add(errors, "train.max_steps", problem)
        _check_sample_budget(job, base_model, errors)
        _check_rollout_room(job, base_model, errors)
        if model_path:
            _check_model_positions(job, model_path, errors)
        _check_eval_groups(job, evaluation, errors)
        _check_reference_columns(job, train, evaluation, errors)
        if tokenizer is not None and task != "pretrain" and _check_chat_template(
                tokenizer, model_path, errors, template_kwargs=job.data.chat_template_kwargs):
            _check_chat_shapes(tokenizer, [("data.train", train), ("data.eval", evaluation)], errors,
                               template_kwargs=job.data.chat_template_kwargs)
    if errors:
        raise ValidationError(errors)
    resolved = job.model_dump(mode="json")
    written = copy.deepcopy(resolved)
    written.pop("output_dir")
    written["model"] = spec["model"].strip()
    written["data"]["train"] = data["train"]
    written["data"]["eval"] = data.get("eval") or None
    written["data"].pop("columns", None)  # derived from the dataset versions, not written
    written["data"].pop("run_spec_template_kwargs", None)  # from the model's reference, not written
    if model_variables:  # the resolved spec's alone: a copy of the run, started from another model, does not carry them
        written["data"]["chat_template_kwargs"] = {name: value for name, value in
                                                   written["data"]["chat_template_kwargs"].items()
                                                   if name in own_variables or name not in model_variables}
    if ppo.get("reward_model") not in (None, ""):
        written["ppo"]["reward_model"] = ppo["reward_model"].strip()
    for (key, term), (_, given) in zip(_reward_model_terms(written), _reward_model_terms(spec)):
        term["args"]["model"] = given["args"]["model"].strip()
    from webapp.runs.selectors import reward_base_model  # selectors build on this module

    return RunPlan(task=job.task, spec=written, resolved=resolved, job=job, base_model=base_model,
                   source_run=source_run, dataset_versions=versions,
                   reward_base_model=reward_base_model(project=project, spec=written), tokenizer=tokenizer,
                   stamped_template_date=stamped_date, dropped_template_variables=dropped)


def trained_template_kwargs(run: Run) -> dict[str, Any]:
    """The ``data.chat_template_kwargs`` ``run`` trained with, from its Run row (its resolved spec: a run logged from
    elsewhere has none), which a run started from its model or a checkpoint of it renders with under its own spec's
    (``plan_run``). An export keeps them in its ``chat_template_kwargs.json``; one made before exports kept them has
    none, and the engine then read them from the source run directory's ``spec.yaml`` alone: a file moved, deleted or
    written over changed what the new run trained with."""
    variables = ((run.resolved_spec or {}).get("data") or {}).get("chat_template_kwargs")
    return dict(variables) if isinstance(variables, dict) else {}


def _model_tokenizer_settings(model_path: str, *, run_spec_variables: bool = True) -> TokenizerSettings | None:
    """``jaxengine.tokenizer.read_tokenizer_settings`` of a model directory; None when it is not one or its files
    cannot be read (the run's start says what is wrong with them). ``run_spec_variables=False`` for a run's model,
    whose variables are its Run row's, as the engine reads it (``data.run_spec_template_kwargs``)."""
    from jaxengine import chat_template
    from jaxengine.tokenizer import TokenizerError, read_tokenizer_settings

    try:
        return (read_tokenizer_settings(model_path, run_spec_variables=run_spec_variables)
                if Path(model_path).is_dir() else None)
    except (TokenizerError, chat_template.ChatTemplateError, OSError):
        return None


def _without_unread_inherited(tokenizer: TokenizerSettings, resolved: dict[str, Any], *,
                              inherited: Iterable[str]) -> tuple[str, ...]:
    """Leave out of the resolved spec's ``data.chat_template_kwargs`` the ``inherited`` variables (the source run's
    Run row's, not the spec's own) that the model's chat template never reads, and name them. They render nothing,
    and carried on they were warned of again at the launch of every descendant (the warning belongs to the launch
    whose author wrote them, ``spec_warnings``); the run's log says once that they were left out. A template that
    cannot be read drops nothing (the run's start says what is wrong with it)."""
    from jaxengine.chat_template import unread_variables

    unread = unread_variables(inherited, tokenizer.chat_template)
    if unread:
        data = resolved["data"]
        resolved["data"] = {**data, "chat_template_kwargs": {
            name: value for name, value in data["chat_template_kwargs"].items() if name not in unread}}
    return unread


def _models_own_unread(tokenizer: TokenizerSettings, resolved: dict[str, Any]) -> tuple[str, ...]:
    """The model directory's own variables (its ``chat_template_kwargs.json``) that the engine leaves out of the run's
    renders and exports (``jaxengine.job._without_unread_own_variables``, the same rule on the same files): not in
    the resolved spec's variables, never read by the model's chat template. The launch names them in the run's log
    with those it left out of the Run row's (``_without_unread_inherited``), once; the engine, told the run came
    from a launch, does not name them again."""
    from jaxengine.chat_template import unread_variables

    variables = resolved["data"].get("chat_template_kwargs") or {}
    if not isinstance(variables, dict):
        return ()  # the schema names what is wrong with it
    return unread_variables(set(tokenizer.template_kwargs) - set(variables), tokenizer.chat_template)


def _fix_template_date(tokenizer: TokenizerSettings, resolved: dict[str, Any]) -> str | None:
    """Record the launch's date as ``data.chat_template_kwargs.date_string`` where the model's chat template stamps
    the day it renders when that is unset (Llama 3.2's) and neither the spec nor the model's own variables set it
    (``jaxengine.chat_template.date_to_fix``, as ``jaxengine train`` fixes it): the run's spec, shown as its config,
    then holds it, and every attempt, evaluation and export (and the chat of its model) renders that date rather than
    the day of each. The date it wrote, for the run to record (``Run.stamped_template_date``); None if none."""
    from jaxengine import chat_template

    data = resolved["data"]
    variables = data.get("chat_template_kwargs", {})
    if not isinstance(variables, dict):
        return None  # the schema names what is wrong with it
    date = chat_template.date_to_fix(tokenizer.chat_template, variables=variables,
                                     model_variables=tokenizer.template_kwargs)
    if date is not None:
        resolved["data"] = {**data, "chat_template_kwargs": {**variables, chat_template.DATE_VARIABLE: date}}
    return date


def _check_sample_budget(job, base_model: BaseModel | None, errors) -> None:
    """The eval generations' token budget must leave the model's context room for a prompt: the run
    failed at its first evaluation otherwise, steps into training."""
    context = base_model.context_length if base_model is not None else None
    if context and job.task != "reward" and job.data.eval is not None and job.train.sample_max_new_tokens >= context:
        _add(errors, "train.sample_max_new_tokens",
             f"{job.train.sample_max_new_tokens} tokens leave no room for a prompt in the model's context of "
             f"{context} tokens; give fewer (the eval samples are short previews: the default is 64)")


def _check_rollout_room(job, base_model: BaseModel | None, errors) -> None:
    """GRPO and PPO completions must leave data.max_seq_len, and the model's context, room for a prompt
    (the engine refuses such a job at its start, after the run was made)."""
    rollouts = getattr(job, job.task, None) if job.task in ("grpo", "ppo") else None
    if rollouts is None:
        return
    context = base_model.context_length if base_model is not None else None
    if rollouts.max_new_tokens >= job.data.max_seq_len:
        _add(errors, f"{job.task}.max_new_tokens",
             f"{rollouts.max_new_tokens} completion tokens leave no room for a prompt in data.max_seq_len "
             f"({job.data.max_seq_len}); raise data.max_seq_len above it or lower {job.task}.max_new_tokens")
    elif context and rollouts.max_new_tokens >= context:
        _add(errors, f"{job.task}.max_new_tokens",
             f"{rollouts.max_new_tokens} completion tokens leave no room for a prompt in the model's context of "
             f"{context} tokens; lower {job.task}.max_new_tokens below {context}")


def _check_model_positions(job, model_path: str, errors) -> None:
    """``data.max_seq_len`` must stay within the positions the model's config.json gives it (its RoPE scaling's
    extended range where it declares one), as the engine checks at the run's start: past them the run trained
    on positions the model never saw, with no word."""
    from jaxengine.models.config import max_seq_len_problem, read_position_limit

    if problem := max_seq_len_problem(job.data.max_seq_len, read_position_limit(model_path)):
        _add(errors, "data.max_seq_len", problem)


def _check_eval_groups(job, evaluation: DatasetVersion | None, errors) -> None:
    """``data.eval_group_by`` must name a short label on every eval row (as the engine checks at the
    run's start, where a missing column failed the run): read the eval version here and say so."""
    if job.data.eval_group_by is None or evaluation is None:
        return
    path = evaluation.absolute_path
    if problem := _eval_groups_problem(str(path), _modified_ns(path), evaluation.format, evaluation.dataset.kind,
                                       json.dumps(evaluation.column_mapping or {}, sort_keys=True),
                                       job.data.eval_group_by, str(evaluation)):
        _add(errors, "data.eval_group_by", problem)


@functools.lru_cache(maxsize=16)
def _eval_groups_problem(path: str, modified_ns: int | None, file_format: str, kind: str, columns: str,
                         group_by: str, source: str) -> str | None:
    """What the eval file (as last modified at ``modified_ns``) lacks to be grouped by ``group_by``, or
    None: the whole file is read, once for every plan of a sweep and every live check of the launch page."""
    from jaxengine.data import formats
    from jaxengine.evaluate import group_labels

    mapping = formats.ColumnMapping(kind=kind, columns=json.loads(columns))
    try:
        launched = formats.DataSource(entry=formats.Entry.LAUNCH, key="data.eval")
        group_labels(list(formats.iter_examples(Path(path), fmt=formats.FileFormat(file_format), mapping=mapping,
                                                source=launched)),
                     group_by, source=source)
    except (ValueError, OSError, formats.DatasetFormatError) as error:
        return str(error).removeprefix("data.eval_group_by: ")
    return None


# Rows of a version read at launch for its reward's reference column: enough to catch a column the
# data lacks, few enough for the launch page's live check of every edit.
REFERENCE_ROWS_CHECKED = 1000


def _check_reference_columns(job, train: DatasetVersion | None, evaluation: DatasetVersion | None, errors) -> None:
    """A reward (``grpo``/``ppo``: ``rewards`` on data.train and data.eval, ``eval_metrics`` on data.eval)
    reading its reference answer from a column (``answer_column``) the data lacks, or holding one it cannot
    score (numeric_match on words), named at the term's input here: the engine checks it when the run
    starts, where the run failed seconds after the launch."""
    from jaxengine.rewards import WeightedReward, missing_reference_column, unscorable_reference

    options = getattr(job, job.task, None) if job.task in ("grpo", "ppo") else None
    if options is None:
        return
    terms = [(f"{job.task}.rewards.{index}", term, (train, evaluation)) for index, term in enumerate(options.rewards)]
    terms += [(f"{job.task}.eval_metrics.{index}", term, (evaluation,)) for index, term in enumerate(options.eval_metrics)]
    for key, term, versions in terms:
        for version in (version for version in versions if version is not None):
            rows = _first_rows(str(version.absolute_path), _modified_ns(version.absolute_path), version.format,
                               version.dataset.kind, json.dumps(version.column_mapping or {}, sort_keys=True))
            scored = [WeightedReward(name=term.name, args=term.args)]
            if missing := missing_reference_column(scored, rows):
                _name, column, number = missing
                _add(errors, f"{key}.args.answer_column",
                     f"{term.name} reads the reference answer from column '{column}', and row {number} of {version} "
                     f"has none; give the column that holds the answers, or other data")
                break
            if unscorable := unscorable_reference(scored, rows):
                _name, number, problem = unscorable
                _add(errors, f"{key}.args.answer_column",
                     f"{term.name} cannot score row {number} of {version}: {problem}; correct the row, or give "
                     "another column")
                break


def _check_chat_shapes(tokenizer: TokenizerSettings, versions: list[tuple[str, DatasetVersion | None]], errors, *,
                       template_kwargs: dict[str, Any]) -> None:
    """Chats of a shape the model's chat template refuses (Gemma's, unless the turns alternate user and assistant),
    which validation counted (``formats.ChatShapes``), named at their data key: the run stopped at its start, on
    the first such row. Each shape found is tried once, as a probe chat, with the model's template and the
    variables the run renders with (the model's own, then ``data.chat_template_kwargs``: a template may refuse a
    shape only with some of them)."""
    from jaxengine.data import formats

    found = [(key, version, shape, tally) for key, version in versions if version is not None
             for shape, tally in ((version.statistics or {}).get("chat_shapes") or {}).items()
             if tally.get("count") and shape in formats.CHAT_SHAPES]
    if not found:
        return
    _template, render = _chat_renderer(tokenizer, template_kwargs)
    for key, version, shape, tally in found:
        if (refusal := formats.chat_shape_refusal(shape, render)) is None:
            continue
        count, rows = tally["count"], tally.get("rows") or []
        named = f"row{'s' if count != 1 else ''} {', '.join(map(str, rows))}{', …' if count > len(rows) else ''}"
        _add(errors, key, f"{count:,} row{'s' if count != 1 else ''} of {version} ({named}) "
                          f"hold{'s' if count == 1 else ''} {formats.CHAT_SHAPES[shape][0]}, which the model's chat "
                          f"template refuses ({refusal}), so the run would stop at its start: put a system turn first "
                          "and user and assistant turns in turn in those chats, or choose a model whose template "
                          "takes them")


# A chat every template takes (Gemma's, Llama's, Mistral's strict alternation): one that fails on it fails on
# every row, prompt-and-completion texts too (rendered as these two turns).
PLAIN_CHAT = [{"role": "user", "content": "user text"}, {"role": "assistant", "content": "assistant text"}]


def _check_chat_template(tokenizer: TokenizerSettings, model_path: str, errors, *,
                         template_kwargs: dict[str, Any]) -> bool:
    """Whether the model's chat template renders ``PLAIN_CHAT`` as a run renders it (whole, and its prompt); where
    it fails (its own raise_exception, a bug such as 1/0, a rendering past ``chat_template``'s bounds), the run
    would stop at its start: said at ``model``, naming the file and the template's error."""
    from jaxengine import chat_template
    from jaxengine.tokenizer import chat_template_file

    if tokenizer.chat_template is None:
        return True  # DEFAULT_CHAT_TEMPLATE
    _template, render = _chat_renderer(tokenizer, template_kwargs)
    try:
        render(PLAIN_CHAT, False)
        render(PLAIN_CHAT[:1], True)
    except chat_template.ChatTemplateError as error:
        advice = "" if str(error).endswith(chat_template.BROKEN_TEMPLATE_ADVICE) else (
            ": fix the template in that file, or choose another model")
        _add(errors, "model", f"{chat_template_file(model_path, tokenizer)}: {error}. It fails on a plain chat of a "
                              "user turn and an assistant turn, as the run renders every row, so the run would stop at "
                              f"its start{advice}")
        return False
    return True


def _chat_renderer(tokenizer: TokenizerSettings, template_kwargs: dict[str, Any]):
    """``(template, render)`` for a model's chat template (``tokenizer``: its tokenizer settings),
    ``render(messages, add_generation_prompt)`` rendering with the variables a run renders with (the model's own,
    then ``template_kwargs``, its ``data.chat_template_kwargs``), jax-free."""
    from jaxengine import chat_template

    template = tokenizer.chat_template or chat_template.DEFAULT_CHAT_TEMPLATE
    variables = {**tokenizer.named_tokens, **tokenizer.template_kwargs, **template_kwargs}

    def render(messages: list[dict], add_generation_prompt: bool) -> str:
        return chat_template.render_chat_template(template, messages, add_generation_prompt=add_generation_prompt,
                                                  **variables)

    return template, render


def _modified_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


@functools.lru_cache(maxsize=16)
def _first_rows(path: str, modified_ns: int | None, file_format: str, kind: str, columns: str) -> tuple[dict, ...]:
    """The first ``REFERENCE_ROWS_CHECKED`` examples of a version's file (as last modified at
    ``modified_ns``), read once for every plan of a sweep and every live check of the launch page; none
    when it cannot be read now (the run's start says why)."""
    from jaxengine.data import formats

    mapping = formats.ColumnMapping(kind=kind, columns=json.loads(columns))
    try:
        examples = formats.iter_examples(Path(path), fmt=formats.FileFormat(file_format), mapping=mapping)
        return tuple(itertools.islice(examples, REFERENCE_ROWS_CHECKED))
    except (ValueError, OSError, formats.DatasetFormatError):
        return ()


def _check_layout(job, errors) -> None:
    """``parallel`` must multiply to the devices the job gets: ``hosts`` × each worker's devices, when
    the pool's live workers agree on their count (``pool_offers``). Otherwise only the job's start can
    tell (``jaxengine.sharding.layout_mesh`` checks it there), and any positive sizes are accepted."""
    if job.parallel is None:
        return
    offer = pool_offers().get(job.pool)
    devices = offer.devices_for(job.hosts) if offer is not None else None
    sizes = job.parallel.model_dump()
    product = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
    if devices is not None and product != devices:
        hosts = counted(job.hosts, "host")
        _add(errors, "parallel", f"data {sizes['data']} × fsdp {sizes['fsdp']} × tensor {sizes['tensor']} = {product} "
                                 f"devices, but a job of {hosts} on pool {job.pool} gets {devices} (its workers: "
                                 f"{offer.summary}); make the sizes multiply to {devices}, or leave parallel out "
                                 "(blank in the form) for the default layout")


def spec_from_yaml(text: str) -> dict[str, Any]:
    """A spec mapping from the advanced editor's YAML; syntax and schema errors name their line.

    Ids stand where paths would (``model: bm_…``), which the schema accepts as strings; they are
    resolved by ``plan_run``. ``output_dir`` is Temper's to set, so its absence is no problem."""
    try:
        parse_spec_text(text, source="spec")
    except SpecError as error:
        problems = [without_temper_keys(problem) for problem in error.problems
                    if not problem.rstrip().endswith("output_dir: required key is missing")]
        if problems:
            # The schema takes an output_dir, which plan_run refuses: say so now, or it shows only once
            # these problems are fixed.
            raise ValidationError({"spec_yaml": problems + _output_dir_problem(text)}) from None
    data = load_spec_yaml(text)
    if not isinstance(data, dict):
        raise ValidationError({"spec_yaml": ["the spec must be a mapping of keys (task, model, data, ...)"]})
    return data


def _output_dir_problem(text: str) -> list[str]:
    """``plan_run``'s refusal of a top-level ``output_dir`` in ``text``, naming its line as the schema's
    problems do; none when there is no such key (or the text is not a YAML mapping)."""
    try:
        data = load_spec_yaml(text)  # the engine's hardened reader: hostile YAML is a YAMLError, not a crash
    except yaml.YAMLError:
        return []
    if not isinstance(data, dict) or "output_dir" not in data:
        return []
    lines = [number for number, line in enumerate(text.splitlines(), start=1) if re.match(r"output_dir\s*:", line)]
    where = f"spec:{lines[0]}" if lines else "spec"  # a flow mapping ({task: sft, output_dir: x}) has no own line
    return [f"{where}: output_dir: {SET_BY_TEMPER['output_dir']}"]


def load_yaml(text: str, *, field: str, source: str, unique_keys: bool = False) -> Any:
    """``text`` parsed as YAML; a syntax error is a ``ValidationError`` on ``field`` that names its line
    and column as a spec's do (``<source>:3:8: YAML syntax error: expected ',' or ']'``). ``unique_keys``:
    a key given twice in a mapping is refused too, naming both lines, as a run spec's YAML is (YAML keeps
    the last in silence: a pipeline's stage trained with a value its author meant to replace)."""
    try:
        data = load_spec_yaml(text)
    except yaml.YAMLError:
        try:
            parse_spec_text(text, source=source)  # says where the syntax breaks, in the engine's words
        except SpecError as error:
            raise ValidationError({field: error.problems}) from None
        raise
    if unique_keys and (duplicates := duplicate_key_problems(text, source=source)):
        raise ValidationError({field: duplicates})
    return data


def spec_mapping_from_yaml(text: str) -> dict[str, Any]:
    """The mapping the advanced editor's YAML holds, not checked against the schema (the launch form
    shows it to finish); a syntax error names its line as ``spec_from_yaml`` does."""
    data = load_yaml(text, field="spec_yaml", source="spec")
    if not isinstance(data, dict):
        raise ValidationError({"spec_yaml": ["the spec must be a mapping of keys (task, model, data, ...)"]})
    return data


def spec_to_yaml(spec: dict[str, Any]) -> str:
    """A written spec as YAML, in the schema's key order (``in_schema_order``: not the database's); text
    stays as typed (``bm_…``, not ``"bm_\\u2026"``)."""
    return yaml.safe_dump(in_schema_order(spec), sort_keys=False, allow_unicode=True)


def _default_name(plan: RunPlan) -> str:
    start = plan.source_run.name if plan.source_run else (plan.base_model.name if plan.base_model else "model")
    return f"{plan.task}-{start}"[:100]


def _enqueue(run: Run) -> None:
    from webapp.runs import placement  # placement builds on this module

    if run.hosts > 1:
        placement.run_place(run=run)  # all its workers now, or it waits (the reapers try again)
        return
    run_pk, attempt, queue = run.pk, run.attempt, placement.pool_queue(placement.run_pool(run))
    transaction.on_commit(lambda: celery_app.send_task(TRAIN_TASK, args=[run_pk, attempt], queue=queue))


def log_line(run: Run, message: str, *, level: str = LogLevel.INFO) -> RunLogLine:
    return RunLogLine.objects.create(run=run, message=message, level=level, action=warning_action(message) or {})


def parse_tags(text: str | list[str]) -> list[str]:
    """Tags from ``"a, b"`` or a list: stripped, in NFC, deduplicated in order, each at most 40 characters.
    Runs are picked by their tags (the table's filter, "Compare the runs tagged"), so a tag is checked as a name:
    an invisible character in one ("baseline" + U+200B) made a tag that looks like another but finds other runs."""
    items = [str(item) for item in (text.split(",") if isinstance(text, str) else text) if str(item).strip()]
    tags: list[str] = []
    for number, item in enumerate(items, start=1):
        try:
            tag = checked_name(item, field="tags")
        except ValidationError as error:
            raise ValidationError({"tags": [f"tag {number}: {message}" for message in error.messages]}) from None
        if not tag:
            continue
        if "," in tag and not isinstance(text, str):
            # The run page's edit form and Launch a copy give tags back as "a, b": one holding a comma came back
            # as two.
            raise ValidationError({"tags": f"tag '{isolated(tag)}' holds a comma, which separates tags on the run "
                                           "page; send each tag as its own item, or use another character"})
        if len(tag) > MAX_TAG_LENGTH:
            raise ValidationError({"tags": f"tag {tag[:20]!r}… is longer than {MAX_TAG_LENGTH} characters"})
        if fold_tag(tag) not in {fold_tag(kept) for kept in tags}:  # "Baseline, baseline" is one tag
            tags.append(tag)
    if len(tags) > MAX_TAGS:
        raise ValidationError({"tags": f"at most {MAX_TAGS} tags per run"})
    return tags


@transaction.atomic
def run_tags_write(*, run: Run, tags: list[str]) -> None:
    """Set ``run``'s tags (as ``parse_tags`` gives them): its ``tags`` list, which the pages show, and its ``RunTag``
    rows, which the runs table's search and tag menu read. The one writer of both, in one transaction, so that
    the two never disagree. A tag is spelt as the project's other runs spell it (``_project_spelling``): tags that
    differ only in letter case are one tag of the project. Callers hold the project's lock (``project_lock``), so
    that two spellings of a new tag given at once are not both stored."""
    tags = _project_spelling(run=run, tags=tags)
    run.tags = tags
    Run.objects.filter(pk=run.pk).update(tags=tags)
    RunTag.objects.filter(run=run).exclude(tag__in=tags).delete()
    RunTag.objects.bulk_create([RunTag(run=run, project_id=run.project_id, tag=tag, tag_folded=fold_tag(tag))
                                for tag in tags], ignore_conflicts=True)


def _project_spelling(*, run: Run, tags: list[str]) -> list[str]:
    """``tags`` each spelt as the oldest of the project's other runs holding it spells it, case aside ("baseline"
    given where a run is tagged "Baseline" is "Baseline"), without repeats. ``run``'s own tags are left out of the
    lookup: a run that alone holds a tag may change its case."""
    spellings: dict[str, str] = {}
    rows = (RunTag.objects.filter(project_id=run.project_id, tag_folded__in={fold_tag(tag) for tag in tags})
            .exclude(run_id=run.pk).order_by("-run__created_at", "-run_id").values_list("tag_folded", "tag"))
    for folded, spelling in rows:
        spellings[folded] = spelling  # newest first: the oldest run's spelling is written last
    return list(dict.fromkeys(spellings.get(fold_tag(tag), tag) for tag in tags))


def metric_names_note(*, project_id: int, names: Iterable[str]) -> None:
    """Add ``names`` to the final metrics the project's runs logged (the runs table's sort menu), leaving those it
    has. Every writer of a run's ``final_metrics`` calls it in its transaction with the names it wrote, so that the
    menu offers a metric once a run logs it. Inserted in order: two writers at once take the rows' locks in the
    same order, and neither waits on the other for ever."""
    rows = [ProjectMetricName(project_id=project_id, name=name) for name in sorted(set(names))]
    if rows:
        ProjectMetricName.objects.bulk_create(rows, ignore_conflicts=True)


def metric_names_rewritten(*, run: Run, before: Iterable[str]) -> None:
    """``run``'s ``final_metrics``, which held the names ``before``, were just saved recomputed from its stored points
    (an attempt that starts over drops the steps an earlier one logged, and a metric only those held): its names are
    noted, and those it no longer holds leave the sort menu unless another run of the project holds them. Called in
    the transaction that saved them, by every writer that replaces a run's ``final_metrics`` rather than adds to
    them."""
    metric_names_note(project_id=run.project_id, names=run.final_metrics)
    _metric_names_forget(project_id=run.project_id, names=set(before) - set(run.final_metrics))


def _metric_names_forget(*, project_id: int, names: Iterable[str]) -> None:
    # Names a run no longer holds (deleted, or its final metrics recomputed without them) that no other run of its
    # project holds leave the sort menu: sorting by one would order nothing. Archived runs still hold theirs (the
    # table lists them). The rows are locked first, in order, so that two runs letting go of the same name at once
    # (two deletions) take turns: the second sees the first's run gone, where each would have seen the other's
    # still there and kept the name. Rare (a deletion, a restarted attempt): the check reads the project's runs.
    names = sorted(set(names))
    if not names:
        return
    list(ProjectMetricName.objects.select_for_update(of=("self",)).filter(project_id=project_id, name__in=names)
         .order_by("name").values_list("pk", flat=True))
    gone = [name for name in names if not Run.objects.filter(project_id=project_id, final_metrics__has_key=name).exists()]
    ProjectMetricName.objects.filter(project_id=project_id, name__in=gone).delete()


@transaction.atomic
def run_create(*, project: Project, spec: Any, user: AbstractBaseUser | None, name: str = "",
               tags: str | list[str] = "", for_api: bool = False, record: bool = True) -> Run:
    """Validate ``spec`` (ids, not paths; see the module notes), save the run and enqueue it on the
    ``train`` queue once the transaction commits. ``for_api``: refusals in the REST API's words (``plan_run``).
    ``record``: log it as launched (``webapp.activity``); False where the caller logs what it was launched for (a
    retry, a pipeline's stage)."""
    public_id = new_run_id()
    name = _checked_name(name or "", required=False)
    checked_json(spec, field="")
    plan = plan_run(project=project, spec=spec, output_dir=run_output_dir(public_id), for_api=for_api)
    run = _save_planned(public_id=public_id, project=project, plan=plan, user=user,
                        name=name or _default_name(plan), tags=parse_tags(tags), for_api=for_api)
    if record:
        activity_record(project=project, actor=user, verb=Verb.RUN_LAUNCHED, target=run)
    return run


_NOT_CHECKED = object()  # plan_warnings' memory when its caller has not checked it


def plan_warnings(plan: RunPlan, *, memory: Any = _NOT_CHECKED) -> list[str]:
    """``jaxengine.spec.spec_warnings`` of a planned run, told the row count of its ``data.train``, then what
    its data versions' validation found that the run should know (``dataset_selectors.launch_warnings``), the disk
    its checkpoints and export need past the free space (``plan_disk_warning``), and the memory it would need past its
    pool's devices (``memory``: its ``plan_memory``, made here unless given)."""
    data = plan.spec["data"]
    versions = {version.public_id: version for version in plan.dataset_versions}
    train, evaluation = versions.get(data.get("train")), versions.get(data.get("eval"))
    warnings = [*spec_warnings(plan.job, train_rows=train.row_count if train is not None else None,
                               chat_template=_model_chat_template(plan)),
                *dataset_selectors.launch_warnings(task=plan.task, train=train, evaluation=evaluation),
                *_turn_split_warnings(plan, [("data.train", train), ("data.eval", evaluation)])]
    if disk := plan_disk_warning(plan):
        warnings.append(disk)
    if memory is _NOT_CHECKED:
        memory = plan_memory(plan)
    return warnings + [memory.warning] if memory is not None and memory.warning else warnings


class CountingWarning(str):
    """A warning whose figures a worker is still counting (``_turn_split_warnings``): the launch page's live check
    asks again while one is among its warnings (``LaunchCheck.counting``)."""


def _turn_split_warnings(plan: RunPlan, versions: list[tuple[str, DatasetVersion | None]]) -> list[str]:
    """An sft run whose model's chat template (with ``data.chat_template_kwargs``) renders earlier assistant turns
    otherwise than the latest (Qwen3's drops their reasoning) trains each conversation of several assistant turns
    one turn per example, each with the conversation before it (``jaxengine.data.pipeline``): said at its data key
    with the examples and tokens that makes, estimated from what validation counted (``formats.TurnSplits``). A
    version validated before that was counted is not counted here, in the request (one pass over its whole file): the
    count is queued as its page queues it (``dataset_services.late_count_request``, once) and a ``CountingWarning``
    says it is under way."""
    from jaxengine.chat_template import GENERATION_MARKER
    from jaxengine.data import formats
    from webapp.datasets import services as dataset_services

    if plan.task != "sft" or plan.job.data.loss_on == "all" or plan.tokenizer is None:
        return []
    if not any(version is not None for _key, version in versions):
        return []
    template, render = _chat_renderer(plan.tokenizer, plan.job.data.chat_template_kwargs)
    if GENERATION_MARKER.search(template) or not formats.turns_split_apart(render):
        return []
    warnings: list[str] = []
    for key, version in versions:
        if version is None:
            continue
        splits = (version.statistics or {}).get("turn_splits")
        if not isinstance(splits, dict):
            if dataset_services.late_count_request(version=version):
                warnings.append(CountingWarning(
                    f"{key}: the model's chat template renders earlier assistant turns otherwise than the latest "
                    "(Qwen3's drops their reasoning), so a conversation of several assistant turns is trained one "
                    "assistant turn per example, each with the conversation before it; counting those of "
                    f"{isolated(str(version))}… (it was validated before they were counted: a worker counts them now, "
                    "and then this check and the version's page say how many). To train each conversation once, "
                    "choose a model whose chat template marks assistant turns with {% generation %}, or set "
                    "data.loss_on: all (every token trained, the user turns too)"))
            continue
        if not splits.get("rows"):
            continue
        rows, split = version.row_count or 0, splits["rows"]
        examples = rows - split + splits.get("examples", 0)
        growth = splits.get("split_characters", 0) / max(splits.get("characters", 0), 1)
        warnings.append(
            f"{key}: the model's chat template renders earlier assistant turns otherwise than the latest (Qwen3's "
            f"drops their reasoning), so {counted(split, 'conversation', grouped=True)} of the {rows:,} rows of "
            f"{isolated(str(version))} {'are' if split != 1 else 'is'} trained one assistant turn per example, each "
            f"with the conversation before it: {examples:,} examples instead of {rows:,} rows, and about "
            f"{growth:.1f}× the tokens (an estimate from the conversations' lengths in characters). To train each "
            "conversation once, choose a model whose chat template marks assistant turns with {% generation %}, or "
            "set data.loss_on: all (every token trained, the user turns too)")
    return warnings


def _model_chat_template(plan: RunPlan) -> str | None:
    """The chat template of a planned run's model, for the warning on ``data.chat_template_kwargs`` it never reads;
    None when the spec gives none or the model's files cannot be read (its start says what is wrong)."""
    from jaxengine import chat_template

    if not plan.job.data.chat_template_kwargs or plan.tokenizer is None:
        return None
    return plan.tokenizer.chat_template or chat_template.DEFAULT_CHAT_TEMPLATE


def plan_disk_warning(plan: RunPlan) -> str | None:
    """``selectors.disk_warning`` of a planned run."""
    from webapp.runs.selectors import disk_warning  # selectors build on this module

    return disk_warning(job=plan.job, base_model=plan.base_model, output_dir=plan.resolved["output_dir"])


def plan_memory(plan: RunPlan):
    """``selectors.memory_check`` of a planned run."""
    from webapp.runs.selectors import memory_check  # selectors build on this module

    return memory_check(job=plan.job, base_model=plan.base_model, pool=plan.job.pool,
                        reward_base_model=plan.reward_base_model)


def _lock_what_it_reads(*, project: Project, plan: RunPlan, for_api: bool = False) -> None:
    """Lock the rows of what a run about to be saved reads — its project, dataset versions, base model,
    starting run and reward runs — as their deletions lock them. A deletion under way then waits for this
    launch and finds the run it must not pull data from under; one that committed first left nothing to lock,
    and the launch is refused, naming what went. Without it, a launch and a deletion at the same instant each
    saw the other not there: on PostgreSQL the launch failed at its commit on a foreign key (a server error),
    and a reward run (no foreign key) was deleted from under a run queued to read it."""
    project_lock(project=project, doing="as the run was being launched")
    missing: dict[str, list[str]] = {}
    versions = {version.pk: version for version in plan.dataset_versions}
    present = set(DatasetVersion.objects.select_for_update(of=("self",)).filter(pk__in=versions)
                  .values_list("pk", flat=True))
    data = plan.spec.get("data") or {}
    for pk in versions.keys() - present:
        version = versions[pk]
        key = next((f"data.{use}" for use in ("train", "eval") if data.get(use) == version.public_id), "data")
        missing.setdefault(key, []).append(f"{version} was deleted as the run was being launched; choose another")
    if plan.base_model is not None and not BaseModel.objects.select_for_update(of=("self",)).filter(
            pk=plan.base_model.pk).exists():
        missing.setdefault("model", []).append(f"base model {plan.base_model.name} was unregistered as the run was "
                                               "being launched; choose another")
    runs = {reference: key for key, reference in reward_references(plan.spec)}
    if plan.source_run is not None:
        runs[plan.source_run.public_id] = "model"
    locked = set(Run.objects.select_for_update(of=("self",)).filter(project=project, public_id__in=runs)
                 .values_list("public_id", flat=True))
    for reference in runs.keys() - locked:
        missing.setdefault(runs[reference], []).append(f"run {reference} was deleted as the run was being launched; "
                                                       "choose another")
    # The runs it reads are judged again now that they are locked: plan_run read them before, and a resume (which
    # locks the project first) committed in between had set one queued again, its export no longer the one read.
    if plan.source_run is not None and plan.source_run.public_id in locked:
        _resolve_model(project, plan.spec.get("model"), missing)
    for key, reference in reward_references(plan.spec):
        if reference in locked:
            _resolve_reward_run(project, reference, missing, key=key, for_api=for_api)
    if missing:
        raise ValidationError(missing)


def _save_planned(*, public_id: str, project: Project, plan: RunPlan, user: AbstractBaseUser | None, name: str,
                  tags: list[str], for_api: bool = False) -> Run:
    _lock_what_it_reads(project=project, plan=plan, for_api=for_api)
    run = Run.objects.create(
        public_id=public_id, project=project, name=name,
        task=plan.task, spec=plan.spec, resolved_spec=plan.resolved, created_by=user,
        base_model=plan.base_model, source_run=plan.source_run,
        total_steps=plan.resolved["train"].get("max_steps"), hosts=plan.resolved.get("hosts", 1),
        stamped_template_date=plan.stamped_template_date or "",
        # With what "About this dataset" says at launch: the model card names the terms the run trained under.
        dataset_names={version.public_id: {"name": version.dataset.name, "number": version.number,
                                           **dataset_selectors.dataset_about(dataset=version.dataset)}
                       for version in plan.dataset_versions},
    )
    run_tags_write(run=run, tags=tags)
    run.dataset_versions.set(plan.dataset_versions)
    log_line(run, f"queued by {user.get_username() if user else 'the system'}")
    if dropped := plan.dropped_template_variables:
        log_line(run, f"data.chat_template_kwargs: {', '.join(dropped)} of {plan.spec['model']}'s variables "
                      f"not carried on: the model's chat template never reads {'it' if len(dropped) == 1 else 'them'}")
    for warning in plan_warnings(plan):
        # A count still under way may find nothing to warn of (a version of single-turn chats): said, not warned.
        log_line(run, warning, level=LogLevel.INFO if isinstance(warning, CountingWarning) else LogLevel.WARNING)
    _enqueue(run)
    return run


@dataclass(frozen=True, kw_only=True)
class SweepLaunched:
    """The runs a sweep made, in the order they were queued, and the tag they share."""

    tag: str
    runs: list[Run]


def new_sweep_tag() -> str:
    return f"sweep-{secrets.token_hex(4)}"


@transaction.atomic
def sweep_create(*, project: Project, spec: Any, user: AbstractBaseUser | None, axes: list[sweeps.SweepAxis],
                 name: str = "", tags: str | list[str] = "", for_api: bool = False) -> SweepLaunched:
    """A run for every combination of the ``axes``' values (``webapp.runs.sweeps``): ``spec`` with
    those keys set, each planned by ``plan_run`` before any is saved, so that one bad combination
    makes no run and queues nothing (a ``ValidationError`` naming its line, key and value under
    ``sweep``; the spec's own problems under their keys, as for one run). The runs are named
    ``<name> · <key>=<value> …``, tagged ``sweep-<id>`` besides ``tags``, and queued in product order.
    ``for_api``: refusals in the REST API's words (``plan_run``)."""
    name = _checked_name(name or "", required=False)
    checked_json(spec, field="")
    tag_list = _checked_sweep(spec=spec, axes=axes, tags=tags)
    tag = new_sweep_tag()
    planned = _plan_sweep(project=project, spec=spec, axes=axes, for_api=for_api)
    runs = [_save_planned(public_id=public_id, project=project, plan=plan, user=user, tags=[tag, *tag_list],
                          for_api=for_api,
                          name=_checked_name(sweeps.run_name(name or _default_name(plan), axes, combination,
                                                             max_length=RUN_NAME_MAX), required=True))
            for public_id, combination, plan in planned]
    activity_record(project=project, actor=user, verb=Verb.SWEEP_LAUNCHED, target=(TargetKind.SWEEP, tag, name or tag),
                    details={"runs": len(runs)})
    return SweepLaunched(tag=tag, runs=runs)


def _checked_sweep(*, spec: Any, axes: list[sweeps.SweepAxis], tags: str | list[str]) -> list[str]:
    """The tags of a sweep's runs besides its own, once its axes are checked against the spec's task."""
    sweeps.check_axes(axes, task=spec.get("task") if isinstance(spec, dict) and spec.get("task") in tasks() else None)
    tag_list = parse_tags(tags)
    if len(tag_list) >= MAX_TAGS:
        raise ValidationError({"tags": f"a sweep adds its own tag to the {MAX_TAGS} a run may have: give at most "
                                       f"{MAX_TAGS - 1}"})
    return tag_list


def _plan_sweep(*, project: Project, spec: Any, axes: list[sweeps.SweepAxis], for_api: bool = False
                ) -> list[tuple[str, tuple[Any, ...], RunPlan]]:
    """Each combination of a sweep's values planned by ``plan_run`` (with its run's id), or the
    ``ValidationError`` that refuses the sweep: the combinations' problems, or runs that would be the same."""
    combinations = sweeps.combinations(axes)
    planned, failures = [], []
    for combination in combinations:
        public_id = new_run_id()
        try:
            plan = plan_run(project=project, spec=sweeps.with_values(spec, axes, combination),
                            output_dir=run_output_dir(public_id), for_api=for_api)
        except ValidationError as error:
            failures.append((combination, error.message_dict))
            continue
        planned.append((public_id, combination, plan))
    if failures:
        raise ValidationError(sweeps.errors(axes, failures, len(combinations)))
    if same := sweeps.same_runs(axes, [(combination, plan.resolved) for _public_id, combination, plan in planned]):
        raise ValidationError({sweeps.FIELD: same})
    return planned


@dataclass(frozen=True, kw_only=True)
class LaunchCheck:
    """What a launch would warn of, and the memory estimate of each run it would make (once each)."""

    warnings: list[str]
    memory: list[str]
    # A warning's figures are being counted by a worker (``CountingWarning``): the page asks again in a moment.
    counting: bool = False


def launch_check(*, project: Project, spec: Any, axes: list[sweeps.SweepAxis], name: str = "",
                 tags: str | list[str] = "") -> LaunchCheck:
    """What launching ``spec`` as one run (``axes`` empty) or as a sweep would warn of, once each, and the
    memory its runs need, or the ``ValidationError`` it would be refused with; nothing is saved or queued
    (the launch page's live check)."""
    _checked_name(name or "", required=False)
    checked_json(spec, field="")
    if axes:
        _checked_sweep(spec=spec, axes=axes, tags=tags)
        planned = _plan_sweep(project=project, spec=spec, axes=axes)
        plans = [plan for _public_id, _combination, plan in planned]
        labels = [sweeps.values_text(axes, combination) for _public_id, combination, _plan in planned]
    else:
        parse_tags(tags)
        plans = [plan_run(project=project, spec=spec, output_dir=run_output_dir("launch-check"))]
        labels = [""]
    memory = [plan_memory(plan) for plan in plans]  # once a plan: it reads the pool's workers and models
    warnings = (warning for plan, check in zip(plans, memory) for warning in plan_warnings(plan, memory=check))
    warnings = list(dict.fromkeys(warnings))
    return LaunchCheck(warnings=warnings, counting=any(isinstance(warning, CountingWarning) for warning in warnings),
                       memory=_memory_lines(memory, labels))


def _memory_lines(checks: list[Any], labels: list[str]) -> list[str]:
    """Each distinct memory estimate of a launch's runs once; where a sweep's combinations need different
    amounts (its ``peft.rank`` or ``train.batch_size`` say), each names the combinations it is for: two bare
    estimates left the reader to guess which run needed which."""
    runs_by_summary: dict[str, list[str]] = {}
    for check, label in zip(checks, labels):
        if check is not None:
            runs_by_summary.setdefault(check.summary, []).append(label)
    if len(runs_by_summary) < 2:
        return list(runs_by_summary)
    return [f"{'; '.join(runs)}: {summary}" for summary, runs in runs_by_summary.items()]


def publish_status(run: Run) -> None:
    """Tell the run's open pages its status once the transaction commits: each loads itself again; a run that
    ended, its project's webhooks too (``webhooks.services.run_ended``, recorded in this transaction). Every change
    of a run's status calls it (``tests/webapp/runs/test_status_events.py``): a page not told shows the old
    status until its stream ends, ten minutes on."""
    from webapp.runs.reporting import publish_event  # reporting builds on this module

    event = {"type": "status", "status": run.status, "message": run.error_message, "notice": run.notice}
    public_id = run.public_id
    transaction.on_commit(lambda: publish_event(public_id, event))
    webhooks.run_ended(run=run)  # the one place every end of a run passes: its project's hooks are told once


def _advance_pipeline(run: Run) -> None:
    from webapp.runs.pipelines import pipeline_advance  # pipelines build on this module

    pipeline_advance(run=run)


def _set_cancel_flag(public_id: str) -> None:
    try:
        client = channels.redis_client()
        try:
            client.set(channels.cancel_key(public_id), "1", ex=channels.CANCEL_FLAG_SECONDS)
            client.publish(channels.events_channel(public_id), '{"type": "cancel_requested"}')
        finally:
            client.close()
    except redis.RedisError as error:
        # The worker also reads Run.cancel_requested at each run heartbeat.
        logger.warning("cancel flag of %s not set in Redis (%s); the database flag will stop it", public_id, error)


@transaction.atomic
def run_cancel(*, run: Run, user: AbstractBaseUser | None) -> Run:
    """Cancel a queued run at once, or ask a running one to stop after its current step (it saves a
    checkpoint first, so it can be resumed)."""
    run = Run.objects.select_for_update(of=("self",)).get(pk=run.pk)
    who = user.get_username() if user else "the system"
    external = run.task == EXTERNAL_TASK and run.status == RunStatus.RUNNING
    if run.status == RunStatus.QUEUED or external:
        # Nothing of Temper's runs a queued or an external run: it is cancelled at once.
        run.status = RunStatus.CANCELLED
        run.finished_at = timezone.now()
        run.error_message = f"cancelled by {who}" + ("" if external else " before it started")
        run.notice = ""
        run.save(update_fields=["status", "finished_at", "error_message", "notice"])
        log_line(run, run.error_message)
        activity_record(project=run.project, actor=user, verb=Verb.RUN_CANCELLED, target=run)
        publish_status(run)
        _advance_pipeline(run)
        return run
    if run.status != RunStatus.RUNNING:
        raise ValidationError({"__all__": f"run {run.public_id} {run.status_phrase}; only queued or running runs can be cancelled"})
    if not run.cancel_requested:  # asked again (another tab, a teammate): the flag is set again, not logged twice
        run.cancel_requested = True
        run.save(update_fields=["cancel_requested"])
        log_line(run, f"cancel requested by {who}; stopping after the current step")
        activity_record(project=run.project, actor=user, verb=Verb.RUN_CANCELLED, target=run)
    public_id = run.public_id
    transaction.on_commit(lambda: _set_cancel_flag(public_id))
    return run


def _clear_cancel_flag(public_id: str) -> None:
    try:
        client = channels.redis_client()
        try:
            client.delete(channels.cancel_key(public_id))
        finally:
            client.close()
    except redis.RedisError as error:
        logger.warning("cancel flag of %s not cleared in Redis: %s", public_id, error)


def _refuse_external(run: Run, done: str) -> None:
    """External runs have no spec Temper can train: a train worker given one failed it, replacing its
    finish message."""
    if run.task == EXTERNAL_TASK:
        raise ValidationError({"__all__": f"run {run.public_id} is an external run, trained outside Temper; it "
                                          f"cannot be {done} here: start it again where it ran"})


_INPUT_NAMES = {"model": "its starting model", "train": "its training data", "eval": "its evaluation data"}
_INPUT_KEYS = {"model": "model", "train": "data.train", "eval": "data.eval"}  # the spec key naming each


def duplicate_address(run: Run) -> str:
    """Where a refusal's words for the run page say Duplicate (a button the REST API has not), the API's words:
    its ``duplicate/`` of ``run``, which launches a copy of its spec (``run_duplicate``)."""
    return f"POST runs/{run.public_id}/duplicate/"


def checkpoint_export_address(run: Run, step: int) -> str:
    """Where a refusal's words for the run page say *Export as a starting model* under Checkpoints, the API's words:
    its ``checkpoints/<step>/export/`` of ``run`` (``checkpoint_export_request``)."""
    return f"POST runs/{run.public_id}/checkpoints/{step}/export/"


def duplicate_way(run: Run, *, keys: list[str]) -> str:
    """``duplicate_address`` with the spec ``keys`` to give anew in its body."""
    return f"{duplicate_address(run)} with a new {' and '.join(dict.fromkeys(keys))} in its spec"


def gone_inputs_refusal(run: Run, *, keep_base_model: bool = False, for_api: bool = False) -> str:
    """Why ``run`` is not trained again when what it trains on was deleted since (its starting run's export, a
    dataset version's file, a reward run or its exported model's folder: queued, it failed on the missing file, in
    words that named the wrong model), or "". ``keep_base_model``: an unregistered base model is no refusal while its directory is still
    the one the run trained from (a resume reads it; ``_base_model_files_kept``). The run page greys Resume and
    Retry with these words (``rerun_refusals``), which their services refuse in; ``for_api``: the REST API's
    words for the way out, which name its ``duplicate/`` and the spec keys to give anew (``duplicate_way``)."""
    gone = [(f"{_INPUT_NAMES[use]} {reference}", _INPUT_KEYS[use]) for use, reference in run.deleted_references()
            if not (keep_base_model and reference.startswith("bm_") and _base_model_files_kept(run))]
    reward_keys: dict[str, str] = {}  # each reward run once, by the first key naming it
    for key, reference in reward_references(run.spec):
        reward_keys.setdefault(reference, key)
    gone += [(f"its reward model {reference}", reward_keys[reference]) for reference in dict.fromkeys(
        reference for _key, reference in deleted_reward_models(run))]
    gone += [(f"the exported model of its reward run {reference}, whose folder is gone from disk",
              reward_keys[reference]) for reference in gone_reward_exports(run)]
    if not gone:
        return ""
    way = (duplicate_way(run, keys=[key for _words, key in gone]) if for_api
           else "duplicate it to choose another")
    return f"what run {run.public_id} trains on was deleted since ({', '.join(words for words, _key in gone)}): {way}"


def _refuse_gone_inputs(run: Run, *, keep_base_model: bool = False, for_api: bool = False) -> None:
    if refusal := gone_inputs_refusal(run, keep_base_model=keep_base_model, for_api=for_api):
        raise ValidationError({"__all__": refusal})


def model_dir_refusal(run: Run, *, doing: str, listing: bool = False, for_api: bool = False) -> str:
    """Why ``run`` cannot be ``doing`` ("resumed", "retried") because the directory it starts from (its spec's
    resolved ``model``, which a resume trains on again and a retry launches from) may no longer be read by its
    project: registered before it lay in another project's folder, or linked into one since; or deleted from disk since
    (``starting_model_gone``), named as the project names it; or "". The train worker
    refuses it too (``worker.tasks.train.check_model_dir``), but only once the run is queued again, and it failed
    there; here it is told in the same words with nothing queued. ``listing``: for the run page, which asks again as
    it follows the run (``load_refusal``'s kept answer). ``for_api``: the REST API's words for the way out
    (``duplicate_way``)."""
    model_path = run.resolved_spec.get("model")
    if not isinstance(model_path, str) or not model_path:
        return ""
    if refusal := load_refusal(path=model_path, project_slug=run.project.slug, listing=listing):
        choose = duplicate_way(run, keys=["model"]) if for_api else "duplicate the run and choose it"
        return (f"{refusal}. Run {run.public_id} trains on that directory, so it cannot be {doing}: once the model is "
                f"registered again from its new folder, {choose}")
    if gone := starting_model_gone(run):
        if for_api:
            choose = duplicate_way(run, keys=["model"])
            remedy = choose if run.source_run is not None else f"{REGISTER_AGAIN}, or {choose}"
        else:
            remedy = ("duplicate the run and choose another starting model" if run.source_run is not None
                      else f"{REGISTER_AGAIN} and duplicate the run to choose it")
        return f"{gone}. Run {run.public_id} starts from it, so it cannot be {doing}: {remedy}"
    return ""


def recorded_saving_checkpoints(run: Run) -> bool:
    """Whether ``run`` wrote checkpoints, as what it recorded says: an artifact (its export, made as it succeeded, when
    the engine saves the last step's checkpoint; a checkpoint exported), its engine's summary (it succeeded, or was
    cancelled as it ran: the engine saves a checkpoint as it stops; it resumed from one, or scored one best), or an
    attempt lost after one. A run cancelled while queued, or failed before its first save, has none of these."""
    summary = run.summary if isinstance(run.summary, dict) else {}
    return (summary.get("status") in (RunStatus.SUCCEEDED, RunStatus.CANCELLED)
            or summary.get("resumed_from_step") is not None or summary.get("best_checkpoint_step") is not None
            or run.lost_after_checkpoint is not None or run.artifacts.exists())


def lost_checkpoints_refusal(run: Run, *, for_api: bool = False) -> str:
    """Why ``run`` is not resumed (nor trained further) because the checkpoint its engine would restore, the newest
    in its run folder, is not there whole, or "". The checkpoints it saved deleted since (its whole run folder, judged
    as ``model_dir_gone`` judges a folder, only under the data root where Temper keeps run folders; or, the folder
    there, its ``checkpoints/`` emptied or its step folders removed): the engine, finding none, trained it again from
    step 0 while its step history went on from where it stopped; refused for a run that saved checkpoints
    (``recorded_saving_checkpoints``) and trained a step, as one that never saved any starts from step 0 as it always did. Its
    newest step folder incomplete (``checkpoint_folder_incomplete``): the engine restores the newest and failed on it
    in the train worker; the refusal names the newest whole one, which it resumes from once those are moved out.
    ``for_api``: the REST API's words for a new run of its spec (``duplicate_address``)."""
    saved_some = run.current_step > 0 and recorded_saving_checkpoints(run)
    if not run.output_dir.is_dir():
        return (_trains_from_step_0_refusal(run, "its run folder, with the checkpoints it saved, was deleted from disk "
                                                 "since", for_api=for_api)
                if saved_some and model_dir_gone(str(run.output_dir)) else "")
    directory = run.output_dir / "checkpoints"
    steps = checkpoint_steps(run)
    incomplete = list(itertools.takewhile(lambda step: checkpoint_folder_incomplete(directory / str(step)),
                                          reversed(steps)))[::-1]
    whole = steps[:len(steps) - len(incomplete)]
    if whole:
        return (_move_out_refusal(run, directory, incomplete, then=f"resume from checkpoint {whole[-1]}, the newest "
                                                                   "whole one") if incomplete else "")
    if saved_some:
        return _trains_from_step_0_refusal(
            run, f"{_incomplete_words(directory, incomplete)}, and it has no whole one" if incomplete
            else f"the checkpoints it saved were deleted from {directory} since",
            then="it could only start over from step 0" if incomplete else "it would train again from step 0",
            for_api=for_api)
    return (_move_out_refusal(run, directory, incomplete, then="start it over from step 0, as it saved no whole "
                                                              "checkpoint") if incomplete else "")


def _incomplete_words(directory: Path, steps: list[int]) -> str:
    named = f"checkpoint {steps[0]} is" if len(steps) == 1 else f"checkpoints {', '.join(map(str, steps))} are"
    return f"{named} incomplete in {directory} (a save or a copy that stopped part way)"


def _move_out_refusal(run: Run, directory: Path, incomplete: list[int], *, then: str) -> str:
    return (f"run {run.public_id} cannot be resumed yet: {_incomplete_words(directory, incomplete)}, and the engine "
            f"restores the newest checkpoint, so it would fail in the train worker. Move "
            f"{'it' if len(incomplete) == 1 else 'them'} out of checkpoints/ to {then}")


def _trains_from_step_0_refusal(run: Run, lost: str, *, then: str = "it would train again from step 0",
                                for_api: bool = False) -> str:
    way = duplicate_address(run) if for_api else "Duplicate it"
    return (f"run {run.public_id} cannot be resumed: {lost}, so {then} while its step history goes on from step "
            f"{run.current_step}. {way} to train its spec again as a new run")


def _refuse_a_model_no_longer_loadable(run: Run, *, doing: str, for_api: bool = False) -> None:
    if refusal := model_dir_refusal(run, doing=doing, for_api=for_api):
        raise ValidationError({"model": refusal})


def rerun_refusals(run: Run) -> dict[str, str]:
    """Why ``run``'s Resume and Retry (keys ``resume``, ``retry``) would be refused for what it trains on, and
    Resume for the checkpoint it would restore gone or incomplete (``lost_checkpoints_refusal``) and for what
    counts on its final model (``replaced_model_refusal``), in the words ``run_resume`` and
    ``run_retry`` refuse in ("" where nothing stands in the way): the run page shows the button greyed with them
    instead of a button refused only once pressed. Its status and the work under way on its files are not judged
    here: the page offers the buttons by status, and those refusals are the click's."""
    if run.task == EXTERNAL_TASK:
        return {"resume": "", "retry": ""}
    return {"resume": (gone_inputs_refusal(run, keep_base_model=True)
                       or model_dir_refusal(run, doing="resumed", listing=True) or lost_checkpoints_refusal(run)
                       or replaced_model_refusal(run)),
            "retry": retry_refusal(run)}


def retry_refusal(run: Run) -> str:
    """``rerun_refusals``' ``retry``: why ``run``'s Retry would be refused for what it trains on, or "". What the run
    page advises a Retry for (``selectors.final_export_gone``) asks this too, so that it never advises a greyed one."""
    return gone_inputs_refusal(run) or model_dir_refusal(run, doing="retried", listing=True)


# A run stopped short of its steps: its Resume and Retry are the ways on, which its base model's unregistering takes.
STOPPED_SHORT = (RunStatus.CANCELLED, RunStatus.FAILED)


def may_still_go_on(run: Run) -> bool:
    """Whether ``run`` stopped short (cancelled, failed) and its page still offers Resume or Retry ungreyed
    (``rerun_refusals``): the run a deletion of what it trains from would strand, refused while it stands
    (``basemodels.selectors.base_model_readers``). A succeeded run has done what it was launched for."""
    if run.task == EXTERNAL_TASK or run.status not in STOPPED_SHORT:
        return False
    refusals = rerun_refusals(run)
    return not (refusals["resume"] and refusals["retry"])


def _base_model_files_kept(run: Run) -> bool:
    """Whether the directory of ``run``'s unregistered base model (its resolved spec's ``model``) is still there and
    still the one it trained from: an owner may delete an uploaded model's folder with it, and a new upload under the
    same name then makes another model at the same path (an upload never writes into a folder that exists, so one
    registered at that path after the run began is another model)."""
    path = (run.resolved_spec or {}).get("model")
    if not isinstance(path, str) or not Path(path).is_dir():
        return False
    return not BaseModel.objects.filter(path=path, uploaded=True, created_at__gt=run.created_at).exists()


def _refuse_while_files_written(run: Run) -> None:
    """Refuse to resume ``run`` while a job writes or reads its directory: a checkpoint export (it reads
    ``checkpoints/<N>``, which the resumed engine may rotate out), the serving copy of its final model (written
    inside ``export/``, which the resumed engine replaces at its end) or a pipeline's export stage quantizing it.
    Those requests lock the run's row and want it finished, so the two never overlap."""
    from webapp.runs.models import Pipeline, PipelineStatus, ServingCopy, ServingCopyStatus
    from webapp.runs.selectors import serving_copy  # selectors import this module

    writers = []
    steps = list(run.checkpoint_exports.filter(status=CheckpointExportStatus.EXPORTING)
                 .order_by("step").values_list("step", flat=True))
    if steps:
        writers.append(f"checkpoint{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))} "
                       f"{'are' if len(steps) > 1 else 'is'} being exported")
    if ((serving_copy(run=run) or {}).get("state") == "writing"
            or ServingCopy.objects.filter(run=run, step__isnull=True, status=ServingCopyStatus.WRITING).exists()):
        writers.append("the serving copy of its final model is being written")
    for pipeline in Pipeline.objects.filter(status=PipelineStatus.RUNNING, result_run=run).order_by("created_at"):
        if "export" in pipeline.stages[pipeline.current_stage]:
            writers.append(f"pipeline {isolated(pipeline.name)} is quantizing its model in its export stage")
    if writers:
        raise ValidationError({"__all__": f"run {run.public_id} cannot be resumed yet: {'; '.join(writers)}. "
                                          "Resume it once that is done (its page shows when)"})


def final_model_dependants(run: Run) -> list[Run]:
    """The runs that started from ``run``'s final model (``model: run_…``, not one of its exported checkpoints)
    or are scored by it (a reward model), oldest first: each names those weights as what it used."""
    if not run.artifacts.filter(kind=ArtifactKind.MODEL).exists():
        return []
    started = [derived for derived in Run.objects.filter(source_run=run).order_by("created_at")
               if isinstance(derived.spec, dict) and str(derived.spec.get("model", "")).strip() == run.public_id]
    scored = [scored for scored in Run.objects.filter(project=run.project_id, task__in=("grpo", "ppo"))
              .exclude(pk=run.pk).order_by("created_at") if run.public_id in reward_run_ids(scored.spec)]
    return sorted({derived.pk: derived for derived in started + scored}.values(), key=lambda derived: derived.created_at)


def saved_max_seq_len_problem(run: Run) -> str | None:
    """What the launch's ``_check_model_positions`` says of ``run``'s saved ``data.max_seq_len`` against its model's
    config.json as it is now, or None: a run saved before that check, or whose model's config.json changed since."""
    from jaxengine.models.config import max_seq_len_problem, read_position_limit

    return max_seq_len_problem(run.resolved_spec.get("data", {}).get("max_seq_len", 0),
                               read_position_limit(run.resolved_spec.get("model", "")))


def _refuse_resuming_past_the_models_positions(run: Run, *, for_api: bool = False) -> None:
    """The launch's ``_check_model_positions`` for a resume: such a run would be queued and fail only once the
    engine started (``check_model_positions``). A resume keeps the saved ``data.max_seq_len`` (the engine refuses
    a changed one) and no spec is edited before a resume, so the refusal walks through the way out: a new run
    (Duplicate marks the field: ``saved_max_seq_len_problem``), started from the run's last checkpoint if wanted."""
    from jaxengine.models.config import max_seq_len_past_positions, read_position_limit

    limit = read_position_limit(run.resolved_spec.get("model", ""))
    if past := max_seq_len_past_positions(run.resolved_spec.get("data", {}).get("max_seq_len", 0), limit):
        saved = checkpoint_steps(run)
        export_way = (checkpoint_export_address(run, saved[-1]) if for_api
                      else "Checkpoints: Export as a starting model") if saved else ""
        from_checkpoint = (f"; to go on from what this run trained, first export its checkpoint {saved[-1]} "
                           f"({export_way}) and give the new run model {run.public_id}@{saved[-1]}") if saved else ""
        new_run = (f"{duplicate_way(run, keys=['data.max_seq_len'])}, at most {limit.positions}, or a model with a "
                   "longer context" if for_api else
                   "start a new run with Duplicate, whose launch form holds this run's spec and marks data.max_seq_len, "
                   f"and give it at most {limit.positions}, or choose a model with a longer context")
        raise ValidationError({"data.max_seq_len": (
            f"data.max_seq_len: {past}. A resume keeps the run's data.max_seq_len (its checkpoints' place in the data "
            f"counts in rows of that length, so a changed one is refused): {new_run}{from_checkpoint}")})


def _used_model_refusal(run: Run) -> str:
    """Why ``run`` is not resumed when other runs started from (or are scored by) its final model, or "": the
    resumed engine writes ``export/`` again at its end, so they would name weights they did not use — their lineage,
    a comparison with them, and a LoRA run resumed on other base weights under its adapter would all be wrong
    without a word. Training on from those weights is a new run that starts from this one's model."""
    dependants = final_model_dependants(run)
    if not dependants:
        return ""
    shown = ", ".join(f"{isolated(derived.name)} ({derived.public_id})" for derived in dependants[:3])
    more = f" and {len(dependants) - 3} more" if len(dependants) > 3 else ""
    return (f"run {run.public_id} cannot be resumed: runs {shown}{more} use its final model, which a resume would "
            f"replace with other weights at its end. Train on from it as a new run instead: launch one with model "
            f"{run.public_id}")


def replaced_model_refusal(run: Run) -> str:
    """Why resuming ``run`` is refused for what counts on its final model, which the resumed engine replaces at its
    end (and has none of until then), or "": a pipeline it is the result of, a running pipeline's stage yet to be
    launched that scores with it, runs started from it or scored by it. ``run_resume`` refuses in these words and
    the run page greys Resume with them (``rerun_refusals``)."""
    from webapp.runs import pipelines  # pipelines build on this module

    return pipelines.result_refusal(run) or pipelines.counted_on_refusal(run) or _used_model_refusal(run)


@transaction.atomic
def run_resume(*, run: Run, user: AbstractBaseUser | None, max_steps: int | None = None, for_api: bool = False) -> Run:
    """Queue a cancelled, failed (or, with more ``max_steps``, succeeded) run again on its own run
    directory: the engine continues from its last checkpoint and the metric history continues. ``for_api``: a
    refusal's way out in the REST API's words (its ``duplicate/``), not the run page's (its Duplicate)."""
    project_lock(project=run.project, doing="as the run was being resumed")
    run = Run.objects.select_for_update(of=("self",)).get(pk=run.pk)
    _refuse_external(run, "resumed")
    _refuse_gone_inputs(run, keep_base_model=True, for_api=for_api)
    _refuse_a_model_no_longer_loadable(run, doing="resumed", for_api=for_api)
    if run.status not in (RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.SUCCEEDED):
        raise ValidationError({"__all__": f"run {run.public_id} {run.status_phrase}; only a finished run can be resumed"})
    if refusal := lost_checkpoints_refusal(run, for_api=for_api):
        raise ValidationError({"__all__": refusal})
    _refuse_while_files_written(run)
    if refusal := replaced_model_refusal(run):
        raise ValidationError({"__all__": refusal})
    _refuse_resuming_past_the_models_positions(run, for_api=for_api)
    if max_steps is not None:
        if max_steps <= run.current_step:
            raise ValidationError({"max_steps": f"give more than the {counted(run.current_step, 'step')} already done"})
        if problem := _steps_problem(max_steps):
            raise ValidationError({"max_steps": problem})
        for spec in (run.spec, run.resolved_spec):
            spec["train"]["max_steps"] = max_steps
            spec["train"]["epochs"] = None
        try:
            parse_spec(run.resolved_spec)
        except SpecError as error:
            raise ValidationError({"max_steps": error.problems}) from None
        run.total_steps = max_steps
    elif run.status == RunStatus.SUCCEEDED:
        raise ValidationError({"max_steps": f"the run has done all its {counted(run.current_step, 'step')}: give a new total above "
                                            f"{run.current_step} (the box beside Train further; max_steps in the API) to train "
                                            "it further"})
    activity_record(project=run.project, actor=user, target=run, details={"max_steps": max_steps} if max_steps else None,
                    verb=Verb.RUN_TRAINED_FURTHER if run.status == RunStatus.SUCCEEDED else Verb.RUN_RESUMED)
    run.status = RunStatus.QUEUED
    run.attempt += 1
    run.queued_at = timezone.now()
    run.series_cache = {}
    run.cancel_requested = False
    run.error_message = run.notice = ""
    run.worker_name = ""  # it waits for whichever train worker is free, as a re-queued lost run does
    run.lost_in_a_row, run.lost_after_checkpoint = 0, None  # a person's resume: lost attempts count afresh
    run.finished_at = None
    run.archived = False  # it trains again: in the table, not hidden under "archived"
    run.save()
    saved = checkpoint_steps(run)  # the engine restores the latest
    log_line(run, f"resume queued by {user.get_username() if user else 'the system'}"
                  + (f" with max_steps {max_steps}" if max_steps else "")
                  + (f"; continuing from checkpoint {saved[-1]}" if saved
                     else "; no checkpoint was saved, so it starts from step 0"))
    from webapp.runs import pipelines  # pipelines build on this module

    pipelines.pipeline_follow_resume(run=run, user=user)
    publish_status(run)
    public_id = run.public_id
    transaction.on_commit(lambda: _clear_cancel_flag(public_id))
    _enqueue(run)
    return run


EXPORT_CHECKPOINT_TASK = "worker.tasks.train.export_checkpoint"
EXPORT_CHECKPOINT_QUEUE = "train"


def checkpoint_steps(run: Run) -> list[int]:
    """Steps of the checkpoints in the run's directory (orbax writes one directory per step)."""
    return checkpoint_steps_in(run.output_dir)


def checkpoint_steps_in(output_dir: Path) -> list[int]:
    """Steps of the checkpoints in the run directory ``output_dir``; none for a folder that is not there (a run
    never started, or deleted from disk)."""
    try:  # the listing's file types: no stat of each entry (the Storage page lists every run's)
        with os.scandir(output_dir / CHECKPOINTS_DIRECTORY) as entries:
            return sorted(int(entry.name) for entry in entries if entry.name.isdigit() and entry.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def final_model_step(run: Run) -> int | None:
    """The step of a succeeded run's final model (its ``model`` artifact, exported when it succeeded), else None: the
    checkpoint of that step holds the same weights, so it is not exported again (``checkpoint_export_request``) and
    the run page shows it as the final model (``selectors.checkpoint_list``). A run resumed since is not succeeded:
    its earlier final model is not offered, and that step's checkpoint may be exported. Nor is a final model whose
    export folder was deleted since (``model_dir_gone``): that checkpoint, while the run's folder keeps it, is then
    the only way to the model again (``run_…@<step>``)."""
    if run.status != RunStatus.SUCCEEDED:
        return None
    final = run.artifacts.filter(kind=ArtifactKind.MODEL).values_list("step", "path").first()
    if final is None or model_dir_gone(final[1]):
        return None
    return final[0]


@transaction.atomic
def checkpoint_export_request(*, run: Run, step: int, user: AbstractBaseUser | None) -> Run:
    """Queue the export of checkpoint ``step`` of a finished run to ``<output_dir>/export-step-<step>``
    (a Hugging Face model, like the final export); other runs can then start from ``run_…@<step>``.
    The train queue does it: loading the model needs the engine and the accelerator. The run's row is
    locked and read again: a resume (which rotates checkpoints out) and an export never overlap."""
    run = Run.objects.select_for_update(of=("self",)).get(pk=run.pk)
    if not run.is_finished or run.task == EXTERNAL_TASK:
        raise ValidationError({"step": f"run {run.public_id} {run.status_phrase}; export checkpoints of finished runs"})
    # Exported first: an export outlives its training checkpoint's deletion, and is no less exported for it.
    if run.artifacts.filter(kind=ArtifactKind.CHECKPOINT, step=step).exists():
        raise ValidationError({"step": f"checkpoint {step} of {run.public_id} is already exported"})
    available = checkpoint_steps(run)
    if step not in available:
        raise ValidationError({"step": f"run {run.public_id} has no checkpoint {step}; it has "
                                       f"{', '.join(map(str, available)) or 'none'}"})
    if step == final_model_step(run):
        raise ValidationError({"step": f"checkpoint {step} of {run.public_id} is the run's final model, exported "
                                       f"when it succeeded: start runs from {run.public_id}"})
    export, created = CheckpointExport.objects.select_for_update(of=("self",)).get_or_create(
        run=run, step=step, defaults={"requested_by": user if user and user.is_authenticated else None})
    if not created:
        if export.status == CheckpointExportStatus.EXPORTING:
            raise ValidationError({"step": f"checkpoint {step} of {run.public_id} is being exported; "
                                           "it is listed on the run's page once it is done"})
        export.status, export.error_message, export.notice = CheckpointExportStatus.EXPORTING, "", ""
        export.requested_by = user if user and user.is_authenticated else None
        export.save(update_fields=["status", "error_message", "notice", "requested_by", "updated_at"])
    log_line(run, f"export of checkpoint {step} queued by {user.get_username() if user else 'the system'}")
    run_pk = run.pk
    transaction.on_commit(lambda: celery_app.send_task(EXPORT_CHECKPOINT_TASK, args=[run_pk, step],
                                                                queue=EXPORT_CHECKPOINT_QUEUE))
    return run


def checkpoint_export_pending(*, run_pk: int, step: int) -> Run | None:
    """The run whose checkpoint ``step`` is to be exported, or None when its export already ended as
    exported (a message delivered twice: after Celery's visibility timeout, or queued again after its
    worker was lost): exporting again would rewrite a directory that runs may be starting from."""
    export = CheckpointExport.objects.filter(run_id=run_pk, step=step).select_related("run").first()
    if export is None or export.status == CheckpointExportStatus.EXPORTED:
        logger.info("run %s: checkpoint %s is not waiting for an export; message dropped", run_pk, step)
        return None
    return export.run


@transaction.atomic
def checkpoint_export_finish(*, run: Run, step: int, export_dir: Path | None = None,
                             error: BaseException | None = None, failure: str | None = None) -> CheckpointExport:
    """Record how the export of checkpoint ``step`` went (``export_dir`` written, or ``error`` raised, or
    ``failure``: why it ended without either, as for a lost export), and tell an open run page: it shows
    the checkpoint as exporting until this event (or its next catch-up) arrives. The one place an export ends: its
    project's ``export.ready``/``export.failed`` webhooks are told here."""
    from webapp.runs.reporting import checkpoint_export_failed, checkpoint_exported, publish_event

    if error is not None:
        failure = f"{type(error).__name__}: {error}"
    if failure is None:
        checkpoint_exported(run=run, step=step, export_dir=export_dir)
    else:
        checkpoint_export_failed(run=run, step=step, reason=failure)
    export, _ = CheckpointExport.objects.select_for_update(of=("self",)).get_or_create(run=run, step=step)
    was = export.status
    export.status = CheckpointExportStatus.EXPORTED if failure is None else CheckpointExportStatus.FAILED
    export.error_message = (failure or "")[:4000]
    export.notice = ""
    export.save(update_fields=["status", "error_message", "notice", "updated_at"])
    if export.status != was:  # the same end reported again (a redelivered message) is not a second end
        webhooks.checkpoint_export_ended(export=export)
    still_exporting = list(run.checkpoint_exports.filter(status=CheckpointExportStatus.EXPORTING)
                           .values_list("step", flat=True))
    event = {"type": "checkpoint", "step": step, "status": export.status, "exporting": still_exporting}
    public_id = run.public_id
    transaction.on_commit(lambda: publish_event(public_id, event))
    return export


def checkpoint_export_requeued(arguments: tuple, *, lost: LostWorker) -> bool:
    """Say on a checkpoint being exported that its worker was lost and the export was queued again
    (``workers.deliveries.FIRST_LOSS_NOTES``): in its ``notice``, which the run page shows beside "exporting" and
    the export's outcome clears (not in ``error_message``, which holds a failure only), and in the run's log. Whether it was said (not for an export ended
    meanwhile). ``updated_at`` is kept: ``checkpoint_exports_fail_lost`` counts the export's silence from it."""
    run_pk, step = arguments
    note = lost.note(doing=f"exporting checkpoint {step}", work="the export")
    if not CheckpointExport.objects.filter(run_id=run_pk, step=step, status=CheckpointExportStatus.EXPORTING).update(
            notice=note):
        return False
    log_line(Run.objects.get(pk=run_pk), note, level=LogLevel.WARNING)
    return True


def checkpoint_exports_fail_lost(*, now: datetime | None = None) -> list[CheckpointExport]:
    """Fail each checkpoint export asked for over ``TEMPER_RUN_LOST_SECONDS`` ago whose message Redis no
    longer holds, waiting or delivered, so that it can be asked for again: an export has no heartbeat,
    but its message stays in Redis until the export is recorded (``acks_late``), however long it waits
    behind a training run or takes. Celery acknowledges it without a record when the worker process
    doing it dies (killed, out of memory), and a Redis restart without persistence drops it; a worker
    killed outright leaves it delivered, and Celery hands it to another worker after its visibility
    timeout. Safe from many reapers at once: an export is failed only while locked and still as read."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TEMPER_RUN_LOST_SECONDS)
    waiting = list(CheckpointExport.objects.filter(status=CheckpointExportStatus.EXPORTING, updated_at__lt=cutoff)
                   .select_related("run"))
    if not waiting:
        return []
    present = held_task_messages(task=EXPORT_CHECKPOINT_TASK, queues=(EXPORT_CHECKPOINT_QUEUE,),
                                 checking="checkpoint exports", now=now)
    if present is None:
        return []
    failed = []
    for export in waiting:
        if (export.run_id, export.step) in present:
            continue
        with transaction.atomic():
            # Not if it ended, or was asked for again, since it was read.
            if not CheckpointExport.objects.select_for_update(of=("self",)).filter(
                    pk=export.pk, status=CheckpointExportStatus.EXPORTING, updated_at=export.updated_at).exists():
                continue
            silent = int((now - export.updated_at).total_seconds())
            failure = (f"the export was lost: its worker stopped before it ended (killed, out of memory) or Redis "
                       f"lost its message, which Redis held nowhere {silent} s after it was asked for; export again")
            failed.append(checkpoint_export_finish(run=export.run, step=export.step, failure=failure))
    return failed


# A checkpoint being deleted is first renamed to this, inside the run's directory but outside ``checkpoints/``, then
# removed: the rename is atomic, so neither the engine (orbax lists ``checkpoints/<step>`` only) nor the run page ever
# sees a half-removed step folder that a resume or an export would try to restore. The name has no ``_<digits>`` end:
# orbax takes such a name for a step wherever it lists.
CHECKPOINT_TRASH_PREFIX = ".deleting-checkpoint-"


def active_run_checkpoints_refusal(run: Run) -> str:
    """Why no checkpoint of ``run`` may be deleted while it is queued, running or stopping, or "" once it has ended."""
    if not run.is_active:
        return ""
    doing = "is stopping" if run.is_stopping else run.status_phrase
    return (f"run {run.public_id} {doing}: its engine restores, saves and rotates out checkpoints itself while it "
            "runs. Delete the checkpoint once the run has ended (cancel it first if it should not go on)")


def checkpoint_delete_refusal(run: Run, step: int) -> str:
    """Why checkpoint ``step`` of ``run`` may not be deleted now, with what to do instead, or "": while the run is
    queued, running or stopping (its engine restores, writes and rotates out checkpoints itself), and while the
    checkpoint is being exported (the train worker reads its folder) or a serving copy of its export is being
    written. The run page shows the button greyed with these words; ``checkpoint_delete`` refuses in them."""
    if refusal := active_run_checkpoints_refusal(run):
        return refusal
    if run.checkpoint_exports.filter(step=step, status=CheckpointExportStatus.EXPORTING).exists():
        return (f"checkpoint {step} of run {run.public_id} is being exported: the train worker is reading it. Delete it "
                "once the export is done (its page lists it then); the exported model stays")
    if ServingCopy.objects.filter(run=run, step=step, status=ServingCopyStatus.WRITING).exists():
        return (f"a serving copy of checkpoint {step} of run {run.public_id} is being written. Delete the checkpoint "
                "once the copy is ready or has failed")
    return ""


@dataclass(frozen=True)
class CheckpointDeleted:
    """What ``checkpoint_delete`` deleted: the step, and the bytes its folder held."""

    step: int
    bytes_freed: int


@transaction.atomic
def checkpoint_delete(*, run: Run, step: int, user: AbstractBaseUser | None, record: bool = True) -> CheckpointDeleted:
    """Delete the training checkpoint ``step`` of ``run`` (``checkpoints/<step>``) to free its disk, keeping the run,
    its curves, its other checkpoints and the checkpoint's export, if any. ``Http404`` when the run's folder holds no
    such checkpoint (deleted already, rotated out, never saved); ``ValidationError`` (``step``) with
    ``checkpoint_delete_refusal``'s words, nothing changed. The run's row is locked and read again, so that a resume,
    an export or a serving copy asked for meanwhile (each locks it too) and a second deletion of the step come
    before or after this one, never between its checks and its rename. ``record``: log it (``webapp.activity``);
    False for ``checkpoints_prune``'s, which logs the whole pruning once."""
    from webapp.runs.selectors import folder_bytes  # selectors import this module

    run = Run.objects.select_for_update(of=("self",)).get(pk=run.pk)
    saved = checkpoint_steps(run)
    if step not in saved:
        raise Http404(f"run {run.public_id} has no checkpoint {step} in its folder (deleted already, or rotated out by "
                      f"the run); it has {', '.join(map(str, saved)) or 'none'}")
    if refusal := checkpoint_delete_refusal(run, step):
        raise ValidationError({"step": refusal})
    folder = run.output_dir / "checkpoints" / str(step)
    freed = folder_bytes(folder)
    # An export that failed said so beside the step; a resume may save that step again, which was never exported.
    run.checkpoint_exports.filter(step=step, status=CheckpointExportStatus.FAILED).delete()
    log_line(run, f"checkpoint {step} deleted by {user.get_username() if user else 'the system'} "
                  f"({filesizeformat(freed)} freed)")
    # Left by a deletion whose process stopped between its rename and its removal: removed with this one.
    leftovers = list(run.output_dir.glob(f"{CHECKPOINT_TRASH_PREFIX}*"))
    trash = run.output_dir / f"{CHECKPOINT_TRASH_PREFIX}{step}-{secrets.token_hex(4)}"
    if record:
        activity_record(project=run.project, actor=user, verb=Verb.CHECKPOINT_DELETED, target=run,
                        details={"step": step, "bytes_freed": freed})
    folder.rename(trash)  # last: a failure before it leaves the checkpoint and its rows as they were
    transaction.on_commit(functools.partial(_remove_folders, [trash, *leftovers]))
    return CheckpointDeleted(step=step, bytes_freed=freed)


@dataclass(frozen=True)
class CheckpointsPruned:
    """What ``checkpoints_prune`` deleted, oldest first, and what it kept with why (``{step: [reasons]}``)."""

    deleted: list[CheckpointDeleted]
    kept: dict[int, list[str]]

    @property
    def bytes_freed(self) -> int:
        return sum(deleted.bytes_freed for deleted in self.deleted)


@transaction.atomic
def checkpoints_prune(*, run: Run, user: AbstractBaseUser | None, keep: Iterable[int] = ()) -> CheckpointsPruned:
    """Delete every training checkpoint of ``run`` but those worth keeping (``selectors.checkpoint_prune_plan``: the
    newest, which Resume and Train further restore; the best by the run's ranking metric; the steps in ``keep``; any
    ``checkpoint_delete`` would refuse now), each through ``checkpoint_delete``, so that one deletion's checks,
    log line and trash-folder rename are the rules of all. The run's row is locked once for the whole: a resume or an
    export asked for meanwhile comes before or after, never between two steps. ``ValidationError`` (``run``) while
    the run is active, (``keep``) for a pinned step the folder has no checkpoint of; nothing changed either way."""
    from webapp.runs.selectors import checkpoint_prune_plan  # selectors import this module

    run = Run.objects.select_for_update(of=("self",)).get(pk=run.pk)
    if refusal := active_run_checkpoints_refusal(run):
        raise ValidationError({"run": refusal})
    plan = checkpoint_prune_plan(run=run, keep=keep, measure=False)
    deleted = [checkpoint_delete(run=run, step=step, user=user, record=False) for step in plan.deleted]
    if deleted:  # a project-wide prune logs each run it pruned, in that run's own transaction
        activity_record(project=run.project, actor=user, verb=Verb.CHECKPOINTS_PRUNED, target=run, details={
            "steps": [each.step for each in deleted], "bytes_freed": sum(each.bytes_freed for each in deleted)})
    return CheckpointsPruned(deleted=deleted, kept=plan.kept)


@dataclass(frozen=True)
class ProjectCheckpointsPruned:
    """What ``project_checkpoints_prune`` did: each pruned run with what it deleted, and the runs it skipped with
    checkpoints to prune but active (each with why)."""

    pruned: list[tuple[Run, CheckpointsPruned]]
    skipped: list[tuple[Run, str]]

    @property
    def checkpoints(self) -> int:
        return sum(len(result.deleted) for _run, result in self.pruned)

    @property
    def bytes_freed(self) -> int:
        return sum(result.bytes_freed for _run, result in self.pruned)


# The Storage page's project-wide prune runs here, on the default queue: over 300 runs of 5 checkpoints it took 3-4 s
# on the 2-core bench host, most of it removing the renamed folders on commit, which grows with the files a checkpoint
# holds (bench/checkpoint_prune.py, bench/RESULTS.md): too long for a request.
PRUNE_PROJECT_TASK = "worker.tasks.storage.prune_project_checkpoints"


# A prune row not written for this long is taken as stopped (its worker lost), so that it no longer refuses the next
# prune: a running one writes after each run, which takes well under a second (bench/RESULTS.md).
PRUNE_STALLED_AFTER = timedelta(minutes=15)


def project_prune_latest(*, project: Project) -> ProjectCheckpointPrune | None:
    """The last project-wide prune asked for in ``project`` (running or not), or None."""
    return ProjectCheckpointPrune.objects.filter(project=project).select_related("requested_by").first()


def project_prune_is_running(prune: ProjectCheckpointPrune) -> bool:
    """Whether ``prune`` is queued or under way: unfinished and written within ``PRUNE_STALLED_AFTER``."""
    return prune.finished_at is None and prune.updated_at > timezone.now() - PRUNE_STALLED_AFTER


def project_prune_running_refusal(running: ProjectCheckpointPrune) -> str:
    """Why another project-wide prune is refused while ``running`` goes on, and what to do."""
    asked = f"asked by {running.requested_by.get_username() if running.requested_by else 'a deleted account'}"
    progress = (f"{running.runs_done} of {running.runs_total} runs done" if running.runs_total is not None
                else "waiting for a worker")
    return (f"The checkpoints of this project's ended runs are being pruned already ({asked} "
            f"{when(running.requested_at)}, {progress}): wait for it to finish, then prune again if need be.")


@transaction.atomic
def project_checkpoints_prune_request(*, project: Project, user: AbstractBaseUser) -> ProjectCheckpointPrune:
    """Record a project-wide prune of ``project`` for ``user`` and queue ``project_checkpoints_prune`` once the
    transaction commits; ``ValidationError`` while another is queued or running (the project row locked first, so
    that two owners pressing at once make one)."""
    project = project_lock(project=project, doing="as its checkpoints were to be pruned")
    latest = project_prune_latest(project=project)
    if latest and project_prune_is_running(latest):
        raise ValidationError(project_prune_running_refusal(latest))
    prune = ProjectCheckpointPrune.objects.create(project=project, requested_by=user)
    project_pk, user_pk, prune_pk = project.pk, user.pk, prune.pk
    transaction.on_commit(lambda: celery_app.send_task(PRUNE_PROJECT_TASK, args=[project_pk, user_pk, prune_pk],
                                                       queue="default"))
    return prune


def project_checkpoints_prune(*, project: Project, user: AbstractBaseUser | None,
                              progress: ProjectCheckpointPrune | None = None) -> ProjectCheckpointsPruned:
    """``checkpoints_prune`` every run of ``project`` with more than one training checkpoint, each in its own
    transaction: a run pruned stays pruned, its folders removed as it commits, when a later one is refused. A run
    still active (or started again since the page showed it) is skipped with ``active_run_checkpoints_refusal``'s
    words; one whose folders cannot be removed (an ``OSError``) is skipped with the error, the others still pruned.
    With ``progress`` (the Storage page's), its progress and outcome are written to it after each run, outside those
    transactions, for the page to read while it goes; it is marked finished even when the prune stops on an error."""
    runs = [run for run in Run.objects.filter(project=project).order_by("created_at", "pk")
            if len(checkpoint_steps(run)) >= 2]  # the newest is always kept: with one, nothing would go
    if progress:
        _prune_recorded(progress, runs_total=len(runs), runs_done=0)
    pruned, skipped = [], []
    try:
        for done, run in enumerate(runs, start=1):
            try:
                result = checkpoints_prune(run=run, user=user)
            except ValidationError as error:
                skipped.append((run, "; ".join(error.messages)))
            except OSError as error:
                skipped.append((run, f"its checkpoint folders could not be deleted: {error}"))
            except Run.DoesNotExist:
                pass  # deleted since: its checkpoints went with it
            else:
                if result.deleted:
                    pruned.append((run, result))
            if progress:
                outcome = ProjectCheckpointsPruned(pruned=pruned, skipped=skipped)
                _prune_recorded(progress, runs_done=done, checkpoints_deleted=outcome.checkpoints,
                                bytes_freed=outcome.bytes_freed,
                                failures=[_prune_failure(run, why) for run, why in skipped])
    except Exception as error:
        if progress:
            skipped.append((None, f"the prune stopped: {error}"))
            _prune_recorded(progress, finished_at=timezone.now(),
                            failures=[_prune_failure(run, why) for run, why in skipped])
        raise
    if progress:
        _prune_recorded(progress, finished_at=timezone.now())
    return ProjectCheckpointsPruned(pruned=pruned, skipped=skipped)


def _prune_recorded(record: ProjectCheckpointPrune, **changes) -> None:
    ProjectCheckpointPrune.objects.filter(pk=record.pk).update(updated_at=timezone.now(), **changes)


def _prune_failure(run: Run | None, why: str) -> dict[str, str]:
    return {"run": run.public_id if run else "", "name": run.name if run else "", "why": why}


def _remove_folders(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


@transaction.atomic
def run_retry(*, run: Run, user: AbstractBaseUser | None, for_api: bool = False) -> Run:
    """Start ``run``'s spec over as a new run with its own fresh run directory, named after it
    (``retry_name``). The same run again: it keeps the template date its launch fixed, which stays marked as
    Temper's (``Run.stamped_template_date``), so a copy of the retry fixes its own day as a copy of ``run`` does.
    ``for_api``: a refusal's way out in the REST API's words, as ``run_resume``'s."""
    _refuse_external(run, "retried")
    _refuse_gone_inputs(run, for_api=for_api)
    _refuse_a_model_no_longer_loadable(run, doing="retried", for_api=for_api)
    retry = run_create(project=run.project, spec=run.spec, user=user, name=retry_name(run), tags=run.tags,
                       for_api=for_api, record=False)
    activity_record(project=run.project, actor=user, verb=Verb.RUN_RETRIED, target=run, details={"as": retry.public_id})
    if run.stamped_template_date and template_date(retry.spec) == run.stamped_template_date:
        retry.stamped_template_date = run.stamped_template_date
        retry.save(update_fields=["stamped_template_date"])
    return retry


def run_duplicate(*, run: Run, user: AbstractBaseUser | None, spec_changes: dict[str, Any],
                  name: str | None = None, tags: list[str] | None = None) -> Run:
    """Launch a copy of ``run`` (the REST API's ``duplicate/``): its spec as the launch page's Duplicate fills the
    form with (``spec_of_a_copy``), with ``spec_changes`` merged onto it section by section as edits of that form
    (a key given drops its one-of rival, as the form clears it), named and tagged as that page offers unless
    ``name`` or ``tags`` is given, and launched by ``run_create``, which checks it as any launch."""
    _refuse_external(run, "duplicated")
    spec, _left_out_date = spec_of_a_copy(run)
    spec = merge_spec(without_rivals(spec, spec_initial(spec_changes)), spec_changes)
    return run_create(project=run.project, spec=spec, user=user, name=copy_name(run) if name is None else name,
                      tags=sweeps.tags_of_a_copy(run.tags) if tags is None else tags, for_api=True)


def copy_name(run: Run) -> str:
    """The name a copy of ``run`` is offered: ``x (copy)``, the name before the suffix cut to fit."""
    suffix = " (copy)"
    return run.name[:RUN_NAME_MAX - len(suffix)].rstrip() + suffix


def template_date(spec: dict[str, Any]) -> Any:
    """The ``data.chat_template_kwargs.date_string`` of a written spec; None where it sets none."""
    from jaxengine.chat_template import DATE_VARIABLE

    variables = ((spec or {}).get("data") or {}).get("chat_template_kwargs")
    return variables.get(DATE_VARIABLE) if isinstance(variables, dict) else None


def spec_of_a_copy(run: Run) -> tuple[dict[str, Any], str | None]:
    """``run``'s spec for a copy of it (the launch page's Duplicate), and the template date it leaves out: the one
    ``run``'s launch fixed itself (``Run.stamped_template_date``), so that the copy's launch fixes the day it is
    launched rather than render ``run``'s day. A date the spec's author wrote stays."""
    from jaxengine.chat_template import DATE_VARIABLE

    spec = copy.deepcopy(run.spec)
    stamped = run.stamped_template_date
    if not stamped or template_date(spec) != stamped:
        return spec, None
    variables = {name: value for name, value in spec["data"]["chat_template_kwargs"].items() if name != DATE_VARIABLE}
    spec["data"]["chat_template_kwargs"] = variables
    return spec, stamped


def template_date_today(run: Run) -> str | None:
    """Today's date as the chat template of ``run``'s model writes it (``jaxengine.chat_template.stamped_date``),
    for the copy's launch page to say which day its launch fixes; None where the model cannot be read now."""
    from jaxengine import chat_template

    model_path = run.resolved_spec.get("model")
    run_spec_variables = (run.resolved_spec.get("data") or {}).get("run_spec_template_kwargs") is not False
    tokenizer = (_model_tokenizer_settings(model_path, run_spec_variables=run_spec_variables)
                 if isinstance(model_path, str) and model_path else None)
    if tokenizer is None:
        return None
    try:
        return chat_template.stamped_date(tokenizer.chat_template or chat_template.DEFAULT_CHAT_TEMPLATE)
    except chat_template.ChatTemplateError:
        return None


RETRY_SUFFIX = re.compile(r" \(retry(?: (?P<number>[0-9]+))?\)$")


def retry_name(run: Run) -> str:
    """The name of a retry of ``run``: ``x (retry)``, then ``x (retry 2)``, ``x (retry 3)``…, counted on from a
    retry's own suffix (a retry of ``x (retry)`` is ``x (retry 2)``, not ``x (retry) (retry)``) and skipping the
    names the project's runs already have; the name before the suffix is cut to fit, so a retry is always told
    apart from what it retries."""
    base, number = run.name, 1
    if match := RETRY_SUFFIX.search(run.name):
        base, number = run.name[:match.start()], int(match["number"] or 1) + 1
    taken = set(Run.objects.filter(project=run.project_id, name__contains=" (retry").values_list("name", flat=True))
    while True:
        suffix = " (retry)" if number == 1 else f" (retry {number})"
        name = base[:RUN_NAME_MAX - len(suffix)].rstrip() + suffix
        if name not in taken:
            return name
        number += 1


RUN_NAME_MAX = 120  # Run.name's max_length


def _checked_name(name: str, *, required: bool) -> str:
    """A run name, stripped and in NFC; a ValidationError when it is blank (if ``required``), too long (it
    was cut at 120 characters without a word) or holds a NUL or an invisible character."""
    name = checked_name(name, field="name")
    if required and not name:
        raise ValidationError({"name": "a run needs a name"})
    if len(name) > RUN_NAME_MAX:
        raise ValidationError({"name": f"{len(name)} characters; a run name has at most {RUN_NAME_MAX}"})
    return name


def edit_digest(text: str) -> str:
    """A fingerprint of a field's text as the run's edit form shows it (``shown_details``), which the
    form sends back beside the field: what it was when the page was opened."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def shown_details(run: Run) -> dict[str, str]:
    """The run's name, tags and notes as its edit form shows them."""
    return {"name": run.name, "tags": ", ".join(run.tags), "notes": run.notes}


@transaction.atomic
def run_update_details(*, run: Run, name: str | None = None, tags: str | list[str] | None = None,
                       notes: str | None = None, seen: dict[str, str] | None = None) -> Run:
    """Rename a run, set its tags (comma-separated or a list) or its markdown notes.

    ``seen``: the ``edit_digest`` of each field as the form showed it. A field sent as it was shown is
    left as it is now (a tab opened before a teammate's edit, changing only the tags, wiped their
    notes); a field changed here that someone else changed meanwhile is refused, naming it, so that
    nobody's text is replaced unseen. Sent again, the form carries what it now shows, and replaces it."""
    if tags is not None:  # before the run's row, as a deletion takes them
        project_lock(project=run.project, doing="as the run's tags were being set")
    run = Run.objects.select_for_update(of=("self",)).get(pk=run.pk)
    given = {"name": name, "tags": tags, "notes": notes}
    if seen:
        now = shown_details(run)
        changed_elsewhere = {}
        for key, value in given.items():
            if not isinstance(value, str) or key not in seen:
                continue
            if edit_digest(value) == seen[key]:
                given[key] = None  # as the form showed it: this edit leaves it as it is now
            elif edit_digest(now[key]) != seen[key]:
                changed_elsewhere[key] = [f"someone else changed the {key} since this page was opened; yours is "
                                          "kept here: save again to replace theirs, or reload the page to read it"]
        if changed_elsewhere:
            raise ValidationError(changed_elsewhere)
    name, tags, notes = given["name"], given["tags"], given["notes"]
    fields = []
    if name is not None:
        run.name = _checked_name(name, required=True)
        fields.append("name")
    if notes is not None:
        run.notes = checked_text(notes, field="notes", max_length=LONG_TEXT_MAX_CHARS)
        fields.append("notes")
    if tags is not None:
        run_tags_write(run=run, tags=parse_tags(tags))
    run.save(update_fields=fields)
    return run


@transaction.atomic
def run_set_archived(*, runs: list[Run], archived: bool, actor: AbstractBaseUser | None = None) -> int:
    """Archive (hide from the default table) or restore runs; returns how many changed. Archiving a queued or
    running run is refused (``ValidationError`` on ``runs``), and then none is archived: hidden under "archived",
    it would go on holding a train worker out of sight of the table; cancel it first (a resume brings an
    archived run back to the table, as it trains again)."""
    chosen = Run.objects.select_for_update(of=("self",)).filter(pk__in=[run.pk for run in runs])
    if archived:
        active = list(chosen.filter(status__in=ACTIVE_STATUSES).order_by("created_at"))
        if len(active) == 1:
            raise ValidationError({"runs": f"run {isolated(active[0].name)} ({active[0].public_id}) is "
                                           f"{active[0].status}: cancel it first, then archive it. Nothing was archived"})
        if active:
            shown = ", ".join(f"{isolated(run.name)} ({run.public_id}, {run.status})" for run in active[:5])
            more = f" and {len(active) - 5} more" if len(active) > 5 else ""
            raise ValidationError({"runs": f"runs {shown}{more} are queued or running: cancel them first, or untick "
                                           "them. Nothing was archived"})
    for run in chosen.exclude(archived=archived).select_related("project").order_by("created_at"):
        activity_record(project=run.project, actor=actor, verb=Verb.RUN_ARCHIVED if archived else Verb.RUN_UNARCHIVED,
                        target=run)
    return chosen.update(archived=archived)


@transaction.atomic
def run_delete(*, run: Run, actor: AbstractBaseUser | None = None) -> None:
    """Delete ``run`` — its metrics, samples, logs, checkpoints, exports and serving copies — and, once
    committed, its directory. Refused (``ValidationError`` on ``delete``) while anything still needs it
    (``selectors.run_readers``). Runs started from its model keep their history and name it as deleted
    (``Run.deleted_references``); chat conversations, arena votes and review items keep their texts."""
    from webapp.chat import services as chat_services  # the chat is built on runs
    from webapp.runs.selectors import run_readers  # selectors import this module

    run = Run.objects.select_for_update(of=("self",)).select_related("pipeline").get(pk=run.pk)  # pipeline: nullable
    if problems := run_readers(run=run):
        raise ValidationError({"delete": problems})
    directory = run_output_dir(run.public_id)
    public_id, name = run.public_id, run.name
    run.delete()
    activity_record(project=run.project, actor=actor, verb=Verb.RUN_DELETED, target=run)
    _metric_names_forget(project_id=run.project_id, names=run.final_metrics or {})
    transaction.on_commit(lambda: shutil.rmtree(directory, ignore_errors=True))
    chat_services.models_deleted(refs=[public_id])
    logger.info("run %s (%s) deleted", public_id, name)


def _worker_gone(run: Run, workers: dict[str, Worker], *, now: datetime) -> str | None:
    """Why the worker process that ran ``run``'s attempt is gone, by its own heartbeat (``Worker``), or
    None while it may be alive: its row silent for two of its heartbeats, marked stopped, or taken over by
    a process started after the attempt began (a worker restarted under the same name). None too where
    nothing tells (heartbeats off, no row): the run's own silence alone decides then, after
    ``TEMPER_RUN_LOST_SECONDS``."""
    worker = workers.get(run.worker_name)
    if worker is None or settings.TEMPER_HEARTBEAT_SECONDS <= 0:
        return None
    if worker.stopped_at is not None:
        return "its worker stopped"
    if run.started_at is not None and worker.started_at > run.started_at:
        return "its worker was restarted"
    silent = (now - worker.last_seen).total_seconds()
    if silent > WORKER_GONE_BEATS * settings.TEMPER_HEARTBEAT_SECONDS:
        return f"its worker has been silent for {int(silent)} s"
    return None


# A run's worker is gone once this many of its heartbeats are missing, and the run's own heartbeat (written by a
# thread of its own, beside the engine, so a compilation or a long step does not hold it) is missing as many.
WORKER_GONE_BEATS = 2


def runs_reap_lost(*, now: datetime | None = None) -> list[Run]:
    """Re-queue running runs whose worker died (SIGKILL, out of memory, host lost): those whose heartbeat is
    older than ``TEMPER_RUN_LOST_SECONDS``, and sooner those silent for ``WORKER_GONE_BEATS`` of their
    heartbeats whose worker process is gone too (``_worker_gone``) — both the run's writer thread and its
    worker's main process silent, which a busy engine does not make. Each is queued as a new attempt that
    resumes from its last checkpoint (``run_attempt_lost``); one whose cancel was requested is marked
    cancelled instead. Safe to run from many processes at once: a run is taken by one conditional update only."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TEMPER_RUN_LOST_SECONDS)
    quiet = now - timedelta(seconds=WORKER_GONE_BEATS * settings.TEMPER_RUN_HEARTBEAT_SECONDS)
    # External runs are reported by a process Temper does not run: nothing to resume.
    silent_runs = list(Run.objects.filter(status=RunStatus.RUNNING, last_heartbeat__lt=max(quiet, cutoff))
                       .exclude(task=EXTERNAL_TASK))
    workers = {worker.name: worker for worker in Worker.objects.filter(
        name__in={run.worker_name for run in silent_runs})} if silent_runs else {}
    reaped = []
    for run in silent_runs:
        silent = int((now - run.last_heartbeat).total_seconds())
        if run.last_heartbeat < cutoff:
            why = f"silent for {silent} s"
        elif run.hosts == 1 and (gone := _worker_gone(run, workers, now=now)):
            why = f"silent for {silent} s, and {gone}"
        else:
            continue
        if (lost := run_attempt_lost(run=run, why=why, now=now, last_heartbeat=run.last_heartbeat)) is not None:
            reaped.append(lost)
    return reaped


@transaction.atomic  # the settled attempt and its log line are read together: a page never sees one alone
def run_attempt_lost(*, run: Run, why: str, now: datetime | None = None, last_heartbeat: datetime | None = None
                     ) -> Run | None:
    """Settle attempt ``run.attempt`` of a running run whose training process is gone (``why``, in words): queued
    again as the next attempt, to resume from its last checkpoint, with the reason (the worker, when the run was last
    heard from, why, and the checkpoint step it resumes from) as its message until that
    attempt starts (its page shows it); a run whose cancel was asked is cancelled, and a multi-host run failed. So
    is a run lost ``TEMPER_RUN_LOST_LIMIT`` times in a row with no new checkpoint between (the same step killing it
    each time would otherwise hold a train worker for ever), with the count and the last reason. Returns the re-queued run, or None when nothing was re-queued. Nothing happens unless the run is still
    running as that attempt (and, given ``last_heartbeat``, has not beaten since): one caller takes it."""
    now = now or timezone.now()
    claimed = Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING, attempt=run.attempt)
    if last_heartbeat is not None:
        claimed = claimed.filter(last_heartbeat=last_heartbeat)
    silent = int((now - run.last_heartbeat).total_seconds()) if run.last_heartbeat else 0
    if run.hosts > 1 and not run.cancel_requested:
        # Its other processes cannot go on without the lost one: failed, to be resumed by a person
        # once the pool has its hosts again.
        from webapp.runs.placement import lost_host_message

        message = lost_host_message(run, step=run.current_step, silent_seconds=silent)
        if claimed.update(status=RunStatus.FAILED, finished_at=now, error_message=message, notice=""):
            run.refresh_from_db()
            log_line(run, message, level=LogLevel.ERROR)
            publish_status(run)
            _advance_pipeline(run)
        return None
    if run.cancel_requested:
        message = f"worker {run.worker_name} was lost ({why}) after a cancel request; marked cancelled"
        if claimed.update(status=RunStatus.CANCELLED, finished_at=now, error_message=message, notice=""):
            run.refresh_from_db()
            log_line(run, message, level=LogLevel.WARNING)
            publish_status(run)
            _advance_pipeline(run)
        return None
    saved = checkpoint_steps(run)
    checkpoint = saved[-1] if saved else None
    in_a_row = run.lost_in_a_row + 1 if run.lost_in_a_row and checkpoint == run.lost_after_checkpoint else 1
    if 0 < settings.TEMPER_RUN_LOST_LIMIT <= in_a_row:
        message = _lost_too_often_message(run, why=why, in_a_row=in_a_row, checkpoint=checkpoint)
        if claimed.update(status=RunStatus.FAILED, finished_at=now, error_message=message[:4000], notice="",
                          lost_in_a_row=in_a_row, lost_after_checkpoint=checkpoint):
            run.refresh_from_db()
            log_line(run, run.error_message, level=LogLevel.ERROR)
            publish_status(run)
            logger.warning("run %s: %s", run.public_id, message)
            _advance_pipeline(run)
        return None
    # Said in full where the run's log keeps it: which worker, when it was last heard from, and where the next
    # attempt starts (the engine restores the newest checkpoint), so that steps trained again are no surprise.
    heard = f", last heard from at {when(run.last_heartbeat)}" if run.last_heartbeat else ""
    resume = (f"resume from its checkpoint at step {checkpoint}" if checkpoint is not None
              else "start over from step 0, as it had saved no checkpoint")
    message = (f"attempt {run.attempt} was lost at step {run.current_step} on worker {run.worker_name}{heard} "
               f"({why}); re-queued to {resume}")
    # A notice, not its error_message: the run has not failed, and a client that reads any error as failure would
    # take it for one.
    if not claimed.update(status=RunStatus.QUEUED, attempt=F("attempt") + 1, worker_name="",
                          notice=message[:4000], queued_at=now, lost_in_a_row=in_a_row,
                          lost_after_checkpoint=checkpoint):
        return None
    run.refresh_from_db()
    log_line(run, message, level=LogLevel.WARNING)
    # An open page reloads: the new attempt trains the steps after the checkpoint again, which it
    # would otherwise go on drawing with the lost attempt's values, under "running".
    publish_status(run)
    logger.warning("run %s: %s", run.public_id, message)
    _enqueue(run)
    return run


def _lost_too_often_message(run: Run, *, why: str, in_a_row: int, checkpoint: int | None) -> str:
    since = ("before saving any checkpoint" if checkpoint is None
             else f"no attempt saving a checkpoint after step {checkpoint}")
    return (f"lost {in_a_row} times in a row at step {run.current_step}, {since}: the last time, attempt "
            f"{run.attempt} on worker {run.worker_name} ({why}); it is not re-queued again: fix the cause (the same "
            "step each time is often out of memory there, or a batch that crashes the process) and Resume")


def task_messages_in_redis(client: redis.Redis, *, task: str, queues: tuple[str, ...],
                           leaving_out: set[str] = frozenset()) -> set[tuple]:
    """The arguments (as a tuple) of every ``task`` message Redis holds in ``queues``: waiting or delivered, but for
    the deliveries tagged in ``leaving_out``."""
    raw = []
    for queue in queues:
        raw += client.lrange(queue, 0, -1)
        for key in client.scan_iter(match=f"{queue}{KOMBU_PRIORITY_SEP}*"):
            raw += client.lrange(key, 0, -1)
    payloads = [json.loads(item) for item in raw]
    payloads += [json.loads(item)[0] for tag, item in client.hgetall(KOMBU_UNACKED_KEY).items()
                 if (tag.decode() if isinstance(tag, bytes) else tag) not in leaving_out]
    found = set()
    for payload in payloads:
        headers = payload.get("headers") or {}
        if headers.get("task") != task:
            continue
        try:
            arguments = ast.literal_eval(headers.get("argsrepr") or "")
        except (ValueError, SyntaxError):
            continue
        if isinstance(arguments, (list, tuple)) and all(isinstance(item, (int, float, str)) for item in arguments):
            found.add(tuple(arguments))
    return found


def held_task_messages(*, task: str, queues: tuple[str, ...], checking: str, now: datetime | None = None
                       ) -> set[tuple] | None:
    """``task_messages_in_redis`` over a client of its own, or None (logged: ``checking`` not checked) while
    Redis cannot be asked: the reaper's checks for lost messages then decide nothing. A message whose worker died
    after it had been delivered once before is not held (``deliveries.abandoned_tags``): Celery would keep it for
    its visibility timeout, an hour, in which its work said it was under way."""
    try:
        client = channels.redis_client()
        try:
            return task_messages_in_redis(client, task=task, queues=queues,
                                          leaving_out=abandoned_tags(client, now=now))
        finally:
            client.close()
    except redis.RedisError as error:
        logger.warning("%s not checked, Redis unavailable: %s", checking, error)
        return None


def train_messages_in_redis(client: redis.Redis, queues: tuple[str, ...] = ("train",)) -> set[tuple[int, int]]:
    """``(run pk, attempt)`` of every ``train_run`` message Redis holds in ``queues``: waiting or delivered."""
    return _run_attempts(task_messages_in_redis(client, task=TRAIN_TASK, queues=queues))


def _run_attempts(train_messages: set[tuple]) -> set[tuple[int, int]]:
    return {(int(arguments[0]), int(arguments[1])) for arguments in train_messages if len(arguments) == 2}


def runs_requeue_lost_messages(*, now: datetime | None = None) -> list[Run]:
    """Send again the message of each run queued for over ``TEMPER_RUN_LOST_SECONDS`` whose message
    Redis no longer holds (a Redis restart without persistence loses its queues). A message sent
    twice is harmless: only the first delivery finds the run queued as that attempt."""
    from webapp.runs.placement import pool_queue, run_pool

    def queue_of(run: Run) -> str:
        return pool_queue(run_pool(run))

    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TEMPER_RUN_LOST_SECONDS)
    # Multi-host runs are placed, not queued (``placement.runs_place_waiting`` retries them).
    waiting = list(Run.objects.filter(status=RunStatus.QUEUED, queued_at__lt=cutoff, hosts=1)
                   .exclude(task=EXTERNAL_TASK))
    if not waiting:
        return []
    held = held_task_messages(task=TRAIN_TASK, queues=tuple({queue_of(run) for run in waiting}), checking="queued runs")
    if held is None:
        return []
    present = _run_attempts(held)
    sent = []
    for run in waiting:
        if (run.pk, run.attempt) in present:
            continue
        if Run.objects.filter(pk=run.pk, attempt=run.attempt, status=RunStatus.QUEUED).update(queued_at=now):
            log_line(run, "its queue message was lost (Redis restarted?); queued again", level=LogLevel.WARNING)
            celery_app.send_task(TRAIN_TASK, args=[run.pk, run.attempt], queue=queue_of(run))
            sent.append(run)
    return sent


# ---- runs trained elsewhere, logged through the API (like a tracking server) ----------------


@transaction.atomic
def run_create_external(*, project: Project, name: str, config: dict[str, Any] | None,
                        user: AbstractBaseUser | None, tags: str | list[str] = "") -> Run:
    """A running run that a process outside Temper reports into (``metrics_log``, ``samples_log``,
    ``run_finish_external``); ``config`` is whatever describes it (shown and diffed like a spec). A
    blank ``name`` is "external run"; a longer one than ``RUN_NAME_MAX`` is refused, as at a launch."""
    name = _checked_name(name or "", required=False) or "external run"
    checked_json(config, field="config", finite=True)
    project_lock(project=project, doing="as the run was being opened")
    public_id = new_run_id()
    now = timezone.now()
    run = Run.objects.create(
        public_id=public_id, project=project, name=name, task=EXTERNAL_TASK,
        spec=config or {}, resolved_spec={"output_dir": str(run_output_dir(public_id))}, status=RunStatus.RUNNING,
        started_at=now, last_heartbeat=now, worker_name="external", created_by=user,
    )
    run_tags_write(run=run, tags=parse_tags(tags))
    log_line(run, f"external run opened by {user.get_username() if user else 'the system'}")
    activity_record(project=project, actor=user, verb=Verb.RUN_LAUNCHED, target=run, details={"external": True})
    return run


def _require_external(run: Run) -> None:
    if run.task != EXTERNAL_TASK:
        raise ValidationError({"__all__": f"run {run.public_id} is trained by Temper; only external runs take logged data"})
    if run.status != RunStatus.RUNNING:
        raise ValidationError({"__all__": f"run {run.public_id} {run.status_phrase}; it takes no more data"})


@dataclass(frozen=True)
class MetricsLogged:
    """What ``metrics_log`` did with a batch: the values stored, and each value left out with why
    (the first ``SKIPPED_LISTED`` of them; ``skipped`` counts them all)."""

    stored: int
    skipped: int
    skipped_values: list[dict[str, Any]]


SKIPPED_LISTED = 20
NOT_FINITE = "NaN or infinity: not stored (a chart cannot draw it); log a finite value or leave the metric out"
ALREADY_LOGGED = "already logged at this step: the first value is kept"


@transaction.atomic
def metrics_log(*, run: Run, points: list[dict[str, Any]]) -> MetricsLogged:
    """Store logged points ``[{"step": 3, "metrics": {"loss": 1.2}, "tokens": 1536, "wall_time": ...}]``
    of an external run; a (metric, step) logged twice keeps its first value, and a NaN or infinite
    value is left out. The caller is told of each value left out, so nothing vanishes unannounced."""
    from webapp.runs.models import MetricPoint
    from webapp.runs.reporting import metric_values, publish_event, track_metric, track_not_finite

    _require_external(run)
    for index, point in enumerate(points):
        for name in point["metrics"]:
            _check_metric_name(name, field=f"points.{index}.metrics")
    run = Run.objects.select_for_update(of=("self",)).get(pk=run.pk)
    now = timezone.now().timestamp()
    rows, payload, skipped = [], [], []
    summary, not_finite_latest = dict(run.final_metrics or {}), dict(run.not_finite_metrics or {})
    # Points already stored (or twice in this batch) are skipped, so the summary counts each once.
    seen = set(MetricPoint.objects.filter(run=run, step__in={point["step"] for point in points})
               .values_list("name", "step"))
    for point in points:
        step, tokens = point["step"], int(point.get("tokens") or 0)
        wall_time = float(now if point.get("wall_time") is None else point["wall_time"])  # 0 is a time, not "now"
        not_finite: list[tuple[str, float]] = []
        for name, value in metric_values(point["metrics"], not_finite=not_finite):
            if (name, step) in seen:
                skipped.append({"step": step, "name": name, "why": ALREADY_LOGGED})
                continue
            seen.add((name, step))
            rows.append(MetricPoint(run=run, step=step, name=name, value=value, wall_time=wall_time, tokens=tokens))
            payload.append({"step": step, "name": name, "value": value, "tokens": tokens, "wall_time": wall_time})
            track_metric(summary, name, value, step)
        for name, value in not_finite:
            skipped.append({"step": step, "name": name, "why": NOT_FINITE})
            track_not_finite(not_finite_latest, name, value, step)
    MetricPoint.objects.bulk_create(rows, ignore_conflicts=True, batch_size=2000)
    if points:
        run.current_step = max(run.current_step, max(point["step"] for point in points))
        run.tokens_seen = max([run.tokens_seen] + [int(point.get("tokens") or 0) for point in points])
    run.final_metrics, run.not_finite_metrics = summary, not_finite_latest
    run.last_heartbeat = timezone.now()
    if run.started_at:
        run.train_seconds = (run.last_heartbeat - run.started_at).total_seconds()
    run.save(update_fields=["current_step", "tokens_seen", "final_metrics", "not_finite_metrics", "last_heartbeat",
                            "train_seconds"])
    metric_names_note(project_id=run.project_id, names={row.name for row in rows})
    public_id = run.public_id
    if payload:
        transaction.on_commit(lambda: publish_event(public_id, {"type": "metrics", "points": payload}))
    return MetricsLogged(stored=len(rows), skipped=len(skipped), skipped_values=skipped[:SKIPPED_LISTED])


METRIC_NAME_MAX = 100  # MetricPoint.name's max_length


def _check_metric_name(name: str, *, field: str) -> None:
    shown = name if len(name) <= 40 else name[:40] + "…"
    if not name.strip():  # one of spaces only was charted under a blank title, with no word of which metric
        raise ValidationError({field: "a metric name is empty (or only spaces); name each metric, e.g. 'loss'"})
    try:
        checked_text(name, field=field, max_length=METRIC_NAME_MAX)
    except ValidationError as error:
        raise ValidationError({field: f"metric name {shown!r}: {error.message_dict[field][0]}"}) from None


@transaction.atomic
def samples_log(*, run: Run, samples: list[dict[str, Any]]) -> int:
    """Store generations ``[{"step", "prompt", "text", "answer"?, "rewards"?}]`` of an external run,
    numbered in order within each step after those already stored."""
    from django.db.models import Max

    from webapp.runs.models import Sample
    from webapp.runs.reporting import sample_row

    _require_external(run)
    for index, record in enumerate(samples):
        checked_json(record, field=f"samples.{index}")
    next_position: dict[int, int] = {}
    rows = []
    for record in samples:
        step = record["step"]
        if step not in next_position:
            highest = Sample.objects.filter(run=run, step=step).aggregate(highest=Max("position"))["highest"]
            next_position[step] = 0 if highest is None else highest + 1
        rows.append(sample_row(run, step, next_position[step], record))
        next_position[step] += 1
    Sample.objects.bulk_create(rows)
    return len(rows)


def series_caches_renew(*, runs: list[Run]) -> None:
    """Cache again the series of those finished ``runs`` whose cache was written in an older bucket layout
    (``selectors.series_cache_current``), from their points: read from that cache, a tokens or time x-axis
    drew each bucket's extremes at its smallest tokens and time, so once per run instead of each read."""
    from webapp.runs.selectors import finished_runs_with_old_series_cache, series_cache_current, series_cache_for

    for run in finished_runs_with_old_series_cache(runs=runs):
        with transaction.atomic():
            locked = Run.objects.select_for_update(of=("self",)).filter(pk=run.pk).first()
            if locked is None:  # deleted meanwhile
                continue
            if locked.is_finished and not series_cache_current(run=locked):
                locked.series_cache = series_cache_for(locked)
                locked.save(update_fields=["series_cache"])
            run.series_cache = locked.series_cache


@transaction.atomic
def run_finish_external(*, run: Run, status: str, message: str = "") -> Run:
    """Close an external run as succeeded, failed or cancelled."""
    from webapp.runs.reporting import metric_summary
    from webapp.runs.selectors import series_cache_for

    _require_external(run)
    checked_text(message, field="message")
    if status not in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED):
        raise ValidationError({"status": f"{status!r} is not one of succeeded, failed, cancelled"})
    run.status, run.error_message, run.finished_at = status, message, timezone.now()
    before = Run.objects.filter(pk=run.pk).values_list("final_metrics", flat=True).get() or {}
    run.final_metrics = metric_summary(run)
    run.series_cache = series_cache_for(run)
    run.save(update_fields=["status", "error_message", "finished_at", "final_metrics", "series_cache"])
    metric_names_rewritten(run=run, before=before)
    log_line(run, f"external run closed: {status}" + (f" ({message})" if message else ""))
    publish_status(run)
    return run
