"""``/metrics`` in Prometheus text format.

- ``temper_http_request_duration_seconds``: server time per request, by method
  (HTTP's own, any other as ``other``), URL pattern (not the raw path) and status, so
  that no request can add label sets without bound; measured by ``RequestMetricsMiddleware``,
  first in the middleware stack.
- ``temper_queue_depth``: messages waiting in each Celery queue (Redis LLEN),
  and ``temper_redis_up``.
- ``temper_jobs``: rows by kind and state for every model an app registered with
  ``register_job_model`` (datasets, runs, ...).
- ``temper_workers``: workers by heartbeat state, ``temper_workers_alive``.

The gauges are computed when scraped, so they are true for every web process.
Readable without login only with ``Authorization: Bearer $TEMPER_METRICS_TOKEN`` or
from an address in ``TEMPER_METRICS_ALLOW``; everyone else gets 403. No address is
trusted unless listed, not even the same host's: behind a reverse proxy on it every
request comes from 127.0.0.1. The address is the client's (``addresses.client_address``:
the forwarded one behind a proxy listed in ``TEMPER_TRUSTED_PROXIES``).
"""
from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis
from django.conf import settings
from django.db.models import Count, Model
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from webapp.celery import app as celery_app
from webapp.core.addresses import client_address
from webapp.core.middleware import DualModeMiddleware
from webapp.workers.models import WorkerState
from webapp.workers.selectors import worker_list

logger = logging.getLogger(__name__)

REDIS_TIMEOUT_SECONDS = 1.0

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
REQUEST_DURATION = Histogram(
    "temper_http_request_duration_seconds",
    "Server time per HTTP request",
    ["method", "route", "status"],
    registry=REGISTRY,
)


# The methods counted by name (RFC 9110's and PATCH); a server takes any token as a method, and each one a client
# made up would otherwise be a label set kept for the process's life.
COUNTED_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})


@dataclass(frozen=True, kw_only=True)
class JobModel:
    kind: str
    model: type[Model]
    state_field: str


_job_models: list[JobModel] = []


def register_job_model(*, kind: str, model: type[Model], state_field: str = "status") -> None:
    """Count rows of ``model`` by ``state_field`` in ``temper_jobs{kind=...}``.
    Call from the app's ``AppConfig.ready()``."""
    if any(job_model.kind == kind for job_model in _job_models):
        return
    _job_models.append(JobModel(kind=kind, model=model, state_field=state_field))


class RequestMetricsMiddleware(DualModeMiddleware):
    """Times every request into ``temper_http_request_duration_seconds``."""

    def call(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        self._observe(request, response, started)
        return response

    async def acall(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = await self.get_response(request)
        self._observe(request, response, started)
        return response

    @staticmethod
    def _observe(request: HttpRequest, response: HttpResponse, started: float) -> None:
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None else "unmatched"
        method = request.method if request.method in COUNTED_METHODS else "other"
        REQUEST_DURATION.labels(method, route, str(response.status_code)).observe(
            time.perf_counter() - started
        )


def celery_queue_names() -> list[str]:
    return sorted(queue.name for queue in celery_app.conf.task_queues)


class StateCollector(Collector):
    """Queue depths, jobs by state and workers, read at scrape time."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._queues()
        yield self._jobs()
        yield from self._workers()

    def _queues(self) -> Iterator[GaugeMetricFamily]:
        redis_up = GaugeMetricFamily("temper_redis_up", "1 when Redis answered this scrape")
        depth = GaugeMetricFamily("temper_queue_depth", "Messages waiting in a Celery queue", labels=["queue"])
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=REDIS_TIMEOUT_SECONDS, socket_connect_timeout=REDIS_TIMEOUT_SECONDS
        )
        try:
            lengths = [(name, client.llen(name)) for name in celery_queue_names()]
        except redis.RedisError as error:
            logger.warning("metrics: Redis at %s did not answer: %s", settings.REDIS_URL, error)
            redis_up.add_metric([], 0)
            yield redis_up
            return
        finally:
            client.close()
        redis_up.add_metric([], 1)
        for name, length in lengths:
            depth.add_metric([name], length)
        yield redis_up
        yield depth

    def _jobs(self) -> GaugeMetricFamily:
        jobs = GaugeMetricFamily("temper_jobs", "Jobs (datasets, runs, ...) by kind and state", labels=["kind", "state"])
        for job_model in _job_models:
            rows = job_model.model.objects.values(job_model.state_field).annotate(count=Count("pk"))
            for row in rows.order_by(job_model.state_field):
                jobs.add_metric([job_model.kind, str(row[job_model.state_field])], row["count"])
        return jobs

    def _workers(self) -> Iterator[GaugeMetricFamily]:
        by_state = {state.value: 0 for state in WorkerState}
        for worker in worker_list():
            by_state[worker.state] += 1
        workers = GaugeMetricFamily("temper_workers", "Workers by heartbeat state", labels=["state"])
        for state, count in by_state.items():
            workers.add_metric([state], count)
        yield workers
        yield GaugeMetricFamily(
            "temper_workers_alive", "Workers with a heartbeat in the last 60 s", value=by_state[WorkerState.ALIVE]
        )


REGISTRY.register(StateCollector())


def metrics_allowed(request: HttpRequest) -> bool:
    """Requests bearing the configured token, and requests from an address in ``TEMPER_METRICS_ALLOW``,
    may read metrics."""
    token = settings.TEMPER_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    # Compared as bytes: compare_digest raises on a str with characters outside ASCII, which a header may hold.
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[len("Bearer "):].encode(), token.encode()):
        return True
    try:
        address = ipaddress.ip_address(client_address(request))
    except ValueError:
        return False
    return any(address in network for network in settings.TEMPER_METRICS_ALLOW)


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(request):
        return HttpResponse(
            "metrics are readable with 'Authorization: Bearer <TEMPER_METRICS_TOKEN>', or from an address listed in "
            f"TEMPER_METRICS_ALLOW (this request came from {client_address(request) or 'no address'}); "
            "set either where Temper runs\n",
            status=403,
            content_type="text/plain",
        )
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
