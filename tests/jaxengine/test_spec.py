"""The job spec: the issue's keys parse, and every kind of mistake is named precisely."""
import subprocess
import sys
from pathlib import Path

import pytest

from jaxengine.spec import GrpoSpec, SpecError, dump_spec, load_spec, parse_spec, parse_spec_text

ROOT = Path(__file__).resolve().parents[2]

# The example from the training issue, verbatim (with task-specific sections for dpo).
ISSUE_SPEC = """\
task: dpo
model: path/to/hf_dir
output_dir: runs/my-run
data:
  train: data/train.jsonl
  eval: data/eval.jsonl
  max_seq_len: 512
  packing: false
peft:
  method: lora
  rank: 8
  alpha: 16
  dropout: 0.0
  targets: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
  quant_bits: 4
  group_size: 64
optim:
  learning_rate: 1.0e-4
  schedule: cosine
  warmup_steps: 10
  weight_decay: 0.01
  max_grad_norm: 1.0
train:
  max_steps: 100
  batch_size: 8
  grad_accum: 1
  eval_every: 50
  save_every: 50
  seed: 0
dpo:
  beta: 0.1
  loss: sigmoid
  label_smoothing: 0.0
"""


def minimal(**overrides):
    spec = {"task": "sft", "model": "demo-tiny", "output_dir": "runs/a", "data": {"train": "t.jsonl"},
            "train": {"max_steps": 10}}
    spec.update(overrides)
    return spec


def problems_of(data) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    return caught.value.problems


