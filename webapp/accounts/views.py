"""The login page, which marks the browser as one the account signed in with (``throttle.DEVICE_COOKIE``), and
the password change page, saying afterwards what the change ended besides the old password."""
from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.template.defaultfilters import pluralize

from webapp.accounts.throttle import DEVICE_COOKIE, DEVICE_COOKIE_MAX_AGE, device_cookie_value


class LoginView(auth_views.LoginView):
    def form_valid(self, form):
        response = super().form_valid(form)
        response.set_cookie(DEVICE_COOKIE, device_cookie_value(form.get_user().get_username(),
                                                               self.request.COOKIES.get(DEVICE_COOKIE)),
                            max_age=DEVICE_COOKIE_MAX_AGE, httponly=True, samesite="Lax",
                            secure=settings.SESSION_COOKIE_SECURE)
        return response


class PasswordChangeView(auth_views.PasswordChangeView):
    def form_valid(self, form):
        response = super().form_valid(form)
        revoked = form.revoked_tokens
        messages.success(self.request, "Your other sessions were signed out" + (
            f", and your {revoked} API token{pluralize(revoked)} revoked." if revoked else "."))
        return response
