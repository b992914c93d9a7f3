"""A pytest plugin that counts, after each test, the process's memory maps and XLA's live compiled programs
(bench/RESULTS.md, "The compiler's segfault"):

    PYTHONPATH=$PWD:bench MAPS_LOG=/tmp/maps.log .venv/bin/python -m pytest -p maps_per_test -p no:cacheprovider FILES

writes ``seconds maps=N live=N nodeid`` lines to MAPS_LOG. MAPS_PREFILL=N maps N single pages first, as a process
that has run more files holds (see bench/compiler_map_limit.py).
"""
import os
import sys
import time

LOG = os.environ.get("MAPS_LOG", "maps.log")
_started = time.time()


def _maps() -> int:
    with open("/proc/self/maps") as handle:
        return sum(1 for _ in handle)


def _live_programs() -> int:
    if "jax" not in sys.modules:
        return -1
    import jax
    return len(jax.devices()[0].client.live_executables())


def _write(line: str) -> None:
    with open(LOG, "a") as out:
        out.write(line + "\n")


def pytest_sessionstart(session):
    prefill = int(os.environ.get("MAPS_PREFILL", "0"))
    if prefill:
        from compiler_map_limit import take_maps
        take_maps(prefill)
    _write(f"session pid={os.getpid()} prefill={prefill} maps={_maps()}")


def pytest_runtest_logfinish(nodeid, location):
    _write(f"{time.time() - _started:7.1f}s maps={_maps()} live={_live_programs()} {nodeid}")