def test_it_parses_the_issue_example(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(ISSUE_SPEC)
    spec = load_spec(path)
    assert spec.task == "dpo"
    assert spec.peft.method == "lora" and spec.peft.alpha == 16.0 and spec.peft.targets[-1] == "down_proj"
    assert spec.optim.schedule == "cosine" and spec.optim.learning_rate == 1.0e-4
    assert spec.train.max_steps == 100 and spec.train.epochs is None
    assert spec.dpo.beta == 0.1 and spec.dpo.loss == "sigmoid"
    assert spec.data.loss_on == "completion"


def test_defaults_fill_the_task_section():
    spec = parse_spec(minimal(task="reward"))
    assert spec.reward.center_rewards_coefficient == 0.0
    assert spec.dpo is None
    assert parse_spec(minimal(task="dpo")).dpo.loss == "sigmoid"


def test_dump_round_trips_including_nulls():
    spec = parse_spec(minimal(optim={"max_grad_norm": None}))
    again = parse_spec_text(dump_spec(spec))
    assert again == spec
    assert again.optim.max_grad_norm is None


def test_it_rejects_a_value_outside_the_choices():
    assert problems_of(minimal(optim={"schedule": "cosin"})) == [
        "optim.schedule: 'cosin' is not one of constant, linear, cosine"
    ]


def test_it_rejects_an_unknown_key_naming_it():
    [problem] = problems_of(minimal(data={"train": "t.jsonl", "packin": True}))
    assert problem.startswith("data.packin: unknown key; allowed keys here: train, eval, max_seq_len, packing")


def test_it_rejects_an_unknown_top_level_key():
    [problem] = problems_of(minimal(lora={"rank": 4}))
    assert problem.startswith("lora: unknown key; allowed keys here: task, model, output_dir, data, peft")


def test_a_section_that_is_not_a_mapping_is_named_with_its_keys():
    """QA 2026-12-04: ``parallel: 8`` read "input should be a valid dictionary or instance of ParallelSpec",
    a Python class, with nothing of what to write."""
    assert problems_of(minimal(parallel=8)) == [
        "parallel: 8 is not a mapping; write it as {key: value, ...} with keys among: data, fsdp, tensor"]
    [problem] = problems_of(minimal(peft="lora"))
    assert problem.startswith("peft: 'lora' is not a mapping; write it as {key: value, ...} with keys among: method, "
                              "rank, alpha")


def test_a_pool_name_outside_its_pattern_says_what_a_name_may_hold():
    assert problems_of(minimal(pool="TPU")) == [
        "pool: 'TPU' is not allowed here: give 1-40 lowercase letters, digits and '-', the first a letter or digit"]


def test_it_rejects_a_missing_required_key():
    data = minimal()
    del data["model"]
    assert problems_of(data) == ["model: required key is missing"]


def test_it_rejects_a_wrong_type():
    [problem] = problems_of(minimal(train={"max_steps": 10, "batch_size": "eight"}))
    assert problem.startswith("train.batch_size: 'eight': input should be a valid integer")


@pytest.mark.parametrize("yaml_line, problem", [
    ("    batch_size: \"64\"", "spec.yaml:5: train.batch_size: '64' is text (in quotes); write the number without quotes: 64"),
    ("    batch_size: 64.0", "spec.yaml:5: train.batch_size: 64.0 is not a whole number; write 64"),
    ("    batch_size: 2.5", "spec.yaml:5: train.batch_size: 2.5 is not a whole number"),
    ("    batch_size: true", "spec.yaml:5: train.batch_size: True is true or false, not a number"),
    ("    epochs: '1.5'", "spec.yaml:5: train.epochs: '1.5' is text (in quotes); write the number without quotes: 1.5"),
    ("    remat: 'true'", "spec.yaml:5: train.remat: 'true' is text (in quotes); write true or false without quotes"),
    ("    remat: 1", "spec.yaml:5: train.remat: 1 is not true or false"),
], ids=["int as text", "int as float", "int with a fraction", "int as bool", "float as text", "bool as text",
        "bool as number"])
def test_it_refuses_numbers_and_booleans_written_as_something_else(yaml_line, problem):
    """QA: batch_size: "64" (in quotes) trained with 64; YAML and JSON users who quote a number by mistake
    are told, by field, to write it without quotes."""
    text = "task: sft\nmodel: m\noutput_dir: o\ntrain:\n" + yaml_line + "\n" + (
        "    max_steps: 3\n" if "epochs" not in yaml_line else "") + "data:\n    train: t.jsonl\n"
    with pytest.raises(SpecError) as error:
        parse_spec_text(text, source="spec.yaml")
    assert error.value.problems == [problem]


@pytest.mark.parametrize("written, value", [("1e-4", 1e-4), ("3E-5", 3e-5), ("+2e-1", 0.2), (".5e-3", 5e-4),
                                            ("1.0e-4", 1e-4), ("0.0001", 1e-4)])
def test_an_exponent_without_a_dot_is_a_number(written, value):
    """QA: PyYAML (YAML 1.1) read an unquoted learning_rate: 1e-4 as text, and the spec told the user to
    write it "without quotes", which they had. The spec reads YAML 1.2's exponent form as a number."""
    text = f"task: sft\nmodel: m\noutput_dir: o\ntrain: {{max_steps: 3}}\ndata: {{train: t.jsonl}}\noptim:\n  learning_rate: {written}\n"
    assert parse_spec_text(text, source="spec.yaml").optim.learning_rate == value


def test_a_quoted_exponent_stays_text_and_pyyaml_itself_is_unchanged():
    import yaml

    text = "task: sft\nmodel: m\noutput_dir: o\ntrain: {max_steps: 3}\ndata: {train: t.jsonl}\noptim:\n  learning_rate: '1e-4'\n"
    with pytest.raises(SpecError) as error:
        parse_spec_text(text, source="spec.yaml")
    assert error.value.problems == [
        "spec.yaml:7: optim.learning_rate: '1e-4' is text (in quotes); write the number without quotes: 1e-4"]
    assert yaml.safe_load("a: 1e-4") == {"a": "1e-4"}  # the loader's resolver is its own, not SafeLoader's


def test_a_quoted_choice_of_numbers_is_named_as_text():
    assert problems_of(minimal(peft={"method": "qlora", "quant_bits": "8"})) == [
        "peft.quant_bits: '8' is not one of 4, 8; write the number without quotes"]


def test_whole_numbers_stay_welcome_where_a_fraction_is_allowed():
    spec = parse_spec(minimal(optim={"learning_rate": 1, "weight_decay": 0}))
    assert spec.optim.learning_rate == 1.0 and isinstance(spec.optim.learning_rate, float)


def test_it_rejects_out_of_range_numbers():
    [problem] = problems_of(minimal(peft={"method": "lora", "dropout": 1.5}))
    assert problem == "peft.dropout: 1.5 is too large: give a number at least 0 and below 1"
    assert problems_of(minimal(train={"max_steps": 10, "batch_size": 10**22})) == [
        "train.batch_size: 10000000000000000000000 is too large: give a whole number from 1 to 65536"]
    # pydantic named only the bound crossed, in its words ("input should be greater than 0"): the range is the
    # field's, both ends.
    assert problems_of(minimal(optim={"learning_rate": 0}, data={"train": "d", "max_seq_len": 4})) == [
        "data.max_seq_len: 4 is too small: give a whole number from 8 to 131072",
        "optim.learning_rate: 0 is too small: give a number above 0 and at most 1"]
    assert problems_of(minimal(optim={"warmup_steps": -1})) == [
        "optim.warmup_steps: -1 is too small: give a whole number of at least 0"]


def test_it_rejects_an_unknown_lora_target_naming_the_item():
    assert problems_of(minimal(peft={"targets": ["q_proj", "qkv"]})) == [
        "peft.targets.1: 'qkv' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"
    ]


def test_it_rejects_both_or_neither_length():
    assert problems_of(minimal(train={"max_steps": 5, "epochs": 1})) == [
        "train: give exactly one of max_steps and epochs (both given)"
    ]
    assert problems_of(minimal(train={})) == ["train: give exactly one of max_steps and epochs (neither given)"]


def test_it_rejects_cross_field_mistakes_naming_the_field():
    assert problems_of(minimal(peft={"method": "qlora", "group_size": 48})) == [
        "peft.group_size: 48 is not a power of two (e.g. 32, 64, 128)"
    ]
    assert problems_of(minimal(task="dpo", dpo={"loss": "ipo", "label_smoothing": 0.1})) == [
        "dpo.label_smoothing: only used with loss sigmoid, robust, exo_pair, aot, aot_pair (loss is 'ipo')"
    ]
    assert problems_of(minimal(peft={"quant_bits": 3})) == ["peft.quant_bits: 3 is not one of 4, 8"]
    assert problems_of(minimal(data={"train": "t.jsonl", "eval_group_by": "task"})) == [
        "data.eval_group_by: 'task' groups the eval rows, but data.eval is not set"
    ]
    assert parse_spec(minimal(data={"train": "t.jsonl", "eval": "e.jsonl", "eval_group_by": "task"})
                      ).data.eval_group_by == "task"


def test_trls_dpo_variants_parse_and_their_settings_are_checked():
    for loss in ("robust", "exo_pair", "nca_pair", "sppo_hard", "apo_zero", "apo_down", "discopop", "kto_pair", "aot",
                 "aot_pair", "bco_pair"):
        assert parse_spec(minimal(task="dpo", dpo={"loss": loss})).dpo.loss == loss
    for loss in ("robust", "exo_pair", "aot", "aot_pair"):  # label noise and EXO's epsilon: read label_smoothing
        assert parse_spec(minimal(task="dpo", dpo={"loss": loss, "label_smoothing": 0.1})).dpo.label_smoothing == 0.1
    assert problems_of(minimal(task="dpo", dpo={"loss": "nca_pair", "label_smoothing": 0.1})) == [
        "dpo.label_smoothing: only used with loss sigmoid, robust, exo_pair, aot, aot_pair (loss is 'nca_pair')"
    ]
    assert parse_spec(minimal(task="dpo", dpo={"loss": "discopop"})).dpo.discopop_tau == 0.05
    assert parse_spec(minimal(task="dpo", dpo={"loss": "discopop", "discopop_tau": 1})).dpo.discopop_tau == 1.0
    for tau in (0, -0.1, 1.5, "warm"):
        [problem] = problems_of(minimal(task="dpo", dpo={"loss": "discopop", "discopop_tau": tau}))
        assert problem.startswith("dpo.discopop_tau: "), problem
    # bco_pair reads beta alone: its running mean is no setting.
    assert problems_of(minimal(task="dpo", dpo={"loss": "bco_pair", "label_smoothing": 0.1})) == [
        "dpo.label_smoothing: only used with loss sigmoid, robust, exo_pair, aot, aot_pair (loss is 'bco_pair')"
    ]
    assert problems_of(minimal(task="dpo", dpo={"loss": "bco_paired"}))[0].startswith(
        "dpo.loss: 'bco_paired' is not one of")


def test_it_rejects_a_section_for_another_task():
    assert problems_of(minimal(dpo={"beta": 0.2})) == [
        "dpo: only used when task is dpo (task is 'sft'); remove it"
    ]


def test_a_section_for_another_task_is_named_beside_the_other_problems():
    """QA: under task grpo, a 'ppo:' section (and no grpo one) was reported only as 'grpo.rewards:
    required key is missing', never saying that the section written was another task's."""
    text = ("task: grpo\nmodel: m\noutput_dir: o\ndata: {train: t.jsonl}\ntrain: {max_steps: 1}\n"
            "ppo: {rewards: [{name: exact_match}]}\n")
    with pytest.raises(SpecError) as caught:
        parse_spec_text(text, source="s.yaml")
    assert caught.value.problems == ["s.yaml: grpo.rewards: required key is missing",
                                     "s.yaml:6: ppo: only used when task is ppo (task is 'grpo'); remove it"]


@pytest.mark.parametrize("yaml_lines, problem", [
    ("data: t.jsonl\ntrain: {max_steps: 1}",
     "s.yaml:4: data: 't.jsonl' is not a mapping; write it as {key: value, ...} with keys among: train, eval, "
     "max_seq_len, packing, loss_on, columns, eval_group_by, chat_template_kwargs, run_spec_template_kwargs"),
    ("data: {train: t.jsonl, columns: [prompt]}\ntrain: {max_steps: 1}",
     "s.yaml:4: data.columns: ['prompt'] is not a mapping; write it as {key: value, ...}"),
    ("data: {train: t.jsonl}\ntrain: {max_steps: 1}\npeft: {targets: q_proj}",
     "s.yaml:6: peft.targets: 'q_proj' is not a list; write it as [a, b] or as lines starting with '- '"),
    ("data: {train: t.jsonl}\ntrain: {max_steps: 1}\ntask: grpo\ngrpo: {rewards: [exact_match]}",
     "s.yaml:6: grpo.rewards.0: 'exact_match' is not a mapping; write it as {key: value, ...} with keys among: "
     "name, weight, args"),
], ids=["section as text", "mapping as list", "list as text", "reward as its name"])
def test_a_mapping_or_list_written_as_something_else_is_named_in_spec_words(yaml_lines, problem):
    """QA: these said 'input should be a valid dictionary or instance of DataSpec' and 'a valid tuple':
    Python's words, naming a class the user never wrote."""
    with pytest.raises(SpecError) as caught:
        parse_spec_text("model: m\noutput_dir: o\n" + ("" if "task:" in yaml_lines else "task: sft\n") + yaml_lines
                        + "\n", source="s.yaml")
    assert caught.value.problems == [problem]


def test_it_reports_every_problem_at_once_with_file_lines(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(ISSUE_SPEC.replace("schedule: cosine", "schedule: cosin").replace("rank: 8", "rnk: 8"))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert caught.value.problems == [
        f"{path}:11: peft.rnk: unknown key; allowed keys here: method, rank, alpha, dropout, targets, "
        "quant_bits, group_size",
        f"{path}:19: optim.schedule: 'cosin' is not one of constant, linear, cosine",
    ]
    assert "optim.schedule" in str(caught.value)


def test_it_reports_yaml_syntax_errors_with_line_and_column():
    with pytest.raises(SpecError) as caught:
        parse_spec_text("task: sft\ndata:\n  train: [a.jsonl\nmodel: m\n", source="s.yaml")
    [problem] = caught.value.problems
    assert problem.startswith("s.yaml:4:6: YAML syntax error:")


def test_it_rejects_a_spec_that_is_not_a_mapping():
    with pytest.raises(SpecError, match="the spec must be a mapping of keys, got list"):
        parse_spec_text("- task\n- sft\n", source="s.yaml")
    with pytest.raises(SpecError, match="s.yaml: the spec is empty"):
        parse_spec_text("", source="s.yaml")


def test_a_task_that_is_not_a_name_is_refused_naming_the_key():
    """A list or mapping as the task used to raise TypeError (unhashable) before validation."""
    for task in (["sft"], {"a": 1}):
        [problem] = problems_of(minimal(task=task))
        assert problem.startswith("task: ") and "sft" in problem


def test_yaml_aliases_are_refused_before_they_expand():
    """Nine aliases to a list of nine aliases, eight levels deep (1.5 KB), expanded to 9**9 items: pasted
    into the launch form it took the web process to 11 GB for two minutes. An alias into itself was a
    recursion once. A spec has no use for aliases; an anchor alone is harmless. (Three levels here: the
    refusal comes at the first alias, before anything expands.)"""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 9)}]" for level in range(1, 3)]
    for text, line in (("\n".join(levels) + "\n", 2), ("task: sft\nnotes: &a [*a]\n", 2)):
        with pytest.raises(SpecError) as caught:
            parse_spec_text(text, source="s.yaml")
        [problem] = caught.value.problems
        assert problem.startswith(f"s.yaml:{line}:") and problem.endswith(
            "aliases (*name) are not allowed in a spec; write the value out")
    minimal_with_anchor = "task: sft\nmodel: m\noutput_dir: o\ndata: {train: t.jsonl}\ntrain: &t {max_steps: 1}\n"
    assert parse_spec_text(minimal_with_anchor).train.max_steps == 1


