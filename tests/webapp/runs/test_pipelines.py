"""Pipelines: stages validated up front, each stage launched from the previous stage's export when
it succeeds, regression guards that stop the pipeline and keep the previous result, failures."""
import copy
from datetime import timedelta
import re

import pytest
import redis
import yaml
from django.utils.html import escape
from django.core.exceptions import ValidationError

from tests.webapp.runs.conftest import FakeRedis, with_checkpoint

from webapp.core.bidi import isolated
from webapp.runs import channels, pipelines, reporting
from webapp.runs.models import ArtifactKind, Pipeline, PipelineStatus, Run, RunStatus


def document(catalog, *, guard=None, stages=2):
    """A pipeline of an sft stage and ``stages - 1`` dpo stages; with a ``guard``, of ``stages`` sft stages (more
    training, the same held-out data), each later one guarded against the one before: a guard compares like with
    like, the same task on the same data.eval."""
    sft = {"task": "sft", "model": catalog.base_model.public_id, "data": {"train": catalog.sft.public_id},
           "train": {"max_steps": 10}}
    if guard:
        sft["data"]["eval"] = catalog.prompts.public_id
        more = {"task": "sft", "data": {"train": catalog.sft.public_id, "eval": catalog.prompts.public_id},
                "train": {"max_steps": 5}}
        later = [{"name": f"sft-{index}", "spec": copy.deepcopy(more), "guard": guard} for index in range(1, stages)]
    else:
        dpo = {"task": "dpo", "data": {"train": catalog.preference.public_id}, "train": {"max_steps": 5}}
        later = [{"name": f"dpo-{index}", "spec": dpo} for index in range(1, stages)]
    return {"name": "chain", "stages": [{"name": "sft", "spec": sft}, *later]}


def finish(run: Run, *, status="succeeded", metrics=None, tmp_path=None) -> Run:
    """What the train worker does at the end of a stage's run."""
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    export = tmp_path / run.public_id
    export.mkdir(exist_ok=True)  # a resumed stage finishes again
    (export / "config.json").write_text("{}")
    with_checkpoint(run, 10)
    run = reporting.run_finish(run=run, summary={"status": status, "step": 10, "export": {"model": str(export)}})
    Run.objects.filter(pk=run.pk).update(final_metrics={name: {"last": value} for name, value in (metrics or {}).items()})
    run.refresh_from_db()
    return run


def test_every_stage_is_checked_before_anything_starts(team, catalog, sent_tasks):
    bad = document(catalog)
    bad["stages"][1]["spec"]["dpo"] = {"loss": "nope"}
    bad["stages"][1]["spec"]["model"] = catalog.base_model.public_id
    bad["stages"][0]["guard"] = {"metric": "eval/loss", "max_drop_percent": 5}
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=bad, user=team.teammate)
    errors = caught.value.message_dict
    assert ("is not one of sigmoid, ipo, hinge, simpo, orpo, robust, exo_pair, nca_pair, sppo_hard, apo_zero, "
            "apo_down, discopop, kto_pair, aot, aot_pair, bco_pair") in errors["stages.1.spec.dpo.loss"][0]
    assert "leave model out" in errors["stages.1.spec.model"][0]
    assert "no previous stage" in errors["stages.0.guard"][0]
    assert not Pipeline.objects.exists() and not Run.objects.exists()
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document={"name": "x", "stages": []}, user=None)
    # In the spec's words, not pydantic's ('[]: list should have at least 1 item after validation, not 0').
    assert caught.value.message_dict == {"stages": ["a pipeline has at least one stage: add a training stage "
                                                    "(name and spec)"]}
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document={"name": "x", "stages": bad["stages"][:1] * 11},
                                  user=None)
    assert caught.value.message_dict == {"stages": ["a pipeline has at most 10 stages; it has 11: split it in two"]}
    # A range in the spec's words, the field's whole range, not pydantic's ('input should be greater than or
    # equal to 0', the one bound crossed).
    negative = document(catalog, guard={"metric": "eval/loss", "max_drop_percent": -5})
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=negative, user=None)
    assert caught.value.message_dict == {"stages.1.guard.max_drop_percent": [
        "-5 is too small: give a number of at least 0"]}


def test_a_guard_on_an_eval_metric_needs_eval_data_in_both_stages(team, catalog, sent_tasks):
    """The New pipeline page's own example guarded its dpo stage on eval/loss with no data.eval: it trained
    the sft and dpo stages, then stopped with 'eval/loss was not logged'. Such a guard is refused up front."""
    guarded = document(catalog, guard={"metric": "eval/loss", "max_drop_percent": 5, "higher_is_better": False})
    del guarded["stages"][1]["spec"]["data"]["eval"]
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=guarded, user=team.teammate)
    assert caught.value.message_dict == {"stages.1.guard.metric": [
        f"eval/loss is logged only by a run with evaluation data, and stage 2 ({isolated('sft-1')}) has no data.eval, "
        "so this guard could never pass; add data.eval there, or guard another metric"]}
    del guarded["stages"][0]["spec"]["data"]["eval"]
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=guarded, user=team.teammate)
    assert (f"stage 1 ({isolated('sft')}) and stage 2 ({isolated('sft-1')}) have no data.eval"
            in caught.value.message_dict["stages.1.guard.metric"][0])
    assert not Pipeline.objects.exists() and not Run.objects.exists()
    guarded["stages"][1]["guard"] = {"metric": "loss", "max_drop_percent": 5, "higher_is_better": False}
    assert pipelines.pipeline_create(project=team.project, document=guarded, user=team.teammate)  # logged by every run


def test_a_guard_between_stages_of_different_tasks_is_refused(team, catalog, sent_tasks):
    """The documented example guarded a dpo stage's eval/loss against the sft stage before it: a DPO preference
    loss (~0.69) against an SFT token loss (~9.8), which passed every time and told the user nothing."""
    example = document(catalog)
    example["stages"][0]["spec"]["data"]["eval"] = catalog.prompts.public_id
    example["stages"][1]["spec"]["data"]["eval"] = catalog.preference.public_id
    example["stages"][1]["guard"] = {"metric": "eval/loss", "max_drop_percent": 5, "higher_is_better": False}
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=example, user=team.teammate)
    stage_2, stage_1 = f"stage 2 ({isolated('dpo-1')})", f"stage 1 ({isolated('sft')})"
    assert caught.value.message_dict == {"stages.1.guard.metric": [
        f"{stage_2} runs task dpo and {stage_1} task sft, so their eval/loss do not measure the same thing: each task "
        "logs its own loss and metrics (a dpo loss near 0.69 against an sft loss near 9.8 passes every time); guard a "
        "stage against one of the same task, or remove the guard",
        f"eval/loss is measured on data.eval, which is {catalog.preference.public_id} in {stage_2} and "
        f"{catalog.prompts.public_id} in {stage_1}: values on different evaluation data do not compare; give both "
        "stages the same data.eval (a stage does not inherit the one before's), or guard another metric"]}
    # Not only eval/ metrics: the training loss of another task is another loss too.
    example["stages"][1]["guard"] = {"metric": "loss", "max_drop_percent": 5, "higher_is_better": False}
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=example, user=team.teammate)
    assert list(caught.value.message_dict) == ["stages.1.guard.metric"]
    assert f"{stage_2} runs task dpo and {stage_1} task sft" in caught.value.message_dict["stages.1.guard.metric"][0]
    assert not Pipeline.objects.exists() and not Run.objects.exists()


def dpo_chain(catalog, *, first_loss=None, second_loss=None) -> dict:
    """sft, then two dpo stages on the same preference eval data, the second guarded on eval/loss."""
    chain = document(catalog, stages=3)
    for stage, loss in ((chain["stages"][1], first_loss), (chain["stages"][2], second_loss)):
        stage["spec"] = {**copy.deepcopy(stage["spec"]), **({"dpo": {"loss": loss}} if loss else {})}
        stage["spec"]["data"] = {"train": catalog.preference.public_id, "eval": catalog.preference.public_id}
    chain["stages"][2]["guard"] = {"metric": "eval/loss", "max_drop_percent": 5, "higher_is_better": False}
    return chain


def test_a_guard_between_dpo_stages_of_different_losses_is_refused(team, catalog, sent_tasks):
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=dpo_chain(catalog, second_loss="ipo"),
                                  user=team.teammate)
    assert caught.value.message_dict == {"stages.2.guard.metric": [
        f"stage 3 ({isolated('dpo-2')}) and stage 2 ({isolated('dpo-1')}) differ in dpo.loss (ipo against sigmoid), so "
        "their eval/loss do not measure the same thing: eval/loss is computed under these settings; give both stages "
        "the same dpo.loss, or remove the guard"]}
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=dpo_chain(catalog, first_loss="simpo",
                                                                            second_loss="orpo"), user=team.teammate)
    assert "differ in dpo.loss (orpo against simpo)" in caught.value.message_dict["stages.2.guard.metric"][0]
    assert not Pipeline.objects.exists()
    # dpo.loss left out is sigmoid, the same loss as written out.
    assert pipelines.pipeline_create(project=team.project, document=dpo_chain(catalog, second_loss="sigmoid"),
                                     user=team.teammate)


