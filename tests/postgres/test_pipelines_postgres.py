"""A pipeline stage's run resumed at the instant its pipeline moves on to its export stage, on PostgreSQL
(``pipelines.pipeline_advance`` locks the run, as ``run_resume`` does): whichever takes the run first wins, and
the other waits for it — a resume first leaves the pipeline waiting for the run, an advance first has the resume
refused while the export stage quantizes. Before, each read the other's rows as they were, and the export stage
quantized a run that trained again. SQLite's writes run one at a time, so only PostgreSQL shows it."""
from __future__ import annotations

import pytest

from tests.postgres.test_postgres import RACE_PREAMBLE, run_django

pytestmark = pytest.mark.integration

RESUME_AND_ADVANCE_SCRIPT = RACE_PREAMBLE + """
from tests.webapp.factories import make_base_model, make_ready_version
from webapp.runs import pipelines, services
from webapp.runs.models import Pipeline, Run, RunStatus

sent = []
celery_app.send_task = lambda name, args=None, **kwargs: sent.append((name, args))
owner = get_user_model().objects.create_user("owner", password="unused-password")
project = project_services.project_create(name="PG", slug="pg", owner=owner)
base_model, data = make_base_model(project), make_ready_version(project)


def race(first, name):
    '''A pipeline's training stage has just succeeded; one thread resumes its run while another moves the pipeline on
    to its export stage. ``first`` holds its locks a moment while the other comes in. Returns (resume outcome,
    the pipeline afterwards, the run afterwards).'''
    spec = {"task": "sft", "model": base_model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 2}}
    pipeline = pipelines.pipeline_create(project=project, user=owner, document={
        "name": name, "stages": [{"name": "sft", "spec": spec}, {"name": "serve", "export": {"quantize": "int8"}}]})
    run = pipeline.runs.get()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=2)
    sent.clear()
    reached = threading.Event()
    real_refuse, real_log_line = services._refuse_while_files_written, services.log_line

    def refuse_then_hold(checked):
        real_refuse(checked)
        if first == "resume":
            reached.set()
            time.sleep(0.5)  # the pipeline's advance now comes in

    def log_then_hold(logged, message, **kwargs):
        line = real_log_line(logged, message, **kwargs)
        if first == "advance" and "quantizing" in message:
            reached.set()
            time.sleep(0.5)  # the resume now comes in
        return line

    services._refuse_while_files_written, services.log_line = refuse_then_hold, log_then_hold
    outcome = {}

    def resume():
        if first != "resume":
            reached.wait(10)
        outcome["resume"] = outcome_of(lambda: services.run_resume(run=Run.objects.get(pk=run.pk), user=owner,
                                                                   max_steps=4))

    def advance():
        if first != "advance":
            reached.wait(10)
        try:
            pipelines.pipeline_advance(run=run)
        finally:
            connection.close()

    run_together(resume, advance)
    services._refuse_while_files_written, services.log_line = real_refuse, real_log_line
    return outcome["resume"], Pipeline.objects.get(pk=pipeline.pk), Run.objects.get(pk=run.pk)


resumed, pipeline, run = race("resume", "resumed first")
assert resumed == ("made", ""), resumed
assert run.status == RunStatus.QUEUED
# The pipeline waits for the resumed run: no export stage began on the weights the resume replaces.
assert pipeline.current_stage == 0 and pipeline.result_run_id is None, (pipeline.current_stage, pipeline.message)
assert [name for name, _args in sent] == [services.TRAIN_TASK], sent

resumed, pipeline, run = race("advance", "advanced first")
assert resumed[0] == "refused" and "is quantizing its model in its export stage" in resumed[1], resumed
assert run.status == RunStatus.SUCCEEDED
assert pipeline.current_stage == 1 and pipeline.result_run_id == run.pk
assert sent == [(pipelines.EXPORT_STAGE_TASK, [pipeline.pk, 1])], sent
assert pipelines.export_stage_start(pipeline_pk=pipeline.pk, stage=1)[0].pk == run.pk
print("ok")
"""


