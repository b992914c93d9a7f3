"""The config side of the models package stays importable without jax."""
import subprocess
import sys


def test_models_config_imports_without_jax():
    code = ("import sys, jaxengine.models, jaxengine.models.config as c; c.ModelConfig; "
            "print(sorted(m for m in ('jax', 'flax', 'torch') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
