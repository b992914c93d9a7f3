"""Writes to datasets and their versions. Callers check access first (``get_project_for_user``
with the member role for uploads); these functions keep the invariants whoever calls them:
version numbers count up per dataset, a stored file is in place before its row is committed,
validation runs after commit on the ``default`` queue, a ready version never changes, and a
failed version keeps no file.
"""
from __future__ import annotations

import contextlib
import logging
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone
from kombu.exceptions import OperationalError
import numpy as np

from jaxengine.data import formats
from jaxengine.spec import TASK_DATASET_KINDS
from webapp.activity.models import Verb
from webapp.activity.services import activity_record
from webapp.basemodels.models import BaseModel
from webapp.basemodels.selectors import base_model_refusal
from webapp.celery import app as celery_app
from webapp.core.bidi import isolated
from webapp.core.text import checked_json, checked_name, checked_text, typed_text
from webapp.core.name_case import name_key
from webapp.datasets import derivations, splitting
from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus, new_version_id
from webapp.datasets.selectors import (PROMPT_READ_ONCE_QUEUED, TURN_SPLITS_QUEUED, dataset_about, dataset_named,
                                      repeats_counted, shared_row_count, shown_statistics, version_readers,
                                      version_row_digests)
from webapp.datasets.uploads import name_as_uploaded, store_upload
from webapp.projects.models import Project
from webapp.webhooks import services as webhooks
from webapp.workers.deliveries import LostWorker, task_deliveries

logger = logging.getLogger(__name__)

VALIDATE_TASK = "worker.tasks.datasets.validate_dataset_version"
TOKEN_STATISTICS_TASK = "worker.tasks.datasets.compute_token_statistics"
TURN_SPLITS_TASK = "worker.tasks.datasets.count_turn_splits"
PROMPT_READ_ONCE_TASK = "worker.tasks.datasets.count_prompt_read_once"
# A derived version's file (a split's two): ``dataset_derivation_write``.
DERIVE_TASK = "worker.tasks.datasets.derive_dataset_version"
# A late count (``late_count_request``) not done this long after it was queued (``selectors.TURN_SPLITS_QUEUED``; its
# task lost with Redis or its worker) is queued again by the next view of the version's page.
TURN_SPLITS_REQUEUE_SECONDS = 600
# Token lengths are measured on the first rows only: tokenizing a whole large upload would
# hold the default queue for minutes for a histogram that a sample draws as well.
TOKEN_STATISTICS_MAX_ROWS = 20_000
# A preference version's token statistics, by field: each side as a run encodes it, after the prompt.
PROMPT_AND_CHOSEN = "prompt + chosen"
PROMPT_AND_REJECTED = "prompt + rejected"
DATASET_NAME_MAX = Dataset._meta.get_field("name").max_length
# What a dataset's "About this dataset" holds (``dataset_about_update``), in the order its form and log name them.
ABOUT_FIELDS = ("source", "licence", "description")
ABOUT_MAX_CHARS = {field: Dataset._meta.get_field(field).max_length for field in ABOUT_FIELDS}


def _send(task_name: str, args: list[Any]) -> None:
    try:
        celery_app.send_task(task_name, args=args, queue="default")
    except OperationalError:
        # The row is committed and stays "uploaded"; the version page offers to queue it again.
        logger.exception("could not queue %s%s: is Redis (REDIS_URL) up?", task_name, tuple(args))


def _enqueue(task_name: str, *args: Any) -> None:
    transaction.on_commit(lambda: _send(task_name, list(args)))


def empty_upload_message(name: str) -> str:
    return f"{isolated(name)} is empty (0 bytes): choose the file that holds your rows, or export it again"


def _column_mapping(kind: str, columns: dict[str, str]) -> formats.ColumnMapping:
    if not isinstance(columns, dict):
        raise ValidationError({"column_mapping": "the column mapping must be a JSON object of field → column, "
                                                 'e.g. {"prompt": "question"}'})
    try:
        return formats.ColumnMapping(kind=formats.DatasetKind(kind), columns=columns)
    except ValueError as error:
        raise ValidationError({"column_mapping": str(error)}) from error


# Words a script sends as a kind, which name a kind's rows: a chat is an sft row's messages.
CHAT_WORDS = ("chat", "chats", "messages", "conversation", "conversations")


def _kind_meant(kind: str) -> str:
    """The kind a word that is none stands for, said after the refusal: a task's name (dpo trains on preference
    rows), or a chat; "" for any other word."""
    word = kind.strip().lower()
    if word in TASK_DATASET_KINDS:
        return f": {word} is a task, which trains on datasets of kind {TASK_DATASET_KINDS[word]}"
    if word in CHAT_WORDS:
        return ": chats (a messages column of role and content turns) are kind sft"
    return ""


@transaction.atomic
def dataset_create(*, project: Project, name: str, kind: str, user: AbstractBaseUser | None,
                   record: bool = True) -> Dataset:
    """Create an empty dataset ``name`` of ``kind`` in ``project``. ``record``: log it (``webapp.activity``); False
    where a worker makes it (a review campaign's export, logged when it was asked for)."""
    name = checked_name(name, field="name", max_length=DATASET_NAME_MAX)
    if not name:
        raise ValidationError({"name": "give the dataset a name, e.g. 'support-chats'"})
    allowed = [member.value for member in formats.DatasetKind]
    if not kind:
        raise ValidationError({"kind": f"choose the dataset's kind: one of {', '.join(allowed)}"})
    if kind.strip().lower() not in allowed:
        raise ValidationError({"kind": f"kind {kind!r} is not one of {', '.join(allowed)}{_kind_meant(kind)}"})
    kind = kind.strip().lower()  # in any letter case, as file_format
    if (taken := dataset_named(project=project, name=name)) is not None:
        raise ValidationError({"name": _name_taken(project, taken)})
    try:
        with transaction.atomic():  # a savepoint: a dataset made at the same moment under the same name
            dataset = Dataset.objects.create(project=project, name=name, kind=kind, created_by=user)
    except IntegrityError:
        if (taken := dataset_named(project=project, name=name)) is None:
            raise
        raise ValidationError({"name": _name_taken(project, taken)}) from None
    if record:
        activity_record(project=project, actor=user, verb=Verb.DATASET_CREATED, target=dataset)
    return dataset


def _checked_line(value: str, *, field: str, example: str) -> str:
    """A one-line field of "About this dataset" (``source``, ``licence``): stripped, as a name is checked
    (``checked_name``), and on one line: the model card writes it on one."""
    line = checked_name(value, field=field, max_length=ABOUT_MAX_CHARS[field])
    if "\n" in line or "\r" in line:
        raise ValidationError({field: f"the {field} is one line; put it on one, e.g. {example}, and say more in the "
                                      "description"})
    return line


def _checked_about(*, source: str | None, licence: str | None, description: str | None) -> dict[str, str]:
    """The fields given, checked as ``dataset_about_update`` stores them."""
    checked = {}
    if source is not None:
        checked["source"] = _checked_line(source, field="source",
                                          example="https://example.org/data or org/name on the Hugging Face hub")
    if licence is not None:
        checked["licence"] = _checked_line(licence, field="licence", example="cc-by-4.0")
    if description is not None:
        checked["description"] = checked_text(typed_text(description).strip(), field="description",
                                              max_length=ABOUT_MAX_CHARS["description"])
    return checked


