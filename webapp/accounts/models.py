from __future__ import annotations

from django.db import models


class AttemptCount(models.Model):
    """Password checks counted for one throttle key (``webapp.accounts.throttle``) since its last right
    password, until ``expires_at``; a row past it counts for nothing and is deleted by the next attempt."""

    key = models.CharField(max_length=100, unique=True)
    count = models.PositiveIntegerField()
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.key}: {self.count} until {self.expires_at:%Y-%m-%d %H:%M:%S}"
