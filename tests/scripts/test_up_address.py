"""The address scripts/up.sh prints to open: one a browser can be sent to, whatever TEMPER_HOST listens on."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def url_host(host: str) -> str:
    """What up.sh's ``url_host`` prints for ``host``, run on its own."""
    script = (ROOT / "scripts" / "up.sh").read_text()
    definition = re.search(r"^url_host\(\) \{.*?^\}", script, re.S | re.M)
    assert definition, "scripts/up.sh defines no url_host"
    return subprocess.run(["bash", "-c", f'{definition.group(0)}\nurl_host "$1"', "url_host", host],
                          capture_output=True, text=True, check=True).stdout.strip()


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
    assert 'starting on http://$(url_host "$HOST"):$PORT' in (ROOT / "scripts" / "up.sh").read_text()
