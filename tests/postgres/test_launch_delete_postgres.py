"""A launch and the deletion of its data at the same instant on PostgreSQL
(``webapp.runs.services._lock_what_it_reads``): whichever locks the version first wins, and the other is
refused in words; before, each saw the other not there, and the launch failed at its commit on the foreign key
(a server error). Likewise a resume and the unregistering of the base model it trains from. SQLite's writes run one
at a time, so only PostgreSQL shows it."""
from __future__ import annotations

import pytest

from tests.postgres.test_postgres import RACE_PREAMBLE, run_django

pytestmark = pytest.mark.integration

LAUNCH_AND_DELETE_SCRIPT = RACE_PREAMBLE + """
from tests.webapp.factories import make_base_model, make_ready_version
from webapp.datasets import services as dataset_services
from webapp.datasets.models import DatasetVersion
from webapp.runs import services
from webapp.runs.models import Run

celery_app.send_task = lambda *args, **kwargs: None  # no broker here: what is queued is not the question
owner = get_user_model().objects.create_user("owner", password="unused-password")
project = project_services.project_create(name="PG", slug="pg", owner=owner)
base_model = make_base_model(project)


def race(first, name):
    '''Launch a run on a new version while another thread deletes the version; ``first`` is "delete" (it
    commits between the launch's planning and its save) or "launch" (the launch holds its locks a moment
    while the deletion comes in). Returns (launch outcome, deletion outcome).'''
    version = make_ready_version(project, name=name)
    spec = {"task": "sft", "model": base_model.public_id, "data": {"train": version.public_id},
            "train": {"max_steps": 2}}
    reached, released = threading.Event(), threading.Event()
    real_plan, real_lock = services.plan_run, services._lock_what_it_reads

    def plan_then_wait(**kwargs):
        plan = real_plan(**kwargs)
        if first == "delete":
            reached.set()
            released.wait(10)
        return plan

    def lock_then_hold(**kwargs):
        real_lock(**kwargs)
        if first == "launch":
            reached.set()
            time.sleep(0.5)  # the deletion is now waiting for this launch's locks

    services.plan_run, services._lock_what_it_reads = plan_then_wait, lock_then_hold
    outcome = {}

    def launch():
        outcome["launch"] = outcome_of(lambda: services.run_create(project=project, spec=spec, user=owner),
                                       made=lambda run: run.public_id)

    def delete():
        reached.wait(10)
        outcome["delete"] = outcome_of(lambda: dataset_services.dataset_version_delete(
            version=DatasetVersion.objects.get(pk=version.pk)))
        released.set()

    run_together(launch, delete)
    services.plan_run, services._lock_what_it_reads = real_plan, real_lock
    return outcome["launch"], outcome["delete"]


launched, deleted = race("delete", "deleted first")
assert deleted == ("made", ""), deleted
assert launched[0] == "refused" and "deleted first v1 was deleted as the run was being launched" in launched[1], launched
assert not Run.objects.exists()

launched, deleted = race("launch", "launched first")
assert launched[0] == "made", launched
assert deleted[0] == "refused" and f"({launched[1]}) is queued with it" in deleted[1], deleted
assert DatasetVersion.objects.filter(dataset__name="launched first").exists()
print("ok")
"""


