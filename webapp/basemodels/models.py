"""The base model registry: Hugging Face-format directories on the shared data
filesystem that runs start from. A registration records what was read from the
directory at that time; the files stay where they are, except a model Temper unpacked itself (``uploaded``), whose
folder an owner may delete with its registration (``services.basemodel_unregister``)."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from webapp.core.ids import PUBLIC_ID_MAX_LENGTH, new_public_id
from webapp.core.name_case import NameKeyModel
from webapp.projects.models import Project


def new_basemodel_id() -> str:
    return new_public_id("bm")


class BaseModel(NameKeyModel):
    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_basemodel_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="base_models")
    name = models.CharField(max_length=100)
    path = models.CharField(max_length=1024, help_text="Resolved absolute path of the model directory.")
    architecture = models.CharField(max_length=100)
    model_type = models.CharField(max_length=50, blank=True)
    parameter_count = models.BigIntegerField()
    context_length = models.IntegerField(null=True)
    vocab_size = models.IntegerField(null=True, help_text="config.json's: the rows of the embedding.")
    tokenizer_vocab_size = models.IntegerField(
        null=True, help_text="The ids the tokenizer has, fewer than vocab_size when the embedding is padded.")
    tokenizer_type = models.CharField(max_length=20)
    dtype = models.CharField(max_length=20)
    size_bytes = models.BigIntegerField()
    weight_files = models.JSONField(default=list)
    config = models.JSONField(default=dict)
    uploaded = models.BooleanField(
        default=False, help_text="Temper unpacked it from an archive into the project's own folder (uploads.py): the "
        "folder is Temper's to delete with the registration. False for a directory registered where it was.")
    registered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            # Names that differ only in letter case are one name ("Demo" and "demo" could not be told apart).
            models.UniqueConstraint(fields=["project", "name_key"], name="basemodel_unique_project_name_key"),
            models.UniqueConstraint(fields=["project", "path"], name="basemodel_unique_project_path"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"

    @property
    def vocabulary_padding(self) -> int | None:
        """Embedding rows past the tokenizer's ids (negative: ids without an embedding row);
        None when either size is unknown."""
        if self.vocab_size is None or self.tokenizer_vocab_size is None:
            return None
        return self.vocab_size - self.tokenizer_vocab_size
