"""A ready preference version in UltraFeedback's layout (HuggingFaceH4/ultrafeedback_binarized: ``prompt`` a text,
``chosen`` and ``rejected`` whole conversations that begin with that user turn) trains: its rows are read with the
prompt once, as TRL's ``maybe_extract_prompt`` reads them (``formats.read_prompt_once``)."""
import pytest

from tests import factories
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.runs import services
from webapp.runs.models import MetricPoint, Run, RunStatus
from worker.tasks import train


def ultrafeedback_row(i: int) -> dict:
    question = f"What is {i} plus {i}?"
    return {"prompt": question,
            "chosen": [{"role": "user", "content": question}, {"role": "assistant", "content": f"It is {2 * i}."}],
            "rejected": [{"role": "user", "content": question}, {"role": "assistant", "content": f"It is {i}."}]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-ultrafeedback"))


def test_a_ready_version_in_ultrafeedbacks_layout_launches_a_dpo_run_that_trains(transactional_db, settings,
                                                                                redis_url, model_dir, monkeypatch):
    """Audit: commit 89b691ae refused such rows as prompt_repeated, so a version uploaded before it, ready, failed
    its run at the start ("starts with the prompt's turn again"), and a new upload of one of the most used
    preference datasets was refused."""
    settings.REDIS_URL = redis_url  # the run's reporter publishes to a real Redis; its thread writes the database
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team()
    base = make_base_model(team.project, path=str(model_dir))
    data = make_ready_version(team.project, name="ultrafeedback", kind="preference",
                              rows=[ultrafeedback_row(i) for i in range(6)])
    spec = {"task": "dpo", "model": base.public_id, "data": {"train": data.public_id, "max_seq_len": 64},
            "train": {"max_steps": 2, "batch_size": 2}, "dpo": {"beta": 0.1}}
    run = services.run_create(project=team.project, spec=spec, user=team.owner)
    assert run.status == RunStatus.QUEUED

    train.train_run(run.pk, run.attempt)

    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    assert run.current_step == 2 and run.summary["data"]["train"]["rows"] == 6
    assert list(MetricPoint.objects.filter(run=run, name="loss").values_list("step", flat=True)) == [1, 2]
