"""Shared fixtures. Test doubles (tiny models, toy tokenizers) live in tests/factories.py.

Eight fake CPU devices let sharding tests build real meshes; the flag must be set
before jax is first imported, which is why it lives at the top of the root conftest.

The tests' tiny models spend most of their time being compiled, so XLA's CPU backend builds them
at LLVM optimisation level 0: the same HLO programs after the same XLA passes, emitted without
LLVM's optimisations (the matmuls are library calls at every level). It cut the engine's tests from
582 to 475 s on a 2-core Xeon (bench/RESULTS.md, "Test suite time"). Its elementwise fusions are emitted by
XLA's older LLVM IR emitters (``--xla_cpu_use_fusion_emitters=false``), which compile in about half the CPU time
of the MLIR fusion emitters on these tiny programs (bench/RESULTS.md, "XLA's fusion emitters"): the same HLO after
the same passes, each element computed by the same operations, with their own approximations of exp, log and
tanh. A test that compares two programs to a bound of float32 rounding runs as shipped (``as_shipped``). Set
XLA_FLAGS yourself to run them all as shipped, e.g. ``XLA_FLAGS=--xla_force_host_platform_device_count=8 make test``.
"""
import os
import subprocess
import sys

SUITE_ONLY_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {SUITE_ONLY_FLAGS}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Real Redis and Celery worker processes for integration and browser tests (see tests/live.py).
from tests.live import celery_workers, default_worker, redis_server, redis_url  # noqa: E402,F401
# A worker process that crashes fails its test, not the whole run by a hang (see the module).
from tests.xdist_scheduling import pytest_handlecrashitem, pytest_xdist_make_scheduler  # noqa: E402,F401

import pytest  # noqa: E402

from tests import fast_flush  # noqa: E402

# Transactional tests' teardown empties the tables without remaking content types and permissions (see the module).
fast_flush.install()


@pytest.fixture(scope="module", autouse=True)
def _compiled_programs_freed_after_each_module():
    """XLA programs that a test file compiled are freed when it ends (``jax.clear_caches``: a few milliseconds when
    the caches are empty); files that share a program compile it again. Kept, the programs of every model, layout and
    shape a process's files met stayed compiled, each with memory regions of its own mapped for its code and
    constants (on CPU from 3 for a small function to about 40 for a training step on 8 devices): once the process
    reached the kernel's limit on maps (vm.max_map_count, 65,530 by default), LLVM's next allocation failed and XLA
    segfaulted compiling whatever came next (bench/RESULTS.md, "The compiler's segfault")."""
    yield
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()


@pytest.fixture(scope="module", autouse=True)
def _serve_workers_state_closed_after_each_module(_compiled_programs_freed_after_each_module):
    """Tests that answer in this process (``worker.tasks.serve.generate``) leave its batching servers, their
    loaded models and the deleted-models watcher in the module's state: closed after each test file, so
    that none of their threads idles on beside the rest of the run. Before the file's compiled programs are freed
    (it asks for that fixture so that its own end comes first): a model's warm-up may still be compiling."""
    yield
    serve = sys.modules.get("worker.tasks.serve")
    if serve is not None:
        serve.shutdown()


def as_shipped(nodeid: str) -> bool:
    """For a test whose claim depends on how XLA emits its programs (two programs agreeing to float32 rounding):
    False where this process compiles as shipped (run the test here); otherwise the test ``nodeid`` is run in a
    child pytest whose XLA_FLAGS leave out the suite's own (``SUITE_ONLY_FLAGS``), which must pass, and True."""
    flags = os.environ.get("XLA_FLAGS", "")
    if not any(flag in flags.split() for flag in SUITE_ONLY_FLAGS.split()):
        return False
    shipped = " ".join(flag for flag in flags.split() if flag not in SUITE_ONLY_FLAGS.split())
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", nodeid],
                            env={**os.environ, "XLA_FLAGS": shipped}, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    return True
