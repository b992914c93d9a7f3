import pytest

from webapp.chat import services


@pytest.fixture
def sent(monkeypatch):
    """The serve tasks enqueued (no worker takes them), as (name, args, queue)."""
    calls = []
    monkeypatch.setattr(services.celery_app, "send_task",
                        lambda name, args, queue, **options: calls.append((name, args, queue)))
    return calls
