import json

from django import template
from django.conf import settings
from django.utils.safestring import SafeString

from webapp.chat import forms
from webapp.runs.markup import render_markdown

register = template.Library()


@register.filter
def model_markdown(text: str) -> SafeString:
    """A model's answer as sanitized Markdown HTML: no raw HTML, script or event handler survives. Its line
    breaks stay: a model writes lines meant as lines (a list of answers, steps, verse), the answer streams in
    with them, and plain Markdown would run them into one paragraph the moment it is done."""
    return render_markdown(text, line_breaks=True)


@register.filter
def stop_sequence_as_typed(sequence: str) -> str:
    """A stop sequence as the form takes it: a line break in it shows as \\n, where the page would show a space."""
    return forms.stop_sequence_as_typed(sequence)


@register.filter
def template_value(value) -> str:
    """A chat template variable's value as JSON writes it ("a pirate", true, 3): a text is told from a number or a
    switch. Plain text: the page escapes it."""
    return json.dumps(value, ensure_ascii=False)


@register.simple_tag
def serve_timeout_seconds() -> int:
    """The time limit a chat answer is cut at (``TEMPER_SERVE_TIMEOUT_SECONDS``), which a timed-out answer names."""
    return settings.TEMPER_SERVE_TIMEOUT_SECONDS