@transaction.atomic
def dataset_about_update(*, dataset: Dataset, user: AbstractBaseUser | None, source: str | None = None,
                         licence: str | None = None, description: str | None = None) -> Dataset:
    """Set what "About this dataset" says: where its rows came from (``source``), under which terms (``licence``)
    and in words (``description``); None leaves a field as it is, "" clears it. All or nothing: a refusal
    (``ValidationError`` naming the field) changes none. Logged (the names of the fields changed, not their text)
    when something changed. Runs launched since carry them into their model cards (``runs.selectors.run_provenance``);
    callers check that the user is a member (as for an upload)."""
    checked = _checked_about(source=source, licence=licence, description=description)
    dataset = Dataset.objects.select_for_update(of=("self",)).select_related("project").get(pk=dataset.pk)
    changed = [field for field, value in checked.items() if getattr(dataset, field) != value]
    for field in changed:
        setattr(dataset, field, checked[field])
    if changed:
        dataset.save(update_fields=changed)
        activity_record(project=dataset.project, actor=user, verb=Verb.DATASET_CHANGED, target=dataset,
                        details={"changed": changed})
    return dataset


def _name_taken(project: Project, taken: Dataset) -> str:
    # Its id: an API client makes a new version by sending it as dataset, and had to list the datasets to find it.
    return (f"{project.slug} already has a dataset named {taken.name!r} (names that differ only in letter case are "
            f"the same name); upload a new version of it instead (in the API: dataset {taken.public_id}, no name)")


def next_version_number(*, dataset: Dataset) -> int:
    """The number the next upload to ``dataset`` gets (numbers of deleted versions are not given again)."""
    highest = dataset.versions.aggregate(highest=Max("number"))["highest"] or 0
    return max(dataset.last_version_number, highest) + 1


def _take_version_number(dataset: Dataset) -> int:
    """The next version number of ``dataset``, taken under its row's lock so that two uploads at once get
    different ones."""
    dataset = Dataset.objects.select_for_update(of=("self",)).get(pk=dataset.pk)
    number = next_version_number(dataset=dataset)
    Dataset.objects.filter(pk=dataset.pk).update(last_version_number=number)
    return number


def _new_version(dataset: Dataset, *, filename: str, file_format: str, column_mapping: dict[str, str],
                 user: AbstractBaseUser | None, **fields: Any) -> DatasetVersion:
    """The next version of ``dataset``, its number taken and its file's place in the dataset's folder set, not saved
    yet (an upload stores its file there first; a split's worker writes it later)."""
    version = DatasetVersion(dataset=dataset, number=_take_version_number(dataset), original_filename=filename[:255],
                             format=file_format, column_mapping=column_mapping, created_by=user, **fields)
    version.file_path = str((dataset_folder(dataset.public_id) / f"{version.public_id}.{file_format}")
                            .relative_to(settings.DATA_ROOT))
    return version


@transaction.atomic
def dataset_version_create(
    *,
    dataset: Dataset,
    upload: UploadedFile,
    file_format: str | None,
    column_mapping: dict[str, str],
    user: AbstractBaseUser | None,
    record: bool = True,
) -> DatasetVersion:
    """Store ``upload`` as the next version of ``dataset`` and queue its validation. ``record``: log it
    (``webapp.activity``); False where what made it is logged instead (a new dataset's first version, an export).

    ``file_format`` None means: tell it from the file name's extension. ``column_mapping`` maps
    the kind's fields to the file's column names (blank entries mean "same name").
    """
    # Checked as a name first (no bidi control, no zero-width character): "report" + U+202E + "lsx.csv" read
    # "reportvsc.xsl" on the version pages, and the extension it is told by was not the one shown.
    filename = checked_name(name_as_uploaded(upload.name or ""), field="file")
    if file_format:
        try:
            file_format = formats.FileFormat(file_format.strip().lower()).value
        except ValueError:
            accepted = ", ".join(member.value for member in formats.FileFormat)
            raise ValidationError({"file_format": f"unknown format {file_format!r}: use one of {accepted}, or leave it "
                                                  "out to tell the format from the file's extension"}) from None
    else:
        try:
            file_format = formats.detect_format(filename, shown_as=isolated(filename)).value
        except ValueError as error:
            raise ValidationError({"file": str(error)}) from error
    checked_json(column_mapping, field="column_mapping")
    mapping = _column_mapping(dataset.kind, column_mapping)
    if upload.size == 0:
        raise ValidationError({"file": empty_upload_message(filename or "the file")})
    if upload.size is not None and upload.size > settings.TEMPER_MAX_UPLOAD_BYTES:
        raise ValidationError({"file": f"the file is over the {settings.TEMPER_MAX_UPLOAD_BYTES} byte upload limit"})
    version = _new_version(dataset, filename=filename or "upload", file_format=file_format,
                           column_mapping=dict(mapping.columns), user=user)
    version.size_bytes = store_upload(upload, version.absolute_path)
    try:
        version.save()
    except BaseException:
        version.absolute_path.unlink(missing_ok=True)
        raise
    if record:
        activity_record(project=dataset.project, actor=user, verb=Verb.DATASET_VERSION_UPLOADED, target=version,
                        details={"file": version.original_filename})
    _enqueue(VALIDATE_TASK, version.pk)
    return version


@transaction.atomic
def dataset_create_with_upload(
    *,
    project: Project,
    name: str,
    kind: str,
    upload: UploadedFile,
    file_format: str | None,
    column_mapping: dict[str, str],
    user: AbstractBaseUser | None,
) -> DatasetVersion:
    """Create dataset ``name`` and its first version from ``upload``; nothing is created on error."""
    dataset = dataset_create(project=project, name=name, kind=kind, user=user)
    return dataset_version_create(
        dataset=dataset, upload=upload, file_format=file_format, column_mapping=column_mapping, user=user, record=False
    )


def dataset_version_requeue(*, version: DatasetVersion) -> DatasetVersion:
    """Queue again the validation of a version that is not settled: no worker took it (Redis was down
    when it was uploaded, or restarted without persistence), or the check stopped half-way (its worker
    process was killed or ran out of memory, and Celery dropped the message with it). Safe to repeat:
    validation of a settled version changes nothing. A derived version whose file is not written yet has its
    derivation queued again instead (``dataset_derivation_write``, as safe to repeat)."""
    if version.is_settled:
        raise ValidationError({"status": f"version {version.number} is {version.status}, not waiting for a worker"})
    if version.derivation and not version.absolute_path.is_file():
        _enqueue(DERIVE_TASK, *_derived_together(version))
        return version
    _enqueue(VALIDATE_TASK, version.pk)
    return version


def _derived_together(version: DatasetVersion) -> list[int | None]:
    """The versions one derivation writes, in the order its task names them: a split's two sides (None for a side
    deleted since: the task then fails the other, saying so), or ``version`` alone."""
    if version.derivation["kind"] != "split":
        return [version.pk]
    partner = (DatasetVersion.objects.filter(public_id=version.derivation["partner"]).values_list("pk", flat=True)
               .first())
    return [version.pk, partner] if version.derivation["side"] == "train" else [partner, version.pk]


