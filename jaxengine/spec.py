"""The job spec: one YAML file describes a training run, for the CLI and the web app alike.

Design note: this module is imported by the web process, so it must stay jax-free (pydantic,
PyYAML and the jax-free ``jaxengine.data.formats`` only; ``tests/jaxengine/test_spec.py`` checks it in a fresh interpreter). Every section is a
frozen pydantic model that forbids unknown keys, so a typo is an error instead of a silently ignored
setting. Validation errors are rewritten into one line per problem that names the dotted key, the
value given and what is allowed, prefixed with ``file:line`` when the spec came from a YAML file:

    spec.yaml:14: optim.schedule: 'cosin' is not one of constant, linear, cosine

Sections that only matter for one task (``dpo``, ``reward``, ``grpo``, ``ppo``) are rejected for other tasks, so a
spec never carries settings that silently do nothing. New tasks add their section model here and
one entry in ``TASK_SECTIONS``.
"""
from __future__ import annotations

import math
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from jaxengine.chat_template import RESERVED_TEMPLATE_VARIABLES, TEMPLATE_VARIABLES_MAX, template_variable_problem
from jaxengine.data import formats
from jaxengine.words import counted

Task = Literal["pretrain", "sft", "reward", "dpo", "grpo", "ppo"]
PeftMethod = Literal["none", "lora", "qlora"]
Schedule = Literal["constant", "linear", "cosine"]
DpoLoss = Literal["sigmoid", "ipo", "hinge", "simpo", "orpo", "robust", "exo_pair", "nca_pair", "sppo_hard",
                  "apo_zero", "apo_down", "discopop", "kto_pair", "aot", "aot_pair", "bco_pair"]
# The dpo losses that read dpo.label_smoothing: assumed label noise (sigmoid, robust, aot, aot_pair), EXO's target
# epsilon.
SMOOTHED_DPO_LOSSES = ("sigmoid", "robust", "exo_pair", "aot", "aot_pair")
KlEstimator = Literal["k1", "k2", "k3"]
GrpoLossType = Literal["grpo", "dr_grpo", "dapo", "gspo"]
AdvantageEstimator = Literal["group", "group_mean", "rloo"]
LossOn = Literal["completion", "all"]
ParamDtype = Literal["float32", "bfloat16"]
# "auto" means bfloat16 on accelerators and float32 on CPU, where bfloat16 matmuls are slow.
ComputeDtype = Literal["auto", "float32", "bfloat16"]
ProjectionName = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

ALL_PROJECTIONS: tuple[str, ...] = typing.get_args(ProjectionName)

# Tuple keys take the lists YAML and JSON give (strict mode takes only tuples); their items stay strict.
_LIST = {"strict": False}

# Task -> the dataset kind (jaxengine.data.formats) its data files hold.
TASK_DATASET_KINDS: dict[str, str] = {"pretrain": "text", "sft": "sft", "reward": "preference", "dpo": "preference",
                                      "grpo": "prompts", "ppo": "prompts"}

# Task -> the task-specific sections it accepts. A section listed for no task of the spec is an error.
TASK_SECTIONS: dict[str, tuple[str, ...]] = {
    "pretrain": (),
    "sft": (),
    "reward": ("reward",),
    "dpo": ("dpo",),
    "grpo": ("grpo",),
    "ppo": ("ppo",),
}

# Tasks whose trainer runs as one SPMD program over many processes (``hosts`` > 1).
MULTI_HOST_TASKS: tuple[str, ...] = ("pretrain", "sft", "reward", "dpo")

# A host pool's name is part of its Celery queue's (``train-<pool>``).
POOL_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"
# Patterns of string keys in words, for their errors (pydantic's quote the regular expression).
PATTERN_WORDS = {POOL_PATTERN: "1-40 lowercase letters, digits and '-', the first a letter or digit"}

# Keys of the common sections that only some tasks read. Elsewhere the spec refuses any value but the
# default, and the web form does not show them.
TASK_ONLY_KEYS: dict[str, tuple[str, ...]] = {"data.packing": ("pretrain", "sft"), "data.loss_on": ("sft",)}


