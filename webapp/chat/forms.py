from __future__ import annotations

from django import forms

from webapp.chat.selectors import ModelChoice
from webapp.chat.services import MESSAGE_MAX_CHARS
from webapp.core.text import typed_text


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

    def __init__(self, *args, choices: list[ModelChoice], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["model"].choices = [(choice.ref, choice.option_label) for choice in choices]


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
