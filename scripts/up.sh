#!/usr/bin/env bash
# Starts Temper on the embedded default: local Redis, SQLite, ./var as data root.
# Migrates, creates the demo project and admin account, starts Redis, three Celery
# workers (default, train, serve) and the ASGI web server; Ctrl-C stops them all.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${TEMPER_PORT:-8000}"
export TEMPER_DATA="${TEMPER_DATA:-$PWD/var}"
mkdir -p "$TEMPER_DATA/logs"
bash scripts/ensure_redis.sh
PY=.venv/bin/python

pids=()
cleanup() {
    trap - INT TERM EXIT
    echo; echo "stopping Temper..."
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

if [ -z "${REDIS_URL:-}" ]; then
    REDIS_PORT="${TEMPER_REDIS_PORT:-6379}"
    if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
        redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
            --dir "$TEMPER_DATA" >"$TEMPER_DATA/logs/redis.log" 2>&1 &
        pids+=($!)
        for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
    fi
    export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
fi

$PY manage.py migrate --noinput
$PY manage.py collectstatic --noinput >/dev/null
$PY manage.py temper_setup

start_worker() {  # name queue concurrency
    .venv/bin/celery -A worker.celery worker -Q "$2" -n "$1@%h" --concurrency "$3" \
        --loglevel INFO >"$TEMPER_DATA/logs/worker-$1.log" 2>&1 &
    pids+=($!)
}
start_worker default default 2
start_worker train train 1
start_worker serve serve 1

echo "Temper is starting on http://127.0.0.1:$PORT  (logs in $TEMPER_DATA/logs; Ctrl-C stops everything)"
.venv/bin/uvicorn webapp.asgi:application --host 127.0.0.1 --port "$PORT" &
pids+=($!)
wait -n "${pids[@]}"
