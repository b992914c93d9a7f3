"""Evaluation test data: two base models and the versions they are scored on. Tasks are recorded, not sent
(``sent_tasks``): the worker's side is tests/integration/test_evaluations.py's."""
from __future__ import annotations

import pytest

from tests.webapp.factories import make_base_model, make_ready_version
from webapp.celery import app as celery_app
from webapp.evals import services

PROMPT_ROWS = [{"prompt": f"What is {index} + 1?", "answer": str(index + 1), "task": "sum" if index % 2 else "count"}
               for index in range(6)]
SFT_ROWS = [{"prompt": f"q{index}", "completion": f"answer {index}"} for index in range(4)]


@pytest.fixture(autouse=True)
def sent_tasks(monkeypatch):
    sent = []
    monkeypatch.setattr(celery_app, "send_task", lambda name, args, queue: sent.append((name, args, queue)))
    return sent


@pytest.fixture
def base_model(team):
    return make_base_model(team.project, name="falcon", path="/models/falcon")


@pytest.fixture
def prompts_version(team):
    return make_ready_version(team.project, name="sums", kind="prompts", rows=PROMPT_ROWS, user=team.owner)


@pytest.fixture
def sft_version(team):
    return make_ready_version(team.project, name="chats", kind="sft", rows=SFT_ROWS, user=team.owner)


def create(team, base_model, version, **settings):
    return services.evaluation_create(project=team.project, model_ref=base_model.public_id, version=version,
                                      settings=services.EvaluationSettings(**settings), user=team.teammate)
