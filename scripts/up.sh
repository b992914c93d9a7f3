#!/usr/bin/env bash
# Starts Temper on the embedded defaults: local Redis, SQLite, ./var as data root.
# Migrates, creates the admin account and the demo project, starts Redis (unless
# REDIS_URL is set or one already answers on TEMPER_REDIS_PORT), three Celery
# workers (default, train, serve) and the ASGI web server. Ctrl-C (or SIGTERM)
# stops every process it started; when any of them dies, the others are stopped too.
# Running it again is safe: every setup step only creates what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${TEMPER_PORT:-8000}"
HOST="${TEMPER_HOST:-127.0.0.1}"
export TEMPER_DATA="${TEMPER_DATA:-$PWD/var}"
PY=.venv/bin/python

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# The address to open for a listening address: every interface (0.0.0.0, ::) is none to send a browser to
# (its Host header is no name TEMPER_ALLOWED_HOSTS admits: a 400 page), and an IPv6 address goes in brackets.
url_host() {
    case "$1" in
        0.0.0.0|::) echo 127.0.0.1 ;;
        *:*) echo "[$1]" ;;
        *) echo "$1" ;;
    esac
}
# The scheme uvicorn serves: HTTPS once it has a certificate or key to serve it with (it reads UVICORN_SSL_CERTFILE
# and UVICORN_SSL_KEYFILE itself). TEMPER_HTTPS alone says nothing of it: behind an HTTPS proxy uvicorn serves HTTP.
url_scheme() {
    if [ -n "${UVICORN_SSL_CERTFILE:-}${UVICORN_SSL_KEYFILE:-}" ]; then echo https; else echo http; fi
}

if port_in_use "$PORT"; then
    echo "port $PORT is already in use (is Temper already running?); stop that process or set TEMPER_PORT" >&2
    exit 1
fi
mkdir -p "$TEMPER_DATA/logs"
bash scripts/ensure_redis.sh

pids=()
cleanup() {
    trap - INT TERM EXIT
    echo; echo "stopping Temper..."
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    # Celery finishes its running task on TERM (warm shutdown); give everything
    # 20 s, then kill what is left so that Ctrl-C always returns the terminal.
    for _ in $(seq 200); do
        alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" -eq 0 ] && break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    echo "Temper stopped."
}
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
trap cleanup EXIT

if [ -z "${REDIS_URL:-}" ]; then
    REDIS_PORT="${TEMPER_REDIS_PORT:-6379}"
    if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
        redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
            --dir "$TEMPER_DATA" >"$TEMPER_DATA/logs/redis.log" 2>&1 &
        pids+=($!)
        for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
        if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
            echo "Redis did not start on port $REDIS_PORT; see $TEMPER_DATA/logs/redis.log (set TEMPER_REDIS_PORT to use another port)" >&2
            exit 1
        fi
    fi
    export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
fi

$PY manage.py migrate --noinput
$PY manage.py collectstatic --noinput >/dev/null
$PY manage.py temper_setup

start_worker() {  # name queue concurrency [pool [celery options...]]
    .venv/bin/celery -A worker.celery worker -Q "$2" -n "$1@%h" --concurrency "$3" --pool "${4:-prefork}" "${@:5}" \
        --loglevel INFO >"$TEMPER_DATA/logs/worker-$1.log" 2>&1 &
    pids+=($!)
}
start_worker default default 2
# A fresh process per job: a process that took part in a multi-host job (pool default) stays in its
# jax.distributed group, and every later run in it failed ("the spec asks for 1 processes, this job has 2").
start_worker train train 1 prefork --max-tasks-per-child 1
# threads: concurrent chats share one batching server per model. A thread only waits on its answer, so
# 64 of them cost little, and match the server's 64 rows (with 16, the 17th chat waited in the queue
# for a whole answer to end before its first token).
start_worker serve serve 64 threads

echo "Temper is starting on $(url_scheme)://$(url_host "$HOST"):$PORT  (logs in $TEMPER_DATA/logs; Ctrl-C stops everything)"
# --no-proxy-headers: uvicorn would believe X-Forwarded-For from any process on this host; Temper reads it itself,
# from TEMPER_TRUSTED_PROXIES only (webapp/core/addresses.py).
.venv/bin/uvicorn webapp.asgi:application --host "$HOST" --port "$PORT" --no-proxy-headers &
pids+=($!)
set +e
# Polled, not 'wait -n': Ctrl-C reaches every process of the group, and bash drops a SIGINT that
# arrives while it waits for a background child that then exits normally (Redis exits 0 on SIGINT),
# so its INT trap could be skipped (exit 1, not 130). A foreground sleep dies of the SIGINT, and bash
# always runs the trap for that.
while true; do
    for pid in "${pids[@]}"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid"
            echo "a Temper process exited (status $?); see $TEMPER_DATA/logs" >&2
            exit 1
        fi
    done
    sleep 0.5
done
