"""Pipelines: a sequence of stages (e.g. QLoRA SFT → DPO → GRPO → quantized export) launched once,
each training stage a run that starts from the previous stage's exported model.

Design note: a pipeline is advanced by the end of its current stage's run, wherever that happens
(the train worker after ``run_finish``/``run_fail``, the web when a queued stage is cancelled):
``pipeline_advance(run=...)`` locks the pipeline row and acts only if the run is its current stage,
so calling it twice, or for a run of no pipeline, changes nothing. A stage may carry a regression
guard: an eval metric that must not fall more than ``max_drop_percent`` below the previous stage's
(``higher_is_better: false`` for losses: must not rise more). The two values must measure the same thing, so a
guard between stages of different tasks, or of settings that change what the metric measures (the loss's variant
and scale: ``dpo.loss``/``beta``, ``grpo.loss_type``/``advantage``, ppo's coefficients; the reward functions'
weights and args), or on an ``eval/`` metric between stages of different ``data.eval``, is refused up front
(``_guard_problems``, naming the keys that differ). A stage that fails its guard stops
the pipeline; its result stays the previous stage's model, and the reason is kept in ``message``. A
guard whose metric the previous stage did not log (a misspelt name) stops the pipeline before its
stage is launched, with the closest logged name. A metric whose latest logged value was NaN or
infinite (not stored: ``Run.not_finite_metrics`` records it) fails the guard, naming the value and
step, rather than comparing the older finite value ``final_metrics`` keeps.

The last stage may instead be an export (``export: {quantize: int8|int4}``): the train queue's
``worker.tasks.train.export_stage`` writes the result run's serving copy ``export/quantized/``
(``jaxengine.quantize.quantize_run_export``, as ``jaxengine export --quantize`` does) with its
memory, perplexity and agreement figures in ``quantization.json``, which the pipeline page shows
(``export_result``). That run then gets no automatic serving copy (``exports_after``): the stage
writes the copy the chat serves, in the scheme it names. A failed export fails the pipeline; its
result stays the run, whose merged export still serves.

A stage's run resumed by a person is followed, not left behind: the pipeline it ended (failed, cancelled, stopped
by its guard; not one a person cancelled, see below) runs again and moves on when the run ends (``pipeline_follow_resume``), and an export stage that
finds its run resumed waits for it instead of quantizing a model about to be replaced (``export_stage_start``).
Only the pipeline's result is not resumed (``result_refusal``): the pipeline, its later stages and its
serving copy stand for that model; nor, while the pipeline runs, a reward run one of its later stages is to score
with (``counted_on_refusal``): the stage is launched from that run's export as it is then. Rows are locked run first, pipeline second, wherever both are.

A person may cancel a running pipeline (``pipeline_cancel``): its current stage's run is cancelled, an export
stage not yet taken by a worker is dropped (``export_stage_start`` finds the pipeline ended), and one writing its
serving copy (``export_started_at``) is waited for. Such a pipeline records who cancelled it (``cancelled_by``)
and is not taken on again by a resume of its stage's run, which then trains alone.
"""
from __future__ import annotations

import copy
import difflib
import logging
import typing
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, FiniteFloat, StringConstraints, model_validator

from jaxengine.spec import DataSpec, DpoSpec, GrpoSpec, PpoSpec, RewardSpec, out_of_range, wrongly_written_value
from jaxengine.words import counted
from webapp.activity.models import Verb
from webapp.activity.services import activity_record
from webapp.celery import app as celery_app
from webapp.core.bidi import isolated
from webapp.core.text import checked_json, checked_name
from webapp.projects.models import Project
from webapp.projects.services import project_lock
from webapp.runs import services
from webapp.runs.models import Pipeline, PipelineStatus, Run, RunStatus
from webapp.runs.selectors import last_value, latest_not_finite, serving_copy_figures
from webapp.runs.serving_copies import export_summary
from webapp.webhooks import services as webhooks
from webapp.workers.deliveries import LostWorker

logger = logging.getLogger(__name__)

PREVIOUS = "previous"
MAX_STAGES = 10
EXPORT_STAGE_TASK = "worker.tasks.train.export_stage"
EXPORT_STAGE_QUEUE = "train"


def _visible_name(name: str) -> str:
    """A name the stages' run names are made of holds no invisible character, as a run's name may not
    (``core.text.checked_name``): a stage named with U+202E RIGHT-TO-LEFT OVERRIDE was accepted, and its run
    could not start once the stages before it had trained."""
    try:
        return checked_name(name, field="name")
    except ValidationError as error:
        raise ValueError(error.messages[0]) from None


# Names are stripped; one of spaces only was taken and shown as a blank heading.
Name60 = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=60),
                   AfterValidator(_visible_name)]
Name120 = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=120),
                    AfterValidator(_visible_name)]


class Guard(BaseModel):
    """A stage's regression guard against the previous stage."""

    # strict, as the run spec's sections: "5" in quotes is refused, not read as 5
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    metric: str = Field(min_length=1, description="A logged metric, e.g. eval/exact_match or eval/loss, that this "
                                                 "stage and the previous one measure alike: the same task and settings "
                                                 "behind it (dpo.loss and beta, grpo.loss_type, reward functions' "
                                                 "weights and args, ...), and for an eval/ metric the same "
                                                 "data.eval.")
    # finite: stored as JSON, which has no infinity (Infinity was a 500 at the INSERT)
    max_drop_percent: FiniteFloat = Field(ge=0, description="How far (in %) it may get worse than the previous "
                                                            "stage's.")
    higher_is_better: bool = Field(default=True, description="false for losses: worse means higher.")