def test_it_names_a_missing_file(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.yaml")


def test_importing_the_spec_loads_no_jax():
    code = (
        "import sys, jaxengine.spec;"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'jax','jaxlib','flax','optax','orbax','torch'});"
        "print(','.join(heavy)); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"jaxengine.spec imported: {result.stdout} {result.stderr}"


def test_it_rejects_packing_for_preference_tasks():
    assert problems_of(minimal(task="dpo", data={"train": "p.jsonl", "packing": True})) == [
        "data.packing: only supported for pretrain and sft (task is 'dpo')"
    ]


def test_it_rejects_loss_on_all_outside_sft():
    assert problems_of(minimal(task="dpo", data={"train": "p.jsonl", "loss_on": "all"})) == [
        "data.loss_on: 'all' only applies to sft (task is 'dpo'); pretrain always trains every token, reward and "
        "dpo score the completions"
    ]


def test_column_names_map_onto_the_task_fields():
    spec = parse_spec(minimal(data={"train": "t.jsonl", "columns": {"prompt": "question", "completion": "reply"}}))
    assert spec.data.columns == {"prompt": "question", "completion": "reply"}
    assert problems_of(minimal(data={"train": "t.jsonl", "columns": {"chosen": "good"}})) == [
        "data.columns: chosen not a field of the sft data that task 'sft' reads; fields: prompt, completion, messages"
    ]


