"""``default`` queue task of project webhooks: one attempt at one delivery. Thin: an id in, the service sends it and
sends this task again, with a countdown, for a retry."""
from __future__ import annotations

from webapp.celery import app
from webapp.webhooks import services


@app.task(name="worker.tasks.webhooks.deliver_webhook", acks_late=True)
def deliver_webhook(delivery_id: int) -> None:
    """Send webhook delivery ``delivery_id`` (safe to redeliver: only a pending one is sent, each attempt once)."""
    services.delivery_attempt(delivery_id=delivery_id)
