"""Serving's fused projections (``fuse_projections``): q/k/v and gate/up as one matmul each give the
logits of the separate projections, prefill and cached decode alike, and leave the original model as it was."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxengine.models import build_model, preset
from jaxengine.models.transformer import fuse_projections, inference_layout, untied_output_projection
from jaxengine.peft.lora import apply_lora
from jaxengine.sampler import decode, prefill


def tiny(name):
    model = build_model(preset(name), rngs=nnx.Rngs(0))
    # Random non-zero biases (qkv_bias presets start at zero, which would hide a misplaced bias).
    for path, value in nnx.iter_graph(model):
        if isinstance(value, nnx.Param) and path[-1] == "bias":
            value[...] = jax.random.normal(jax.random.key(len(path)), value.shape) * 0.5
    return model


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_fused_projections_give_the_logits_of_the_separate_ones(name):
    model = tiny(name)
    fused = fuse_projections(model)
    attention, mlp = fused.layers[0].self_attn, fused.layers[0].mlp
    assert attention.q_proj is None and attention.qkv_proj is not None and mlp.gate_up_proj is not None
    # The original keeps its separate projections (the copy shares its other arrays).
    assert model.layers[0].self_attn.qkv_proj is None and model.layers[0].self_attn.q_proj is not None
    assert fused.embed_tokens.embedding[...] is model.embed_tokens.embedding[...]

    input_ids_bt = jax.random.randint(jax.random.key(1), (2, 7), 0, model.config.vocab_size)
    pad_counts_b = jnp.array([0, 3], jnp.int32)
    outputs = []
    for candidate in (model, fused):
        logits_bv, cache = prefill(candidate, input_ids_bt, pad_counts_b, total_length=16)
        step_logits_bv, _ = decode(candidate, jnp.array([5, 9], jnp.int32), 7 - pad_counts_b, pad_counts_b, cache)
        outputs.append((np.asarray(logits_bv), np.asarray(step_logits_bv)))
    for separate, joined in zip(*outputs):
        np.testing.assert_allclose(joined, separate, rtol=1e-5, atol=1e-5)


def test_a_projection_with_a_lora_adapter_stays_separate_and_fusing_twice_changes_nothing():
    model = tiny("tiny-llama")
    apply_lora(model, targets=["q_proj", "up_proj"], rank=2, alpha=4.0)
    fused = fuse_projections(model)
    attention, mlp = fused.layers[0].self_attn, fused.layers[0].mlp
    assert attention.qkv_proj is None and attention.q_proj.lora is not None  # an adapter adds to q alone
    assert mlp.gate_up_proj is None and mlp.up_proj.lora is not None
    again = fuse_projections(fuse_projections(build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))))
    assert again.layers[0].self_attn.qkv_proj.kernel.shape == (64, 4 * 16 + 2 * 2 * 16)  # q, then k and v


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-gemma3"])  # tied embeddings; Gemma's soft-capped logits
def test_untied_output_projection_gives_the_tied_logits_and_keeps_the_table(name):
    model = tiny(name)
    assert model.lm_head is None
    untied = untied_output_projection(model)
    assert model.lm_head is None  # the original is left as it was
    table_vd = model.embed_tokens.embedding[...]
    assert untied.embed_tokens.embedding[...] is table_vd  # still the lookup table, not a copy
    np.testing.assert_array_equal(np.asarray(untied.lm_head.kernel[...]), np.asarray(table_vd).T)

    input_ids_bt = jax.random.randint(jax.random.key(2), (2, 5), 0, model.config.vocab_size)
    positions_bt = jnp.broadcast_to(jnp.arange(5), (2, 5))
    np.testing.assert_allclose(np.asarray(untied(input_ids_bt, positions_bt)[0]),
                               np.asarray(model(input_ids_bt, positions_bt)[0]), rtol=1e-5, atol=1e-5)
    again = untied_output_projection(untied)
    assert again.lm_head.kernel[...] is untied.lm_head.kernel[...]  # an untied model is not copied again


def test_inference_layout_on_cpu_fuses_and_unties():
    model = tiny("tiny-qwen3")
    laid_out = inference_layout(model)
    assert laid_out.layers[0].self_attn.qkv_proj is not None and laid_out.layers[0].mlp.gate_up_proj is not None
    assert laid_out.lm_head is not None and model.lm_head is None
    assert model.layers[0].self_attn.qkv_proj is None
