"""An estimate of a training job's memory per device, from the model's facts and the job spec (jax-free).

Design note. It is a guide, not a measurement: it counts what dominates and says what it leaves out.

- Weights: every parameter in ``train.param_dtype``; under QLoRA the layers' projections at
  ``peft.quant_bits`` plus one float32 scale per ``peft.group_size`` weights. LoRA adapters are float32.
- Gradients and AdamW's two moments: one copy and two copies of the trained parameters, in their dtype.
- Weights, gradients and optimizer state are sharded over ``parallel.fsdp`` × ``parallel.tensor``.
- Activations kept for the backward pass (Korthikanti et al., 2022, for 16-bit compute): per layer and
  row, ``T·(34·D + 5·H·T)`` bytes, with ``T`` the sequence length, ``D`` the width and ``H`` the heads;
  with ``train.remat`` only each layer's input (``2·T·D``) plus one layer's whole set. float32 compute
  doubles them. Plus the output logits, ``T·V·4`` bytes a row up to ``train.logits_memory_mb`` (the
  trainer computes larger ones in chunks). A micro-batch has ``train.batch_size`` rows, twice that for
  preference pairs (reward, dpo) and ``× grpo.num_generations`` for grpo, split over ``parallel.data`` ×
  ``parallel.fsdp``.
- RL (grpo, ppo) also holds the sampler's KV cache: per row, ``2·L·KV·head_dim·T`` values in the compute
  dtype.
- PPO also trains its value head (``width + 1`` float32 weights, under LoRA too, replicated: weights,
  gradients and AdamW's moments), and with ``ppo.reward_model`` holds that model whole on one device: its
  parameters in float32 (as ``reward_scoring`` loads it, unsharded) plus its ``width`` float32 score head.
  The reward model's scoring activations (inference only, a few rows) are not counted.
- The KL reference of grpo (``grpo.beta`` > 0) and ppo (``ppo.kl_coef`` > 0), ``jaxengine.grpo.reference_weights``:
  under full fine-tuning a frozen copy of the starting weights, held for the whole run; under LoRA and QLoRA
  the base with the adapters as zeros, so only zeros of the adapters (and of PPO's value head), made for each
  rollout's reference pass. Either way one more copy of the trained parameters, sharded as they are (PPO's
  value head replicated). dpo holds none: its reference log-probs are computed once before training.
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxengine.spec import JobSpec, ParallelSpec

GIB = 1024**3
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    """What the estimate reads of a model: its parameter count and the shapes of its config.json."""

    parameter_count: int
    layers: int
    width: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocabulary: int

    @classmethod
    def from_config(cls, *, parameter_count: int, config: dict) -> ModelFacts | None:
        """From a Hugging Face config.json's keys; None when one it needs is missing."""
        try:
            width, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            return cls(parameter_count=parameter_count, layers=int(config["num_hidden_layers"]), width=width,
                       intermediate=int(config["intermediate_size"]), heads=heads,
                       kv_heads=int(config.get("num_key_value_heads") or heads),
                       head_dim=int(config.get("head_dim") or width // heads), vocabulary=int(config["vocab_size"]))
        except (KeyError, TypeError, ValueError):
            return None

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        query, key_value = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q_proj": (self.width, query), "k_proj": (self.width, key_value), "v_proj": (self.width, key_value),
                "o_proj": (query, self.width), "gate_proj": (self.width, self.intermediate),
                "up_proj": (self.width, self.intermediate), "down_proj": (self.intermediate, self.width)}


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Bytes per device, by part."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    kv_cache: int
    reward_model: int = 0
    reference: int = 0  # the KL reference's trained parameters (see the module notes)

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.activations + self.kv_cache + self.reward_model
                + self.reference)

    def summary(self) -> str:
        """``≈ 3.2 GiB per device for weights + optimizer + activations (weights 1 GiB, ...)``."""
        parts = [("weights", self.weights), ("gradients", self.gradients), ("optimizer state", self.optimizer),
                 ("activations", self.activations)] + ([("KV cache", self.kv_cache)] if self.kv_cache else []) \
            + ([("reward model", self.reward_model)] if self.reward_model else []) \
            + ([("KL reference", self.reference)] if self.reference else [])
        return (f"≈ {byte_size(self.total)} per device for weights + optimizer + activations ("
                + ", ".join(f"{name} {byte_size(value)}" for name, value in parts) + ")")


_UNITS = (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024))


def byte_size(value: int) -> str:
    """``value`` bytes in the largest unit (GiB, MiB, KiB) that holds at least one, to 3 significant digits and with
    its unit: ``1.5 GiB``, ``150 MiB``, ``39.1 KiB``, ``512 B``. Each figure carries its own, as a memory line puts
    figures of different sizes side by side (a tiny model's read "3.7e-05" in GiB)."""
    for unit, size in _UNITS:
        if value >= size:
            scaled = value / size
            return f"{scaled:.3g} {unit}" if scaled < 1000 else f"{scaled:.0f} {unit}"
    return f"{value} B"


def trained_bytes(*, facts: ModelFacts, spec: JobSpec) -> int:
    """The bytes of the parameters ``spec`` trains, unsharded: every parameter in ``train.param_dtype`` under full
    fine-tuning, the float32 LoRA adapters of ``peft.targets`` otherwise."""
    if spec.peft.method == "none":
        return facts.parameter_count * _DTYPE_BYTES.get(spec.train.param_dtype, 4)
    shapes = facts.projection_shapes()
    return facts.layers * sum(spec.peft.rank * sum(shapes[name]) for name in spec.peft.targets) * 4


