"""Worker processes keep XLA's compiled programs on disk, so a restarted serve worker does not pay
every cache shape's compile again on its first chats."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A worker process as Celery starts it (the app module, then jax through the task modules), compiling
# one program that takes milliseconds; prints the cache directory jax was given.
WORKER_COMPILE = (
    "import worker.celery, jax, jax.numpy as jnp;"
    "jax.jit(lambda x: jnp.tanh(x) * 3)(jnp.ones(7)).block_until_ready();"
    "print(jax.config.jax_compilation_cache_dir)"
)


def run_worker_process(tmp_path: Path, **env: str) -> str:
    environ = {key: value for key, value in os.environ.items() if key != "JAX_COMPILATION_CACHE_DIR"}
    environ.update(DJANGO_SETTINGS_MODULE="webapp.settings", TEMPER_DATA=str(tmp_path / "data"), **env)
    result = subprocess.run([sys.executable, "-c", WORKER_COMPILE], cwd=ROOT, env=environ, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_it_writes_compiled_programs_under_the_data_root(tmp_path):
    assert run_worker_process(tmp_path) == str(tmp_path / "data" / "jax-cache")
    # Even a program that compiled in milliseconds (jax's default keeps only those over a second).
    assert any((tmp_path / "data" / "jax-cache").iterdir())


def test_an_empty_setting_turns_it_off(tmp_path):
    assert run_worker_process(tmp_path, TEMPER_JAX_CACHE="") == "None"
    assert not (tmp_path / "data" / "jax-cache").exists()
