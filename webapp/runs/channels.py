"""Redis names shared by the web and the train worker for one run.

- ``cancel_key(run)``: set (with a day's expiry) when someone cancels; the worker polls it off the
  training thread and stops after the current step. The database's ``Run.cancel_requested`` says the
  same thing for when Redis is away.
- ``events_channel(run)``: pub/sub channel of live events, JSON objects with a ``type``:
  ``metrics`` (``points``: ``[{step, name, value, tokens, wall_time}]``), ``progress`` (step, total,
  tokens, elapsed), ``log`` (``lines``), ``samples`` (``step``), ``status`` (the run's status). The
  database holds everything the channel carries, so a page that missed events loses nothing: it
  reads the database on load and the channel only extends what it has.
- ``evaluating_key(run)``: the latest ``evaluating`` event (JSON, with a day's expiry), kept by the worker as
  it publishes it, so that a page loaded mid-evaluation says so too (the database keeps no such event).
- ``host_key(run, attempt, process)``: each process of a multi-host run refreshes it (with an expiry of
  ``TEMPER_HOST_LOST_SECONDS``) while it lives; a key that expired names the host that was lost.
"""
from __future__ import annotations

import redis
from django.conf import settings

CANCEL_FLAG_SECONDS = 24 * 3600
EVALUATING_SECONDS = 24 * 3600
REDIS_TIMEOUT_SECONDS = 2.0


def cancel_key(public_id: str) -> str:
    return f"temper:run:{public_id}:cancel"


def events_channel(public_id: str) -> str:
    return f"temper:run:{public_id}:events"


def evaluating_key(public_id: str) -> str:
    return f"temper:run:{public_id}:evaluating"


def host_key(public_id: str, attempt: int, process: int) -> str:
    return f"temper:run:{public_id}:attempt:{attempt}:host:{process}"


def redis_client() -> redis.Redis:
    """A short-timeout client: Redis being away must slow nothing down for long."""
    return redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=REDIS_TIMEOUT_SECONDS, socket_connect_timeout=REDIS_TIMEOUT_SECONDS
    )
