from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from webapp.chat.selectors import ModelChoice
from webapp.chat.services import MESSAGE_MAX_CHARS
from webapp.chat.openai_api import MAX_STOP_SEQUENCES
from webapp.core.text import checked_text, typed_text


class TypedTextField(forms.CharField):
    """Text for the model, typed in a textarea: its line breaks as typed (``typed_text``), not as the form sent them."""

    def to_python(self, value):
        return typed_text(super().to_python(value))


def _setting(field: type[forms.Field], *, label: str, minimum: float, maximum: float, **kwargs) -> forms.Field:
    """A sampling setting whose every error (empty, not a number, out of range) names it and its range, where
    Django's said "Ensure this value is less than or equal to 2.0." under a field it did not name."""
    whole = field is forms.IntegerField
    message = f"{label} must be {'a whole number' if whole else 'a number'} from {minimum:g} to {maximum:g}."
    return field(min_value=minimum, max_value=maximum, label=label, **kwargs,
                 error_messages={kind: message for kind in ("required", "invalid", "min_value", "max_value")})


class ConversationForm(forms.Form):
    """A new conversation: the model, the system prompt and the sampling settings."""

    model = forms.ChoiceField(help_text="A base model, a succeeded run's export, or an exported checkpoint.")
    system_prompt = TypedTextField(widget=forms.Textarea(attrs={"rows": 3}), required=False, max_length=20_000)
    temperature = _setting(forms.FloatField, label="Temperature", minimum=0.0, maximum=2.0, initial=0.7,
                           help_text="0 is greedy.")
    top_p = _setting(forms.FloatField, label="Top-p", minimum=0.01, maximum=1.0, initial=1.0, help_text="1 is off.")
    top_k = _setting(forms.IntegerField, label="Top-k", minimum=0, maximum=1000, initial=0, help_text="0 is off.")
    # As the API's max_tokens (and the serve request's bound); an answer gets no more than the model's context
    # leaves it in any case (worker.tasks.serve.fit_to_context).
    max_tokens = _setting(forms.IntegerField, label="Max tokens", minimum=1, maximum=8192, initial=256,
                          help_text="At most what the model's context leaves after the conversation.")

    # Optional, as /v1's (same ranges): left empty, a penalty is 0 (off).
    presence_penalty = _setting(forms.FloatField, label="Presence penalty", minimum=-2.0, maximum=2.0, initial=0.0,
                                required=False, help_text="0 is off; above 0, a token already in the answer is "
                                                          "less likely to come again.")
    frequency_penalty = _setting(forms.FloatField, label="Frequency penalty", minimum=-2.0, maximum=2.0, initial=0.0,
                                 required=False, help_text="0 is off; above 0, the more often a token came, the "
                                                           "less likely it is again.")
    stop = TypedTextField(label="Stop sequences", widget=forms.Textarea(attrs={"rows": 2}), required=False,
                          strip=False, max_length=4_000,
                          help_text="One a line, up to 4: the answer ends before the first to appear.")

    def __init__(self, *args, choices: list[ModelChoice], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["model"].choices = [(choice.ref, choice.option_label) for choice in choices]

    def clean_presence_penalty(self) -> float:
        return self.cleaned_data["presence_penalty"] or 0.0

    def clean_frequency_penalty(self) -> float:
        return self.cleaned_data["frequency_penalty"] or 0.0

    def clean_stop(self) -> list[str]:
        """The stop sequences, one a line (spaces kept, as they are part of the text; empty lines left out),
        checked as /v1 checks its ``stop`` (``openai_api.MAX_STOP_SEQUENCES``)."""
        sequences = [line for line in self.cleaned_data["stop"].split("\n") if line]
        if len(sequences) > MAX_STOP_SEQUENCES:
            raise forms.ValidationError(f"Stop sequences: {len(sequences)} given; give at most "
                                        f"{MAX_STOP_SEQUENCES} stop sequences, one a line.")
        for sequence in sequences:
            try:
                checked_text(sequence, field="stop")
            except ValidationError as error:
                raise forms.ValidationError(f"Stop sequences: {error.message_dict['stop'][0]}.") from None
        return sequences


class MessageForm(forms.Form):
    # The page shows no label beside the box: its name and how to send are on the box itself.
    content = TypedTextField(
        widget=forms.Textarea(attrs={"rows": 3, "aria-label": "Message",
                                     "placeholder": "Message the model: Enter sends, Shift+Enter starts a new line"}),
        max_length=MESSAGE_MAX_CHARS, strip=False)


class ArenaExportForm(forms.Form):
    """The arena's export of its decisive votes: the ``preference`` dataset whose next version they become
    (``arena.arena_export`` checks the name; its errors are keyed by this field)."""

    dataset_name = forms.CharField(required=False, initial="arena-preferences", label="Dataset name")