class SpecError(ValueError):
    """An invalid job spec. ``problems`` holds one human-readable line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid job spec:\n  " + "\n  ".join(problems))


class _Section(BaseModel):
    # Strict: a number or boolean must be written as one. In lax mode "64" (in quotes), 64.0 and true
    # trained as 64, 64 and 1, so a quoted value or a typo in a YAML or JSON spec went unnoticed.
    # Whole numbers still fill float keys. Lists fill tuple keys (``_LIST``), as YAML and JSON have no tuples.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class DataSpec(_Section):
    """``data``: where the rows come from and how they become token sequences."""

    train: str = Field(description="Training dataset file (jsonl/json/csv/parquet) in the task's format.")
    eval: str | None = Field(default=None, description="Optional held-out dataset in the same format.")
    max_seq_len: int = Field(default=512, ge=8, le=131072, description="Tokens per training sequence.")
    packing: bool = Field(
        default=False,
        description="Pack several examples per row; attention never crosses example boundaries.",
    )
    loss_on: LossOn = Field(
        default="completion",
        description="completion: loss on completions / assistant turns only; all: every token.",
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="The files' own column names for the task's fields, e.g. {prompt: question}.",
    )
    eval_group_by: str | None = Field(
        default=None, min_length=1, max_length=64,
        description="A column of data.eval (e.g. task or category): each eval metric is also logged per "
                    "value, as eval/<metric>/<value> (at most 32 values).",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, max_length=TEMPLATE_VARIABLES_MAX,
        description="Variables the model's chat template reads, e.g. {enable_thinking: false} for Qwen3: used "
                    "wherever the run renders a chat (training rows, eval, RL prompts, samples) and kept with "
                    "the exported model, so chat renders the same. Values are strings, numbers, true/false or null.",
    )

    run_spec_template_kwargs: bool = Field(
        default=True,
        description="Where the model is a run's export made before exports kept chat_template_kwargs.json: true "
                    "takes that run's variables from its directory's spec.yaml; false takes none from there "
                    "(Temper sets it false and gives the source run's recorded variables in chat_template_kwargs).",
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _scalar_template_variables(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name, item in value.items():
            if problem := template_variable_problem(name, item):
                raise ValueError(f"{name}: {problem}" if name.isidentifier() else problem)
        return value

    @model_validator(mode="after")
    def _group_by_needs_eval(self) -> DataSpec:
        if self.eval_group_by is not None and self.eval is None:
            raise ValueError(f"eval_group_by: {self.eval_group_by!r} groups the eval rows, but data.eval is not set")
        return self


class PeftSpec(_Section):
    """``peft``: full fine-tuning (``none``), LoRA, or LoRA over a quantized frozen base (QLoRA)."""

    method: PeftMethod = Field(default="none", description="none: every weight trained | lora: low-rank adapters "
                               "on the targets, the base frozen | qlora: LoRA over a base quantized to quant_bits, "
                               "the least memory.")
    rank: int = Field(default=8, ge=1, le=1024, description="LoRA rank r.")
    alpha: float = Field(default=16.0, gt=0, description="LoRA scale numerator: updates are scaled by alpha / rank.")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    targets: tuple[ProjectionName, ...] = Field(
        default=ALL_PROJECTIONS, min_length=1, description="Projection names that get LoRA adapters.", **_LIST
    )
    quant_bits: Literal[4, 8] = Field(default=4, description="qlora: 4 (NF4) or 8 (int8) bits for frozen weights.")
    group_size: int = Field(default=64, ge=8, le=4096, description="qlora: weights per quantization scale.")

    @model_validator(mode="after")
    def _group_size_is_power_of_two(self) -> PeftSpec:
        if self.group_size & (self.group_size - 1):
            raise ValueError(f"group_size: {self.group_size} is not a power of two (e.g. 32, 64, 128)")
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"targets: {list(self.targets)} names a projection twice")
        return self


class OptimSpec(_Section):
    """``optim``: AdamW with decoupled weight decay, warmup then a constant/linear/cosine schedule."""

    learning_rate: float = Field(default=1.0e-4, gt=0, le=1.0, description="Peak learning rate.")
    schedule: Schedule = Field(default="cosine", description="Decay after warmup: constant | linear | cosine.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warmup from 0 to learning_rate.")
    weight_decay: float = Field(default=0.0, ge=0.0, description="Decoupled (AdamW) weight decay.")
    max_grad_norm: float | None = Field(default=1.0, gt=0, description="Global-norm clipping; null disables it.")
    adam_beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(default=0.999, ge=0.0, lt=1.0)
    adam_epsilon: float = Field(default=1.0e-8, gt=0)


class TrainSpec(_Section):
    """``train``: how long, how big, how often to evaluate and save, and in which precision."""

    max_steps: int | None = Field(default=None, ge=1, description="Optimizer steps; give this or epochs.")
    epochs: float | None = Field(default=None, gt=0, description="Passes over the training data; or max_steps.")
    batch_size: int = Field(default=8, ge=1, le=65536, description=(
        "Rows per micro-batch: sequences (pretrain, sft), chosen/rejected pairs (reward, dpo), prompts (grpo: "
        "each sampled num_generations times; ppo: one completion each)."))
    grad_accum: int = Field(default=1, ge=1, description="Micro-batches per optimizer step.")
    eval_every: int | None = Field(default=None, ge=1, description="Evaluate every N steps (and at the end).")
    save_every: int | None = Field(default=None, ge=1, description="Checkpoint every N steps (and at the end).")
    keep_last: int = Field(default=3, ge=1, description="Checkpoints kept besides the best by eval loss "
                           "(tasks grpo and ppo: by the first eval metric).")
    seed: int = Field(default=0, ge=0, lt=2**32, description="Seeds initialisation, shuffling and dropout.")
    param_dtype: ParamDtype = Field(default="float32", description="Storage dtype of the model's weights: under "
                                   "LoRA/QLoRA the frozen base's too (adapters are float32), so bfloat16 halves "
                                   "a LoRA base's memory.")
    compute_dtype: ComputeDtype = Field(default="auto", description="Matmul dtype; auto = bfloat16 except on CPU.")
    remat: bool = Field(default=False, description="Recompute each layer in the backward pass: less memory, ~1/3 more compute.")
    logits_memory_mb: int = Field(default=1024, ge=0, description="Output logits (loss positions x vocabulary x 4 "
                                  "bytes) up to this size are kept for the backward pass; larger ones are "
                                  "computed in chunks and recomputed there (less memory, one more output projection).")
    eval_samples: int = Field(default=16, ge=0, le=256, description="Eval prompts generated greedily at each eval.")
    sample_max_new_tokens: int = Field(default=64, ge=1, description="Token budget of those generations.")

    @model_validator(mode="after")
    def _one_length(self) -> TrainSpec:
        if (self.max_steps is None) == (self.epochs is None):
            given = "both" if self.max_steps is not None else "neither"
            raise ValueError(f"give exactly one of max_steps and epochs ({given} given)")
        return self


class DpoSpec(_Section):
    """``dpo``: preference optimisation loss and its knobs."""

    beta: float = Field(default=0.1, gt=0, description="Inverse temperature; ORPO's odds-ratio weight.")
    loss: DpoLoss = Field(default="sigmoid", description=(
        "sigmoid: DPO, -log σ(beta × log-ratio margin) | ipo: (margin − 1/(2 beta))², less prone to "
        "overfit | hinge: SLiC, relu(1 − beta × margin) | simpo: reference-free, length-normalised, "
        "target margin simpo_gamma | orpo: reference-free, chosen NLL plus an odds-ratio term weighted by "
        "beta | robust: DPO unbiased for labels flipped at rate label_smoothing | exo_pair: EXO, KL to the "
        "target preference (1 − label_smoothing, label_smoothing) | nca_pair: NCA, pushes each implicit "
        "reward itself (chosen up, rejected down) | sppo_hard: SPPO, each log-ratio squared toward ±1/(2 beta) "
        "| apo_zero: APO, chosen up and rejected down | apo_down: APO, both down, rejected more | discopop: "
        "logistic below zero margin, exponential above, blended at temperature discopop_tau | kto_pair: KTO on "
        "pairs, each log-ratio against the batch's mean log-ratio of the other side | aot: AOT for paired data, "
        "the policy's sorted margins above the reference's | aot_pair: AOT for unpaired data, the sorted chosen "
        "log-ratios above the sorted rejected ones (kto_pair, aot, aot_pair: statistics of each micro-batch) | "
        "bco_pair: BCO, each implicit reward classified against delta, the running mean of the rewards of every "
        "training micro-batch so far (logged as delta; checkpointed, so a resumed run goes on with it)."))
    label_smoothing: float = Field(default=0.0, ge=0.0, lt=0.5, description=(
        "sigmoid, robust, aot, aot_pair: assumed rate of flipped labels; exo_pair: the target's epsilon (0 means "
        "0.001)."))
    simpo_gamma: float = Field(default=0.5, ge=0.0, description="simpo only: target reward margin.")
    discopop_tau: float = Field(default=0.05, gt=0.0, le=1.0, description=(
        "discopop only: temperature of the blend of its two terms (the paper's 0.05). At most 1: above, the "
        "exponential term grows without bound as the margin falls."))

    @model_validator(mode="after")
    def _smoothing_only_where_read(self) -> DpoSpec:
        if self.label_smoothing and self.loss not in SMOOTHED_DPO_LOSSES:
            raise ValueError(f"label_smoothing: only used with loss {', '.join(SMOOTHED_DPO_LOSSES)} "
                             f"(loss is {self.loss!r})")
        return self


class RewardSpec(_Section):
    """``reward``: the scalar head read at each sequence's last token, trained with Bradley-Terry."""

    center_rewards_coefficient: float = Field(
        default=0.0, ge=0.0, description="Adds coef * mean((r_chosen + r_rejected)^2) to keep rewards centred."
    )


