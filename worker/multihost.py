"""The worker's side of a multi-host run's liveness: each process's heartbeat in Redis, and the
watch on its peers' that ends a process whose peer was lost (``jaxengine.distributed.PeerWatchdog``).

Every process refreshes ``channels.host_key(run, attempt, process)`` every ``BEAT_SECONDS`` with an
expiry of ``TEMPER_HOST_LOST_SECONDS``. A peer whose key was seen and then expired is lost: its
process died (SIGKILL, out of memory, host gone) or stopped being scheduled. The survivor records
the run as failed naming that host (a conditional update: the first process to notice wins, later
verdicts change nothing), gives back its worker's reservation and ends its own process, which is
blocked, or about to be, in a collective that will never complete. Before the verdict it leaves
``stopped`` in its own key: should the verdict not be written (the database busy past every try) or
come after the reaper's (``services.runs_reap_lost``), the reaper names the lost host alone, not
every host whose key is gone. A peer never seen is left to
jax.distributed's initialization timeout: it may still be starting. A process that finished its part
(process 0 still exports the model after the others are done) leaves ``done`` in its key instead.

The watch also asks the database whether the attempt is still on (``placement.attempt_ended_reason``):
an attempt cancelled while queued, failed by a peer or the reaper, or placed again because a host
never started (``placement.runs_replace_unstarted``) ends its processes within a second, including
one still waiting in jax.distributed's initialization for a peer that will never come.

A process can also die without a word when its peer vanishes: the collectives library (gloo) aborts
the whole process (SIGABRT) on a half-received message, so no Python ``finally`` runs and this host's
key expires as well, and the reaper would name every host. The worker's main process, which outlives
its pool process, then does what the dead process would have done (``settle_after_crash``): waits for
the peers' keys, and if some expired, records them as lost and leaves ``stopped`` in this host's key.
"""
from __future__ import annotations

import logging
import threading
import time

import redis
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from jaxengine.distributed import PeerWatchdog, end_process
from webapp.runs import channels, placement, reporting
from webapp.runs.models import Run
from worker.forking import database_round

logger = logging.getLogger(__name__)

BEAT_SECONDS = 1.0
DONE = b"done"
DONE_SECONDS = 3600
# Left by a process that ended itself because a peer was lost: it is not lost itself, so that the
# reaper's fallback verdict (``placement.silent_hosts``) names only the host that really went.
STOPPED = b"stopped"
VERDICT_TRIES = 5


