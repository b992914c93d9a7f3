"""Fixtures for run tests: a team with a base model and ready datasets, and the tasks the services
would send to Celery (captured, not sent)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest

from tests.webapp.factories import make_base_model, make_ready_version
from webapp.celery import app as celery_app
from webapp.runs import services


@dataclass
class Sent:
    calls: list

    @property
    def names(self) -> list[str]:
        return [call[0] for call in self.calls]


@pytest.fixture
def sent_tasks(monkeypatch) -> Sent:
    sent = Sent(calls=[])
    monkeypatch.setattr(celery_app, "send_task",
                        lambda name, args=None, queue=None, **kwargs: sent.calls.append((name, args, queue)))
    return sent


@dataclass
class Catalog:
    base_model: object
    sft: object
    preference: object
    prompts: object


@pytest.fixture
def catalog(team) -> Catalog:
    return Catalog(
        base_model=make_base_model(team.project),
        sft=make_ready_version(team.project, name="chats", kind="sft"),
        preference=make_ready_version(team.project, name="pairs", kind="preference",
                                      rows=[{"prompt": "p", "chosen": "a", "rejected": "b"}]),
        prompts=make_ready_version(team.project, name="questions", kind="prompts",
                                   rows=[{"prompt": "2+2?", "answer": "4"}]),
    )


def make_pool_worker(name: str, *, pool: str, devices: dict, seen_ago: float = 1.0):
    """A train worker of host ``pool`` as its heartbeat leaves it, with ``devices`` (e.g. ``{"platform":
    "cpu", "count": 4}``). It announces no coordinator address, so placement never picks it."""
    from datetime import timedelta

    from django.utils import timezone

    from webapp.workers.models import Worker

    now = timezone.now()
    return Worker.objects.create(name=name, host=name.split("@")[-1], pid=1, pool=pool, devices=devices,
                                 queues=["train" if pool == "default" else f"train-{pool}"],
                                 started_at=now, last_seen=now - timedelta(seconds=seen_ago))


@pytest.fixture
def tpu_pool(only_this_tests_workers):
    """Host pool ``tpu``: two live workers of four CPU devices each (a stale one of eight is ignored), and no other
    worker rows (the default pool has none: the session's live Celery workers, when an integration or browser file
    ran earlier in this process, beat into the test database)."""
    return [make_pool_worker("train@tpu-0", pool="tpu", devices={"platform": "cpu", "count": 4, "kinds": ["cpu"]}),
            make_pool_worker("train@tpu-1", pool="tpu", devices={"platform": "cpu", "count": 4, "kinds": ["cpu"]}),
            make_pool_worker("train@tpu-old", pool="tpu", devices={"platform": "cpu", "count": 8}, seen_ago=3600)]


def sft_spec(catalog: Catalog, **overrides) -> dict:
    spec = {"task": "sft", "model": catalog.base_model.public_id, "data": {"train": catalog.sft.public_id},
            "train": {"max_steps": 10, "batch_size": 2}}
    for key, value in overrides.items():
        spec[key] = value
    return spec


def with_checkpoint(run, step: int) -> None:
    """A training checkpoint of ``run`` at ``step`` in its run folder, as the engine saves one (what an export of it
    reads, and what a resume restores: a run that saved checkpoints is not resumed once its folder is gone)."""
    directory = run.output_dir / "checkpoints" / str(step)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "state").write_text("weights")


def compare_chart_data(page: str) -> dict:
    """The compare page's chart data (its "compare-data" JSON)."""
    return json.loads(re.search(r'<script id="compare-data" type="application/json">(.*?)</script>', page, re.S)[1])


def drawn_series(data: dict, run_id: str) -> dict:
    """A run's series in ``compare_chart_data`` as the page draws them (static/runs_compare.js: trace), each with
    its x: ``metric_series``' form."""
    return {name: {**data["x"][run_id][sent["x"]], "value": sent["value"], "downsampled": sent["downsampled"]}
            for name, sent in data["series"][run_id].items()}


class FakeRedis:
    """What Celery's Redis transport leaves in Redis: waiting messages in the queue's list (and
    its priority lists), delivered ones in the ``unacked`` hash as [payload, exchange, key]; every
    message one of ``task``'s, with the given arguments."""

    def __init__(self, *, waiting=(), priority=(), unacked=(), task=services.TRAIN_TASK):
        message = lambda args: json.dumps({"body": "", "headers": {"task": task,  # noqa: E731
                                                                   "argsrepr": repr(list(args))}})
        self.lists = {"train": [message(args) for args in waiting],
                      "train\x06\x163": [message(args) for args in priority]}
        self.unacked = [json.dumps([json.loads(message(args)), "", "train"]) for args in unacked]

    def lrange(self, key, start, end):
        return self.lists.get(key, [])

    def scan_iter(self, match):
        return [key for key in self.lists if key.startswith(match.rstrip("*")) and key != "train"]

    def hgetall(self, key):
        return {f"tag-{index}": raw for index, raw in enumerate(self.unacked)}

    def zrange(self, key, start, end, withscores=False):
        return []  # no delivery times: each counts as just made

    def close(self):
        pass
