"""The address of the client that sent a request, for whatever counts or allows by address (the login throttle,
``/metrics``' ``TEMPER_METRICS_ALLOW``), and whether it came over HTTPS: what a reverse proxy says of the request.

Behind a reverse proxy every request's direct peer (``REMOTE_ADDR``) is the proxy, and the client's address is in
the ``X-Forwarded-For`` header the proxy adds to. That header is believed only when the peer is one of
``TEMPER_TRUSTED_PROXIES`` (none by default): anyone else can write it, and a guesser who could choose its address
would be a new client at every guess. A client can send its own header too, which the proxies append to, so its
entries are read from the right: each trusted proxy's entry is skipped, and the first one that is not a trusted
proxy's is the address the nearest trusted proxy saw. The uvicorn server is started with ``--no-proxy-headers``
(``scripts/up.sh``, the Dockerfile, ``docker-compose.yml``): by default it believes the header itself from any
process on the same host, before Temper sees the request.

The same rule holds for ``X-Forwarded-Proto``, by which an HTTPS proxy says the request came over HTTPS
(``SECURE_PROXY_SSL_HEADER`` under ``TEMPER_HTTPS=1``): Django believes it from any peer, so
``webapp.core.middleware.ForwardedProtoOnlyFromTrustedProxies``, near the head of ``MIDDLEWARE``, drops it from a
request whose peer is not a trusted proxy, before anything asks whether the request is secure. Otherwise a client that
reached Temper past the proxy could say it was secure: HSTS sent to it, ``https`` in the links Django builds for it.
"""
from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def _trusted(address: str) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:  # not an address: no proxy's
        return False
    return any(parsed in network for network in settings.TEMPER_TRUSTED_PROXIES)


def from_trusted_proxy(request: HttpRequest) -> bool:
    """Whether the request's direct peer (``REMOTE_ADDR``) is one of ``TEMPER_TRUSTED_PROXIES``: only then are the
    ``X-Forwarded-`` headers it sends believed."""
    return _trusted(request.META.get("REMOTE_ADDR") or "")


def forget_untrusted_forwarded_proto(request: HttpRequest) -> None:
    """Drops ``X-Forwarded-Proto`` from a request that is not from a trusted proxy (see the module note)."""
    if not from_trusted_proxy(request):
        request.META.pop("HTTP_X_FORWARDED_PROTO", None)


def client_address(request: HttpRequest) -> str:
    """The client's address: ``REMOTE_ADDR``, unless that is a trusted proxy's (``TEMPER_TRUSTED_PROXIES``); then the
    first ``X-Forwarded-For`` entry from the right that is not a trusted proxy's, or the leftmost when all are
    (see the module note). Empty when the server gave no address."""
    peer = request.META.get("REMOTE_ADDR") or ""
    if not from_trusted_proxy(request):
        return peer
    # Django joins repeated headers with commas: one list however the proxies sent it.
    forwarded = [entry.strip() for entry in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if entry.strip()]
    for entry in reversed(forwarded):
        if not _trusted(entry):
            return entry
    return forwarded[0] if forwarded else peer
