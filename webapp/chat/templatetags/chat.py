from django import template
from django.utils.safestring import SafeString

from webapp.runs.markup import render_markdown

register = template.Library()


@register.filter
def model_markdown(text: str) -> SafeString:
    """A model's answer as sanitized Markdown HTML: no raw HTML, script or event handler survives."""
    return render_markdown(text)
