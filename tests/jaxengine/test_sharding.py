"""Placement of models on a (data, fsdp, tensor) mesh of 8 fake CPU devices."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from jaxengine.checkpoint.hf import load_hf_model
from jaxengine.models import build_model, preset
from jaxengine.sharding import batch_sharding, logical_to_spec, make_mesh, shard_model


def test_make_mesh_has_named_axes_of_given_sizes():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    with pytest.raises(ValueError, match="needs 16 devices but 8 are available"):
        make_mesh(data=4, fsdp=2, tensor=2)
    with pytest.raises(ValueError, match="needs 2 devices but 1 is available"):  # not "1 are"
        make_mesh(data=2, fsdp=1, tensor=1, devices=jax.devices()[:1])


def test_logical_axes_map_to_mesh_axes_and_replicate_what_does_not_divide():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    assert logical_to_spec(("embed", "heads"), (64, 64), mesh) == PartitionSpec("fsdp", "tensor")
    assert logical_to_spec(("vocab", "embed"), (256, 64), mesh) == PartitionSpec("tensor", "fsdp")
    # A dimension the mesh axis does not divide (15 over tensor=2) stays whole.
    assert logical_to_spec(("embed", "kv_heads"), (64, 15), mesh) == PartitionSpec("fsdp", None)
    assert logical_to_spec(("norm",), (64,), mesh) == PartitionSpec(None)
    with pytest.raises(ValueError, match="logical axis 'bogus' has no sharding rule"):
        logical_to_spec(("bogus",), (4,), mesh)


def test_every_parameter_has_logical_axes():
    model = build_model(preset("tiny-gemma3"), rngs=nnx.Rngs(0))
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        axes = variable.get_metadata().get("logical_axes")
        assert axes is not None and len(axes) == variable[...].ndim, path


@pytest.mark.parametrize("kind", ["gemma3", "qwen2"])
def test_sharded_forward_equals_single_device(kind, tiny_hf_model_dir):
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    single, _ = load_hf_model(tiny_hf_model_dir(kind))
    sharded, _ = load_hf_model(tiny_hf_model_dir(kind), mesh=mesh)
    q_kernel = sharded.layers[0].self_attn.q_proj.kernel[...]
    assert q_kernel.sharding.spec == PartitionSpec("fsdp", "tensor")
    assert len(q_kernel.addressable_shards) == 8

    ids_bt = np.random.RandomState(3).randint(3, 256, size=(4, 12)).astype(np.int32)
    positions_bt = np.broadcast_to(np.arange(12, dtype=np.int32), (4, 12))
    expected, _ = single(jnp.asarray(ids_bt), jnp.asarray(positions_bt))

    graphdef, state = nnx.split(sharded)
    forward = jax.jit(lambda state, ids, positions: nnx.merge(graphdef, state)(ids, positions)[0])
    batch = batch_sharding(mesh)
    logits = forward(state, jax.device_put(ids_bt, batch), jax.device_put(positions_bt, batch))
    assert len(logits.sharding.device_set) == 8
    assert np.abs(np.asarray(logits) - np.asarray(expected)).max() <= 1e-5

    # Cached decoding on the mesh: prefill 11 tokens, then feed the 12th.
    @jax.jit
    def prefill_then_step(state, ids, positions):
        model = nnx.merge(graphdef, state)
        cache = model.init_cache(batch_size=ids.shape[0], max_length=16)
        _, cache = model(ids[:, :11], positions[:, :11], cache=cache)
        return model(ids[:, 11:], positions[:, 11:], cache=cache)[0]

    step_logits = prefill_then_step(state, jax.device_put(ids_bt, batch), jax.device_put(positions_bt, batch))
    assert np.abs(np.asarray(step_logits[:, 0]) - np.asarray(expected[:, -1])).max() <= 1e-5


def test_shard_model_places_a_built_model():
    mesh = make_mesh(data=1, fsdp=2, tensor=4)
    model = shard_model(build_model(preset("tiny-llama"), rngs=nnx.Rngs(0)), mesh)
    assert model.layers[1].mlp.down_proj.kernel[...].sharding.spec == PartitionSpec("tensor", "fsdp")
    assert model.embed_tokens.embedding[...].sharding.spec == PartitionSpec("tensor", "fsdp")