# The RL issue's grpo example, verbatim in the keys it names.
GRPO_SPEC = """\
task: grpo
model: demo-tiny
output_dir: runs/grpo
data: {train: prompts.jsonl, eval: prompts_eval.jsonl}
train: {max_steps: 10}
grpo:
  num_generations: 8
  max_new_tokens: 128
  temperature: 1.0
  top_p: 1.0
  beta: 0.04
  kl_estimator: k3
  epsilon: 0.2
  epsilon_high: 0.2
  loss_type: grpo
  advantage: group
  num_iterations: 1
  mask_truncated: false
  dynamic_sampling: false
  rewards:
    - {name: exact_match, weight: 1.0, args: {answer_column: answer}}
    - {name: format_regex, weight: 0.2, args: {pattern: "Answer: .+"}}
"""


def test_it_parses_the_rl_issue_grpo_example():
    spec = parse_spec_text(GRPO_SPEC)
    assert spec.grpo.num_generations == 8 and spec.grpo.rewards[1].weight == 0.2
    assert spec.grpo.rewards[1].args == {"pattern": "Answer: .+"}
    assert parse_spec_text(dump_spec(spec)) == spec


def test_it_names_bad_reward_functions_and_args_with_lines():
    text = GRPO_SPEC.replace("name: format_regex, weight: 0.2, args: {pattern: \"Answer: .+\"}",
                             "name: format_regex, args: {pattern: \"(\"}")
    text = text.replace("args: {answer_column: answer}", "args: {colum: answer}")
    with pytest.raises(SpecError) as error:
        parse_spec_text(text, source="grpo.yaml")
    assert error.value.problems == [
        "grpo.yaml:21: grpo.rewards.0.args.colum: exact_match: unknown argument colum; allowed: answer_column, "
        "case_sensitive, extract, group, pattern",
        "grpo.yaml:22: grpo.rewards.1.args.pattern: format_regex: pattern '(' is not a regular expression "
        "(missing ), unterminated subpattern at position 0)",
    ]
    wrong_value = GRPO_SPEC.replace('args: {pattern: "Answer: .+"}', 'args: {pattern: "x", full_match: "yes"}')
    with pytest.raises(SpecError) as error:
        parse_spec_text(wrong_value, source="grpo.yaml")
    assert error.value.problems == ["grpo.yaml:22: grpo.rewards.1.args.full_match: format_regex: full_match must be "
                                    "true or false, got 'yes'"]
    unknown = GRPO_SPEC.replace("name: exact_match", "name: exactmatch")
    with pytest.raises(SpecError, match=r"grpo.rewards.0.name: 'exactmatch' is not a reward function; registered: "):
        parse_spec_text(unknown)


