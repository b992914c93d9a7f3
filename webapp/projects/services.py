"""Writes to projects and memberships. Callers check access first (``access.py``);
these functions enforce the invariants that hold whoever calls them: slugs are
unique and well-formed, a user is a member of a project at most once, and a project
always keeps at least one owner."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from webapp.activity.models import Verb
from webapp.activity.services import activity_record
from webapp.basemodels.inspection import project_folder
from webapp.core.bidi import isolated
from webapp.core.text import checked_name, checked_text, typed_text
from webapp.projects.models import DESCRIPTION_MAX_CHARS, Membership, Project, Role
from webapp.projects.selectors import project_readers
from webapp.webhooks import services as webhooks

SLUG_MAX_LENGTH = 50
SLUG_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?$")
# Slugs that would read like site sections rather than projects.
RESERVED_SLUGS = frozenset({"new", "admin", "api", "accounts", "static", "metrics", "workers"})


def _validate_slug(slug: str) -> None:
    if not SLUG_RE.match(slug):
        raise ValidationError(
            {
                "slug": f"slug {slug!r} must be 1-50 lower-case letters, digits or hyphens, "
                "starting and ending with a letter or digit (e.g. 'chat-tuning')"
            }
        )
    if slug in RESERVED_SLUGS:
        raise ValidationError({"slug": f"slug {slug!r} is reserved; choose another"})


def _validate_role(role: str) -> None:
    if role not in Role.values:
        raise ValidationError({"role": f"role {role!r} must be one of {', '.join(Role.values)}"})


def _checked_project_name(name: str) -> str:
    # Project names need not be unique (the slug is): two teams may both call theirs "Chat tuning".
    name = checked_name(name, field="name", max_length=Project._meta.get_field("name").max_length)
    if not name:
        raise ValidationError({"name": "the project name must not be empty"})
    return name


def _checked_description(description: str) -> str:
    # Typed in a textarea (CRLF line breaks) or sent by a script: stored with LF either way.
    return checked_text(typed_text(description).strip(), field="description", max_length=DESCRIPTION_MAX_CHARS)


@transaction.atomic
def project_create(*, name: str, slug: str, owner: AbstractBaseUser) -> Project:
    """Create a project with ``owner`` as its first owner; a blank ``slug`` is made from the name."""
    name = _checked_project_name(name)
    if not slug:
        slug = slugify(name)[:SLUG_MAX_LENGTH].strip("-")
        if not slug:
            raise ValidationError({"slug": "the name gives no slug (lower-case letters a-z, digits and hyphens); "
                                           "type one"})
    _validate_slug(slug)
    taken = ValidationError({"slug": f"a project with slug {slug!r} already exists; choose another"})
    if Project.objects.filter(slug=slug).exists():
        raise taken
    _refuse_a_left_over_models_folder(slug)
    try:
        # A savepoint: two people may claim the same slug at the same moment.
        with transaction.atomic():
            project = Project.objects.create(name=name, slug=slug)
    except IntegrityError as error:
        raise taken from error
    Membership.objects.create(project=project, user=owner, role=Role.OWNER)
    return project


@transaction.atomic
def project_update(*, project: Project, user: AbstractBaseUser | None, name: str, description: str) -> Project:
    """Rename ``project`` and set its description, by the name rules of ``project_create``; all or nothing.
    The slug never changes: addresses, API clients, run directories and the models root's ``projects/<slug>/``
    name it. A change is one entry of the activity log naming the fields changed (a rename with both names;
    never the description's text), and a rename is told to the project's ``project.renamed`` webhooks; a save that
    changes nothing records none."""
    name, description = _checked_project_name(name), _checked_description(description)
    project = Project.objects.select_for_update(of=("self",)).get(pk=project.pk)
    changed = [field for field, value in (("name", name), ("description", description))
               if getattr(project, field) != value]
    if not changed:
        return project
    details: dict[str, object] = {"changed": changed}
    name_was = project.name
    if "name" in changed:
        # Keys growing in length: PostgreSQL's jsonb keeps keys by length, then bytes, and the log shows them in the
        # order it reads them.
        details |= {"name_was": name_was, "renamed_to": name}
    project.name, project.description = name, description
    project.save(update_fields=changed)
    activity_record(project=project, actor=user, verb=Verb.PROJECT_CHANGED, details=details)
    if "name" in changed:
        webhooks.project_renamed(project=project, name_was=name_was, user=user)
    return project


def _refuse_a_left_over_models_folder(slug: str) -> None:
    # projects/<slug>/ under the models root is the project of that slug's alone (webapp.basemodels.inspection): a
    # deleted project's folder stays there (the files are the user's, the root may be read-only to Temper), and a
    # new project given its slug would see that team's private models as its own.
    folder = project_folder(models_root=Path(settings.MODELS_ROOT), project_slug=slug)
    if folder.exists():
        raise ValidationError({"slug": (
            f"the models root already has a folder for slug {slug!r} ({folder}), left by a deleted project or made "
            "ahead of this one: its models would be this project's; choose another slug, or ask an administrator "
            "to move that folder away first")})


@transaction.atomic
def membership_add(*, project: Project, user: AbstractBaseUser, role: str,
                   actor: AbstractBaseUser | None = None) -> Membership:
    """Make ``user`` a member of ``project`` with ``role``; ``actor`` did it (None: manage.py)."""
    _validate_role(role)
    if Membership.objects.filter(project=project, user=user).exists():
        raise ValidationError(
            {"username": f"{user.get_username()} is already a member of {isolated(project.name)}; change their role "
                         "instead"}
        )
    membership = Membership.objects.create(project=project, user=user, role=role)
    activity_record(project=project, actor=actor, verb=Verb.MEMBER_ADDED, target=membership, details={"role": role})
    return membership


def _ensure_another_owner(membership: Membership) -> None:
    # Every owner row of the project is locked, in one order, before the check. Locking only the others let
    # two owners demoting each other at once each lock the other's row and then wait for their own (on
    # PostgreSQL a deadlock: a server error); now the second waits for the first, then finds its change made.
    owners = (
        Membership.objects.select_for_update(of=("self",))
        .filter(project_id=membership.project_id, role=Role.OWNER)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    if not [pk for pk in owners if pk != membership.pk]:
        raise ValidationError(
            {"username": f"{membership.user.get_username()} is the last owner of "
             f"{isolated(membership.project.name)}; make someone else owner first"}
        )


def _give_up_what_members_hold(membership: Membership) -> None:
    # What a member holds in the project that a viewer or someone outside may not: their place among the
    # reviewers of its campaigns and their project tokens. Kept, they would be theirs again, unasked, once
    # they are promoted or added back.
    from webapp.chat.tokens import project_tokens_revoke_all  # the chat and review apps are built on projects
    from webapp.review.services import reviewer_leave_campaigns

    reviewer_leave_campaigns(project=membership.project, user=membership.user)
    project_tokens_revoke_all(project=membership.project, user=membership.user)


@transaction.atomic
def membership_set_role(*, membership: Membership, role: str, actor: AbstractBaseUser | None = None) -> Membership:
    """Change a member's role; the last owner cannot be demoted. A member made a viewer leaves the reviewers
    of the project's campaigns (viewers cannot review) and loses their project tokens (viewers cannot chat),
    so being promoted again gives them back neither unasked."""
    _validate_role(role)
    if membership.role == Role.OWNER and role != Role.OWNER:
        _ensure_another_owner(membership)
    if role == Role.VIEWER:
        _give_up_what_members_hold(membership)
    activity_record(project=membership.project, actor=actor, verb=Verb.MEMBER_ROLE_CHANGED, target=membership,
                    details={"from": membership.role, "to": role})
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def membership_remove(*, membership: Membership, actor: AbstractBaseUser | None = None) -> None:
    """Remove a member from a project; the last owner cannot be removed. They leave the reviewers of its
    review campaigns and their project tokens for it are revoked, so that being added again later gives them
    back neither unasked."""
    if membership.role == Role.OWNER:
        _ensure_another_owner(membership)
    _give_up_what_members_hold(membership)
    membership.delete()
    activity_record(project=membership.project, actor=actor, verb=Verb.MEMBER_REMOVED, target=membership)


def _check_confirmation(project: Project, typed: str) -> None:
    """Deleting a project is undone by nothing: the person types its slug, so that a click on the wrong
    project's page (or a form sent by mistake) deletes nothing."""
    typed = typed.strip()
    if not typed:
        raise ValidationError({"confirm_slug": f"type the project's slug, {project.slug}, to confirm"})
    if typed != project.slug:
        raise ValidationError({"confirm_slug": f"{typed!r} is not the project's slug; type {project.slug} to confirm"})


def project_lock(*, project: Project, doing: str) -> Project:
    """Lock ``project``'s row for work about to be added to it (a run launched or queued again, a pipeline, a
    review campaign; through ``chat.services.model_lock`` a chat turn, an arena battle, a generated review
    campaign, a /v1 completion), inside the caller's transaction, and refuse the work (``ValidationError``,
    non-field) when the project was deleted meanwhile; ``doing`` ends the sentence ("as the run was being
    launched"). ``project_delete`` locks the same row before its check, so a deletion and such work are taken one after the other: the
    deletion then sees the work and is refused, or the work is. Lock the project before the rows of what is
    in it, as the deletion does, so that neither waits on the other in turn. ``FOR NO KEY UPDATE``: a
    deletion waits for it, the foreign-key checks of rows saved in the project meanwhile do not."""
    locked = Project.objects.select_for_update(no_key=True, of=("self",)).filter(pk=project.pk).first()
    if locked is None:
        raise ValidationError({"__all__": f"project {isolated(project.name)} was deleted {doing}"})
    return locked


@transaction.atomic
def project_delete(*, project: Project, confirmation: str) -> None:
    """Delete ``project`` with everything in it — memberships, datasets, base model registrations, runs,
    pipelines, serving copies, review campaigns, conversations, battles, chat tokens — and, once committed,
    the files of its dataset versions, its runs' directories and its base models' serving copies. A base
    model's own directory stays (it is the user's, under ``TEMPER_MODELS_ROOT``). ``confirmation`` is the
    slug as the person typed it. Refused (``ValidationError`` on ``delete``) while work in it is in flight
    (``selectors.project_readers``)."""
    # Imported here: these apps are built on projects.
    from webapp.chat.services import models_deleted
    from webapp.datasets.models import DatasetVersion
    from webapp.runs.serving_copies import base_model_copy_dir
    from webapp.runs.services import run_output_dir

    _check_confirmation(project, confirmation)
    # Locked before the check, as the work it looks for locks it (``project_lock``) before it is added.
    project = Project.objects.select_for_update(of=("self",)).get(pk=project.pk)
    if problems := project_readers(project=project):
        raise ValidationError({"delete": problems})
    version_files = [path for version in DatasetVersion.objects.filter(dataset__project=project)
                     for path in (version.absolute_path, *version.side_paths)]
    dataset_ids = list(project.datasets.values_list("public_id", flat=True))
    run_ids = list(project.runs.values_list("public_id", flat=True))
    base_models = list(project.base_models.all())
    directories = ([run_output_dir(public_id) for public_id in run_ids]
                   + [base_model_copy_dir(base_model) for base_model in base_models])
    project.delete()
    transaction.on_commit(lambda: _remove_project_files(version_files, dataset_ids, directories))
    models_deleted(refs=[*run_ids, *(base_model.public_id for base_model in base_models)])


def _remove_project_files(version_files: list[Path], dataset_ids: list[str], directories: list[Path]) -> None:
    from webapp.datasets.services import remove_dataset_files  # the datasets app is built on projects

    remove_dataset_files(version_files, dataset_ids=dataset_ids)
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)
