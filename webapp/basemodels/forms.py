from django import forms


class BaseModelRegisterForm(forms.Form):
    name = forms.CharField(max_length=100)
    path = forms.CharField(
        max_length=1024,
        help_text="The model directory (config.json, *.safetensors, tokenizer files): absolute, "
        "or relative to the models root.",
    )
