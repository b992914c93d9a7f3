"""Registering and unregistering base models. The caller has checked that the user may write to the
project (member or owner). A model's directory is the user's (under ``TEMPER_MODELS_ROOT``, perhaps
read-only, perhaps shared with other tools): neither registering nor unregistering ever writes to it (an
owner's upload, ``uploads.basemodel_upload``, writes a new one and then registers it here, ``uploaded``; an
owner may delete such a folder with its registration, ``removal``)."""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from webapp.activity.models import Verb
from webapp.activity.services import activity_record
from webapp.basemodels.inspection import ModelDirError, read_model_facts, resolve_model_dir
from webapp.basemodels.models import BaseModel
from webapp.basemodels.removal import remove_uploaded_folder, uploaded_folder_refusal
from webapp.basemodels.selectors import base_model_readers, basemodel_named
from webapp.core.text import checked_name, checked_text
from webapp.projects.models import Project
from webapp.projects.services import project_lock
from webapp.runs.serving_copies import base_model_copy_dir

logger = logging.getLogger(__name__)


BASE_MODEL_NAME_MAX = BaseModel._meta.get_field("name").max_length


@transaction.atomic
def basemodel_register(
    *, project: Project, name: str, path: str, user: AbstractBaseUser | None, uploaded: bool = False
) -> BaseModel:
    """Register the model directory at ``path`` (absolute, or relative to
    ``settings.MODELS_ROOT``) in ``project`` under ``name``; ``uploaded``: Temper unpacked it there itself
    (``uploads.model_archive_register``), so that its folder may be deleted with it.

    Raises ``ValidationError`` naming the field (``name`` or ``path``) when the name
    is taken (in any letter case), the path leaves the models root or lies in another
    project's folder (``inspection.resolve_model_dir``), or the directory is not a readable
    Hugging Face-format model.
    """
    name = checked_name(name, field="name", max_length=BASE_MODEL_NAME_MAX)
    checked_text(path, field="path")
    if not name:
        raise ValidationError({"name": "give the model a name, e.g. 'llama-3.2-1b'"})
    if (taken := basemodel_named(project=project, name=name)) is not None:
        raise ValidationError({"name": name_taken_message(project, taken.name)})
    try:
        model_dir = resolve_model_dir(path, models_root=settings.MODELS_ROOT, project_slug=project.slug)
        facts = read_model_facts(model_dir, models_root=settings.MODELS_ROOT, project_slug=project.slug)
    except ModelDirError as error:
        raise ValidationError({"path": str(error)}) from error
    existing = BaseModel.objects.filter(project=project, path=str(model_dir)).first()
    if existing is not None:
        raise ValidationError({"path": f"{model_dir} is already registered here as {existing.name!r}"})
    try:
        with transaction.atomic():  # a savepoint: a registration racing this one under the same name
            base_model = _create(project=project, name=name, model_dir=model_dir, facts=facts, user=user,
                                 uploaded=uploaded)
    except IntegrityError:
        if (taken := basemodel_named(project=project, name=name)) is None:
            raise
        raise ValidationError({"name": name_taken_message(project, taken.name)}) from None
    activity_record(project=project, actor=user, verb=Verb.BASE_MODEL_REGISTERED, target=base_model,
                    details={"uploaded": True} if uploaded else None)
    return base_model


def name_taken_message(project: Project, name: str) -> str:
    return (f"{project.slug} already has a base model named {name!r}; names that differ only in letter case "
            "are the same name")


def _create(*, project: Project, name: str, model_dir, facts, user: AbstractBaseUser | None,
            uploaded: bool) -> BaseModel:
    return BaseModel.objects.create(
        project=project,
        name=name,
        path=str(model_dir),
        architecture=facts.architecture,
        model_type=facts.model_type,
        parameter_count=facts.parameter_count,
        context_length=facts.context_length,
        vocab_size=facts.vocab_size,
        tokenizer_vocab_size=facts.tokenizer_vocab_size,
        tokenizer_type=facts.tokenizer_type,
        dtype=facts.dtype,
        size_bytes=facts.size_bytes,
        weight_files=list(facts.weight_files),
        config=facts.config,
        registered_by=user,
        uploaded=uploaded,
    )


@dataclass
class FolderRemoval:
    """What became of an uploaded model's folder asked to go with its registration: filled in once the
    unregistering commits (``removed``, or ``error`` saying why the files are still there)."""

    path: str
    removed: bool = False
    error: str = ""


@transaction.atomic
def basemodel_unregister(*, base_model: BaseModel, delete_files: bool = False,
                         actor: AbstractBaseUser | None = None) -> FolderRemoval | None:
    """Remove ``base_model``'s registration and its serving copies (their rows, and once committed their
    directory under ``DATA_ROOT/serving-copies/``), and the model's own directory only when ``delete_files``
    (the caller has checked the user owns the project): then it must be a folder Temper unpacked itself
    (``removal.uploaded_folder_refusal``), and it is removed once committed (the answer says how that went).
    Refused (``ValidationError`` on ``delete``, or on ``delete_files`` for a folder that may not go, nothing
    deleted) while work still needs it (``selectors.base_model_readers``: among others, runs stopped short that may
    still be resumed or retried from it). Runs started from it keep their history and name it as deleted (``Run.deleted_references``); conversations with it say it is no longer
    available."""
    from webapp.chat import services as chat_services  # the chat is built on base models

    # The project's row first, as a resume, a retry and a launch lock it before the rows they read: one under way
    # is then seen queued by the check below, and one waiting behind this finds the model gone (a resume judged
    # it still there before, and was queued to fail in the worker on a folder deleted meanwhile).
    project_lock(project=base_model.project, doing="as the base model was being unregistered")
    base_model = BaseModel.objects.select_for_update(of=("self",)).get(pk=base_model.pk)
    if problems := base_model_readers(base_model=base_model):
        raise ValidationError({"delete": problems})
    if delete_files and (refusal := uploaded_folder_refusal(base_model=base_model)):
        raise ValidationError({"delete_files": refusal})
    copies = base_model_copy_dir(base_model)
    base_model.delete()
    activity_record(project=base_model.project, actor=actor, verb=Verb.BASE_MODEL_DELETED, target=base_model,
                    details={"files_deleted": True} if delete_files else None)
    transaction.on_commit(lambda: shutil.rmtree(copies, ignore_errors=True))
    chat_services.models_deleted(refs=[base_model.public_id])
    if not delete_files:
        logger.info("base model %s unregistered; its directory %s is left in place", base_model, base_model.path)
        return None
    removal = FolderRemoval(path=base_model.path)
    transaction.on_commit(lambda: _remove_folder(removal, base_model))
    return removal


def _remove_folder(removal: FolderRemoval, base_model: BaseModel) -> None:
    try:
        remove_uploaded_folder(path=removal.path, project_slug=base_model.project.slug)
    except OSError as error:
        removal.error = f"{error.filename}: {error.strerror}" if error.filename and error.strerror else str(error)
        logger.warning("base model %s unregistered; its folder %s could not be removed: %s", base_model, removal.path,
                       error)
    else:
        removal.removed = True
        logger.info("base model %s unregistered and its folder %s removed", base_model, removal.path)
