from __future__ import annotations

from django.conf import settings
from django.db import models


class AttemptCount(models.Model):
    """Password checks counted for one throttle key (``webapp.accounts.throttle``) since its last right
    password, until ``expires_at``; a row past it counts for nothing and is deleted by the next attempt."""

    key = models.CharField(max_length=100, unique=True)
    count = models.PositiveIntegerField()
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.key}: {self.count} until {self.expires_at:%Y-%m-%d %H:%M:%S}"


class Preferences(models.Model):
    """One person's settings for the pages, kept on the server so that they follow them to any browser.
    A user without a row has the defaults (``selectors.preferences_for``)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True,
                                related_name="preferences")
    # WCAG 2.1.4: the reviewing page's bare 1, 2, t, b, s and e answer an item; a speech-input user or a
    # stray key press sends them by accident, so they can be turned off.
    review_shortcuts = models.BooleanField(default=True)

    def __str__(self) -> str:
        return f"{self.user}: review shortcuts {'on' if self.review_shortcuts else 'off'}"
