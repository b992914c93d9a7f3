from django import forms


class BaseModelRegisterForm(forms.Form):
    name = forms.CharField(max_length=100)
    path = forms.CharField(
        max_length=1024,
        help_text="The model directory (config.json, *.safetensors, tokenizer files): absolute, "
        "or relative to the models root.",
    )


class BaseModelUploadForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        help_text="The model's name here, and its folder's under the project's own: letters, digits, '.', '_' and '-'.")
    archive = forms.FileField(
        widget=forms.ClearableFileInput(attrs={"accept": ".zip,.tar,.tar.gz,.tgz"}),
        help_text="A .zip, .tar or .tar.gz of a Hugging Face-format model directory (config.json, *.safetensors, "
        "tokenizer files).")
