"""``python manage.py resttoken --user NAME [--name LABEL]``: print a new personal token of the REST API
(``/api/v1/``), as the API tokens page makes one, for a machine set up without a browser."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from webapp.api.services import token_create


class Command(BaseCommand):
    help = "Create a personal token for the REST API (/api/v1/) and print it."

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="username the token acts as")
        parser.add_argument("--name", default="cli", help="a name to recognise the token by on the API tokens page")

    def handle(self, *args, user, name, **options):
        account = get_user_model().objects.filter(username=user).first()
        if account is None:
            raise CommandError(f"--user: no user named {user!r}")
        if not account.is_active:
            raise CommandError(f"--user: {user!r} is deactivated; its tokens would be refused")
        try:
            _token, secret = token_create(user=account, name=name)
        except ValidationError as error:  # the name: empty, too long, or holding a NUL
            raise CommandError(f"--name: {' '.join(error.messages)}") from None
        self.stdout.write(secret)