def test_it_rejects_grpo_mistakes():
    assert problems_of(minimal(task="grpo")) == ["grpo.rewards: required key is missing"]
    one = {"rewards": [{"name": "valid_json"}]}
    assert problems_of(minimal(task="grpo", grpo={**one, "num_generations": 1})) == [
        "grpo.num_generations: 1 is too small: give a whole number of at least 2"]
    assert problems_of(minimal(task="grpo", grpo={**one, "loss_type": "ppo"})) == [
        "grpo.loss_type: 'ppo' is not one of grpo, dr_grpo, dapo, gspo"]
    assert problems_of(minimal(task="grpo", grpo={"rewards": []})) == [
        "grpo.rewards: give at least one reward function, e.g. {name: exact_match}"]
    assert problems_of(minimal(task="grpo", grpo={"rewards": [{"name": "valid_json"}] * 2})) == [
        "grpo.rewards: ['valid_json', 'valid_json'] names a function twice; give it once with its weight"]
    assert problems_of(minimal(task="grpo", grpo={**one, "eval_metrics": [{"name": "valid_json"}]})) == [
        "grpo.eval_metrics: ['valid_json'] repeats a name (training rewards ['valid_json'] are already scored at "
        "every evaluation)"]
    assert problems_of(minimal(task="sft", grpo=one)) == [
        "grpo: only used when task is grpo (task is 'sft'); remove it"]


def test_it_rejects_a_ppo_batch_of_one_completion():
    """QA: PPO whitens advantages over a step's completions, so a step needs two; a spec of train.batch_size 1
    was accepted (the launch form, the YAML view, the API) and the run failed at its start instead."""
    ppo = {"reward_model": "runs/r"}
    message = ("train.batch_size: PPO needs at least 2 completions per step (batch_size 1 × grad_accum 1) to "
               "whiten advantages over the batch; raise train.batch_size or train.grad_accum")
    assert problems_of(minimal(task="ppo", ppo=ppo, train={"max_steps": 10, "batch_size": 1})) == [message]
    assert parse_spec(minimal(task="ppo", ppo=ppo, train={"max_steps": 10, "batch_size": 1, "grad_accum": 2}))
    # GRPO's completions are its groups': one prompt of num_generations completions is enough.
    assert parse_spec(minimal(task="grpo", grpo={"rewards": [{"name": "valid_json"}]},
                              train={"max_steps": 10, "batch_size": 1}))


def test_it_rejects_eval_metrics_without_eval_data():
    """They are scored on data.eval only: without it, the spec was accepted and they silently did nothing."""
    scored = [{"name": "exact_match"}, {"name": "valid_json"}]
    grpo = {"rewards": [{"name": "format_regex", "args": {"pattern": "x"}}], "eval_metrics": scored}
    assert problems_of(minimal(task="grpo", grpo=grpo)) == [
        "grpo.eval_metrics: ['exact_match', 'valid_json'] are scored on data.eval only, and data.eval is not set, "
        "so they would never be scored; add data.eval (held-out prompts) or remove grpo.eval_metrics"]
    ppo = {"reward_model": "runs/r", "eval_metrics": scored[:1]}
    assert problems_of(minimal(task="ppo", ppo=ppo)) == [
        "ppo.eval_metrics: ['exact_match'] are scored on data.eval only, and data.eval is not set, "
        "so they would never be scored; add data.eval (held-out prompts) or remove ppo.eval_metrics"]
    with_eval = {"train": "t.jsonl", "eval": "e.jsonl"}
    assert parse_spec(minimal(task="grpo", data=with_eval, grpo=grpo)).grpo.eval_metrics[1].name == "valid_json"
    assert parse_spec(minimal(task="ppo", data=with_eval, ppo=ppo)).ppo.eval_metrics[0].name == "exact_match"
    # From a file, at the key's line.
    text = ("task: ppo\nmodel: demo-tiny\noutput_dir: runs/a\ndata: {train: t.jsonl}\ntrain: {max_steps: 10}\n"
            "ppo:\n  reward_model: runs/r\n  eval_metrics:\n    - name: exact_match\n")
    with pytest.raises(SpecError) as caught:
        parse_spec_text(text, source="spec.yaml")
    assert caught.value.problems[0].startswith("spec.yaml:8: ppo.eval_metrics: ['exact_match'] are scored")