def test_a_guard_between_dpo_stages_of_different_betas_is_refused_on_a_metric_beta_scales(team, catalog, sent_tasks):
    """beta scales the DPO loss and its implicit rewards (a sigmoid loss at beta 0.5 is not one at 0.1), not whether
    the chosen completion's implicit reward is above the rejected one's."""
    chain = dpo_chain(catalog)
    chain["stages"][2]["spec"]["dpo"] = {"beta": 0.5}
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=chain, user=team.teammate)
    assert caught.value.message_dict == {"stages.2.guard.metric": [
        f"stage 3 ({isolated('dpo-2')}) and stage 2 ({isolated('dpo-1')}) differ in dpo.beta (0.5 against 0.1), so "
        "their eval/loss do not measure the same thing: eval/loss is computed under these settings; give both stages "
        "the same dpo.beta, or remove the guard"]}
    chain["stages"][2]["guard"] = {"metric": "eval/rewards/accuracies", "max_drop_percent": 5}
    assert pipelines.pipeline_create(project=team.project, document=chain, user=team.teammate)


def test_a_guard_between_discopop_stages_of_different_temperatures_is_refused(team, catalog, sent_tasks):
    """discopop_tau shapes discopop's loss as simpo_gamma shapes simpo's: eval/loss at tau 0.05 and at 0.5 are other
    numbers; other losses never read it."""
    chain = dpo_chain(catalog, first_loss="discopop", second_loss="discopop")
    chain["stages"][2]["spec"]["dpo"]["discopop_tau"] = 0.5
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=chain, user=team.teammate)
    assert "differ in dpo.discopop_tau (0.5 against 0.05)" in caught.value.message_dict["stages.2.guard.metric"][0]
    chain = dpo_chain(catalog, first_loss="nca_pair", second_loss="nca_pair")
    chain["stages"][2]["spec"]["dpo"]["discopop_tau"] = 0.5
    assert pipelines.pipeline_create(project=team.project, document=chain, user=team.teammate)


def grpo_chain(catalog, *, metric: str, later: dict) -> dict:
    """sft, then two grpo stages scored on the same prompts, the second (``later`` merged into its grpo section)
    guarded on ``metric`` against the first."""
    grpo = {"task": "grpo", "data": {"train": catalog.prompts.public_id, "eval": catalog.prompts.public_id},
            "train": {"max_steps": 2}, "grpo": {"rewards": [{"name": "exact_match"},
                                                            {"name": "format_regex", "args": {"pattern": "[0-9]"}}]}}
    chain = document(catalog)
    chain["stages"][1] = {"name": "grpo-1", "spec": grpo}
    second = copy.deepcopy(grpo)
    second["grpo"] |= later
    chain["stages"].append({"name": "grpo-2", "spec": second, "guard": {"metric": metric, "max_drop_percent": 10}})
    return chain


def guard_errors(team, chain) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=chain, user=team.teammate)
    assert list(caught.value.message_dict) == ["stages.2.guard.metric"]
    return caught.value.message_dict["stages.2.guard.metric"]


def test_a_guard_on_a_reward_between_stages_of_different_reward_functions_is_refused(team, catalog, sent_tasks):
    """The guard compared tasks, dpo.loss and data.eval only: eval/reward, the weighted sum of the reward functions,
    was compared between stages weighing them differently, and eval/format_regex between stages whose regex
    differed. A function's own score does not depend on its weight."""
    stages = f"stage 3 ({isolated('grpo-2')}) and stage 2 ({isolated('grpo-1')})"
    reweighted = [{"name": "exact_match", "weight": 2}, {"name": "format_regex", "args": {"pattern": "[0-9]"}}]
    assert guard_errors(team, grpo_chain(catalog, metric="eval/reward", later={"rewards": reweighted})) == [
        f"{stages} differ in grpo.rewards[exact_match].weight (2 against 1), so their eval/reward do not measure the "
        "same thing: eval/reward is computed under these settings; give both stages the same "
        "grpo.rewards[exact_match].weight, or remove the guard"]
    assert pipelines.pipeline_create(project=team.project, document=grpo_chain(
        catalog, metric="eval/exact_match", later={"rewards": reweighted}), user=team.teammate)
    other_regex = [{"name": "exact_match"}, {"name": "format_regex", "args": {"pattern": "[a-z]"}}]
    for metric in ("eval/format_regex", "rewards/format_regex/mean", "eval/reward"):
        assert guard_errors(team, grpo_chain(catalog, metric=metric, later={"rewards": other_regex})) == [
            f"{stages} differ in grpo.rewards[format_regex].args, so their {metric} do not measure the same thing: "
            f"{metric} is computed under these settings; give both stages the same grpo.rewards[format_regex].args, "
            "or remove the guard"]
    fewer = [{"name": "exact_match"}]
    assert "differ in grpo.rewards (exact_match against exact_match, format_regex)" in guard_errors(
        team, grpo_chain(catalog, metric="reward", later={"rewards": fewer}))[0]
    assert Pipeline.objects.count() == 1


def test_a_guard_on_a_loss_between_stages_of_different_loss_settings_is_refused(team, catalog, sent_tasks):
    """grpo.loss_type and advantage (and ppo's coefficients) set the loss's scale: a dapo loss is not a grpo one.
    They leave the reward alone."""
    stages = f"stage 3 ({isolated('grpo-2')}) and stage 2 ({isolated('grpo-1')})"
    later = {"loss_type": "dapo", "advantage": "rloo", "epsilon_high": 0.28}
    assert guard_errors(team, grpo_chain(catalog, metric="loss", later=later)) == [
        f"{stages} differ in grpo.loss_type (dapo against grpo); grpo.advantage (rloo against group); "
        "grpo.epsilon_high (0.28 against 0.2), so their loss do not measure the same thing: loss is computed under "
        "these settings; give both stages the same grpo.loss_type, grpo.advantage, grpo.epsilon_high, or remove the "
        "guard"]
    assert pipelines.pipeline_create(project=team.project, document=grpo_chain(catalog, metric="eval/reward",
                                                                               later=later), user=team.teammate)
    ppo_chain = grpo_chain(catalog, metric="loss", later={})
    for stage, vf_coef in ((ppo_chain["stages"][1], 0.5), (ppo_chain["stages"][2], 1.0)):
        stage["spec"]["task"] = "ppo"
        stage["spec"]["train"]["batch_size"] = 2
        stage["spec"]["ppo"] = {**stage["spec"].pop("grpo"), "vf_coef": vf_coef}
    assert "differ in ppo.vf_coef (1 against 0.5)" in guard_errors(team, ppo_chain)[0]


def test_a_guard_on_an_eval_metric_between_stages_of_different_eval_data_is_refused(team, catalog, sent_tasks):
    from tests.webapp.factories import make_ready_version

    other = make_ready_version(team.project, name="other questions", kind="prompts",
                               rows=[{"prompt": "3+3?", "answer": "6"}])
    guarded = document(catalog, guard={"metric": "eval/exact_match", "max_drop_percent": 10})
    guarded["stages"][1]["spec"]["data"]["eval"] = other.public_id
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=guarded, user=team.teammate)
    assert caught.value.message_dict == {"stages.1.guard.metric": [
        f"eval/exact_match is measured on data.eval, which is {other.public_id} in stage 2 ({isolated('sft-1')}) and "
        f"{catalog.prompts.public_id} in stage 1 ({isolated('sft')}): values on different evaluation data do not "
        "compare; give both stages the same data.eval (a stage does not inherit the one before's), or guard another "
        "metric"]}
    # A metric of the training data is not read from data.eval.
    guarded["stages"][1]["guard"] = {"metric": "loss", "max_drop_percent": 5, "higher_is_better": False}
    assert pipelines.pipeline_create(project=team.project, document=guarded, user=team.teammate)


def test_a_guard_between_comparable_stages_is_accepted(team, catalog, sent_tasks):
    """sft on more data guarded against forgetting on the same held-out data, dpo stages of one loss, grpo stages
    scored by the same rewards on the same prompts: each stage's value measures what the one before's did."""
    sft = pipelines.pipeline_create(project=team.project, document=document(
        catalog, guard={"metric": "eval/loss", "max_drop_percent": 5, "higher_is_better": False}, stages=3),
        user=team.teammate)
    assert [stage["guard"]["metric"] for stage in sft.stages[1:]] == ["eval/loss", "eval/loss"]
    assert pipelines.pipeline_create(project=team.project, document=dpo_chain(catalog, first_loss="ipo",
                                                                              second_loss="ipo"), user=team.teammate)
    grpo = {"task": "grpo", "data": {"train": catalog.prompts.public_id, "eval": catalog.prompts.public_id},
            "train": {"max_steps": 2}, "grpo": {"rewards": [{"name": "exact_match"}]}}
    chain = document(catalog)
    chain["stages"][1] = {"name": "grpo-1", "spec": grpo}
    chain["stages"].append({"name": "grpo-2", "spec": copy.deepcopy(grpo),
                            "guard": {"metric": "eval/exact_match", "max_drop_percent": 10}})
    assert pipelines.pipeline_create(project=team.project, document=chain, user=team.teammate)


def test_a_bad_first_model_is_named_once_at_the_stage_that_gives_it(team, catalog, sent_tasks):
    """A mistyped model in stage 1 was also reported at every later stage (stages.1.spec.model: 'bm_typo' is
    not a base model…), whose spec gives no model at all: later stages are checked with the first stage's
    model as a stand-in, and its problem is the first stage's to name."""
    typo = document(catalog, stages=3)
    typo["stages"][0]["spec"]["model"] = "bm_typo"
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=typo, user=team.teammate)
    errors = caught.value.message_dict
    assert list(errors) == ["stages.0.spec.model"]
    assert "bm_typo" in errors["stages.0.spec.model"][0]
    assert not Pipeline.objects.exists() and not Run.objects.exists()


