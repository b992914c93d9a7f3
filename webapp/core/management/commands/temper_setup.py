"""First-run setup used by ``make up``: the admin account (and, as features land,
the demo project). Running it twice is safe."""
from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the admin account and demo project if missing (idempotent)."

    def handle(self, *args, **options) -> None:
        username = os.environ.get("TEMPER_ADMIN_USER", "admin")
        password = os.environ.get("TEMPER_ADMIN_PASSWORD")
        user_model = get_user_model()
        user = user_model.objects.filter(username=username).first()
        if user is None:
            password = password or secrets.token_urlsafe(12)
            user_model.objects.create_superuser(username=username, email="", password=password)
            self.stdout.write(f"admin account created: {username} / {password}")
        elif password:
            user.set_password(password)
            user.save(update_fields=["password"])
            self.stdout.write(f"admin account: {username} / {password}")
        else:
            self.stdout.write(f"admin account: {username} (password unchanged)")
