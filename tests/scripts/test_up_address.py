"""The address scripts/up.sh prints to open: one a browser can be sent to, whatever TEMPER_HOST listens on, with the
scheme uvicorn serves."""
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def up_function(name: str, *arguments: str, environment: dict[str, str] | None = None) -> str:
    """What up.sh's function ``name`` prints for ``arguments``, run on its own (in ``environment``)."""
    script = (ROOT / "scripts" / "up.sh").read_text()
    definition = re.search(rf"^{name}\(\) \{{.*?^\}}", script, re.S | re.M)
    assert definition, f"scripts/up.sh defines no {name}"
    return subprocess.run(["bash", "-c", f'{definition.group(0)}\n{name} "$@"', name, *arguments],
                          capture_output=True, text=True, check=True, env=environment).stdout.strip()


def url_host(host: str) -> str:
    return up_function("url_host", host)


@pytest.mark.parametrize("host, shown", [
    ("127.0.0.1", "127.0.0.1"),
    ("0.0.0.0", "127.0.0.1"),
    ("::", "127.0.0.1"),
    ("::1", "[::1]"),
    ("10.0.0.5", "10.0.0.5"),
])
def test_the_address_to_open_is_one_a_browser_can_be_sent_to(host, shown):
    """With TEMPER_HOST=0.0.0.0 it printed http://0.0.0.0:8000, whose Host header no default TEMPER_ALLOWED_HOSTS
    admits (a 400 page), and an IPv6 address without its brackets."""
    assert url_host(host) == shown


def test_the_printed_address_is_the_one_to_open():
    assert 'starting on $(url_scheme)://$(url_host "$HOST"):$PORT' in (ROOT / "scripts" / "up.sh").read_text()


@pytest.mark.parametrize("variables, scheme", [
    ({}, "http"),
    # Behind an HTTPS proxy: Temper is reached over HTTPS, but uvicorn itself serves HTTP on this address.
    ({"TEMPER_HTTPS": "1"}, "http"),
    ({"TEMPER_HTTPS": "1", "UVICORN_SSL_CERTFILE": "/etc/temper/cert.pem", "UVICORN_SSL_KEYFILE": "/etc/temper/key.pem"},
     "https"),
    ({"UVICORN_SSL_CERTFILE": "/etc/temper/both.pem"}, "https"),
    ({"UVICORN_SSL_KEYFILE": "/etc/temper/key.pem"}, "https"),
    ({"UVICORN_SSL_CERTFILE": ""}, "http"),
])
def test_the_printed_scheme_is_the_one_uvicorn_serves(variables, scheme):
    """With UVICORN_SSL_CERTFILE and UVICORN_SSL_KEYFILE (README, *HTTPS without a proxy*) uvicorn serves only HTTPS,
    and up.sh printed an http:// address that the browser could not open. uvicorn serves HTTPS once either is set
    (its Config.is_ssl)."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("UVICORN_SSL_CERTFILE", "UVICORN_SSL_KEYFILE", "TEMPER_HTTPS")}
    assert up_function("url_scheme", environment=environment | variables) == scheme