def test_a_resume_and_its_pipelines_advance_at_once_never_export_a_run_that_trains_again(database_url, tmp_path):
    assert run_django(RESUME_AND_ADVANCE_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


CANCEL_AND_ADVANCE_SCRIPT = RACE_PREAMBLE + """
from tests.webapp.factories import make_base_model, make_ready_version
from webapp.runs import pipelines, services
from webapp.runs.models import Pipeline, PipelineStatus, Run, RunStatus

sent = []
celery_app.send_task = lambda name, args=None, **kwargs: sent.append((name, args))
owner = get_user_model().objects.create_user("canceller", password="unused-password")
project = project_services.project_create(name="PG cancel", slug="pg-cancel", owner=owner)
base_model, data = make_base_model(project), make_ready_version(project)


def race(first, name):
    '''A pipeline's first training stage has just succeeded; one thread cancels the pipeline while another moves
    it on to its second stage. ``first`` holds its locks a moment while the other comes in. Returns (cancel
    outcome, the pipeline afterwards, its runs by stage afterwards).'''
    spec = {"task": "sft", "model": base_model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 2}}
    later = {"task": "sft", "data": {"train": data.public_id}, "train": {"max_steps": 2}}
    pipeline = pipelines.pipeline_create(project=project, user=owner, document={
        "name": name, "stages": [{"name": "one", "spec": spec}, {"name": "two", "spec": later}]})
    run = pipeline.runs.get()
    export = services.run_output_dir(run.public_id) / "export"
    export.mkdir(parents=True, exist_ok=True)
    (export / "config.json").write_text("{}")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    from webapp.runs import reporting
    reporting.run_finish(run=Run.objects.get(pk=run.pk),
                         summary={"status": "succeeded", "step": 2, "export": {"model": str(export)}})
    sent.clear()
    reached = threading.Event()
    real_launch, real_info = pipelines._launch_stage, pipelines.logger.info

    def launch_then_hold(*args, **kwargs):
        launched = real_launch(*args, **kwargs)
        if first == "advance":
            reached.set()
            time.sleep(0.5)  # the cancel now comes in
        return launched

    def info_then_hold(message, *args):
        real_info(message, *args)
        if first == "cancel" and args and "cancelled by" in str(args[-1]):
            reached.set()
            time.sleep(0.5)  # the advance now comes in

    pipelines._launch_stage, pipelines.logger.info = launch_then_hold, info_then_hold
    outcome = {}

    def cancel():
        if first != "cancel":
            reached.wait(10)
        outcome["cancel"] = outcome_of(lambda: pipelines.pipeline_cancel(pipeline=Pipeline.objects.get(pk=pipeline.pk),
                                                                         user=owner))

    def advance():
        if first != "advance":
            reached.wait(10)
        try:
            pipelines.pipeline_advance(run=Run.objects.get(pk=run.pk))
        finally:
            connection.close()

    run_together(cancel, advance)
    pipelines._launch_stage, pipelines.logger.info = real_launch, real_info
    runs = {stage.pipeline_stage: stage for stage in Run.objects.filter(pipeline=pipeline)}
    return outcome["cancel"], Pipeline.objects.get(pk=pipeline.pk), runs


# The cancel first: the advance waits for it, finds the pipeline cancelled and starts no second stage.
cancelled, pipeline, runs = race("cancel", "cancelled first")
assert cancelled == ("made", ""), cancelled
assert pipeline.status == PipelineStatus.CANCELLED and pipeline.current_stage == 0, (pipeline.status, pipeline.message)
assert sorted(runs) == [0] and runs[0].status == RunStatus.SUCCEEDED, runs
assert sent == [], sent

# The advance first: the cancel waits, sees the pipeline moved on, and cancels the second stage it launched.
cancelled, pipeline, runs = race("advance", "advanced first")
assert cancelled == ("made", ""), cancelled
assert pipeline.status == PipelineStatus.CANCELLED and pipeline.current_stage == 1, (pipeline.status, pipeline.message)
assert pipeline.message.startswith("cancelled by canceller at stage 2"), pipeline.message
assert runs[1].status == RunStatus.CANCELLED, runs[1].status
print("ok")
"""


def test_a_pipelines_cancel_and_its_advance_at_once_leave_no_stage_running(database_url, tmp_path):
    assert run_django(CANCEL_AND_ADVANCE_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


CREATE_AND_RESUME_SCRIPT = RACE_PREAMBLE + """
from tests.webapp.factories import make_base_model, make_ready_version
from webapp.runs import pipelines, services
from webapp.runs.models import Artifact, ArtifactKind, Pipeline, PipelineStatus, Run, RunStatus

sent = []
celery_app.send_task = lambda name, args=None, **kwargs: sent.append((name, args))
owner = get_user_model().objects.create_user("judge-owner", password="unused-password")
project = project_services.project_create(name="PG judge", slug="pg-judge", owner=owner)
base_model = make_base_model(project)
sft_data = make_ready_version(project, name="chats", kind="sft")
pairs = make_ready_version(project, name="pairs", kind="preference", rows=[{"prompt": "p", "chosen": "a", "rejected": "b"}])
prompts = make_ready_version(project, name="asks", kind="prompts", rows=[{"prompt": "2+2?", "answer": "4"}])


def race(first, name):
    '''A succeeded reward run; one thread creates a pipeline whose second stage scores with it while another trains
    it further. ``first`` holds a moment once past its checks while the other comes in. Returns (create outcome,
    resume outcome, the reward run afterwards).'''
    reward = services.run_create(project=project, user=owner, name=f"judge {name}", spec={
        "task": "reward", "model": base_model.public_id, "data": {"train": pairs.public_id},
        "train": {"max_steps": 2, "batch_size": 2}})
    Run.objects.filter(pk=reward.pk).update(status=RunStatus.SUCCEEDED, current_step=2)
    Artifact.objects.create(run=reward, kind=ArtifactKind.MODEL, step=2, path=str(reward.output_dir / "export"))
    # The folders a succeeded run keeps: a launch scoring with it reads its export, a resume its checkpoints.
    (reward.output_dir / "export").mkdir(parents=True)
    (reward.output_dir / "checkpoints" / "2").mkdir(parents=True)
    (reward.output_dir / "checkpoints" / "2" / "state").write_text("weights")  # not left empty: that one is incomplete
    document = {"name": name, "stages": [
        {"name": "sft", "spec": {"task": "sft", "model": base_model.public_id, "data": {"train": sft_data.public_id},
                                 "train": {"max_steps": 2}}},
        {"name": "rl", "spec": {"task": "grpo", "data": {"train": prompts.public_id},
                                "train": {"max_steps": 2, "batch_size": 2},
                                "grpo": {"num_generations": 2,
                                         "rewards": [{"name": "reward_model", "args": {"model": reward.public_id}}]}}}]}
    reached = threading.Event()
    real_check, real_refuse = pipelines._check_stages, services._refuse_while_files_written

    def check_then_hold(*args):
        real_check(*args)
        if first == "create":
            reached.set()
            time.sleep(0.5)  # the resume now comes in

    def refuse_then_hold(checked):
        real_refuse(checked)
        if first == "resume":
            reached.set()
            time.sleep(0.5)  # the pipeline's creation now comes in

    pipelines._check_stages, services._refuse_while_files_written = check_then_hold, refuse_then_hold
    outcome = {}

    def create():
        if first != "create":
            reached.wait(10)
        outcome["create"] = outcome_of(lambda: pipelines.pipeline_create(project=project, document=document,
                                                                         user=owner))

    def resume():
        if first != "resume":
            reached.wait(10)
        outcome["resume"] = outcome_of(lambda: services.run_resume(run=Run.objects.get(pk=reward.pk), user=owner,
                                                                   max_steps=4))

    run_together(create, resume)
    pipelines._check_stages, services._refuse_while_files_written = real_check, real_refuse
    return outcome["create"], outcome["resume"], Run.objects.get(pk=reward.pk)


# The creation first: the resume waits for it and is refused, naming the pipeline's stage that scores with the run.
created, resumed, reward = race("create", "created first")
assert created == ("made", ""), created
assert resumed[0] == "refused" and "a running pipeline is to score with its reward model" in resumed[1], resumed
assert reward.status == RunStatus.SUCCEEDED, reward.status
# The resume first: the creation waits for it and is refused, the run having no exported reward model now.
created, resumed, reward = race("resume", "resumed first")
assert resumed == ("made", ""), resumed
assert created[0] == "refused" and f"run {reward.public_id} has no exported reward model (it is queued)" in created[1], created
# (the other scripts here share the database: only this project's pipelines are counted)
assert list(Pipeline.objects.filter(project=project).values_list("name", "status")) == [
    ("created first", PipelineStatus.RUNNING)]
print("ok")
"""


def test_a_pipeline_and_a_resume_of_the_reward_run_it_scores_with_at_once_never_both_go_ahead(database_url,
                                                                                                tmp_path):
    """Its stages were checked before the project was locked: a resume of a reward run a later stage names, committed
    in between, left a running pipeline counting on a run with no export, whose stage then failed at its launch."""
    assert run_django(CREATE_AND_RESUME_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"
