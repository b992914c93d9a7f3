"""The fused attention path (row lengths instead of a dense mask) against the general masked one.

On CPU the fused path runs ``jax.nn.dot_product_attention(implementation="xla")``; the cuDNN kernel
behind the same call on GPU is exercised by ``bench/gpu_train.py --attention cudnn``.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxengine.data.pipeline import Example, attention_mask, make_batch
from jaxengine.models import build_model, preset
from jaxengine.models.layers import fused_attention, resolve_attention_implementation
from jaxengine.tasks import LanguageModelTask

LENGTHS = np.array([12, 5, 1, 9], np.int32)


def lengths_mask(lengths_b, length, window=None):
    """Bool [B, T, T] by hand: s <= t, s < length (and t - s < window)."""
    t, s = np.arange(length)[:, None], np.arange(length)[None, :]
    allowed = (s <= t)[None] & (s[None] < lengths_b[:, None, None])
    if window is not None:
        allowed &= ((t - s) < window)[None]
    return allowed


def reference_attention(q_btnh, k_bskh, v_bskh, mask_bts, scale):
    """Grouped-query softmax attention in float64 numpy, keys/values repeated per query head."""
    q, k, v = (np.asarray(x, np.float64) for x in (q_btnh, k_bskh, v_bskh))
    groups = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    scores_bnts = np.einsum("btnh,bsnh->bnts", q, k) * scale
    scores_bnts = np.where(mask_bts[:, None], scores_bnts, -np.inf)
    scores_bnts -= scores_bnts.max(axis=-1, keepdims=True)
    probs_bnts = np.exp(scores_bnts)
    probs_bnts /= probs_bnts.sum(axis=-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", probs_bnts, v)


@pytest.mark.parametrize("window", [None, 3])
def test_fused_attention_matches_masked_softmax_attention_on_real_rows(window):
    batch, length, heads, kv_heads, head_dim = 4, 12, 6, 2, 8
    q, k, v = (jax.random.normal(jax.random.key(i), (batch, length, n, head_dim), jnp.float32)
               for i, n in enumerate((heads, kv_heads, kv_heads)))
    fused = fused_attention(q, k, v, jnp.asarray(LENGTHS), scale=0.3, window=window, implementation="xla")
    masked = reference_attention(q, k, v, lengths_mask(LENGTHS, length, window), scale=0.3)
    real_bt = np.arange(length)[None, :] < LENGTHS[:, None]
    assert np.isfinite(np.asarray(fused)).all()
    np.testing.assert_allclose(np.asarray(fused)[real_bt], np.asarray(masked)[real_bt], atol=1e-5, rtol=0)


def test_auto_is_xla_on_cpu_and_an_explicit_cudnn_fails_loudly_there():
    assert jax.default_backend() == "cpu"
    assert resolve_attention_implementation("auto", dtype=jnp.bfloat16, head_dim=128) == "xla"
    assert resolve_attention_implementation("cudnn", dtype=jnp.float32, head_dim=64) == "cudnn"
    with pytest.raises(ValueError, match="attention_implementation"):
        resolve_attention_implementation("flash", dtype=jnp.bfloat16, head_dim=64)
    q = jnp.zeros((1, 16, 2, 64), jnp.bfloat16)
    with pytest.raises(Exception):  # no cuDNN on CPU: the error surfaces, nothing falls back silently
        jax.block_until_ready(fused_attention(q, q, q, jnp.array([16]), scale=0.125, window=None,
                                              implementation="cudnn"))


def right_padded_batch(vocab_size):
    examples = [Example(ids=(np.arange(n) * 5 + n) % (vocab_size - 3) + 3, loss_mask=np.arange(n) >= 1)
                for n in LENGTHS.tolist()]
    return jax.tree.map(jnp.asarray, make_batch(examples, max_seq_len=16, pad_id=0))


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])  # gemma3: a sliding layer (window 4 < 16 tokens)
def test_model_with_lengths_matches_the_segment_mask_and_the_task_loss_is_unchanged(family):
    model = build_model(preset(f"tiny-{family}"), rngs=nnx.Rngs(0), attention_implementation="xla")
    batch = right_padded_batch(model.config.vocab_size)
    lengths_b = jnp.sum(batch.segment_ids > 0, axis=-1)
    fused_btd, _ = model.hidden_states(batch.input_ids, batch.positions, lengths_b=lengths_b)
    masked_btd, _ = model.hidden_states(batch.input_ids, batch.positions,
                                        attention_mask_bts=attention_mask(batch.segment_ids))
    real_bt = np.asarray(batch.segment_ids) > 0
    np.testing.assert_allclose(np.asarray(fused_btd)[real_bt], np.asarray(masked_btd)[real_bt], atol=1e-5, rtol=0)
    packed_loss, _, _ = LanguageModelTask().loss(model, batch)
    unpacked_loss, _, _ = LanguageModelTask(unpacked=True).loss(model, batch)
    assert abs(float(packed_loss) - float(unpacked_loss)) <= 1e-6
