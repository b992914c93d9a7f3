"""Device mesh (data, fsdp, tensor) and the placement of model parameters on it.

Every parameter carries ``logical_axes`` metadata (see ``jaxengine.models.layers``); rules map
each logical name to a mesh axis (or None: replicated). A dimension that the mesh axis does
not divide is replicated instead, so that small tensors (one key/value head, tiny test
models) still place on any mesh. Batches are split over ``data`` and ``fsdp`` together.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
# Logical parameter axis -> mesh axis. Matmul inputs ('embed') shard over fsdp; heads, MLP
# width and vocabulary over tensor (Megatron-style column/row split).
DEFAULT_RULES: dict[str, str | None] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "norm": None,
    "head_dim": None,
}


def make_mesh(*, data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over the first data*fsdp*tensor devices."""
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    for name, size in sizes.items():
        if size < 1:
            raise ValueError(f"mesh axis {name!r} must have size >= 1, got {size}")
    devices = list(jax.devices() if devices is None else devices)
    needed = data * fsdp * tensor
    if needed > len(devices):
        raise ValueError(
            f"mesh data={data} x fsdp={fsdp} x tensor={tensor} needs {needed} devices but {len(devices)} are available"
        )
    return Mesh(np.array(devices[:needed]).reshape(data, fsdp, tensor), MESH_AXES)


def logical_to_spec(axes: Sequence[str | None] | None, shape: Sequence[int], mesh: Mesh,
                    rules: dict[str, Any] | None = None) -> PartitionSpec:
    """PartitionSpec of an array whose dimensions have logical ``axes`` (None: replicated).

    A mesh axis is used at most once per array, and only where it divides the dimension.
    """
    rules = DEFAULT_RULES if rules is None else rules
    if axes is None:
        return PartitionSpec()
    used: set[str] = set()
    spec = []
    for axis, dim in zip(axes, shape):
        mesh_axis = rules.get(axis) if axis is not None else None
        if axis is not None and axis not in rules:
            raise ValueError(f"logical axis {axis!r} has no sharding rule; rules cover {sorted(rules)}")
        mesh_axes = (mesh_axis,) if isinstance(mesh_axis, str) else tuple(mesh_axis or ())
        mesh_axes = tuple(a for a in mesh_axes if a not in used)
        size = math.prod(mesh.shape[a] for a in mesh_axes)
        if not mesh_axes or size == 1 or dim % size:
            spec.append(None)
            continue
        used.update(mesh_axes)
        spec.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return PartitionSpec(*spec)


def logical_to_sharding(axes: Sequence[str | None] | None, shape: Sequence[int], mesh: Mesh,
                        rules: dict[str, Any] | None = None) -> NamedSharding:
    """NamedSharding of an array with logical ``axes`` on ``mesh``."""
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


def state_shardings(state: nnx.State, mesh: Mesh, rules: dict[str, Any] | None = None) -> nnx.State:
    """A NamedSharding for every variable of an ``nnx.State`` (same tree), from its logical axes.

    Variables without ``logical_axes`` metadata (e.g. optimizer counters) are replicated.
    """
    def sharding_of(variable):
        return variable.replace(logical_to_sharding(
            variable.get_metadata().get("logical_axes"), np.shape(variable[...]), mesh, rules))

    return jax.tree.map(sharding_of, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model: nnx.Module, mesh: Mesh, rules: dict[str, Any] | None = None) -> nnx.Module:
    """Move every variable of ``model`` onto ``mesh`` per its logical axes (in place); returns ``model``."""
    state = nnx.state(model)
    shardings = state_shardings(state, mesh, rules)
    nnx.update(model, jax.device_put(state, shardings))
    return model


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a batch-major array of ``ndim`` dims: rows split over (data, fsdp)."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))
