"""A project's webhooks and each message sent to them (see ``webapp.webhooks.services``)."""
from __future__ import annotations

import secrets
from urllib.parse import urlsplit

from django.conf import settings
from django.db import models

from webapp.core.ids import PUBLIC_ID_MAX_LENGTH, new_public_id
from webapp.projects.models import Project

# What a webhook may subscribe to, grouped as its form shows them, each with its line there; "ping" (Send test) goes
# to a hook whatever it chose.
EVENT_GROUPS = {
    "Runs": {
        "run.succeeded": "run.succeeded: a run succeeded",
        "run.failed": "run.failed: a run failed",
        "run.cancelled": "run.cancelled: a run was cancelled",
    },
    "Pipelines": {
        "pipeline.ended": "pipeline.ended: a pipeline ended (succeeded, failed, stopped by a guard or cancelled)",
    },
    "Dataset versions": {
        "dataset_version.ready": "dataset_version.ready: a dataset version passed its check",
        "dataset_version.failed": "dataset_version.failed: a dataset version failed its check",
    },
    "Exports": {
        "export.ready": "export.ready: a run's checkpoint was exported (runs can start from it) or a serving copy "
                        "was written (the chat serves it)",
        "export.failed": "export.failed: a checkpoint export or a serving copy failed",
    },
    "Review": {
        "review.exported": "review.exported: a review campaign's export became a dataset version, or failed",
    },
    "Evaluations": {
        "evaluation.succeeded": "evaluation.succeeded: an evaluation scored its model (the metric and its value)",
        "evaluation.failed": "evaluation.failed: an evaluation could not score its model (why)",
    },
    "Project": {
        "project.renamed": "project.renamed: an owner renamed the project (the old name, the new, and who)",
    },
}
EVENTS = {event: line for events in EVENT_GROUPS.values() for event, line in events.items()}
PING = "ping"


class WebhookFormat(models.TextChoices):
    JSON = "json", "Temper's JSON payload"
    SLACK = "slack", "Slack, Mattermost or Discord (/slack) incoming webhook: {\"text\": …}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


def new_webhook_id() -> str:
    return new_public_id("wh")


def new_delivery_id() -> str:
    return new_public_id("whd")


def new_webhook_secret() -> str:
    """The key a receiver checks ``X-Temper-Signature`` with: 192 random bits."""
    return "whsec_" + secrets.token_hex(24)


class Webhook(models.Model):
    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_webhook_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhooks")
    url = models.CharField(max_length=2000)
    events = models.JSONField(default=list)  # keys of EVENTS
    format = models.CharField(max_length=8, choices=WebhookFormat.choices, default=WebhookFormat.JSON)
    secret = models.CharField(max_length=80, default=new_webhook_secret)
    active = models.BooleanField(default=True)
    # The address Temper's pages were served at when an owner last saved the hook ("https://temper.example.org"):
    # the links in its messages start with it unless TEMPER_BASE_URL says otherwise (a worker has no request).
    site_url = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.url})"

    @property
    def host(self) -> str:
        """The address's host: all that people other than owners may read of it (the activity log)."""
        return urlsplit(self.url).hostname or ""


class WebhookDelivery(models.Model):
    """One event for one hook: its payload as recorded when the event happened, sent (and retried) by the
    ``default`` worker; the answer's first 200 characters kept, never more."""

    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_delivery_id)
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=40)
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_status_code = models.PositiveIntegerField(null=True)
    last_error = models.CharField(max_length=300, blank=True)
    last_response = models.CharField(max_length=200, blank=True)
    next_attempt_at = models.DateTimeField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        verbose_name_plural = "webhook deliveries"  # the admin made it "deliverys"
        indexes = [models.Index(fields=["webhook", "-created_at"], name="webhook_delivery_newest")]

    def __str__(self) -> str:
        return f"{self.public_id} {self.event} ({self.status})"
