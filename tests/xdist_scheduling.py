"""The suite's ``--dist loadfile`` scheduler, made to survive a worker that crashes.

pytest-xdist 3.8's file scheduler hangs for good when a worker process dies mid-file (a segfault in native
code, say) and it replaces the worker: it puts back on the queue every file the dead worker had ever been
given, finished ones included, and the replacement is handed an empty or one-test batch it waits on
forever (pytest-dev/pytest-xdist#784, #1323, #1327, #1363; no release has the fixes yet). CI then runs
into its time limit instead of reporting the one failed test. Here the test the worker died in is
run once more, first, by the replacement (``pytest_handlecrashitem``: the summary counts it as a rerun; a
second crash of it is reported failed), the rest of its file goes to the replacement, and a worker whose
batch is the last work there is is told so, so that it runs the batch's last test. The one retry is a safety net
for crashes of native code that come and go; a test that kills its process every time still fails. XLA's CPU
compiler segfaulted so in three clean-clone CIs (2026-12-06), in tests that pass alone and in their file: the
process had kept every program it compiled and reached the kernel's limit on memory maps; tests/conftest.py now
frees each file's programs (bench/RESULTS.md, "The compiler's segfault").

It also hands out the longest files first (``LONGEST_FILES``). xdist queues files by their number of tests,
most first, so a file of one long test (the PostgreSQL rerun of tests/webapp, 3-5 minutes in CI) came last
and one process ran it alone while the other sat idle; sent first, the long files run beside each other and
the many short files even out the end (bench/RESULTS.md, "Test suite time").
"""
from __future__ import annotations

import pytest
from xdist.scheduler import LoadFileScheduling


# The files that take longest in one process, longest first: the PostgreSQL rerun (one test, 216-306 s in the
# clean-clone CI), then by a whole-suite run's durations under load (a file's time is its tests' setup, call and
# teardown; bench/RESULTS.md, "Test suite time"). Files not named here follow in xdist's order.
LONGEST_FILES = (
    "tests/postgres/test_webapp_suite_postgres.py",
    "tests/jaxengine/test_sharded_training.py",
    "tests/jaxengine/test_serving.py",
    "tests/worker/test_serve.py",
    "tests/jaxengine/test_grpo.py",
    "tests/jaxengine/test_job.py",
    "tests/integration/test_runs.py",
    "tests/jaxengine/test_trainer.py",
    "tests/bench/test_gpu_scripts.py",
    "tests/jaxengine/test_ppo.py",
    "tests/browser/test_runs.py",
    "tests/jaxengine/sampler/test_sampler.py",
    "tests/jaxengine/test_quantize.py",
    "tests/browser/test_accessibility.py",
    "tests/integration/test_multihost.py",
    "tests/jaxengine/test_losses.py",
    "tests/postgres/test_project_delete_postgres.py",
    "tests/jaxengine/models/test_families.py",
)


class CrashSafeLoadFileScheduling(LoadFileScheduling):
    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        unfinished = {scope: tests for scope, tests in workload.items() if not all(tests.values())}
        if not unfinished:
            return None
        # Tests run in the order they were sent, so the first one not done is the one the worker died in.
        crashed_scope, crashed = next(
            (scope, nodeid) for scope, tests in unfinished.items() for nodeid, done in tests.items() if not done)
        unfinished[crashed_scope][crashed] = True
        self.workqueue.update((scope, tests) for scope, tests in unfinished.items() if not all(tests.values()))
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed

    def mark_test_pending(self, item: str) -> None:
        """Queue ``item`` (a test its worker died in, which ``remove_node`` marked done) to run again, first."""
        scope = self._split_scope(item)
        tests = self.workqueue.setdefault(scope, {item: False})
        tests[item] = False
        self.workqueue.move_to_end(scope, last=False)

    def _reschedule(self, node) -> None:
        # xdist reschedules every node whenever one finishes collecting, a replacement still collecting included,
        # and fails (KeyError) if there is work to hand it: with a crashed test queued again, two crashes at once
        # met that. Its own collection's end schedules it.
        if node not in self.registered_collections:
            return
        super()._reschedule(node)

    def _assign_work_unit(self, node) -> None:
        longest = next((scope for scope in LONGEST_FILES if scope in self.workqueue), None)
        if longest is not None:
            self.workqueue.move_to_end(longest, last=False)  # the queue's first unit is the one sent
        super()._assign_work_unit(node)
        # A worker runs a test once it knows what comes next (another test, or that there is no more work):
        # with the queue empty nothing else would tell it, after a replacement's first batch.
        if not self.workqueue and self.collection is not None and not node.shutting_down:
            node.shutdown()


_crashes_retried: set[str] = set()


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    if crashitem in _crashes_retried or not isinstance(sched, CrashSafeLoadFileScheduling):
        return None  # reported failed, as xdist does
    _crashes_retried.add(crashitem)
    sched.mark_test_pending(crashitem)
    report.outcome = "rerun"
    report.longrepr = f"{report.longrepr}; run once more by its replacement (a second crash fails it)"
    return True


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadfile":
        return CrashSafeLoadFileScheduling(config, log)
    return None
