"""``default`` queue tasks for review campaigns. Thin: ids in, a service call."""
from __future__ import annotations

from webapp.celery import app
from webapp.review import services


@app.task(name="worker.tasks.review.load_campaign_items", acks_late=True)
def load_campaign_items(campaign_id: int) -> None:
    """Make a loading campaign's items from its dataset version (safe to redeliver)."""
    services.campaign_load_items(campaign_id=campaign_id)


@app.task(name="worker.tasks.review.write_export", acks_late=True)
def write_export(export_id: int) -> None:
    """Write a campaign export as a new dataset version (safe to redeliver)."""
    services.export_write(export_id=export_id)
