"""The API tokens page: a user creates (the secret is shown once) and revokes their tokens."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.api import services
from webapp.api.models import ApiToken


@login_required
@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest) -> HttpResponse:
    secret = None
    error = None
    if request.method == "POST":
        try:
            _token, secret = services.token_create(user=request.user, name=request.POST.get("name", ""))
        except ValidationError as problem:
            error = problem.messages[0]
    return render(request, "accounts/tokens.html", {
        "tokens": ApiToken.objects.filter(user=request.user), "secret": secret, "error": error,
    }, status=400 if error else 200)


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    services.token_revoke(user=request.user, token_id=token_id)
    messages.success(request, "Token revoked.")
    return redirect("api:tokens")
