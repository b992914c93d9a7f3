"""The API tokens page: a user creates (the secret is shown once) and revokes their tokens. A token
is made once per sending of the form (``webapp.core.submissions.form_send_once_secret``): a repeat
cannot show the secret again, so it makes nothing and says where the secret was shown."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from webapp.api import services
from webapp.api.models import ApiToken
from webapp.core.auth_header import DEFAULT_TOKEN_LIFETIME, TOKEN_LIFETIME_CHOICES, token_expiry
from webapp.core.submissions import form_send_once_secret, note_secret_already_shown
from webapp.projects.models import Role, role_at_least
from webapp.projects.selectors import project_list_for_user


@login_required
@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest) -> HttpResponse:
    secret = None
    error = None
    if request.method == "POST":
        def create() -> tuple[str, str]:
            token, new_secret = services.token_create(
                user=request.user, name=request.POST.get("name", ""),
                expires_at=token_expiry(request.POST.get("expires", DEFAULT_TOKEN_LIFETIME)))
            return str(token.pk), new_secret

        try:
            token_id, secret = form_send_once_secret(request, create=create)
        except ValidationError as problem:
            error = problem.messages[0]
        else:
            if not secret:
                note_secret_already_shown(request, tokens=ApiToken.objects.filter(user=request.user), token_id=token_id)
    return render(request, "accounts/tokens.html", {
        "tokens": ApiToken.objects.filter(user=request.user), "secret": secret, "error": error,
        "lifetimes": TOKEN_LIFETIME_CHOICES, "lifetime": request.POST.get("expires", DEFAULT_TOKEN_LIFETIME),
        "now": timezone.now(),
        # /v1/ takes a project's token instead, made on the Chat page of a project one may chat in.
        "chat_projects": [project for project in project_list_for_user(user=request.user)
                          if role_at_least(project.role, Role.MEMBER)],
    }, status=400 if error else 200)


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    if services.token_revoke(user=request.user, token_id=token_id):
        messages.success(request, "Token revoked.")
    else:  # a second click, or an id that is not one of yours: the same answer, nothing changed
        messages.info(request, "That token is not among yours (revoked already?); nothing was revoked.")
    return redirect("api:tokens")
