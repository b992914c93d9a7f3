"""QLoRA storage: NF4/int8 codes by hand, error bounds, memory ratio, and the quantized model's forward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxengine.models import build_model, preset
from jaxengine.peft import quant


def test_nf4_codes_and_packing_by_hand():
    # One group of 4 weights in one output column; absmax 2 -> normalized [1, -1, 0, 0.5626...].
    kernel = jnp.array([[2.0], [-2.0], [0.0], [2 * 0.5626170039176941]])
    packed, scales = quant.quantize(kernel, bits=4, group_size=4)
    assert scales.tolist() == [[2.0]]
    # codes 15, 0, 7, 13 -> bytes (15 | 0 << 4) and (7 | 13 << 4)
    assert packed.dtype == jnp.uint8 and packed[:, 0].tolist() == [15, 7 | 13 << 4]
    np.testing.assert_allclose(quant.dequantize(packed, scales, bits=4, group_size=4, dtype=jnp.float32), kernel,
                               atol=1e-7)


def test_int8_codes_by_hand():
    kernel = jnp.array([[1.0, 0.0], [-0.5, 0.25]])
    codes, scales = quant.quantize(kernel, bits=8, group_size=2)
    assert scales.tolist() == [[1.0, 0.25]]
    assert codes.tolist() == [[127, 0], [-64, 127]]  # round(-63.5) = -64 (half to even)


@pytest.mark.parametrize("bits,bound", [(4, quant.NF4_MAX_HALF_GAP), (8, 1 / 254)])
def test_dequantization_error_is_within_the_bound_of_each_group(bits, bound):
    kernel = jax.random.normal(jax.random.key(0), (256, 48)) * jnp.linspace(0.01, 3.0, 48)
    codes, scales = quant.quantize(kernel, bits=bits, group_size=64)
    error = jnp.abs(quant.dequantize(codes, scales, bits=bits, group_size=64, dtype=jnp.float32) - kernel)
    absmax_per_weight = jnp.repeat(jnp.max(jnp.abs(kernel.reshape(4, 64, 48)), axis=1), 64, axis=0)
    assert bool(jnp.all(error <= bound * absmax_per_weight + 1e-6))
    assert float(jnp.max(error / absmax_per_weight)) > bound / 4  # the bound is not vacuous


def test_quantized_model_stores_under_0_3x_bfloat16_and_computes_with_dequantized_kernels():
    model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))
    reference = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))
    report = quant.quantize_model(model, bits=4, group_size=64)
    assert report["ratio_to_bfloat16"] <= 0.3
    assert report["ratio_to_bfloat16"] == pytest.approx((0.5 + 4 / 64) / 2)
    reference_modules = dict(nnx.iter_modules(reference))
    for path, mine in nnx.iter_modules(model):
        if getattr(mine, "quantized", None) is not None:
            reference_modules[path].kernel[...] = mine.quantized.dequantize(jnp.float32)
    ids = jnp.array([[5, 9, 33, 2, 7]])
    positions = jnp.arange(5)[None]
    np.testing.assert_allclose(model(ids, positions)[0], reference(ids, positions)[0], atol=1e-5)
    assert not any("kernel" in str(path[-1]) and "q_proj" in str(path)
                   for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param)))
    quant.dequantize_model(model)
    np.testing.assert_allclose(model(ids, positions)[0], reference(ids, positions)[0], atol=1e-5)
