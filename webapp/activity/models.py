"""A project's activity log: who did what to which of its objects, and when.

Design note: an entry names its actor and its target by snapshot (``actor_name``, ``target_kind`` +
``target_id`` + ``target_label``), not only by foreign key, so that it stays readable once the account
or the object is gone: the log is read most when something went missing. Only people's actions are
entries (a worker failing a run is not); ``webapp.activity.services.activity_record`` writes them inside
the action's own transaction."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from webapp.projects.models import Project


class Verb(models.TextChoices):
    """What was done; the label reads before the target's kind and name ("launched" run "sft-1")."""

    RUN_LAUNCHED = "run.launched", "launched"
    SWEEP_LAUNCHED = "sweep.launched", "launched"
    RUN_CANCELLED = "run.cancelled", "cancelled"
    RUN_DELETED = "run.deleted", "deleted"
    RUN_ARCHIVED = "run.archived", "archived"
    RUN_UNARCHIVED = "run.unarchived", "unarchived"
    RUN_RESUMED = "run.resumed", "resumed"
    RUN_RETRIED = "run.retried", "retried"
    RUN_TRAINED_FURTHER = "run.trained_further", "trained further"
    PIPELINE_LAUNCHED = "pipeline.launched", "launched"
    PIPELINE_CANCELLED = "pipeline.cancelled", "cancelled"
    CHECKPOINT_DELETED = "checkpoint.deleted", "deleted a checkpoint of"
    CHECKPOINTS_PRUNED = "checkpoints.pruned", "pruned the checkpoints of"
    SERVING_COPY_REQUESTED = "serving_copy.requested", "asked for a serving copy of"
    DATASET_CREATED = "dataset.created", "created"
    DATASET_CHANGED = "dataset.changed", "changed"
    DATASET_VERSION_UPLOADED = "dataset_version.uploaded", "uploaded"
    # Its target the version split; its details name the two new versions (datasets.services.dataset_version_split).
    DATASET_VERSION_SPLIT = "dataset_version.split", "split"
    # Their target the version derived from; their details name the new version and the rows it leaves out
    # (datasets.services.dataset_version_derive).
    DATASET_VERSION_DEDUPED = "dataset_version.deduped", "removed the exact repeats of"
    DATASET_VERSION_DECONTAMINATED = "dataset_version.decontaminated", "removed the rows shared with another from"
    DATASET_VERSION_DELETED = "dataset_version.deleted", "deleted"
    DATASET_DELETED = "dataset.deleted", "deleted"
    BASE_MODEL_REGISTERED = "base_model.registered", "registered"
    BASE_MODEL_DELETED = "base_model.deleted", "deleted"
    # The project's own name or description (its details name the fields, never the old description's text).
    PROJECT_CHANGED = "project.changed", "changed"
    MEMBER_ADDED = "member.added", "added"
    MEMBER_ROLE_CHANGED = "member.role_changed", "changed the role of"
    MEMBER_REMOVED = "member.removed", "removed"
    CHAT_TOKEN_CREATED = "chat_token.created", "created"
    CHAT_TOKEN_REVOKED = "chat_token.revoked", "revoked"
    CAMPAIGN_CREATED = "campaign.created", "created"
    CAMPAIGN_DELETED = "campaign.deleted", "deleted"
    CAMPAIGN_EXPORTED = "campaign.exported", "exported"
    EVALUATION_LAUNCHED = "evaluation.launched", "launched"
    EVALUATION_CANCELLED = "evaluation.cancelled", "cancelled"
    EVALUATION_DELETED = "evaluation.deleted", "deleted"
    # Where the project's data is sent: each change is a security matter (webapp.webhooks.services).
    WEBHOOK_CREATED = "webhook.created", "added"
    WEBHOOK_CHANGED = "webhook.changed", "changed"
    WEBHOOK_DELETED = "webhook.deleted", "deleted"
    WEBHOOK_SECRET_REGENERATED = "webhook.secret_regenerated", "made a new secret for"


class TargetKind(models.TextChoices):
    RUN = "run", "run"
    SWEEP = "sweep", "sweep"
    PIPELINE = "pipeline", "pipeline"
    DATASET = "dataset", "dataset"
    DATASET_VERSION = "dataset_version", "dataset version"
    BASE_MODEL = "base_model", "base model"
    MEMBER = "member", "member"
    CHAT_TOKEN = "chat_token", "project token"
    CAMPAIGN = "campaign", "review campaign"
    EVALUATION = "evaluation", "evaluation"
    WEBHOOK = "webhook", "webhook"


class Activity(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="activities")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="+")
    actor_name = models.CharField(max_length=150, blank=True, help_text=(
        "The actor's username when they acted; blank for manage.py (no actor)."))
    verb = models.CharField(max_length=40, choices=Verb.choices)
    target_kind = models.CharField(max_length=20, choices=TargetKind.choices, blank=True)
    target_id = models.CharField(max_length=150, blank=True, help_text="The target's public id (run_…, ds_…).")
    target_label = models.CharField(max_length=200, blank=True, help_text="The target's name when it was done.")
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Newest first: the whole log; one person's (the person filter, and the names it offers, read from the index
        # alone); one kind's; one verb's (the action filter: "deleted" is a handful of verbs, each read newest first);
        # one verb of one kind's (both filters: "who deleted a run"). Without the last four a filter to a rare person,
        # kind or action reads the project's whole log, and a rare action of a common kind all that kind's entries.
        indexes = [models.Index(fields=["project", "-created_at", "-id"], name="activity_project_newest"),
                   models.Index(fields=["project", "actor_name", "-created_at", "-id"], name="activity_actor_newest"),
                   models.Index(fields=["project", "target_kind", "-created_at", "-id"], name="activity_kind_newest"),
                   models.Index(fields=["project", "verb", "-created_at", "-id"], name="activity_verb_newest"),
                   models.Index(fields=["project", "target_kind", "verb", "-created_at", "-id"],
                                name="activity_kind_verb_newest")]

    def __str__(self) -> str:
        return f"{self.actor_name or 'manage.py'} {self.verb} {self.target_id}"
