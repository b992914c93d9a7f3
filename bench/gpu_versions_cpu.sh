#!/usr/bin/env bash
# The engine's tests on the GPU host's versions (jax 0.11.2, flax 0.12.10, Python 3.12), here on the CPU:
# a device session is 15 minutes, so an API that changed between jax 0.10.2 (pinned here) and 0.11.2 must
# not be found there. Tests that build their tiny models with torch/transformers are left out (PyPI's
# torch for Python 3.12 is a CUDA build of several GB); everything else of tests/jaxengine runs.
#
#   bash bench/gpu_versions_cpu.sh            # VENV defaults to /tmp/venv-gpu-versions, PY312 to python3.12
set -eu
VENV="${VENV:-/tmp/venv-gpu-versions}"
PY312="${PY312:-$(command -v python3.12 || echo /root/.pyenv/versions/3.12.1/bin/python)}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY312" -m venv "$VENV"
    "$VENV/bin/pip" install -q "jax==0.11.2" "flax==0.12.10" orbax-checkpoint "pydantic==2.14.4" "pyyaml==6.0.4" \
        "sentencepiece==0.2.3" "tokenizers==0.23.3" "safetensors==0.8.0" "tqdm==4.70.1" "jinja2==3.1.6" \
        "orjson==3.13.0" "pytest==9.2.0"
    "$VENV/bin/pip" install -q --no-deps -e .
fi
"$VENV/bin/python" -c "import jax, flax, optax, orbax.checkpoint; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__)"
# -o addopts="": the project's addopts use pytest-django's and xdist's options, not installed here.
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q -o addopts="" -m "not slow and not gpu" tests/jaxengine \
    --continue-on-collection-errors "$@"
