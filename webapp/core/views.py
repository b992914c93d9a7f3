from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness probe for compose and load balancers: no database, no login."""
    return JsonResponse({"status": "ok"})


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """A refused form in Temper's own 403 page (settings.CSRF_FAILURE_VIEW). Django's page is a bare
    one that speaks of Referer headers and cookies; what a person mostly hit is a form left open
    across a new login (a new token), and what helps is to reload it and submit again."""
    message = (f"This form could not be accepted: its security token is missing or out of date ({reason.rstrip('.')}). "
               "This happens when the page was opened before you logged in again, or in another tab. "
               "Go back, reload the page and submit it again.")
    return render(request, "403.html", {"exception": message}, status=403)
