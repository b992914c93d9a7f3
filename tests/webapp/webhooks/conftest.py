"""The webhook tests' receiver (a real HTTP server on this host, which their hooks may reach), the Celery tasks they
send (a delivery runs at once, as the worker would run it) and the hooks they add."""
from __future__ import annotations

import pytest

from tests.webapp.webhooks.receiver import LOOPBACK_ALLOWED, running_receiver  # noqa: F401 (a fixture)
from webapp.celery import app as celery_app
from webapp.webhooks import services
from webapp.webhooks.models import Webhook
from worker.tasks.webhooks import deliver_webhook

SITE = "https://temper.example.org"


@pytest.fixture(autouse=True)
def no_redis(settings):
    """Run status events go nowhere: nothing here may reach a Redis another test (or person) uses."""
    settings.REDIS_URL = "redis://127.0.0.1:1/0"


@pytest.fixture(autouse=True)
def loopback_allowed(settings):
    """Hooks at this host's closed ports too (their refusals are tested), not only the receiver's."""
    settings.TEMPER_WEBHOOK_ALLOWED_NETWORKS = LOOPBACK_ALLOWED


@pytest.fixture
def sent(monkeypatch) -> list[tuple]:
    """Tasks sent to Celery: a webhook delivery runs at once, as the worker would run it (the tests of the worker
    itself are the integration tests'); the others are only kept, with their options (a retry's countdown)."""
    calls = []

    def send_task(name, args=None, queue=None, **options):
        calls.append((name, args, queue, options))
        if name == services.DELIVER_TASK and not options.get("countdown"):
            deliver_webhook(*args)

    monkeypatch.setattr(celery_app, "send_task", send_task)
    return calls


def hook(project, receiver, path, events, *, format="json") -> Webhook:
    return services.webhook_create(project=project, url=receiver.url + path, events=events, format=format,
                                   site_url=SITE, user=None)


