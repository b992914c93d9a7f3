#!/usr/bin/env bash
# Issue 9's RL proof for one demo build, end to end (bench/RESULTS.md, "RL proof from the teacher's
# demonstrations"):
#
#     bench/demo_rl_proof.sh SEED [OUT]      # OUT defaults to bench/out/proof-SEED
#
# builds the demo model with `jaxengine demo-base --seed SEED` (skipped when OUT/demo/model exists),
# runs the teacher SFT (bench/demo_sft_teacher.yaml), then GRPO (bench/demo_grpo.yaml) and PPO
# (bench/demo_ppo.yaml) from its export, each under /usr/bin/time, with the shipped specs' paths moved
# from bench/out/ to OUT/; then scores the three exports with `jaxengine eval --by task` on the 500
# held-out prompts. OUT/summary.txt collects the figures (eval JSON and each step's wall/CPU time).
set -euo pipefail
seed=${1:?usage: bench/demo_rl_proof.sh SEED [OUT]}
out=${2:-bench/out/proof-$seed}
here=$(cd "$(dirname "$0")/.." && pwd)
engine="$here/.venv/bin/jaxengine"
mkdir -p "$out/specs"
summary="$out/summary.txt"
: > "$summary"

timed() {  # timed NAME COMMAND...: run it, log to OUT/NAME.log, add its wall and CPU time to the summary
    local name=$1; shift
    /usr/bin/time -f "$name: %e s wall, %U s user + %S s sys" -a -o "$summary" "$@" > "$out/$name.log" 2>&1
}

if [[ ! -f "$out/demo/model/model.safetensors" ]]; then
    timed demo-base "$engine" demo-base --out "$out/demo" --seed "$seed" --no-progress
fi
for name in demo_sft_teacher demo_grpo demo_ppo; do
    sed "s#bench/out/#$out/#g" "$here/bench/$name.yaml" > "$out/specs/$name.yaml"
    timed "$name" "$engine" train "$out/specs/$name.yaml" --no-progress
done
for run in demo_sft_teacher demo_grpo demo_ppo; do
    echo "$run: $("$engine" eval --model "$out/$run/export" --data "$out/demo/data/eval.jsonl" \
        --metric exact_match --max-new-tokens 16 --by task)" >> "$summary"
done
cat "$summary"
