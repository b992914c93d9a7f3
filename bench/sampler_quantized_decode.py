"""Decode tokens/s of the Sampler on an int8 serving copy of the demo model (greedy, 64 new tokens, batch 1 and 8,
best of 5 after a warm-up; decode = batch x 64 / (time(65 tokens) - time(1 token))). Run it in two trees to compare
two engines (argument: a label printed with the figures):

    PYTHONPATH=$PWD .venv/bin/python bench/sampler_quantized_decode.py after
"""
import sys, time
from pathlib import Path
import jax.numpy as jnp
from jaxengine.quantize import quantize_model_dir, load_quantized
from jaxengine.sampler import Sampler, SamplingParams
from jaxengine.tokenizer import load_tokenizer
q = Path("/tmp/q8demo")
if not (q / "quantization.json").exists():
    quantize_model_dir("bench/out/demo/model", q, scheme_name="int8")
model, config, _ = load_quantized(q, compute_dtype=jnp.float32)
tok = load_tokenizer(q)
s = Sampler(model, tok)
out = {}
for batch in (1, 8):
    prompts = ["Tell me a story about a cat"] * batch
    for n in (1, 65):
        p = SamplingParams(max_new_tokens=n, temperature=0.0)
        s.generate(prompts, p)
    best = {}
    for n in (1, 65):
        p = SamplingParams(max_new_tokens=n, temperature=0.0)
        ts = []
        for _ in range(5):
            t = time.perf_counter(); s.generate(prompts, p); ts.append(time.perf_counter() - t)
        best[n] = min(ts)
    out[batch] = round(batch * 64 / (best[65] - best[1]), 1)
print(sys.argv[1], "decode tok/s", out)
