"""``python manage.py apitoken --user NAME --project SLUG [--name N]``: print a new token of the
OpenAI-compatible API for one project."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from webapp.chat.tokens import project_token_create
from webapp.projects.models import Project
from webapp.projects.selectors import project_list_for_user


class Command(BaseCommand):
    help = ("Create a project-scoped token for the OpenAI-compatible API (/v1/) and print it; the REST API (/api/v1/) "
            "takes a personal token instead: python manage.py resttoken --user NAME.")

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="username (a member or owner of the project)")
        parser.add_argument("--project", required=True, help="project slug")
        parser.add_argument("--name", default="cli", help="a name to recognise the token by")

    def handle(self, *args, user, project, name, **options):
        account = get_user_model().objects.filter(username=user).first()
        if account is None:
            raise CommandError(f"--user: no user named {user!r}")
        project_row = Project.objects.filter(slug=project).first()
        if project_row is None:
            theirs = ", ".join(f"{one.slug} ({one.name})" for one in project_list_for_user(user=account)) or "none"
            raise CommandError(f"--project: no project with slug {project!r}; {user}'s projects: {theirs}")
        try:
            _token, secret = project_token_create(user=account, project=project_row, name=name)
        except PermissionError as error:
            raise CommandError(str(error)) from None
        except ValidationError as error:  # the name: too long, or holding a NUL
            raise CommandError(f"--name: {' '.join(error.messages)}") from None
        self.stdout.write(secret)
