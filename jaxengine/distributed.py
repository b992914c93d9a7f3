"""Multi-host jobs: one process per host joins JAX's multi-controller runtime (``jax.distributed``).

Design note. Something outside the engine places the processes (the web app reserves N workers of
a host pool and sends each one task; ``jaxengine train --coordinator ...`` does it by hand) and
gives each its ``ProcessGroup``: the coordinator's address (process 0's host and a free port), the
process count and its own index. ``initialize`` joins the group before jax computes anything.

Every process then runs the same trainer on the same data order, its arrays global over a mesh
of every process's devices (``jaxengine.job.job_placement``: the spec's ``parallel`` layout, or the
default one, which on CPU puts every device on ``data``; ``jaxengine.sharding.MeshPlacement``
places the state by its logical axes and cuts each device's rows of a batch from the batch every
process holds). The jitted step is thus one SPMD program over all hosts and XLA's own collectives
(gloo on CPU, NCCL on GPU, ICI on TPU) reduce the gradients: no collective layer of Temper's own.
Process 0 alone writes the run directory's files and reports; orbax checkpoints are written by all
processes together; a stop request is agreed by all processes so that they stop at the same step.

A process that dies leaves its peers blocked in the next collective. ``PeerWatchdog`` polls a
liveness check (the worker's: the peers' heartbeats in Redis) on its own thread, which a blocked
collective does not hold, and calls ``on_lost`` (by default: end the process) when a peer falls
silent; jax's coordination-service heartbeat (``heartbeat_timeout_seconds``) is the backstop.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# Seconds without a heartbeat after which jax's coordination service declares a process dead (and
# ends the others). Longer than the watchdogs' verdicts, which name the lost host before that.
JAX_HEARTBEAT_TIMEOUT_SECONDS = 60
# How long process 0 waits for every peer to connect.
INITIALIZATION_TIMEOUT_SECONDS = 300


class DistributedError(RuntimeError):
    """A process group that cannot form or a job that cannot run across it; the message says why."""


@dataclass(frozen=True, kw_only=True)
class ProcessGroup:
    """This process's place in a multi-host job."""

    coordinator_address: str  # "host:port" of process 0's coordination service
    num_processes: int
    process_id: int

    def __post_init__(self) -> None:
        host, _, port = self.coordinator_address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise DistributedError(f"coordinator_address: {self.coordinator_address!r} is not host:port")
        if self.num_processes < 1:
            raise DistributedError(f"num_processes: {self.num_processes} must be at least 1")
        if not 0 <= self.process_id < self.num_processes:
            raise DistributedError(f"process_id: {self.process_id} is not in 0..{self.num_processes - 1}")


def initialize(group: ProcessGroup, *, heartbeat_timeout_seconds: int = JAX_HEARTBEAT_TIMEOUT_SECONDS,
               initialization_timeout_seconds: int = INITIALIZATION_TIMEOUT_SECONDS) -> None:
    """Join ``group`` (``jax.distributed.initialize``); call before anything else uses jax.

    One process joins one group: a process that already joined one (a Celery pool child reused for
    a second job) is refused, since jax cannot leave a group and join another cleanly."""
    import jax

    if jax.distributed.is_initialized():
        raise DistributedError("this process already joined a jax.distributed group; run multi-host jobs in "
                               "workers started with --max-tasks-per-child 1 (a fresh process per job)")
    # gloo gives CPU devices cross-process collectives (the default of recent jax; explicit here).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=group.coordinator_address, num_processes=group.num_processes,
        process_id=group.process_id, initialization_timeout=initialization_timeout_seconds,
        heartbeat_timeout_seconds=heartbeat_timeout_seconds,
    )
    logger.info("process %s of %s joined %s: %s local devices of %s", group.process_id, group.num_processes,
                group.coordinator_address, jax.local_device_count(), jax.device_count())


def shutdown() -> None:
    """Leave the group (all processes should, at the end of the job)."""
    import jax

    if jax.distributed.is_initialized():
        jax.distributed.shutdown()


class PeerWatchdog:
    """Calls ``check()`` every ``interval_seconds`` on a daemon thread; when it returns a description
    of a lost peer, calls ``on_lost(description)`` once and stops. The default ``on_lost`` ends the
    process at once (``os._exit``): a process blocked in a collective cannot be unwound politely."""

    def __init__(self, check: Callable[[], str | None], *, interval_seconds: float = 1.0,
                 on_lost: Callable[[str], None] | None = None):
        self.check = check
        self.interval_seconds = interval_seconds
        self.on_lost = on_lost or end_process
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="temper-peer-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            try:
                lost = self.check()
            except Exception:  # a failed check (Redis away) is no verdict; the next one retries
                logger.exception("peer check failed; retrying in %s s", self.interval_seconds)
                continue
            if lost is not None:
                self.lost = lost
                logger.error("peer lost: %s", lost)
                self.on_lost(lost)
                return


def end_process(description: str) -> None:
    """End this process at once (no cleanup: it may be blocked in a collective)."""
    logger.error("ending this process: %s", description)
    os._exit(75)
