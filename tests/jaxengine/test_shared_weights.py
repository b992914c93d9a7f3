"""Rollout and update share one copy of the policy's weights (issue 9, tunix-style): the sampler of every GRPO and PPO
rollout reads the trainer's own arrays, after updates too, LoRA's base and adapters unmerged; nothing holds a second
copy of the model while it generates (a KL reference only where its coefficient is above 0); and a QLoRA model's
generation keeps its kernels quantized across the decode loop, rebuilding one layer's at a time."""
import gc
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxengine import sampler as sampler_module
from jaxengine.grpo import make_grpo_trainer
from jaxengine.job import build_job_model
from jaxengine.models import build_model, preset
from jaxengine.peft import lora, quant
from jaxengine.ppo import make_ppo_trainer
from jaxengine.sampler import Sampler, SamplingParams
from jaxengine.spec import parse_spec
from jaxengine.tokenizer import load_tokenizer
from tests.jaxengine.test_grpo import grpo_spec
from tests.jaxengine.test_ppo import ppo_mapping


def live_bytes() -> int:
    """Bytes of every jax array alive in the process (garbage collected first)."""
    gc.collect()
    return sum(array.nbytes for array in jax.live_arrays())


def tree_bytes(tree) -> int:
    return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


def buffers(tree) -> set[int]:
    """The device buffers of a pytree's arrays (PRNG keys aside: they are not weights)."""
    return {leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(tree)
            if not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)}


@dataclass(frozen=True)
class RolloutView:
    """What a rollout's sampler read, taken as it started generating."""

    sampler_buffers: set[int]
    trainer_buffers: set[int]  # the trainer's params, frozen part and RNG state at that moment
    lora_leaves: int  # adapter arrays the sampler reads (LoRA unmerged: the base kernels beside them)
    merged_adapters: int
    live_bytes: int  # every live array's bytes, less those alive before the job model was built


@pytest.fixture
def rollout_views(monkeypatch):
    """Records a ``RolloutView`` each time a sampler starts generating from ``views.trainer``'s model."""

    class Views(list):
        trainer = None
        baseline = 0

    views = Views()
    original = sampler_module.Sampler._current_state

    def recording(sampler):
        state = original(sampler)
        trainer = views.trainer
        adapters = [module for _, module in nnx.iter_modules(sampler.model) if isinstance(module, lora.LoraAdapter)]
        views.append(RolloutView(
            sampler_buffers=buffers(state),
            trainer_buffers=buffers((trainer.params, trainer.frozen, trainer.rng_state)),
            lora_leaves=len(jax.tree.leaves(nnx.state(sampler.model, lora.LoraParam))),
            merged_adapters=sum(adapter.merged for adapter in adapters),
            live_bytes=live_bytes() - views.baseline))
        return state

    monkeypatch.setattr(sampler_module.Sampler, "_current_state", recording)
    return views


def rl_spec(task: str, demo_dir, run_dir, *, peft: str, coefficient: float = 0.0):
    """A two-step GRPO or PPO spec on the micro demo: the second rollout comes after an update."""
    train = {"max_steps": 2, "batch_size": 2, "seed": 1}
    peft_section = {"method": peft, **({"rank": 4} if peft != "none" else {})}
    if task == "grpo":
        return grpo_spec(demo_dir, run_dir, grpo={"num_generations": 4, "beta": coefficient}, train=train,
                         peft=peft_section)
    mapping = ppo_mapping(demo_dir, run_dir, train=train, peft=peft_section)
    mapping["ppo"]["kl_coef"] = coefficient
    return parse_spec(mapping)


def trained(task: str, spec, run_dir, views):
    """Builds the job (after taking the live-array baseline) and runs its two steps; returns the trainer."""
    views.baseline = live_bytes()
    job_model = build_job_model(spec)
    trainer, _ = (make_grpo_trainer if task == "grpo" else make_ppo_trainer)(spec, job_model, run_dir)
    del job_model  # the trainer holds what the run needs; a test's own reference must not count
    views.trainer = trainer
    assert trainer.fit(progress_bar=False)["status"] == "succeeded"
    return trainer


