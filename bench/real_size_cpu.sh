#!/usr/bin/env bash
# A real-size model through the engine on CPU, each step in a fresh process with its wall time and peak
# RSS: a random-initialised preset (default qwen2.5-0.5b, float32) with the demo tokenizer, then inspect,
# generate, 6 LoRA and 6 QLoRA SFT steps and 3 LoRA GRPO (G = 4), DPO, reward and PPO steps on the demo
# data, the int8 serving copy, and decoding 32 tokens from the export and from the copy (the serve worker's
# BatchDecoder). Not a speed target: it shows what a CPU-only team meets with a model of the size they
# fine-tune, and catches what tiny test models cannot (padded vocabularies, memory held twice).
#
#   bash bench/real_size_cpu.sh DEMO_DIR [PRESET]    # DEMO_DIR from `jaxengine demo-base --out DEMO_DIR`
set -euo pipefail
DEMO="$(cd "$1" && pwd)"
PRESET="${2:-qwen2.5-0.5b}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export JAX_PLATFORMS=cpu
step() { local name="$1"; shift; /usr/bin/time -f "$name: %e s wall, peak RSS %M KB" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" \
           || { cat "$WORK/$name.err"; exit 1; }; tail -1 "$WORK/$name.err"; }

step make .venv/bin/python - "$PRESET" "$WORK/model" "$DEMO/model" <<'PY'
import sys
from flax import nnx
from jaxengine.checkpoint.hf import save_hf_model
from jaxengine.models import build_model, preset
from jaxengine.tokenizer import load_tokenizer
name, out, demo = sys.argv[1:]
tokenizer = load_tokenizer(demo)
config = preset(name).replace(bos_token_id=tokenizer.bos_id, eos_token_ids=tuple(tokenizer.eos_ids),
                              pad_token_id=tokenizer.pad_id)
save_hf_model(build_model(config, rngs=nnx.Rngs(0)), config, out, source_dir=demo)
PY
step inspect .venv/bin/jaxengine inspect --model "$WORK/model"
sed -n 1,6p "$WORK/inspect.out"
step generate .venv/bin/jaxengine generate --model "$WORK/model" --prompt "What is 8 + 2 + 4?" --chat \
    --max-new-tokens 16 --temperature 0 --json
for method in lora qlora; do
  cat >"$WORK/$method.yaml" <<YAML
task: sft
model: $WORK/model
output_dir: $WORK/run-$method
data: {train: $DEMO/data/sft.jsonl, eval: $DEMO/data/eval.jsonl, max_seq_len: 128}
peft: {method: $method, rank: 8, alpha: 16}
optim: {learning_rate: 1.0e-4}
train: {max_steps: 6, batch_size: 4, eval_every: 6, save_every: 3, eval_samples: 4, sample_max_new_tokens: 8}
YAML
  step "train-$method" .venv/bin/jaxengine train "$WORK/$method.yaml"
  .venv/bin/python -c "import json,sys; s=json.load(open(sys.argv[1])); m=s['final_metrics']; print(f\"  tokens/s at step 6: {m['tokens_per_second']:.1f}, quantization: {s.get('quantization')}\")" "$WORK/run-$method/summary.json"
done
cat >"$WORK/grpo.yaml" <<YAML
task: grpo
model: $WORK/model
output_dir: $WORK/run-grpo
data: {train: $DEMO/data/prompts.jsonl, eval: $DEMO/data/eval.jsonl, max_seq_len: 64}
peft: {method: lora, rank: 8, alpha: 16}
optim: {learning_rate: 1.0e-5}
train: {max_steps: 3, batch_size: 8, eval_every: 3, save_every: 3, eval_samples: 2}
grpo:
  num_generations: 4
  max_new_tokens: 16
  beta: 0.04
  rewards: [{name: exact_match, args: {answer_column: answer}}]
YAML
step train-grpo .venv/bin/jaxengine train "$WORK/grpo.yaml"
.venv/bin/python -c "import json,sys; m=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print('  step 3: ' + ', '.join(f'{k} {m[k]:.1f} s' for k in ('time/rollout', 'time/logprobs', 'time/update')))" "$WORK/run-grpo/metrics.jsonl"
for task in dpo reward; do
  cat >"$WORK/$task.yaml" <<YAML
task: $task
model: $WORK/model
output_dir: $WORK/run-$task
data: {train: $DEMO/data/preference.jsonl, max_seq_len: 64}
peft: {method: lora, rank: 8, alpha: 16}
optim: {learning_rate: 1.0e-5}
train: {max_steps: 3, batch_size: 4, save_every: 3}
YAML
  step "train-$task" .venv/bin/jaxengine train "$WORK/$task.yaml"
done
cat >"$WORK/ppo.yaml" <<YAML
task: ppo
model: $WORK/model
output_dir: $WORK/run-ppo
data: {train: $DEMO/data/prompts.jsonl, eval: $DEMO/data/eval.jsonl, max_seq_len: 64}
peft: {method: lora, rank: 8, alpha: 16}
optim: {learning_rate: 1.0e-5}
train: {max_steps: 3, batch_size: 8, eval_every: 3, save_every: 3, eval_samples: 2}
ppo: {max_new_tokens: 16, rewards: [{name: exact_match, args: {answer_column: answer}}]}
YAML
step train-ppo .venv/bin/jaxengine train "$WORK/ppo.yaml"
step export-int8 .venv/bin/jaxengine export --run "$WORK/run-lora" --quantize int8 --eval-limit 16
for source in export export/quantized; do
  step "decode-${source//\//-}" .venv/bin/python - "$WORK/run-lora/$source" <<'PY'
import sys, time
from jaxengine.sampler import SamplingParams
from jaxengine.serving import BatchDecoder, ServeRequest, load_serving_model
loaded = load_serving_model(sys.argv[1])
decoder = BatchDecoder(loaded.model, loaded.tokenizer)
request = ServeRequest(prompt_ids=tuple(loaded.tokenizer.encode("What is 8 + 2 + 4?")),
                       params=SamplingParams(max_new_tokens=32, temperature=0.7, seed=0), ignore_eos=True)
decoder.run([request])  # compiles
started = time.perf_counter()
decoder.run([request])
print(f"  {sys.argv[1].split('run-lora/')[1]}: {(time.perf_counter() - started) / 32 * 1e3:.0f} ms a token, 1 stream, "
      f"weights {loaded.nbytes / 2**20:.0f} MiB", file=sys.stderr)
PY
  tail -2 "$WORK/decode-${source//\//-}.err" | head -1
done