def test_each_stage_starts_from_the_previous_export(team, catalog, sent_tasks, tmp_path):
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog, stages=3), user=team.teammate)
    first = pipeline.runs.get()
    assert first.pipeline_stage == 0 and first.name == "chain · stage 1 (sft)"
    first = finish(first, tmp_path=tmp_path)
    pipelines.pipeline_advance(run=first)
    pipelines.pipeline_advance(run=first)  # twice changes nothing
    second = Run.objects.get(pipeline=pipeline, pipeline_stage=1)
    assert second.spec["model"] == first.public_id and second.source_run == first
    assert second.resolved_spec["model"] == first.artifacts.get(kind=ArtifactKind.MODEL).path
    pipelines.pipeline_advance(run=finish(second, tmp_path=tmp_path))
    third = Run.objects.get(pipeline=pipeline, pipeline_stage=2)
    pipelines.pipeline_advance(run=finish(third, tmp_path=tmp_path))
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.SUCCEEDED and pipeline.result_run == third
    assert Run.objects.filter(pipeline=pipeline).count() == 3
    assert pipeline.message == "all 3 stages succeeded"


def test_a_pipeline_of_one_stage_says_so_when_it_succeeds(team, catalog, sent_tasks, tmp_path):
    """It said "all 1 stages succeeded"."""
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog, stages=1), user=team.teammate)
    pipelines.pipeline_advance(run=finish(pipeline.runs.get(), tmp_path=tmp_path))
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.SUCCEEDED and pipeline.message == "its one stage succeeded"


def test_long_pipeline_and_stage_names_still_name_every_stages_run(team, catalog, sent_tasks, tmp_path):
    """QA: a stage's run is named "<pipeline> · stage <n> (<stage>)", past a run name's 120 characters for a
    pipeline name of 88 and a stage name of 36, both allowed: the pipeline was refused ("name: 131
    characters") when that was the first stage, and failed after the first stage had trained when it was
    the second ("stage 2 could not start: 132 characters"). The pipeline's name is cut to fit instead."""
    long = document(catalog)
    long["name"] = "p" * 120
    long["stages"][1]["name"] = "s" * 60
    pipeline = pipelines.pipeline_create(project=team.project, document=long, user=team.teammate)
    first = pipeline.runs.get()
    assert first.name == "p" * (120 - len(" · stage 1 (sft)")) + " · stage 1 (sft)"
    pipelines.pipeline_advance(run=finish(first, tmp_path=tmp_path))
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.RUNNING, pipeline.message
    second = Run.objects.get(pipeline=pipeline, pipeline_stage=1)
    suffix = " · stage 2 (" + "s" * 60 + ")"
    assert second.name == "p" * (120 - len(suffix)) + suffix


def test_it_rejects_bidi_controls_in_pipeline_and_stage_names_before_anything_starts(team, catalog, sent_tasks):
    """A stage's run is named after the pipeline and the stage, and a run's name may hold no invisible character:
    a stage named with U+202E RIGHT-TO-LEFT OVERRIDE was accepted, and its run could not start once the stages
    before it had trained. Both names are refused up front, by their keys."""
    hostile = document(catalog)
    hostile["name"] = "chain\u202e"
    hostile["stages"][1]["name"] = "dpo\u202e-1"
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=hostile, user=team.teammate)
    invisible = ("an invisible character, U+202E (RIGHT-TO-LEFT OVERRIDE), at position {}: remove it (it makes names "
                 "that look alike but differ)")
    assert caught.value.message_dict == {"name": [invisible.format(6)], "stages.1.name": [invisible.format(4)]}
    assert not Pipeline.objects.exists() and not Run.objects.exists()


def failing_its_guard(team, catalog, tmp_path, *, stages: int) -> tuple[Pipeline, Run, Run]:
    """A guarded pipeline (eval/exact_match may fall 10%) whose second stage fell 20% (0.5 → 0.4), judged:
    (the pipeline, its first stage's run, its second's)."""
    guard = {"metric": "eval/exact_match", "max_drop_percent": 10}
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog, guard=guard, stages=stages),
                                         user=team.teammate)
    first = finish(pipeline.runs.get(), metrics={"eval/exact_match": 0.5}, tmp_path=tmp_path)
    pipelines.pipeline_advance(run=first)
    second = finish(Run.objects.get(pipeline=pipeline, pipeline_stage=1), metrics={"eval/exact_match": 0.4},
                    tmp_path=tmp_path)
    pipelines.pipeline_advance(run=second)
    pipeline.refresh_from_db()
    return pipeline, first, second


def test_a_stage_that_fails_its_guard_stops_the_pipeline(team, catalog, sent_tasks, tmp_path):
    pipeline, first, _second = failing_its_guard(team, catalog, tmp_path, stages=3)
    assert pipeline.status == PipelineStatus.STOPPED and pipeline.result_run == first
    assert pipeline.message == (f"stage 2 (sft-1) failed its guard: eval/exact_match fell 20.0% (0.5 → 0.4), more than "
                                f"the 10% allowed; the result stays chain · stage 1 (sft) ({first.public_id})")
    assert not Run.objects.filter(pipeline=pipeline, pipeline_stage=2).exists()



def test_a_guard_on_a_metric_the_previous_stage_did_not_log_stops_before_its_stage_trains(team, catalog, sent_tasks,
                                                                                         tmp_path):
    """A misspelt guard metric failed only after its stage had trained, though the previous stage's
    metrics already showed it could never pass."""
    guard = {"metric": "eval/exact_mtch", "max_drop_percent": 10}
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog, guard=guard, stages=3),
                                         user=team.teammate)
    first = finish(pipeline.runs.get(), metrics={"eval/exact_match": 0.5, "eval/loss": 1.0, "loss": 0.9},
                   tmp_path=tmp_path)
    pipelines.pipeline_advance(run=first)
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.STOPPED and pipeline.result_run == first and pipeline.finished_at
    assert pipeline.message == (
        f"stage 2 (sft-1) was not started: its guard reads eval/exact_mtch, which chain · stage 1 (sft) ({first.public_id}) "
        f"did not log, so the guard could never pass (did you mean eval/exact_match?); the result stays chain · stage 1 (sft) "
        f"({first.public_id})")
    assert not Run.objects.filter(pipeline=pipeline, pipeline_stage=1).exists()
    # With nothing close, it names the eval metrics that were logged.
    other = pipelines.pipeline_create(project=team.project, document=document(
        catalog, guard={"metric": "eval/reward_model", "max_drop_percent": 10}), user=team.teammate)
    pipelines.pipeline_advance(run=finish(other.runs.get(), metrics={"eval/loss": 1.0, "loss": 0.9}, tmp_path=tmp_path))
    other.refresh_from_db()
    assert other.status == PipelineStatus.STOPPED and "did not log, so the guard could never pass (it logged eval/loss);" in other.message

def train(run: Run, evaluations: dict[int, float], tmp_path) -> Run:
    """What the train worker does for a stage's run: the engine's progress records (``eval/loss`` at the
    steps of ``evaluations``) through the run's reporter, then its finish."""
    from tests.webapp.runs.test_reporting import Progress

    started = reporting.run_start(run_pk=run.pk, attempt=run.attempt, worker_name="train@test")
    reporter = reporting.RunReporter(run=started, flush_seconds=0.05, use_redis=False)
    reporter.start()
    for step in range(1, 11):
        metrics = {"step": step, "loss": 1.0, "tokens": step * 100,
                   **({"eval/loss": evaluations[step]} if step in evaluations else {})}
        reporter.on_progress(Progress(step=step, total_steps=10, metrics=metrics, elapsed_seconds=step,
                                      tokens_seen=step * 100))
    reporter.close()
    (tmp_path / run.public_id).mkdir()
    (tmp_path / run.public_id / "config.json").write_text("{}")
    with_checkpoint(run, 10)
    return reporting.run_finish(run=Run.objects.get(pk=run.pk), summary={
        "status": "succeeded", "step": 10, "export": {"model": str(tmp_path / run.public_id)}})


def test_a_guard_cannot_pass_on_a_metric_whose_last_value_was_not_finite(transactional_db, team, catalog, sent_tasks,
                                                                         tmp_path, client_for):
    """QA: NaN and infinity are not stored (a chart cannot draw them), so a guard read the metric's last finite
    value: a stage whose eval/loss went NaN at its last evaluation passed a guard on eval/loss with an older one."""
    guard = {"metric": "eval/loss", "max_drop_percent": 5, "higher_is_better": False}
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog, guard=guard, stages=3),
                                         user=team.teammate)
    first = train(pipeline.runs.get(), {5: 2.0, 10: 2.0}, tmp_path)
    pipelines.pipeline_advance(run=first)
    second = train(Run.objects.get(pipeline=pipeline, pipeline_stage=1), {5: 1.9, 10: float("nan")}, tmp_path)
    assert second.final_metrics["eval/loss"]["last"] == 1.9, "the charts' summary keeps the last value stored"
    pipelines.pipeline_advance(run=second)
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.STOPPED and pipeline.result_run == first
    assert pipeline.message == (f"stage 2 (sft-1) failed its guard: eval/loss was NaN at step 10 of chain · stage 2 (sft-1) "
                                f"({second.public_id}): the guard cannot pass; the result stays chain · stage 1 (sft) "
                                f"({first.public_id})")
    page = client_for(team.viewer).get(f"/p/alpha/pipelines/{pipeline.public_id}/").content.decode()
    assert f"eval/loss was NaN at step 10 of chain · stage 2 (sft-1) ({second.public_id}): the guard cannot pass" in page