@pytest.mark.parametrize("task", ["grpo", "ppo"])
@pytest.mark.parametrize("peft", ["none", "lora"])
def test_rollouts_read_the_trainers_own_weights_after_every_update(task, peft, demo_dir, tmp_path, rollout_views):
    trainer = trained(task, rl_spec(task, demo_dir, tmp_path / "run", peft=peft), tmp_path / "run", rollout_views)
    weights = tree_bytes((trainer.params, trainer.frozen))
    optimizer = tree_bytes(trainer.opt_state)
    assert len(rollout_views) == 2  # step 1's rollout, and step 2's from the weights step 1 updated
    for view in rollout_views:
        # Every array the sampler reads is one of the trainer's buffers: no copy, merged kernel or stale model.
        assert view.sampler_buffers and view.sampler_buffers <= view.trainer_buffers
        # Nothing else holds the model meanwhile: the weights once, the optimizer state, small change.
        assert weights + optimizer <= view.live_bytes < 1.5 * weights + optimizer, (view.live_bytes, weights,
                                                                                     optimizer)
    if peft == "lora":
        # The sampler reads the base kernels and the adapters beside them, unmerged.
        assert all(view.lora_leaves > 0 and view.merged_adapters == 0 for view in rollout_views)


@pytest.mark.parametrize("task", ["grpo", "ppo"])
@pytest.mark.parametrize("coefficient, kept_copies", [(0.0, 0), (0.1, 1)])
def test_a_full_fine_tuning_kl_reference_is_one_copy_kept_only_when_its_coefficient_is_above_zero(
        task, coefficient, kept_copies, demo_dir, tmp_path, rollout_views):
    spec = rl_spec(task, demo_dir, tmp_path / "run", peft="none", coefficient=coefficient)
    trainer = trained(task, spec, tmp_path / "run", rollout_views)
    assert (trainer.batch_source.reference is None) == (kept_copies == 0)
    weights = tree_bytes(trainer.params)
    held = (1 + kept_copies) * weights + tree_bytes(trainer.opt_state)
    assert all(held <= view.live_bytes < held + 0.5 * weights for view in rollout_views), (
        [view.live_bytes for view in rollout_views], weights, held)


def generation_temp_bytes(sampler: Sampler, monkeypatch) -> int:
    """The scratch memory XLA assigned the program of ``sampler``'s generation (one prompt, 4 tokens)."""
    prompts, params = [[2, 5, 9]], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0)
    sampler.generate(prompts, params)
    compiled = sampler._compiled  # the structure's program holder, shared: monkeypatch puts it back
    function, measured = compiled.function, []

    def measuring(*args, **kwargs):
        measured.append(function.lower(*args, **kwargs).compile().memory_analysis().temp_size_in_bytes)
        return function(*args, **kwargs)

    monkeypatch.setattr(compiled, "function", measuring)
    sampler.generate(prompts, params)
    return measured[0]


def test_a_quantized_model_generates_rebuilding_one_layers_kernels_at_a_time(demo_dir, monkeypatch):
    """QLoRA's codes are dequantized where a matmul reads them. XLA hoisted every layer's dequantization out
    of the decode loop (a full-precision model held for the whole generation beside the codes), and, that
    barred, still rebuilt every layer's kernels at the start of the prefill and of each step: the program's
    scratch over the unquantized model's was 0.9 times the whole model's dequantized kernels. Each kernel now
    waits for its projection's input (``layers.Linear``): at 6 layers, the scratch over the unquantized
    model's stays under one layer's dequantized kernels. Measured 0.28 of a layer at 2 and at 12 layers (a
    layer's projections are rebuilt a few at a time); the bound leaves XLA room to hold one layer whole, and
    fails at two layers held, let alone six."""
    tokenizer = load_tokenizer(demo_dir / "model")
    layers = 6
    config = preset("tiny-llama").replace(vocab_size=tokenizer.vocab_size, num_layers=layers,
                                          layer_types=("full_attention",) * layers)
    temp_bytes, dequantized_bytes = {}, 0
    for quantized in (False, True):
        model = build_model(config, rngs=nnx.Rngs(0))
        if quantized:
            quant.quantize_model(model, bits=4, group_size=32)
            dequantized_bytes = sum(4 * module.codes[...].size * 2 for _, module in nnx.iter_modules(model)
                                    if isinstance(module, quant.QuantizedKernel))
        lora.apply_lora(model, targets=lora.PROJECTIONS, rank=4, alpha=8, seed=0)
        model.eval()
        temp_bytes[quantized] = generation_temp_bytes(Sampler(model, tokenizer), monkeypatch)
    layer_bytes = dequantized_bytes / layers
    assert layer_bytes > 0
    assert temp_bytes[True] - temp_bytes[False] < layer_bytes, (temp_bytes, layer_bytes)
