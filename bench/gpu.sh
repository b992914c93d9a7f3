#!/usr/bin/env bash
# The H200 benchmark run in one go (about 8 minutes): sampler decode at batch 1 and 64, then the
# trainer's step for full bf16 SFT (batch 8 and 16 x 2048, cuDNN attention, remat; at batch 8 also
# through the sharded path, side by side), LoRA and QLoRA (batch 8 x 2048). Each configuration is
# its own python process (so its peak-memory figure is its own; full and sharded share one, for a
# side-by-side ratio) under its own `timeout` (so one hang cannot eat the budget). Every line goes
# to $OUT/gpu.log.
#
#   OUT=/some/dir bash bench/gpu.sh          # from the repository root; PYTHON defaults to python3
#
# pydantic/orjson are not on the GPU host: install the carried wheels to /tmp/site first, e.g.
#   pip install --no-deps --target /tmp/site .whl/*.whl
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

"$PY" -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" 2>&1 | tee -a "$LOG"
run 140 bench/gpu_sampler.py --preset llama3.2-1b
TRAIN=(bench/gpu_train.py --preset qwen3-0.6b --seq 2048 --steps 5 --attention cudnn)
# full and the sharded path (issue 6) side by side in one process: prints sharded/full tokens/s.
run 120 "${TRAIN[@]}" --batch 8 --configs full,sharded
run 90 "${TRAIN[@]}" --batch 16 --configs full
run 65 "${TRAIN[@]}" --batch 8 --configs lora
run 65 "${TRAIN[@]}" --batch 8 --configs qlora
echo "=== $(date -u +%H:%M:%S) done" | tee -a "$LOG"
