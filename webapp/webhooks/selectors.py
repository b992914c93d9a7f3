"""Reads of a project's webhooks, for its owners."""
from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Prefetch, Q
from django.http import Http404

from webapp.core.keyset import KeysetPage, keyset_page
from webapp.projects.models import Project
from webapp.webhooks.models import Webhook, WebhookDelivery

DELIVERIES_SHOWN = 20


@dataclass(frozen=True)
class WebhookRow:
    webhook: Webhook
    deliveries: list[WebhookDelivery]
    delivery_count: int  # all it keeps (up to services.DELIVERIES_KEPT), of which ``deliveries`` are the newest

    @property
    def older_kept(self) -> bool:
        """Whether it keeps deliveries older than those shown (the page then says where to read them)."""
        return self.delivery_count > len(self.deliveries)


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
    """Each hook of ``project`` with its newest ``DELIVERIES_SHOWN`` deliveries, newest first, and how many it keeps:
    three queries however many hooks (the counts grouped in the hooks' query; a sliced prefetch is one windowed query
    for all of them)."""
    newest = Prefetch("deliveries", queryset=WebhookDelivery.objects.all()[:DELIVERIES_SHOWN], to_attr="newest")
    webhooks = (webhook_list(project=project).select_related("created_by")
                .annotate(delivery_count=Count("deliveries")).prefetch_related(newest))
    return [WebhookRow(webhook=webhook, deliveries=webhook.newest, delivery_count=webhook.delivery_count)
            for webhook in webhooks]


def webhook_list(*, project: Project):
    """``project``'s hooks, oldest first (as the page lists them)."""
    return Webhook.objects.filter(project=project)


def delivery_page(*, webhook: Webhook, after: tuple[str, int] | None, limit: int) -> KeysetPage[WebhookDelivery]:
    """The ``limit`` deliveries of ``webhook``, newest first, after the one whose (time as ISO text, id) is ``after``."""
    deliveries = webhook.deliveries.all()
    if after is not None:
        created_at, last_id = after
        deliveries = deliveries.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=last_id))
    return keyset_page(deliveries, limit=limit, key=lambda delivery: (delivery.created_at.isoformat(), delivery.pk))
