"""The password change page: Django's view, saying afterwards what the change ended besides the old password."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.template.defaultfilters import pluralize


class PasswordChangeView(auth_views.PasswordChangeView):
    def form_valid(self, form):
        response = super().form_valid(form)
        revoked = form.revoked_tokens
        messages.success(self.request, "Your other sessions were signed out" + (
            f", and your {revoked} API token{pluralize(revoked)} revoked." if revoked else "."))
        return response
