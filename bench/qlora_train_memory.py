"""XLA's scratch memory (``temp_size_in_bytes``) of a QLoRA forward pass, and of a forward + backward for the LoRA
weights, against LoRA on the same unquantized model, with and without remat: tiny-llama's shape widened to
``width`` (intermediate 2 x width), ``layers`` layers, NF4 group 32, LoRA rank 4 on every projection, a batch of
8 x 64 tokens. Compiles only (nothing runs). Run it in two trees to compare two engines:

    PYTHONPATH=$PWD .venv/bin/python bench/qlora_train_memory.py 12 256
"""
import json
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from jaxengine.models import build_model, preset
from jaxengine.peft import lora, quant

layers, width = int(sys.argv[1]), int(sys.argv[2])
results, dequantized = {}, 0
for quantized in (False, True):
    for remat in (False, True):
        config = preset("tiny-llama").replace(num_layers=layers, hidden_size=width, intermediate_size=2 * width,
                                              layer_types=("full_attention",) * layers)
        model = build_model(config, rngs=nnx.Rngs(0))
        if quantized:
            quant.quantize_model(model, bits=4, group_size=32)
            dequantized = sum(4 * module.codes[...].size * 2 for _, module in nnx.iter_modules(model)
                              if isinstance(module, quant.QuantizedKernel))
        lora.apply_lora(model, targets=lora.PROJECTIONS, rank=4, alpha=8, seed=0)
        model.remat = remat
        graphdef, adapters, rest = nnx.split(model, lora.LoraParam, ...)
        ids = jnp.zeros((8, 64), jnp.int32)
        positions = jnp.broadcast_to(jnp.arange(64), (8, 64))

        def loss(adapters, rest, ids, positions):
            logits, _ = nnx.merge(graphdef, adapters, rest)(ids, positions)
            return logits.mean()

        def scratch(function):
            compiled = jax.jit(function).lower(adapters, rest, ids, positions).compile()
            return compiled.memory_analysis().temp_size_in_bytes

        name = ("qlora" if quantized else "lora") + ("+remat" if remat else "")
        results[name] = {"forward": scratch(loss), "grad": scratch(jax.grad(loss))}
print(json.dumps({"layers": layers, "width": width, "dequantized_bytes": dequantized, **results}))
