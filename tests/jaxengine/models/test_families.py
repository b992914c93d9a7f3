"""Every family against Hugging Face transformers on a tiny random model, in float32.

Per kind: full-forward logits match (<= 1e-4), greedy decoding of 32 tokens with our KV cache
matches ``generate`` token for token, and the cached-decode logits match a full forward pass
over the same tokens (<= 1e-5).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxengine.checkpoint.hf import load_hf_model
from tests import factories

NEW_TOKENS = 32


def jitted_forward(model):
    """model(...) as one jitted function of (ids, positions, mask, cache)."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, input_ids_bt, positions_bt, attention_mask_bts, cache):
        return nnx.merge(graphdef, state)(input_ids_bt, positions_bt, attention_mask_bts=attention_mask_bts,
                                          cache=cache)

    return lambda ids, positions, mask=None, cache=None: forward(state, ids, positions, mask, cache)


def positions_for(batch: int, start: int, length: int) -> jnp.ndarray:
    return jnp.broadcast_to(jnp.arange(start, start + length, dtype=jnp.int32), (batch, length))


def greedy_with_cache(model, prompt_bt: np.ndarray, new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(generated ids [B, new_tokens], logits [B, T + new_tokens - 1, V] seen while decoding)."""
    forward = jitted_forward(model)
    batch, prompt_length = prompt_bt.shape
    cache = model.init_cache(batch_size=batch, max_length=prompt_length + new_tokens)
    logits_btv, cache = forward(jnp.asarray(prompt_bt, jnp.int32), positions_for(batch, 0, prompt_length),
                                cache=cache)
    all_logits = [logits_btv]
    token_b = jnp.argmax(logits_btv[:, -1], axis=-1).astype(jnp.int32)
    generated = [token_b]
    for step in range(new_tokens - 1):
        logits_btv, cache = forward(token_b[:, None], positions_for(batch, prompt_length + step, 1), cache=cache)
        all_logits.append(logits_btv)
        token_b = jnp.argmax(logits_btv[:, -1], axis=-1).astype(jnp.int32)
        generated.append(token_b)
    assert int(cache.index) == prompt_length + new_tokens - 1
    return np.stack([np.asarray(t) for t in generated], axis=1), np.asarray(jnp.concatenate(all_logits, axis=1))


@pytest.fixture(scope="module")
def prompt_bt() -> np.ndarray:
    return np.random.RandomState(0).randint(3, 256, size=(2, 9))


@pytest.mark.parametrize("kind", factories.TINY_KINDS)
def test_family_matches_transformers(kind, tiny_hf_model_dir, prompt_bt):
    model_dir = tiny_hf_model_dir(kind)
    model, config = load_hf_model(model_dir)
    reference = factories.load_hf_reference(model_dir)
    reference.generation_config.eos_token_id = None  # always generate the full 32 tokens

    with torch.no_grad():
        expected = reference.generate(torch.tensor(prompt_bt), max_new_tokens=NEW_TOKENS, do_sample=False,
                                      pad_token_id=0)[:, prompt_bt.shape[1]:].numpy()
    generated, cached_logits = greedy_with_cache(model, prompt_bt, NEW_TOKENS)
    np.testing.assert_array_equal(generated, expected)

    # Full forward over prompt + generated tokens (the last one is never fed back).
    sequence_bt = np.concatenate([prompt_bt, generated[:, :-1]], axis=1)
    with torch.no_grad():
        reference_logits = reference(torch.tensor(sequence_bt)).logits.numpy()
    logits_btv, no_cache = jitted_forward(model)(jnp.asarray(sequence_bt, jnp.int32),
                                                 positions_for(*sequence_bt.shape[:1], 0, sequence_bt.shape[1]))
    assert no_cache is None and logits_btv.dtype == jnp.float32
    assert np.abs(np.asarray(logits_btv) - reference_logits).max() <= 1e-4
    assert np.abs(cached_logits - np.asarray(logits_btv)).max() <= 1e-5
    if config.has_sliding_layers:  # the window must have mattered for this test to prove anything
        assert sequence_bt.shape[1] > 2 * config.sliding_window


def test_left_padded_row_matches_unpadded_row(tiny_hf_model_dir):
    """A caller-built mask and shifted positions make a left-padded row compute what it would alone.

    Gemma 3 is the demanding case: its sliding window is measured in positions, not slots.
    """
    model, _ = load_hf_model(tiny_hf_model_dir("gemma3"))
    forward = jitted_forward(model)
    tokens = np.random.RandomState(1).randint(3, 256, size=(10,))
    alone_logits, _ = forward(jnp.asarray(tokens[None], jnp.int32), positions_for(1, 0, 10))

    pad = 3
    ids_bt = jnp.asarray(np.concatenate([np.zeros(pad, int), tokens])[None], jnp.int32)  # [1, 13]
    positions_bt = jnp.asarray(np.concatenate([np.zeros(pad, int), np.arange(10)])[None], jnp.int32)
    valid_s = np.arange(pad + 10) >= pad
    mask_bts = jnp.asarray((np.tril(np.ones((13, 13), bool)) & valid_s[None, :])[None])  # [1, T, S]
    padded_logits, _ = forward(ids_bt, positions_bt, mask_bts)
    assert np.abs(np.asarray(padded_logits[:, pad:]) - np.asarray(alone_logits)).max() <= 1e-5

    # The same through the cache: prefill the padded prompt, then decode one token.
    cache = model.init_cache(batch_size=1, max_length=16)
    prefill_mask_bts = jnp.pad(mask_bts, ((0, 0), (0, 0), (0, 3)))  # [1, 13, 16]: no unwritten slot is seen
    _, cache = forward(ids_bt, positions_bt, prefill_mask_bts, cache)
    next_token = jnp.asarray([[7]], jnp.int32)
    decode_mask_bts = jnp.asarray(((np.arange(16) >= pad) & (np.arange(16) <= pad + 10))[None, None])  # [1, 1, S]
    step_logits, _ = forward(next_token, jnp.asarray([[10]], jnp.int32), decode_mask_bts, cache)
    full_logits, _ = forward(jnp.asarray(np.append(tokens, 7)[None], jnp.int32), positions_for(1, 0, 11))
    assert np.abs(np.asarray(step_logits[:, 0]) - np.asarray(full_logits[:, -1])).max() <= 1e-5


def test_bfloat16_compute_stays_close_to_float32(tiny_hf_model_dir):
    """bfloat16 parameters and compute run end to end with float32 logits near the float32 model's."""
    model_dir = tiny_hf_model_dir("qwen3")
    model32, _ = load_hf_model(model_dir)
    model16, _ = load_hf_model(model_dir, param_dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)
    assert model16.layers[0].self_attn.q_proj.kernel[...].dtype == jnp.bfloat16
    ids_bt = jnp.asarray(np.random.RandomState(2).randint(3, 256, size=(2, 8)), jnp.int32)
    logits32, _ = model32(ids_bt, positions_for(2, 0, 8))
    logits16, _ = model16(ids_bt, positions_for(2, 0, 8))
    assert logits16.dtype == jnp.float32
    # bfloat16 has 8 bits of mantissa: ~1% relative error per op on logits of magnitude ~3.
    assert 0 < np.abs(np.asarray(logits16) - np.asarray(logits32)).max() < 0.25
    cache = model16.init_cache(batch_size=2, max_length=8)
    assert cache.keys[0].dtype == jnp.bfloat16


def test_out_of_range_padding_ids_do_not_poison_other_positions(tiny_hf_model_dir):
    """Masked left padding holding sentinel ids (-1, >= vocab) gives the same logits as padding id 0."""
    model, _ = load_hf_model(tiny_hf_model_dir("llama"))
    tokens = np.random.RandomState(4).randint(3, 256, size=(8,))
    valid_s = np.arange(10) >= 2
    mask_bts = jnp.asarray((np.tril(np.ones((10, 10), bool)) & valid_s[None, :])[None])  # [1, T, S]
    positions_bt = jnp.asarray(np.concatenate([[0, 0], np.arange(8)])[None], jnp.int32)
    logits = {}
    for name, pad in (("zero", [0, 0]), ("sentinel", [-1, 10_000])):
        ids_bt = jnp.asarray(np.concatenate([pad, tokens])[None], jnp.int32)
        logits[name], _ = model(ids_bt, positions_bt, attention_mask_bts=mask_bts)
    assert np.isfinite(np.asarray(logits["sentinel"])).all()
    np.testing.assert_array_equal(np.asarray(logits["sentinel"][:, 2:]), np.asarray(logits["zero"][:, 2:]))


def test_remat_recomputes_layers_with_identical_gradients(tiny_hf_model_dir):
    model, _ = load_hf_model(tiny_hf_model_dir("gemma3"))
    ids_bt = jnp.asarray(np.random.RandomState(6).randint(3, 256, size=(2, 12)), jnp.int32)
    positions_bt = positions_for(2, 0, 12)

    def gradients(model):
        graphdef, state = nnx.split(model)

        def loss(state):
            logits_btv, _ = nnx.merge(graphdef, state)(ids_bt, positions_bt)
            return jnp.mean(jax.nn.log_softmax(logits_btv)[..., 5])

        return jax.grad(loss), state

    plain_grad, state = gradients(model)
    model.remat = True
    remat_grad, _ = gradients(model)
    # The rematerialisation primitive is "remat2" in jax 0.10 and "checkpoint" in later versions.
    def uses_remat(grad):
        jaxpr = str(jax.make_jaxpr(grad)(state))
        return "remat2[" in jaxpr or "checkpoint[" in jaxpr

    assert not uses_remat(plain_grad) and uses_remat(remat_grad)
    for plain, rematerialised in zip(jax.tree.leaves(plain_grad(state)), jax.tree.leaves(remat_grad(state))):
        assert np.abs(np.asarray(plain) - np.asarray(rematerialised)).max() <= 1e-6