class Export(BaseModel):
    """An export stage: the previous stage's model quantized into its serving copy."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    quantize: Literal["int8", "int4"] = Field(description="int8 (per channel) or int4 (groups of group_size).")
    group_size: int | None = Field(default=None, ge=2, description="Weights per scale; int4 defaults to 64.")

    @model_validator(mode="after")
    def _even_groups(self) -> Export:
        # As jaxengine.quantize.QuantScheme requires (it imports jax): an odd size failed the export stage
        # after every training stage had run.
        if self.group_size is not None and self.group_size % 2:
            raise ValueError(f"group_size: {self.group_size} must be an even number (e.g. 32, 64, 128)")
        return self


class Stage(BaseModel):
    """A training stage (``spec``) or, last, an export stage (``export``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Name60 = Field(description="The stage's name (its run is named after it).")
    spec: dict[str, Any] | None = None
    export: Export | None = None
    guard: Guard | None = None

    @model_validator(mode="after")
    def _spec_or_export(self) -> Stage:
        if (self.spec is None) == (self.export is None):
            raise ValueError("give a stage either a spec (a training run) or an export (e.g. {quantize: int4})")
        if self.export is not None and self.guard is not None:
            raise ValueError("an export stage trains nothing, so it has no guard; remove it")
        return self


class PipelineDocument(BaseModel):
    """What a person writes: the pipeline's name and its stages."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Name120 = Field(description="The pipeline's name.")
    stages: list[Stage] = Field(min_length=1, max_length=MAX_STAGES)


def parse_document(data: Any) -> PipelineDocument:
    """Validate a pipeline document; errors name the stage and key (``stages.1.guard.metric``)."""
    import pydantic

    if not isinstance(data, dict):
        raise ValidationError("the document must be a mapping with a name and its stages")
    checked_json(data, field="")
    try:
        return PipelineDocument.model_validate(data)
    except pydantic.ValidationError as error:
        errors: dict[str, list[str]] = {}
        for problem in error.errors(include_url=False):
            errors.setdefault(".".join(str(part) for part in problem["loc"]) or "__all__", []).append(
                _problem_in_words(problem))
        raise ValidationError(errors) from None


# The part of a document whose keys an error lists, by the key that holds it.
_PARTS = {"stages": Stage, "guard": Guard, "export": Export}


def _problem_in_words(problem: dict[str, Any]) -> str:
    """A pydantic error of a document as a run spec's read ('required key is missing', 'unknown key;
    allowed keys here: ...', "'int3' is not one of int8, int4"), not pydantic's own words."""
    kind, message, loc = problem["type"], problem["msg"], problem["loc"]
    holders = [part for part in loc[:-1] if isinstance(part, str)]
    part = _PARTS.get(holders[-1]) if holders else PipelineDocument
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        return "unknown key" + (f"; allowed keys here: {', '.join(part.model_fields)}" if part else "")
    if kind == "literal_error" and part is not None and loc[-1] in part.model_fields:
        allowed = typing.get_args(part.model_fields[loc[-1]].annotation)
        return f"{problem['input']!r} is not one of {', '.join(map(str, allowed))}"
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    if wrong := wrongly_written_value(kind, problem["input"]):
        return wrong
    field = part.model_fields.get(loc[-1]) if part is not None and loc and isinstance(loc[-1], str) else None
    if words := out_of_range(kind, context=problem.get("ctx", {}), field=field):
        return f"{problem['input']!r} {words}"
    if loc == ("stages",) and kind == "too_short":
        return "a pipeline has at least one stage: add a training stage (name and spec)"
    if loc == ("stages",) and kind == "too_long":
        return f"a pipeline has at most {MAX_STAGES} stages; it has {problem['ctx']['actual_length']}: split it in two"
    return f"{problem['input']!r}: {message[0].lower()}{message[1:]}"


def _check_stages(project: Project, document: PipelineDocument) -> None:
    """Every stage's spec must be a valid run spec of the project (later stages' models excepted:
    they are the previous stage's export, unknown until it has run)."""
    errors: dict[str, list[str]] = {}
    for index, stage in enumerate(document.stages):
        if stage.export is not None and (index == 0 or index != len(document.stages) - 1):
            errors[f"stages.{index}.export"] = ["an export stage comes last, after a training stage whose model it "
                                                "quantizes"]
    if errors:
        raise ValidationError(errors)
    first_model = document.stages[0].spec.get("model")
    if first_model in (None, PREVIOUS):
        errors["stages.0.spec.model"] = ["the first stage starts from a base model (bm_…) or a run's export (run_…)"]
    if document.stages[0].guard is not None:
        errors["stages.0.guard"] = ["the first stage has no previous stage to guard against; remove its guard"]
    for index, stage in enumerate(document.stages):
        if problems := _guard_problems(document.stages, index):
            errors.setdefault(f"stages.{index}.guard.metric", []).extend(problems)
    for index, stage in enumerate(document.stages):
        if stage.export is not None:
            continue
        spec = dict(stage.spec)
        if index > 0:
            if spec.get("model", PREVIOUS) != PREVIOUS:
                errors.setdefault(f"stages.{index}.spec.model", []).append(
                    f"stage {index + 1} starts from the previous stage's model; leave model out (or write '{PREVIOUS}')")
            spec["model"] = first_model  # a stand-in with a known architecture, to check the rest
        try:
            services.plan_run(project=project, spec=spec, output_dir=services.run_output_dir("pipeline-check"))
        except ValidationError as error:
            for key, messages in error.message_dict.items():
                if (index > 0 and key == "model" and stage.spec.get("model", PREVIOUS) == PREVIOUS
                        and "stages.0.spec.model" in errors):
                    continue  # the stand-in's problem, named once at the first stage, which gives it
                errors.setdefault(f"stages.{index}.spec.{key}", []).extend(messages)
    if errors:
        raise ValidationError(errors)


def _guard_problems(stages: list[Stage], index: int) -> list[str]:
    """Why stage ``index``'s guard could never pass or would tell nothing, if it is so. The guard compares this
    stage's final value of its metric with the stage before's, so both must log it and measure it alike: an
    ``eval/`` metric is logged only by a run with evaluation data, and is measured on that data, so both stages
    need the same ``data.eval`` (a stage's spec inherits nothing from the stage before); a loss, and the metrics
    logged beside it, mean something else under another task (a DPO preference loss near 0.69 against an SFT token
    loss near 9.8 always "improved"), or under other settings of the same task (``_metric_settings``)."""
    guard = stages[index].guard
    if guard is None or index == 0:
        return []
    labels = {position: f"stage {position + 1} ({isolated(stages[position].name)})" for position in (index - 1, index)}
    specs = {position: stages[position].spec or {} for position in (index - 1, index)}
    problems = []
    tasks = {position: spec.get("task") for position, spec in specs.items()}
    if all(isinstance(task, str) for task in tasks.values()) and tasks[index - 1] != tasks[index]:
        problems.append(
            f"{labels[index]} runs task {tasks[index]} and {labels[index - 1]} task {tasks[index - 1]}, so their "
            f"{guard.metric} do not measure the same thing: each task logs its own loss and metrics (a dpo loss near "
            "0.69 against an sft loss near 9.8 passes every time); guard a stage against one of the same task, or "
            "remove the guard")
    elif differing := _differing_settings(tasks[index], guard.metric, specs[index - 1], specs[index]):
        problems.append(
            f"{labels[index]} and {labels[index - 1]} differ in "
            f"{'; '.join(_difference_in_words(*difference) for difference in differing)}, so their {guard.metric} do "
            f"not measure the same thing: {guard.metric} is computed under these settings; give both stages the same "
            f"{', '.join(key for key, _, _ in differing)}, or remove the guard")
    if not guard.metric.startswith("eval/"):
        return problems
    evaluations = {position: _eval_data(spec) for position, spec in specs.items()}
    without = [labels[position] for position, evaluation in evaluations.items() if evaluation is None]
    if without:
        problems.append(
            f"{guard.metric} is logged only by a run with evaluation data, and {' and '.join(without)} "
            f"{'has' if len(without) == 1 else 'have'} no data.eval, so this guard could never pass; "
            "add data.eval there, or guard another metric")
    elif evaluations[index - 1] != evaluations[index]:
        problems.append(
            f"{guard.metric} is measured on data.eval, which is {evaluations[index]} in {labels[index]} and "
            f"{evaluations[index - 1]} in {labels[index - 1]}: values on different evaluation data do not compare; "
            "give both stages the same data.eval (a stage does not inherit the one before's), or guard another "
            "metric")
    return problems


# Metrics that are the loss itself, whose scale a task's loss settings set (the others are read per task).
_LOSS_METRICS = ("loss", "eval/loss")
# The RL metrics of the total (weighted) reward: its loss settings do not change them.
_TOTAL_REWARD_METRICS = ("reward", "eval/reward", "reward_std", "frac_reward_zero_std")


def _differing_settings(task: Any, metric: str, before: dict[str, Any], now: dict[str, Any]
                        ) -> list[tuple[str, Any, Any]]:
    """The settings that decide what ``metric`` measures and that differ between two stages of ``task`` (the
    previous stage's spec ``before``, this one's ``now``): (key as this stage names it, its value here, the
    previous stage's value). A setting is compared only where both stages' sections validate (an invalid one
    gets its own error) and both have it (reward functions that differ in name are named as one difference)."""
    settings_before, settings_now = _metric_settings(task, metric, before), _metric_settings(task, metric, now)
    return [(key, value, settings_before[setting][1]) for setting, (key, value) in settings_now.items()
            if setting in settings_before and settings_before[setting][1] != value]


def _metric_settings(task: Any, metric: str, spec: dict[str, Any]) -> dict[Any, tuple[str, Any]]:
    """What decides ``metric`` of a run of ``spec`` (a stage's, of ``task``), defaults filled in: by an identity
    compared across stages, (the key that holds it, its value). A metric means something else, and a guard
    comparing it across stages compares different numbers, when: the loss's variant or scale changes (dpo.loss,
    dpo.beta, grpo.loss_type, ppo.vf_coef, ...); a reward is the weighted sum of other functions, or of the same
    ones with other weights or args; a reward function (``eval/<name>``, ``rewards/<name>/mean``) scores by
    other args."""
    if task == "sft" and metric in _LOSS_METRICS:
        data = spec.get("data") if isinstance(spec.get("data"), dict) else {}
        return {"data.loss_on": ("data.loss_on", data.get("loss_on", DataSpec.model_fields["loss_on"].default))}
    if task == "reward" and metric in _LOSS_METRICS and (reward := _section(spec, "reward", RewardSpec)):
        return {"center": ("reward.center_rewards_coefficient", reward.center_rewards_coefficient)}
    if task == "dpo" and (dpo := _section(spec, "dpo", DpoSpec)):
        settings = {"loss": ("dpo.loss", dpo.loss)}
        if not metric.endswith("accuracies"):  # whether the chosen's implicit reward is above: no scale
            settings |= {name: (f"dpo.{name}", getattr(dpo, name)) for name in ("beta", "label_smoothing")}
            if dpo.loss == "simpo":
                settings["simpo_gamma"] = ("dpo.simpo_gamma", dpo.simpo_gamma)
            if dpo.loss == "discopop":
                settings["discopop_tau"] = ("dpo.discopop_tau", dpo.discopop_tau)
        return settings
    if task not in ("grpo", "ppo") or not (section := _section(spec, task, GrpoSpec if task == "grpo" else PpoSpec)):
        return {}
    lists = {term.name: ("rewards", term) for term in section.rewards}
    lists |= {term.name: ("eval_metrics", term) for term in section.eval_metrics}
    for name, (where, term) in lists.items():
        if metric in (f"eval/{name}", f"rewards/{name}/mean", f"rewards/{name}/std") or metric.startswith(
                f"eval/{name}/"):
            return {("args", name): (f"{task}.{where}[{name}].args", term.args)}
    settings: dict[Any, tuple[str, Any]] = {
        "rewards": (f"{task}.rewards", ", ".join(sorted(term.name for term in section.rewards)))}
    for term in section.rewards:
        settings[("weight", term.name)] = (f"{task}.rewards[{term.name}].weight", term.weight)
        settings[("args", term.name)] = (f"{task}.rewards[{term.name}].args", term.args)
    if task == "ppo":
        settings["reward_model"] = ("ppo.reward_model", section.reward_model)
    if metric in _TOTAL_REWARD_METRICS:
        return settings
    # The loss and the metrics logged beside it (kl, clip ratios, entropy, value loss): their advantages come
    # from the rewards above, then these settings shape and weigh the objective.
    loss_keys = (("loss_type", "advantage", "beta", "kl_estimator") if task == "grpo" else
                 ("kl_coef", "vf_coef", "entropy_coef", "value_clip", "gamma", "lam"))
    settings |= {key: (f"{task}.{key}", getattr(section, key)) for key in loss_keys}
    settings |= {"epsilon": (f"{task}.epsilon", section.epsilon),
                 "epsilon_high": (f"{task}.epsilon_high", section.upper_clip)}
    if task == "grpo" and section.loss_type == "dr_grpo":  # its sum is divided by max_new_tokens
        settings["max_new_tokens"] = ("grpo.max_new_tokens", section.max_new_tokens)
    return settings


def _section(spec: dict[str, Any], name: str, model: type[BaseModel]) -> Any:
    """Section ``name`` of ``spec`` with its defaults; None when it does not validate (its own error says so)."""
    import pydantic

    try:
        return model.model_validate(spec.get(name) or {})
    except pydantic.ValidationError:
        return None


def _difference_in_words(key: str, now: Any, before: Any) -> str:
    if key.endswith(".args"):  # free text, not worth repeating: the key is enough
        return key
    return f"{key} ({_value_in_words(now)} against {_value_in_words(before)})"


def _value_in_words(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else "none" if value in (None, "") else str(value)


def _eval_data(spec: dict[str, Any]) -> Any:
    data = spec.get("data")
    return data.get("eval") if isinstance(data, dict) and data.get("eval") not in (None, "") else None


def _stage_spec(pipeline: Pipeline, index: int, model: str | None) -> dict[str, Any]:
    spec = copy.deepcopy(pipeline.stages[index]["spec"])
    if index > 0:
        spec["model"] = model
    return spec


def _stage_run_name(pipeline: Pipeline, index: int) -> str:
    """``<pipeline> · stage <n> (<stage>)``, the pipeline's name cut to fit a run name: both names may be as long
    as their fields allow (120 and 60), and a stage whose run name was too long failed to start after the
    stages before it had trained. The word "stage" keeps the two names apart as drawn: a run name holds no bidi
    isolate (``core.text.checked_name``), and in ``<pipeline> · <n>. <stage>`` a pipeline name ending in
    right-to-left letters took the stage's number and a right-to-left stage name into its right-to-left run
    ("Qwen עברית · 2. שלב" was drawn "Qwen בלש .2 · תירבע")."""
    stage = f" · stage {index + 1} ({pipeline.stages[index]['name']})"
    return pipeline.name[:services.RUN_NAME_MAX - len(stage)].rstrip() + stage


def _launch_stage(pipeline: Pipeline, index: int, *, model: str | None, user: AbstractBaseUser | None) -> Run:
    run = services.run_create(project=pipeline.project, spec=_stage_spec(pipeline, index, model), user=user,
                              name=_stage_run_name(pipeline, index), record=False)
    Run.objects.filter(pk=run.pk).update(pipeline=pipeline, pipeline_stage=index)
    run.pipeline, run.pipeline_stage = pipeline, index
    services.log_line(run, f"stage {index + 1} of {len(pipeline.stages)} of pipeline {pipeline.name}")
    return run


@transaction.atomic
def pipeline_create(*, project: Project, document: Any, user: AbstractBaseUser | None) -> Pipeline:
    """Validate every stage, save the pipeline and launch its first stage."""
    parsed = parse_document(document)
    # Before the pipeline's row, whose foreign key would otherwise wait on a deletion's lock of the project; and
    # before its stages are checked, as run_resume locks it first: a reward run a later stage names, resumed as the
    # stages were checked, was then queued with no export, and that stage failed at its launch. One now waits for
    # the other, and the resume is refused (``counted_on_refusal``) or the stage is.
    project_lock(project=project, doing="as the pipeline was being created")
    _check_stages(project, parsed)
    pipeline = Pipeline.objects.create(
        project=project, name=parsed.name.strip(), created_by=user,
        stages=[stage.model_dump(mode="json", exclude_none=True) for stage in parsed.stages],
    )
    _launch_stage(pipeline, 0, model=None, user=user)
    activity_record(project=project, actor=user, verb=Verb.PIPELINE_LAUNCHED, target=pipeline)
    return pipeline


def _ended_not_finite(metric: str, *runs: Run) -> str | None:
    """Why a guard on ``metric`` cannot pass when one of ``runs`` last logged it as NaN or infinity:
    ``final_metrics`` keeps only finite values, so its "last" would be an older one."""
    for run in runs:
        if ended := latest_not_finite(run=run, name=metric):
            value, step = ended
            return f"{metric} was {value} at step {step} of {run.name} ({run.public_id}): the guard cannot pass"
    return None


def guard_verdict(guard: dict[str, Any], previous: Run, current: Run) -> str | None:
    """None when ``current`` passes ``guard`` against ``previous``; otherwise the reason, in words."""
    metric = guard["metric"]
    if reason := _ended_not_finite(metric, previous, current):
        return reason
    before = last_value(final_metrics=previous.final_metrics, name=metric)
    after = last_value(final_metrics=current.final_metrics, name=metric)
    if before is None or after is None:
        missing = previous if before is None else current
        return f"{metric} was not logged by {missing.name} ({missing.public_id}), so the guard cannot pass"
    worse_by = (before - after) if guard.get("higher_is_better", True) else (after - before)
    percent = 100.0 * worse_by / max(abs(before), 1e-12)
    if percent > guard["max_drop_percent"]:
        direction = "fell" if guard.get("higher_is_better", True) else "rose"
        return (f"{metric} {direction} {percent:.1f}% ({before:.4g} → {after:.4g}), more than the "
                f"{guard['max_drop_percent']:g}% allowed")
    return None


def _guard_never_passes(guard: dict[str, Any] | None, *, previous: Run) -> str | None:
    """Why a stage's ``guard`` could never pass against ``previous``, the stage before it, once that has
    ended: its metric is not among what ``previous`` logged (a misspelt name, or a metric of another
    task), or the last value it logged was NaN or infinity. Known before the stage trains, so its run is
    not spent on a guard that can only fail."""
    if not guard:
        return None
    if reason := _ended_not_finite(guard["metric"], previous):
        return reason
    if guard["metric"] in (previous.final_metrics or {}):
        return None
    logged = sorted(previous.final_metrics or {})
    close = difflib.get_close_matches(guard["metric"], logged, n=1)
    evaluated = [name for name in logged if name.startswith("eval/")]
    hint = (f" (did you mean {close[0]}?)" if close
            else f" (it logged {', '.join(evaluated)})" if evaluated else " (it logged no eval/ metric)")
    return (f"its guard reads {guard['metric']}, which {previous.name} ({previous.public_id}) did not log, so "
            f"the guard could never pass{hint}")


@transaction.atomic
def pipeline_advance(*, run: Run) -> Pipeline | None:
    """Move ``run``'s pipeline on now that the run has ended (see the module notes)."""
    if run.pipeline_id is None:
        return None
    # The run first, as run_resume locks it: a resume at this instant either commits first (the run is queued
    # again, and the pipeline waits for it) or finds the pipeline moved on (and refuses while its export stage runs).
    run = Run.objects.select_for_update(of=("self",)).get(pk=run.pk)
    pipeline = (Pipeline.objects.select_for_update(of=("self",)).select_related("project", "result_run")
                .get(pk=run.pipeline_id))
    # An ended pipeline is taken on again only by a resume of its stage (pipeline_follow_resume).
    if run.pipeline_stage != pipeline.current_stage or pipeline.status != PipelineStatus.RUNNING:
        return pipeline
    index, now = pipeline.current_stage, timezone.now()
    label = f"stage {index + 1} ({pipeline.stages[index]['name']})"
    result_note = (f"; the result stays {pipeline.result_run.name} ({pipeline.result_run.public_id})"
                   if pipeline.result_run else "")
    if run.status in (RunStatus.QUEUED, RunStatus.RUNNING):
        return pipeline
    if run.status != RunStatus.SUCCEEDED:
        pipeline.status = PipelineStatus.CANCELLED if run.status == RunStatus.CANCELLED else PipelineStatus.FAILED
        pipeline.message = f"{label} {run.status}: {run.error_message or 'no message'}{result_note}"
        pipeline.finished_at = now
        pipeline.save(update_fields=["status", "message", "finished_at"])
        webhooks.pipeline_ended(pipeline=pipeline)
        return pipeline
    guard = pipeline.stages[index].get("guard")
    if guard and pipeline.result_run is not None:
        reason = guard_verdict(guard, pipeline.result_run, run)
        if reason is not None:
            pipeline.status, pipeline.finished_at = PipelineStatus.STOPPED, now
            pipeline.message = f"{label} failed its guard: {reason}{result_note}"
            pipeline.save(update_fields=["status", "message", "finished_at"])
            webhooks.pipeline_ended(pipeline=pipeline)
            services.log_line(run, pipeline.message, level="warning")
            return pipeline
    pipeline.result_run = run
    pipeline.status = PipelineStatus.RUNNING
    if index + 1 == len(pipeline.stages):
        pipeline.status, pipeline.finished_at = PipelineStatus.SUCCEEDED, now
        pipeline.message = _all_stages_succeeded(pipeline)
        pipeline.save(update_fields=["result_run", "status", "finished_at", "message"])
        webhooks.pipeline_ended(pipeline=pipeline)
        return pipeline
    pipeline.current_stage = index + 1
    pipeline.message = ""
    if "export" in pipeline.stages[index + 1]:
        export = pipeline.stages[index + 1]["export"]
        pipeline.message = f"stage {index + 2} ({pipeline.stages[index + 1]['name']}): quantizing {run.name} to {export['quantize']}"
        pipeline.save(update_fields=["result_run", "status", "current_stage", "message"])
        services.log_line(run, f"{pipeline.message} (pipeline {pipeline.name})")
        pipeline_pk, stage = pipeline.pk, index + 1
        transaction.on_commit(lambda: celery_app.send_task(EXPORT_STAGE_TASK, args=[pipeline_pk, stage],
                                                                  queue=EXPORT_STAGE_QUEUE))
        return pipeline
    if reason := _guard_never_passes(pipeline.stages[index + 1].get("guard"), previous=run):
        pipeline.status, pipeline.finished_at = PipelineStatus.STOPPED, now
        pipeline.message = (f"stage {index + 2} ({pipeline.stages[index + 1]['name']}) was not started: {reason}; "
                            f"the result stays {run.name} ({run.public_id})")
        pipeline.save(update_fields=["result_run", "status", "current_stage", "message", "finished_at"])
        webhooks.pipeline_ended(pipeline=pipeline)
        services.log_line(run, pipeline.message, level="warning")
        return pipeline
    pipeline.save(update_fields=["result_run", "status", "current_stage", "message"])
    try:
        with transaction.atomic():
            _launch_stage(pipeline, index + 1, model=run.public_id, user=pipeline.created_by)
    except ValidationError as error:
        pipeline.status, pipeline.finished_at = PipelineStatus.FAILED, now
        pipeline.message = (f"stage {index + 2} could not start: {'; '.join(error.messages)}; "
                            f"the result stays {run.name} ({run.public_id})")
        pipeline.save(update_fields=["status", "finished_at", "message"])
        webhooks.pipeline_ended(pipeline=pipeline)
    return pipeline


class _MovedOn(Exception):
    """The pipeline moved to another stage between finding its stage's run and locking it."""


def _stage_run_pk(pipeline: Pipeline) -> int | None:
    """The run whose end moves the pipeline on: its current stage's, or at an export stage the run it quantizes."""
    if "export" in pipeline.stages[pipeline.current_stage]:
        return pipeline.result_run_id
    return (Run.objects.filter(pipeline=pipeline, pipeline_stage=pipeline.current_stage)
            .order_by("-created_at").values_list("pk", flat=True).first())


def pipeline_cancel(*, pipeline: Pipeline, user: AbstractBaseUser | None) -> Pipeline:
    """Cancel a running pipeline: its current stage's run is cancelled (``services.run_cancel``: at once when
    queued, after its current step when running), an export stage not yet taken by a worker is dropped, and the
    pipeline ends cancelled, naming who cancelled it. Refused once the pipeline has ended, and while its export
    stage writes the serving copy (stopping it midway would leave half a copy).

    Rows are locked run first, pipeline second, as ``pipeline_advance`` locks them: the stage's run is found, locked,
    and the pipeline locked and read again; if it moved on meanwhile (the run ended and the next stage started),
    the transaction is rolled back and the lookup done again."""
    for _attempt in range(3):
        try:
            return _pipeline_cancel_once(pipeline_pk=pipeline.pk, user=user)
        except _MovedOn:
            continue
    raise ValidationError({"__all__": f"pipeline {isolated(pipeline.name)} ({pipeline.public_id}) kept moving on to "
                                      "its next stage as it was being cancelled; try again"})


@transaction.atomic
def _pipeline_cancel_once(*, pipeline_pk: int, user: AbstractBaseUser | None) -> Pipeline:
    seen = Pipeline.objects.get(pk=pipeline_pk)
    run_pk = _stage_run_pk(seen) if seen.status == PipelineStatus.RUNNING else None
    run = Run.objects.select_for_update(of=("self",)).filter(pk=run_pk).first() if run_pk else None
    pipeline = (Pipeline.objects.select_for_update(of=("self",)).select_related("result_run")
                .get(pk=pipeline_pk))
    if pipeline.status != PipelineStatus.RUNNING:
        raise ValidationError({"__all__": f"pipeline {isolated(pipeline.name)} ({pipeline.public_id}) has already "
                                          f"ended ({pipeline.get_status_display().lower()}); only a running pipeline "
                                          "can be cancelled"})
    if (pipeline.current_stage, pipeline.result_run_id) != (seen.current_stage, seen.result_run_id):
        raise _MovedOn
    index = pipeline.current_stage
    label = f"stage {index + 1} ({isolated(pipeline.stages[index]['name'])})"
    exporting = "export" in pipeline.stages[index]
    if exporting and pipeline.export_started_at is not None:
        raise ValidationError({"__all__": (
            f"pipeline {isolated(pipeline.name)} ({pipeline.public_id}) cannot be cancelled now: {label} is writing "
            f"the serving copy of its model, which cannot be stopped midway; wait for it to end (its page shows when)")})
    who = user.get_username() if user else "the system"
    stopping = run is not None and not exporting and run.status in (RunStatus.QUEUED, RunStatus.RUNNING)
    result_note = (f"; the result stays {isolated(pipeline.result_run.name)} ({pipeline.result_run.public_id})"
                   if pipeline.result_run else "")
    pipeline.status, pipeline.finished_at, pipeline.cancelled_by = PipelineStatus.CANCELLED, timezone.now(), who
    pipeline.message = (f"cancelled by {who} at {label}"
                        + ("; its export was not started" if exporting else "")
                        + (f"; its run {isolated(run.name)} ({run.public_id}) "
                           + ("was taken out of the queue" if run.status == RunStatus.QUEUED
                              else "was asked to stop after its current step")
                           if stopping else "")
                        + result_note)
    # Saved before the run is cancelled: pipeline_advance, which run_cancel calls for a queued run, then finds
    # the pipeline ended and leaves this message.
    pipeline.save(update_fields=["status", "finished_at", "cancelled_by", "message"])
    webhooks.pipeline_ended(pipeline=pipeline)
    activity_record(project=pipeline.project, actor=user, verb=Verb.PIPELINE_CANCELLED, target=pipeline)
    if stopping:
        services.run_cancel(run=run, user=user)
        services.log_line(run, f"pipeline {isolated(pipeline.name)} cancelled by {who}")
    logger.info("pipeline %s: %s", pipeline.public_id, pipeline.message)
    return pipeline


def exports_after(run: Run) -> bool:
    """Whether ``run`` is a pipeline stage followed by an export stage (which writes its serving copy)."""
    if run.pipeline_id is None or run.pipeline_stage is None:
        return False
    stages = Pipeline.objects.filter(pk=run.pipeline_id).values_list("stages", flat=True).first() or []
    return run.pipeline_stage + 1 < len(stages) and "export" in stages[run.pipeline_stage + 1]


@transaction.atomic
def export_stage_start(*, pipeline_pk: int, stage: int) -> tuple[Run, dict[str, Any]] | None:
    """The run to quantize and the export settings of stage ``stage``; None when the pipeline is
    not (or no longer) at that stage, e.g. a message delivered twice after the stage ended.

    The run is locked and read again first, as ``run_resume`` and ``pipeline_advance`` lock it: once this
    returns, a resume is refused until the stage ends (``services._refuse_while_files_written``). A run found
    resumed all the same (it was resumed as the pipeline moved on) is not quantized: the pipeline goes back to
    its stage and follows it, as it follows any resumed stage, and exports once it succeeds again."""
    run = _lock_result_run(pipeline_pk)
    pipeline = Pipeline.objects.select_for_update(of=("self",)).filter(pk=pipeline_pk).first()
    if (pipeline is None or pipeline.status != PipelineStatus.RUNNING or pipeline.current_stage != stage
            or run is None or pipeline.result_run_id != run.pk or "export" not in pipeline.stages[stage]):
        logger.info("pipeline %s: export stage %s is not current; message dropped", pipeline_pk, stage)
        return None
    if run.status != RunStatus.SUCCEEDED:
        _follow_resumed_result(pipeline, run)
        return None
    # From here the copy is being written: pipeline_cancel asks to wait rather than leave half a copy.
    pipeline.export_started_at = timezone.now()
    pipeline.save(update_fields=["export_started_at"])
    return run, pipeline.stages[stage]["export"]


def _lock_result_run(pipeline_pk: int) -> Run | None:
    """Lock the run the pipeline's export stage quantizes before the pipeline itself: rows are locked run first,
    pipeline second everywhere (``run_resume``, ``run_cancel``, ``pipeline_advance``), so no two wait on each other."""
    result_run_pk = Pipeline.objects.filter(pk=pipeline_pk).values_list("result_run", flat=True).first()
    return Run.objects.select_for_update(of=("self",)).filter(pk=result_run_pk).first() if result_run_pk else None


def _follow_resumed_result(pipeline: Pipeline, run: Run) -> None:
    """Put ``pipeline`` back at ``run``'s stage, its result the stage before's run again, since ``run`` was resumed
    before the export stage after it began; once ``run`` ends, ``pipeline_advance`` judges its guard again and sends
    the export. Both rows are locked."""
    index = run.pipeline_stage
    previous = (Run.objects.filter(pipeline=pipeline, pipeline_stage=index - 1, status=RunStatus.SUCCEEDED)
                .order_by("-created_at").first() if index else None)
    export_label = f"stage {pipeline.current_stage + 1} ({pipeline.stages[pipeline.current_stage]['name']})"
    pipeline.current_stage, pipeline.result_run = index, previous
    pipeline.message = (f"{export_label} waits: {isolated(run.name)} ({run.public_id}) was resumed as it began; the "
                        "pipeline goes on once it ends")
    pipeline.save(update_fields=["current_stage", "result_run", "message"])
    services.log_line(run, f"{pipeline.message} (pipeline {isolated(pipeline.name)})", level="warning")
    logger.warning("pipeline %s: %s", pipeline.public_id, pipeline.message)
    if run.status not in (RunStatus.QUEUED, RunStatus.RUNNING):  # it ended again before the message was taken
        pipeline_advance(run=run)


def result_refusal(run: Run) -> str:
    """Why ``run`` is not resumed while it is a pipeline's result (the last stage that succeeded and passed its
    guard), or "": the pipeline stands for its final model as trained, which the resumed engine replaces at its end
    (and with it the serving copy an export stage quantized, which nothing writes again). Training on from it is
    a new run that starts from its model."""
    pipeline = Pipeline.objects.filter(result_run=run).order_by("created_at").first()
    if pipeline is None:
        return ""
    quantized = (pipeline.status == PipelineStatus.SUCCEEDED and bool(pipeline.stages)
                 and "export" in pipeline.stages[-1])
    return (f"run {run.public_id} cannot be resumed: it is the result of pipeline {isolated(pipeline.name)} "
            f"({pipeline.public_id}), which stands for its final model as trained"
            + (", quantized by its export stage into the serving copy a resume would delete" if quantized else "")
            + f"; a resume would replace that model with other weights at its end. Train on from it as a new run "
            f"instead: launch one with model {run.public_id}")


def stages_counting_on(run: Run) -> list[tuple[Pipeline, int]]:
    """(pipeline, stage index) for each stage of a running pipeline that names ``run`` as its reward model
    (``services.reward_run_ids``) and is not launched yet: it is launched once the stages before it end, from the
    reward run's export as it is then, and fails at its launch if the run has none (resumed, it has none until it
    ends). A stage already launched is a run, which ``services.final_model_dependants`` finds; a later stage's
    starting model is always the stage before's, so only reward models are named ahead."""
    if run.task != "reward":
        return []
    running = Pipeline.objects.filter(project=run.project_id, status=PipelineStatus.RUNNING).order_by("created_at")
    return [(pipeline, index) for pipeline in running
            for index in range(pipeline.current_stage + 1, len(pipeline.stages))
            if run.public_id in services.reward_run_ids(pipeline.stages[index].get("spec") or {})]


def counted_on_refusal(run: Run) -> str:
    """Why ``run`` is not resumed while a running pipeline's later stage is to score with its model
    (``stages_counting_on``), naming each pipeline and stage, or ""."""
    waiting = stages_counting_on(run)
    if not waiting:
        return ""
    shown = "; ".join(f"pipeline {isolated(pipeline.name)} ({pipeline.public_id}), its stage {index + 1} "
                      f"({isolated(pipeline.stages[index]['name'])})" for pipeline, index in waiting)
    return (f"run {run.public_id} cannot be resumed while a running pipeline is to score with its reward model: "
            f"{shown}. That stage starts once the stages before it end, from this run's exported model, which a "
            "resumed run has none of until it ends (the stage would fail at its launch) and then replaces with "
            "other weights. Resume it once the pipeline has ended, or cancel the pipeline first")


def pipeline_follow_resume(*, run: Run, user: AbstractBaseUser | None) -> Pipeline | None:
    """Take ``run``'s ended pipeline on again when ``run``, its current stage, is resumed (it failed, was
    cancelled, or failed its guard): the pipeline is running again and moves on when the run ends, as if the stage
    had not ended. A pipeline a person cancelled (``cancelled_by``) stays cancelled: the run alone is resumed, and
    its log says so. Called by ``run_resume`` with the run's row locked; the pipeline's is locked here."""
    if run.pipeline_id is None:
        return None
    pipeline = Pipeline.objects.select_for_update(of=("self",)).get(pk=run.pipeline_id)
    if run.pipeline_stage != pipeline.current_stage or pipeline.status not in (
            PipelineStatus.FAILED, PipelineStatus.CANCELLED, PipelineStatus.STOPPED):
        return pipeline
    if pipeline.cancelled_by:
        services.log_line(run, resumed_alone_note(pipeline))
        return pipeline
    label = f"stage {pipeline.current_stage + 1} ({pipeline.stages[pipeline.current_stage]['name']})"
    pipeline.status, pipeline.finished_at = PipelineStatus.RUNNING, None
    pipeline.message = (f"{label} resumed by {user.get_username() if user else 'the system'}: the pipeline goes on "
                        f"once {isolated(run.name)} ({run.public_id}) ends")
    pipeline.save(update_fields=["status", "finished_at", "message"])
    services.log_line(run, f"{pipeline.message} (pipeline {isolated(pipeline.name)})")
    return pipeline


def resumed_alone_note(pipeline: Pipeline) -> str:
    """What a stage's run of a pipeline a person cancelled says (its page, and its log when resumed)."""
    return (f"pipeline {isolated(pipeline.name)} was cancelled by {isolated(pipeline.cancelled_by)} and stays "
            "cancelled: resumed, this run trains alone, and no later stage starts when it ends; launch the pipeline "
            "again to run them")


@transaction.atomic
def export_stage_finish(*, pipeline_pk: int, stage: int, description: dict[str, Any] | None = None,
                        error: BaseException | None = None, failure: str | None = None) -> Pipeline | None:
    """Record the export stage's outcome: the pipeline succeeds with the copy's figures in its
    message, or fails with the error (or the ``failure`` in words; its result stays the run). None
    when the stage had already ended (a message delivered twice, a lost stage failed meanwhile)."""
    _lock_result_run(pipeline_pk)
    pipeline = Pipeline.objects.select_for_update(of=("self",)).select_related("result_run").get(pk=pipeline_pk)
    if pipeline.status != PipelineStatus.RUNNING or pipeline.current_stage != stage:
        return None
    label = f"stage {stage + 1} ({pipeline.stages[stage]['name']})"
    run = pipeline.result_run
    pipeline.finished_at = timezone.now()
    if error is not None or failure is not None:
        pipeline.status = PipelineStatus.FAILED
        reason = failure if failure is not None else f"failed: {type(error).__name__}: {error}"
        from webapp.runs.reporting import in_project_terms  # reporting builds on services, as this module does

        reason = in_project_terms(run, reason)  # the run's eval version by name, not its file's path
        pipeline.message = (f"{label} {reason}; the result stays {run.name} "
                            f"({run.public_id}), its unquantized export")[:4000]
        level = "error"
    else:
        pipeline.status = PipelineStatus.SUCCEEDED
        pipeline.message = f"{_all_stages_succeeded(pipeline)}; {export_summary(description or {})}"
        level = "info"
    pipeline.save(update_fields=["status", "message", "finished_at"])
    webhooks.pipeline_ended(pipeline=pipeline)
    services.log_line(run, pipeline.message, level=level)
    return pipeline


def export_stage_requeued(arguments: tuple, *, lost: LostWorker) -> bool:
    """Say on a pipeline whose export stage's worker was lost that the stage was queued again
    (``workers.deliveries.FIRST_LOSS_NOTES``): its ``message``, which the stage's outcome replaces, and the log of
    the run it quantizes. Whether it was said (not for a stage ended meanwhile)."""
    pipeline_pk, stage = arguments
    pipeline = Pipeline.objects.filter(pk=pipeline_pk).select_related("result_run").first()
    if pipeline is None or stage >= len(pipeline.stages):
        return False
    label = f"stage {stage + 1} ({pipeline.stages[stage]['name']})"
    note = lost.note(doing=f"writing the serving copy of {label}", work="the stage")
    if not Pipeline.objects.filter(pk=pipeline_pk, status=PipelineStatus.RUNNING, current_stage=stage).update(
            message=note):
        return False
    if pipeline.result_run is not None:
        services.log_line(pipeline.result_run, f"{note} (pipeline {isolated(pipeline.name)})", level="warning")
    return True


def pipelines_fail_lost_exports(*, now: datetime | None = None) -> list[Pipeline]:
    """Fail each pipeline whose export stage began over ``TEMPER_RUN_LOST_SECONDS`` ago and whose
    message Redis no longer holds, waiting or delivered (a Redis restart without persistence, a send
    that failed): no worker will ever take it, and the pipeline would otherwise stay running. The
    stage begins when the run it quantizes ends (``pipeline_advance`` sends the message then); a
    worker taking it keeps the message in Redis until the stage is recorded (``acks_late``), so a
    long export is not taken for a lost one. Safe from many reapers at once (the row is locked)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TEMPER_RUN_LOST_SECONDS)
    waiting = [pipeline for pipeline in Pipeline.objects.filter(status=PipelineStatus.RUNNING,
                                                                result_run__finished_at__lt=cutoff)
               .select_related("result_run")
               if pipeline.current_stage < len(pipeline.stages) and "export" in pipeline.stages[pipeline.current_stage]]
    if not waiting:
        return []
    present = services.held_task_messages(task=EXPORT_STAGE_TASK, queues=(EXPORT_STAGE_QUEUE,),
                                          checking="export stages", now=now)
    if present is None:
        return []
    failed = []
    for pipeline in waiting:
        if (pipeline.pk, pipeline.current_stage) in present:
            continue
        silent = int((now - pipeline.result_run.finished_at).total_seconds())
        scheme = pipeline.stages[pipeline.current_stage]["export"]["quantize"]
        failure = (f"lost: Redis no longer holds its export message {silent} s after it was sent (a Redis restart, "
                   f"or a failed send), so no worker will take it; quantize the run with jaxengine export "
                   f"--quantize {scheme}, or launch the pipeline again")
        ended = export_stage_finish(pipeline_pk=pipeline.pk, stage=pipeline.current_stage, failure=failure)
        if ended is not None:
            logger.warning("pipeline %s: %s", pipeline.public_id, ended.message)
            failed.append(ended)
    return failed


def export_result(pipeline: Pipeline) -> dict[str, Any] | None:
    """The figures of the serving copy a succeeded export stage wrote (its ``quantization.json``), or None."""
    if pipeline.result_run is None or not pipeline.stages or "export" not in pipeline.stages[-1]:
        return None
    if pipeline.status != PipelineStatus.SUCCEEDED:
        return None
    figures = serving_copy_figures(pipeline.result_run)
    if figures is None:
        return None
    # In MiB, as its summary line just above says it (Django's filesizeformat counts in 1024s but writes MB).
    mib = 2**20
    figures = {**figures, "size": f"{figures.get('model_bytes', 0) / mib:.1f} MiB "
                                  f"({figures.get('bfloat16_bytes', 0) / mib:.1f} MiB in bfloat16)"}
    if "perplexity_quantized" in figures or "greedy_agreement" in figures:
        return figures
    # The copy is measured on its run's eval data: without it the page would show no quality at all, silently.
    last_training = len(pipeline.stages) - 1  # the export stage's number is the one after it
    data = pipeline.result_run.spec.get("data") if isinstance(pipeline.result_run.spec, dict) else None
    if isinstance(data, dict) and data.get("eval"):
        return figures
    return {**figures, "unmeasured": (
        f"not measured: stage {last_training} ({isolated(pipeline.stages[last_training - 1]['name'])}) has no "
        "evaluation data (data.eval); give it some to see the copy's perplexity and greedy agreement against the "
        "unquantized model")}


def stage_ran(pipeline: Pipeline, index: int) -> bool:
    """Whether stage ``index`` was started, its run perhaps deleted since: a pipeline moves past a stage only
    once its run succeeded, and a succeeded pipeline's last stage ran too."""
    return index < pipeline.current_stage or (index == pipeline.current_stage
                                             and pipeline.status == PipelineStatus.SUCCEEDED)


def result_deleted(pipeline: Pipeline) -> bool:
    """Whether the pipeline had a result whose run was deleted since: the first stage to succeed and pass
    its guard becomes the result, before the pipeline moves on or succeeds."""
    return pipeline.result_run_id is None and (pipeline.current_stage > 0
                                               or pipeline.status == PipelineStatus.SUCCEEDED)


def export_stage_status(pipeline: Pipeline, index: int) -> str:
    """running, succeeded or failed for the export stage the pipeline is at; not started before it."""
    if index != pipeline.current_stage:
        return "not started"
    return {PipelineStatus.RUNNING: "running", PipelineStatus.SUCCEEDED: "succeeded"}.get(pipeline.status, "failed")


def _all_stages_succeeded(pipeline: Pipeline) -> str:
    return "its one stage succeeded" if len(pipeline.stages) == 1 else f"all {counted(len(pipeline.stages), 'stage')} succeeded"
