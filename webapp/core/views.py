from django.http import HttpRequest, JsonResponse


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness probe for compose and load balancers: no database, no login."""
    return JsonResponse({"status": "ok"})
