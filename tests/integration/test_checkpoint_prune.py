"""The Storage page's project-wide prune, queued by the web and run by a real ``default`` Celery worker over a real
Redis: the ended run keeps its newest checkpoint, the active one is left as it was."""
import pytest
from django.test import Client
from django.utils import timezone

from tests.live import wait_for
from tests.webapp.factories import form_token, make_team, write_bytes
from webapp.runs.models import Run, RunStatus
from webapp.runs.services import checkpoint_steps, run_output_dir

pytestmark = pytest.mark.integration


def run_with_checkpoints(team, name, status, steps):
    run = Run(project=team.project, name=name, task="sft", spec={}, status=status, started_at=timezone.now(),
              created_by=team.owner)
    run.resolved_spec = {"output_dir": str(run_output_dir(run.public_id))}
    run.save()
    for step in steps:
        write_bytes(run.output_dir / "checkpoints" / str(step) / "state" / "shard", 4096)
    return run


def test_the_worker_prunes_the_ended_runs_and_skips_the_active_ones(default_worker):
    team = make_team()
    ended = run_with_checkpoints(team, "ended", RunStatus.FAILED, (10, 20, 30))
    running = run_with_checkpoints(team, "running", RunStatus.RUNNING, (10, 20))
    client = Client()
    client.force_login(team.owner)
    page = client.get("/p/alpha/storage/").content.decode()
    response = client.post("/p/alpha/storage/prune/", {"submission_token": form_token(page, after='id="storage-prune"')})
    assert response.status_code == 302
    wait_for(lambda: checkpoint_steps(ended) == [30], timeout=30, workers=default_worker,
             what="the worker to prune the ended run")
    assert not [path for path in ended.output_dir.iterdir() if path.name.startswith(".deleting-checkpoint-")]
    assert checkpoint_steps(running) == [10, 20]