# The two sides of a split, in the order the split task names them; each becomes a dataset of its own.
SPLIT_SIDES = ("train", "held_out")
SPLIT_FILE_WORDS = {"train": "train", "held_out": "held-out"}
# What each derivation is called where it is asked for, refused, failed or logged: the refusal of a version not
# ready ("only a ready version can be ..."), the word in a derived file's name, the failure's opening, the lost
# worker's note (``LostWorker.note``: doing, work), the activity verb.
DERIVATION_DONE = {"split": "split", "dedupe": "deduplicated", "decontaminate": "decontaminated"}
DERIVATION_FILE_WORDS = {"dedupe": "deduplicated", "decontaminate": "decontaminated"}
DERIVATION_FAILED = {"split": "the rows could not be split", "dedupe": "the exact repeats could not be removed",
                     "decontaminate": "the shared rows could not be removed"}
DERIVATION_LOST = {"split": ("splitting these rows", "the split"), "dedupe": ("removing the exact repeats", "the work"),
                   "decontaminate": ("removing the shared rows", "the work")}
DERIVATION_VERBS = {"dedupe": Verb.DATASET_VERSION_DEDUPED, "decontaminate": Verb.DATASET_VERSION_DECONTAMINATED}


def _ready_source(version: DatasetVersion, *, kind: str) -> DatasetVersion:
    """``version`` locked, for a derivation of ``kind`` (``DERIVATION_DONE``); refused on ``version`` unless ready."""
    source = (DatasetVersion.objects.select_for_update(of=("self",)).select_related("dataset__project")
              .get(pk=version.pk))
    if source.status != VersionStatus.READY:
        verb = "split" if kind == "split" else "derive from"
        then = ("wait for its check to end" if not source.is_settled
                else f"it keeps no rows: upload the file fixed, and {verb} that version")
        raise ValidationError({"version": f"{isolated(str(source))} {source.status_phrase}: only a ready version can "
                                          f"be {DERIVATION_DONE[kind]}; {then}"})
    return source


def _derivation_record(kind: str, source: DatasetVersion) -> dict[str, Any]:
    """What every derived version records of where it came from (``DatasetVersion.derivation``)."""
    return {"kind": kind, "source": source.public_id, "dataset": source.dataset.public_id,
            "dataset_name": source.dataset.name, "number": source.number}


def _derived_version(dataset: Dataset, *, source: DatasetVersion, file_word: str, record: dict[str, Any],
                     user: AbstractBaseUser | None, **fields: Any) -> DatasetVersion:
    """The next version of ``dataset``, saved waiting for the file a worker writes from ``source``
    (``dataset_derivation_write``): in ``derivations.derived_format``, named after the source's file."""
    out_format = derivations.derived_format(formats.FileFormat(source.format)).value
    stem = Path(source.original_filename).stem or "rows"
    version = _new_version(dataset, filename=f"{stem}-{file_word}.{out_format}", file_format=out_format,
                           column_mapping=dict(source.column_mapping), user=user, size_bytes=0, derivation=record,
                           **fields)
    version.save()
    return version


def _split_problems(source: DatasetVersion, *, held_out: Any, seed: Any, stratify: str,
                    names: dict[str, str]) -> tuple[dict[str, str], int]:
    """What is wrong with a split of ready version ``source`` as asked, by field (all of them at once, so that a
    form shows each beside its field), and the held-out rows it asks for."""
    problems: dict[str, str] = {}
    held_out_rows = 0
    try:
        held_out_rows = splitting.held_out_size(held_out).rows(source.row_count or 0)
    except splitting.SplitError as error:
        problems["held_out"] = str(error)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= splitting.MAX_SEED:
        problems["seed"] = f"the seed is a whole number from 0 to {splitting.MAX_SEED}, e.g. 0"
    if stratify and (refused := _stratify_problem(source, stratify=stratify)):
        problems["stratify"] = refused
    project = source.dataset.project
    for field, name in names.items():
        try:
            checked = checked_name(name, field=field, max_length=DATASET_NAME_MAX)
        except ValidationError as error:
            problems[field] = "; ".join(error.messages)
            continue
        if not checked:
            problems[field] = "give the new dataset a name, e.g. 'support-chats held-out'"
        elif (taken := dataset_named(project=project, name=checked)) is not None:
            problems[field] = (f"{project.slug} already has a dataset named {taken.name!r} (names that differ only "
                               "in letter case are the same name): choose another name")
    if "train_name" not in problems and "held_out_name" not in problems and \
            name_key(names["train_name"]) == name_key(names["held_out_name"]):
        problems["held_out_name"] = "the two sides need different names, e.g. 'qa train' and 'qa held-out'"
    return problems, held_out_rows


def _stratify_problem(source: DatasetVersion, *, stratify: str) -> str:
    """Why ready version ``source`` cannot be split stratified by column ``stratify`` as far as its first rows tell
    (``splitting.check_strata``); "" where they do not."""
    path, fmt = source.absolute_path, formats.FileFormat(source.format)
    try:
        columns = splitting.first_row_columns(path, fmt=fmt)
        if stratify not in columns:
            return (f"{isolated(str(source))} has no column {stratify[:100]!r}; its columns are "
                    f"{', '.join(map(repr, columns))}, or leave it blank to split at random")
        splitting.check_strata(path, fmt=fmt, column=stratify)
    except splitting.SplitError as error:
        return str(error)
    except (formats.DatasetFormatError, OSError) as error:
        raise ValidationError({"version": f"{isolated(str(source))} cannot be read ({error}); upload it again"}
                              ) from None
    return ""


@transaction.atomic
def dataset_version_split(*, version: DatasetVersion, held_out: Any, seed: Any = 0, stratify: str = "",
                          train_name: str | None = None, held_out_name: str | None = None,
                          user: AbstractBaseUser | None) -> tuple[DatasetVersion, DatasetVersion]:
    """Split ready version ``version`` into two new datasets of its kind, a training side and a held-out side
    (``train_name`` and ``held_out_name``, by default "<name> train" and "<name> held-out"), each with one version
    waiting for its file: ``held_out`` rows (a fraction in (0, 1) such as 0.1 or "10%", or a count of rows, fewer
    than the version's) go to the held-out side, drawn with ``seed``, each value of column ``stratify`` ("" for none)
    holding out its share, exact duplicates on one side (``splitting.split_assignment``). A ``default`` worker writes
    the two files and queues their checks (``dataset_derivation_write``), after which they are ready as uploads are.

    New datasets, not versions of existing ones: a dataset's versions are one data set's revisions, compared one
    against the next, and the two sides of a split are two data sets. Each keeps its ``derivation`` record (where it
    came from, as asked) and the source dataset's "About this dataset" (source, licence, description: the same rows,
    under the same terms). All or nothing: a refusal (``ValidationError`` naming each field: ``version``,
    ``held_out``, ``seed``, ``stratify``, ``train_name``, ``held_out_name``) saves nothing. Logged on the source
    version. Callers check that the user is a member, as for an upload."""
    source = _ready_source(version, kind="split")
    dataset = source.dataset
    stratify = (stratify or "").strip()
    names = {"train_name": (train_name or "").strip() or f"{dataset.name} train",
             "held_out_name": (held_out_name or "").strip() or f"{dataset.name} held-out"}
    problems, held_out_rows = _split_problems(source, held_out=held_out, seed=seed, stratify=stratify, names=names)
    if problems:
        raise ValidationError(problems)
    size = splitting.held_out_size(held_out)
    record = {**_derivation_record("split", source), "fraction": size.fraction, "count": size.count,
              "held_out_rows": held_out_rows, "seed": seed, "stratify": stratify}
    public_ids = {side: new_version_id() for side in SPLIT_SIDES}
    made = []
    for side, partner in zip(SPLIT_SIDES, reversed(SPLIT_SIDES)):
        field = f"{side}_name"
        try:
            new_dataset = dataset_create(project=dataset.project, name=names[field], kind=dataset.kind, user=user)
        except ValidationError as error:  # the name taken at this moment by someone else
            raise ValidationError({field: error.messages}) from None
        Dataset.objects.filter(pk=new_dataset.pk).update(**dataset_about(dataset=dataset))
        made.append(_derived_version(new_dataset, source=source, file_word=SPLIT_FILE_WORDS[side],
                                     record={**record, "side": side, "partner": public_ids[partner]}, user=user,
                                     public_id=public_ids[side]))
    train, held = made
    activity_record(project=dataset.project, actor=user, verb=Verb.DATASET_VERSION_SPLIT, target=source,
                    details={"train": str(train), "held_out": f"{held} ({size.shown()})", "seed": seed,
                             **({"stratified_by": stratify} if stratify else {})})
    _enqueue(DERIVE_TASK, train.pk, held.pk)
    return train, held


