"""The base of Temper's own middleware: one class that Django runs in the event loop under ASGI (uvicorn)
and plainly under WSGI (the test client), so that no request crosses to a thread and back for it."""
from __future__ import annotations

from io import BytesIO

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware

from webapp.core.addresses import forget_untrusted_forwarded_proto


class DualModeMiddleware:
    """Subclasses write ``call`` (sync) and ``acall`` (async); Django picks the mode of the chain."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        return self.acall(request) if self.is_async else self.call(request)

    def call(self, request: HttpRequest) -> HttpResponse:
        raise NotImplementedError

    async def acall(self, request: HttpRequest) -> HttpResponse:
        raise NotImplementedError


class ForwardedProtoOnlyFromTrustedProxies(DualModeMiddleware):
    """Believes ``X-Forwarded-Proto`` only from ``TEMPER_TRUSTED_PROXIES``, as ``X-Forwarded-For`` is
    (``webapp.core.addresses``). Ahead of Django's and Temper's other middleware in ``MIDDLEWARE``: each of those may
    ask whether the request is secure."""

    def call(self, request: HttpRequest) -> HttpResponse:
        forget_untrusted_forwarded_proto(request)
        return self.get_response(request)

    async def acall(self, request: HttpRequest) -> HttpResponse:
        forget_untrusted_forwarded_proto(request)
        return await self.get_response(request)


# Temper's pages load their scripts and styles from its own static files and hold no inline script or event
# attribute, so the browser may refuse every other script: an escaping slip on a page that shows model
# output, a dataset's text or a run's name becomes markup that does nothing. Plotly's WebGL charts (the
# hyperparameters' parallel coordinates) build functions from text ('unsafe-eval'); its charts set inline
# styles, and it draws images from data: and blob: addresses when a chart is saved as a picture.
CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'self'",
    "script-src 'self' 'unsafe-eval'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))


class ContentSecurityPolicy(DualModeMiddleware):
    """Adds ``CONTENT_SECURITY_POLICY`` to every response that does not set its own."""

    def call(self, request: HttpRequest) -> HttpResponse:
        return self._with_policy(self.get_response(request))

    async def acall(self, request: HttpRequest) -> HttpResponse:
        return self._with_policy(await self.get_response(request))

    @staticmethod
    def _with_policy(response: HttpResponse) -> HttpResponse:
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response


def security_headers(scope: dict) -> list[tuple[bytes, bytes]]:
    """The security headers (CSP, X-Frame-Options, nosniff, Referrer-Policy, HSTS where served over HTTPS …)
    that Django's middleware gives an answer to the ASGI request ``scope``, for an answer made before Django
    (the upload guard's 413). Made by those middlewares themselves, so their settings and ours hold there too
    and no list of headers is kept twice."""
    request = ASGIRequest({"path": "/", "method": "GET", **scope}, BytesIO())
    forget_untrusted_forwarded_proto(request)
    response = HttpResponse()
    plain = set(response.headers)

    def answer(_request):
        return response

    SecurityMiddleware(answer).process_response(request, response)
    XFrameOptionsMiddleware(answer).process_response(request, response)
    ContentSecurityPolicy._with_policy(response)
    return [(name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in response.headers.items() if name not in plain]
