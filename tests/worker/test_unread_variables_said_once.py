"""A run started in the web app from a run's model whose chat template never reads one of that run's variables: the
launch leaves it out of the variables the new run renders with, and the engine leaves it out of the model's own
(the export's chat_template_kwargs.json, which keeps its run's variables). Each said so in the run's log, so one
variable was told twice, in two wordings; the run's log names it once now."""
import pytest

from tests import factories
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.runs import services
from webapp.runs.models import Run, RunStatus
from worker.tasks import train

CHAT = {"prompt": "Hello there", "completion": " general"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-unread"))


def trained(run: Run) -> Run:
    train.train_run(run.pk, run.attempt)
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    return run


def test_a_run_from_a_runs_model_names_a_variable_its_template_never_reads_once(transactional_db, settings, redis_url,
                                                                                model_dir, monkeypatch):
    settings.REDIS_URL = redis_url  # the run's reporter publishes to a real Redis; its thread writes the database
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team()
    base = make_base_model(team.project, path=str(model_dir))
    chats = make_ready_version(team.project, name="chats", rows=[CHAT, CHAT])

    def spec(model: str, **data) -> dict:
        return {"task": "sft", "model": model, "data": {"train": chats.public_id, "max_seq_len": 64, **data},
                "train": {"max_steps": 1, "batch_size": 2, "eval_samples": 0}}

    parent = trained(services.run_create(project=team.project, user=team.owner,
                                         spec=spec(base.public_id, chat_template_kwargs={"persona": "pirate"})))
    child = trained(services.run_create(project=team.project, user=team.owner, spec=spec(parent.public_id)))
    said = list(child.log_lines.filter(message__contains="persona").values_list("message", flat=True))
    assert said == [f"data.chat_template_kwargs: persona of {parent.public_id}'s variables not carried on: the model's "
                    "chat template never reads it"]
