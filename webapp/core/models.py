"""What every app shares in the database: the record of each form sent (see ``submissions``), and the
steps ``temper_setup`` has done."""
from __future__ import annotations

from django.conf import settings
from django.db import models


class Submission(models.Model):
    """A form (or an API request with an ``Idempotency-Key``) that made something: ``key`` digests
    the form's name, its one-time token and the fields sent, ``result`` says what the first sending
    made (the address of its page, or its id). Unique per user, so of two identical sendings, even
    concurrent ones, one makes it and the other is answered with the first's ``result``. An API
    request's ``key`` digests its address and key alone, and ``body_digest`` its body: the key
    stands for one request, and another body sent under it is refused. ``claimed_by`` marks a sending still at work
    (a random mark of its own; empty once ``result`` is filled in): an identical sending meanwhile waits for it
    (``webapp.core.submissions``), and ``created_at`` is when it was claimed."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=64)
    body_digest = models.CharField(max_length=64, blank=True)
    result = models.CharField(max_length=512, blank=True)
    claimed_by = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="submission_unique_user_key")]

    def __str__(self) -> str:
        return f"{self.key[:12]}… → {self.result}"


class SetupStep(models.Model):
    """A thing ``manage.py temper_setup`` made once (``name``: "demo-project", "demo-base-model",
    "demo-dataset:demo-sft", ...). Setup runs at every start: without this record, what a team deleted of
    the demo (a dataset, the base model, the whole project) was made again at the next one."""

    name = models.CharField(max_length=100, unique=True)
    done_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name
