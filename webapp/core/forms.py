"""Helpers shared by the forms of every app."""
from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from webapp.core.text import typed_text


def errors_by_key(error: ValidationError) -> dict[str, list[str]]:
    """A service's ``ValidationError`` as messages by the key they name; one naming none under ``__all__``."""
    return error.message_dict if hasattr(error, "error_dict") else {"__all__": error.messages}


def add_service_errors(form: forms.Form, error: ValidationError) -> None:
    """Show a service's ``ValidationError`` on ``form``: each message next to the
    field it names when the form has that field, otherwise at the top of the form."""
    if not hasattr(error, "error_dict"):
        form.add_error(None, error)
        return
    for field, messages in error.message_dict.items():
        form.add_error(field if field in form.fields else None, messages)


class TypedTextField(forms.CharField):
    """Text typed in a textarea: its line breaks as typed (``typed_text``), not as the form sent them (CR LF each), so
    that ``max_length`` counts what the box's ``maxlength`` let its person type."""

    def to_python(self, value):
        return typed_text(super().to_python(value))