def test_a_stage_is_not_started_on_a_previous_stage_whose_guarded_metric_ended_not_finite(
        transactional_db, team, catalog, sent_tasks, tmp_path):
    guard = {"metric": "eval/loss", "max_drop_percent": 5, "higher_is_better": False}
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog, guard=guard),
                                         user=team.teammate)
    first = train(pipeline.runs.get(), {5: 2.0, 10: float("inf")}, tmp_path)
    pipelines.pipeline_advance(run=first)
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.STOPPED and pipeline.result_run == first
    assert pipeline.message == (f"stage 2 (sft-1) was not started: eval/loss was infinity at step 10 of chain · stage 1 "
                                f"(sft) ({first.public_id}): the guard cannot pass; the result stays chain · stage 1 (sft) "
                                f"({first.public_id})")
    assert not Run.objects.filter(pipeline=pipeline, pipeline_stage=1).exists()


def test_guards_on_losses_and_missing_metrics():
    previous = Run(name="a", public_id="run_a", final_metrics={"eval/loss": {"last": 2.0}})
    current = Run(name="b", public_id="run_b", final_metrics={"eval/loss": {"last": 2.08}})
    loss_guard = {"metric": "eval/loss", "max_drop_percent": 5, "higher_is_better": False}
    assert pipelines.guard_verdict(loss_guard, previous, current) is None  # 4% worse: allowed
    current.final_metrics = {"eval/loss": {"last": 2.2}}
    assert "rose 10.0% (2 → 2.2)" in pipelines.guard_verdict(loss_guard, previous, current)
    assert "was not logged by b (run_b)" in pipelines.guard_verdict({"metric": "x", "max_drop_percent": 1}, current, current)


def test_a_failed_or_cancelled_stage_ends_the_pipeline(team, catalog, sent_tasks, tmp_path, django_capture_on_commit_callbacks):
    from webapp.runs import services

    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog), user=team.teammate)
    first = pipeline.runs.get()
    services.run_cancel(run=first, user=team.teammate)  # queued: cancelled at once, the pipeline follows
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.CANCELLED and "stage 1 (sft) cancelled" in pipeline.message
    other = pipelines.pipeline_create(project=team.project, document=document(catalog), user=team.teammate)
    run = other.runs.get()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    pipelines.pipeline_advance(run=reporting.run_fail(run=run, error=RuntimeError("out of memory")))
    other.refresh_from_db()
    assert other.status == PipelineStatus.FAILED and "RuntimeError: out of memory" in other.message


def test_an_ended_pipeline_without_a_result_does_not_wait_for_one(team, catalog, sent_tasks, client_for):
    # It read 'Result: none yet' after failing, as if a result might still come, and its message was
    # styled like any note.
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog), user=team.teammate)
    page = client_for(team.viewer).get(f"/p/alpha/pipelines/{pipeline.public_id}/").content.decode()
    assert "none yet" in page
    # Running, it reads itself again (static/page_refresh.js, which holds back while a field is being filled).
    assert 'content="5"></noscript><script src="/static/page_refresh.js" data-seconds="5" defer>' in page
    Pipeline.objects.filter(pk=pipeline.pk).update(status=PipelineStatus.FAILED, message="stage 1 (sft) failed: boom")
    page = client_for(team.viewer).get(f"/p/alpha/pipelines/{pipeline.public_id}/").content.decode()
    assert "none yet" not in page and "none: no stage succeeded and passed its guard" in page
    assert 'http-equiv="refresh"' not in page and "page_refresh.js" not in page
    assert 'class="card run-message message-error" id="pipeline-message">stage 1 (sft) failed: boom</p>' in page


def test_pipeline_pages(team, catalog, sent_tasks, client_for):
    client = client_for(team.teammate)
    page = client.get("/p/alpha/pipelines/new/").content.decode()
    assert catalog.base_model.public_id in page and catalog.preference.public_id in page
    text = yaml.safe_dump(document(catalog))
    response = client.post("/p/alpha/pipelines/new/", {"document": text})
    pipeline = Pipeline.objects.get()
    assert response["Location"] == f"/p/alpha/pipelines/{pipeline.public_id}/"
    detail = client_for(team.viewer).get(response["Location"]).content.decode()
    assert "chain · stage 1 (sft)" in detail and "not started" in detail
    bad = client.post("/p/alpha/pipelines/new/", {"document": "name: x\nstages: [\n"})
    assert bad.status_code == 400 and "YAML syntax error" in bad.content.decode()
    assert client_for(team.viewer).get("/p/alpha/pipelines/new/").status_code == 403
    assert client_for(team.outsider).get(response["Location"]).status_code == 404
    assert "chain" in client.get("/p/alpha/runs/").content.decode()


@pytest.mark.parametrize("text, errors", [
    ("name: x\nstages: [\n  - name: sft\n", ["document:3:3: YAML syntax error: expected the node "
                                             "content, but found &#x27;-&#x27;"]),
    ("- a\n- b\n", ["the document must be a mapping with a name and its stages"]),
    ("name: x\n", ["<code>stages</code>: required key is missing"]),
    ("name: x\nstages:\n  - name: one\n    spec: {task: sft}\n    foo: 1\n    guard: {metric: m, drop: 3}\n",
     ["<code>stages.0.guard.max_drop_percent</code>: required key is missing",
      "<code>stages.0.guard.drop</code>: unknown key; allowed keys here: metric, max_drop_percent, higher_is_better",
      "<code>stages.0.foo</code>: unknown key; allowed keys here: name, spec, export, guard"]),
    ("name: x\nstages:\n  - name: one\n    spec: {task: sft}\n    guard: {metric: m, max_drop_percent: '5', "
     "higher_is_better: 'false'}\n  - name: two\n    export: {quantize: int4, group_size: '32'}\n",
     ["<code>stages.0.guard.max_drop_percent</code>: &#x27;5&#x27; is text (in quotes); write the number without "
      "quotes: 5",
      "<code>stages.0.guard.higher_is_better</code>: &#x27;false&#x27; is text (in quotes); write true or false "
      "without quotes",
      "<code>stages.1.export.group_size</code>: &#x27;32&#x27; is text (in quotes); write the number without "
      "quotes: 32"]),
    # A key given twice was kept at its last value in silence, where a run spec's YAML is refused naming it:
    # the stage trained 2000 steps though its author had meant 2 (or thought the line removed).
    ("name: x\nstages:\n  - name: one\n    spec: {task: sft, train: {max_steps: 2, max_steps: 2000}}\nname: y\n",
     ["document:5: name is given twice (first on line 1); YAML keeps the last, so keep the one you mean and "
      "delete the other",
      "document:4: stages.0.spec.train.max_steps is given twice (first on line 4); YAML keeps the last, so keep "
      "the one you mean and delete the other"]),
    ("name: x\nstages:\n  - name: one\n  - name: two\n    export: {quantize: int3}\n",
     ["<code>stages.0</code>: give a stage either a spec (a training run) or an export (e.g. {quantize: int4})",
      "<code>stages.1.export.quantize</code>: &#x27;int3&#x27; is not one of int8, int4"]),
])
def test_a_bad_document_is_named_in_words_and_kept(team, catalog, client_for, text, errors):
    """Syntax errors read as PyYAML's repr ('in "<unicode string>", line 3, column 3: ... ^') and document
    errors as pydantic's ('Extra inputs are not permitted', 'Input should be a valid dictionary or instance
    of PipelineDocument'); they now read as the run spec's do. A problem of the whole document is not put
    under a key: it read '__all__: the document must be a mapping' and 'document: document:3:3: ...'."""
    response = client_for(team.teammate).post("/p/alpha/pipelines/new/", {"document": text})
    page = response.content.decode()
    assert response.status_code == 400 and not Pipeline.objects.exists()
    assert re.findall(r"<li>(.*?)</li>", page[page.index('id="pipeline-errors"'):page.index("</ul>")]) == errors
    assert escape(text) in page


def export_document(catalog, **export):
    doc = document(catalog, stages=1)
    doc["stages"].append({"name": "serve", "export": {"quantize": "int4", **export}})
    return doc


def test_an_export_stage_comes_last_after_a_training_stage(team, catalog, sent_tasks):
    misplaced = export_document(catalog)
    misplaced["stages"].insert(0, misplaced["stages"].pop())
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=misplaced, user=team.teammate)
    assert "comes last" in caught.value.message_dict["stages.0.export"][0]
    guarded = export_document(catalog)
    guarded["stages"][1]["guard"] = {"metric": "eval/loss", "max_drop_percent": 5}
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=guarded, user=team.teammate)
    assert "has no guard" in caught.value.message_dict["stages.1"][0]
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=export_document(catalog, quantize="int3"),
                                  user=team.teammate)
    assert "stages.1.export.quantize" in caught.value.message_dict
    both = export_document(catalog)
    both["stages"][1]["spec"] = both["stages"][0]["spec"]
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=both, user=team.teammate)
    assert "either a spec" in caught.value.message_dict["stages.1"][0]
    assert not Pipeline.objects.exists()