class RewardTermSpec(_Section):
    """One term of an RL reward: a registered reward function (``jaxengine.rewards``), its weight, its args."""

    name: str = Field(description="A registered reward function, e.g. exact_match, format_regex.")
    weight: float = Field(default=1.0, allow_inf_nan=False,
                          description="Multiplies this function's scores in the total reward.")
    args: dict[str, Any] = Field(default_factory=dict, description="The function's keyword arguments.")

    @model_validator(mode="after")
    def _registered_with_fitting_args(self) -> RewardTermSpec:
        from jaxengine import rewards

        if self.name not in rewards.REWARDS:
            raise ValueError(f"name: {self.name!r} is not a reward function; registered: "
                             f"{', '.join(sorted(rewards.REWARDS))}")
        try:
            rewards.check_args(self.name, self.args)
            # Scoring nothing still checks the arguments themselves (a regex that does not compile, no keywords).
            rewards.REWARDS[self.name]([], [], **self.args)
        except rewards.RewardArgumentError as error:
            # Under the argument's own key (the launch form shows it at that input) when it can be one.
            key = f"args.{error.argument}" if error.argument.isidentifier() else "args"
            raise ValueError(f"{key}: {self.name}: {error}") from None
        except Exception as error:
            raise ValueError(f"args: {self.name}: {type(error).__name__}: {error}") from None
        return self


# Rollout knobs that GRPO and PPO share: one definition each (the default is given where it is used).
MaxNewTokens = Annotated[int, Field(ge=1, description="Token budget of each completion.")]
RolloutTemperature = Annotated[float, Field(gt=0, description="Sampling temperature of the rollouts.")]
RolloutTopP = Annotated[float, Field(gt=0, le=1.0, description="Nucleus sampling of the rollouts (1 = off).")]
NumIterations = Annotated[int, Field(ge=1, description="Policy updates per batch of rollouts (mu).")]
MaskTruncated = Annotated[bool, Field(description="Completions that hit max_new_tokens get no loss.")]
ClipEpsilon = Annotated[float, Field(gt=0, lt=1.0, description="Lower clip: ratios below 1 - epsilon are "
                                     "clipped (and above 1 + epsilon, unless epsilon_high is given).")]
ClipEpsilonHigh = Annotated[float | None, Field(gt=0, description="Upper clip of the policy ratio: 1 + epsilon_high; "
                                                "at least epsilon; null: equal to epsilon (the symmetric PPO clip; "
                                                "larger: DAPO's clip-higher).")]


def _upper_clip(epsilon: float, epsilon_high: float | None) -> float:
    """A ratio clip's upper ``epsilon_high``, ``epsilon`` where it is null: the clip is [1 - epsilon, 1 + this]."""
    return epsilon if epsilon_high is None else epsilon_high


def _check_clip(section: str, epsilon: float, epsilon_high: float | None) -> None:
    # Below epsilon the clip range favours lowering probabilities, the opposite of DAPO's clip-higher.
    if epsilon_high is not None and epsilon_high < epsilon:
        raise ValueError(f"epsilon_high: {epsilon_high:g} is below {section}.epsilon {epsilon:g}; give epsilon_high "
                         "at least epsilon (equal, or null: the symmetric PPO clip; larger: DAPO's clip-higher), "
                         "or lower epsilon")


def _check_reward_names(rewards: tuple[RewardTermSpec, ...], eval_metrics: tuple[RewardTermSpec, ...]) -> None:
    """Each reward function once, and eval-only metrics distinct from them (ValueError naming the key)."""
    names = [term.name for term in rewards]
    if len(set(names)) != len(names):
        raise ValueError(f"rewards: {names} names a function twice; give it once with its weight")
    extra = [term.name for term in eval_metrics]
    if len(set(extra)) != len(extra) or set(extra) & set(names):
        raise ValueError(f"eval_metrics: {extra} repeats a name (training rewards {names} are already "
                         "scored at every evaluation)")


class GrpoSpec(_Section):
    """``grpo``: rollouts, rewards, advantages and the GRPO-family objective."""

    num_generations: int = Field(default=8, ge=2, description=(
        "Completions per prompt (G), at least 2: a completion's advantage is its reward against the others of "
        "its prompt."))
    max_new_tokens: MaxNewTokens = 128
    temperature: RolloutTemperature = 1.0
    top_p: RolloutTopP = 1.0
    beta: float = Field(default=0.04, ge=0, description="KL coefficient; 0 skips the reference pass entirely.")
    kl_estimator: KlEstimator = Field(default="k3", description=(
        "How the per-token KL to the reference is estimated: k1: log(π/π_ref), unbiased but can go "
        "negative | k2: ½ log²(π/π_ref), low variance, biased | k3: π_ref/π − log(π_ref/π) − 1, unbiased "
        "and non-negative (GRPO's)"))
    epsilon: ClipEpsilon = 0.2
    epsilon_high: ClipEpsilonHigh = None
    loss_type: GrpoLossType = Field(default="grpo", description=(
        "How per-token losses become one: grpo: mean over each completion, then over completions | "
        "dr_grpo: sum / (completions × max_new_tokens), no length bias | dapo: mean over every token of "
        "the batch | gspo: one sequence-level ratio per completion, averaged as grpo."))
    advantage: AdvantageEstimator = Field(default="group", description=(
        "A completion's advantage from its group's rewards: group: (r − mean) / std | group_mean: r − "
        "mean (Dr. GRPO: hard and easy prompts weigh alike) | rloo: r − mean of the other completions of "
        "its prompt."))
    num_iterations: NumIterations = 1
    mask_truncated: MaskTruncated = False
    dynamic_sampling: bool = Field(default=False, description="Drop groups with zero reward variance and refill.")
    dynamic_sampling_pool: int = Field(default=4, ge=1, description="With dynamic_sampling: prompts sampled per "
                                       "prompt of the batch, in one rollout; groups with reward variance fill the "
                                       "batch first.")
    rewards: tuple[RewardTermSpec, ...] = Field(description="Reward functions, summed with weights.", **_LIST)
    eval_metrics: tuple[RewardTermSpec, ...] = Field(
        default=(), description="Extra reward functions scored on data.eval only (eval/<name>), e.g. exact_match "
                                "when training on a format reward. The first ranks checkpoints (the best is kept); "
                                "without any, the first reward does.", **_LIST)
    zero_std_patience: int = Field(default=20, ge=1, description="Stop when every group's rewards are equal "
                                   "(frac_reward_zero_std = 1) this many steps in a row, or, with mask_truncated, "
                                   "every completion was truncated.")
    max_kl: float | None = Field(default=None, gt=0, description="Stop when the step's kl exceeds this; null: no ceiling.")

    @model_validator(mode="after")
    def _distinct_reward_names(self) -> GrpoSpec:
        _check_clip("grpo", self.epsilon, self.epsilon_high)
        if not self.rewards:
            raise ValueError("rewards: give at least one reward function, e.g. {name: exact_match}")
        _check_reward_names(self.rewards, self.eval_metrics)
        return self

    @property
    def upper_clip(self) -> float:
        return _upper_clip(self.epsilon, self.epsilon_high)


