from django import forms

from webapp.basemodels.uploads import several_archives_message
from webapp.datasets.forms import OneFileInput


class BaseModelRegisterForm(forms.Form):
    name = forms.CharField(max_length=100)
    path = forms.CharField(
        max_length=1024,
        help_text="The model directory (config.json, *.safetensors, tokenizer files): absolute, "
        "or relative to the models root.",
    )


class ArchiveField(forms.FileField):
    """One archive: several files sent under its name are refused (``OneFileInput``), not all but the last dropped."""

    def to_python(self, data):
        if isinstance(data, list):
            raise forms.ValidationError(several_archives_message(len(data)), code="several_files")
        return super().to_python(data)


class BaseModelUploadForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        help_text="The model's name here, and its folder's under the project's own: letters, digits, '.', '_' and '-'.")
    archive = ArchiveField(
        widget=OneFileInput(attrs={"accept": ".zip,.tar,.tar.gz,.tgz"}),
        help_text="A .zip, .tar or .tar.gz of a Hugging Face-format model directory (config.json, *.safetensors, "
        "tokenizer files).")
