"""Static files as the default setup serves them (production settings, collectstatic, WhiteNoise): compressed
for a browser that takes gzip, and cached for good under a name that changes with their content, so that a
chart page does not fetch plotly's 1.4 MB again, uncompressed, every minute."""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SERVE = """
import json
import django
django.setup()
from django.core.management import call_command
call_command("collectstatic", "--noinput", verbosity=0)
from django.templatetags.static import static
from django.test import Client

url = static("vendor/plotly-temper.min.js")
answers = {}
for name, encodings in (("gzip", "gzip, deflate"), ("plain", "")):
    response = Client().get(url, headers={"Accept-Encoding": encodings} if encodings else {})
    body = b"".join(response.streaming_content) if response.streaming else response.content
    answers[name] = {"status": response.status_code, "encoding": response.get("Content-Encoding"),
                     "cache": response.get("Cache-Control"), "vary": response.get("Vary"), "bytes": len(body)}
print(json.dumps({"url": url, **answers}))
"""


def test_a_chart_pages_plotly_is_served_gzipped_and_cached_for_good(tmp_path):
    result = subprocess.run([sys.executable, "-c", SERVE], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={"PATH": "", "DJANGO_SETTINGS_MODULE": "webapp.settings", "TEMPER_DATA": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    served = json.loads(result.stdout.strip().splitlines()[-1])
    size = (ROOT / "static" / "vendor" / "plotly-temper.min.js").stat().st_size
    # Its name holds a hash of its content: a new bundle gets a new address, so the old one may be kept for good.
    assert re.fullmatch(r"/static/vendor/plotly-temper\.min\.[0-9a-f]{12}\.js", served["url"]), served["url"]
    gzipped, plain = served["gzip"], served["plain"]
    assert gzipped["status"] == 200 and gzipped["encoding"] == "gzip" and gzipped["bytes"] < size / 2
    assert "Accept-Encoding" in gzipped["vary"]
    assert "immutable" in gzipped["cache"] and "max-age=315360000" in gzipped["cache"]
    assert plain["status"] == 200 and plain["encoding"] is None and plain["bytes"] == size