class PpoSpec(_Section):
    """``ppo``: rollouts, a value head, GAE and the clipped PPO objective with a KL penalty in the reward."""

    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="Discount of later tokens' rewards in GAE.")
    lam: float = Field(default=0.95, ge=0.0, le=1.0, description="GAE lambda: 0 = one-step TD, 1 = Monte Carlo.")
    value_clip: float = Field(default=0.2, gt=0, description="New values stay within old values ± this (clipped value loss).")
    vf_coef: float = Field(default=0.5, ge=0.0, description="Weight of the value loss in the total loss.")
    entropy_coef: float = Field(default=0.0, ge=0.0, description="Weight of the entropy bonus (subtracted from the loss).")
    kl_coef: float = Field(default=0.04, ge=0.0, description="KL penalty per token, folded into the reward; "
                           "0 skips the reference pass entirely.")
    reward_model: str | None = Field(default=None, description="A task: reward run scoring prompt + completion: in "
                                     "Temper the run (run_…), to the jaxengine CLI its directory or export/; or "
                                     "give rewards.")
    rewards: tuple[RewardTermSpec, ...] = Field(default=(), description="Reward functions, summed with weights; "
                                                "or give reward_model.", **_LIST)
    epsilon: ClipEpsilon = 0.2
    epsilon_high: ClipEpsilonHigh = None
    max_new_tokens: MaxNewTokens = 128
    temperature: RolloutTemperature = 1.0
    top_p: RolloutTopP = 1.0
    num_iterations: NumIterations = 1
    mask_truncated: MaskTruncated = False
    eval_metrics: tuple[RewardTermSpec, ...] = Field(
        default=(), description="Extra reward functions scored on data.eval only (eval/<name>), e.g. exact_match "
                                "when rewarding with a reward model.", **_LIST)
    zero_std_patience: int = Field(default=20, ge=1, description="Stop when every completion of the batch got "
                                   "the same reward (frac_reward_zero_std = 1) this many steps in a row.")
    truncated_patience: int = Field(default=20, ge=1, description="With mask_truncated: stop when every "
                                    "completion was truncated (none in the loss) this many steps in a row.")
    max_kl: float | None = Field(default=None, gt=0, description="Stop when the step's objective/kl (per completion) "
                                 "exceeds this; null: no ceiling.")

    @model_validator(mode="after")
    def _one_reward_source(self) -> PpoSpec:
        if (self.reward_model is None) == (not self.rewards):
            what_to_do = ("(both given): remove the reward functions, or choose no reward model" if self.rewards else
                          "(neither given): choose a reward model (a task: reward run) or add a reward function "
                          "such as exact_match")
            raise ValueError(f"reward_model: give exactly one of reward_model and rewards {what_to_do}")
        if self.reward_model is not None and not self.reward_model.strip():
            raise ValueError("reward_model: empty; give the directory of a task: reward run")
        _check_clip("ppo", self.epsilon, self.epsilon_high)
        _check_reward_names(self.rewards, self.eval_metrics)
        return self

    @property
    def upper_clip(self) -> float:
        return _upper_clip(self.epsilon, self.epsilon_high)


class ParallelSpec(_Section):
    """``parallel``: the (data, fsdp, tensor) mesh a job trains on (``jaxengine.sharding``).

    ``data`` copies the weights and splits the batch; ``fsdp`` splits the batch too and shards weights
    and optimizer state (gathered layer by layer); ``tensor`` splits heads, MLP width and vocabulary.
    The sizes must multiply to the job's device count (checked when the job starts, where the devices
    are known), and a micro-batch's rows must split over data × fsdp (``JobSpec`` checks it with the
    batch size). Leave the section out for the default: every device on fsdp on accelerators, one device
    (unsharded) on CPU.
    """

    data: int = Field(default=1, ge=1, le=65536, description="Replicas: weights copied, batch split.")
    fsdp: int = Field(default=1, ge=1, le=65536, description="Shards of weights and optimizer state; batch split.")
    tensor: int = Field(default=1, ge=1, le=65536, description="Tensor-parallel split of heads, MLP and vocabulary.")


