from __future__ import annotations

import json
import re
from collections.abc import Iterable

from django import forms
from django.core.exceptions import ValidationError

from webapp.chat.selectors import ModelChoice, TemplateVariable
from webapp.chat.services import (MESSAGE_MAX_CHARS, TEMPLATE_VARIABLE_MAX_CHARS, checked_template_variables,
                                  unread_variable_problem)
from webapp.chat.openai_api import MAX_STOP_SEQUENCES
from webapp.core.forms import TypedTextField
from webapp.core.model_refs import chat_ref
from webapp.core.text import checked_text


# The Thinking control where one setting serves two models, an arena battle's and a generated review campaign's: each
# model's own default, or the chat's switch on or off for both (sent as enable_thinking to a model whose chat template
# reads it). The values a form sends, as ``enable_thinking`` keeps them.
THINKING_CHOICES = [("", "Each model's default"), ("on", "On"), ("off", "Off")]
THINKING_VALUES = {"": None, "on": True, "off": False}
THINKING_HELP = ("For models whose chat template reads enable_thinking (Qwen3's): on, the model reasons in a think block "
                 "before it answers; off, its template closes an empty one. Each model's default: as its own template "
                 "variables set it (a run trained with thinking off answers with it off).")


def thinking_choice(value: str) -> bool | None:
    """``enable_thinking`` for a Thinking control's ``value`` (``THINKING_CHOICES``); a ``ValidationError`` keyed
    ``thinking`` for any other."""
    if value not in THINKING_VALUES:
        raise ValidationError({"thinking": f"Thinking: {value!r} is not a choice; choose on, off, or each model's "
                                           "default (empty)"})
    return THINKING_VALUES[value]


# A chat template variable's field is ``var_<name>``; a boolean's is a select, unset meaning the template's own default.
VARIABLE_PREFIX = "var_"
VARIABLE_BOOLEAN_CHOICES = [("", "Not sent (the model's default)"), ("true", "true"), ("false", "false")]
VARIABLE_HELP = ("Read by the model's chat template, sent with every turn; filled in with the model's own value where it "
                 "has one. Empty: not sent (sent empty where the model sets it).")
VARIABLE_BOOLEAN_HELP = "Read by the model's chat template as a switch, sent with every turn."


def template_variable_field(*, name: str, readers: Iterable[TemplateVariable], help_text: str = "",
                            switch_help_text: str = "") -> forms.Field:
    """The field of chat template variable ``name`` read by ``readers`` (a model's ``TemplateVariable`` each), alike
    wherever one is set (this chat panel, the arena's compare mode, a generated review campaign): a select of true or
    false, or not sent (the template's own default), where every reader reads it as a switch, with
    ``switch_help_text``; a text box otherwise, with ``help_text``. What is sent is read by ``typed_template_value``."""
    if all(variable.kind == "boolean" for variable in readers):
        field = forms.ChoiceField(choices=VARIABLE_BOOLEAN_CHOICES, required=False, help_text=switch_help_text)
    else:
        field = forms.CharField(required=False, strip=False, max_length=TEMPLATE_VARIABLE_MAX_CHARS,
                                help_text=help_text)
    field.label = f"{name} (chat template variable)"
    return field


def as_typed_text(value) -> str:
    """A template variable's value as its field shows it: true/false as the boolean select's values, None as empty."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _as_typed(variable: TemplateVariable) -> str:
    return as_typed_text(variable.default) if variable.has_default else ""


def typed_template_value(text: str, variable: TemplateVariable):
    """``text`` as a value of ``variable``: true/false for a boolean (or a model default that is one), a number where
    the model's own value is one, else the text; ``ValueError`` saying what to give."""
    if variable.kind == "boolean" or isinstance(variable.default, bool):
        if text.strip().lower() not in ("true", "false"):
            raise ValueError(f"{text!r} is not true or false; give one of them")
        return text.strip().lower() == "true"
    if isinstance(variable.default, int):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a whole number, as the model's own value {variable.default} is; "
                             "give one") from None
    if isinstance(variable.default, float):
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number, as the model's own value {variable.default} is; give one"
                             ) from None
    return text


# A stop sequence may hold what one line of a box cannot ("\n\nUser:", a tab): written as these escapes.
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
_ESCAPED = {character: f"\\{letter}" for letter, character in _ESCAPES.items()}
_ESCAPE = re.compile(r"\\(.?)")
_ESCAPES_HELP = "\\n for a line break, \\t for a tab, \\r for a carriage return, \\\\ for a backslash"


def stop_sequence_as_typed(sequence: str) -> str:
    """``sequence`` as one line of the stop sequences box, each line break, tab, carriage return and
    backslash written as its escape: what ``StopSequencesField`` reads back as ``sequence``."""
    return "".join(_ESCAPED.get(character, character) for character in sequence)


