"""The REST API's addresses end with a slash. Django's CommonMiddleware answers one without it by a
301 to the address with it, an HTML page, and a client that follows it (urllib does) sends its POST
again as a GET: a run was not launched, and the client saw the runs list as if it had been. Under
``/api/`` such an address gets a JSON 404 naming the right one instead. Async-capable: under ASGI the
chain does not cross to a thread and back for it."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import is_valid_path

from webapp.core.middleware import DualModeMiddleware


class ApiAddressWithoutSlash(DualModeMiddleware):
    def call(self, request: HttpRequest) -> HttpResponse:
        return _missing_slash(request) or self.get_response(request)

    async def acall(self, request: HttpRequest) -> HttpResponse:
        return _missing_slash(request) or await self.get_response(request)


def _missing_slash(request: HttpRequest) -> JsonResponse | None:
    """The 404 of an API address that exists with a slash at its end, else None (URL resolution only)."""
    path = request.path_info
    if (path.startswith("/api/") and not path.endswith("/") and not is_valid_path(path)
            and is_valid_path(f"{path}/")):
        return JsonResponse({"detail": f"no API address {path}; it ends with a slash: {path}/"}, status=404)
    return None
