#!/usr/bin/env bash
# The wheels the H200 host lacks (pydantic and its parts, orjson; its image has jax, flax, optax, orbax,
# safetensors, pyyaml, sentencepiece, tokenizers, jinja2), for its Python 3.12 on x86-64, at this
# project's pins, into .whl/ (git-ignored). Carry .whl to the device and install them there first:
#
#   bash bench/gpu_wheels.sh                      # here, once
#   device run, carry [".whl"]:  pip install -q --no-deps --target /tmp/site .whl/*.whl && OUT=$OUT bash bench/gpu.sh 1
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { grep -o "\"$1==[^\"]*\"" pyproject.toml | tr -d '"'; }
rm -rf .whl && mkdir .whl
.venv/bin/pip download --quiet --dest .whl --only-binary :all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    "$(pin pydantic)" "$(pin orjson)"
ls .whl