def _repeats_removed(source: DatasetVersion) -> int:
    """The rows a dedupe of ready ``source`` removes: the exact repeats its check counted, or, for a version checked
    before they were counted, counted from its digests."""
    if (repeats := repeats_counted(version=source)) is not None:
        return repeats
    digests = version_row_digests(version=source)
    if digests is None:
        raise ValidationError({"version": f"the rows of {isolated(str(source))} cannot be read (its file is gone "
                                          "from storage): upload it again"})
    return len(digests) - int(derivations.first_occurrences(digests).sum())


def _decontamination_against(source: DatasetVersion, against: str) -> tuple[DatasetVersion, int]:
    """The version ``against`` (a dv_ id of ``source``'s project) whose rows a decontamination of ``source`` removes,
    and how many of ``source``'s rows that removes; refused on ``against`` where it is none to remove rows of, or
    where the rows removed would be none or all."""
    against = (against or "").strip()
    if not against:
        raise ValidationError({"against": "choose the version whose rows to remove from this one, e.g. the "
                                          "evaluation set a run will be scored on"})
    other = (DatasetVersion.objects.filter(dataset__project_id=source.dataset.project_id, public_id=against)
             .select_related("dataset").first())
    if other is None:
        raise ValidationError({"against": f"{source.dataset.project.slug} has no dataset version {against[:40]!r}: "
                                          "choose one of its ready versions by its dv_ id"})
    if other.pk == source.pk:
        raise ValidationError({"against": "a version shares every row with itself: choose another version"})
    if other.status != VersionStatus.READY:
        raise ValidationError({"against": f"{isolated(str(other))} {other.status_phrase}: only a ready version's rows "
                                          "are known; wait for its check, or choose another version"})
    if other.dataset.kind != source.dataset.kind:
        # Digests are of the examples after each version's column mapping: rows of two kinds hold different fields,
        # so none is ever the same example; a "nothing shared" would be true and misleading.
        raise ValidationError({"against": f"{isolated(str(other))} is a {other.dataset.kind} dataset's version and "
                                          f"{isolated(str(source))} a {source.dataset.kind} one's: their rows are "
                                          f"different examples, never the same; choose a version of a "
                                          f"{source.dataset.kind} dataset"})
    shared = shared_row_count(version=source, other=other)
    if shared is None:
        raise ValidationError({"against": f"the rows of {isolated(str(source))} or {isolated(str(other))} cannot be "
                                          "read (a file gone from storage): upload it again"})
    if not shared:
        raise ValidationError({"against": f"{isolated(str(source))} shares no row with {isolated(str(other))}: "
                                          "there is nothing to remove"})
    if shared >= (source.row_count or 0):
        raise ValidationError({"against": f"every row of {isolated(str(source))} is in {isolated(str(other))}: "
                                          "removing them would leave no row; choose another version"})
    return other, shared


@transaction.atomic
def dataset_version_derive(*, version: DatasetVersion, kind: str, against: str = "",
                           user: AbstractBaseUser | None) -> DatasetVersion:
    """A new version of ``version``'s own dataset, written from ready ``version`` by a ``default`` worker
    (``dataset_derivation_write``) and checked as an upload is: ``kind`` "dedupe" keeps the first row of each exact
    repeat (``derivations.first_occurrences``), "decontaminate" drops every row that version ``against`` (a dv_ id
    of a ready version of the project, of the same kind) also holds (``derivations.rows_not_in``).

    A version of the same dataset, unlike a split's new datasets: the rows left are a revision of the same set, and
    the version comparison page shows exactly those removed. Rows are compared as training reads them (after each
    version's column mapping). Refused, saving nothing, where it would remove no row or every row (``version`` or
    ``against`` named). Logged on ``version``. Callers check that the user is a member, as for an upload."""
    if kind not in DERIVATION_VERBS:
        raise ValidationError({"kind": f"{str(kind)[:40]!r} is no derivation: use dedupe (remove exact repeats) or "
                                       "decontaminate (remove the rows shared with another version)"})
    source = _ready_source(version, kind=kind)
    details: dict[str, Any] = {}
    if kind == "dedupe":
        removed = _repeats_removed(source)
        if not removed:
            raise ValidationError({"version": f"{isolated(str(source))} has no exact repeats: there is nothing to "
                                              "remove"})
        record = {**_derivation_record(kind, source), "removed_rows": removed}
    else:
        other, removed = _decontamination_against(source, against)
        record = {**_derivation_record(kind, source), "removed_rows": removed, "against": other.public_id,
                  "against_name": str(other)}
        details["against"] = str(other)
    made = _derived_version(source.dataset, source=source, file_word=DERIVATION_FILE_WORDS[kind], record=record,
                            user=user)
    activity_record(project=source.dataset.project, actor=user, verb=DERIVATION_VERBS[kind], target=source,
                    details={"new_version": str(made), "removed_rows": removed, **details})
    _enqueue(DERIVE_TASK, made.pk)
    return made


def _derivation_fail(versions: list[DatasetVersion], message: str) -> None:
    """Fail the derived versions still waiting for their file, saying why (their page lists it as the problem)."""
    problem = formats.Issue(code=f"{versions[0].derivation['kind']}_failed", message=message)
    for version in versions:
        if DatasetVersion.objects.filter(pk=version.pk, status=VersionStatus.UPLOADED).update(
                status=VersionStatus.FAILED, error_count=1, errors=[problem.to_dict()], notice="",
                validated_at=timezone.now()):
            version.absolute_path.unlink(missing_ok=True)
            logger.warning("dataset version %s failed: %s", version.public_id, message)
            webhooks.dataset_version_settled(version=DatasetVersion.objects.select_related("dataset").get(pk=version.pk))