def test_the_export_stage_quantizes_the_last_model_and_the_page_shows_its_figures(
        team, catalog, sent_tasks, tmp_path, client_for, django_capture_on_commit_callbacks):
    import json

    pipeline = pipelines.pipeline_create(project=team.project, document=export_document(catalog), user=team.teammate)
    first = pipeline.runs.get()
    assert pipelines.exports_after(first)  # so the train worker sends it no automatic serving copy
    with django_capture_on_commit_callbacks(execute=True):
        pipelines.pipeline_advance(run=finish(first, tmp_path=tmp_path))
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.RUNNING and pipeline.current_stage == 1 and pipeline.result_run == first
    assert "quantizing chain · stage 1 (sft) to int4" in pipeline.message
    assert sent_tasks.calls[-1] == (pipelines.EXPORT_STAGE_TASK, [pipeline.pk, 1], "train")
    assert Run.objects.filter(pipeline=pipeline).count() == 1  # an export stage is not a run
    assert pipelines.export_stage_start(pipeline_pk=pipeline.pk, stage=1) == (first, {"quantize": "int4"})
    page = client_for(team.viewer).get(f"/p/alpha/pipelines/{pipeline.public_id}/").content.decode()
    assert "export (int4)" in page and 'data-status="running"' in page

    # What quantize_run_export writes (tests/worker/test_pipeline_export.py runs the real one).
    copy = first.output_dir / "export" / "quantized"
    copy.mkdir(parents=True)
    description = {"scheme": "int4", "bits": 4, "group_size": 64, "model_bytes": 3 * 2**20,
                   "bfloat16_bytes": 10 * 2**20, "ratio_to_bfloat16": 0.3, "eval_sequences": 8,
                   "perplexity_reference": 12.5, "perplexity_quantized": 13.0, "perplexity_increase": 0.04,
                   "eval_prompts": 8, "greedy_agreement": 0.875}
    (copy / "quantization.json").write_text(json.dumps(description))
    pipelines.export_stage_finish(pipeline_pk=pipeline.pk, stage=1, description=description)
    pipelines.export_stage_finish(pipeline_pk=pipeline.pk, stage=1, error=RuntimeError("late"))  # ignored: over
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.SUCCEEDED and pipeline.result_run == first
    assert pipeline.message == ("all 2 stages succeeded; int4 copy 3.0 MiB (30% of bfloat16), perplexity 12.5 → 13 "
                                "(+4.0%), greedy agreement 88%")
    assert pipelines.export_stage_start(pipeline_pk=pipeline.pk, stage=1) is None
    page = client_for(team.viewer).get(f"/p/alpha/pipelines/{pipeline.public_id}/").content.decode()
    assert 'id="pipeline-export"' in page and "12.5000 unquantized → 13.0000 quantized" in page
    # In MiB, as the summary line above it: the table said "3.0 MB" (filesizeformat's 1024s) under "3.0 MiB".
    assert "88%" in page and "<td>3.0 MiB (10.0 MiB in bfloat16)</td>" in page and str(copy) in page


def test_a_failed_export_fails_the_pipeline_and_keeps_the_run_as_its_result(team, catalog, sent_tasks, tmp_path):
    pipeline = pipelines.pipeline_create(project=team.project, document=export_document(catalog), user=team.teammate)
    first = finish(pipeline.runs.get(), tmp_path=tmp_path)
    pipelines.pipeline_advance(run=first)
    pipelines.export_stage_finish(pipeline_pk=pipeline.pk, stage=1, error=ValueError("group_size 64 does not divide 48"))
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.FAILED and pipeline.result_run == first
    assert "stage 2 (serve) failed: ValueError: group_size 64 does not divide 48" in pipeline.message
    assert pipelines.export_result(pipeline) is None


def test_the_new_pipeline_example_ends_in_an_export_stage_and_launches(team, catalog, sent_tasks, client_for):
    import html
    import re

    client = client_for(team.teammate)
    page = client.get("/p/alpha/pipelines/new/").content.decode()
    text = html.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", page, re.S).group(1))
    stages = yaml.safe_load(text)["stages"]
    assert [stage["name"] for stage in stages] == ["sft", "dpo", "serve"] and stages[-1]["export"] == {"quantize": "int8"}
    response = client.post("/p/alpha/pipelines/new/", {"document": text})
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Pipeline.objects.get().stages[-1] == {"name": "serve", "export": {"quantize": "int8"}}


def test_the_new_pipeline_examples_guard_compares_like_with_like_and_launches(team, catalog, sent_tasks, client_for):
    """The example suggested a guard on eval/loss for its dpo stage, against the sft stage before it: a preference
    loss against a token loss, which passes every time. It shows the guard on a stage it means something for, more
    sft on new data checked for forgetting on the same held-out data; uncommented (its new data filled in), that
    stage is accepted and launches."""
    import html

    page = client_for(team.teammate).get("/p/alpha/pipelines/new/").content.decode()
    text = html.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", page, re.S).group(1))
    uncommented = re.sub(r"(?m)^  # (- |  )", r"  \1", text).replace("dv_…", catalog.sft.public_id)
    stages = yaml.safe_load(uncommented)["stages"]
    assert [stage["name"] for stage in stages] == ["sft", "sft-more", "dpo", "serve"]
    assert "guard" not in stages[2]
    assert stages[1]["guard"] == {"metric": "eval/loss", "max_drop_percent": 5, "higher_is_better": False}
    assert stages[1]["spec"]["data"]["eval"] == stages[0]["spec"]["data"]["eval"] == catalog.prompts.public_id
    response = client_for(team.teammate).post("/p/alpha/pipelines/new/", {"document": uncommented})
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Pipeline.objects.get().stages[1]["guard"]["metric"] == "eval/loss"


def test_the_new_pipeline_example_fills_in_the_newest_ready_data_of_each_kind(team, catalog, client_for):
    """The example filled in the first sft dataset by name ("aardvark", an old one, here) rather than the data the
    team uploaded last, and could give the training data as its own evaluation data."""
    import html

    from tests.webapp.factories import make_ready_version
    from webapp.datasets.models import DatasetVersion, VersionStatus

    older_sft = make_ready_version(team.project, name="aardvark", kind="sft")
    newest_sft = make_ready_version(team.project, name="zebra chats", kind="sft")
    newest_pairs = make_ready_version(team.project, name="zebra pairs", kind="preference",
                                      rows=[{"prompt": "p", "chosen": "a", "rejected": "b"}])
    failed = make_ready_version(team.project, name="broken", kind="sft")
    DatasetVersion.objects.filter(pk=failed.pk).update(status=VersionStatus.FAILED)  # newest, but not ready

    def example() -> dict:
        page = client_for(team.teammate).get("/p/alpha/pipelines/new/").content.decode()
        return yaml.safe_load(html.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", page, re.S).group(1)))

    stages = example()["stages"]
    assert stages[0]["spec"]["data"]["train"] == newest_sft.public_id
    # Evaluation data other than the training data: the newest other sft or prompts version.
    assert stages[0]["spec"]["data"]["eval"] == older_sft.public_id
    assert stages[1]["spec"]["data"]["train"] == newest_pairs.public_id
    newest_prompts = make_ready_version(team.project, name="held-out", kind="prompts")
    assert example()["stages"][0]["spec"]["data"]["eval"] == newest_prompts.public_id


def test_an_export_stage_whose_message_was_lost_fails_the_pipeline_with_the_reason(
        team, catalog, sent_tasks, tmp_path, client_for, monkeypatch, django_capture_on_commit_callbacks):
    pipeline = pipelines.pipeline_create(project=team.project, document=export_document(catalog), user=team.teammate)
    first = finish(pipeline.runs.get(), tmp_path=tmp_path)
    with django_capture_on_commit_callbacks(execute=True):
        pipelines.pipeline_advance(run=first)
    assert sent_tasks.calls[-1] == (pipelines.EXPORT_STAGE_TASK, [pipeline.pk, 1], "train")
    sent_at = first.finished_at

    def redis_holding(**messages):
        monkeypatch.setattr(channels, "redis_client",
                            lambda: FakeRedis(task=pipelines.EXPORT_STAGE_TASK, **messages))

    # Waiting in the queue, or delivered to a worker that is quantizing (acks_late): not lost, however long.
    for held in ({"waiting": [(pipeline.pk, 1)]}, {"priority": [(pipeline.pk, 1)]}, {"unacked": [(pipeline.pk, 1)]}):
        redis_holding(**held)
        assert pipelines.pipelines_fail_lost_exports(now=sent_at + timedelta(hours=3)) == []
    # Gone, but within TEMPER_RUN_LOST_SECONDS of the send (a message on its way): not yet.
    redis_holding(waiting=[(pipeline.pk, 0), (pipeline.pk + 1, 1)])
    assert pipelines.pipelines_fail_lost_exports(now=sent_at + timedelta(seconds=30)) == []

    # Redis cannot be asked: nothing is decided.
    def unavailable():
        raise redis.ConnectionError("refused")
    monkeypatch.setattr(channels, "redis_client", unavailable)
    assert pipelines.pipelines_fail_lost_exports(now=sent_at + timedelta(seconds=120)) == []
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.RUNNING

    redis_holding(waiting=[(pipeline.pk, 0), (pipeline.pk + 1, 1)])
    failed = pipelines.pipelines_fail_lost_exports(now=sent_at + timedelta(seconds=120))
    assert [lost.pk for lost in failed] == [pipeline.pk]
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.FAILED and pipeline.result_run == first
    assert pipeline.message == (
        "stage 2 (serve) lost: Redis no longer holds its export message 120 s after it was sent (a Redis restart, "
        "or a failed send), so no worker will take it; quantize the run with jaxengine export --quantize int4, or "
        f"launch the pipeline again; the result stays {first.name} ({first.public_id}), its unquantized export")
    assert first.log_lines.filter(level="error", message=pipeline.message).exists()
    page = client_for(team.viewer).get(f"/p/alpha/pipelines/{pipeline.public_id}/").content.decode()
    assert 'id="pipeline-message"' in page and "Redis no longer holds its export message" in page
    # Once failed it is left alone: by the next check, and by a late message's outcome.
    assert pipelines.pipelines_fail_lost_exports(now=sent_at + timedelta(seconds=240)) == []
    assert pipelines.export_stage_finish(pipeline_pk=pipeline.pk, stage=1, description={"scheme": "int4"}) is None
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.FAILED


def test_a_pipeline_at_a_training_stage_is_not_checked_for_an_export_message(team, catalog, sent_tasks, tmp_path,
                                                                             monkeypatch):
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog, stages=3),
                                         user=team.teammate)
    first = finish(pipeline.runs.get(), tmp_path=tmp_path)
    pipelines.pipeline_advance(run=first)  # stage 2 is a run, with its own lost-run checks
    monkeypatch.setattr(channels, "redis_client", lambda: FakeRedis())
    assert pipelines.pipelines_fail_lost_exports(now=first.finished_at + timedelta(hours=1)) == []
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.RUNNING and pipeline.current_stage == 1


