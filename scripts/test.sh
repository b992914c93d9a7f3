#!/usr/bin/env bash
# Runs the default test suite, in TEMPER_TEST_WORKERS processes (default 2; 0 runs it in this one).
# A whole test file goes to one process (--dist loadfile), so its module fixtures (a live server, a
# built model) are made once. pytest's exit code 5 (no tests collected) counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
workers="${TEMPER_TEST_WORKERS:-2}"
# A key of the suite's own: no test process makes one in ./var (webapp/secret.py; tests/webapp/test_secret_key.py
# checks the file).
export TEMPER_SECRET_KEY="${TEMPER_SECRET_KEY:-temper-test-suite-signing-key-not-for-any-deployment}"
parallel=()
if [ "$workers" != "0" ]; then parallel=(-n "$workers" --dist loadfile); fi
.venv/bin/python -m pytest "${parallel[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "no tests were collected: failing"; exit 1; fi
exit "$rc"