def _ready_version(public_id: str, *, named: str, role: str) -> DatasetVersion:
    """The ready version ``public_id`` a derivation reads (``named`` as its record names it, in the ``role`` it has:
    "which it is split from"); ``DerivationError`` once deleted."""
    version = DatasetVersion.objects.select_related("dataset").filter(public_id=public_id,
                                                                      status=VersionStatus.READY).first()
    if version is None:
        raise derivations.DerivationError(f"{named}, {role}, was deleted before a worker wrote this version: ask "
                                          "again of another version")
    return version


def _digests(version: DatasetVersion) -> np.ndarray:
    digests = version_row_digests(version=version)
    if digests is None:
        raise derivations.DerivationError(f"the rows of {version} cannot be read (its file is gone from storage): "
                                          "upload it again and derive from that version")
    return digests


def _destinations(record: dict[str, Any], source: DatasetVersion, digests: np.ndarray) -> np.ndarray:
    """Each source row's file among those the derivation writes (``derivations.write_rows``)."""
    if record["kind"] == "split":
        labels = (splitting.column_labels(source.absolute_path, fmt=formats.FileFormat(source.format),
                                          column=record["stratify"]) if record["stratify"] else None)
        return splitting.split_assignment(digests, held_out=record["held_out_rows"], seed=record["seed"],
                                          labels=labels).astype(np.int8)
    if record["kind"] == "dedupe":
        keep = derivations.first_occurrences(digests)
    else:
        against = _ready_version(record["against"], named=record["against_name"], role="whose rows it leaves out")
        keep = derivations.rows_not_in(digests, _digests(against))
    if not keep.any():
        raise derivations.DerivationError("no row would be left")
    return np.where(keep, 0, derivations.DROPPED).astype(np.int8)


def _derived_files(versions: list[DatasetVersion]) -> list[int]:
    """Write the files of ``versions`` (one derivation's, in its task's order) from the version they were asked of;
    their sizes in bytes."""
    record = versions[0].derivation
    role = "which it is split from" if record["kind"] == "split" else "which it is derived from"
    source = _ready_version(record["source"], named=f"{record['dataset_name']} v{record['number']}", role=role)
    destinations = _destinations(record, source, _digests(source))
    for version in versions:
        version.absolute_path.parent.mkdir(parents=True, exist_ok=True)
    return derivations.write_rows(source.absolute_path, fmt=formats.FileFormat(source.format),
                                  destinations=destinations, paths=[version.absolute_path for version in versions])


def dataset_derivation_write(*, version_ids: list[int | None]) -> list[DatasetVersion]:
    """Write the files of one derivation's versions (``dataset_version_split``'s two sides, in their order, or
    ``dataset_version_derive``'s version; the ``default`` worker runs this) and queue their checks, which make them
    ready (or failed) as an upload's check does. A derivation that cannot be made (the source deleted or unreadable,
    a side left empty by duplicates, a stratify column of too many values, the version to decontaminate against
    deleted) fails its versions with the reason. Safe to repeat: versions settled or deleted are left alone, and
    files written already (each is moved into place whole) are not written again. Returns the versions whose checks
    were queued."""
    found = {version.pk: version for version in DatasetVersion.objects.select_related("dataset").filter(
        pk__in=[pk for pk in version_ids if pk is not None], status=VersionStatus.UPLOADED)}
    if not found:
        return []
    waiting = [found[pk] for pk in version_ids if pk in found]
    if len(waiting) < len(version_ids):
        _derivation_fail(waiting, "its other side was deleted or failed before a worker split the rows: split the "
                                  "version again")
        return []
    kind = waiting[0].derivation["kind"]
    if not all(version.absolute_path.is_file() for version in waiting):
        try:
            sizes = _derived_files(waiting)
        except (derivations.DerivationError, formats.DatasetFormatError, OSError) as error:
            _derivation_fail(waiting, f"{DERIVATION_FAILED[kind]}: {error}")
            return []
        except Exception as error:  # a bug of Temper's own: settled, or the versions wait for good
            logger.exception("%s of %s failed", kind, ", ".join(version.public_id for version in waiting))
            _derivation_fail(waiting, f"{DERIVATION_FAILED[kind]}: an error of Temper's own stopped it "
                                      f"({type(error).__name__}: {error}): tell whoever runs Temper (the default "
                                      "worker's log has the details)")
            return []
        for version, size in zip(waiting, sizes):
            if not DatasetVersion.objects.filter(pk=version.pk).update(size_bytes=size):  # deleted meanwhile
                version.absolute_path.unlink(missing_ok=True)
    for version in waiting:
        _send(VALIDATE_TASK, [version.pk])
    return waiting


def _internal_error(error: Exception) -> formats.Issue:
    return formats.Issue(code="internal_error", message=(
        f"Temper's check of this file stopped on an error of its own ({type(error).__name__}: {error}), not on a "
        "problem it found in the file: tell whoever runs Temper (the default worker's log has the details), and "
        "upload the file again once it is mended"))


def dataset_version_validate(*, version_id: int) -> DatasetVersion | None:
    """Check a stored version against its kind (the ``default`` worker runs this).

    Afterwards the version is ``ready`` with its row count and statistics, or ``failed`` with
    its first errors and their total, its file deleted (an error of Temper's own reader too: ``internal_error``,
    logged with its traceback). Running it again on a settled version
    changes nothing, so a redelivered task is harmless. None when the version was deleted before or
    while it was checked.
    """
    version = DatasetVersion.objects.select_related("dataset").filter(pk=version_id).first()
    if version is None:  # deleted before a worker took it
        return None
    if version.is_settled:
        return version
    if not DatasetVersion.objects.filter(pk=version.pk).update(status=VersionStatus.VALIDATING):
        return None
    version.status = VersionStatus.VALIDATING
    mapping = formats.ColumnMapping(kind=formats.DatasetKind(version.dataset.kind), columns=version.column_mapping)
    try:
        report = formats.validate_file(
            version.absolute_path,
            fmt=formats.FileFormat(version.format),
            mapping=mapping,
            max_bytes=settings.TEMPER_MAX_UPLOAD_BYTES,
        )
    except FileNotFoundError:
        missing = formats.Issue(code="missing_file", message="the uploaded file is gone from storage; upload it again")
        report = formats.ValidationReport(row_count=0, error_count=1, errors=(missing,), statistics={}, columns=())
    except Exception as error:  # a reader's own bug: settled, or the version waits for good and a check again meets it
        logger.exception("dataset version %s: the check stopped on an error of Temper's", version.public_id)
        report = formats.ValidationReport(row_count=0, error_count=1, errors=(_internal_error(error),), statistics={},
                                          columns=())
    version.row_count = report.row_count
    version.error_count = report.error_count
    version.errors = [issue.to_dict() for issue in report.errors]
    version.statistics = report.statistics
    version.notice = ""
    version.validated_at = timezone.now()
    version.status = VersionStatus.READY if report.ok else VersionStatus.FAILED
    if report.ok:
        version.row_digests_path.write_bytes(report.row_digests)
    else:
        version.absolute_path.unlink(missing_ok=True)
    if not _save_unless_deleted(version, ["row_count", "error_count", "errors", "notice", "statistics", "validated_at",
                                          "status"]):
        version.row_digests_path.unlink(missing_ok=True)
        return None
    logger.info("dataset version %s: %s, %s rows, %s errors", version.public_id, version.status,
                report.row_count, report.error_count)
    webhooks.dataset_version_settled(version=version)
    return version