@pytest.fixture
def resumable(monkeypatch):
    from webapp.runs import services

    monkeypatch.setattr(services, "_clear_cancel_flag", lambda public_id: None)
    return services


def test_a_resumed_stage_takes_its_ended_pipeline_on_again(team, catalog, sent_tasks, tmp_path, resumable):
    """A failed stage's run resumed: its pipeline went on saying failed while the run trained, then moved on without
    a word when it succeeded. It follows the run again at once, and says so."""
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog), user=team.teammate)
    first = pipeline.runs.get()
    Run.objects.filter(pk=first.pk).update(status=RunStatus.RUNNING)
    first.refresh_from_db()
    pipelines.pipeline_advance(run=reporting.run_fail(run=first, error=RuntimeError("out of memory")))
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.FAILED and pipeline.finished_at is not None
    resumable.run_resume(run=first, user=team.owner)
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.RUNNING and pipeline.finished_at is None
    assert pipeline.message == ("stage 1 (sft) resumed by alpha-owner: the pipeline goes on once \u2068chain · stage 1 ("
                                f"sft)\u2069 ({first.public_id}) ends")
    assert first.log_lines.filter(message=f"{pipeline.message} (pipeline \u2068chain\u2069)").exists()
    pipelines.pipeline_advance(run=finish(Run.objects.get(pk=first.pk), tmp_path=tmp_path))
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.RUNNING and pipeline.current_stage == 1 and pipeline.result_run == first
    assert Run.objects.get(pipeline=pipeline, pipeline_stage=1).spec["model"] == first.public_id


def test_a_stage_resumed_after_failing_its_guard_is_judged_again(team, catalog, sent_tasks, tmp_path, resumable):
    pipeline, first, second = failing_its_guard(team, catalog, tmp_path, stages=2)
    assert pipeline.status == PipelineStatus.STOPPED
    resumable.run_resume(run=second, user=team.teammate, max_steps=20)  # trained longer, it may pass
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.RUNNING and pipeline.result_run == first
    pipelines.pipeline_advance(run=finish(Run.objects.get(pk=second.pk), metrics={"eval/exact_match": 0.48},
                                          tmp_path=tmp_path))
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.SUCCEEDED and pipeline.result_run == second


def test_a_pipelines_result_is_not_resumed(team, catalog, sent_tasks, tmp_path, resumable,
                                           django_capture_on_commit_callbacks):
    """A succeeded pipeline's result resumed: the engine wrote other weights at its end than those its guards judged
    and its export stage quantized (the serving copy then served the old ones, under the run's name)."""
    pipeline = pipelines.pipeline_create(project=team.project, document=export_document(catalog), user=team.teammate)
    first = pipeline.runs.get()
    with django_capture_on_commit_callbacks(execute=True):
        pipelines.pipeline_advance(run=finish(first, tmp_path=tmp_path))
    with pytest.raises(ValidationError, match="is quantizing its model in its export stage"):
        resumable.run_resume(run=first, user=team.teammate, max_steps=20)
    pipelines.export_stage_finish(pipeline_pk=pipeline.pk, stage=1, description={"scheme": "int4"})
    with pytest.raises(ValidationError) as refused:
        resumable.run_resume(run=first, user=team.teammate, max_steps=20)
    assert refused.value.messages == [
        f"run {first.public_id} cannot be resumed: it is the result of pipeline \u2068chain\u2069 ({pipeline.public_id}), "
        "which stands for its final model as trained, quantized by its export stage into the serving copy a resume "
        "would delete; a resume would replace that model with other weights at its end. Train on from it as a new run "
        f"instead: launch one with model {first.public_id}"]
    assert resumable.rerun_refusals(first)["resume"] == refused.value.messages[0]  # its page greys Train further
    assert Run.objects.get(pk=first.pk).status == RunStatus.SUCCEEDED


def test_an_export_stage_whose_run_was_resumed_as_it_began_follows_the_run(team, catalog, sent_tasks, tmp_path,
                                                                          django_capture_on_commit_callbacks):
    """The export task took the pipeline's word that its run had finished: a run resumed as the pipeline moved on
    was quantized while it trained again, and the pipeline succeeded on the weights its resume then replaced."""
    from django.db.models import F

    pipeline = pipelines.pipeline_create(project=team.project, document=export_document(catalog), user=team.teammate)
    first = pipeline.runs.get()
    with django_capture_on_commit_callbacks(execute=True):
        pipelines.pipeline_advance(run=finish(first, tmp_path=tmp_path))
    assert sent_tasks.calls[-1] == (pipelines.EXPORT_STAGE_TASK, [pipeline.pk, 1], "train")
    # What a resume committed at that instant leaves (tests/postgres/test_pipelines_postgres.py races the two).
    Run.objects.filter(pk=first.pk).update(status=RunStatus.QUEUED, attempt=F("attempt") + 1, finished_at=None)
    assert pipelines.export_stage_start(pipeline_pk=pipeline.pk, stage=1) is None
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.RUNNING and pipeline.current_stage == 0 and pipeline.result_run is None
    assert pipeline.message == (f"stage 2 (serve) waits: \u2068chain · stage 1 (sft)\u2069 ({first.public_id}) was resumed as "
                                "it began; the pipeline goes on once it ends")
    # Once the resumed run ends, its new weights are exported.
    with django_capture_on_commit_callbacks(execute=True):
        pipelines.pipeline_advance(run=finish(Run.objects.get(pk=first.pk), tmp_path=tmp_path))
    pipeline.refresh_from_db()
    assert pipeline.current_stage == 1 and pipeline.result_run == first
    assert sent_tasks.calls[-1] == (pipelines.EXPORT_STAGE_TASK, [pipeline.pk, 1], "train")
    assert pipelines.export_stage_start(pipeline_pk=pipeline.pk, stage=1) == (first, {"quantize": "int4"})


def test_cancelling_a_pipeline_cancels_its_queued_stage_and_names_who(team, catalog, sent_tasks, tmp_path):
    """A pipeline had no cancel of its own: messages told people to "cancel the pipeline", and the only way was to
    find its current stage's run and cancel that."""
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog), user=team.teammate)
    first = pipeline.runs.get()
    cancelled = pipelines.pipeline_cancel(pipeline=pipeline, user=team.owner)
    assert cancelled.status == PipelineStatus.CANCELLED and cancelled.finished_at is not None
    assert cancelled.message == (f"cancelled by alpha-owner at stage 1 (\u2068sft\u2069); its run \u2068chain · stage 1 ("
                                 f"sft)\u2069 ({first.public_id}) was taken out of the queue")
    first.refresh_from_db()
    assert first.status == RunStatus.CANCELLED and first.error_message == "cancelled by alpha-owner before it started"
    pipeline.refresh_from_db()
    assert pipeline.message == cancelled.message  # not replaced by the run's own cancel reaching pipeline_advance
    with pytest.raises(ValidationError) as refused:
        pipelines.pipeline_cancel(pipeline=pipeline, user=team.owner)
    assert refused.value.messages == [f"pipeline \u2068chain\u2069 ({pipeline.public_id}) has already ended "
                                      "(cancelled); only a running pipeline can be cancelled"]