def test_a_warmup_as_long_as_the_run_is_warned_of_when_the_steps_are_known():
    from jaxengine.spec import spec_warnings

    def warnings(train, *, warmup=10, task="sft", **known):
        extra = {"grpo": {"rewards": [{"name": "valid_json"}]}} if task == "grpo" else {}
        return spec_warnings(parse_spec(minimal(task=task, train=train, optim={"warmup_steps": warmup}, **extra)),
                             **known)

    assert warnings({"max_steps": 10}) == [
        "optim.warmup_steps: 10 is not below the run's 10 optimizer steps (train.max_steps), so the learning rate "
        "never reaches optim.learning_rate 0.0001: the run ends still warming up; give warmup_steps below 10 "
        "(a tenth of the steps is common) or train longer"]
    assert warnings({"max_steps": 11}) == []  # the peak at step index 10, the last step's
    assert warnings({"max_steps": 5}, warmup=0) == []
    # train.epochs: known only with data.train's row count; 2 epochs of 36 rows in steps of 4 × 2 rows: 9 at most.
    epochs = {"epochs": 2, "batch_size": 4, "grad_accum": 2}
    assert warnings(epochs) == []
    assert warnings(epochs, train_rows=36, warmup=8) == []
    assert warnings(epochs, train_rows=36, warmup=9, task="grpo") == [
        "optim.warmup_steps: 9 is not below the run's 9 optimizer steps (at most: train.epochs 2 × 36 rows of "
        "data.train / (train.batch_size 4 × train.grad_accum 2)), so the learning rate never reaches "
        "optim.learning_rate 0.0001: the run ends still warming up; give warmup_steps below 9 (a tenth of the "
        "steps is common) or train longer"]
    # pretrain cuts a long text into several rows: its row count bounds no step count.
    assert warnings(epochs, train_rows=36, warmup=9, task="pretrain") == []


def test_a_step_larger_than_the_epochs_asked_for_is_warned_of():
    """Found launching sft with train.epochs 1 at train.batch_size 300 × grad_accum 2 over 200 rows: the form said
    ready, and the run made its one step of 600 rows, 3 passes over the data (its epoch metric ended at 3)."""
    from jaxengine.spec import spec_warnings

    def warnings(train, *, task="sft", **known):
        extra = {"grpo": {"rewards": [{"name": "valid_json"}]}} if task == "grpo" else {}
        return spec_warnings(parse_spec(minimal(task=task, train=train, **extra)), **known)

    big = {"epochs": 1, "batch_size": 300, "grad_accum": 2}
    assert warnings(big, train_rows=200) == [
        "train.epochs: one optimizer step takes 600 rows (train.batch_size 300 × train.grad_accum 2), more than "
        "train.epochs 1 × the 200 rows of data.train, so the run's one step trains 3 passes over the data, not 1; "
        "give train.batch_size × train.grad_accum at most 200, or train.max_steps instead of train.epochs"]
    assert warnings(big, train_rows=600) == []  # one step, one pass
    assert warnings(big) == []  # rows not known
    assert warnings({**big, "epochs": 3}, train_rows=200) == []
    assert warnings({"max_steps": 1, "batch_size": 300, "grad_accum": 2}, train_rows=200) == []  # steps asked for
    assert warnings(big, train_rows=200, task="pretrain") == []  # a long text makes several rows


def test_evaluations_asked_for_without_eval_data_are_warned_of():
    from jaxengine.spec import spec_warnings

    lonely = parse_spec(minimal(train={"max_steps": 100, "eval_every": 50}))
    assert spec_warnings(lonely) == [
        "train.eval_every: 50 evaluates nothing, as data.eval is not given: the run logs training metrics only; "
        "give data.eval (held-out rows in data.train's format) or leave eval_every out"]
    assert spec_warnings(parse_spec(minimal(train={"max_steps": 100, "eval_every": 50},
                                            data={"train": "t.jsonl", "eval": "e.jsonl"}))) == []
    assert spec_warnings(parse_spec(minimal(train={"max_steps": 100}))) == []


def test_evaluation_on_the_training_data_itself_is_warned_of():
    """QA: the demo project has one preference dataset, and a first-time DPO or reward run picked it as its
    evaluation data too: its eval accuracy scored pairs it trained on, and nothing said so."""
    from jaxengine.spec import spec_warnings

    same = parse_spec(minimal(data={"train": "t.jsonl", "eval": "t.jsonl"}, train={"max_steps": 100, "eval_every": 50}))
    assert spec_warnings(same) == [
        "data.eval: the same data as data.train, so each evaluation scores rows the run trains on and its eval "
        "metrics say more of memory than of what the model learned; give held-out rows (another dataset, or a "
        "version of this one without them)"]
    held_out = parse_spec(minimal(data={"train": "t.jsonl", "eval": "e.jsonl"}, train={"max_steps": 100}))
    assert spec_warnings(held_out) == []


def _schema_keys(model=None, prefix=""):
    """Every settable key of the spec as a dotted path -> its pydantic field (sections recursed into)."""
    from pydantic import BaseModel

    from jaxengine.spec import JobSpec, _unwrap

    keys = {}
    for name, field in (model or JobSpec).model_fields.items():
        section = _unwrap(field.annotation)
        if isinstance(section, type) and issubclass(section, BaseModel):
            keys.update(_schema_keys(section, f"{prefix}{name}."))
        else:
            keys[f"{prefix}{name}"] = field
    return keys


