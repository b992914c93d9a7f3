"""Registering and unregistering base models. The caller has checked that the user may write to the
project (member or owner). A model's directory is the user's (under ``TEMPER_MODELS_ROOT``, perhaps
read-only, perhaps shared with other tools): neither registering nor unregistering ever writes to it (an
owner's upload, ``uploads.basemodel_upload``, writes a new one and then registers it here)."""
from __future__ import annotations

import logging
import shutil

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from webapp.basemodels.inspection import ModelDirError, read_model_facts, resolve_model_dir
from webapp.basemodels.models import BaseModel
from webapp.basemodels.selectors import base_model_readers, basemodel_named
from webapp.core.text import checked_name, checked_text
from webapp.projects.models import Project
from webapp.runs.serving_copies import base_model_copy_dir

logger = logging.getLogger(__name__)


BASE_MODEL_NAME_MAX = BaseModel._meta.get_field("name").max_length


@transaction.atomic
def basemodel_register(
    *, project: Project, name: str, path: str, user: AbstractBaseUser | None
) -> BaseModel:
    """Register the model directory at ``path`` (absolute, or relative to
    ``settings.MODELS_ROOT``) in ``project`` under ``name``.

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
            return _create(project=project, name=name, model_dir=model_dir, facts=facts, user=user)
    except IntegrityError:
        if (taken := basemodel_named(project=project, name=name)) is None:
            raise
        raise ValidationError({"name": name_taken_message(project, taken.name)}) from None


def name_taken_message(project: Project, name: str) -> str:
    return (f"{project.slug} already has a base model named {name!r}; names that differ only in letter case "
            "are the same name")


def _create(*, project: Project, name: str, model_dir, facts, user: AbstractBaseUser | None) -> BaseModel:
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
    )


@transaction.atomic
def basemodel_unregister(*, base_model: BaseModel) -> None:
    """Remove ``base_model``'s registration and its serving copies (their rows, and once committed their
    directory under ``DATA_ROOT/serving-copies/``), never the model's own directory. Refused
    (``ValidationError`` on ``delete``) while work still needs it (``selectors.base_model_readers``). Runs
    started from it keep their history and name it as deleted (``Run.deleted_references``); conversations
    with it say it is no longer available."""
    from webapp.chat import services as chat_services  # the chat is built on base models

    base_model = BaseModel.objects.select_for_update(of=("self",)).get(pk=base_model.pk)
    if problems := base_model_readers(base_model=base_model):
        raise ValidationError({"delete": problems})
    copies = base_model_copy_dir(base_model)
    base_model.delete()
    transaction.on_commit(lambda: shutil.rmtree(copies, ignore_errors=True))
    chat_services.models_deleted(refs=[base_model.public_id])
    logger.info("base model %s unregistered; its directory %s is left in place", base_model, base_model.path)
