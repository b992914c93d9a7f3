"""A person's own settings, set from the page they matter on and answered by going back to it."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from webapp.accounts import services


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
