"""``default`` queue tasks for review campaigns. Thin: ids in, a service call."""
from __future__ import annotations

from webapp.celery import app
from webapp.review import services


@app.task(name="worker.tasks.review.load_campaign_items", acks_late=True)
def load_campaign_items(campaign_id: int) -> None:
    """Make a loading campaign's items from its dataset version (safe to redeliver)."""
    services.campaign_load_items(campaign_id=campaign_id)
