"""Device mesh (data, fsdp, tensor) and the placement of model parameters on it.

Every parameter carries ``logical_axes`` metadata (see ``jaxengine.models.layers``); rules map
each logical name to a mesh axis (or None: replicated). A dimension that the mesh axis does
not divide is replicated instead, so that small tensors (one key/value head, tiny test
models) still place on any mesh. Batches are split over ``data`` and ``fsdp`` together.

Training: a job's ``parallel`` section (or ``default_layout``) gives the mesh (``layout_mesh``);
the trainer places its arrays with ``state_shardings`` and its batches with ``place_batch``, and
runs inside ``jax.set_mesh`` so that the models' activation constraints (``constrain``,
``constrain_kv_cache``: no-ops without a mesh in context) see the mesh while jit traces.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxengine.words import counted

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
            f"mesh data={data} x fsdp={fsdp} x tensor={tensor} needs {needed} devices but "
            f"{counted(len(devices), 'is', 'are')} available"
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
        if not isinstance(variable, nnx.Variable):
            return NamedSharding(mesh, PartitionSpec())
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


# --------------------------------------------------------------------------------------------
# Layouts from the job spec's ``parallel`` section


def default_layout(device_count: int, *, platform: str, process_count: int = 1) -> dict[str, int] | None:
    """The (data, fsdp, tensor) sizes a job without ``parallel`` gets, or None for the unsharded path.

    On accelerators every device of the job goes on ``fsdp``: parameters and optimizer state are
    split eightfold on eight chips (what lets a model that fits no single chip train at all) while
    the batch is still split over every device. On CPU a job runs on one device: XLA's CPU backend
    already uses every core inside one device and there is no device memory to save, so the fake
    host devices (``--xla_force_host_platform_device_count``) stay a testing tool. A job of several
    processes (``jaxengine.distributed``) always gets a mesh, since its arrays must span them all; on
    CPU that is every device on ``data``.
    """
    if platform == "cpu" and process_count > 1:
        return {"data": device_count, "fsdp": 1, "tensor": 1}
    if platform == "cpu" or device_count == 1:
        return None
    return {"data": 1, "fsdp": device_count, "tensor": 1}


def layout_mesh(layout: dict[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh of a ``parallel`` layout over ``devices`` (default: every device of every process).

    The sizes must multiply to exactly the device count: a job that leaves devices idle, or asks for
    more than it has, is a mistake in the spec rather than something to work around.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = {name: int(layout.get(name, 1)) for name in MESH_AXES}
    product = math.prod(sizes.values())
    if product != len(devices):
        given = " x ".join(f"{name} {size}" for name, size in sizes.items())
        raise ValueError(f"parallel: {given} = {counted(product, 'device')}, but this job has {len(devices)}; "
                         f"make the sizes multiply to {len(devices)} (or leave parallel out for the default)")
    return make_mesh(**sizes, devices=devices)


def batch_rows_multiple(mesh: Mesh) -> int:
    """Rows a batch must be a multiple of to split over the mesh's batch axes (data x fsdp)."""
    return math.prod(mesh.shape[axis] for axis in BATCH_AXES)


# --------------------------------------------------------------------------------------------
# Batches and activations


# Logical axis -> mesh axis for activations (the residual stream, the KV cache): rows over the
# batch axes, everything else whole (``table_vocab``: an embedding table gathered for its lookup keeps
# only its vocabulary split). Tensor parallelism splits the weights (heads, MLP width);
# XLA derives the split of the activations inside attention and the MLP from them.
ACTIVATION_RULES: dict[str, Any] = {"batch": BATCH_AXES, "length": None, "act_embed": None,
                                    "table_vocab": DEFAULT_RULES["vocab"]}


def place_batch(tree: Any, mesh: Mesh, *, batch_axis: int = 0) -> Any:
    """Every array of ``tree`` as a global array on ``mesh``, rows (dimension ``batch_axis``) split over
    (data, fsdp); arrays with fewer dimensions, and rows the batch axes do not divide, are replicated.

    Every process holds the same whole batch (each runs the same seeded data pipeline), so each
    device's piece is cut from it by index (``jax.make_array_from_callback``): this works unchanged
    when the mesh spans several processes, where a plain ``device_put`` of the batch could not.
    """
    def place(array):
        array = np.asarray(array)
        axes = [None] * array.ndim
        if array.ndim > batch_axis:
            axes[batch_axis] = "batch"
        sharding = NamedSharding(mesh, logical_to_spec(axes, array.shape, mesh, ACTIVATION_RULES))
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    return jax.tree.map(place, tree)


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """``x`` with a sharding constraint from its logical ``axes`` on the mesh in context (``jax.set_mesh``,
    which the trainer enters); without a mesh, the identity. Dimensions the mesh does not divide stay whole."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, x.shape, mesh, ACTIVATION_RULES))


def constrain_kv_cache(buffer_f: jax.Array, *, batch: int, kv_heads: int) -> jax.Array:
    """A KV cache buffer [F, ...] (F = B x K, see ``layers.kv_cache_shapes``) with rows over (data, fsdp)
    and key/value heads over tensor; identity without a mesh in context.

    F is batch-major, so splitting it over (data, fsdp, tensor) in that order gives each (data, fsdp)
    position a block of whole rows and each tensor position a block of heads within them, exactly
    when data x fsdp divides B and tensor divides K. Otherwise only the rows are split (or nothing).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or buffer_f.ndim < 3:
        return buffer_f
    row_split = math.prod(mesh.shape[axis] for axis in BATCH_AXES)
    if batch % row_split:
        return buffer_f
    leading = MESH_AXES if kv_heads % mesh.shape["tensor"] == 0 else BATCH_AXES
    spec = PartitionSpec(leading, *([None] * (buffer_f.ndim - 1)))
    return jax.lax.with_sharding_constraint(buffer_f, spec)