@dataclass(frozen=True, kw_only=True)
class DiskEstimate:
    """The disk a run's output directory needs at its fullest, by part (see ``estimate_disk``)."""

    checkpoint: int  # one checkpoint
    checkpoints: int  # how many are on disk at once, at most
    export: int  # the final model

    @property
    def total(self) -> int:
        return self.checkpoint * self.checkpoints + self.export

    def summary(self) -> str:
        """``≈ 12.1 GiB: 4 checkpoints of 2.33 GiB and the exported model 2.79 GiB``."""
        return (f"≈ {byte_size(self.total)}: {self.checkpoints} checkpoints of {byte_size(self.checkpoint)} and "
                f"the exported model {byte_size(self.export)}")


def estimate_disk(*, facts: ModelFacts, spec: JobSpec, stored_bytes_per_parameter: int | None = None) -> DiskEstimate:
    """The disk training ``spec`` on a model of ``facts`` writes at its fullest.

    A checkpoint (``jaxengine.trainer.Checkpoints``) holds the trained parameters and AdamW's two moments, each as
    large as they (``trained_bytes``; PPO's value head is a rounding error). ``train.keep_last`` are kept, plus the best
    by eval when older (a run with ``data.eval``), plus the one being written before the oldest is pruned. The export
    (``jaxengine.job.export_trained``) is the whole merged model in the base's stored dtype when that is a 16-bit one
    (``stored_bytes_per_parameter``, from its config.json: 2), else ``train.param_dtype``; under LoRA and QLoRA plus
    the float32 adapter."""
    trained = trained_bytes(facts=facts, spec=spec)
    kept = spec.train.keep_last + 1 + (1 if spec.data.eval is not None else 0)
    per_parameter = stored_bytes_per_parameter or _DTYPE_BYTES.get(spec.train.param_dtype, 4)
    adapter = trained if spec.peft.method != "none" else 0
    return DiskEstimate(checkpoint=3 * trained, checkpoints=kept, export=facts.parameter_count * per_parameter + adapter)


def stored_bytes_per_parameter(config: dict) -> int | None:
    """2 when a config.json says its weights are stored in a 16-bit dtype (``jaxengine.checkpoint.hf
    .stored_half_dtype``'s reading, without jax), else None."""
    return 2 if (config.get("dtype") or config.get("torch_dtype")) in ("bfloat16", "float16") else None


def estimate_memory(*, facts: ModelFacts, spec: JobSpec, devices: int = 1,
                    reward_model: ModelFacts | None = None) -> MemoryEstimate:
    """The memory a device holds training ``spec`` on a model of ``facts`` (see the module notes); a spec
    without ``parallel`` puts its ``devices`` on fsdp, as the job does on accelerators. ``reward_model``:
    the facts of ``ppo.reward_model``'s model, counted when the spec scores with it."""
    train, peft = spec.train, spec.peft
    parallel = spec.parallel or ParallelSpec(fsdp=devices)
    param_bytes = _DTYPE_BYTES.get(train.param_dtype, 4)
    compute_bytes = 4 if train.compute_dtype == "float32" else 2
    shapes = facts.projection_shapes()
    trained = trained_bytes(facts=facts, spec=spec)
    if peft.method == "none":
        weights = facts.parameter_count * param_bytes
    elif peft.method == "qlora":
        projections = facts.layers * sum(inputs * outputs for inputs, outputs in shapes.values())
        quantized = projections * peft.quant_bits // 8 + projections // peft.group_size * 4
        weights = (facts.parameter_count - projections) * param_bytes + quantized + trained
    else:
        weights = facts.parameter_count * param_bytes + trained
    model_shards = parallel.fsdp * parallel.tensor
    rows = train.batch_size * {"dpo": 2, "reward": 2}.get(spec.task, 1)
    if spec.task == "grpo":
        rows *= spec.grpo.num_generations
    rows = -(-rows // (parallel.data * parallel.fsdp))
    length = spec.data.max_seq_len
    layer = length * (34 * facts.width + 5 * facts.heads * length) * compute_bytes // 2
    kept = facts.layers * 2 * length * facts.width * compute_bytes // 2 + layer if train.remat else facts.layers * layer
    logits = min(length * facts.vocabulary * 4 * rows, train.logits_memory_mb * 1024**2)
    # PPO's value head and the reward model are replicated, not sharded (see the module notes).
    value_head = (facts.width + 1) * 4 if spec.task == "ppo" else 0
    scorer = (reward_model.parameter_count * 4 + reward_model.width * 4
              if spec.task == "ppo" and spec.ppo.reward_model is not None and reward_model is not None else 0)
    kl_to_reference = ((spec.task == "grpo" and spec.grpo.beta > 0) or (spec.task == "ppo" and spec.ppo.kl_coef > 0))
    reference = trained // model_shards + value_head if kl_to_reference else 0
    kv_cache = (rows * 2 * facts.layers * facts.kv_heads * facts.head_dim * length * compute_bytes
                if spec.task in ("grpo", "ppo") else 0)
    return MemoryEstimate(weights=weights // model_shards + value_head, gradients=trained // model_shards + value_head,
                          optimizer=2 * trained // model_shards + 2 * value_head, activations=rows * kept + logits,
                          kv_cache=kv_cache, reward_model=scorer, reference=reference)
