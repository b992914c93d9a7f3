"""A run launched in the web app whose data turns out bad at training time: the train task tells the engine where the
run came from (``Entry.LAUNCH``), so the run's error and its page advise the launch form's settings (the dataset
version, its Column mapping), not a job spec's data.columns, which a user of the web never wrote. The command line's
spec wording stays (tests/jaxengine/test_job.py::test_cli_data_errors_name_what_the_spec_can_set)."""
import html

import pytest
from django.test import Client

from tests import factories
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.runs import services
from webapp.runs.models import Run, RunStatus
from worker.tasks import train

GOOD_CHAT = {"prompt": "Hello there", "completion": " general"}
# A row whose completion came under another column name: its advice names where a column mapping is set.
RENAMED_CHAT = {"prompt": "a b c", "reply": " d e"}
LAUNCH_ADVICE = "(map a differently named column to it: the Column mapping of a new version of the dataset, uploaded again)"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-launch-words"))


def _spec(task: str, base, train_version, eval_version=None) -> dict:
    data = {"train": train_version.public_id, "max_seq_len": 64}
    if eval_version is not None:
        data["eval"] = eval_version.public_id
    spec = {"task": task, "model": base.public_id, "data": data, "train": {"max_steps": 1, "batch_size": 2}}
    if task == "grpo":
        spec["grpo"] = {"num_generations": 2, "max_new_tokens": 4, "rewards": [{"name": "exact_match"}]}
    return spec


@pytest.mark.parametrize("case", ["sft data.train", "sft data.eval", "grpo data.train"])
def test_a_web_launched_run_with_a_bad_row_fails_with_the_launch_forms_words(transactional_db, settings, redis_url,
                                                                            model_dir, monkeypatch, case):
    settings.REDIS_URL = redis_url  # the run's reporter publishes to a real Redis; its thread writes the database
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team()
    base = make_base_model(team.project, path=str(model_dir))
    if case == "grpo data.train":
        bad_rows = [{"prompt": "2 + 2?", "answer": "4"}, {"question": "3 + 3?", "answer": "6"}]
        bad = make_ready_version(team.project, name="questions", kind="prompts", rows=bad_rows)
        spec = _spec("grpo", base, bad)
    else:
        good = make_ready_version(team.project, name="chats", rows=[GOOD_CHAT, GOOD_CHAT])
        bad = make_ready_version(team.project, name="odd-chats", rows=[GOOD_CHAT, RENAMED_CHAT])
        spec = _spec("sft", base, bad) if case == "sft data.train" else _spec("sft", base, good, bad)
    run = services.run_create(project=team.project, spec=spec, user=team.owner)
    assert run.status == RunStatus.QUEUED

    train.train_run(run.pk, run.attempt)

    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.FAILED
    # The version by its name (reporting.in_project_terms), the row, and the advice for the web.
    assert run.error_message.startswith(f"DataError: {bad}: line 2, row 2, field "), run.error_message
    assert run.error_message.endswith(LAUNCH_ADVICE), run.error_message
    assert "data.columns" not in run.error_message and "job spec" not in run.error_message
    client = Client()
    client.force_login(team.owner)
    page = client.get(f"/p/{team.project.slug}/runs/{run.public_id}/").content.decode()
    assert html.escape(LAUNCH_ADVICE) in page and "data.columns in the job spec" not in page
