"""A person's own settings, set from the page they matter on and answered by going back to it; the login page,
which marks the browser as one the account signed in with (``throttle.DEVICE_COOKIE``); and the password change
page, saying afterwards what the change ended besides the old password."""
from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.defaultfilters import pluralize
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from webapp.accounts import services
from webapp.accounts.throttle import DEVICE_COOKIE, DEVICE_COOKIE_MAX_AGE, device_cookie_value


@login_required
@require_POST
def review_shortcuts(request: HttpRequest) -> HttpResponse:
    """Turn the reviewing page's single-key shortcuts on or off (``review_shortcuts``: on or off), then back
    to ``next``, a page of this site (the home page otherwise)."""
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        back = "/"
    value = request.POST.get("review_shortcuts", "")
    if value not in ("on", "off"):
        messages.error(request, f"review_shortcuts must be on or off, not {value!r}: use the reviewing page's "
                                "button. Nothing was changed.")
        return redirect(back)
    services.review_shortcuts_set(user=request.user, on=value == "on")
    messages.success(request, f"Single-key shortcuts turned {value}.")
    return redirect(back)


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
