from __future__ import annotations

from django import forms

from jaxengine.data import formats
from webapp.core.forms import TypedTextField
from webapp.datasets.models import KIND_CHOICES
from webapp.datasets.services import ABOUT_MAX_CHARS, DATASET_NAME_MAX, empty_upload_message
from webapp.datasets.uploads import one_file_per_upload_message

FORMAT_CHOICES = [("", "From the file extension")] + [(fmt.value, fmt.value.upper()) for fmt in formats.FileFormat]
# Every field a column mapping can name, across kinds; the page shows those of the chosen kind.
MAPPABLE_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(f for fields in formats.KIND_FIELDS.values() for f in fields))
ACCEPT = ",".join(sorted(formats.EXTENSIONS))


def mapping_field_name(field_name: str) -> str:
    return f"map_{field_name}"


class OneFileInput(forms.ClearableFileInput):
    """Hands its field every file sent under its name when there are several: Django's input keeps the
    last one, and the others would be dropped without a word."""

    def value_from_datadict(self, data, files, name):
        sent = files.getlist(name)
        return sent if len(sent) > 1 else super().value_from_datadict(data, files, name)


class DatasetFileField(forms.FileField):
    """A FileField that refuses several files (see ``OneFileInput``) and whose empty-file error names the
    file and says what to do (Django's says only "The submitted file is empty.")."""

    widget = OneFileInput

    def to_python(self, data):
        if isinstance(data, list):
            raise forms.ValidationError(one_file_per_upload_message(len(data)), code="several_files")
        if data and getattr(data, "size", None) == 0:
            raise forms.ValidationError(empty_upload_message(data.name), code="empty")
        return super().to_python(data)


class UploadForm(forms.Form):
    """Upload a dataset file: a new dataset (name and kind) or, with ``dataset``, a new version.

    The file field comes last: fields after it are lost when an oversize file stops the upload.
    """

    name = forms.CharField(max_length=100, help_text="A name for the dataset within this project.")
    kind = forms.ChoiceField(
        choices=KIND_CHOICES,
        initial=formats.DatasetKind.SFT,  # what a post-training team uploads most; text (pretraining) the least
        help_text="; ".join(f"<b>{kind.value}</b>: {text}" for kind, text in formats.KIND_DESCRIPTIONS.items()),
    )
    file_format = forms.ChoiceField(choices=FORMAT_CHOICES, required=False, label="Format")

    def __init__(self, *args, dataset=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.dataset = dataset
        if dataset is not None:
            del self.fields["name"]
            del self.fields["kind"]
        for field_name in MAPPABLE_FIELDS:
            self.fields[mapping_field_name(field_name)] = forms.CharField(
                max_length=200, required=False, label=f"Column for '{field_name}'",
                widget=forms.TextInput(attrs={"placeholder": field_name}),
            )
        self.fields["file"] = DatasetFileField(
            widget=OneFileInput(attrs={"accept": ACCEPT}),
            help_text="JSONL, JSON (an array of objects), CSV with a header row, or Parquet; UTF-8 text.",
        )

    @property
    def file_to_choose_again(self) -> str | None:
        """The name of the file sent with a form that comes back for errors in its other fields: the
        browser shows the file input empty, so the page says to choose it again."""
        sent = self.files.get("file") if self.is_bound else None
        if sent is None or not self.errors or "file" in self.errors:
            return None
        return sent.name

    def column_mapping(self) -> dict[str, str]:
        """The mapping for the dataset's kind: those of its fields with a column name filled in."""
        kind = formats.DatasetKind(self.dataset.kind if self.dataset is not None else self.cleaned_data["kind"])
        return {
            field_name: self.cleaned_data[mapping_field_name(field_name)].strip()
            for field_name in formats.KIND_FIELDS[kind]
            if self.cleaned_data.get(mapping_field_name(field_name), "").strip()
        }

    def mapping_fields(self):
        """(bound field, kinds that use it) pairs, for the column-mapping section of the page."""
        for field_name in MAPPABLE_FIELDS:
            kinds = " ".join(kind.value for kind, fields in formats.KIND_FIELDS.items() if field_name in fields)
            yield self[mapping_field_name(field_name)], kinds


class TokenStatisticsForm(forms.Form):
    base_model = forms.ChoiceField(label="Tokenizer of base model")

    def __init__(self, *args, base_models, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["base_model"].choices = [(model.public_id, model.name) for model in base_models]


class DatasetAboutForm(forms.Form):
    """"About this dataset": where its rows came from and under which terms, carried into the model cards of runs
    launched on it since (``services.dataset_about_update`` checks and stores it)."""

    source = forms.CharField(max_length=ABOUT_MAX_CHARS["source"], required=False, help_text=(
        "An address (https://…), a Hugging Face hub id (org/name) or words; blank if unknown."))
    licence = forms.CharField(max_length=ABOUT_MAX_CHARS["licence"], required=False, help_text=(
        "The terms the rows are under, e.g. cc-by-4.0, or the name of an agreement."))
    description = TypedTextField(max_length=ABOUT_MAX_CHARS["description"], required=False,
                                 widget=forms.Textarea(attrs={"rows": 3}))


class SplitForm(forms.Form):
    """"Split into train and held-out" on a ready version's page (``services.dataset_version_split`` checks the
    values and names each refusal's field)."""

    held_out = forms.CharField(label="Hold out", initial="0.1", max_length=40, help_text=(
        "A fraction of the rows (0.1 or 10%) or a number of rows (500)."))
    seed = forms.IntegerField(initial=0, min_value=0, help_text="The same seed splits the same way again.")
    stratify = forms.ChoiceField(label="Stratify by", required=False, help_text=(
        "Each value of this column holds out its share of the rows (a label such as task)."))
    train_name = forms.CharField(label="Training dataset", max_length=DATASET_NAME_MAX)
    held_out_name = forms.CharField(label="Held-out dataset", max_length=DATASET_NAME_MAX)

    def __init__(self, *args, dataset_name: str, columns: tuple[str, ...], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["stratify"].choices = [("", "No column: at random"), *((column, column) for column in columns)]
        self.fields["train_name"].initial = f"{dataset_name} train"
        self.fields["held_out_name"].initial = f"{dataset_name} held-out"


class DecontaminateForm(forms.Form):
    """"Remove rows shared with another version" on a ready version's page (``services.dataset_version_derive``
    checks the choice and names its refusal's field)."""

    against = forms.ChoiceField(label="Remove the rows shared with", help_text=(
        "Another ready version of the project, of this kind: an evaluation or benchmark set, say."))

    def __init__(self, *args, choices: list[tuple[str, str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["against"].choices = choices