def test_a_launch_and_the_deletion_of_its_data_at_once_end_in_one_refusal_not_an_error(database_url, tmp_path):
    assert run_django(LAUNCH_AND_DELETE_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


LAUNCH_AND_RESUME_SCRIPT = RACE_PREAMBLE + """
from tests.webapp.factories import make_base_model, make_ready_version
from webapp.runs import services
from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

celery_app.send_task = lambda *args, **kwargs: None
owner = get_user_model().objects.create_user("scorer-owner", password="unused-password")
project = project_services.project_create(name="PG scorer", slug="pg-scorer", owner=owner)
base_model = make_base_model(project)
pairs = make_ready_version(project, name="pairs", kind="preference", rows=[{"prompt": "p", "chosen": "a", "rejected": "b"}])
prompts = make_ready_version(project, name="asks", kind="prompts", rows=[{"prompt": "2+2?", "answer": "4"}])


def race(first, name):
    '''A succeeded reward run; one thread launches a GRPO run scoring with it while another trains it further.
    ``first``: "launch" (its plan read the reward run, then the resume comes in before its save) or "resume" (it
    holds a moment once past its checks while the launch comes in). Returns (launch, resume, the reward run).'''
    reward = services.run_create(project=project, user=owner, name=f"scorer {name}", spec={
        "task": "reward", "model": base_model.public_id, "data": {"train": pairs.public_id},
        "train": {"max_steps": 2, "batch_size": 2}})
    Run.objects.filter(pk=reward.pk).update(status=RunStatus.SUCCEEDED, current_step=2)
    Artifact.objects.create(run=reward, kind=ArtifactKind.MODEL, step=2, path=str(reward.output_dir / "export"))
    # The folders a succeeded run keeps: a launch scoring with it reads its export, a resume its checkpoints.
    (reward.output_dir / "export").mkdir(parents=True)
    (reward.output_dir / "checkpoints" / "2").mkdir(parents=True)
    (reward.output_dir / "checkpoints" / "2" / "state").write_text("weights")  # not left empty: that one is incomplete
    spec = {"task": "grpo", "model": base_model.public_id, "data": {"train": prompts.public_id},
            "train": {"max_steps": 2, "batch_size": 2},
            "grpo": {"num_generations": 2, "rewards": [{"name": "reward_model", "args": {"model": reward.public_id}}]}}
    reached = threading.Event()
    real_plan, real_refuse = services.plan_run, services._refuse_while_files_written

    def plan_then_hold(**kwargs):
        plan = real_plan(**kwargs)
        if first == "launch":
            reached.set()
            time.sleep(0.5)  # the resume now comes in and commits
        return plan

    def refuse_then_hold(checked):
        real_refuse(checked)
        if first == "resume":
            reached.set()
            time.sleep(0.5)  # the launch now comes in
    services.plan_run, services._refuse_while_files_written = plan_then_hold, refuse_then_hold
    outcome = {}

    def launch():
        if first != "launch":
            reached.wait(10)
        outcome["launch"] = outcome_of(lambda: services.run_create(project=project, spec=spec, user=owner, name=name))

    def resume():
        if first != "resume":
            reached.wait(10)
            time.sleep(0.1)
        outcome["resume"] = outcome_of(lambda: services.run_resume(run=Run.objects.get(pk=reward.pk), user=owner,
                                                                   max_steps=4))

    run_together(launch, resume)
    services.plan_run, services._refuse_while_files_written = real_plan, real_refuse
    return outcome["launch"], outcome["resume"], Run.objects.get(pk=reward.pk)


for first in ("launch", "resume"):
    launched, resumed, reward = race(first, f"{first} first")
    assert resumed == ("made", ""), (first, resumed)
    assert launched[0] == "refused" and f"run {reward.public_id} has no exported reward model (it is queued)" in launched[1], (
        first, launched)
    assert not Run.objects.filter(project=project, task="grpo").exists(), first
print("ok")
"""


def test_a_launch_and_a_resume_of_the_reward_run_it_scores_with_at_once_never_both_go_ahead(database_url,
                                                                                             tmp_path):
    """The launch read its reward run in plan_run, before any lock: a resume committed before its save set the run
    queued again, and the launch still went ahead, queued to score with a model being trained anew. The runs it reads
    are judged again once locked (``services._lock_what_it_reads``)."""
    assert run_django(LAUNCH_AND_RESUME_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


RESUME_AND_MODEL_DELETE_SCRIPT = RACE_PREAMBLE + """
from tests.webapp.factories import make_base_model, make_ready_version
from webapp.basemodels import services as base_model_services
from webapp.basemodels.models import BaseModel
from webapp.runs import pipelines, services
from webapp.runs.models import Run, RunStatus

celery_app.send_task = lambda *args, **kwargs: None
owner = get_user_model().objects.create_user("resume-owner", password="unused-password")
project = project_services.project_create(name="PG resume", slug="pg-resume", owner=owner)
chats = make_ready_version(project, name="chats")


def race(first):
    '''A succeeded run trained further while another thread unregisters its base model (whose folder is gone with
    it); ``first`` is "delete" (it holds a moment once its check answered) or "resume" (it holds a moment once its
    run is saved queued, uncommitted). Returns (resume outcome, deletion outcome, the run).'''
    base_model = make_base_model(project, name=f"model {first}", path=f"/models/gone-{first}")
    run = services.run_create(project=project, user=owner, name=f"{first} first", spec={
        "task": "sft", "model": base_model.public_id, "data": {"train": chats.public_id}, "train": {"max_steps": 2}})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=2)
    outcome = race_in_order(
        first, readers=(base_model_services, "base_model_readers"), lock=(pipelines, "pipeline_follow_resume"),
        delete=lambda: outcome_of(lambda: base_model_services.basemodel_unregister(
            base_model=BaseModel.objects.get(pk=base_model.pk))),
        act=("resume", lambda: outcome_of(lambda: services.run_resume(run=Run.objects.get(pk=run.pk), user=owner,
                                                                      max_steps=4))))
    return outcome["resume"], outcome["delete"], Run.objects.get(pk=run.pk)


resumed, deleted, run = race("delete")
assert deleted == ("made", ""), deleted
assert resumed == ("refused", f"what run {run.public_id} trains on was deleted since (its starting model "
                              f"{run.spec['model']}): duplicate it to choose another"), resumed
assert run.status == RunStatus.SUCCEEDED, run.status

resumed, deleted, run = race("resume")
assert resumed == ("made", ""), resumed
assert deleted == ("refused", f"run \\u2068resume first\\u2069 ({run.public_id}) is queued from it; cancel it or wait "
                              "for it to finish"), deleted
assert run.status == RunStatus.QUEUED and BaseModel.objects.filter(name="model resume").exists()
print("ok")
"""


def test_a_resume_and_the_unregistering_of_its_model_at_once_never_both_go_ahead(database_url, tmp_path):
    """The unregistering locked the model's row alone, which a resume does not read: a resume under way as the
    model went was queued all the same (each saw the other not there), to fail in the train worker on a folder
    deleted with it. It now locks the project's row first, as a resume does (``projects.services.project_lock``)."""
    assert run_django(RESUME_AND_MODEL_DELETE_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"