class JobSpec(_Section):
    """A whole training job."""

    task: Task = Field(description="pretrain | sft | reward | dpo | grpo | ppo")
    model: str = Field(min_length=1, description="A Hugging Face-format directory, or demo-tiny (the demo model).")
    output_dir: str = Field(min_length=1, description="Run directory: metrics, checkpoints, export.")
    data: DataSpec
    peft: PeftSpec = PeftSpec()
    optim: OptimSpec = OptimSpec()
    train: TrainSpec
    parallel: ParallelSpec | None = None
    dpo: DpoSpec | None = None
    reward: RewardSpec | None = None
    grpo: GrpoSpec | None = None
    ppo: PpoSpec | None = None
    # Multi-host jobs (``jaxengine.distributed``): one process per host of ``pool``, joined by jax.distributed.
    hosts: int = Field(default=1, ge=1, le=256, description="Hosts (processes) the job runs on; 1 = one process.")
    pool: str = Field(default="default", pattern=POOL_PATTERN,
                      description="Host pool whose workers take the job (Celery queue train-<pool>; default: train).")

    @model_validator(mode="before")
    @classmethod
    def _fill_task_section(cls, values: Any) -> Any:
        if isinstance(values, dict) and isinstance(values.get("task"), str) and values["task"] in TASK_SECTIONS:
            for section in TASK_SECTIONS[values["task"]]:
                if values.get(section) is None:
                    values = {**values, section: {}}
        return values

    @model_validator(mode="after")
    def _sections_match_task(self) -> JobSpec:
        if self.data.packing and self.task not in TASK_ONLY_KEYS["data.packing"]:
            raise ValueError(f"data.packing: only supported for pretrain and sft (task is {self.task!r})")
        kind = TASK_DATASET_KINDS[self.task]
        unknown = sorted(set(self.data.columns) - set(formats.KIND_FIELDS[formats.DatasetKind(kind)]))
        if unknown:
            fields = ", ".join(formats.KIND_FIELDS[formats.DatasetKind(kind)])
            raise ValueError(f"data.columns: {', '.join(unknown)} not a field of the {kind} data that task "
                             f"{self.task!r} reads; fields: {fields}")
        if self.data.loss_on == "all" and self.task not in TASK_ONLY_KEYS["data.loss_on"]:
            raise ValueError(f"data.loss_on: 'all' only applies to sft (task is {self.task!r}); "
                             "pretrain always trains every token, reward and dpo score the completions")
        if self.hosts > 1 and self.task not in MULTI_HOST_TASKS:
            raise ValueError(f"hosts: {self.task} runs on one host (its rollouts are sampled by one process); "
                             f"multi-host jobs run {', '.join(MULTI_HOST_TASKS)}")
        misplaced = _sections_for_another_task(self.task, [name for name in type(self).model_fields
                                                           if getattr(self, name) is not None])
        if misplaced:
            raise ValueError(misplaced[0])
        if problem := eval_only_problem(self):
            raise ValueError(problem)
        completions = self.train.batch_size * self.train.grad_accum
        if self.task == "ppo" and completions < 2:
            # Its advantages are whitened over the step's completions (jaxengine.ppo): one has no spread.
            raise ValueError(f"train.batch_size: PPO needs at least 2 completions per step (batch_size "
                             f"{self.train.batch_size} × grad_accum {self.train.grad_accum}) to whiten advantages "
                             "over the batch; raise train.batch_size or train.grad_accum")
        # A layout given here is checked against the batch here, before any host is placed; a default
        # layout only where the job's devices are known (``jaxengine.job.job_placement``).
        if self.parallel is not None and (problem := batch_split_problem(self, self.parallel.data * self.parallel.fsdp)):
            raise ValueError(problem)
        return self


def _sections_for_another_task(task: str, given: Any) -> list[str]:
    """One problem per task section in ``given`` (section names) that ``task`` does not read, naming it."""
    other_sections = {s for sections in TASK_SECTIONS.values() for s in sections} - set(TASK_SECTIONS[task])
    return [f"{section}: only used when task is {section} (task is {task!r}); remove it"
            for section in sorted(other_sections & set(given))]


# Task section -> its keys that only evaluations read (on data.eval's rows).
EVAL_ONLY_KEYS: dict[str, tuple[str, ...]] = {"grpo": ("eval_metrics",), "ppo": ("eval_metrics",)}


def eval_only_problem(spec: JobSpec) -> str | None:
    """Why a key of ``spec`` that only evaluations read does nothing (no ``data.eval``); None when none does."""
    if spec.data.eval is not None:
        return None
    for section in TASK_SECTIONS[spec.task]:
        for key in EVAL_ONLY_KEYS.get(section, ()):
            if value := getattr(getattr(spec, section), key):
                names = [term.name for term in value]
                return (f"{section}.{key}: {names} are scored on data.eval only, and data.eval is not set, so "
                        f"they would never be scored; add data.eval (held-out prompts) or remove {section}.{key}")
    return None


def batch_split_problem(spec: JobSpec, multiple: int) -> str | None:
    """Why a micro-batch of ``spec`` (``train.batch_size`` rows, × ``grpo.num_generations`` for grpo)
    cannot be split over the mesh's data × fsdp = ``multiple`` devices; None when it can."""
    rows = spec.train.batch_size * (spec.grpo.num_generations if spec.task == "grpo" else 1)
    if rows % multiple == 0:
        return None
    what = (f"{spec.train.batch_size} × grpo.num_generations {spec.grpo.num_generations} = {counted(rows, 'row')}"
            if spec.task == "grpo" else counted(rows, "row"))
    return (f"train.batch_size: {what} {'does' if rows == 1 else 'do'} not split over parallel data × fsdp = "
            f"{multiple} devices; "
            f"give a multiple of {multiple}, or move devices to parallel.tensor")


def total_steps_for(spec: JobSpec, rows_per_epoch: int) -> int:
    """``train.max_steps``, or the steps that ``train.epochs`` passes over ``rows_per_epoch`` rows take."""
    if spec.train.max_steps is not None:
        return spec.train.max_steps
    rows_per_step = spec.train.batch_size * spec.train.grad_accum
    return max(1, math.ceil(spec.train.epochs * rows_per_epoch / rows_per_step))


# Tasks whose batch rows per epoch are at most data.train's rows (one example or prompt per row, some
# dropped). Not pretrain: it cuts a long text into several windows.
ROWS_BOUND_STEPS_TASKS: tuple[str, ...] = ("sft", "reward", "dpo", "grpo", "ppo")


def spec_warnings(spec: JobSpec, *, train_rows: int | None = None, chat_template: str | None = None) -> list[str]:
    """Settings of a valid ``spec`` that work against each other, one line each (the spec still runs).

    ``train_rows``, the row count of ``data.train`` where the caller knows it, bounds the optimizer steps
    of a spec that gives ``train.epochs``; without it only ``train.max_steps`` tells them before the
    engine reads the data, and nothing is said where they are not known. ``chat_template``, the model's
    (``Tokenizer.chat_template``) where the caller has read it, tells the ``data.chat_template_kwargs`` it
    never reads."""
    warnings = []
    if chat_template is not None and (problem := unread_template_variables_problem(
            spec.data.chat_template_kwargs, chat_template, key="data.chat_template_kwargs")):
        warnings.append(problem)
    if problem := _warmup_problem(spec, train_rows=train_rows):
        warnings.append(problem)
    if problem := _step_past_epochs_problem(spec, train_rows=train_rows):
        warnings.append(problem)
    if problem := _eval_problem(spec):
        warnings.append(problem)
    if problem := _held_out_problem(spec):
        warnings.append(problem)
    return warnings


