#!/usr/bin/env bash
# Creates the virtual environment and installs the project with its test extras.
# Safe to run repeatedly: pip only acts when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
stamp=.venv/.temper-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/pip install --quiet --upgrade pip
    .venv/bin/pip install --quiet -e ".[test]"
    touch "$stamp"
fi
