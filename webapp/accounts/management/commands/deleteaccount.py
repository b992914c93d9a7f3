"""``python manage.py deleteaccount USERNAME``: delete an account by the rules the admin follows, or say in
words what keeps it (``webapp.accounts.services.account_delete``)."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from webapp.accounts.services import account_delete


class Command(BaseCommand):
    help = "Delete an account with what was its own; refused, in words, where the team's data needs it."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username, **options):
        account = get_user_model().objects.filter(username=username).first()
        if account is None:
            raise CommandError(f"no user named {username!r}")
        try:
            account_delete(user=account)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        self.stdout.write(f"deleted the account {username}")