def unread_template_variables_problem(variables: dict[str, Any], chat_template: str, *, key: str) -> str | None:
    """Why some of ``variables`` (given at ``key``) do nothing: ``chat_template`` never reads them (a typo,
    or another model's switch), naming the variables it does read; None when it reads them all. A template
    that cannot be parsed says so where it is rendered."""
    from jaxengine.chat_template import ChatTemplateError, template_variables

    try:
        reads = template_variables(chat_template)
    except ChatTemplateError:
        return None
    unread = sorted(set(variables) - reads)
    if not unread:
        return None
    settable = sorted(reads - RESERVED_TEMPLATE_VARIABLES)
    return (f"{key}: the model's chat template never reads {', '.join(unread)}, so "
            f"{'it does' if len(unread) == 1 else 'they do'} nothing; the variables it reads are "
            f"{', '.join(settable) if settable else 'none besides the conversation'}")


def _held_out_problem(spec: JobSpec) -> str | None:
    # A project with one dataset of a kind (the demo's preference pairs) invites picking it for both.
    if spec.data.eval is None or spec.data.eval != spec.data.train:
        return None
    return ("data.eval: the same data as data.train, so each evaluation scores rows the run trains on and its eval "
            "metrics say more of memory than of what the model learned; give held-out rows (another dataset, or a "
            "version of this one without them)")


def _eval_problem(spec: JobSpec) -> str | None:
    # The trainer evaluates on data.eval only: without it eval_every asks for evaluations that never run.
    if spec.train.eval_every is None or spec.data.eval is not None:
        return None
    return (f"train.eval_every: {spec.train.eval_every} evaluates nothing, as data.eval is not given: the run logs "
            f"training metrics only; give data.eval (held-out rows in data.train's format) or leave eval_every out")


def _warmup_problem(spec: JobSpec, *, train_rows: int | None) -> str | None:
    warmup = spec.optim.warmup_steps
    if spec.train.max_steps is not None:
        steps, counted = spec.train.max_steps, "train.max_steps"
    elif train_rows is not None and spec.task in ROWS_BOUND_STEPS_TASKS:
        # An upper bound (rows the engine drops make fewer steps): a warmup as long warms up for the whole run.
        steps = total_steps_for(spec, train_rows)
        counted = (f"at most: train.epochs {spec.train.epochs:g} × {train_rows} rows of data.train / "
                   f"(train.batch_size {spec.train.batch_size} × train.grad_accum {spec.train.grad_accum})")
    else:
        return None
    if warmup < steps:
        return None
    # The schedule reaches the peak at step index warmup_steps; the last step's index is steps - 1.
    return (f"optim.warmup_steps: {warmup} is not below the run's {steps} optimizer steps ({counted}), so the "
            f"learning rate never reaches optim.learning_rate {spec.optim.learning_rate:g}: the run ends still "
            f"warming up; give warmup_steps below {steps} (a tenth of the steps is common) or train longer")


def _step_past_epochs_problem(spec: JobSpec, *, train_rows: int | None) -> str | None:
    """A run of ``train.epochs`` whose one optimizer step takes more rows than those epochs hold: it still makes a
    step, of a whole batch, so it trains more passes than asked (epochs 1 at a batch of 600 over 200 rows trained
    3, its ``epoch`` metric ending at 3). ``train_rows`` bounds the rows a pass holds, so the passes are at least so many."""
    if spec.train.max_steps is not None or train_rows is None or not train_rows or spec.task not in ROWS_BOUND_STEPS_TASKS:
        return None
    rows_per_step = spec.train.batch_size * spec.train.grad_accum
    if rows_per_step <= spec.train.epochs * train_rows:
        return None
    return (f"train.epochs: one optimizer step takes {rows_per_step} rows (train.batch_size {spec.train.batch_size} × "
            f"train.grad_accum {spec.train.grad_accum}), more than train.epochs {spec.train.epochs:g} × the "
            f"{train_rows} rows of data.train, so the run's one step trains {rows_per_step / train_rows:.3g} passes "
            f"over the data, not {spec.train.epochs:g}; give train.batch_size × train.grad_accum at most "
            f"{math.floor(spec.train.epochs * train_rows)}, or train.max_steps instead of train.epochs")


def parse_spec(data: Any, *, source: str | None = None, _lines: dict[tuple, int] | None = None) -> JobSpec:
    """Validate a spec given as a mapping (e.g. a parsed YAML document or a web form).

    Raises SpecError naming each bad key by dotted path, the value and what is allowed.
    """
    if not isinstance(data, dict):
        raise SpecError([_prefix(source, None) + f"the spec must be a mapping of keys, got {type(data).__name__}"])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        lines = _lines or {}
        # In the order of the file's lines (those of no line, a missing key, first): in the model's field order,
        # a file's problems read as lines 4, 6, 5.
        errors = error.errors(include_url=False)
        # A list with a bad element is also "too short" by the elements that passed: targets: [zz] read
        # "peft.targets: ['zz']: give at least 1" beside the element's own problem, which names the allowed values.
        element_lists = {tuple(err["loc"][:-1]) for err in errors if err["loc"] and isinstance(err["loc"][-1], int)}
        errors = [err for err in errors if not (err["type"] == "too_short" and tuple(err["loc"]) in element_lists)]
        found = [(_line_for(tuple(part for part in err["loc"] if not _is_union_tag(part)), lines) or 0,
                  _describe(err, source, lines)) for err in errors]
        # A section for another task is checked once every field is valid; when some are not, it is
        # named too: under task grpo a "ppo:" section otherwise showed only as "grpo.rewards: required".
        task = data.get("task")
        if isinstance(task, str) and task in TASK_SECTIONS:
            misplaced = _sections_for_another_task(task, [key for key in data if data[key] is not None])
            found += [(lines.get((line.partition(":")[0],)) or 0, _prefix(source, lines.get((line.partition(":")[0],)))
                       + line) for line in misplaced if not any(problem.endswith(line) for _, problem in found)]
        raise SpecError([problem for _line, problem in sorted(found, key=lambda pair: pair[0])]) from None


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate a YAML spec file; errors carry ``file:line`` of the offending key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([f"{path}: no such file"]) from None
    except IsADirectoryError:
        raise SpecError([f"{path}: a directory; give the spec's YAML file"]) from None
    except OSError as error:
        raise SpecError([f"{path}: cannot be read ({error.strerror})"]) from None
    except UnicodeDecodeError as error:
        raise SpecError([f"{path}: not UTF-8 text ({error.reason} at byte {error.start})"]) from None
    return parse_spec_text(text, source=str(path))


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (``*name``). A spec never needs one, and nine aliases to
    a list of nine aliases, eight levels deep, is 1.5 KB of text that expands to 9**9 items: it took
    the web process to 11 GB (a "billion laughs")."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in a spec; write the value out",
                self.peek_event().start_mark)
        return super().compose_node(parent, index)


