"""Django settings for Temper.

Everything comes from the environment through ``webapp.env``; with no variable set
Temper runs on SQLite, a local data directory (``./var``) and a local Redis.
"""
from __future__ import annotations

from pathlib import Path

import dj_database_url

from webapp.env import env_bool, env_choice, env_int, env_list, env_networks, env_path, env_str
from webapp.secret import secret_key

BASE_DIR = Path(__file__).resolve().parent.parent

DATA_ROOT = env_path("TEMPER_DATA", BASE_DIR / "var")
MODELS_ROOT = env_path("TEMPER_MODELS_ROOT", DATA_ROOT / "models")

# TEMPER_SECRET_KEY, or a random key made once in DATA_ROOT/secret_key (webapp/secret.py).
SECRET_KEY = secret_key(env_str("TEMPER_SECRET_KEY", ""), DATA_ROOT)
DEBUG = env_bool("TEMPER_DEBUG", False)
ALLOWED_HOSTS = env_list("TEMPER_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("TEMPER_CSRF_TRUSTED_ORIGINS", [])
# Served over HTTPS (TEMPER_HTTPS=1), by uvicorn itself (--ssl-keyfile, or UVICORN_SSL_KEYFILE) or by a proxy in
# front: the session and CSRF cookies are sent over HTTPS only, a request is secure when it came over HTTPS or a
# proxy says it did (X-Forwarded-Proto, which the proxy must set itself and never pass on from the client; believed
# only from TEMPER_TRUSTED_PROXIES, below), and browsers are told to use HTTPS for TEMPER_HSTS_SECONDS. With no
# proxy listed a request is read as it came, which is right for uvicorn's own HTTPS; behind an HTTPS proxy left out
# of the list every request reads as plain HTTP, and the refused form's page says what to set
# (webapp.core.views.csrf_failure).
SERVED_OVER_HTTPS = env_bool("TEMPER_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SERVED_OVER_HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if SERVED_OVER_HTTPS else None
SECURE_HSTS_SECONDS = env_int("TEMPER_HSTS_SECONDS", 0) if SERVED_OVER_HTTPS else 0
CSRF_FAILURE_VIEW = "webapp.core.views.csrf_failure"  # Temper's 403 page, saying what to do

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "webapp.core",
    "webapp.accounts",
    "webapp.projects",
    "webapp.basemodels",
    "webapp.datasets",
    "webapp.workers",
    "webapp.runs",
    "webapp.api",
    "webapp.review",
    "webapp.evals",
    "webapp.chat",
    "webapp.webhooks",
    "webapp.activity",
]

MIDDLEWARE = [
    "webapp.core.metrics.RequestMetricsMiddleware",
    "webapp.core.streams.ReleaseDatabaseForStreams",  # after every other middleware's database work
    "webapp.core.middleware.ForwardedProtoOnlyFromTrustedProxies",  # before anything asks if a request is secure
    "django.middleware.security.SecurityMiddleware",
    "webapp.core.middleware.ContentSecurityPolicy",
    "webapp.core.static.StaticFilesMiddleware",  # WhiteNoise, without a thread hop for other addresses
    "django.contrib.sessions.middleware.SessionMiddleware",
    "webapp.api.middleware.ApiAddressWithoutSlash",  # before CommonMiddleware's 301 to the slash
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "webapp.core.bidi.BidiBalanceMiddleware",
]

ROOT_URLCONF = "webapp.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "webapp.core.context_processors.low_disk",
            ],
        },
    },
]