@transaction.atomic
def token_statistics_request(*, version: DatasetVersion, base_model: BaseModel) -> DatasetVersion:
    """Queue token-length statistics of a ready version with ``base_model``'s tokenizer."""
    if version.status != VersionStatus.READY:
        raise ValidationError({"base_model": "token lengths can be computed once the version is ready"})
    if base_model.project_id != version.dataset.project_id:
        raise ValidationError({"base_model": "choose a base model of this project"})
    version.token_statistics = {"status": "computing", "base_model": base_model.name}
    version.save(update_fields=["token_statistics"])
    _enqueue(TOKEN_STATISTICS_TASK, version.pk, base_model.pk)
    return version


def token_statistics_compute(*, version_id: int, base_model_id: int) -> DatasetVersion | None:
    """Token lengths per field of the first ``TOKEN_STATISTICS_MAX_ROWS`` rows (worker side).

    Strings are encoded as they are; chats are rendered with the model's chat template first, as
    training sees them, with the model's own template variables (its ``chat_template_kwargs.json``), which
    the result keeps as ``template_kwargs`` for the page to name: a run renders with its
    ``data.chat_template_kwargs`` over them, which a count made before any run cannot know. Where that template
    renders earlier assistant turns otherwise than the latest (Qwen3's; ``formats.turns_split_apart``), an sft
    run trains a conversation of several assistant turns one turn per example (``jaxengine.data.pipeline``): such
    a conversation is counted as those examples, each the conversation up to its turn as the template renders it,
    and ``split_by_turn`` says how many conversations and examples that made. A preference row is counted as a dpo or
    reward run encodes it (``pipeline.preference_lengths``): its prompt, and each side with the prompt before it
    (``PROMPT_AND_CHOSEN``, ``PROMPT_AND_REJECTED``), the lengths ``data.max_seq_len`` cuts; counts made before were of
    each side alone (``chosen``, ``rejected``), and their page still shows them so.
    """
    # Imported here: only the worker computes tokens, and the web process need not load tokenizers.
    from jaxengine.chat_template import ChatTemplateError
    from jaxengine.data.pipeline import DataError, preference_lengths
    from jaxengine.tokenizer import TokenizerError, load_tokenizer

    version = DatasetVersion.objects.select_related("dataset").filter(pk=version_id).first()
    base_model = BaseModel.objects.filter(pk=base_model_id).first()
    if version is None or base_model is None:  # deleted since the count was asked for
        return None
    result: dict[str, Any] = {"base_model": base_model.name, "tokenizer": base_model.tokenizer_type}
    rows, doing = 0, "loading the tokenizer"
    try:
        if refusal := base_model_refusal(base_model=base_model):
            raise TokenizerError(refusal)
        tokenizer = load_tokenizer(base_model.path)
        result["template_kwargs"] = dict(tokenizer.template_kwargs)
        doing = "reading row 1"
        mapping = formats.ColumnMapping(kind=formats.DatasetKind(version.dataset.kind), columns=version.column_mapping)
        split_by_turn = {"rows": 0, "examples": 0} if (mapping.kind is formats.DatasetKind.SFT
                                                      and _template_splits_turns(tokenizer)) else None
        lengths: dict[str, Counter] = {}

        def counts_of(example: dict[str, Any]) -> list[dict[str, int]]:
            """The token counts of a row's examples, by field and in all: one example, or one per assistant turn
            of a conversation trained so, the conversation up to that turn."""
            nonlocal doing
            chat = example.get("messages") if split_by_turn is not None else None
            if chat is not None and sum(message["role"] == "assistant" for message in chat) > 1:
                doing = f"row {rows + 1}, field messages"
                turns = [len(tokenizer.encode(tokenizer.apply_chat_template(chat[:index + 1])))
                         for index, message in enumerate(chat) if message["role"] == "assistant"]
                split_by_turn["rows"] += 1
                split_by_turn["examples"] += len(turns)
                return [{"messages": count, "total": count} for count in turns]
            counts = {}
            for field_name in formats.KIND_FIELDS[mapping.kind]:
                doing = f"row {rows + 1}, field {field_name}"
                value = example.get(field_name)
                if value is not None:
                    counts[field_name] = len(tokenizer.encode(
                        tokenizer.apply_chat_template(value) if isinstance(value, list) else value))
            if mapping.kind is formats.DatasetKind.PREFERENCE:
                doing = f"row {rows + 1}, fields prompt, chosen and rejected"
                chosen, rejected = preference_lengths(example, tokenizer=tokenizer)
                return [{"prompt": counts.get("prompt", 0), PROMPT_AND_CHOSEN: chosen, PROMPT_AND_REJECTED: rejected}]
            return [{**counts, "total": sum(counts.values())}]

        for example in formats.iter_examples(version.absolute_path, fmt=formats.FileFormat(version.format), mapping=mapping):
            for counts in counts_of(example):
                for field_name, count in counts.items():
                    lengths.setdefault(field_name, Counter())[count] += 1
            rows += 1
            doing = f"reading row {rows + 1}"
            if rows >= TOKEN_STATISTICS_MAX_ROWS:
                break
    # A chat template that raises on a row (Gemma's on a system turn) is the model's to fix, as a broken
    # tokenizer is; uncaught, it left the statistics 'computing'.
    except ChatTemplateError as error:  # a template may fail on some rows only: say which
        result.update(status="failed", error=f"{doing}: {error}" if doing.startswith("row") else str(error))
    except (TokenizerError, formats.DatasetFormatError, OSError) as error:
        result.update(status="failed", error=str(error))
    except DataError as error:  # a preference row whose turns the template renders so that they cannot be located
        result.update(status="failed", error=f"{doing}: {error}")
    # Anything else (a template's own bug, a tokenizer library's) is recorded too: uncaught, it ended the task
    # and left the statistics 'computing' for ever, with nothing on the page to say why.
    except Exception as error:
        logger.exception("token statistics of %s with %s failed", version.public_id, base_model.name)
        result.update(status="failed", error=f"{doing}: {type(error).__name__}: {error}")
    else:
        result.update(
            status="ready",
            rows=rows,
            sampled=rows < (version.row_count or 0),
            unit="tokens",
            fields={name: formats.summarize_lengths(counter) for name, counter in sorted(lengths.items())},
        )
        if split_by_turn is not None:
            result["split_by_turn"] = split_by_turn
    version.token_statistics = result
    return version if _save_unless_deleted(version, ["token_statistics"]) else None