# YAML 1.2 reads 1e-4 as a number; PyYAML follows YAML 1.1, where an exponent needs a dot (1.0e-4) and
# 1e-4 is text, which a strict spec then refused as "text (in quotes)" that the user never quoted. The
# loader takes YAML 1.2's exponent form too; a quoted "1e-4" stays text.
_NoAliasLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))


def load_yaml(text: str) -> Any:
    """``text`` as YAML, safely: the safe loader's types, no aliases (``yaml.YAMLError`` otherwise)."""
    return _readable(yaml.load, text)


def _readable(read, text: str) -> Any:
    """``read(text)`` with the safe loader without aliases; what PyYAML lets escape as Python's own
    errors (a RecursionError for "[" * 2000, a ValueError from a constructor: a number past Python's
    4,300-digit limit, a date with a 13th month) is a ``yaml.YAMLError`` in words, like a syntax error."""
    try:
        return read(text, Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader)
    except RecursionError:
        raise yaml.YAMLError("it nests too deeply (lists or mappings hundreds of levels inside each other); "
                             "write it flatter") from None
    except ValueError as error:
        if "integer string conversion" in str(error):
            raise yaml.YAMLError("a number has more digits than any setting takes (over 4,300)") from None
        raise yaml.YAMLError(f"a value cannot be read: {error}") from None


def parse_spec_text(text: str, *, source: str = "<spec>") -> JobSpec:
    """Validate a spec given as YAML text (the web app's "advanced" editor uses this)."""
    try:
        node = _readable(yaml.compose, text)
        data = load_yaml(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(error, "problem", None) or str(error)
        if "'\\t'" in problem:
            problem += " (indent with spaces: YAML does not take tabs)"
        raise SpecError([f"{where}: YAML syntax error: {problem}"]) from None
    if data is None:
        raise SpecError([f"{source}: the spec is empty"])
    lines, duplicates = _key_lines(node)
    if duplicates:
        raise SpecError(_duplicate_problems(duplicates, source))
    return parse_spec(data, source=source, _lines=lines)


def duplicate_key_problems(text: str, *, source: str) -> list[str]:
    """Each key that a mapping of the YAML ``text`` gives twice, as ``parse_spec_text`` names it, for a
    document that holds specs without being one (a pipeline's); ``text`` must already load."""
    return _duplicate_problems(_key_lines(_readable(yaml.compose, text))[1], source)


def _duplicate_problems(duplicates: list[tuple[str, int, int]], source: str) -> list[str]:
    return [f"{source}:{line}: {key} is given twice (first on line {first}); YAML keeps the last, "
            "so keep the one you mean and delete the other" for key, first, line in duplicates]


def dump_spec(spec: JobSpec) -> str:
    """The spec as YAML with every default filled in (written to ``<output_dir>/spec.yaml``).

    Nulls are kept: ``max_grad_norm: null`` means "no clipping", not "use the default".
    """
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


def _key_lines(node: yaml.Node | None, prefix: tuple = ()) -> tuple[dict[tuple, int], list[tuple[str, int, int]]]:
    """Map each key path in a composed YAML document (no aliases, so a tree) to its 1-based line, and
    list (dotted key, first line, repeated line) for each key a mapping gives twice: PyYAML quietly
    keeps the last value, so a spec edited by hand could train with a setting its author thought removed."""
    lines: dict[tuple, int] = {}
    duplicates: list[tuple[str, int, int]] = []
    children = []
    if isinstance(node, yaml.MappingNode):
        first_lines: dict[tuple, int] = {}
        for key_node, value_node in node.value:
            path = (*prefix, key_node.value)
            lines[path] = key_node.start_mark.line + 1
            if path in first_lines:
                duplicates.append((".".join(map(str, path)), first_lines[path], lines[path]))
            first_lines.setdefault(path, lines[path])
            children.append((path, value_node))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*prefix, index)] = item.start_mark.line + 1
            children.append(((*prefix, index), item))
    for path, child in children:
        child_lines, child_duplicates = _key_lines(child, path)
        lines.update(child_lines)
        duplicates += child_duplicates
    return lines, duplicates


def _prefix(source: str | None, line: int | None) -> str:
    if source is None:
        return ""
    return f"{source}:{line}: " if line else f"{source}: "


def _describe(err: dict, source: str | None, lines: dict[tuple, int]) -> str:
    """One line for one pydantic error: 'file:line: dotted.key: what is wrong and what is allowed'."""
    loc = tuple(part for part in err["loc"] if not _is_union_tag(part))
    value = err.get("input")
    kind = err["type"]
    message = err["msg"]
    if kind == "literal_error":
        allowed = _allowed_values(loc)
        message = f"{value!r} is not one of {', '.join(map(str, allowed))}" if allowed else message
        if isinstance(value, str) and any(not isinstance(choice, str) and str(choice) == value.strip()
                                          for choice in allowed):
            message += "; write the number without quotes"
    elif kind == "extra_forbidden":
        siblings = _allowed_keys(loc[:-1])
        message = "unknown key" + (f"; allowed keys here: {', '.join(siblings)}" if siblings else "")
    elif kind == "missing":
        message = "required key is missing"
    elif value is None and kind.endswith("_type"):
        # YAML reads "model:" with nothing after it as null; pydantic then asked for "a valid string".
        message = "nothing is written after the colon; give a value"
    elif _non_finite(value):
        message = f"{value!r} is not a finite number"
    elif kind in ("int_type", "float_type", "bool_type") and (wrong := wrongly_written_value(kind, value)):
        message = wrong
    elif words := out_of_range(kind, context=err.get("ctx", {}), field=_field_info(loc)):
        message = f"{value!r} {words}"
    elif kind == "string_pattern_mismatch" and (words := PATTERN_WORDS.get(err.get("ctx", {}).get("pattern"))):
        message = f"{value!r} is not allowed here: give {words}"
    elif kind in ("model_type", "dict_type"):
        # pydantic says "a valid dictionary or instance of DataSpec": Python's words, not the spec's.
        keys = _allowed_keys(loc)
        message = f"{value!r} is not a mapping; write it as {{key: value, ...}}" + (
            f" with keys among: {', '.join(keys)}" if keys else "")
    elif kind in ("tuple_type", "list_type"):
        message = f"{value!r} is not a list; write it as [a, b] or as lines starting with '- '"
    elif kind == "too_short" and isinstance(value, (list, tuple)):
        least = err.get("ctx", {}).get("min_length", 1)
        message = f"{list(value)!r}: give at least {least}"
    elif kind == "value_error":
        # Validators name their own field first ("group_size: ..."); fold it into the path.
        message = message.removeprefix("Value error, ")
        field, sep, rest = message.partition(": ")
        if sep and all(part.isidentifier() for part in field.split(".")):
            loc, message = (*loc, *field.split(".")), rest
    else:
        message = f"{value!r}: {message[0].lower()}{message[1:]}" if value is not None else message
    dotted = ".".join(str(part) for part in loc) or "(top level)"
    line = _line_for(loc, lines)
    return f"{_prefix(source, line)}{dotted}: {message}"


