"""Datasets and their versions.

A dataset is a named collection of uploads of one kind (``text``, ``sft``, ``preference``,
``prompts``; see ``jaxengine.data.formats``). Each upload is a new ``DatasetVersion``: the file
is stored under ``settings.DATA_ROOT`` and checked by a ``default`` worker task. A version that
passes becomes ``ready`` and never changes again (runs refer to it) until someone deletes it, file
and row (its number is not given again); one that fails keeps its errors but not its file, so
nothing unchecked is ever usable.
"""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import models

from jaxengine.data.formats import DatasetKind, FileFormat
from webapp.core.ids import PUBLIC_ID_MAX_LENGTH, new_public_id
from webapp.core.name_case import NameKeyModel
from webapp.projects.models import Project

KIND_CHOICES = [(kind.value, kind.value) for kind in DatasetKind]
FORMAT_CHOICES = [(fmt.value, fmt.value.upper()) for fmt in FileFormat]


def new_dataset_id() -> str:
    return new_public_id("ds")


def new_version_id() -> str:
    return new_public_id("dv")


class Dataset(NameKeyModel):
    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_dataset_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=KIND_CHOICES)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    # The highest version number given so far: numbers are never given twice, so a deleted "v3" that a
    # run's history or a teammate's note names is never another file.
    last_version_number = models.PositiveIntegerField(default=0)
    # Where the rows came from and under which terms: carried into the model card of every run trained on it
    # (``runs.selectors.run_provenance``), edited by members (``services.dataset_about_update``).
    # db_default: rows written by code from before these columns (a migration's older model) get "".
    source = models.CharField(max_length=500, blank=True, default="", db_default="", help_text=(
        "Where the data came from: an address (https://…), a Hugging Face hub id (org/name) or words."))
    licence = models.CharField(max_length=100, blank=True, default="", db_default="", help_text=(
        "The terms it is under, short: a licence id such as cc-by-4.0, or words."))
    description = models.TextField(max_length=2000, blank=True, default="", db_default="")

    class Meta:
        ordering = ["name"]
        constraints = [
            # Names that differ only in letter case are one name ("Demo" and "demo" could not be told apart).
            models.UniqueConstraint(fields=["project", "name_key"], name="dataset_unique_project_name_key"),
            models.CheckConstraint(
                condition=models.Q(kind__in=[kind.value for kind in DatasetKind]), name="dataset_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"


class VersionStatus(models.TextChoices):
    UPLOADED = "uploaded", "Uploaded"
    VALIDATING = "validating", "Validating"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


# A version's status in a sentence (DatasetVersion.status_phrase).
STATUS_PHRASES = {VersionStatus.UPLOADED: "is waiting for its check", VersionStatus.VALIDATING: "is being checked",
                  VersionStatus.READY: "is ready", VersionStatus.FAILED: "failed its check"}


class DatasetVersion(models.Model):
    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_version_id)
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    file_path = models.CharField(max_length=1024, help_text="Path of the stored file, relative to DATA_ROOT.")
    original_filename = models.CharField(max_length=255)
    format = models.CharField(max_length=10, choices=FORMAT_CHOICES)
    size_bytes = models.BigIntegerField()
    column_mapping = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=12, choices=VersionStatus.choices, default=VersionStatus.UPLOADED)
    row_count = models.BigIntegerField(null=True)
    errors = models.JSONField(default=list, blank=True, help_text="The first errors found (Issue.to_dict()).")
    error_count = models.IntegerField(default=0)
    notice = models.TextField(blank=True, default="", help_text=(
        "A word on the check under way that is no problem of the file: that its worker was lost and it started over "
        "(datasets.services.version_check_requeued). The check's outcome clears it."))
    statistics = models.JSONField(default=dict, blank=True)
    token_statistics = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    validated_at = models.DateTimeField(null=True)
    # Where a version written from another by a worker came from (``services.dataset_version_split`` and
    # ``services.dataset_version_derive``), by snapshot so that it still says so once that version is deleted; {} for
    # an upload. Keys: kind ("split", "dedupe" or "decontaminate"), source (dv_ id), dataset (ds_ id), dataset_name,
    # number. A split's: side ("train" or "held_out"), partner (the other side's dv_ id), fraction or count (as asked;
    # the other null), held_out_rows (the rows that asked for), seed, stratify (a column, or ""). A dedupe's and a
    # decontamination's: removed_rows (counted when asked); a decontamination's: against (dv_ id) and against_name
    # (that version as it was named: "qa-eval v2").
    derivation = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["dataset", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "number"], name="datasetversion_unique_number"),
            models.CheckConstraint(
                condition=models.Q(status__in=[status.value for status in VersionStatus]),
                name="datasetversion_status_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.dataset.name} v{self.number}"

    @property
    def absolute_path(self) -> Path:
        return Path(settings.DATA_ROOT) / self.file_path

    @property
    def row_digests_path(self) -> Path:
        """Beside the file once it is ready: each row's ``formats.row_digest`` in file order, 8 bytes a row (a
        launch counts the rows its train and eval versions share with them)."""
        return self.absolute_path.with_suffix(".rows")

    @property
    def search_index_path(self) -> Path:
        """Beside the file once a search built it: the searchable text of its rows (``webapp.datasets.search``)."""
        return self.absolute_path.with_suffix(".search")

    @property
    def search_rows_path(self) -> Path:
        """Beside the file with ``search_index_path``: its rows' examples, the ones a search shows read from here."""
        return self.absolute_path.with_suffix(".search-rows")

    @property
    def side_paths(self) -> tuple[Path, ...]:
        """The files kept beside the version's own, which go with it."""
        return (self.row_digests_path, self.search_index_path, self.search_rows_path)

    @property
    def is_settled(self) -> bool:
        """True once validation has finished, either way."""
        return self.status in (VersionStatus.READY, VersionStatus.FAILED)

    @property
    def being_written(self) -> bool:
        """A split's or another derivation's version whose file the worker has not written yet: its size (0) and
        file name say nothing true until then."""
        return bool(self.derivation) and self.status == VersionStatus.UPLOADED

    @property
    def status_phrase(self) -> str:
        """The status as a sentence says it after the version: "failed its check", not "is failed"."""
        return STATUS_PHRASES[self.status]