def version_turn_splits(*, version: DatasetVersion) -> dict[str, int] | None:
    """The ``turn_splits`` statistics of a ready sft version (``formats.TurnSplits``: its conversations of several
    assistant turns, the examples a template that trains them one turn per example makes of them, the characters),
    counted now where its validation came before they were counted, and kept in its statistics: a launch's
    turn-split warning and the version's page need them. One pass over the file, a row at a time as validation reads
    it, once per version. None for another kind, a version not ready, or a file that cannot be read now (the run's
    start says what is wrong with it)."""
    if version.status != VersionStatus.READY or version.dataset.kind != formats.DatasetKind.SFT:
        return None
    if isinstance(splits := (version.statistics or {}).get("turn_splits"), dict):
        return splits
    tally = formats.TurnSplits()
    mapping = formats.ColumnMapping(kind=formats.DatasetKind.SFT, columns=version.column_mapping)
    try:
        examples = formats.iter_examples(version.absolute_path, fmt=formats.FileFormat(version.format), mapping=mapping)
        for row, example in enumerate(examples, start=1):
            tally.add(example, row)
    except (formats.DatasetFormatError, OSError, ValueError) as error:
        logger.warning("turn splits of %s not counted: %s", version.public_id, error)
        return None
    splits = tally.to_dict()
    with transaction.atomic():
        stored = DatasetVersion.objects.select_for_update(of=("self",)).filter(pk=version.pk).first()
        if stored is not None and "turn_splits" not in (stored.statistics or {}):
            stored.statistics = {**shown_statistics(stored.statistics), "turn_splits": splits}
            stored.save(update_fields=["statistics"])
    version.statistics = {**shown_statistics(version.statistics), "turn_splits": splits}
    return splits


def version_prompt_read_once(*, version: DatasetVersion) -> dict[str, Any] | None:
    """The ``prompt_read_once`` statistics of a ready preference version (its rows in UltraFeedback's layout, read with
    their prompt's turns once, ``formats.read_prompt_once``), counted now where its validation came before such rows
    were so read. That validation counted those rows with the prompt in each side: its lengths, chat shapes and pairs,
    and the row digests, are counted again too (one validation pass over the file) and stored in their place. None for
    another kind, a version not ready, or a file that cannot be read now or no longer passes (logged; the run's start
    says what is wrong with it)."""
    if version.status != VersionStatus.READY or version.dataset.kind != formats.DatasetKind.PREFERENCE:
        return None
    if isinstance(read_once := (version.statistics or {}).get("prompt_read_once"), dict):
        return read_once
    mapping = formats.ColumnMapping(kind=formats.DatasetKind.PREFERENCE, columns=version.column_mapping)
    try:
        report = formats.validate_file(version.absolute_path, fmt=formats.FileFormat(version.format), mapping=mapping)
    except (OSError, ValueError) as error:
        logger.warning("rows read with their prompt once of %s not counted: %s", version.public_id, error)
        return None
    if not report.ok:
        logger.warning("rows read with their prompt once of %s not counted: its file no longer passes (%s)",
                       version.public_id, "; ".join(issue.message for issue in report.errors[:3]))
        return None
    with transaction.atomic():
        stored = DatasetVersion.objects.select_for_update(of=("self",)).filter(pk=version.pk).first()
        if stored is not None and "prompt_read_once" not in (stored.statistics or {}):
            stored.statistics = {**shown_statistics(stored.statistics), **report.statistics}
            stored.save(update_fields=["statistics"])
            stored.row_digests_path.write_bytes(report.row_digests)
    version.statistics = {**shown_statistics(version.statistics), **report.statistics}
    return report.statistics["prompt_read_once"]


# What a version's validation counts now that versions validated before lack, by kind: the statistics key that holds
# it, its marker while queued (``selectors.COUNT_QUEUED_MARKERS``) and the worker's task that counts it.
LATE_COUNTS = {
    formats.DatasetKind.SFT: ("turn_splits", TURN_SPLITS_QUEUED, TURN_SPLITS_TASK),
    formats.DatasetKind.PREFERENCE: ("prompt_read_once", PROMPT_READ_ONCE_QUEUED, PROMPT_READ_ONCE_TASK),
}


def late_count_request(*, version: DatasetVersion) -> bool:
    """For the version's page: whether a count that a ready version's validation did not make yet (``LATE_COUNTS``:
    an sft version's turn splits, ``version_turn_splits``; a preference version's rows read with their prompt once,
    ``version_prompt_read_once``) is still to make (the page says "counting…" and refreshes). The count is one pass
    over the whole file, which held the page's request for as long as a large version takes: it is queued on the
    ``default`` queue instead, once, and again only where one queued ``TURN_SPLITS_REQUEUE_SECONDS`` ago has not
    counted. False where there is nothing to count."""
    late = LATE_COUNTS.get(formats.DatasetKind(version.dataset.kind))
    if version.status != VersionStatus.READY or late is None:
        return False
    key, marker, task = late
    if isinstance((version.statistics or {}).get(key), dict):
        return False
    now = timezone.now().timestamp()
    with transaction.atomic():
        stored = DatasetVersion.objects.select_for_update(of=("self",)).filter(pk=version.pk).first()
        if stored is None:
            return False
        statistics = stored.statistics or {}
        if isinstance(statistics.get(key), dict):
            version.statistics = statistics
            return False
        queued = statistics.get(marker)
        if not isinstance(queued, (int, float)) or not 0 <= now - queued < TURN_SPLITS_REQUEUE_SECONDS:
            stored.statistics = {**statistics, marker: now}
            stored.save(update_fields=["statistics"])
            _enqueue(task, version.pk)
        version.statistics = stored.statistics
    return True


def turn_splits_count(*, version_id: int) -> dict[str, int] | None:
    """``version_turn_splits`` of a version by id (worker side of ``late_count_request``); None for one deleted
    since, or with nothing to count."""
    version = DatasetVersion.objects.select_related("dataset").filter(pk=version_id).first()
    return version_turn_splits(version=version) if version is not None else None


def prompt_read_once_count(*, version_id: int) -> dict[str, Any] | None:
    """``version_prompt_read_once`` of a version by id (worker side of ``late_count_request``); None for one deleted
    since, or with nothing to count."""
    version = DatasetVersion.objects.select_related("dataset").filter(pk=version_id).first()
    return version_prompt_read_once(version=version) if version is not None else None


def _template_splits_turns(tokenizer) -> bool:
    """Whether ``tokenizer``'s chat template, with the model's own variables, has an sft run train a conversation
    of several assistant turns one turn per example, as ``runs.services._turn_split_warnings`` tells a launch."""
    from jaxengine.chat_template import GENERATION_MARKER

    if GENERATION_MARKER.search(tokenizer.chat_template or ""):
        return False
    try:
        return formats.turns_split_apart(
            lambda messages, prompt: tokenizer.apply_chat_template(messages, add_generation_prompt=prompt))
    # A template that raises on the probe chat (a bug of its own) raises at the file's rows too, which the count's
    # failure then names.
    except Exception:
        return False


# Not "split it into smaller files": a run trains on one version, so the parts would each train alone.
WORKERS_LOST_PROBLEM = ("checking this file stopped two workers in turn (killed, out of memory, or their host lost); it "
                        "is not checked again: ask an administrator for workers with more memory and upload it again, "
                        "or upload fewer rows (not the file split in parts: a run trains on one version)")