ASGI_APPLICATION = "webapp.asgi.application"

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{DATA_ROOT / 'temper.sqlite3'}"),
        conn_max_age=env_int("TEMPER_DB_CONN_MAX_AGE", 0),
    )
}
TEMPER_DB_POOL_MAX = env_int("TEMPER_DB_POOL_MAX", 16)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and TEMPER_DB_POOL_MAX > 0:
    # Under uvicorn, Django runs each request's database work in a thread of its own (asgiref's
    # per-request ThreadSensitiveContext), and a connection belongs to its thread: without a pool every
    # request connected anew, a PostgreSQL backend started and authenticated each time (7-38 ms of wall
    # time a request here: bench/RESULTS.md). A psycopg pool per process hands connections from request to request.
    # Persistent connections (TEMPER_DB_CONN_MAX_AGE) and a pool exclude each other; the pool wins.
    # A pooled connection can die while idle (the server restarted, or ended idle sessions; see also
    # webapp.core.db_pool for forked workers): each is checked (an empty query) before it is handed out,
    # and replaced when dead, rather than failing its request.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1, "max_size": TEMPER_DB_POOL_MAX, "timeout": env_int("TEMPER_DB_POOL_TIMEOUT", 30),
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web process read while a worker writes metrics. Transactions take the write lock
    # when they begin: a deferred one that read first fails at once ("database is locked", no wait)
    # when another process wrote in between, as worker heartbeats every second make likely.
    DATABASES["default"].setdefault("OPTIONS", {})
    DATABASES["default"]["OPTIONS"].update(
        {"timeout": 20, "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
         "transaction_mode": "IMMEDIATE"}
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "accounts:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_ROOT / "staticfiles"
# collectstatic names each file by a hash of its content and writes a gzipped copy beside it (WhiteNoise), so
# pages ask for a name that WhiteNoise serves compressed and cached for good: a new file gets a new name. A page
# rendered before collectstatic has run fails (the name is not in the manifest); scripts/up.sh and the compose
# file run it at every start.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env_bool("TEMPER_CELERY_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# Uploads stream to disk above this many bytes (Django's temporary-file handler).
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
TEMPER_MAX_UPLOAD_BYTES = env_int("TEMPER_MAX_UPLOAD_BYTES", 2 * 1024**3)
# A base model's archive uploaded by a project owner (webapp.basemodels.uploads): the body, and what it unpacks to.
TEMPER_MODEL_UPLOAD_MAX_BYTES = env_int("TEMPER_MODEL_UPLOAD_MAX_BYTES", 20 * 1000**3)
# ... and the most files and folders it may hold: millions of empty ones would use up the disk's inodes.
TEMPER_MODEL_UPLOAD_MAX_MEMBERS = env_int("TEMPER_MODEL_UPLOAD_MAX_MEMBERS", 10_000)
# Signed-in pages show a banner when the data directory's disk (or the models root's) has less free space than this
# or 5 % of its size, whichever is smaller (webapp.core.disk_free); 0 turns the banner off.
# Unset: the smaller of 5 GiB and 5 % of the disk (webapp.core.disk_free); set: that many bytes as is; 0: no banner.
TEMPER_DISK_WARN_FREE_BYTES = env_int("TEMPER_DISK_WARN_FREE_BYTES", None, minimum=0, unit="bytes")
TEMPER_METRICS_TOKEN = env_str("TEMPER_METRICS_TOKEN", "")
# Addresses that may read /metrics without the token; none by default, not even 127.0.0.1: behind a reverse
# proxy on the same host every request comes from there.
TEMPER_METRICS_ALLOW = env_networks("TEMPER_METRICS_ALLOW")
# Reverse proxies whose X-Forwarded-For is believed (webapp.core.addresses.client_address): addresses or networks,
# none by default, when a request's address is its direct peer's whatever it forwards.
TEMPER_TRUSTED_PROXIES = env_networks("TEMPER_TRUSTED_PROXIES")
# The address people reach Temper at ("https://temper.example.org"): the links in webhook messages start with it.
# Empty: each hook's links start with the address its Webhooks page was served at when an owner last saved it.
TEMPER_BASE_URL = env_str("TEMPER_BASE_URL", "").rstrip("/")
if TEMPER_BASE_URL and not TEMPER_BASE_URL.startswith(("http://", "https://")):
    raise ValueError(f"environment variable TEMPER_BASE_URL={TEMPER_BASE_URL!r} must start with http:// or https://, "
                     "e.g. https://temper.example.org")
# Webhook messages go only to public addresses and to these networks (webapp/webhooks/network.py).
TEMPER_WEBHOOK_ALLOWED_NETWORKS = env_networks("TEMPER_WEBHOOK_ALLOWED_NETWORKS")
# Who may create a project (webapp.projects.selectors.may_create_project): any signed-in account, or staff only.
TEMPER_PROJECT_CREATORS = env_choice("TEMPER_PROJECT_CREATORS", "everyone", ("everyone", "staff"))
# The chat list, the arena and /v1/models look at every model's tokenizer, template and serving copy files on each
# load: what stat says of them is kept this many seconds (webapp.core.file_stamps); 0 takes it on every look.
TEMPER_MODEL_FILES_RECHECK_SECONDS = env_int("TEMPER_MODEL_FILES_RECHECK_SECONDS", 2, minimum=0, unit="seconds")
# A sweep (webapp.runs.sweeps) launches at most this many runs: the product of its keys' value counts.
TEMPER_SWEEP_MAX_RUNS = env_int("TEMPER_SWEEP_MAX_RUNS", 16)
# Wrong passwords for one account from browsers it never signed in with, every address together, in the login
# throttle's window: past it those are refused; its known browsers are not (webapp.accounts.throttle).
TEMPER_LOGIN_ACCOUNT_MAX_FAILURES = env_int("TEMPER_LOGIN_ACCOUNT_MAX_FAILURES", 100)
# Seconds between worker heartbeats; 0 turns them off. Stale after TEMPER_WORKER_STALE_AFTER s of silence.
TEMPER_HEARTBEAT_SECONDS = env_int("TEMPER_HEARTBEAT_SECONDS", 10)
# Seconds of silence after which a worker is presumed lost (``webapp.workers.models.stale_after``): shown stale,
# the messages it held queued again, left out of placement and of the live counts. At least two heartbeats: a
# shorter wait would take a live worker between two of its beats for dead and hand its tasks to another.
TEMPER_WORKER_STALE_AFTER = env_int("TEMPER_WORKER_STALE_AFTER", 60, minimum=1, unit="seconds")
if TEMPER_HEARTBEAT_SECONDS > 0 and TEMPER_WORKER_STALE_AFTER < 2 * TEMPER_HEARTBEAT_SECONDS:
    raise ValueError(
        f"environment variable TEMPER_WORKER_STALE_AFTER={TEMPER_WORKER_STALE_AFTER} is shorter than two heartbeats "
        f"(TEMPER_HEARTBEAT_SECONDS={TEMPER_HEARTBEAT_SECONDS}): a live worker would be taken for lost between its "
        f"beats and its tasks handed to another; give at least {2 * TEMPER_HEARTBEAT_SECONDS} seconds, or lower "
        "TEMPER_HEARTBEAT_SECONDS")
# Runs: a running run's worker refreshes its heartbeat this often; a run silent for longer than
# TEMPER_RUN_LOST_SECONDS (or for two of its beats while its worker is silent for two of its own) is lost
# and re-queued to resume, and a checkpoint export whose message
# Redis has held nowhere that long is failed (checked every TEMPER_REAPER_SECONDS by every worker's
# main process; 0 turns the check off in that process).
TEMPER_RUN_HEARTBEAT_SECONDS = env_int("TEMPER_RUN_HEARTBEAT_SECONDS", 5)
TEMPER_RUN_LOST_SECONDS = env_int("TEMPER_RUN_LOST_SECONDS", 60)
TEMPER_REAPER_SECONDS = env_int("TEMPER_REAPER_SECONDS", 5)
# A run lost this many times in a row with no new checkpoint between (killed at the same step again and
# again) is failed with the reason instead of re-queued; 0 re-queues it for ever.
TEMPER_RUN_LOST_LIMIT = env_int("TEMPER_RUN_LOST_LIMIT", 3)
# Multi-host runs (``webapp.runs.placement``): a run waits this long for N free workers of its pool
# (then fails with the reason); each host's process heartbeats in Redis and its peers end the job
# when one is silent for TEMPER_HOST_LOST_SECONDS. A train worker announces the address its peers
# reach it at (default: its host name's IP) and a port for a job's coordinator (default: any free one).
TEMPER_PLACEMENT_TIMEOUT_SECONDS = env_int("TEMPER_PLACEMENT_TIMEOUT_SECONDS", 1800)
TEMPER_HOST_LOST_SECONDS = env_int("TEMPER_HOST_LOST_SECONDS", 15)
# A placed attempt whose hosts did not all start this long after its placement is placed again as a
# new attempt (its started processes stop), with the hosts that did not start named in its log.
TEMPER_HOST_START_SECONDS = env_int("TEMPER_HOST_START_SECONDS", 120)
TEMPER_WORKER_ADDRESS = env_str("TEMPER_WORKER_ADDRESS", "")
TEMPER_COORDINATOR_PORT = env_int("TEMPER_COORDINATOR_PORT", 0)
# Serving: bytes of model weights the serve worker keeps loaded (least recently used out beyond it),
# and the default time limit of one generation.
TEMPER_SERVE_MEMORY_BYTES = env_int("TEMPER_SERVE_MEMORY_BYTES", 8 * 1024**3)
TEMPER_SERVE_TIMEOUT_SECONDS = env_int("TEMPER_SERVE_TIMEOUT_SECONDS", 30)
# The time limit of one review campaign answer (worker.tasks.review.model_answers), counted from its slice's
# submission: longer than a chat answer's, as a campaign may ask for up to 4096 new tokens a prompt and nobody
# reads them as they come, yet bounded, so that one slice cannot hold the serve worker for ever.
TEMPER_REVIEW_ANSWER_TIMEOUT_SECONDS = env_int("TEMPER_REVIEW_ANSWER_TIMEOUT_SECONDS", 600)
# The same bound for an evaluation's greedy completions (worker.tasks.evals), a slice of rows at a time: a setting of
# its own, so that an operator may give campaigns' long sampled answers more time than up to 1024 tokens of greedy
# completion without letting evaluations hold the serve worker as long.
TEMPER_EVAL_ANSWER_TIMEOUT_SECONDS = env_int("TEMPER_EVAL_ANSWER_TIMEOUT_SECONDS", 600)
# A model the serve worker loads compiles a lone conversation's programs in its idle time
# (jaxengine.serving.BatchingServer.warm), so a first answer does not stall at each compile.
TEMPER_SERVE_WARMUP = env_bool("TEMPER_SERVE_WARMUP", True)
# On CPU, concurrent conversations with a small model have their rows split over this many host devices,
# each decoding on its own core (jaxengine.serving.serving_devices, devices_for_model); 0: one per core
# the serve worker may use, 1: one device.
TEMPER_SERVE_CPU_DEVICES = env_int("TEMPER_SERVE_CPU_DEVICES", 0)
# After a model load, a serve worker whose memory maps (/proc/self/maps lines) pass this drops the compiled programs
# of every model structure it retired (worker.tasks.serve.drop_retired_programs_past_high_water): XLA's compiler
# segfaults at the kernel's vm.max_map_count (65,530 by default).
TEMPER_SERVE_MAPS_HIGH_WATER = env_int("TEMPER_SERVE_MAPS_HIGH_WATER", 50_000)
# Workers keep compiled XLA programs here (see worker/celery.py); empty: no persistent cache.
TEMPER_JAX_CACHE = env_str("TEMPER_JAX_CACHE", str(DATA_ROOT / "jax-cache"))
# The serving copy written when a run succeeds: int8 (per channel), int4 (groups of 64) or none.
TEMPER_SERVE_QUANTIZE = env_choice("TEMPER_SERVE_QUANTIZE", "int8", ("int8", "int4", "none"))
# A serving copy shown as being written for longer than this whose task no serve worker holds (its message
# lost, its worker stopped) is shown as failed with that reason, so that it can be made again
# (webapp.runs.serving_copies.serving_copies_give_up_stale).
TEMPER_SERVING_COPY_STALE_SECONDS = env_int("TEMPER_SERVING_COPY_STALE_SECONDS", 1800)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"client_errors_without_traceback": {"()": "webapp.core.logging.ClientErrorsWithoutTraceback"}},
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("TEMPER_LOG_LEVEL", "INFO")},
    # 4xx answers keep their one line, not the traceback of the refusal (see the filter). A logger's filter
    # sees only the records logged on that very logger, so each is named.
    "loggers": {"django.request": {"filters": ["client_errors_without_traceback"]},
                "django.security.DisallowedHost": {"filters": ["client_errors_without_traceback"]}},
}
