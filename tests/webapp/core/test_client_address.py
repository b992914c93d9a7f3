"""The client's address (``webapp.core.addresses.client_address``), what the login throttle counts under and
``/metrics``' allow list reads: the direct peer (REMOTE_ADDR), unless that peer is one of
``TEMPER_TRUSTED_PROXIES``; then what the nearest trusted proxy says in X-Forwarded-For. Behind a reverse proxy
every request came from the proxy: ten wrong passwords by anyone locked every client out of the account's
sign-in from browsers it never used, and /metrics could not be opened to a monitoring host's address. The one rule
holds for X-Forwarded-Proto too (``webapp.core.middleware.ForwardedProtoOnlyFromTrustedProxies``)."""
import ipaddress
import subprocess
import sys

import pytest
from django.test import Client, RequestFactory

from tests.webapp.factories import PASSWORD
from tests.webapp.test_settings import ROOT
from webapp.accounts.throttle import MAX_FAILURES
from webapp.core.addresses import client_address

PROXY = "10.0.0.2"


def networks(*items: str) -> tuple:
    return tuple(ipaddress.ip_network(item) for item in items)


def address_of(remote: str, forwarded: str | None = None) -> str:
    headers = {} if forwarded is None else {"X-Forwarded-For": forwarded}
    return client_address(RequestFactory().get("/", REMOTE_ADDR=remote, headers=headers))


def test_with_no_trusted_proxy_the_forwarded_address_is_not_believed(settings):
    settings.TEMPER_TRUSTED_PROXIES = ()
    assert address_of(PROXY, "203.0.113.7") == PROXY
    assert address_of("127.0.0.1", "203.0.113.7") == "127.0.0.1"


def test_a_trusted_proxys_forwarded_address_is_the_clients(settings):
    settings.TEMPER_TRUSTED_PROXIES = networks("10.0.0.0/24", "::1")
    assert address_of(PROXY, "203.0.113.7") == "203.0.113.7"
    assert address_of("::1", "2001:db8::7") == "2001:db8::7"
    assert address_of(PROXY) == PROXY  # a proxy's own request (a health check) names no client
    assert address_of(PROXY, "") == PROXY


def test_what_the_client_wrote_before_the_trusted_proxies_is_not_believed(settings):
    # The client sent its own X-Forwarded-For; each proxy appends the address it saw: the first address from the
    # right that is no trusted proxy's is the one the nearest of them saw.
    settings.TEMPER_TRUSTED_PROXIES = networks("10.0.0.0/24")
    assert address_of(PROXY, "198.51.100.1, 203.0.113.7, 10.0.0.9") == "203.0.113.7"
    assert address_of(PROXY, "10.0.0.5, 10.0.0.9") == "10.0.0.5"  # every hop a proxy: the farthest one
    assert address_of(PROXY, "not-an-address, 203.0.113.7") == "203.0.113.7"


def test_an_untrusted_peer_is_the_client_whatever_it_forwards(settings):
    settings.TEMPER_TRUSTED_PROXIES = networks("10.0.0.0/24")
    assert address_of("192.0.2.50", "203.0.113.7") == "192.0.2.50"


class TestTheLoginThrottleBehindAProxy:
    url = "/accounts/login/"

    def guess(self, client_ip: str, *, password: str = "guess", remote: str = PROXY):
        return Client(REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=client_ip).post(
            self.url, {"username": "alpha-owner", "password": password})

    def test_one_clients_guesses_lock_only_that_client(self, team, settings):
        settings.TEMPER_TRUSTED_PROXIES = networks("10.0.0.0/24")
        for _attempt in range(MAX_FAILURES):
            self.guess("203.0.113.7")
        assert b"Too many failed logins for this account from your address" in \
            self.guess("203.0.113.7", password=PASSWORD).content
        assert self.guess("198.51.100.1", password=PASSWORD).status_code == 302  # the owner, elsewhere

    def test_a_client_not_behind_the_proxy_cannot_choose_its_address(self, team, settings):
        settings.TEMPER_TRUSTED_PROXIES = networks("10.0.0.0/24")
        for attempt in range(MAX_FAILURES):
            self.guess(f"203.0.113.{attempt}", remote="192.0.2.50")
        assert b"Too many failed logins for this account from your address" in \
            self.guess("198.51.100.1", password=PASSWORD, remote="192.0.2.50").content


def test_metrics_allow_the_client_behind_a_trusted_proxy_and_not_a_forger(client, db, settings):
    settings.TEMPER_METRICS_TOKEN = ""
    settings.TEMPER_METRICS_ALLOW = networks("192.0.2.0/24")
    settings.TEMPER_TRUSTED_PROXIES = networks("10.0.0.0/24")
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # no Redis needed: it reports redis_up 0
    assert client.get("/metrics", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="192.0.2.9").status_code == 200
    refused = client.get("/metrics", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert refused.status_code == 403 and "(this request came from 203.0.113.7)" in refused.content.decode()
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.7", HTTP_X_FORWARDED_FOR="192.0.2.9").status_code == 403


def test_https_is_believed_only_from_a_trusted_proxy(client, db, settings):
    """With TEMPER_HTTPS=1, SECURE_PROXY_SSL_HEADER believed X-Forwarded-Proto from any peer: a client that reached
    Temper past the proxy made its request secure by saying so (HSTS sent, https in the links Django builds, and the
    CSRF Origin check asking for https), while X-Forwarded-For from that same peer was ignored."""
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 3600
    settings.TEMPER_TRUSTED_PROXIES = networks("10.0.0.0/24")

    def seen(remote: str, proto: str = "https") -> tuple:
        response = client.get("/accounts/login/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_PROTO=proto)
        request = response.wsgi_request
        return request.is_secure(), request.scheme, response.headers.get("Strict-Transport-Security")

    assert seen(PROXY) == (True, "https", "max-age=3600")
    assert seen(PROXY, "http") == (False, "http", None)
    assert seen("192.0.2.50") == (False, "http", None)
    assert seen("127.0.0.1") == (False, "http", None)  # the same host is no proxy unless listed


@pytest.mark.parametrize("value", ["10.0.0.0/8, proxy.local", "10.0.0.300"])
def test_the_settings_refuse_a_trusted_proxy_that_is_not_an_address(value):
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env={"PATH": "", "DJANGO_SETTINGS_MODULE": "webapp.settings",
                                                        "TEMPER_TRUSTED_PROXIES": value})
    assert result.returncode != 0
    bad = value.split(", ")[-1]
    assert (f"environment variable TEMPER_TRUSTED_PROXIES: {bad!r} is not an IP address or network (such as "
            "10.0.0.5 or 10.0.0.0/8); separate several with commas") in result.stderr