class StopSequencesField(TypedTextField):
    """Stop sequences typed one a line, a line break within one written ``\\n`` (see ``_ESCAPES``); cleaned to
    the list of them, empty lines left out and spaces kept (they are part of the text). A list given as the
    form's initial value is shown as typed, so a saved conversation's sequences come back as they were."""

    def prepare_value(self, value):
        if isinstance(value, (list, tuple)):
            return "\n".join(stop_sequence_as_typed(sequence) for sequence in value)
        return value

    def clean(self, value) -> list[str]:
        lines = super().clean(value).split("\n")
        sequences = [_stop_sequence(line, number=number) for number, line in enumerate(lines, start=1) if line]
        if len(sequences) > MAX_STOP_SEQUENCES:
            raise forms.ValidationError(f"Stop sequences: {len(sequences)} given; give at most "
                                        f"{MAX_STOP_SEQUENCES} stop sequences, one a line.")
        return sequences


def _stop_sequence(line: str, *, number: int) -> str:
    """One line of the stop sequences box, its escapes read, checked as /v1 checks its ``stop``."""

    def unescaped(match: re.Match) -> str:
        if match.group(1) in _ESCAPES:
            return _ESCAPES[match.group(1)]
        written = f'"\\{match.group(1)}" is no escape' if match.group(1) else 'a lone "\\" ends the line'
        raise forms.ValidationError(f"Stop sequences, line {number}: {written}; write {_ESCAPES_HELP}.")

    sequence = _ESCAPE.sub(unescaped, line)
    try:
        return checked_text(sequence, field="stop")
    except ValidationError as error:
        raise forms.ValidationError(f"Stop sequences, line {number}: {error.message_dict['stop'][0]}.") from None


def _setting(field: type[forms.Field], *, label: str, minimum: float, maximum: float, **kwargs) -> forms.Field:
    """A sampling setting whose every error (empty, not a number, out of range) names it and its range, where
    Django's said "Ensure this value is less than or equal to 2.0." under a field it did not name."""
    whole = field is forms.IntegerField
    message = f"{label} must be {'a whole number' if whole else 'a number'} from {minimum:g} to {maximum:g}."
    return field(min_value=minimum, max_value=maximum, label=label, **kwargs,
                 error_messages={kind: message for kind in ("required", "invalid", "min_value", "max_value")})


class ModelRefField(forms.ChoiceField):
    """One of the project's models, its checkpoints named in either spelling the product shows (``model_refs``)."""

    def to_python(self, value):
        return chat_ref(super().to_python(value))


