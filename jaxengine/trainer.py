"""The one training loop: every task (pretrain, sft, reward, dpo) runs through ``Trainer.fit``.

Design note. The model is split once into (trainable parameters, RNG state, everything else):
full fine-tuning trains every ``nnx.Param``; LoRA trains only the adapters and leaves the base in
the frozen part, which is never copied, donated or differentiated. The optimizer step is one
``jax.jit`` over plain pytrees with the trainable state, optimizer state and RNG state donated,
so they are updated in place. Gradient accumulation is a ``lax.scan`` over the micro-batches of
one step inside that same jitted function (see ``jaxengine.tasks`` for the weighting).

Checkpoints (orbax, synchronous, atomically renamed) hold the trainable state, the optimizer
state, the RNG state (all as one flat list of arrays: their tree structure is rebuilt from the
model and optimizer, which keeps the on-disk format independent of flax/optax internals), the
step, the data position, the count of tokens trained on and the job's settings with its data files' sha256
(a resume reports each setting changed since, and refuses a training file with other contents, whose rows the
saved data position no longer counts: ``settings_changes``). ``fit`` on a run directory that has
checkpoints resumes from the latest one: the same arrays, the same data order, the same jitted
computation, hence the same metrics, and a token count that goes on from the checkpoint's; metric
and sample lines logged after that checkpoint (by a run that died) are dropped first, so the
history never holds a step twice.

Loss state. A loss that keeps statistics across steps (dpo's bco_pair: a running mean of rewards) has them in
the trainer's ``loss_state``, a pytree beside the optimizer state (the task's ``initial_loss_state()``; empty
for every other task): the jitted step takes it and returns it updated, each micro-batch of a step in turn seeing
the state the one before left. It is replicated over a mesh, and checkpointed as named arrays in the checkpoint's
``extra`` item (``loss_state/<path>``), not in the flat ``state`` list: that list, and so every checkpoint of a
task without loss state, is what it was before loss states existed, and exports read it without knowing the loss.
A checkpoint without the arrays (written before, or under another loss) resumes with the task's initial state.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import json
import math
import resource
import sys
import time
import traceback as tracebacks
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxengine.checkpoint.step_folders import incomplete_checkpoint_message
from jaxengine.data import pipeline
from jaxengine.sharding import MeshPlacement
from jaxengine.spec import OptimSpec

Metrics = dict[str, float]


# tensorstore's status codes for array data a checkpoint lacks (files deleted, or written part way).
MISSING_DATA_STATUSES = ("NOT_FOUND", "DATA_LOSS", "OUT_OF_RANGE")


def _is_missing_data(error: BaseException | None) -> bool:
    """Whether ``error``, or an error that caused it, is tensorstore reporting array data that is gone or cut
    short: a ValueError with one of ``MISSING_DATA_STATUSES``, or FAILED_PRECONDITION on reading a chunk
    (an OCDBT data file deleted or emptied: "Truncated Zstd-compressed stream"). Orbax wraps the latter in a
    bare Exception. Any other error (arrays of another shape) is not an incomplete checkpoint."""
    while error is not None:
        text = str(error).lstrip() if isinstance(error, ValueError) else ""
        if text.startswith(MISSING_DATA_STATUSES) or (text.startswith("FAILED_PRECONDITION") and "Error reading" in text):
            return True
        error = error.__cause__ or error.__context__
    return False


def _is_late_read_callback(unraisable) -> bool:
    """Whether an unraisable error (``sys.unraisablehook``'s argument) is tensorstore finishing one of a failed
    restore's other reads: orbax closes the restore's event loop at the first failure, and each read still under
    way then calls back into it from tensorstore's threads ("Event loop is closed" in ``call_soon_threadsafe``)."""
    error = unraisable.exc_value
    if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed" and unraisable.exc_traceback):
        return False
    return tracebacks.extract_tb(unraisable.exc_traceback)[0].name == "call_soon_threadsafe"


def _quiet_late_read_callbacks() -> None:
    """Keep the tracebacks of a failed restore's late read callbacks (``_is_late_read_callback``: dozens, some
    printed before the failure's one-line TrainingError, some after) off stderr; every other unraisable error
    still goes to the hook that was there. Installed once, before the first restore."""
    previous = sys.unraisablehook
    if getattr(previous, "quiets_late_read_callbacks", False):
        return

    def hook(unraisable):
        if not _is_late_read_callback(unraisable):
            previous(unraisable)

    hook.quiets_late_read_callbacks = True
    sys.unraisablehook = hook


class TrainingError(RuntimeError):
    """A run that cannot continue (non-finite loss, bad checkpoint); the message says what to do."""


# --------------------------------------------------------------------------------------------
# Optimizer


def learning_rate_schedule(optim: OptimSpec, *, total_steps: int | jax.Array) -> Callable[[jax.Array], jax.Array]:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup from 0 over ``warmup_steps``
    (reaching the peak at step ``warmup_steps``), then constant, or linear / cosine decay reaching 0
    at step ``total_steps`` (a number, or a traced one: the jitted step takes it as an argument)."""
    peak, warmup = optim.learning_rate, optim.warmup_steps
    # Times the reciprocal, not divided: the float32 numbers XLA computed when the length was a constant of the
    # program (it turns a division by a constant into that product), so a step compiled for any length gives them.
    per_decay_step = 1.0 / jnp.maximum(jnp.asarray(total_steps, jnp.float32) - warmup, 1.0)

    def schedule(step: jax.Array) -> jax.Array:
        step = jnp.asarray(step, jnp.float32)
        warm = peak * step / max(warmup, 1)
        progress = jnp.clip((step - warmup) * per_decay_step, 0.0, 1.0)
        if optim.schedule == "constant":
            decayed = jnp.asarray(peak, jnp.float32)
        elif optim.schedule == "linear":
            decayed = peak * (1.0 - progress)
        else:
            decayed = peak * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return jnp.where(step < warmup, warm, decayed)

    return schedule


def make_optimizer(optim: OptimSpec, *, total_steps: int | jax.Array) -> optax.GradientTransformation:
    """AdamW with decoupled weight decay on matrices only (not norms or biases), after global-norm clipping."""
    schedule = learning_rate_schedule(optim, total_steps=total_steps)
    adamw = optax.adamw(
        schedule, b1=optim.adam_beta1, b2=optim.adam_beta2, eps=optim.adam_epsilon,
        weight_decay=optim.weight_decay, mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params),
    )
    if optim.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(optim.max_grad_norm), adamw)


# --------------------------------------------------------------------------------------------
# Checkpoints


def _to_storable(leaf: jax.Array) -> jax.Array:
    return jax.random.key_data(leaf) if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key) else leaf


class Checkpoints:
    """Step-numbered orbax checkpoints under ``directory``: keeps the last ``keep_last`` and the best one.

    "Best" is by each checkpoint's ``meta["eval_score"]`` (the run's ``best_metric`` at that step, None
    when it did not evaluate), lowest first when ``higher_is_better`` is false (a loss), highest when
    true (an accuracy). Checkpoints written before scores were generic carry ``eval_loss`` instead.
    """

    def __init__(self, directory: Path, *, keep_last: int, higher_is_better: bool = False):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.keep_last = keep_last
        self.higher_is_better = higher_is_better
        self.manager = ocp.CheckpointManager(
            directory.absolute(),
            options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False, create=True),
            item_names=("state", "meta", "extra"),
        )

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def meta(self, step: int) -> dict[str, Any]:
        ocp = self._ocp
        return dict(self._read(step, ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)

    def _read(self, step: int, args: Any) -> Any:
        """``manager.restore(step, args)``; a checkpoint directory missing its items (a run directory copied
        part way, a save that stopped on a full disk) is a TrainingError naming it, not orbax's KeyError
        ('Item "meta" was not found in the checkpoint') from the middle of a resume or an export."""
        _quiet_late_read_callbacks()
        try:
            return self.manager.restore(step, args=args)
        except Exception as error:
            if not isinstance(error, (KeyError, OSError)) and not _is_missing_data(error):
                raise
            raise TrainingError(incomplete_checkpoint_message(Path(self.manager.directory) / str(step))) from None

    def save(self, step: int, leaves: list[jax.Array], meta: dict[str, Any],
             extra: dict[str, np.ndarray] | None = None) -> None:
        """Save ``leaves`` and ``meta`` as checkpoint ``step``, with ``extra`` named host arrays (read back
        by ``extra``) when given; their names, shapes and dtypes go into the meta."""
        ocp = self._ocp
        state = {f"{i:05d}": _to_storable(leaf) for i, leaf in enumerate(leaves)}
        items = {"state": ocp.args.StandardSave(state)}
        if extra:
            arrays = [(name, np.asarray(value)) for name, value in sorted(extra.items())]
            meta = {**meta, "extra": [{"name": name, "shape": list(array.shape), "dtype": array.dtype.str}
                                      for name, array in arrays]}
            items["extra"] = ocp.args.StandardSave({f"{i:05d}": array for i, (_, array) in enumerate(arrays)})
        self.manager.save(step, args=ocp.args.Composite(**items, meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()
        self._prune()

    def extra(self, step: int) -> dict[str, np.ndarray]:
        """The named host arrays saved with checkpoint ``step`` (none for most)."""
        entries = self.meta(step).get("extra") or []
        if not entries:
            return {}
        like = {f"{i:05d}": np.zeros(entry["shape"], np.dtype(entry["dtype"])) for i, entry in enumerate(entries)}
        restored = self._read(step, self._ocp.args.Composite(extra=self._ocp.args.StandardRestore(like)))
        return {entry["name"]: np.asarray(restored.extra[f"{i:05d}"]) for i, entry in enumerate(entries)}

    def restore(self, step: int, like: list[jax.Array]) -> tuple[list[jax.Array], dict[str, Any]]:
        """Arrays of checkpoint ``step`` shaped and placed like ``like``, and its metadata."""
        ocp = self._ocp
        abstract = {
            f"{i:05d}": jax.ShapeDtypeStruct(_to_storable(leaf).shape, _to_storable(leaf).dtype,
                                             sharding=getattr(leaf, "sharding", None))
            for i, leaf in enumerate(like)
        }
        restored = self._read(step, ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                       meta=ocp.args.JsonRestore()))
        leaves = []
        for i, leaf in enumerate(like):
            value = restored.state[f"{i:05d}"]
            if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(leaf))
            leaves.append(value)
        return leaves, dict(restored.meta)

    def best_step(self) -> int | None:
        """The step of the best-scored checkpoint (the earliest among equals), or None when none was scored."""
        sign = -1.0 if self.higher_is_better else 1.0
        scored = [(sign * score, step) for step in self.steps() if (score := _eval_score(self.meta(step))) is not None]
        return min(scored)[1] if scored else None

    def _prune(self) -> None:
        steps = self.steps()
        keep = set(steps[-self.keep_last:]) | {self.best_step()}
        for step in steps:
            if step not in keep:
                self.manager.delete(step)

    def close(self) -> None:
        self.manager.close()


def _eval_score(meta: dict[str, Any]) -> float | None:
    return meta.get("eval_score", meta.get("eval_loss"))


def is_better(score: float, best: float | None, *, higher_is_better: bool) -> bool:
    """Whether ``score`` beats ``best`` (None: nothing yet); a tie is not better, so the earlier step stays best."""
    if best is None:
        return True
    return score > best if higher_is_better else score < best


# --------------------------------------------------------------------------------------------
# Run-directory files


def _logged_records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) of each line of a run's ``metrics.jsonl`` or ``samples.jsonl``, read on resume. A last
    line that is no JSON is a write the run's end cut short (a kill, a full disk: its step has no checkpoint
    either) and is dropped; any other line that is not a record with a step is a TrainingError naming the
    file and line, where a resume stopped with a traceback."""
    if not path.exists():
        return []
    lines = [(number, line) for number, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    records = []
    for position, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if position == len(lines) - 1:
                break
            problem = f"it is not JSON ({error.msg} at column {error.colno})"
        else:
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append((line, record))
                continue
            problem = "it is not a record with a step"
        raise TrainingError(f"{path}: line {number}: {problem}, so the run cannot resume after it; remove the line "
                            "(or the file) and run the job again")
    return records


def _truncate_jsonl(path: Path, *, after_step: int) -> None:
    """Drop lines whose ``step`` exceeds ``after_step`` (logged by a run that died before saving)."""
    if not path.exists():
        return
    kept = [line for line, record in _logged_records(path) if record["step"] <= after_step]
    path.write_text("".join(line + "\n" for line in kept))


def _logged_tokens(path: Path, *, at_or_before: int) -> int:
    """The ``tokens`` of the last line of ``path`` at or before step ``at_or_before`` (0 without one)."""
    tokens = 0
    for _, record in _logged_records(path):
        if record["step"] <= at_or_before:
            tokens = int(record.get("tokens", 0))
    return tokens


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


# --------------------------------------------------------------------------------------------
# Jitted computations. Module-level with the model structure, task and optimizer settings as
# static arguments, so every Trainer over the same model shape reuses one compiled step (tests and
# resumed runs in one process compile once). The run's length is an argument, not a static one: runs
# that differ only in it (most of the engine's tests; a run resumed to more steps) share the step.


def memory_metrics(devices) -> dict[str, float]:
    """Peak memory so far, in GiB: ``memory/host_peak_gib``, the process's resident set (on CPU the
    devices' arrays live there too), and on accelerators ``memory/device_peak_gib``, the most any of
    ``devices`` has held. Logged every step so that a batch size or sequence length near the limit
    shows before it runs out."""
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    metrics = {"memory/host_peak_gib": peak_rss * (1 if sys.platform == "darwin" else 1024) / 2**30}
    device_peaks = [stats.get("peak_bytes_in_use") for stats in map(_device_memory_stats, devices)]
    device_peaks = [peak for peak in device_peaks if peak is not None]
    if device_peaks:
        metrics["memory/device_peak_gib"] = max(device_peaks) / 2**30
    return metrics


def _device_memory_stats(device) -> dict[str, int]:
    try:
        return device.memory_stats() or {}  # None on CPU
    except Exception:  # a backend without the statistics: nothing to report, not a failed run
        return {}


def initial_loss_state(task) -> Any:
    """The state ``task``'s loss carries across steps (see the module notes); an empty pytree for most tasks."""
    return task.initial_loss_state() if hasattr(task, "initial_loss_state") else {}


def _task_loss(task, model, batch, loss_state):
    """``task``'s (loss, weight, metrics) on ``batch`` and its loss state after it (unchanged for a task without)."""
    if hasattr(task, "loss_with_state"):
        return task.loss_with_state(model, batch, loss_state)
    return (*task.loss(model, batch), loss_state)


# The names of the loss state's arrays in a checkpoint's ``extra`` item: this, then the path of each array in the
# pytree ("loss_state/bco_running_mean/mean").
LOSS_STATE_PREFIX = "loss_state/"


def _loss_state_arrays(loss_state: Any) -> dict[str, Any]:
    """Each array of ``loss_state`` by its checkpoint name (``LOSS_STATE_PREFIX`` and its path)."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(loss_state)
    return {LOSS_STATE_PREFIX + jax.tree_util.keystr(path, simple=True, separator="/"): leaf for path, leaf in leaves}


def _restored_loss_state(initial: Any, saved: dict[str, np.ndarray]) -> Any:
    """``initial`` (the task's initial loss state) with each array a checkpoint saved under its name put back;
    an array the checkpoint lacks (it was written before loss states, or under another loss) stays initial."""
    named = _loss_state_arrays(initial)
    restored = [saved.get(name, leaf) for name, leaf in named.items()]
    return jax.tree.unflatten(jax.tree.structure(initial), restored)


def _micro_loss(params, rng_state, loss_state, frozen, batch, *, graphdef, task):
    # Fresh Variable objects: the RNG state arrives from an outer trace (it is not differentiated),
    # and dropout's counter increments must happen on Variables of this trace.
    model = nnx.merge(graphdef, params, rng_state, frozen, copy=True)
    loss, weight, metrics, loss_state = _task_loss(task, model, batch, loss_state)
    return loss * weight, (loss, weight, metrics, nnx.state(model, nnx.RngState), loss_state)


TRAIN_STEP_STATIC = ("graphdef", "task", "optim")
EVAL_STEP_STATIC = ("graphdef", "task")


def _train_step(params, opt_state, rng_state, loss_state, frozen, batches, step, total_steps, *, graphdef, task,
                optim: OptimSpec):
    """One optimizer step over ``batches`` (a batch pytree with a leading grad-accum axis [A, ...]).

    The loss state goes through the micro-batches in order (each one's loss sees the state the one before left,
    as TRL's stateful losses update once per forward pass under gradient accumulation); it is no parameter, so
    no gradient flows into it. Returns the new (params, opt_state, rng_state, loss_state) and the step's metrics:
    the task's metrics
    weighted over micro-batches (their plain mean when every weight is 0, e.g. RL completions all
    masked as truncated: the rollout metrics still say what happened), ``grad_norm`` (before clipping),
    ``learning_rate``, ``loss_weight``.
    """
    loss_fn = functools.partial(_micro_loss, graphdef=graphdef, task=task)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    first = jax.tree.map(lambda x: x[0], batches)
    _, (_, _, metric_shapes, _, _) = jax.eval_shape(loss_fn, params, rng_state, loss_state, frozen, first)

    def body(carry, batch):
        grads_sum, rng_state, loss_state, weighted, summed, weight_sum = carry
        (_, (loss, weight, metrics, rng_state, loss_state)), grads = grad_fn(params, rng_state, loss_state, frozen,
                                                                             batch)
        grads_sum = jax.tree.map(jnp.add, grads_sum, grads)
        weighted = {name: weighted[name] + value * weight for name, value in metrics.items()}
        summed = {name: summed[name] + value for name, value in metrics.items()}
        return (grads_sum, rng_state, loss_state, weighted, summed, weight_sum + weight), None

    no_metrics = {name: jnp.zeros((), jnp.float32) for name in metric_shapes}
    zeros = (jax.tree.map(jnp.zeros_like, params), rng_state, loss_state, no_metrics, no_metrics,
             jnp.zeros((), jnp.float32))
    (grads_sum, rng_state, loss_state, weighted, summed, weight_sum), _ = jax.lax.scan(body, zeros, batches)
    micro_batches = jax.tree.leaves(batches)[0].shape[0]
    denominator = jnp.maximum(weight_sum, 1.0)
    grads = jax.tree.map(lambda g: g / denominator, grads_sum)
    grad_norm = optax.tree.norm(grads)
    optimizer = make_optimizer(optim, total_steps=total_steps)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics = {name: jnp.where(weight_sum > 0, value / denominator, summed[name] / micro_batches)
               for name, value in weighted.items()}
    schedule = learning_rate_schedule(optim, total_steps=total_steps)
    metrics.update(grad_norm=grad_norm, learning_rate=schedule(step), loss_weight=weight_sum)
    return params, opt_state, rng_state, loss_state, metrics


def _eval_step(params, rng_state, loss_state, frozen, batch, *, graphdef, task):
    """The task's metrics on one batch, multiplied by its weight, and the weight. A loss with state scores the
    batch as a training micro-batch would from ``loss_state``; what it would change is dropped, so evaluating
    never changes training (TRL's DPOTrainer does update bco_pair's running mean on eval batches)."""
    model = nnx.merge(graphdef, params, rng_state, frozen)
    _, weight, metrics, _ = _task_loss(task, model, batch, loss_state)
    return {name: value * weight for name, value in metrics.items()}, weight


# The unsharded path (no mesh): arrays stay where they are.
train_step = jax.jit(_train_step, static_argnames=TRAIN_STEP_STATIC, donate_argnums=(0, 1, 2, 3))
eval_step = jax.jit(_eval_step, static_argnames=EVAL_STEP_STATIC)


def sharded_steps(params, opt_state, rng_state, loss_state, frozen):
    """``train_step`` and ``eval_step`` (same signatures) jitted with the shardings of these placed
    arrays in and out, so the state keeps its layout from step to step (the loss state replicated); batches
    come in placed (``MeshPlacement.put_batches``), metrics go out replicated."""
    def shardings(tree):
        return jax.tree.map(lambda leaf: leaf.sharding, tree)

    params_s, opt_s, rng_s, frozen_s = shardings(params), shardings(opt_state), shardings(rng_state), shardings(frozen)
    replicated = NamedSharding(jax.tree.leaves(params_s)[0].mesh, PartitionSpec())
    loss_s = jax.tree.map(lambda _: replicated, loss_state)
    train = _jit_per_static(_train_step, traced=("total_steps",), donate_argnums=(0, 1, 2, 3),
                            in_shardings=(params_s, opt_s, rng_s, loss_s, frozen_s, None, None, None),
                            out_shardings=(params_s, opt_s, rng_s, loss_s, replicated))
    evaluate = _jit_per_static(_eval_step, in_shardings=(params_s, rng_s, loss_s, frozen_s, None),
                               out_shardings=replicated)
    return train, evaluate


# One jitted function per (function, jit options with their shardings, static arguments), the most recently used
# ones kept: trainers of the same model under the same layout (the tests' runs; a run resumed in its process) share
# its compiled programs, as unsharded ones share ``train_step``'s. A train worker's process runs one job, which needs
# two (train and eval). Kept without a bound, a process that trained under many models and layouts (a test process)
# held every program it had compiled, and the meshes and models their functions close over: XLA's CPU programs map
# tens of memory regions each (code, constants), and at the kernel's limit on a process's maps (vm.max_map_count,
# 65,530 by default) LLVM's next allocation failed and XLA segfaulted while compiling (bench/RESULTS.md, "The
# compiler's segfault"). Dropping a jitted function frees its programs.
_SHARDED_JITS_KEPT = 8
_SHARDED_JITS: collections.OrderedDict[tuple, Callable] = collections.OrderedDict()


def _jit_per_static(function, *, traced: tuple[str, ...] = (), **jit_options):
    # jit takes no keyword arguments alongside in_shardings, so the static ones are bound first
    # (one compiled function per distinct set; they are fixed for a trainer), and the ``traced`` ones are
    # passed on after the positional arguments.
    options = tuple((name, _hashable(value)) for name, value in sorted(jit_options.items()))

    def call(*args, **static):
        args = (*args, *(static.pop(name) for name in traced))
        key = (function, options, tuple(sorted(static.items())))
        jitted = _SHARDED_JITS.get(key)
        if jitted is None:
            jitted = _SHARDED_JITS[key] = jax.jit(functools.partial(function, **static), **jit_options)
            while len(_SHARDED_JITS) > _SHARDED_JITS_KEPT:
                _SHARDED_JITS.popitem(last=False)
        else:
            _SHARDED_JITS.move_to_end(key)
        return jitted(*args)

    return call


def _hashable(tree) -> tuple:
    """A pytree of shardings (or argument numbers, None for 'as given') as a key: its structure and leaves."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=lambda leaf: leaf is None)
    return treedef, tuple(leaves)


def changed_settings_problem(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What a resume under ``now`` would change of the ``saved`` resume settings (``TrainConfig.resume_settings``;
    keys in both only), as words that follow "checkpoints": each key with its saved and its new value, and what to
    do; None when nothing changes. A resume under them went on silently, on other data or state than the run's."""
    changed = [f"{key} {json.dumps(value)} (this spec: {json.dumps(now[key])})"
               for key, value in saved.items() if key in now and now[key] != value]
    if not changed:
        return None
    return (f"saved under other settings than this spec's: {', '.join(changed)}; they shape the saved state or the "
            "order of the training data, so the run cannot go on under new values: put each back as saved to resume "
            "it, or start a new run (another output_dir)")


# The key of the training file in a checkpoint's ``data_files`` record. A resume goes on from the saved data
# position (the epoch, and a cursor into that epoch's seeded shuffle of the file's rows; an RL block's prompt indices
# likewise), which counts in the rows of the file as it was when the checkpoint was saved: over a file edited or
# replaced since, the resumed run would train on other rows than its step count says (some twice, some never), so a
# changed training file is refused. Every other change a resume allows (optimizer, loss and reward settings,
# training lengths, the eval file) leaves the saved state and the data order meaning what they meant: the run goes
# on under it, and each change is reported (``settings_changes``).
TRAINING_FILE = "data.train"


def changed_training_file_problem(saved_files: dict[str, Any], now_files: dict[str, Any], *,
                                  step: int) -> str | None:
    """What a resume of checkpoint ``step`` over the training file of ``now_files`` would do when its contents are
    not those of ``saved_files`` (both ``TrainConfig.data_files`` records), and what to do; None when they are the
    same, or when either has no record of it (checkpoints of earlier engines, a trainer given no files)."""
    saved, now = saved_files.get(TRAINING_FILE), now_files.get(TRAINING_FILE)
    if not saved or not now or saved["sha256"] == now["sha256"]:
        return None
    return (f"{TRAINING_FILE}: {now['path']} changed since checkpoint {step} was saved (sha256 {saved['sha256'][:12]} "
            f"then, {now['sha256'][:12]} now): a resume goes on from the saved position in the training file's "
            "shuffled rows, so over other contents the run would train on other rows than its steps say; put the "
            "file back as it was to resume, or start a new run (another output_dir)")


def _changed_values(saved: dict[str, Any], now: dict[str, Any], prefix: str = ""):
    """Each leaf that differs between the ``saved`` and the ``now`` record, by dotted key, as words: saved value ->
    new value for a key in both; ``added`` with its value for a key only ``now`` has (a setting an engine added
    since the checkpoint, set by this spec) and ``removed`` with its saved value for one only ``saved`` has. A
    missing key and a null are both unset: an engine's new setting left at null was not set either way. In
    ``saved``'s order, added keys after."""
    for key, value in saved.items():
        if key not in now:
            if value is not None:
                yield f"{prefix}{key} removed (was {json.dumps(value)})"
        elif now[key] == value:
            continue
        elif isinstance(value, dict) and isinstance(now[key], dict):
            yield from _changed_values(value, now[key], f"{prefix}{key}.")
        else:
            yield f"{prefix}{key} {json.dumps(value)} -> {json.dumps(now[key])}"
    for key, value in now.items():
        if key not in saved and value is not None:
            yield f"{prefix}{key} added: {json.dumps(value)}"


def settings_changes(meta: dict[str, Any], config: TrainConfig) -> list[str]:
    """One line per setting that a resume of the checkpoint with ``meta`` changes under ``config`` (its
    ``recorded_settings``, a setting only one of the two records has included, and the contents of its data files
    other than the training one, which a resume refuses to change: ``changed_training_file_problem``), saved value
    -> new value. Nothing is compared with a record that is missing or empty (checkpoints of engines before
    ``recorded_settings``, a trainer given none): every setting would read as added or removed."""
    saved_settings = meta.get("settings") or {}
    changes = list(_changed_values(saved_settings, config.recorded_settings)) if (
        saved_settings and config.recorded_settings) else []
    for key, saved in (meta.get("data_files") or {}).items():
        now = config.data_files.get(key)
        if key != TRAINING_FILE and now and saved and now["sha256"] != saved["sha256"]:
            changes.append(f"{key} {now['path']} changed since that step (sha256 {saved['sha256'][:12]} -> "
                           f"{now['sha256'][:12]}): eval scores from here on are over other rows")
    return [f"resumed from step {meta['step']} with a changed setting: {change}" for change in changes]


# --------------------------------------------------------------------------------------------
# The trainer


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The loop's knobs (from the spec's ``train`` and ``optim`` sections)."""

    total_steps: int
    batch_size: int
    grad_accum: int = 1
    max_seq_len: int
    packing: bool = False
    eval_every: int | None = None
    save_every: int | None = None
    keep_last: int = 3
    seed: int = 0
    optim: OptimSpec = field(default_factory=OptimSpec)
    # What the checkpoints belong to (e.g. task, model and PEFT settings); resuming checks it.
    identity: str = ""
    # Identities earlier engines wrote for this same job (``jaxengine.job.earlier_job_identities``).
    identity_aliases: tuple[str, ...] = ()
    # Settings, by dotted spec key, that shape the saved state or the order of the data
    # (``jaxengine.job.resume_settings``): saved with each checkpoint, a resume under other values is refused.
    resume_settings: dict[str, Any] = field(default_factory=dict)
    # Every other setting of the job, nested as in its spec (``jaxengine.job.recorded_settings``), and each data file
    # by its spec key with its path and the sha256 of its contents (``jaxengine.job.data_files``): saved with each
    # checkpoint, a resume under other values goes on and reports each change (``settings_changes``), except a
    # training file with other contents, which it refuses (``changed_training_file_problem``).
    recorded_settings: dict[str, Any] = field(default_factory=dict)
    data_files: dict[str, dict[str, str]] = field(default_factory=dict)
    # The evaluation metric that ranks checkpoints; the best one is always saved and never pruned.
    best_metric: str = "eval/loss"
    best_higher_is_better: bool = False


@dataclass(frozen=True, kw_only=True)
class Progress:
    """What the progress callback receives after every step."""

    step: int
    total_steps: int
    metrics: Metrics
    elapsed_seconds: float
    tokens_seen: int  # over the whole run, earlier attempts included


@dataclass(frozen=True, kw_only=True)
class EvalProgress:
    """What the evaluation callback receives while a step evaluates, before that step's ``Progress``: at
    its start and after each eval batch (``batches_done`` of ``batches``), then once more with
    ``generating`` before the eval hook (greedy samples, RL eval rollouts) runs. An evaluation over a
    large eval set takes a minute and more, and a page that heard nothing meanwhile looked stuck."""

    step: int
    batches_done: int
    batches: int
    generating: bool = False


class Trainer:
    """Trains ``model`` on ``task`` (see module notes). ``trainable`` picks the trained variables.

    The trainer takes over the model's trainable and RNG arrays and donates them to each step, so
    after ``fit`` the ``model`` object passed in must not be run: ``current_model()`` is the trained
    one. ``eval_hook(model, step) -> metrics`` runs after each evaluation (e.g. greedy samples) and
    may return extra metrics to log.

    Batches come from ``train_examples`` (shuffled, resumable, ``grad_accum`` micro-batches per
    step), or, for tasks that make their own data each step (e.g. RL rollouts with the current
    model), from ``batch_source(trainer) -> batches`` with the [A, ...] leading accumulation axis.
    ``guard(record) -> reason | None`` sees each step's logged metrics; a reason ends the run with
    status ``failed`` and that message, keeping the checkpoints already saved.

    ``placement`` (a ``jaxengine.sharding.MeshPlacement``) makes the arrays global over the
    devices of every process of a multi-host job; then only process 0 writes the run directory's
    files and runs ``eval_hook``, while checkpoints are written by all processes together.
    """

    def __init__(
        self,
        *,
        model: nnx.Module,
        task: Any,
        config: TrainConfig,
        train_examples: list | None = None,
        eval_examples: list | None = None,
        pad_id: int,
        run_dir: str | Path,
        trainable: Any = nnx.Param,
        eval_hook: Callable[[nnx.Module, int], Metrics] | None = None,
        batch_source: Callable[[Trainer], Any] | None = None,
        guard: Callable[[Metrics], str | None] | None = None,
        placement: Any = None,
        mesh: Mesh | None = None,
    ):
        if (train_examples is None) == (batch_source is None):
            raise ValueError("give the trainer exactly one of train_examples and batch_source")
        if mesh is not None:
            if placement is not None:
                raise ValueError("give the trainer a mesh or a placement, not both")
            placement = MeshPlacement(mesh)
        self.task = task
        self.config = config
        self.train_examples = train_examples
        self.batch_source = batch_source
        self.guard = guard
        self.eval_examples = eval_examples or []
        self.pad_id = pad_id
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.eval_hook = eval_hook
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.samples_path = self.run_dir / "samples.jsonl"

        model.train()
        self.graphdef, params, rng_state, self.frozen = nnx.split(model, trainable, nnx.RngState, ...)
        model.eval()
        self.eval_graphdef = nnx.graphdef(model)
        model.train()
        self.placement = placement
        self.writes_files = jax.process_index() == 0
        if placement is not None:
            params, rng_state, self.frozen = placement.put_state((params, rng_state, self.frozen))
        self.params, self.rng_state = params, rng_state
        self.opt_state = make_optimizer(config.optim, total_steps=config.total_steps).init(params)
        self.loss_state = self._placed_loss_state(initial_loss_state(task))
        self._train_step, self._eval_step = train_step, eval_step
        if isinstance(placement, MeshPlacement):
            self.opt_state = placement.put_optimizer_state(self.opt_state, params)
            self._train_step, self._eval_step = sharded_steps(params, self.opt_state, rng_state, self.loss_state,
                                                              self.frozen)
        self.step = 0
        self.data_position = pipeline.DataPosition()
        self.tokens_seen = 0
        self.resume_changes: list[str] = []  # what the last resume changed (``settings_changes``)

    # ---- counts -------------------------------------------------------------------------

    @property
    def trainable_parameter_count(self) -> int:
        return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(self.params))

    # ---- evaluation -----------------------------------------------------------------------

    def current_model(self, *, train: bool = False) -> nnx.Module:
        """A fresh module over the current weights (eval mode unless ``train``); editing it, e.g. merging
        LoRA, leaves the trainer's state as it is."""
        state = (self.params, self.rng_state, self.frozen)
        if self.placement is not None:
            state = self.placement.to_local(state)
        return nnx.merge(self.graphdef if train else self.eval_graphdef, *state)

    def evaluate(self, *, on_batch: Callable[[int, int], None] | None = None) -> Metrics:
        """Weighted means of the task's metrics over the whole eval set, as ``eval/<name>``;
        ``on_batch(done, batches)`` is called before the first batch and after each, when there is one."""
        totals: dict[str, float] = {}
        weight_total = 0.0
        batches = -(-len(self.eval_examples) // self.config.batch_size)
        if on_batch is not None and batches:  # RL tasks evaluate in their hook alone
            on_batch(0, batches)
        for done, batch in enumerate(pipeline.eval_batches(self.eval_examples, batch_size=self.config.batch_size,
                                                           max_seq_len=self.config.max_seq_len, pad_id=self.pad_id),
                                     start=1):
            task = self._task_for_batches(batch)
            if self.placement is not None:
                batch = self.placement.put_replicated(batch)
            weighted, weight = self._eval_step(self.params, self.rng_state, self.loss_state, self.frozen, batch,
                                               graphdef=self.eval_graphdef, task=task)
            for name, value in weighted.items():
                totals[name] = totals.get(name, 0.0) + float(value)
            weight_total += float(weight)
            if on_batch is not None:
                on_batch(done, batches)
        return {f"eval/{name}": value / max(weight_total, 1.0) for name, value in totals.items()}

    # ---- checkpoints ------------------------------------------------------------------------

    def _placed_loss_state(self, loss_state: Any) -> Any:
        """``loss_state`` (host or device arrays) as the step takes it: replicated over the mesh, if any."""
        if self.placement is not None:
            return self.placement.put_replicated(loss_state)
        return jax.tree.map(jnp.asarray, loss_state)

    def _state_leaves(self) -> list[jax.Array]:
        return jax.tree.leaves((self.params, self.opt_state, self.rng_state))

    def _load_state_leaves(self, leaves: list[jax.Array]) -> None:
        treedef = jax.tree.structure((self.params, self.opt_state, self.rng_state))
        self.params, self.opt_state, self.rng_state = jax.tree.unflatten(treedef, leaves)

    def save_checkpoint(self, checkpoints: Checkpoints, *, eval_score: float | None) -> None:
        meta = {"step": self.step, "epoch": self.data_position.epoch, "cursor": self.data_position.cursor,
                "tokens_seen": self.tokens_seen, "seed": self.config.seed, "identity": self.config.identity,
                "eval_metric": self.config.best_metric, "eval_score": eval_score,
                "resume_settings": self.config.resume_settings, "settings": self.config.recorded_settings,
                "data_files": self.config.data_files}
        # A batch source that holds data across steps (RL rollouts reused for num_iterations updates)
        # saves it with the checkpoint, so a run resumed from it trains on the same data.
        extra = self.batch_source.arrays_to_checkpoint(self.step) if hasattr(
            self.batch_source, "arrays_to_checkpoint") else {}
        # Replicated, so every process reads the whole value of each array, even over several hosts.
        extra = {**extra, **{name: np.asarray(leaf) for name, leaf in _loss_state_arrays(self.loss_state).items()}}
        checkpoints.save(self.step, self._state_leaves(), meta, extra=extra)

    def resume(self, checkpoints: Checkpoints) -> bool:
        """Restore the latest checkpoint if there is one; returns whether it did."""
        steps = checkpoints.steps()
        if not steps:
            return False
        meta = checkpoints.meta(steps[-1])
        if meta.get("identity") not in (self.config.identity, *self.config.identity_aliases):
            raise TrainingError(f"{checkpoints.manager.directory}: these checkpoints belong to another job "
                                f"({meta.get('identity')}), not this one ({self.config.identity}); "
                                "use a new output_dir")
        # Checkpoints of engines before resume_settings have none: spec.yaml's are compared before the job starts.
        if problem := changed_settings_problem(meta.get("resume_settings") or {}, self.config.resume_settings):
            raise TrainingError(f"{checkpoints.manager.directory}: checkpoints {problem}")
        if problem := changed_training_file_problem(meta.get("data_files") or {}, self.config.data_files,
                                                    step=steps[-1]):
            raise TrainingError(f"{checkpoints.manager.directory}: {problem}")
        leaves, meta = checkpoints.restore(steps[-1], self._state_leaves())
        if meta.get("seed") != self.config.seed:
            raise TrainingError(f"{checkpoints.manager.directory}: checkpoints were written with seed {meta.get('seed')}, "
                                f"the spec says {self.config.seed}; use a new output_dir or the same seed")
        self.resume_changes = settings_changes(meta, self.config)
        self._load_state_leaves(leaves)
        self.step = int(meta["step"])
        extra = checkpoints.extra(steps[-1])
        saved_loss_state = {name: extra.pop(name) for name in list(extra) if name.startswith(LOSS_STATE_PREFIX)}
        self.loss_state = self._placed_loss_state(_restored_loss_state(initial_loss_state(self.task), saved_loss_state))
        if hasattr(self.batch_source, "restore_from_checkpoint"):
            self.batch_source.restore_from_checkpoint(self.step, extra)
        self.data_position = pipeline.DataPosition(epoch=int(meta["epoch"]), cursor=int(meta["cursor"]))
        if "tokens_seen" in meta:
            self.tokens_seen = int(meta["tokens_seen"])
        else:
            # Written by an engine that restarted the count at 0 on resume. Going on from the count it
            # logged at this step (rather than from 0) keeps metrics.jsonl's count one that only drops
            # where that engine restarted it, and is the whole run's count unless it had resumed before.
            self.tokens_seen = _logged_tokens(self.metrics_path, at_or_before=self.step)
        return True

    def _best_saved_score(self, checkpoints: Checkpoints) -> float | None:
        """The best score among the run's checkpoints (a resumed run must beat it to save a new best)."""
        step = checkpoints.best_step()
        return _eval_score(checkpoints.meta(step)) if step is not None else None

    # ---- the loop -------------------------------------------------------------------------

    def _task_for_batches(self, batches: Any) -> Any:
        """The task as these host batches' step needs it: a task with ``for_batches`` (language modelling)
        takes static shapes from them (its count of loss positions); every process holds the same
        batches, so all compile the same step."""
        for_batches = getattr(self.task, "for_batches", None)
        return self.task if for_batches is None else for_batches(batches)

    def _next_batches(self, stream: pipeline.BatchStream):
        batches = [stream.next_batch() for _ in range(self.config.grad_accum)]
        return pipeline.stack_batches(batches, pad_id=self.pad_id)

    def fit(
        self,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        progress_bar: bool | None = None,
        on_evaluation: Callable[[EvalProgress], None] | None = None,
        on_log: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Train to ``total_steps`` (resuming from the run's checkpoints); returns the run summary.
        ``on_progress`` hears of every step, ``on_evaluation`` of an evaluation as it goes, ``on_log`` (process 0)
        of each line for the run's log: a resume's changed settings (``settings_changes``, also the summary's
        ``resumed_with_changes``).

        ``should_stop`` is checked between steps; when it returns True the run saves a checkpoint and
        ends with status ``cancelled``. A non-finite loss ends it with status ``failed`` and keeps the
        last good checkpoint.
        """
        if isinstance(self.placement, MeshPlacement) and jax.sharding.get_abstract_mesh().empty:
            # Everything the run traces (steps, rollouts, eval hooks) sees the mesh, so that the models'
            # activation and KV-cache constraints apply.
            with jax.set_mesh(self.placement.mesh):
                return self.fit(should_stop=should_stop, on_progress=on_progress, progress_bar=progress_bar,
                                on_evaluation=on_evaluation, on_log=on_log)
        config = self.config
        checkpoints = Checkpoints(self.run_dir / "checkpoints", keep_last=config.keep_last,
                                  higher_is_better=config.best_higher_is_better)
        resumed_from = self.step if self.resume(checkpoints) else None
        if self.writes_files and on_log is not None:
            for line in self.resume_changes:
                on_log(line)
        if self.writes_files and resumed_from is not None:
            _truncate_jsonl(self.metrics_path, after_step=self.step)
            _truncate_jsonl(self.samples_path, after_step=self.step)
        elif self.writes_files and self.metrics_path.exists():
            self.metrics_path.unlink()
        stream = None if self.batch_source is not None else pipeline.BatchStream(
            examples=self.train_examples, batch_size=config.batch_size, max_seq_len=config.max_seq_len,
            pad_id=self.pad_id, seed=config.seed, packing=config.packing, position=self.data_position)
        bar = _progress_bar(config.total_steps, self.step) if (progress_bar if progress_bar is not None
                                                                 else sys.stderr.isatty()) else None
        status, message = "succeeded", None
        started = time.perf_counter()
        last_metrics: Metrics = {}
        best_eval = self._best_saved_score(checkpoints)
        try:
            while self.step < config.total_steps:
                stop = should_stop is not None and should_stop()
                if self.placement is not None:
                    stop = self.placement.agree(stop)  # every process stops at the same step
                if stop:
                    status, message = "cancelled", f"cancelled at step {self.step}"
                    if self.step not in checkpoints.steps():  # not just saved by save_every (orbax refuses twice)
                        self.save_checkpoint(checkpoints, eval_score=None)
                    break
                batches = self.batch_source(self) if stream is None else self._next_batches(stream)
                step_started = time.perf_counter()
                step_batches = batches if self.placement is None else self.placement.put_batches(batches)
                self.params, self.opt_state, self.rng_state, self.loss_state, metrics = self._train_step(
                    self.params, self.opt_state, self.rng_state, self.loss_state, self.frozen, step_batches,
                    np.int32(self.step),
                    graphdef=self.graphdef, task=self._task_for_batches(batches), optim=config.optim,
                    total_steps=config.total_steps)
                metrics = {name: float(value) for name, value in metrics.items()}
                seconds = time.perf_counter() - step_started
                self.step += 1
                if stream is not None:
                    self.data_position = stream.position
                if not math.isfinite(metrics["loss"]):
                    status = "failed"
                    message = (f"loss is {metrics['loss']} at step {self.step}; stopped, keeping the last good "
                               "checkpoint. Lower optim.learning_rate, set optim.max_grad_norm, or use float32.")
                    break
                if not math.isfinite(metrics["grad_norm"]):
                    # This step's update already made the weights non-finite: nothing of it may be saved.
                    status = "failed"
                    message = (f"grad_norm is {metrics['grad_norm']} at step {self.step} (the loss was finite); "
                               "stopped, keeping the last good checkpoint. Lower optim.learning_rate, or set train.compute_dtype: float32.")
                    break
                tokens = sum(int(np.sum(np.asarray(part.segment_ids) > 0))
                             for part in jax.tree.leaves(batches, is_leaf=_is_token_batch) if _is_token_batch(part))
                self.tokens_seen += tokens
                record = {"step": self.step, **metrics, "tokens_per_second": tokens / max(seconds, 1e-9),
                          "tokens": self.tokens_seen, **memory_metrics(jax.local_devices())}
                record.pop("loss_weight")
                if stream is not None:
                    # Fractional: the rows read over the rows (steps × batch / rows, as W&B users read it). The
                    # epochs completed alone were 0 at every step of a run that max_steps ends within its first.
                    record["epoch"] = self.data_position.epoch + self.data_position.cursor / len(stream.examples)
                else:
                    # Tasks that make their data each step (RL) time making it themselves; this is the update.
                    record["time/update"] = seconds
                    # They read no stream: their source says how far through its prompts it has drawn.
                    if hasattr(self.batch_source, "epoch_after"):
                        record["epoch"] = self.batch_source.epoch_after(self.step)
                at_end = self.step == config.total_steps
                evaluates = self.eval_examples or self.eval_hook is not None
                eval_score, new_best = None, False
                if evaluates and ((config.eval_every and self.step % config.eval_every == 0) or at_end):
                    evaluated = self.step
                    evaluation = self.evaluate(on_batch=None if on_evaluation is None else (
                        lambda done, batches: on_evaluation(EvalProgress(step=evaluated, batches_done=done,
                                                                         batches=batches))))
                    if self.eval_hook is not None:
                        if on_evaluation is not None:
                            batches = -(-len(self.eval_examples) // config.batch_size)
                            on_evaluation(EvalProgress(step=evaluated, batches_done=batches, batches=batches,
                                                       generating=True))
                        current = self.current_model()  # on every process: gathering may be collective
                        if self.writes_files:
                            # Several processes: process 0 alone runs the hook, on its local copy and
                            # outside the job's mesh (whose devices it does not all hold).
                            alone = jax.set_mesh(None) if jax.process_count() > 1 else contextlib.nullcontext()
                            with alone:
                                evaluation.update(self.eval_hook(current, self.step))
                    eval_score = evaluation.get(config.best_metric)
                    if eval_score is not None and is_better(eval_score, best_eval,
                                                            higher_is_better=config.best_higher_is_better):
                        best_eval, new_best = eval_score, True
                    if self.placement is not None:
                        new_best = self.placement.agree(new_best)  # eval_hook scores on process 0 alone
                    record.update(evaluation)
                if self.writes_files:
                    _append_jsonl(self.metrics_path, record)
                last_metrics = record
                # A new best is saved even between save_every steps, so a later stop still has it.
                if (config.save_every and self.step % config.save_every == 0) or at_end or new_best:
                    self.save_checkpoint(checkpoints, eval_score=eval_score)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{metrics['loss']:.4f}")
                if on_progress is not None:
                    on_progress(Progress(step=self.step, total_steps=config.total_steps, metrics=record,
                                         elapsed_seconds=time.perf_counter() - started,
                                         tokens_seen=self.tokens_seen))
                if self.guard is not None and (reason := self.guard(record)) is not None:
                    status, message = "failed", f"stopped by the guard at step {self.step}: {reason}"
                    break
        except TrainingError as error:
            # A step that cannot be made (a reward function failing on a sample) fails the run like a
            # non-finite loss: the summary says why, and the checkpoints saved so far are kept.
            kept = checkpoints.steps()
            status, message = "failed", f"{error}; stopped" + (f", keeping checkpoint {kept[-1]}" if kept else "")
        finally:
            if bar is not None:
                bar.close()
            best_step = checkpoints.best_step()
            best_score = _eval_score(checkpoints.meta(best_step)) if best_step is not None else None
            checkpoints.close()
        return {
            "status": status,
            "message": message,
            "step": self.step,
            "total_steps": config.total_steps,
            "resumed_from_step": resumed_from,
            "resumed_with_changes": self.resume_changes,
            "final_metrics": last_metrics,
            "best_checkpoint": {"metric": config.best_metric, "step": best_step, "value": best_score},
            "best_checkpoint_step": best_step,
            "train_seconds": time.perf_counter() - started,
            "tokens_seen": self.tokens_seen,
            "trainable_parameters": self.trainable_parameter_count,
        }


def restore_trained_model(model: nnx.Module, *, trainable: Any, optim: OptimSpec, checkpoint_dir: Path,
                          step: int | None = None) -> tuple[nnx.Module, dict[str, Any]]:
    """``model`` (eval mode) with the trainable weights of checkpoint ``step`` (default: the latest), and its meta."""
    model.eval()
    graphdef, params, rng_state, frozen = nnx.split(model, trainable, nnx.RngState, ...)
    # The optimizer state's structure (not its values) is needed to read the flat checkpoint.
    opt_state = make_optimizer(optim, total_steps=1).init(params)
    checkpoints = Checkpoints(Path(checkpoint_dir), keep_last=1)
    try:
        steps = checkpoints.steps()
        if not steps:
            raise TrainingError(f"{checkpoint_dir}: no checkpoints to restore")
        if step is not None and step not in steps:
            raise TrainingError(f"{checkpoint_dir}: no checkpoint for step {step}; there are {steps}")
        leaves, meta = checkpoints.restore(steps[-1] if step is None else step,
                                           jax.tree.leaves((params, opt_state, rng_state)))
    finally:
        checkpoints.close()
    params, _, rng_state = jax.tree.unflatten(jax.tree.structure((params, opt_state, rng_state)), leaves)
    return nnx.merge(graphdef, params, rng_state, frozen), meta


def _is_token_batch(node: Any) -> bool:
    return isinstance(node, pipeline.TokenBatch)


def _progress_bar(total: int, initial: int):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)
