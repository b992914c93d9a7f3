#!/usr/bin/env bash
# Runs the default test suite. pytest's exit code 5 (no tests collected) counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "no tests were collected: failing"; exit 1; fi
exit "$rc"
