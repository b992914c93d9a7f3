"""The memory estimate against numbers worked out by hand for a tiny model (see jaxengine/memory.py's notes)."""
import json
import types

import pytest

from jaxengine.memory import (DiskEstimate, MemoryEstimate, ModelFacts, byte_size, estimate_disk, estimate_memory,
                             stored_bytes_per_parameter)
from jaxengine.spec import parse_spec
from tests import factories

# 2 layers, width 16, MLP 32, 4 heads of 4 (2 key/value heads), vocabulary 64. A layer's projections:
# q 16×16, k 16×8, v 16×8, o 16×16, gate 16×32, up 16×32, down 32×16 = 2304 weights; 4608 in all.
FACTS = ModelFacts(parameter_count=10_000, layers=2, width=16, intermediate=32, heads=4, kv_heads=2, head_dim=4,
                   vocabulary=64)


def spec(**sections):
    base = {"task": "sft", "model": "m", "output_dir": "/tmp/out", "data": {"train": "t.jsonl", "max_seq_len": 8},
            "train": {"max_steps": 1, "batch_size": 2}}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values} if isinstance(values, dict) else values
    return parse_spec(base)


# Activations of one row and layer, 16-bit compute: T·(34·D + 5·H·T) = 8·(544 + 160) = 5632 bytes;
# two layers, two rows: 22528. Logits: 2 rows × 8 × 64 × 4 = 4096.
def test_full_fine_tuning():
    estimate = estimate_memory(facts=FACTS, spec=spec())
    assert estimate == MemoryEstimate(weights=40_000, gradients=40_000, optimizer=80_000, activations=26_624,
                                      kv_cache=0)
    assert estimate.total == 186_624


def test_lora_trains_only_its_adapters():
    # rank 2 on q (16+16) and v (16+8): 2·(2·32 + 2·24) = 224 float32 adapter weights = 896 bytes.
    estimate = estimate_memory(facts=FACTS, spec=spec(peft={"method": "lora", "rank": 2, "targets": ["q_proj", "v_proj"]}))
    assert (estimate.weights, estimate.gradients, estimate.optimizer) == (40_896, 896, 1_792)


def test_qlora_quantizes_the_projections():
    # 4608 projection weights at 4 bits = 2304 bytes, plus 4608 / 8 scales × 4 bytes = 2304; the other 5392
    # parameters in float32 = 21568; adapters 896.
    estimate = estimate_memory(facts=FACTS, spec=spec(peft={"method": "qlora", "rank": 2, "targets": ["q_proj", "v_proj"],
                                                            "quant_bits": 4, "group_size": 8}))
    assert estimate.weights == 21_568 + 4_608 + 896


def test_remat_keeps_each_layers_input_and_one_layer():
    # Per row: 2 layers × 2·8·16 = 512, plus one layer's 5632 = 6144; two rows 12288, plus logits 4096.
    assert estimate_memory(facts=FACTS, spec=spec(train={"remat": True})).activations == 16_384


def test_bfloat16_weights_halve_them_and_fsdp_shards_them_and_the_batch():
    estimate = estimate_memory(facts=FACTS, spec=spec(train={"param_dtype": "bfloat16"}, parallel={"fsdp": 2}))
    assert (estimate.weights, estimate.gradients, estimate.optimizer) == (10_000, 10_000, 20_000)
    assert estimate.activations == 11_264 + 2_048  # one row a device


def test_grpo_counts_every_generation_and_the_kv_cache():
    grpo = estimate_memory(facts=FACTS, spec=spec(task="grpo", data={"train": "p.jsonl", "max_seq_len": 8},
                                                  grpo={"num_generations": 2, "rewards": [{"name": "exact_match"}]}))
    # 2 prompts × 2 generations = 4 rows; KV: 4 rows × 2 (K, V) × 2 layers × 2 heads × 4 × 8 positions × 2 bytes.
    assert grpo.activations == 4 * 11_264 + 8_192 and grpo.kv_cache == 2_048


def test_dpo_rows_are_pairs():
    dpo = estimate_memory(facts=FACTS, spec=spec(task="dpo", data={"train": "p.jsonl", "max_seq_len": 8}))
    assert dpo.activations == 4 * 11_264 + 8_192


def test_the_summary_names_each_part():
    estimate = MemoryEstimate(weights=2 * 1024**3, gradients=1024**3, optimizer=2 * 1024**3,
                              activations=3 * 1024**3 // 2, kv_cache=0)
    assert estimate.summary() == ("≈ 6.5 GiB per device for weights + optimizer + activations (weights 2 GiB, "
                                  "gradients 1 GiB, optimizer state 2 GiB, activations 1.5 GiB)")


def test_a_size_reads_in_its_own_unit():
    """The launch form's memory line gave tiny figures as GiB with the unit only at the end ("weights 3.7e-05, ...
    GiB"): each figure now carries its own unit, the largest in which it is at least 1."""
    assert [byte_size(value) for value in (0, 512, 40_000, 150 * 1024**2, 1023 * 1024**2, 3 * 1024**3 // 2,
                                           200 * 1024**3, 3 * 1024**4)] == [
        "0 B", "512 B", "39.1 KiB", "150 MiB", "1023 MiB", "1.5 GiB", "200 GiB", "3072 GiB"]


def test_facts_come_from_a_config_json():
    config = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "intermediate_size": 32, "vocab_size": 64}
    assert ModelFacts.from_config(parameter_count=10_000, config=config) == FACTS
    assert ModelFacts.from_config(parameter_count=10_000, config={"hidden_size": 16}) is None


