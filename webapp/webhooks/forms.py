from __future__ import annotations

from django import forms

from webapp.webhooks.models import EVENT_GROUPS, WebhookFormat


class WebhookForm(forms.Form):
    url = forms.CharField(label="Payload URL", max_length=2000, help_text=(
        "http:// or https:// only; Temper POSTs to it and does not follow redirects. A Slack or Mattermost incoming "
        "webhook's address is itself a secret: only owners see this page."))
    events = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, choices=[
        (group, list(events.items())) for group, events in EVENT_GROUPS.items()],
                                       initial=["run.succeeded", "run.failed"])
    format = forms.ChoiceField(choices=WebhookFormat.choices, initial=WebhookFormat.JSON)
    active = forms.BooleanField(required=False, initial=True, help_text="Unticked, no event is sent to it.")