def mirrored_shardings(tree: Any, params: Any, param_shardings: Any, mesh: Mesh) -> Any:
    """Shardings for ``tree`` (e.g. an optimizer state): a leaf whose key path ends with a parameter's
    path and has that parameter's shape (Adam's mu and nu) is placed like the parameter; every other
    leaf (step counters, norms) is replicated."""
    by_path = {}
    for (path, leaf), sharding in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(param_shardings)):
        by_path[path] = (np.shape(leaf), sharding)
    replicated = NamedSharding(mesh, PartitionSpec())

    def sharding_of(path, leaf):
        for start in range(len(path)):
            found = by_path.get(path[start:])
            if found is not None and found[0] == np.shape(leaf):
                return found[1]
        return replicated

    return jax.tree_util.tree_map_with_path(sharding_of, tree)


def put(value: jax.Array, target: NamedSharding) -> jax.Array:
    """``value`` placed with ``target``; when the mesh spans several processes (each holding the same
    value), each process fills in the pieces of its own devices. A value already spread over several
    processes (weights read straight into the mesh, an optimizer state made from them) has no copy in
    any one process to cut pieces from: it is resharded on the devices instead."""
    if jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(put(jax.random.key_data(value), target), impl=jax.random.key_impl(value))
    if target.is_fully_addressable:
        return jax.device_put(value, target)
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        if value.sharding.is_equivalent_to(target, value.ndim):
            return value
        return jax.jit(lambda array: array, out_shardings=target)(value)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, target, lambda index: host[index])


class MeshPlacement:
    """Where a trainer's arrays live on a (data, fsdp, tensor) mesh (``Trainer(mesh=...)``).

    Parameters and frozen weights are placed by their logical axes (FSDP shards, tensor splits), the
    optimizer state like the parameters it mirrors, RNG state replicated, and batches split by rows
    over (data, fsdp). The mesh may span several processes (``jax.distributed``): every process
    then builds the same values and contributes the pieces of its own devices. The trainer also
    jits its steps with these arrays' shardings in and out and runs inside ``jax.set_mesh(mesh)``.
    """

    def __init__(self, mesh: Mesh, *, rules: dict[str, Any] | None = None, batch_axis: int = 1):
        self.mesh = mesh
        self.rules = rules
        self.batch_axis = batch_axis

    def put_state(self, tree: Any) -> Any:
        """A pytree of ``nnx.State`` (or Variables) with every array placed by its logical axes."""
        return jax.tree.map(put, tree, state_shardings(tree, self.mesh, self.rules))

    def put_optimizer_state(self, opt_state: Any, params: Any) -> Any:
        """The optimizer state placed like the (already placed) ``params`` it mirrors."""
        targets = mirrored_shardings(opt_state, params, jax.tree.map(lambda leaf: leaf.sharding, params), self.mesh)
        return jax.tree.map(put, opt_state, targets)

    def put_batches(self, batches: Any) -> Any:
        """A training batch [A, B, ...] with rows (axis ``batch_axis``) split over (data, fsdp)."""
        return place_batch(batches, self.mesh, batch_axis=self.batch_axis)

    def put_replicated(self, batch: Any) -> Any:
        """An evaluation batch (its last one need not split evenly): whole on every device. The models'
        residual-stream constraints still split the work by rows where the rows divide."""
        replicated = NamedSharding(self.mesh, PartitionSpec())
        return jax.tree.map(lambda leaf: put(np.asarray(leaf), replicated), batch)

    def to_local(self, tree: Any) -> Any:
        """The arrays as they are when this process holds them all (one process); else gathered here."""
        from jax.experimental import multihost_utils

        def local(leaf):
            if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
                return leaf
            if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                return jax.random.wrap_key_data(local(jax.random.key_data(leaf)), impl=jax.random.key_impl(leaf))
            return jax.device_put(multihost_utils.process_allgather(leaf, tiled=True), jax.local_devices()[0])

        return jax.tree.map(local, tree)

    def agree(self, flag: bool) -> bool:
        """True on every process when any process says True (so that all stop at the same step)."""
        if jax.process_count() == 1:
            return bool(flag)
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))
