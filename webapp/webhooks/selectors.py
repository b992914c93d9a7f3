"""Reads of a project's webhooks, for its owners."""
from __future__ import annotations

from dataclasses import dataclass

from django.http import Http404

from webapp.projects.models import Project
from webapp.webhooks.models import Webhook, WebhookDelivery

DELIVERIES_SHOWN = 20


@dataclass(frozen=True)
class WebhookRow:
    webhook: Webhook
    deliveries: list[WebhookDelivery]


def webhook_get(*, project: Project, public_id: str) -> Webhook:
    """``project``'s hook ``public_id``; 404 for any other (another project's too)."""
    webhook = Webhook.objects.select_related("project").filter(project=project, public_id=public_id).first()
    if webhook is None:
        raise Http404("no such webhook in this project")
    return webhook


def delivery_get(*, webhook: Webhook, public_id: str) -> WebhookDelivery:
    delivery = WebhookDelivery.objects.select_related("webhook__project").filter(
        webhook=webhook, public_id=public_id).first()
    if delivery is None:
        raise Http404("no such delivery of this webhook")
    return delivery


def webhook_rows(*, project: Project) -> list[WebhookRow]:
    """Each hook of ``project`` with its newest ``DELIVERIES_SHOWN`` deliveries, newest first."""
    return [WebhookRow(webhook=webhook, deliveries=list(webhook.deliveries.all()[:DELIVERIES_SHOWN]))
            for webhook in Webhook.objects.filter(project=project)]