def wrongly_written_value(kind: str, value: Any) -> str | None:
    """What is wrong with a number or boolean written as another type, for a strict pydantic error of ``kind``
    (int_type, float_type, bool_type) on ``value``; None when it is no such case (the web's pipeline
    documents say it the same way)."""
    if kind == "bool_type":
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "on", "off"):
            return f"{value!r} is text (in quotes); write true or false without quotes"
        return f"{value!r} is not true or false" if isinstance(value, (int, float)) else None
    if isinstance(value, bool):
        return f"{value!r} is true or false, not a number"
    if isinstance(value, str):
        try:
            int(value) if kind == "int_type" else float(value)
        except ValueError:
            return None
        return f"{value!r} is text (in quotes); write the number without quotes: {value.strip()}"
    if kind == "int_type" and isinstance(value, float):
        return f"{value!r} is not a whole number" + (f"; write {int(value)}" if value.is_integer() else "")
    return None


RANGE_ERRORS = ("greater_than_equal", "greater_than", "less_than_equal", "less_than")


def out_of_range(kind: str, *, context: dict[str, Any], field: FieldInfo | None) -> str | None:
    """A pydantic range error of ``kind`` in the project's words, to follow the value: "is too small: give a whole
    number from 8 to 131072"; None for an error of another kind. pydantic names only the bound crossed, in its
    own words ("Input should be greater than or equal to 8"); ``field`` (the FieldInfo, where the error is a
    field's) gives the other bound too, so the answer says the whole range (the web's pipeline documents and the
    REST API's bodies say it the same way)."""
    if kind not in RANGE_ERRORS:
        return None
    bounds = dict(context)
    for constraint in field.metadata if field is not None else ():
        bounds.update({name: getattr(constraint, name) for name in ("ge", "gt", "le", "lt")
                       if getattr(constraint, name, None) is not None})
    shown = {name: _bound(value) for name, value in bounds.items() if name in ("ge", "gt", "le", "lt")}
    if "ge" in shown and "le" in shown:
        allowed = f"from {shown['ge']} to {shown['le']}"
    else:
        lower = f"at least {shown['ge']}" if "ge" in shown else f"above {shown['gt']}" if "gt" in shown else ""
        upper = f"at most {shown['le']}" if "le" in shown else f"below {shown['lt']}" if "lt" in shown else ""
        allowed = f"{lower} and {upper}" if lower and upper else lower or upper
        allowed = f"of {allowed}" if allowed.startswith("at ") and not (lower and upper) else allowed
    whole = field is not None and _unwrap(field.annotation) is int
    size = "too small" if kind.startswith("greater") else "too large"
    return f"is {size}: give a {'whole number' if whole else 'number'} {allowed}"


def _bound(value: Any) -> str:
    """A bound as a person writes it: 0, not 0.0."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _non_finite(value: Any) -> bool:
    """NaN or an infinity, as a float or as the text pydantic reads as one ('nan', '-inf')."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return False
    return isinstance(value, float) and not math.isfinite(value)


def _is_union_tag(part: Any) -> bool:
    # pydantic inserts the union member ("int", "float", "literal['a']") into error locations.
    return isinstance(part, str) and (part in {"int", "float", "str", "bool", "none"} or "[" in part)


def _line_for(loc: tuple, lines: dict[tuple, int]) -> int | None:
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _field_annotation(loc: tuple) -> Any:
    model: Any = JobSpec
    annotation: Any = None
    for part in loc:
        if isinstance(part, int):
            annotation = _unwrap(annotation, container=True)
            continue
        model = _unwrap(annotation) if annotation is not None else model
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
    return annotation


def _field_info(loc: tuple) -> FieldInfo | None:
    """The spec field at ``loc`` (None for an item of a list, or no field)."""
    if not loc or isinstance(loc[-1], int):
        return None
    model = _unwrap(_field_annotation(loc[:-1])) if loc[:-1] else JobSpec
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model.model_fields.get(loc[-1])
    return None


def _unwrap(annotation: Any, *, container: bool = False) -> Any:
    """Strip Optional[...] (and, for a list index, the tuple[...] around the item type)."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        annotation = members[0] if len(members) == 1 else annotation
        origin = typing.get_origin(annotation)
    if container and origin in (tuple, list):
        return typing.get_args(annotation)[0]
    return annotation


def _allowed_values(loc: tuple) -> tuple:
    annotation = _unwrap(_field_annotation(loc))
    return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else ()


def in_schema_order(mapping: dict[str, Any], loc: tuple = ()) -> dict[str, Any]:
    """``mapping`` (a spec, or its part at ``loc``) with its keys in the schema's order and the keys the
    schema does not name (a reward's ``args``) after them as given; nested sections and lists of them
    likewise. A spec read back from PostgreSQL, whose jsonb keeps keys by length, reads as written."""
    order = {key: index for index, key in enumerate(_allowed_keys(loc))}
    keys = sorted(mapping, key=lambda key: order.get(key, len(order)))  # stable: the rest keep their order
    return {key: _value_in_schema_order(mapping[key], (*loc, key)) for key in keys}


def _value_in_schema_order(value: Any, loc: tuple) -> Any:
    if isinstance(value, dict):
        return in_schema_order(value, loc)
    if isinstance(value, list):
        return [_value_in_schema_order(item, (*loc, index)) for index, item in enumerate(value)]
    return value


def _allowed_keys(loc: tuple) -> list[str]:
    model = _unwrap(_field_annotation(loc)) if loc else JobSpec
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def best_metric_for(spec: JobSpec) -> tuple[str, bool]:
    """(metric, higher is better) that ranks a run's checkpoints (the trainer keeps the best one, the run page marks
    it): eval loss, or for grpo and ppo the first eval metric (the first training reward when there is none; ppo's
    ``reward_model`` is ``eval/reward_model``)."""
    if spec.task == "grpo":
        first = spec.grpo.eval_metrics[0] if spec.grpo.eval_metrics else spec.grpo.rewards[0]
        return f"eval/{first.name}", True
    if spec.task == "ppo":
        if spec.ppo.eval_metrics:
            return f"eval/{spec.ppo.eval_metrics[0].name}", True
        return f"eval/{'reward_model' if spec.ppo.reward_model is not None else spec.ppo.rewards[0].name}", True
    return "eval/loss", False