def _readme_key_table() -> dict[str, str]:
    """The README's "Job spec" table: dotted key -> the default cell as written.

    A row may name several keys of one section (`optim.adam_beta1` / `adam_beta2`), with defaults
    separated the same way (0.9 / 0.999)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Job spec\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        key_cell, default_cell = (cell.strip() for cell in line.strip("|").split(" | ")[:2])
        names = [name.strip().strip("`") for name in key_cell.split(" / ")]
        defaults = [part.strip() for part in default_cell.split(" / ")]
        if len(defaults) != len(names):
            defaults = defaults[:1] * len(names)
        parent = names[0].rpartition(".")[0]
        for name, default in zip(names, defaults):
            rows[name if "." in name or not parent else f"{parent}.{name}"] = default
    return rows


def _readme_default(cell: str):
    """The Python value a README default cell stands for: YAML, where a bare 'none' means no value."""
    import yaml

    from jaxengine.spec import ALL_PROJECTIONS

    if cell == "none":
        return None
    if cell == "all seven":
        return list(ALL_PROJECTIONS)
    try:
        return float(cell)
    except ValueError:
        return yaml.safe_load(cell.strip("`"))


def test_the_readme_documents_every_spec_key_with_its_default():
    from pydantic_core import PydanticUndefined

    schema = _schema_keys()
    table = _readme_key_table()
    assert sorted(set(schema) - set(table)) == [], "spec keys missing from the README's Job spec table"
    assert sorted(set(table) - set(schema)) == [], "README Job spec rows naming no spec key"
    for key, field in schema.items():
        cell = table[key]
        if cell == "see below":  # parallel.*: the layout without the section is explained under the table
            continue
        if field.default is PydanticUndefined and field.default_factory is None:
            assert cell == "required", key
        elif cell == "one required":  # train.max_steps / train.epochs: None, and the validator wants one
            assert field.default is None, key
        else:
            default = field.default_factory() if field.default_factory else field.default
            default = list(default) if isinstance(default, tuple) else default
            expected = _readme_default(cell)
            if isinstance(expected, float) and not isinstance(default, bool):
                assert default == pytest.approx(expected, rel=1e-12), (key, cell, default)
            else:
                assert default == expected, (key, cell, default)


def test_the_readme_first_spec_is_valid_and_reads_what_demo_base_writes():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Engine CLI: train and demo-base\n", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = parse_spec_text(example, source="README.md")
    assert spec.model == "demo-tiny"
    demo_out = section.split("jaxengine demo-base --out ", 1)[1].split()[0]  # the DIR of the block above it
    assert {spec.data.train, spec.data.eval} == {f"{demo_out}/data/sft.jsonl", f"{demo_out}/data/eval.jsonl"}


def test_a_key_given_twice_is_named_with_both_lines():
    # PyYAML keeps the last value: a spec edited by hand could train with the setting its author removed.
    text = ("task: sft\nmodel: m\noutput_dir: o\ndata:\n  train: t.jsonl\noptim:\n  learning_rate: 1.0e-4\n"
            "  learning_rate: 1.0e-3\ngrpo:\n  rewards:\n    - {name: exact_match, weight: 1, weight: 2}\n"
            "train: {max_steps: 1}\n")
    with pytest.raises(SpecError) as caught:
        parse_spec_text(text, source="s.yaml")
    assert caught.value.problems == [
        "s.yaml:8: optim.learning_rate is given twice (first on line 7); YAML keeps the last, so keep the one you "
        "mean and delete the other",
        "s.yaml:11: grpo.rewards.0.weight is given twice (first on line 11); YAML keeps the last, so keep the one "
        "you mean and delete the other"]
    assert parse_spec_text(text.replace("  learning_rate: 1.0e-3\n", "").replace(", weight: 2", "").replace(
        "grpo:\n  rewards:\n    - {name: exact_match, weight: 1}\n", ""), source="s.yaml").optim.learning_rate == 1e-4


def test_a_spec_in_any_key_order_is_put_in_the_schemas_order():
    """PostgreSQL's jsonb gives a stored spec back with its keys by length: the run page's YAML must not."""
    from jaxengine.spec import in_schema_order

    stored = {"train": {"seed": 0, "max_steps": 5}, "task": "grpo", "model": "bm_x",
              "grpo": {"rewards": [{"weight": 1.0, "args": {"zeta": 1, "alpha": 2}, "name": "exact_match"}],
                       "num_generations": 4},
              "data": {"train": "dv_x", "max_seq_len": 64}}
    ordered = in_schema_order(stored)
    assert list(ordered) == ["task", "model", "data", "train", "grpo"]
    assert list(ordered["data"]) == ["train", "max_seq_len"] and list(ordered["train"]) == ["max_steps", "seed"]
    assert list(ordered["grpo"]) == ["num_generations", "rewards"]
    assert list(ordered["grpo"]["rewards"][0]) == ["name", "weight", "args"]
    assert list(ordered["grpo"]["rewards"][0]["args"]) == ["zeta", "alpha"]  # free-form: as given
    assert ordered == stored


def test_a_key_written_with_nothing_after_its_colon_is_named_as_such():
    text = "task: sft\nmodel:\noutput_dir: runs/a\ndata: {train: }\ntrain: {max_steps: 2, batch_size: }\n"
    with pytest.raises(SpecError) as caught:
        parse_spec_text(text, source="spec.yaml")
    assert caught.value.problems == [
        "spec.yaml:2: model: nothing is written after the colon; give a value",
        "spec.yaml:4: data.train: nothing is written after the colon; give a value",
        "spec.yaml:5: train.batch_size: nothing is written after the colon; give a value"]


def test_it_rejects_a_reward_weight_that_is_no_finite_number():
    """QA: a weight of .nan or .inf was accepted, and the run spent its first rollout and update to fail with
    'loss is nan ... lower optim.learning_rate', pointing away from the weight."""
    for weight in (float("nan"), float("inf")):
        assert problems_of(minimal(task="grpo", grpo={"rewards": [{"name": "valid_json", "weight": weight}]})) == [
            f"grpo.rewards.0.weight: {weight!r} is not a finite number"]
        assert problems_of(minimal(task="ppo", ppo={"rewards": [{"name": "valid_json", "weight": weight}]})) == [
            f"ppo.rewards.0.weight: {weight!r} is not a finite number"]


def test_it_rejects_an_upper_clip_below_the_lower_naming_both():
    """QA: grpo.epsilon_high below grpo.epsilon was accepted: the clip range [1 - epsilon, 1 + epsilon_high]
    then favours lowering probabilities, the opposite of DAPO's clip-higher, and nothing said so."""
    grpo = {"rewards": [{"name": "valid_json"}], "epsilon": 0.2, "epsilon_high": 0.1}
    assert problems_of(minimal(task="grpo", grpo=grpo)) == [
        "grpo.epsilon_high: 0.1 is below grpo.epsilon 0.2; give epsilon_high at least epsilon (equal, or null: the "
        "symmetric PPO clip; larger: DAPO's clip-higher), or lower epsilon"]
    assert parse_spec(minimal(task="grpo", grpo={**grpo, "epsilon_high": 0.2})).grpo.upper_clip == 0.2
    assert parse_spec(minimal(task="grpo", grpo={**grpo, "epsilon_high": 0.28})).grpo.upper_clip == 0.28
    # The launch form shows the field's description: it states the rule before anyone breaks it.
    assert GrpoSpec.model_fields["epsilon_high"].description == (
        "Upper clip of the policy ratio: 1 + epsilon_high; at least epsilon; null: equal to epsilon (the symmetric "
        "PPO clip; larger: DAPO's clip-higher).")


