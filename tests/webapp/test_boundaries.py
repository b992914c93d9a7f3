"""The web process must start fast and stay small: it never imports jax."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_web_process_never_imports_jax():
    code = (
        "import os, sys; os.environ['DJANGO_SETTINGS_MODULE']='webapp.settings_test';"
        "import django; django.setup();"
        "import webapp.urls, webapp.asgi;"
        "from django.urls import get_resolver; get_resolver().url_patterns;"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'jax','jaxlib','flax','optax','orbax','torch'});"
        "print(','.join(heavy)); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"web process imported: {result.stdout} {result.stderr}"


def test_healthz(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
