"""Worker heartbeats: every Celery worker process reports who and where it is.

On ``worker_ready`` a daemon thread in the worker's main process writes a
heartbeat row (``webapp.workers.services.worker_heartbeat_record``) at once and
then every ``settings.TEMPER_HEARTBEAT_SECONDS``; ``worker_shutdown`` stops it and
marks the worker stopped. The running job comes from Celery's own record of the
requests this worker has accepted, which the main process keeps whatever the pool.

Devices are probed once, in a short-lived subprocess, because importing jax and
initialising a backend in the worker's main process would break the forked pool
children (JAX is not fork-safe) and would hold accelerator memory the jobs need.
The probe runs with preallocation off so that three workers starting together on
one GPU host do not each grab most of its memory. Until it answers, heartbeats
carry empty devices (shown as "probing").

Train workers also announce their host pool (from their queue), the address their peers reach them
at (``TEMPER_WORKER_ADDRESS``, default the IP of their host name) and a port that a multi-host job
placed here can use for its coordinator (``TEMPER_COORDINATOR_PORT``, default one found free at
each beat): ``webapp.runs.placement`` reads them.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import datetime

from celery import signals
from celery.worker import state as worker_state
from django.conf import settings
from django.utils import timezone

from webapp.runs.placement import pool_of_queues
from worker.forking import database_round
from webapp.workers.services import worker_heartbeat_record, worker_mark_stopped

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 180
PROBE_SCRIPT = """
import json
import jax

devices = jax.local_devices()
memory_bytes = None
try:
    stats = devices[0].memory_stats()  # None on CPU; bytes_limit on GPU/TPU
    memory_bytes = (stats or {}).get("bytes_limit")
except Exception:  # memory is reported where the backend knows it, nowhere else
    pass
print(json.dumps({
    "platform": devices[0].platform,
    "count": len(devices),
    "kinds": sorted({device.device_kind for device in devices}),
    "memory_bytes": memory_bytes,
    "jax_version": jax.__version__,
}))
"""


def probe_devices(*, started: Callable[[subprocess.Popen], bool] = lambda process: True) -> dict:
    """JAX's view of this host's devices, from a subprocess: platform, count,
    device kinds, memory per device (None where unknown); ``{"error": ...}`` on failure.
    ``started(process)`` is told the subprocess as soon as it runs; False ends it (the worker is stopping)."""
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    process = subprocess.Popen([sys.executable, "-c", PROBE_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    if not started(process):
        process.kill()
        process.communicate()
        return {"error": "the worker stopped before its device probe answered"}
    try:
        stdout, stderr = process.communicate(timeout=PROBE_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"error": f"device probe gave no answer within {PROBE_TIMEOUT_SECONDS} s"}
    if process.returncode != 0:
        return {"error": f"device probe failed: {stderr.strip()[-500:]}"}
    return json.loads(stdout.strip().splitlines()[-1])


def worker_address() -> str:
    """``TEMPER_WORKER_ADDRESS``, else the IP address this host's name resolves to, else the name."""
    if settings.TEMPER_WORKER_ADDRESS:
        return settings.TEMPER_WORKER_ADDRESS
    host = socket.gethostname()
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def coordinator_port() -> int:
    """``TEMPER_COORDINATOR_PORT``, else a TCP port free on this host right now."""
    if settings.TEMPER_COORDINATOR_PORT:
        return settings.TEMPER_COORDINATOR_PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def current_jobs() -> list[str]:
    """The tasks this worker is running, as ``task.name argsrepr`` strings."""
    return sorted(
        f"{request.name} {request.argsrepr}"[:200] for request in list(worker_state.active_requests)
    )


def held_deliveries() -> list[str]:
    """The broker delivery tags of the messages this worker holds: running, or reserved and waiting for
    the pool (acks late: Redis keeps each as delivered until its task ends)."""
    requests = list(worker_state.active_requests) + list(worker_state.reserved_requests)
    return sorted({str(request.message.delivery_tag) for request in requests
                   if request.message is not None and request.message.delivery_tag is not None})


class Heartbeat:
    """Sends this worker's heartbeat until stopped."""

    def __init__(self, *, name: str, queues: list[str], interval_seconds: float) -> None:
        self.name = name
        self.queues = queues
        self.pool = pool_of_queues(queues)
        self.address = worker_address() if self.pool else ""
        self.interval_seconds = interval_seconds
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.started_at: datetime = timezone.now()
        self.devices: dict = {}
        self._stop = threading.Event()
        # The device probe's subprocess while it runs: stop() ends it, so that a worker stopped while
        # its probe is still importing jax leaves no process behind (up.sh's Ctrl-C test saw one).
        self._probe_process: subprocess.Popen | None = None
        self._probe_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="temper-heartbeat", daemon=True)

    def start(self) -> None:
        threading.Thread(target=self._probe, name="temper-device-probe", daemon=True).start()
        self._thread.start()

    def stop(self) -> None:
        with self._probe_lock:
            self._stop.set()
            probe = self._probe_process
        if probe is not None and probe.poll() is None:
            probe.kill()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with database_round():
            worker_mark_stopped(name=self.name, pid=self.pid)

    def beat(self) -> None:
        """Write one heartbeat now (a database round: no pool child forks meanwhile, ``worker.forking``)."""
        with database_round():
            worker_heartbeat_record(
                name=self.name,
                host=self.host,
                pid=self.pid,
                queues=self.queues,
                devices=self.devices,
                current_jobs=current_jobs(),
                deliveries=held_deliveries(),
                started_at=self.started_at,
                pool=self.pool,
                address=self.address,
                coordinator_port=coordinator_port() if self.pool else None,
            )

    def _probe(self) -> None:
        self.devices = probe_devices(started=self._probe_started)
        if not self._stop.is_set():
            self._beat_safely()

    def _probe_started(self, process: subprocess.Popen) -> bool:
        """Record the probe's subprocess for stop(); False when stop() came first (the probe is ended)."""
        with self._probe_lock:
            self._probe_process = process
            return not self._stop.is_set()

    def _run(self) -> None:
        while True:
            self._beat_safely()
            if self._stop.wait(self.interval_seconds):
                return

    def _beat_safely(self) -> None:
        try:
            self.beat()
        except Exception:  # a missed heartbeat must never take the worker down
            logger.exception("heartbeat of %s failed; retrying in %s s", self.name, self.interval_seconds)


_heartbeat: Heartbeat | None = None


@signals.worker_ready.connect
def _start_heartbeat(sender, **kwargs) -> None:
    global _heartbeat
    if settings.TEMPER_HEARTBEAT_SECONDS <= 0:
        return
    queues = sorted(sender.app.amqp.queues.consume_from)
    _heartbeat = Heartbeat(
        name=sender.hostname, queues=queues, interval_seconds=settings.TEMPER_HEARTBEAT_SECONDS
    )
    _heartbeat.start()


@signals.worker_shutdown.connect
def _stop_heartbeat(sender, **kwargs) -> None:
    if _heartbeat is not None:
        _heartbeat.stop()