class HostLiveness:
    """Heartbeat of process ``process_id`` of ``run``'s current attempt, and the watch on its peers."""

    def __init__(self, *, run: Run, process_id: int, num_processes: int, worker_name: str,
                 lost_seconds: int | None = None):
        self.run = run
        self.attempt = run.attempt
        self.process_id = process_id
        self.peers = [process for process in range(num_processes) if process != process_id]
        self.worker_name = worker_name
        self.lost_seconds = lost_seconds or settings.TEMPER_HOST_LOST_SECONDS
        self._client = channels.redis_client()
        self._seen: set[int] = set()
        self._lost: list[int] = []
        self._stop = threading.Event()
        self._beat_thread = threading.Thread(target=self._beat_loop, name="temper-host-heartbeat", daemon=True)
        self.watchdog = PeerWatchdog(self.check, interval_seconds=BEAT_SECONDS, on_lost=self._end_lost)

    def _key(self, process: int) -> str:
        return channels.host_key(self.run.public_id, self.attempt, process)

    def start(self) -> None:
        self._beat()
        self._beat_thread.start()
        self.watchdog.start()

    def stop(self, *, finished: bool) -> None:
        """Stop beating and watching; ``finished``: this process's part of the job is done (its peers
        may still be finishing theirs), else it gave up and its peers should stop too."""
        self.watchdog.stop()
        self._leave(DONE if finished else None)
        self._client.close()

    def _beat(self) -> None:
        try:
            self._client.set(self._key(self.process_id), self.worker_name, ex=self.lost_seconds)
        except redis.RedisError as error:  # the next beat retries; a peer only acts after lost_seconds
            logger.warning("host heartbeat of run %s not written: %s", self.run.public_id, error)

    def _beat_loop(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            self._beat()

    def silent_peers(self) -> list[int]:
        """Peers that were seen alive and whose heartbeat has since expired (a finished peer is not lost)."""
        alive = [self._client.get(self._key(process)) is not None for process in self.peers]
        self._seen.update(process for process, present in zip(self.peers, alive) if present)
        return [process for process, present in zip(self.peers, alive) if not present and process in self._seen]

    def check(self) -> str | None:
        """The watchdog's question: why this process must end now (None: it goes on)."""
        self._lost = []
        ended = placement.attempt_ended_reason(run_pk=self.run.pk, attempt=self.attempt)
        if ended is not None:
            return ended
        self._lost = self.silent_peers()
        if not self._lost:
            return None
        return ", ".join(f"host {process}" for process in self._lost) + " lost"

    def wait_for_lost_peers(self) -> list[int]:
        """After the engine raised: the peers lost (an error in a collective is often the echo of a
        dead peer), waiting up to ``lost_seconds`` for their heartbeats to expire; [] if none was."""
        deadline = time.monotonic() + self.lost_seconds + 2 * BEAT_SECONDS
        while True:
            try:
                lost = self.silent_peers()
            except redis.RedisError:
                return []
            if lost or time.monotonic() > deadline:
                return lost
            time.sleep(BEAT_SECONDS)

    def _end_lost(self, description: str) -> None:
        """Watchdog verdict: record the lost hosts (if that is the reason), give the worker back, end
        this process. A verdict that cannot be written (the database busy past its timeout) is tried
        again; ended this process must be in any case, since it is blocked, or about to be, in a
        collective."""
        close_old_connections()
        try:
            if self._lost:
                self._leave(STOPPED)
                self._record_loss()
            placement.host_release(worker_name=self.worker_name, run_pk=self.run.pk, attempt=self.attempt)
        except Exception:
            logger.exception("run %s: the verdict '%s' was not recorded", self.run.public_id, description)
        finally:
            logger.error("run %s: %s; ending process %s", self.run.public_id, description, self.process_id)
            end_process(description)

    def _leave(self, value: bytes | None) -> None:
        """Stop beating and leave ``value`` in this process's key for an hour (None: remove the key,
        so that the peers take this process for lost at once)."""
        self._stop.set()
        if self._beat_thread.is_alive() and self._beat_thread is not threading.current_thread():
            self._beat_thread.join(timeout=5)
        try:
            if value is None:
                self._client.delete(self._key(self.process_id))
            else:
                self._client.set(self._key(self.process_id), value, ex=DONE_SECONDS)
        except redis.RedisError as error:  # the key expires by itself
            logger.warning("run %s: host %s's key not updated: %s", self.run.public_id, self.process_id, error)

    def settle_after_crash(self) -> list[int]:
        """In the worker's main process, after the pool process running this host died (see the module
        note): the peers lost, waiting up to ``lost_seconds`` for their keys to expire, recorded as the
        run's verdict with ``stopped`` left in this host's key; [] when none went (this host's death is
        then the loss, which its peers or the reaper record). The reservation is given back either way.
        The main process forks the dead process's replacement meanwhile, so the database is used in one
        ``database_round`` (``worker.forking``), after the wait."""
        self._seen.update(self.peers)  # the attempt ran: every peer had started
        try:
            lost = self.wait_for_lost_peers()
            with database_round():
                if lost:
                    self._lost = lost
                    self._leave(STOPPED)
                    self._record_loss()
                    logger.error("run %s: host %s's process died after %s; recorded", self.run.public_id,
                                 self.process_id, ", ".join(f"host {process} was lost" for process in lost))
                placement.host_release(worker_name=self.worker_name, run_pk=self.run.pk, attempt=self.attempt)
            return lost
        finally:
            self._client.close()

    def _record_loss(self) -> None:
        for attempt in range(1, VERDICT_TRIES + 1):
            try:
                reporting.run_fail_hosts_lost(run=self.run, lost=self._lost)
                return
            except DatabaseError as error:
                if attempt == VERDICT_TRIES:
                    raise
                logger.warning("run %s: recording the lost hosts failed (%s); trying again", self.run.public_id, error)
                time.sleep(BEAT_SECONDS)
                close_old_connections()