def test_cancelling_a_pipeline_stops_its_training_stage_and_starts_no_other(team, catalog, sent_tasks, tmp_path,
                                                                          resumable):
    """The message is kept once the run has stopped: it said the run "stops after its current step" while the
    table beside it said cancelled; it says what was done, true before and after."""
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog, stages=3),
                                         user=team.teammate)
    first = finish(pipeline.runs.get(), tmp_path=tmp_path)
    pipelines.pipeline_advance(run=first)
    second = Run.objects.get(pipeline=pipeline, pipeline_stage=1)
    Run.objects.filter(pk=second.pk).update(status=RunStatus.RUNNING)
    cancelled = pipelines.pipeline_cancel(pipeline=pipeline, user=team.teammate)
    assert cancelled.message == (f"cancelled by alpha-teammate at stage 2 (\u2068dpo-1\u2069); its run \u2068chain · "
                                 f"stage 2 (dpo-1)\u2069 ({second.public_id}) was asked to stop after its current step; the result stays "
                                 f"\u2068chain · stage 1 (sft)\u2069 ({first.public_id})")
    second.refresh_from_db()
    assert second.status == RunStatus.RUNNING and second.cancel_requested
    # Even should the stage still succeed (its last step was under way), the pipeline stays cancelled.
    pipelines.pipeline_advance(run=finish(second, tmp_path=tmp_path))
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.CANCELLED and pipeline.result_run == first
    assert not Run.objects.filter(pipeline=pipeline, pipeline_stage=2).exists()


def test_cancelling_a_pipeline_drops_an_export_not_started_and_waits_for_one_writing(
        team, catalog, sent_tasks, tmp_path, django_capture_on_commit_callbacks):
    pipeline = pipelines.pipeline_create(project=team.project, document=export_document(catalog), user=team.teammate)
    first = pipeline.runs.get()
    with django_capture_on_commit_callbacks(execute=True):
        pipelines.pipeline_advance(run=finish(first, tmp_path=tmp_path))
    cancelled = pipelines.pipeline_cancel(pipeline=pipeline, user=team.teammate)
    assert cancelled.message == (f"cancelled by alpha-teammate at stage 2 (\u2068serve\u2069); its export was not "
                                 f"started; the result stays \u2068chain · stage 1 (sft)\u2069 ({first.public_id})")
    assert pipelines.export_stage_start(pipeline_pk=pipeline.pk, stage=1) is None  # the worker drops its message
    assert Run.objects.get(pk=first.pk).status == RunStatus.SUCCEEDED  # the run it would have quantized is kept

    writing = pipelines.pipeline_create(project=team.project, document=export_document(catalog), user=team.teammate)
    with django_capture_on_commit_callbacks(execute=True):
        pipelines.pipeline_advance(run=finish(writing.runs.get(), tmp_path=tmp_path))
    assert pipelines.export_stage_start(pipeline_pk=writing.pk, stage=1) is not None  # a worker took it
    with pytest.raises(ValidationError) as refused:
        pipelines.pipeline_cancel(pipeline=writing, user=team.teammate)
    assert refused.value.messages == [
        f"pipeline \u2068chain\u2069 ({writing.public_id}) cannot be cancelled now: stage 2 (\u2068serve\u2069) is "
        "writing the serving copy of its model, which cannot be stopped midway; wait for it to end (its page shows "
        "when)"]
    writing.refresh_from_db()
    assert writing.status == PipelineStatus.RUNNING


def test_the_pipeline_page_cancels_for_members_only(team, catalog, sent_tasks, client_for):
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog), user=team.teammate)
    address = f"/p/alpha/pipelines/{pipeline.public_id}/"
    assert 'id="pipeline-cancel"' not in client_for(team.viewer).get(address).content.decode()
    assert client_for(team.viewer).post(f"{address}cancel/").status_code == 403
    client = client_for(team.teammate)
    page = client.get(address).content.decode()
    assert f'action="{address}cancel/"' in page and ">Cancel pipeline</button>" in page
    token = re.search(r'name="submission_token" value="([^"]+)"', page).group(1)
    response = client.post(f"{address}cancel/", {"submission_token": token})
    assert response.status_code == 302 and response["Location"] == address
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.CANCELLED and "cancelled by alpha-teammate" in pipeline.message
    page = client.get(address).content.decode()
    assert "Pipeline \u2068chain\u2069 cancelled." in page and 'id="pipeline-cancel"' not in page
    # Not "no stage succeeded and passed its guard", which a cancelled pipeline's page said of its result.
    assert "none: cancelled before a stage gave one" in page and "passed its guard" not in page
    again = client.post(f"{address}cancel/", {"submission_token": token})  # the same form sent twice: no error
    assert again["Location"] == address and "already ended" not in client.get(address).content.decode()
    refused = client.post(f"{address}cancel/", follow=True).content.decode()
    assert "has already ended (cancelled); only a running pipeline can be cancelled" in refused


def test_resuming_the_stage_of_a_pipeline_a_person_cancelled_leaves_the_pipeline_cancelled(
        team, catalog, sent_tasks, tmp_path, resumable, client_for):
    """The pipeline kept no record of who cancelled it: resuming its cancelled stage's run took it on again, and the
    stages the person had cancelled were launched when the run ended."""
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog), user=team.teammate)
    first = pipeline.runs.get()
    pipelines.pipeline_cancel(pipeline=pipeline, user=team.owner)
    pipeline.refresh_from_db()
    assert pipeline.cancelled_by == "alpha-owner"
    cancelled_message = pipeline.message
    resumable.run_resume(run=Run.objects.get(pk=first.pk), user=team.teammate)
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.CANCELLED and pipeline.message == cancelled_message
    note = ("pipeline \u2068chain\u2069 was cancelled by \u2068alpha-owner\u2069 and stays cancelled: resumed, this run "
            "trains alone, and no later stage starts when it ends; launch the pipeline again to run them")
    assert Run.objects.get(pk=first.pk).status == RunStatus.QUEUED
    assert first.log_lines.filter(message=note).exists()
    assert escape(note) in client_for(team.teammate).get(f"/p/alpha/runs/{first.public_id}/").content.decode()
    pipelines.pipeline_advance(run=finish(Run.objects.get(pk=first.pk), tmp_path=tmp_path))
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.CANCELLED and pipeline.result_run is None
    assert not Run.objects.filter(pipeline=pipeline, pipeline_stage=1).exists()


def test_a_pipeline_cancelled_by_its_stages_run_follows_the_resumed_run(team, catalog, sent_tasks, tmp_path,
                                                                       resumable, client_for):
    """Only the pipeline's own cancel keeps it cancelled: its stage's run cancelled alone ends it cancelled too, and
    a resume of that run takes it on again, as a failed stage's does."""
    pipeline = pipelines.pipeline_create(project=team.project, document=document(catalog), user=team.teammate)
    first = pipeline.runs.get()
    resumable.run_cancel(run=first, user=team.owner)
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.CANCELLED and pipeline.cancelled_by == ""
    page = client_for(team.teammate).get(f"/p/alpha/runs/{first.public_id}/").content.decode()
    assert "stays cancelled" not in page
    resumable.run_resume(run=Run.objects.get(pk=first.pk), user=team.teammate)
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.RUNNING
    pipelines.pipeline_advance(run=finish(Run.objects.get(pk=first.pk), tmp_path=tmp_path))
    pipeline.refresh_from_db()
    assert pipeline.current_stage == 1 and pipeline.result_run == first


def test_the_export_figures_say_why_quality_was_not_measured(team, catalog, sent_tasks, tmp_path, client_for):
    """A last training stage without data.eval (the New pipeline page's own dpo stage) gets a copy with no
    perplexity and no greedy agreement: the page showed its size and directory and said nothing of them."""
    import json

    pipeline = pipelines.pipeline_create(project=team.project, document=export_document(catalog), user=team.teammate)
    first = finish(pipeline.runs.get(), tmp_path=tmp_path)
    pipelines.pipeline_advance(run=first)
    copy = first.output_dir / "export" / "quantized"
    copy.mkdir(parents=True)
    description = {"scheme": "int4", "bits": 4, "group_size": 64, "model_bytes": 3 * 2**20,
                   "bfloat16_bytes": 10 * 2**20, "ratio_to_bfloat16": 0.3}
    (copy / "quantization.json").write_text(json.dumps(description))
    pipelines.export_stage_finish(pipeline_pk=pipeline.pk, stage=1, description=description)
    page = client_for(team.viewer).get(f"/p/alpha/pipelines/{pipeline.public_id}/").content.decode()
    assert 'id="pipeline-export"' in page
    assert ("<tr><th>Quality</th><td>not measured: stage 1 (\u2068sft\u2069) has no evaluation data (data.eval); give it some "
            "to see the copy&#x27;s perplexity and greedy agreement against the unquantized model</td></tr>") in page