def versions_fail_abandoned(*, now: datetime | None = None) -> list[DatasetVersion]:
    """Fail each version being checked whose check lost two workers in turn (run by every worker's reaper,
    ``worker/reaper.py``): ``deliveries_restore_orphaned`` queues a dead worker's message again once, and one that
    kills its next worker too (a file too big for its memory) is left to Celery's visibility timeout, an hour, after
    which it kills another. Its message is held by no live worker (``workers.deliveries.task_deliveries``), was
    delivered again, and that delivery is ``TEMPER_RUN_LOST_SECONDS`` old. The version fails with the reason
    (``WORKERS_LOST_PROBLEM``) and its file goes, as any failed check's; its redelivery then finds it settled.
    Safe from many reapers at once: a version is failed only while still being checked."""
    now = now or timezone.now()
    checking = list(DatasetVersion.objects.filter(status=VersionStatus.VALIDATING))
    if not checking:
        return []
    deliveries = task_deliveries(task=VALIDATE_TASK, now=now)
    if deliveries is None:
        return []
    abandoned = deliveries.abandoned(delivered_before=now - timedelta(seconds=settings.TEMPER_RUN_LOST_SECONDS))
    failed = []
    for version in checking:
        if (version.pk,) not in abandoned:
            continue
        problem = formats.Issue(code="worker_lost", message=WORKERS_LOST_PROBLEM)
        if not DatasetVersion.objects.filter(pk=version.pk, status=VersionStatus.VALIDATING).update(
                status=VersionStatus.FAILED, error_count=1, errors=[problem.to_dict()], notice="", validated_at=now):
            continue
        version.absolute_path.unlink(missing_ok=True)
        logger.warning("dataset version %s failed: %s", version.public_id, WORKERS_LOST_PROBLEM)
        failed.append(DatasetVersion.objects.get(pk=version.pk))
        webhooks.dataset_version_settled(version=failed[-1])
    return failed


def version_check_requeued(arguments: tuple, *, lost: LostWorker) -> bool:
    """Say on a version being checked that its worker was lost and the check was queued again
    (``workers.deliveries.FIRST_LOSS_NOTES``): in its ``notice``, not among its ``errors``, which list problems of
    the file only (an API client reads any as the version's failure); the check's outcome clears it. Whether it was
    said (not for a version settled or deleted meanwhile)."""
    (version_id,) = arguments
    return DatasetVersion.objects.filter(pk=version_id, status__in=(VersionStatus.UPLOADED, VersionStatus.VALIDATING)
                                         ).update(notice=lost.note(doing="checking this file", work="the check")) > 0


def derivation_requeued(arguments: tuple, *, lost: LostWorker) -> bool:
    """Say on the versions of a derivation still waiting for their files (a split's two sides) that the worker writing
    them was lost and the work was queued again (``workers.deliveries.FIRST_LOSS_NOTES``), as
    ``version_check_requeued`` says of a check; their check's outcome clears it. Whether it was said."""
    said = 0
    for version in DatasetVersion.objects.filter(pk__in=[pk for pk in arguments if pk is not None],
                                                 status=VersionStatus.UPLOADED).only("pk", "derivation"):
        doing, work = DERIVATION_LOST[version.derivation["kind"]]
        said += DatasetVersion.objects.filter(pk=version.pk).update(notice=lost.note(doing=doing, work=work))
    return said > 0


@transaction.atomic
def token_statistics_requeued(arguments: tuple, *, lost: LostWorker) -> bool:
    """Say beside a token count under way that its worker was lost and the count was queued again
    (``workers.deliveries.FIRST_LOSS_NOTES``), until the count's outcome replaces it. Whether it was said (not for
    a count ended or asked again with another model meanwhile)."""
    version_id, base_model_id = arguments
    version = DatasetVersion.objects.select_for_update(of=("self",)).filter(pk=version_id).first()
    base_model = BaseModel.objects.filter(pk=base_model_id).first()
    if (version is None or base_model is None or version.token_statistics.get("status") != "computing"
            or version.token_statistics.get("base_model") != base_model.name):
        return False
    version.token_statistics = {**version.token_statistics,
                                "note": lost.note(doing="counting these tokens", work="the count")}
    version.save(update_fields=["token_statistics"])
    return True


def _save_unless_deleted(version: DatasetVersion, fields: list[str]) -> bool:
    """Save a worker's result on ``version``; False (nothing saved) when a person deleted the version while
    the worker read it (``save(update_fields=...)`` raises when no row is left to update)."""
    if not DatasetVersion.objects.filter(pk=version.pk).exists():
        logger.info("dataset version %s was deleted while a worker read it; its result is dropped", version.public_id)
        return False
    try:
        version.save(update_fields=fields)
    except DatabaseError:  # deleted between the two statements
        return False
    return True


@transaction.atomic
def dataset_version_delete(*, version: DatasetVersion, actor: AbstractBaseUser | None = None) -> None:
    """Delete ``version`` and, once committed, its file. Refused (``ValidationError`` on ``delete``) while
    work still reads it. Runs trained on it keep their history and name it as deleted
    (``Run.deleted_references``); review campaigns and exports keep their copies of its rows."""
    # Joined to the dataset for the names its refusals show; the lock is the version's only, so that an upload
    # of another version (which takes its number under the dataset's lock) need not wait for this one.
    version = DatasetVersion.objects.select_for_update(of=("self",)).select_related("dataset").get(pk=version.pk)
    if problems := version_readers(versions=[version]):
        raise ValidationError({"delete": problems})
    paths = [version.absolute_path, *version.side_paths]
    version.delete()
    activity_record(project=version.dataset.project, actor=actor, verb=Verb.DATASET_VERSION_DELETED, target=version)
    transaction.on_commit(lambda: remove_dataset_files(paths, dataset_ids=[]))
    logger.info("dataset version %s (%s) deleted", version.public_id, version)


@transaction.atomic
def dataset_delete(*, dataset: Dataset, actor: AbstractBaseUser | None = None) -> None:
    """Delete ``dataset`` with every version and, once committed, their files; refused as
    ``dataset_version_delete`` is while work still reads one of them. Its name is free again."""
    dataset = Dataset.objects.select_for_update(of=("self",)).get(pk=dataset.pk)
    versions = list(DatasetVersion.objects.select_for_update(of=("self",)).select_related("dataset")
                    .filter(dataset=dataset))
    if problems := version_readers(versions=versions):
        raise ValidationError({"delete": problems})
    paths = [path for version in versions for path in (version.absolute_path, *version.side_paths)]
    dataset.delete()
    activity_record(project=dataset.project, actor=actor, verb=Verb.DATASET_DELETED, target=dataset,
                    details={"versions": len(versions)})
    transaction.on_commit(lambda: remove_dataset_files(paths, dataset_ids=[dataset.public_id]))
    logger.info("dataset %s (%s) deleted with %d versions", dataset.public_id, dataset.name, len(versions))


def dataset_folder(public_id: str) -> Path:
    """The folder of a dataset's version files (``dataset_version_create`` stores them there)."""
    return Path(settings.DATA_ROOT) / "datasets" / public_id


def remove_dataset_files(paths: list[Path], *, dataset_ids: list[str]) -> None:
    """Remove deleted versions' files, then the folders of the deleted datasets ``dataset_ids``: taken from
    the datasets, not the files, since a dataset whose versions were deleted before it, or all failed (a
    failed version keeps no file), has a folder and no file in it."""
    for path in paths:
        path.unlink(missing_ok=True)
    for public_id in dataset_ids:
        with contextlib.suppress(OSError):  # not empty: something else was put there; or never made
            dataset_folder(public_id).rmdir()
