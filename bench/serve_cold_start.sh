#!/usr/bin/env bash
# A new serve process's first answer (bench/serve_cold_start.py) five ways, each in a fresh process:
# no persistent cache, without and with the warm-up; a cache at jax's default minimum compile time (1 s)
# and one keeping every program (as worker/celery.py sets it), two runs each (fill, then read); and the
# warm-up from the filled cache of every program. One JSON line per process.
#
#   bash bench/serve_cold_start.sh MODEL_DIR [TOKENS]
set -u
MODEL="$1"
TOKENS="${2:-256}"
CACHES="$(mktemp -d)"
trap 'rm -rf "$CACHES"' EXIT
run() { env JAX_PLATFORMS=cpu "$@" .venv/bin/python bench/serve_cold_start.py --model "$MODEL" --tokens "$TOKENS" \
            ${WARM:+--warm} 2>/dev/null; }
echo "no cache, no warm-up:"; run
echo "no cache, warm-up:"; WARM=1 run
echo "cache at jax's default (1 s), run 1 / 2:"
for _ in 1 2; do run JAX_COMPILATION_CACHE_DIR="$CACHES/default"; done
echo "cache keeping every program, run 1 / 2:"
for _ in 1 2; do run JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_COMPILATION_CACHE_DIR="$CACHES/every"; done
echo "cache keeping every program, warm-up, run 1 / 2:"
for _ in 1 2; do WARM=1 run JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_COMPILATION_CACHE_DIR="$CACHES/every"; done
