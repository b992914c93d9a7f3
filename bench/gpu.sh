#!/usr/bin/env bash
# The H200 benchmark run, in two parts of under ten minutes each (the device tool's limit per command;
# its whole budget is 15 minutes a session, start-up included, so part 1 holds the figures wanted most):
#   part 1: sampler decode at batch 1 and 64 (issue 7); the trainer's step for full bf16 SFT at batch 8
#           x 2048, with the sharded path side by side (issues 8 and 6), and at batch 16 x 2048 (issue 8:
#           must fit);
#   part 2: the int8 serving copy through the serve worker's decoder, batch 1 and 64 streams (issue 4);
#           GRPO rollout and update tokens/s with G = 8 (issue 9); LoRA and QLoRA SFT (issue 8).
# Each configuration is its own python process (so its peak-memory figure is its own; full and sharded
# share one, for a side-by-side ratio) under its own `timeout` (so one hang cannot eat the budget). Every
# line goes to $OUT/gpu.log as it is printed, so a part cut short still returns what it measured.
#
#   OUT=/some/dir bash bench/gpu.sh 1       # from the repository root; PYTHON defaults to python3
#   OUT=/some/dir bash bench/gpu.sh 2
#
# pydantic/orjson are not on the GPU host: make their wheels here with bench/gpu_wheels.sh, carry .whl,
# and install them to /tmp/site there first (this script puts /tmp/site on PYTHONPATH):
#   pip install -q --no-deps --target /tmp/site .whl/*.whl && OUT=$OUT bash bench/gpu.sh 1
set -u
OUT="${OUT:-.}"
LOG="$OUT/gpu.log"
PY="${PYTHON:-python3}"
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
# Let one process use nearly all of the 141 GB (jax preallocates 75% by default).
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
mkdir -p "$OUT"

run() {  # run SECONDS SCRIPT ARGS...: one configuration, its output and exit status logged
    local limit=$1
    shift
    echo "=== $(date -u +%H:%M:%S) limit ${limit}s: $*" | tee -a "$LOG"
    timeout -k 10 "$limit" "$PY" "$@" 2>&1 | tee -a "$LOG"
    echo "=== exit ${PIPESTATUS[0]} (124: timed out)" | tee -a "$LOG"
}

PART="${1:-1}"
"$PY" -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" 2>&1 | tee -a "$LOG"
TRAIN=(bench/gpu_train.py --preset qwen3-0.6b --seq 2048 --steps 5 --attention cudnn)
case "$PART" in
1)
    run 120 bench/gpu_sampler.py --preset llama3.2-1b
    # full and the sharded path (issue 6) side by side in one process: prints sharded/full tokens/s.
    run 120 "${TRAIN[@]}" --batch 8 --configs full,sharded
    run 90 "${TRAIN[@]}" --batch 16 --configs full
    ;;
2)
    run 120 bench/gpu_serve.py --preset llama3.2-1b --scheme int8 --streams 64 --tokens 128
    run 150 bench/gpu_grpo.py --preset llama3.2-1b --prompts 8 --tokens 128 --steps 5
    run 60 "${TRAIN[@]}" --batch 8 --configs lora
    run 60 "${TRAIN[@]}" --batch 8 --configs qlora
    ;;
*)
    echo "bench/gpu.sh: part $PART is not 1 or 2" | tee -a "$LOG"
    exit 2
    ;;
esac
echo "=== $(date -u +%H:%M:%S) part $PART done" | tee -a "$LOG"
