"""Reads of a person's own settings."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from webapp.accounts.models import Preferences


def preferences_for(*, user: AbstractBaseUser) -> Preferences:
    """``user``'s preferences: their row, or the defaults (unsaved) while they have changed none."""
    try:
        return Preferences.objects.get(user=user)
    except Preferences.DoesNotExist:
        return Preferences(user=user)