class ConversationForm(forms.Form):
    """A new conversation: the model, the system prompt and the sampling settings."""

    model = ModelRefField(help_text="A base model, a succeeded run's export, or an exported checkpoint.")
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
    stop = StopSequencesField(
        label="Stop sequences", widget=forms.Textarea(attrs={"rows": 2}), required=False, strip=False, max_length=4_000,
        help_text=f"One a line, up to {MAX_STOP_SEQUENCES}: the answer ends before the first to appear. Within one, write "
                  f"{_ESCAPES_HELP} (\\n\\nUser: ends it at an empty line followed by User:).")

    thinking = forms.BooleanField(
        label="Thinking", required=False,
        help_text="The model reasons in a think block before it answers. Off: its chat template closes an empty one "
                  "(enable_thinking false), as Qwen3's does.")

    def __init__(self, *args, choices: list[ModelChoice], thinking: dict[str, bool] | None = None,
                 variables: dict[str, dict[str, TemplateVariable]] | None = None, **kwargs):
        """``thinking``: ``selectors.thinking_defaults`` of ``choices``: the Thinking switch is there only for those
        models (forms.js's ``data-thinking-defaults`` shows it as the model select changes), set to each one's default.
        ``variables``: each model's ``selectors.chat_template_variables`` by ref, offered alike (``_add_variables``)."""
        super().__init__(*args, **kwargs)
        if "model" in self.initial:
            self.initial["model"] = chat_ref(self.initial["model"])  # a run page's ?model=run_…@N
        self.fields["model"].choices = [(choice.ref, choice.option_label) for choice in choices]
        self.choices = {choice.ref: choice for choice in choices}
        self.variables = variables or {}
        self._add_variables(choices)
        self.thinking_defaults = thinking or {}
        if not self.thinking_defaults:
            del self.fields["thinking"]
            return
        field = self.fields["thinking"]
        field.widget.attrs["data-thinking-defaults"] = json.dumps(self.thinking_defaults)
        model = self.data.get("model") if self.is_bound else self.initial.get("model") or (choices[0].ref if choices else None)
        field.initially_hidden = model not in self.thinking_defaults
        if not self.is_bound and "thinking" not in self.initial and model in self.thinking_defaults:
            self.initial["thinking"] = self.thinking_defaults[model]

    def _picked_model(self, choices: list[ModelChoice]) -> str | None:
        return self.data.get("model") if self.is_bound else self.initial.get("model") or (choices[0].ref if choices else None)

    def _add_variables(self, choices: list[ModelChoice]) -> None:
        """A field ``var_<name>`` for each chat template variable some model reads, after the sampling settings
        (``template_variable_field``: a select of true/false, or unset, for a boolean, a text box otherwise). Each carries
        ``data-template-variable``, the models that read it with their defaults, by which forms.js shows it, enabled
        and set to the picked model's default, as the model select changes; the others are hidden and disabled, so the
        form sends only the picked model's."""
        by_name: dict[str, dict[str, TemplateVariable]] = {}
        for ref, variables in self.variables.items():
            for name, variable in variables.items():
                by_name.setdefault(name, {})[ref] = variable
        picked = chat_ref(self._picked_model(choices) or "")
        for name, readers in sorted(by_name.items()):
            field = template_variable_field(name=name, readers=readers.values(), help_text=VARIABLE_HELP,
                                            switch_help_text=VARIABLE_BOOLEAN_HELP)
            field.widget.attrs["data-template-variable"] = json.dumps(
                {ref: _as_typed(variable) for ref, variable in readers.items()})
            field.initially_hidden = picked not in readers
            if field.initially_hidden:
                field.widget.attrs["disabled"] = True
            elif not self.is_bound and f"{VARIABLE_PREFIX}{name}" not in self.initial:
                self.initial[f"{VARIABLE_PREFIX}{name}"] = _as_typed(readers[picked])
            self.fields[f"{VARIABLE_PREFIX}{name}"] = field

    def template_variables(self) -> dict:
        """The picked model's chat template variables as the conversation keeps them: each value as the type of the
        model's own (text otherwise); an empty box is left out, unless the model sets that variable (then it is
        the empty text that overrides it)."""
        return self.cleaned_data.get("template_variables", {})

    def _clean_variables(self, model: str) -> None:
        reads = self.variables.get(model, {})
        values = {}
        for key in self.data:
            if not key.startswith(VARIABLE_PREFIX):
                continue
            name, typed = key[len(VARIABLE_PREFIX):], self.data.get(key, "")
            if name not in reads:
                if typed:  # a value for a variable the picked model's template does not read: refused, not dropped
                    self.add_error(None, "Template variable " + unread_variable_problem(
                        name=name, model=self.choices[model], readable=reads, remedy="leave it empty"))
                continue
            field_name = f"{VARIABLE_PREFIX}{name}"
            if field_name not in self.cleaned_data:
                continue  # the field's own error (too long) is already said
            variable = reads[name]
            text = self.cleaned_data[field_name]
            if text == "" and (variable.kind == "boolean" or not variable.has_default):
                continue
            try:
                values[name] = typed_template_value(text, variable)
            except ValueError as error:
                self.add_error(field_name, f"{name}: {error}")
        self.cleaned_data["template_variables"] = values

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("model") in self.choices:
            self._clean_variables(cleaned["model"])
        if values := cleaned.get("template_variables"):  # bounded, and a first turn rendered with them
            try:
                cleaned["template_variables"] = checked_template_variables(
                    model=self.choices[cleaned["model"]], variables=values, enable_thinking=self.enable_thinking(),
                    system_prompt=cleaned.get("system_prompt", ""))
            except ValidationError as error:
                for message in error.message_dict["template_variables"]:
                    self.add_error(None, f"Template variables: {message}")
        return cleaned

    def enable_thinking(self) -> bool | None:
        """The switch as the conversation keeps it: None for a model whose template does not read it."""
        if self.cleaned_data["model"] not in self.thinking_defaults:
            return None
        return bool(self.cleaned_data.get("thinking"))

    @staticmethod
    def settings_of(conversation) -> dict:
        """``conversation``'s model, system prompt and sampling settings as the form's initial values: a new
        conversation with these settings."""
        return {"model": conversation.model_ref, "system_prompt": conversation.system_prompt,
                **{name: getattr(conversation, name) for name in ("temperature", "top_p", "top_k", "max_tokens",
                                                                  "presence_penalty", "frequency_penalty", "stop")},
                **({"thinking": conversation.enable_thinking} if conversation.enable_thinking is not None else {}),
                **{f"{VARIABLE_PREFIX}{name}": as_typed_text(value) for name, value in conversation.template_variables.items()}}

    def clean_presence_penalty(self) -> float:
        return self.cleaned_data["presence_penalty"] or 0.0

    def clean_frequency_penalty(self) -> float:
        return self.cleaned_data["frequency_penalty"] or 0.0


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
