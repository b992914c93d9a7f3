"""A test file's compiled XLA programs are freed before the next file runs in its process (tests/conftest.py): a
process that kept them all ran out of memory maps and XLA's CPU compiler segfaulted (bench/RESULTS.md, "The
compiler's segfault")."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Ten programs of a module-level jitted function (one per static argument), as the engine's steps compile one per
# model; the test file keeps no reference to any of them.
COMPILES = ("import functools\nimport jax\nimport jax.numpy as jnp\n\n\n"
            "@functools.partial(jax.jit, static_argnames='scale')\ndef scaled(x, *, scale):\n    return x * scale\n\n\n"
            "def test_it_compiles():\n    for scale in range(10):\n        scaled(jnp.ones(3), scale=scale)\n"
            "    assert len(jax.devices()[0].client.live_executables()) >= 10\n")
# Runs after it, in the same process.
COUNTS = ("import jax\n\n\n"
          "def test_nothing_the_file_before_compiled_is_left():\n"
          "    assert len(jax.devices()[0].client.live_executables()) == 0\n")


def test_a_files_compiled_programs_are_freed_before_the_next_file(tmp_path):
    (tmp_path / "test_a.py").write_text(COMPILES)
    (tmp_path / "test_b.py").write_text(COUNTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    environment = {name: value for name, value in os.environ.items() if not name.startswith(("PYTEST_", "DJANGO_"))}
    environment["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider", "-p", "tests.conftest", "-q",
         "test_a.py", "test_b.py"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)
    assert "2 passed" in result.stdout, result.stdout
