"""Shared fixtures. Test doubles (tiny models, toy tokenizers) live in tests/factories.py.

Eight fake CPU devices let sharding tests build real meshes; the flag must be set
before jax is first imported, which is why it lives at the top of the root conftest.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Real Redis and Celery worker processes for integration and browser tests (see tests/live.py).
from tests.live import celery_workers, default_worker, redis_server, redis_url  # noqa: E402,F401