@pytest.mark.parametrize("case", ["another project's folder", "unregistered"])
def test_a_stage_naming_a_model_that_cannot_be_loaded_is_refused_at_creation_naming_the_stage_and_field(
        team, catalog, sent_tasks, client_for, settings, tmp_path, case):
    """A pipeline whose stage names a base model the project may not load (its directory now in another project's
    folder) or one unregistered is refused when it is created, on the form and in the API, under the stage's key
    (``stages.0.spec.model``) in the launch's words, with nothing started."""
    import json

    from django.test import Client

    from tests.webapp.factories import make_base_model, write_model_dir
    from webapp.api.services import token_create
    from webapp.basemodels.models import BaseModel
    from webapp.basemodels.selectors import base_model_refusal

    settings.MODELS_ROOT = tmp_path / "models"
    secret = write_model_dir(settings.MODELS_ROOT / "projects" / "alpha-elsewhere" / "secret-ft").resolve()
    model = make_base_model(team.project, name="borrowed", path=str(secret))
    doc = document(catalog, stages=2)
    doc["stages"][0]["spec"]["model"] = model.public_id
    if case == "unregistered":
        words = f"{model.public_id!r} is not a base model of alpha"
        BaseModel.objects.filter(pk=model.pk).delete()
    else:
        words = base_model_refusal(base_model=model)
        assert "does not exist" in words and "register it again from there" in words
    form = client_for(team.teammate).post("/p/alpha/pipelines/new/", {"document": yaml.safe_dump(doc)})
    assert form.status_code == 400
    assert f"<li><code>stages.0.spec.model</code>: {escape(words)}</li>" in form.content.decode()
    _token, secret_key = token_create(user=team.teammate, name="pipelines")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {secret_key}").post(
        "/api/v1/projects/alpha/pipelines/", json.dumps(doc), content_type="application/json")
    assert api.status_code == 400 and api.json()["errors"] == {"stages.0.spec.model": [words]}
    assert not Pipeline.objects.exists() and not Run.objects.exists() and sent_tasks.calls == []


def test_a_stage_whose_reward_model_became_unusable_after_creation_fails_at_its_launch_in_the_same_words(
        team, catalog, sent_tasks, tmp_path):
    """What a later stage names may change after the pipeline was made (here its reward run trained further, so it
    has no exported model while it runs): the stage then fails at its launch, in the words creation gives it."""
    reward = succeeded_reward_run(team, catalog, tmp_path)
    doc = scoring_document(catalog, reward)
    pipeline = pipelines.pipeline_create(project=team.project, document=doc, user=team.teammate)
    Run.objects.filter(pk=reward.pk).update(status=RunStatus.RUNNING)
    with pytest.raises(ValidationError) as caught:
        pipelines.pipeline_create(project=team.project, document=doc, user=team.teammate)
    [words] = caught.value.message_dict["stages.1.spec.grpo.rewards.0.args.model"]
    assert words == f"run {reward.public_id} has no exported reward model (it is running)"
    pipelines.pipeline_advance(run=finish(pipeline.runs.get(), tmp_path=tmp_path))
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.FAILED
    assert pipeline.message.startswith(f"stage 2 could not start: {words}; the result stays")


def succeeded_reward_run(team, catalog, tmp_path) -> Run:
    """A succeeded reward run ("judge", 10 steps) with its exported model."""
    from webapp.runs import services
    from webapp.runs.models import Artifact

    reward = services.run_create(project=team.project, user=team.teammate, name="judge", spec={
        "task": "reward", "model": catalog.base_model.public_id, "data": {"train": catalog.preference.public_id},
        "train": {"max_steps": 10, "batch_size": 2}})
    Run.objects.filter(pk=reward.pk).update(status=RunStatus.SUCCEEDED, current_step=10)
    Artifact.objects.create(run=reward, kind=ArtifactKind.MODEL, step=10, path=str(tmp_path / "reward-export"))
    with_checkpoint(reward, 10)
    return Run.objects.get(pk=reward.pk)


def scoring_document(catalog, reward: Run) -> dict:
    """A pipeline of an sft stage, then a grpo stage that scores with ``reward``."""
    doc = document(catalog, stages=1)
    doc["stages"].append({"name": "rl", "spec": {
        "task": "grpo", "data": {"train": catalog.prompts.public_id}, "train": {"max_steps": 5, "batch_size": 2},
        "grpo": {"num_generations": 2, "rewards": [{"name": "reward_model", "args": {"model": reward.public_id}}]}}})
    return doc


def reward_run_and_its_pipeline(team, catalog, tmp_path):
    """A succeeded reward run, and a running pipeline whose second stage (not launched yet) scores with it."""
    reward = succeeded_reward_run(team, catalog, tmp_path)
    pipeline = pipelines.pipeline_create(project=team.project, document=scoring_document(catalog, reward),
                                         user=team.teammate)
    return Run.objects.get(pk=reward.pk), pipeline


def test_a_reward_run_a_running_pipelines_later_stage_scores_with_is_not_resumed(team, catalog, sent_tasks, tmp_path,
                                                                                 resumable):
    """Trained further while a pipeline's later stage counted on it, a reward run had no export when the stage
    launched, which then failed ("has no exported reward model"), and once it ended it scored with other weights
    than the pipeline was made with. Its resume is refused, naming the pipeline and stage, until the pipeline ends."""
    reward, pipeline = reward_run_and_its_pipeline(team, catalog, tmp_path)
    words = (f"run {reward.public_id} cannot be resumed while a running pipeline is to score with its reward model: "
             f"pipeline \u2068chain\u2069 ({pipeline.public_id}), its stage 2 (\u2068rl\u2069). That stage starts once "
             "the stages before it end, from this run's exported model, which a resumed run has none of until it ends "
             "(the stage would fail at its launch) and then replaces with other weights. Resume it once the pipeline "
             "has ended, or cancel the pipeline first")
    with pytest.raises(ValidationError) as refused:
        resumable.run_resume(run=reward, user=team.teammate, max_steps=20)
    assert refused.value.messages == [words]
    assert resumable.rerun_refusals(reward) == {"resume": words, "retry": ""}  # a retry is a new run: no harm
    reward.refresh_from_db()
    assert (reward.status, reward.attempt, reward.total_steps) == (RunStatus.SUCCEEDED, 1, 10)
    pipelines.pipeline_advance(run=finish(pipeline.runs.get(), tmp_path=tmp_path))
    pipeline.refresh_from_db()
    stage = pipeline.runs.get(pipeline_stage=1)
    assert pipeline.status == PipelineStatus.RUNNING and stage.status == RunStatus.QUEUED  # it launched
    # Launched, the stage is a run scored by it: the resume stays refused, now for that run.
    assert resumable.rerun_refusals(reward)["resume"].startswith(
        f"run {reward.public_id} cannot be resumed: runs {isolated(stage.name)} ({stage.public_id}) use its final model")


def test_a_reward_run_is_resumed_once_the_pipeline_counting_on_it_has_ended(team, catalog, sent_tasks, tmp_path,
                                                                           resumable):
    """Only a running pipeline holds the run: cancelled before its later stage launched, it no longer does."""
    reward, pipeline = reward_run_and_its_pipeline(team, catalog, tmp_path)
    other = pipelines.pipeline_create(project=team.project, document=document(catalog), user=team.teammate)
    assert pipelines.stages_counting_on(reward) == [(pipeline, 1)]  # not the pipeline that names it nowhere
    assert pipelines.stages_counting_on(Run.objects.get(pk=other.runs.get().pk)) == []
    pipelines.pipeline_cancel(pipeline=pipeline, user=team.teammate)
    assert resumable.rerun_refusals(reward) == {"resume": "", "retry": ""}
    assert resumable.run_resume(run=reward, user=team.teammate, max_steps=20).status == RunStatus.QUEUED


def test_the_run_page_greys_the_resume_a_pipeline_refuses_and_links_it(team, catalog, sent_tasks, tmp_path,
                                                                       client_for, django_capture_on_commit_callbacks):
    """Train further was offered on the reward run's page and refused once pressed (in the web form and the REST
    API): greyed now, with the refusal's words and a link to the pipeline; pressed all the same, refused in them."""
    import json

    from django.test import Client
    from django.urls import reverse

    from webapp.api.services import token_create

    reward, pipeline = reward_run_and_its_pipeline(team, catalog, tmp_path)
    pipeline_url = f"/p/alpha/pipelines/{pipeline.public_id}/"
    page = client_for(team.teammate).get(f"/p/alpha/runs/{reward.public_id}/").content.decode()
    assert 'id="resume-refused">Train further</button>' in page
    assert f'action="/p/alpha/runs/{reward.public_id}/resume/"' not in page
    words = pipelines.counted_on_refusal(reward)
    assert (f'<p class="card run-message" id="resume-refusal">Train further: {escape(words)} '
            f'<a href="{pipeline_url}">Open pipeline <bdi>chain</bdi></a></p>') in page
    assert f'action="/p/alpha/runs/{reward.public_id}/retry/"' in page
    response = client_for(team.teammate).post(reverse("runs:resume", args=["alpha", reward.public_id]),
                                              {"max_steps": "20"}, follow=True)
    assert [str(message) for message in response.context["messages"]] == [words]
    _token, secret = token_create(user=team.teammate, name="resume")
    with django_capture_on_commit_callbacks(execute=True):
        answer = Client(HTTP_AUTHORIZATION=f"Bearer {secret}").post(
            f"/api/v1/projects/alpha/runs/{reward.public_id}/resume/", json.dumps({"max_steps": 20}),
            content_type="application/json")
    assert answer.status_code == 400 and answer.json()["errors"] == {"__all__": [words]}
    assert Run.objects.get(pk=reward.pk).status == RunStatus.SUCCEEDED
    pipelines.pipeline_cancel(pipeline=pipeline, user=team.teammate)
    page = client_for(team.teammate).get(f"/p/alpha/runs/{reward.public_id}/").content.decode()
    assert 'id="resume-refus' not in page and f'action="/p/alpha/runs/{reward.public_id}/resume/"' in page