def test_ppo_counts_its_value_head_and_its_reward_model():
    """QA: PPO's estimate left out what PPO holds beyond the policy: the value head (width + 1 float32
    weights, trained under LoRA too, replicated) and, with ppo.reward_model, the whole reward model."""
    rules = estimate_memory(facts=FACTS, spec=spec(task="ppo", data={"train": "p.jsonl", "max_seq_len": 8},
                                                   ppo={"rewards": [{"name": "exact_match"}]}))
    # Value head: 16 + 1 = 17 float32 weights = 68 bytes; its gradient 68 and AdamW's two moments 136.
    assert (rules.weights, rules.gradients, rules.optimizer, rules.reward_model) == (40_068, 40_068, 80_136, 0)
    lora = estimate_memory(facts=FACTS, spec=spec(task="ppo", data={"train": "p.jsonl", "max_seq_len": 8},
                                                  peft={"method": "lora", "rank": 2, "targets": ["q_proj", "v_proj"]},
                                                  ppo={"rewards": [{"name": "exact_match"}]}))
    assert (lora.weights, lora.gradients, lora.optimizer) == (40_896 + 68, 896 + 68, 1_792 + 136)

    # The reward model (loaded in float32 on one device, not sharded): 10_000 parameters = 40_000 bytes,
    # plus its score head, 16 float32 weights = 64 bytes; whatever the policy's fsdp.
    scored = estimate_memory(facts=FACTS, reward_model=FACTS,
                             spec=spec(task="ppo", data={"train": "p.jsonl", "max_seq_len": 8}, parallel={"fsdp": 2},
                                       ppo={"reward_model": "run_x"}))
    assert scored.reward_model == 40_064 and scored.weights == 20_000 + 68
    assert scored.total == (scored.weights + scored.gradients + scored.optimizer + scored.activations
                            + scored.kv_cache + 40_064 + scored.reference)
    assert "reward model 39.1 KiB, KL reference 19.6 KiB)" in scored.summary()


def test_the_kl_reference_is_one_more_copy_of_the_trained_parameters():
    """QA: grpo and ppo with a KL term under full fine-tuning hold a frozen copy of the starting weights
    (jaxengine.grpo.reference_weights), which the estimate left out: a run that fits by the estimate did not."""
    prompts = {"data": {"train": "p.jsonl", "max_seq_len": 8}}
    rewards = {"rewards": [{"name": "exact_match"}]}
    lora = {"method": "lora", "rank": 2, "targets": ["q_proj", "v_proj"]}
    grpo = estimate_memory(facts=FACTS, spec=spec(task="grpo", **prompts, grpo={**rewards, "beta": 0.04}))
    assert grpo.reference == 40_000 and grpo.total == 40_000 * 5 + grpo.activations + grpo.kv_cache
    assert "KL reference 39.1 KiB)" in grpo.summary()
    assert estimate_memory(facts=FACTS, spec=spec(task="grpo", **prompts, grpo={**rewards, "beta": 0})).reference == 0
    sharded = estimate_memory(facts=FACTS, spec=spec(task="grpo", **prompts, parallel={"fsdp": 2},
                                                     train={"param_dtype": "bfloat16"}, grpo=rewards))
    assert sharded.reference == 10_000
    # Under LoRA the reference is the base with the adapters as zeros: 896 bytes of them.
    assert estimate_memory(facts=FACTS, spec=spec(task="grpo", **prompts, peft=lora, grpo=rewards)).reference == 896
    # PPO's copy holds its value head too (68 bytes, replicated); kl_coef 0 runs no reference.
    ppo = estimate_memory(facts=FACTS, spec=spec(task="ppo", **prompts, ppo=rewards))
    assert ppo.reference == 40_068
    assert estimate_memory(facts=FACTS, spec=spec(task="ppo", **prompts, ppo={**rewards, "kl_coef": 0})).reference == 0
    # dpo's reference log-probs are computed once before training: no weights are held for them.
    assert estimate_memory(facts=FACTS, spec=spec(task="dpo", **prompts)).reference == 0


