"""API tokens: a user's bearer credentials for the REST API (``Authorization: Bearer tmp_…``).
Only a SHA-256 digest of the token is stored; the token itself is shown once, when created."""
from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the token, hex.")
    prefix = models.CharField(max_length=12, help_text="The token's first characters, to recognise it.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="From then on the token is refused; empty: "
                                                                       "it works until revoked.")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
