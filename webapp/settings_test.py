"""Fast settings for the test suite: MD5 hashing, a throwaway data root."""
import tempfile
from pathlib import Path

from webapp.settings import *  # noqa: F401,F403
from webapp.settings import DATABASES

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DATA_ROOT = Path(tempfile.mkdtemp(prefix="temper-test-data-"))
MODELS_ROOT = DATA_ROOT / "models"
STATIC_ROOT = DATA_ROOT / "staticfiles"
# WhiteNoise warns on every request when its root is missing.
STATIC_ROOT.mkdir()
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # The suite on PostgreSQL (DATABASE_URL=postgres://... make test): no pool. Django's test clients
    # disconnect the request_finished handler that hands a request's connection back, so an ASGI request's
    # pooled connection (a thread's own) was never returned and the pool ran dry mid-suite.
    # tests/postgres/ checks the pool itself, in processes with the production settings.
    DATABASES["default"]["OPTIONS"].pop("pool", None)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["NAME"] = str(DATA_ROOT / "test.sqlite3")
    # A file, not Django's default in-memory test database, so that the Celery worker processes
    # started by integration and browser tests (tests/live.py) open the same database.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_ROOT / "test-db.sqlite3")}
# Model files are looked at on every request (webapp.core.file_stamps): tests write them and load a page at once.
TEMPER_MODEL_FILES_RECHECK_SECONDS = 0
# Serve warm-ups compile a model's programs in the background (tens of CPU seconds); the tests that are
# about them turn them on.
TEMPER_SERVE_WARMUP = False
