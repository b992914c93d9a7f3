"""A worker process that dies mid-file: that one test runs once more, a second crash fails it; the run goes on and
ends (tests/xdist_scheduling.py)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PASSING = "def test_one():\n    pass\n\ndef test_two():\n    pass\n"
# The worker process dies as a segfault in native code would take it: no report, no teardown.
DIES = "import os\n\ndef test_dies():\n    os._exit(1)\n\ndef test_after_it():\n    pass\n"
DIES_ALONE = "import os\n\ndef test_dies_alone():\n    os._exit(1)\n"
# Dies the first time only, as a crash that comes and goes.
DIES_ONCE = ("import os, pathlib\n\ndef test_dies_once():\n    mark = pathlib.Path('died.mark')\n"
             "    if not mark.exists():\n        mark.write_text('x')\n        os._exit(1)\n\n"
             "def test_after_it():\n    pass\n")


def run_suite(directory: Path, files: dict[str, str], workers: int) -> subprocess.CompletedProcess:
    for name, text in files.items():
        (directory / name).write_text(text)
    (directory / "pytest.ini").write_text("[pytest]\n")
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("PYTEST_", "DJANGO_"))}
    environment["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider", "-p", "tests.xdist_scheduling",
         "-n", str(workers), "--dist", "loadfile", "-q", *sorted(name for name in files if name != "conftest.py")],
        cwd=directory, env=environment, capture_output=True, text=True, timeout=120)


def test_the_rest_of_a_file_runs_after_its_worker_dies_and_the_crash_is_one_failure(tmp_path):
    result = run_suite(tmp_path, {"test_a.py": PASSING, "test_b.py": DIES}, workers=1)
    assert "1 failed, 3 passed, 1 rerun" in result.stdout, result.stdout  # run twice, crashed twice
    assert "FAILED test_b.py::test_dies" in result.stdout


def test_a_crash_that_does_not_come_again_is_a_rerun_not_a_failure(tmp_path):
    result = run_suite(tmp_path, {"test_a.py": PASSING, "test_b.py": DIES_ONCE}, workers=1)
    assert result.returncode == 0, result.stdout
    assert "4 passed, 1 rerun" in result.stdout, result.stdout


def test_a_run_whose_last_file_crashes_its_worker_ends(tmp_path):
    result = run_suite(tmp_path, {"test_a.py": DIES_ALONE, "test_b.py": PASSING, "test_c.py": DIES_ALONE}, workers=2)
    assert "2 failed, 2 passed" in result.stdout, result.stdout


def test_the_suite_schedules_its_files_with_it(pytestconfig):
    from tests import xdist_scheduling

    implementations = pytestconfig.pluginmanager.hook.pytest_xdist_make_scheduler.get_hookimpls()
    assert xdist_scheduling.pytest_xdist_make_scheduler in [implementation.function for implementation in implementations]


def test_the_longest_files_are_sent_first_and_the_rest_in_xdists_order(tmp_path):
    # xdist alone sends test_a.py first (most tests); the files named as longest go before it, in their order.
    def recording(count: int) -> str:
        return "".join(f"def test_{index}():\n    with open('order.log', 'a') as log:\n"
                       f"        log.write(__file__.rsplit('/', 1)[-1] + '\\n')\n\n" for index in range(count))

    conftest = "import tests.xdist_scheduling as scheduling\n\nscheduling.LONGEST_FILES = ('test_c.py', 'test_b.py')\n"
    result = run_suite(tmp_path, {"conftest.py": conftest, "test_a.py": recording(3), "test_b.py": recording(1),
                                  "test_c.py": recording(1), "test_d.py": recording(2)}, workers=1)
    assert "7 passed" in result.stdout, result.stdout
    assert (tmp_path / "order.log").read_text().split() == ["test_c.py", "test_b.py", *["test_a.py"] * 3,
                                                            "test_d.py", "test_d.py"]


def test_every_file_named_as_longest_is_a_test_file_of_the_suite():
    from tests.xdist_scheduling import LONGEST_FILES

    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
    assert [name for name in LONGEST_FILES if not (ROOT / name).is_file()] == []
