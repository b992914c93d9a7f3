"""Starting points for the launch form, per task: a name, a one-line description and the spec
keys they set (everything else keeps the schema's default). The first preset of a task is what a
new form starts from, except on the demo model (``DEMO_PRESET``).

LoRA's learning rate of 2e-4 is the usual one for models of 1 B parameters and more, and stays the
default. The 2.6 M-parameter demo model learns far slower at it: from the loss of 11.6 to 9.5 in the
first 30 steps (0 % exact match), where 1e-3 reaches 4.3 and levels off near 1.3 by step 50 (bench/RESULTS.md,
"The demo model's first LoRA run"); a form opened on the demo model starts from ``DEMO_PRESET``."""
from __future__ import annotations

from typing import Any

DEMO_PRESET = "LoRA, demo model"

PRESETS: dict[str, list[dict[str, Any]]] = {
    "pretrain": [
        {"name": "Continued pre-training", "description": "Full weights, packed sequences, one epoch.",
         "spec": {"data": {"packing": True, "max_seq_len": 512},
                  "optim": {"learning_rate": 1e-4, "warmup_steps": 10},
                  "train": {"epochs": 1, "batch_size": 8, "save_every": 100}}},
    ],
    "sft": [
        {"name": "LoRA", "description": "Rank-16 adapters on every projection; quick and light.",
         "spec": {"peft": {"method": "lora", "rank": 16, "alpha": 32},
                  "optim": {"learning_rate": 2e-4, "warmup_steps": 10},
                  "train": {"max_steps": 200, "batch_size": 8, "eval_every": 50, "save_every": 50,
                            "eval_samples": 8}}},
        {"name": DEMO_PRESET, "description": "LoRA at learning rate 1e-3, which a model as small as the demo's "
                                             "(2.6 M parameters) needs: 2e-4 suits models of 1 B and more.",
         "spec": {"peft": {"method": "lora", "rank": 16, "alpha": 32},
                  "optim": {"learning_rate": 1e-3, "warmup_steps": 10},
                  "train": {"max_steps": 200, "batch_size": 8, "eval_every": 50, "save_every": 50,
                            "eval_samples": 8}}},
        {"name": "Full fine-tune", "description": "Every weight trained; lower learning rate.",
         "spec": {"peft": {"method": "none"},
                  "optim": {"learning_rate": 2e-5, "warmup_steps": 20, "weight_decay": 0.01},
                  "train": {"epochs": 2, "batch_size": 8, "eval_every": 100, "save_every": 100}}},
        {"name": "QLoRA", "description": "LoRA over a 4-bit (NF4) frozen base: the least memory.",
         "spec": {"peft": {"method": "qlora", "rank": 16, "alpha": 32, "quant_bits": 4},
                  "optim": {"learning_rate": 2e-4, "warmup_steps": 10},
                  "train": {"max_steps": 200, "batch_size": 8, "eval_every": 50, "save_every": 50}}},
    ],
    "reward": [
        {"name": "Reward model", "description": "Bradley-Terry on chosen/rejected pairs, one epoch.",
         "spec": {"optim": {"learning_rate": 1e-5, "warmup_steps": 10},
                  "train": {"epochs": 1, "batch_size": 8, "eval_every": 50, "save_every": 50},
                  "reward": {"center_rewards_coefficient": 0.01}}},
    ],
    "dpo": [
        {"name": "DPO", "description": "Sigmoid loss, beta 0.1, LoRA adapters.",
         "spec": {"peft": {"method": "lora", "rank": 16, "alpha": 32},
                  "optim": {"learning_rate": 5e-6, "warmup_steps": 10},
                  "train": {"epochs": 1, "batch_size": 8, "eval_every": 50, "save_every": 50},
                  "dpo": {"beta": 0.1, "loss": "sigmoid"}}},
        {"name": "SimPO", "description": "Reference-free, length-normalised margin loss.",
         "spec": {"optim": {"learning_rate": 1e-6},
                  "train": {"epochs": 1, "batch_size": 8, "eval_every": 50, "save_every": 50},
                  "dpo": {"beta": 2.0, "loss": "simpo", "simpo_gamma": 0.5}}},
    ],
    "grpo": [
        {"name": "GRPO (exact match)", "description": "8 rollouts per prompt scored by exact match with the answer column.",
         "spec": {"peft": {"method": "lora", "rank": 16, "alpha": 32},
                  "optim": {"learning_rate": 1e-5},
                  "train": {"max_steps": 100, "batch_size": 4, "save_every": 25},
                  "grpo": {"num_generations": 8, "max_new_tokens": 64,
                           "rewards": [{"name": "exact_match", "weight": 1.0}]}}},
    ],
    "ppo": [
        {"name": "PPO (exact match)", "description": "A value head and GAE; rollouts scored by exact match with the "
                                                     "answer column, KL penalty 0.04 per token.",
         "spec": {"peft": {"method": "lora", "rank": 16, "alpha": 32},
                  "optim": {"learning_rate": 1e-5},
                  "train": {"max_steps": 100, "batch_size": 8, "save_every": 25},
                  "ppo": {"max_new_tokens": 64, "rewards": [{"name": "exact_match", "weight": 1.0}]}}},
    ],
}


def presets_for(task: str) -> list[dict[str, Any]]:
    """The presets of ``task`` (a generic one when the task has none yet)."""
    return PRESETS.get(task) or [
        {"name": "Defaults", "description": "The engine's defaults, 100 steps.", "spec": {"train": {"max_steps": 100}}}
    ]


def demo_preset_name(task: str) -> str | None:
    """The preset a new ``task`` form opened on the demo model starts from (None: the task's first)."""
    return DEMO_PRESET if any(preset["name"] == DEMO_PRESET for preset in presets_for(task)) else None


def preset_named(task: str, name: str | None) -> dict[str, Any]:
    """Preset ``name`` of ``task``, or the task's first when ``name`` is None or unknown: the one a form holds."""
    options = presets_for(task)
    return next((preset for preset in options if preset["name"] == name), options[0])


def preset_spec(task: str, name: str | None) -> dict[str, Any]:
    """The spec keys preset ``name`` of ``task`` sets (the first preset when ``name`` is unknown)."""
    return {"task": task, **preset_named(task, name)["spec"]}
