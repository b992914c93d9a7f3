"""An evaluation whose serve worker was killed outright: its message is queued again once, the evaluation saying so
and starting over; one that killed two workers in turn fails with the reason and holds its model no more. A private
Redis and real kombu consumers killed with SIGKILL (tests/webapp/workers/test_deliveries.py's)."""
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.webapp.evals.conftest import create
from tests.webapp.workers.test_deliveries import broker, killed_twice, lost_once, worker_row  # noqa: F401 (a fixture)
from webapp.basemodels.selectors import base_model_readers
from webapp.evals import services
from webapp.evals.models import Evaluation, EvaluationStatus
from webapp.workers import deliveries


@pytest.fixture
def sent_tasks():  # the real send: these tests need the message in Redis
    return None


def test_a_lost_serve_worker_says_so_and_the_evaluation_starts_over(broker, team, base_model,  # noqa: F811
                                                                     prompts_version, client_for):
    evaluation = create(team, base_model, prompts_version)
    assert services.evaluation_start(evaluation_id=evaluation.pk) is not None
    held = lost_once(broker, services.EVALUATION_TASK, [evaluation.pk])
    later = timezone.now() + timedelta(seconds=90)
    dead = worker_row(holding=[held], last_seen=later - timedelta(seconds=61))
    assert len(deliveries.deliveries_restore_orphaned(now=later)) == 1
    evaluation.refresh_from_db()
    assert evaluation.status == EvaluationStatus.RUNNING
    assert evaluation.notice.startswith(f"the worker scoring this evaluation ({dead.name}, last heard from at ")
    page = client_for(team.viewer).get(f"/p/alpha/evaluations/{evaluation.public_id}/").content.decode()
    assert 'id="evaluation-notice"' in page and "the scoring was queued again and starts over" in page
    # The message queued again is taken up although the evaluation is running: its worker died.
    assert services.evaluation_start(evaluation_id=evaluation.pk) is not None
    assert services.evaluation_finish(evaluation_id=evaluation.pk, result={"metric": "exact_match", "value": 0.5,
                                                                           "count": 6, "examples": []})
    evaluation.refresh_from_db()
    assert evaluation.status == EvaluationStatus.SUCCEEDED and evaluation.notice == ""


def test_an_evaluation_that_killed_two_workers_fails_with_the_reason(broker, team, base_model,  # noqa: F811
                                                                     prompts_version):
    evaluation = create(team, base_model, prompts_version)
    services.evaluation_start(evaluation_id=evaluation.pk)
    killed_twice(broker, services.EVALUATION_TASK, [evaluation.pk])
    assert services.evaluations_fail_abandoned(now=timezone.now()) == []  # delivered just now
    assert base_model_readers(base_model=base_model) != []
    later = timezone.now() + timedelta(seconds=90)
    assert services.evaluations_fail_abandoned(now=later) == [evaluation.pk]
    evaluation = Evaluation.objects.get(pk=evaluation.pk)
    assert evaluation.status == EvaluationStatus.FAILED and evaluation.error == services.WORKERS_LOST
    assert base_model_readers(base_model=base_model) == []
    assert services.evaluations_fail_abandoned(now=later) == []  # failed once
