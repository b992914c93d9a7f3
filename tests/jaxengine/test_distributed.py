"""jaxengine.distributed: the process group's checks, data-parallel placement on the 8 fake CPU
devices of one process (the same code paths a multi-host job takes, minus the second process: that
is tests/integration/test_multihost.py), and the peer watchdog."""
from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest

from jaxengine.distributed import DataParallel, DistributedError, PeerWatchdog, ProcessGroup, _process_rows
from jaxengine.spec import SpecError, parse_spec


def test_a_process_group_names_its_bad_field():
    ProcessGroup(coordinator_address="10.0.0.1:8476", num_processes=2, process_id=1)
    with pytest.raises(DistributedError, match="coordinator_address: 'host-only' is not host:port"):
        ProcessGroup(coordinator_address="host-only", num_processes=2, process_id=0)
    with pytest.raises(DistributedError, match=r"process_id: 2 is not in 0\.\.1"):
        ProcessGroup(coordinator_address="h:1", num_processes=2, process_id=2)
    with pytest.raises(DistributedError, match="num_processes: 0"):
        ProcessGroup(coordinator_address="h:1", num_processes=0, process_id=0)


def test_batches_split_by_rows_over_every_device():
    placement = DataParallel()
    assert placement.device_count == 8
    batches = np.arange(2 * 16 * 3).reshape(2, 16, 3)  # [A, B, T]
    placed = placement.put_batches(batches)
    assert placed.shape == (2, 16, 3)
    np.testing.assert_array_equal(np.asarray(placed), batches)
    # Each device holds 2 of the 16 rows, in device order, both accumulation steps.
    for shard in placed.addressable_shards:
        rows = shard.index[1]
        assert rows.stop - rows.start == 2
        np.testing.assert_array_equal(np.asarray(shard.data), batches[:, rows])


def test_it_rejects_a_batch_that_does_not_split_over_the_devices():
    with pytest.raises(DistributedError, match="train.batch_size: 12 rows do not split over the job's 8 devices"):
        DataParallel().put_batches(np.zeros((1, 12, 4)))


def test_state_is_replicated_and_comes_back_local():
    placement = DataParallel()
    key = jax.random.key(3)
    state = {"w": np.ones((4, 2), np.float32), "key": key}
    placed = placement.put_state(state)
    assert placed["w"].sharding.is_fully_replicated and len(placed["w"].sharding.device_set) == 8
    assert jax.dtypes.issubdtype(placed["key"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(placed["key"]), jax.random.key_data(key))
    local = placement.to_local(placed)  # one process: already addressable, returned as is
    np.testing.assert_array_equal(np.asarray(local["w"]), state["w"])


def test_a_stop_request_is_agreed():
    placement = DataParallel()
    assert placement.agree(True) is True and placement.agree(False) is False


def test_process_rows_are_the_block_of_its_own_devices():
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxengine.sharding import make_mesh

    # A mesh of the last four devices only: this process holds rows 0-7 of 8 (all of them).
    mesh = make_mesh(data=4, devices=jax.devices()[4:])
    assert _process_rows(NamedSharding(mesh, PartitionSpec("data")), (8, 5), 0) == slice(0, 8)


def test_the_watchdog_reports_a_lost_peer_once():
    verdicts = iter([None, None, "host 1 (worker b) silent for 12 s"])
    seen = []
    done = threading.Event()

    def on_lost(description):
        seen.append(description)
        done.set()

    watchdog = PeerWatchdog(lambda: next(verdicts), interval_seconds=0.01, on_lost=on_lost)
    watchdog.start()
    assert done.wait(5)
    time.sleep(0.05)
    watchdog.stop()
    assert seen == ["host 1 (worker b) silent for 12 s"] and watchdog.lost == seen[0]


def test_a_failing_check_is_no_verdict():
    calls = []

    def check():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("redis away")
        return None

    watchdog = PeerWatchdog(check, interval_seconds=0.01, on_lost=lambda description: pytest.fail(description))
    watchdog.start()
    deadline = time.monotonic() + 5
    while len(calls) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    watchdog.stop()
    assert len(calls) >= 5 and watchdog.lost is None


SPEC = {"task": "sft", "model": "m", "output_dir": "o", "data": {"train": "t.jsonl"}, "train": {"max_steps": 1}}


def test_the_spec_takes_hosts_and_a_pool():
    spec = parse_spec({**SPEC, "hosts": 2, "pool": "tpu-v5e"})
    assert (spec.hosts, spec.pool) == (2, "tpu-v5e")
    assert (parse_spec(SPEC).hosts, parse_spec(SPEC).pool) == (1, "default")


def test_the_spec_rejects_bad_hosts():
    with pytest.raises(SpecError, match="hosts: 0: input should be greater than or equal to 1"):
        parse_spec({**SPEC, "hosts": 0})
    with pytest.raises(SpecError, match="pool: "):
        parse_spec({**SPEC, "pool": "Bad Pool"})
    grpo = {**SPEC, "task": "grpo", "data": {"train": "p.jsonl"}, "grpo": {"rewards": [{"name": "exact_match"}]}}
    with pytest.raises(SpecError, match="hosts: grpo runs on one host"):
        parse_spec({**grpo, "hosts": 2})