def test_a_wider_grpo_clip_needs_only_epsilon():
    """epsilon_high defaulted to 0.2 where PPO's follows epsilon, so `grpo: {epsilon: 0.3}` alone was refused
    as an upper clip below the lower one the user never gave."""
    grpo = {"rewards": [{"name": "valid_json"}]}
    assert parse_spec(minimal(task="grpo", grpo={**grpo, "epsilon": 0.3})).grpo.upper_clip == 0.3
    assert parse_spec(minimal(task="grpo", grpo=grpo)).grpo.upper_clip == 0.2  # the default clip is unchanged


def test_it_rejects_a_pattern_without_regex_extraction():
    """QA: a pattern given with another extraction (the default full, or last_number) was silently ignored:
    the reward scored the whole text or the last number while the spec read as if it used the pattern."""
    term = {"name": "exact_match", "args": {"pattern": r"#### (\d+)"}}
    assert problems_of(minimal(task="grpo", grpo={"rewards": [term]})) == [
        "grpo.rewards.0.args.pattern: exact_match: pattern is read only with extract: regex (extract is 'full'); "
        "set extract to regex, or remove pattern"]
    assert parse_spec(minimal(task="grpo", grpo={"rewards": [{**term, "args": {**term["args"], "extract": "regex"}}]}))


def test_it_rejects_a_reward_model_batch_or_length_of_zero():
    """QA: reward_model's batch_size 0 and max_seq_len 0 passed the spec check; the run then failed (or
    looped) in the reward model's first scoring, a whole rollout in."""
    for argument in ("batch_size", "max_seq_len"):
        term = {"name": "reward_model", "args": {"model": "runs/r", argument: 0}}
        assert problems_of(minimal(task="grpo", grpo={"rewards": [term]})) == [
            f"grpo.rewards.0.args.{argument}: reward_model: {argument} must be at least 1, got 0"]


def test_a_file_s_problems_are_listed_in_the_order_of_its_lines(tmp_path):
    """QA: `jaxengine train` listed a spec's problems in the order of the spec's sections (data, optim, train),
    so a file's read as lines 4, 6, 5; a key missing from the file (no line) comes first."""
    path = tmp_path / "spec.yaml"
    path.write_text("task: sft\nmodel: m\ndata: {train: t.jsonl, max_seq_len: '64'}\n"
                    "train: {max_steps: 0}\noptim: {learning_rate: 1e-3, bogus: 1}\nparallel: {data: 'two'}\n")
    with pytest.raises(SpecError) as excinfo:
        load_spec(path)
    assert [problem.split(": ")[:2] for problem in excinfo.value.problems] == [
        [str(path), "output_dir"], [f"{path}:3", "data.max_seq_len"], [f"{path}:4", "train.max_steps"],
        [f"{path}:5", "optim.bogus"], [f"{path}:6", "parallel.data"]]


def test_a_batch_of_one_row_that_does_not_split_is_said_in_the_singular():
    """It read "1 rows do not split"."""
    from jaxengine.spec import batch_split_problem

    spec = parse_spec(minimal(train={"max_steps": 10, "batch_size": 1}))
    assert batch_split_problem(spec, 2) == ("train.batch_size: 1 row does not split over parallel data × fsdp = 2 "
                                            "devices; give a multiple of 2, or move devices to parallel.tensor")


def test_a_bad_list_element_is_named_once_without_the_list_called_too_short():
    """Session-33 audit: targets: [zz] read "peft.targets: ['zz']: give at least 1" beside the element's own
    problem; an empty list is still too short."""
    assert problems_of(minimal(peft={"method": "lora", "targets": ["zz"]})) == [
        "peft.targets.0: 'zz' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"]
    assert problems_of(minimal(peft={"method": "lora", "targets": []})) == ["peft.targets: []: give at least 1"]