@pytest.mark.parametrize("task, peft, param_dtype", [
    ("grpo", "none", "float32"), ("grpo", "none", "bfloat16"), ("grpo", "lora", "float32"), ("ppo", "none", "float32"),
    ("ppo", "lora", "bfloat16"),
])
def test_the_kl_reference_estimate_is_the_bytes_the_trainer_holds(tmp_path_factory, tmp_path, task, peft,
                                                                    param_dtype):
    import jax
    from flax import nnx

    from jaxengine.cli.model_dir import safetensors_summary
    from jaxengine.grpo import reference_weights
    from jaxengine.job import build_job_model

    model_dir = factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny"))  # with a tokenizer, as a job needs
    job = parse_spec({"task": task, "model": str(model_dir), "output_dir": str(tmp_path / "run"),
                      "data": {"train": "p.jsonl", "max_seq_len": 8}, "train": {"max_steps": 1, "batch_size": 2,
                                                                                "param_dtype": param_dtype},
                      "peft": {"method": peft, "rank": 2, "targets": ["q_proj", "v_proj"]} if peft != "none" else {},
                      task: {"rewards": [{"name": "exact_match"}]}})
    job_model = build_job_model(job)
    trainer = types.SimpleNamespace(params=nnx.state(job_model.model, job_model.trainable))  # as the Trainer holds them
    held = sum(leaf.nbytes for leaf in jax.tree.leaves(reference_weights(job, job_model)(trainer)))
    facts = ModelFacts.from_config(parameter_count=safetensors_summary(model_dir)["parameters"],
                                   config=json.loads((model_dir / "config.json").read_text()))
    assert held > 0 and estimate_memory(facts=facts, spec=job).reference == held


# The disk a run writes (estimate_disk): checkpoints of the trained parameters and AdamW's two moments, and the export.
def test_disk_full_fine_tuning_keeps_keep_last_and_the_one_being_written():
    # 10,000 float32 parameters = 40,000 bytes, × 3 with the moments = 120,000 a checkpoint; keep_last 3 + 1 being
    # written = 4; the export in float32: 40,000.
    estimate = estimate_disk(facts=FACTS, spec=spec())
    assert estimate == DiskEstimate(checkpoint=120_000, checkpoints=4, export=40_000)
    assert estimate.total == 520_000
    assert estimate.summary() == "≈ 508 KiB: 4 checkpoints of 117 KiB and the exported model 39.1 KiB"


def test_disk_counts_the_best_checkpoint_of_a_run_that_evaluates_and_a_16_bit_export():
    estimate = estimate_disk(facts=FACTS, spec=spec(data={"eval": "e.jsonl"}, train={"keep_last": 1}),
                             stored_bytes_per_parameter=stored_bytes_per_parameter({"torch_dtype": "bfloat16"}))
    assert estimate == DiskEstimate(checkpoint=120_000, checkpoints=3, export=20_000)
    assert stored_bytes_per_parameter({"dtype": "float32"}) is None


def test_disk_lora_checkpoints_hold_the_adapters_and_the_export_adds_them_to_the_merged_model():
    # 896 bytes of float32 adapters (test_lora_trains_only_its_adapters), × 3; the export: 40,000 + 896.
    estimate = estimate_disk(facts=FACTS, spec=spec(peft={"method": "lora", "rank": 2, "targets": ["q_proj", "v_proj"]}))
    assert estimate == DiskEstimate(checkpoint=2_688, checkpoints=4, export=40_896)


@pytest.mark.parametrize("peft, param_dtype", [("none", "float32"), ("none", "bfloat16"), ("lora", "float32")])
def test_a_checkpoints_estimate_is_the_bytes_of_the_state_the_trainer_saves(tmp_path_factory, tmp_path, peft,
                                                                            param_dtype):
    """A checkpoint holds the trained parameters and the optimizer's state (``Trainer._state_leaves``, less the
    few-byte RNG and step counts): the estimate is their bytes."""
    import jax
    from flax import nnx

    from jaxengine.cli.model_dir import safetensors_summary
    from jaxengine.job import build_job_model
    from jaxengine.trainer import make_optimizer

    model_dir = factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny"))
    job = parse_spec({"task": "sft", "model": str(model_dir), "output_dir": str(tmp_path / "run"),
                      "data": {"train": "t.jsonl", "max_seq_len": 8},
                      "train": {"max_steps": 1, "batch_size": 2, "param_dtype": param_dtype},
                      "peft": {"method": peft, "rank": 2, "targets": ["q_proj", "v_proj"]} if peft != "none" else {}})
    job_model = build_job_model(job)
    params = nnx.state(job_model.model, job_model.trainable)  # as the Trainer splits them
    state = (params, make_optimizer(job.optim, total_steps=1).init(params))
    saved = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
    facts = ModelFacts.from_config(parameter_count=safetensors_summary(model_dir)["parameters"],
                                   config=json.loads((model_dir / "config.json").read_text()))
    estimated = estimate_disk(facts=facts, spec=job).checkpoint
    assert estimated <= saved <= estimated + 16  # the optimizer's step counts: a few int32 scalars
