"""The launch form built from the spec schema: widgets per type, values read back."""
from typing import Literal

import pytest
from django.core.exceptions import ValidationError
from django.http import QueryDict
from pydantic import BaseModel, Field

from webapp.runs import specform


class Term(BaseModel):
    name: str
    weight: float = 1.0


class Section(BaseModel):
    """``demo``: every kind of key."""

    mode: Literal["a", "b"] = "a"
    on: bool = False
    rate: float | None = Field(default=None, description="A rate.")
    names: tuple[Literal["x", "y"], ...] = ("x",)
    terms: tuple[Term, ...] = Field(default=(Term(name="t"),), description="Terms.")
    label: str = "hi"


def fields():
    return {key: specform._spec_field("demo", key, info) for key, info in Section.model_fields.items()}


def test_each_type_gets_its_widget():
    built = fields()
    assert [built[key].widget for key in ("mode", "on", "rate", "names", "terms", "label")] == [
        "select", "checkbox", "number", "multi", "json", "text"]
    assert built["mode"].choices == ("a", "b") and built["rate"].optional and built["rate"].help == "A rate."
    assert built["terms"].default == [{"name": "t", "weight": 1.0}]


def test_values_are_read_back_and_bad_json_names_its_key(monkeypatch):
    section = specform.SpecSection(name="demo", title="demo", fields=tuple(fields().values()))
    monkeypatch.setattr(specform, "form_sections", lambda task: [section])
    monkeypatch.setattr(specform, "task_section_names", lambda task: ("data", "demo"))
    data = QueryDict(mutable=True)
    data.update({"model": "bm_x", "data.train": "dv_y", "demo.mode": "b", "demo.on": "on", "demo.rate": "",
                 "demo.terms": '[{"name": "u", "weight": 2}]', "demo.label": "there"})
    data.setlist("demo.names", ["x", "y"])
    spec = specform.spec_from_form("sft", data)
    assert spec["demo"] == {"mode": "b", "on": True, "rate": None, "names": ["x", "y"],
                            "terms": [{"name": "u", "weight": 2}], "label": "there"}
    assert spec["data"] == {"train": "dv_y"}
    data["demo.terms"] = "[{name: u}]"
    with pytest.raises(ValidationError) as caught:
        specform.spec_from_form("sft", data)
    assert "demo.terms" in caught.value.message_dict


def test_data_columns_are_not_a_form_field():
    names = {field.name for section in specform.form_sections("sft") for field in section.fields}
    assert "data.columns" not in names and "data.train" not in names and "data.max_seq_len" in names


def test_every_list_of_reward_terms_is_a_reward_list_for_every_task():
    from jaxengine.spec import RewardTermSpec

    for task in specform.tasks():
        built = {field.name: field for section in specform.form_sections(task) for field in section.fields}
        for name in specform.task_section_names(task):
            for key, info in specform.section_model(name).model_fields.items():
                item = specform._strip_optional(info.annotation)[0]
                if specform.typing.get_args(item)[:1] == (RewardTermSpec,):
                    assert built[f"{name}.{key}"].widget == "rewards", (task, key)
    grpo = {field.name: field for section in specform.form_sections("grpo") for field in section.fields}
    assert grpo["grpo.rewards"].widget == grpo["grpo.eval_metrics"].widget == "rewards"


def test_reward_rows_are_read_in_order_with_typed_arguments():
    data = QueryDict(mutable=True)
    data.update({"r.2.name": "length_target", "r.2.args.length_target.target": "12",
                 "r.2.args.length_target.unit": "words", "r.0.name": "valid_json", "r.0.weight": "2.5",
                 "r.0.args.valid_json.require_object": "false", "r.1.name": "",
                 "r.5.name": "numeric_match", "r.5.args.numeric_match.tolerance": "1e-3",
                 "r.5.args.numeric_match.group": "2.5", "r.5.args.numeric_match.extract": "nearest"})
    terms, errors = specform.reward_rows_from_form("r", data)
    assert terms == [{"name": "valid_json", "weight": 2.5, "args": {"require_object": False}},
                     {"name": "length_target", "args": {"target": 12, "unit": "words"}},
                     {"name": "numeric_match", "args": {"tolerance": 0.001, "group": "2.5", "extract": "nearest"}}]
    # Named by the term's place in the spec's list (the blank row 1 is not a term).
    assert errors == {"r.2.args.group": "'2.5' is not a whole number",
                      "r.2.args.extract": "'nearest' is not one of full, last_number, answer_line, boxed, regex"}


def test_the_scale_out_fieldset_holds_the_layout_hosts_and_pool():
    assert [field.name for field in specform.scale_out_section("sft").fields] == [
        "parallel.data", "parallel.fsdp", "parallel.tensor", "hosts", "pool"]
    # GRPO's rollouts are sampled by one process: no hosts input to get wrong.
    assert [field.name for field in specform.scale_out_section("grpo").fields] == [
        "parallel.data", "parallel.fsdp", "parallel.tensor", "pool"]
    layout = specform.scale_out_section("sft").fields
    assert all(field.default is None and field.optional for field in layout[:3])  # blank: the default layout
    assert layout[3].default == 1 and layout[4].default == "default"


def test_the_layout_hosts_and_pool_are_read_back_and_flattened_again():
    data = QueryDict(mutable=True)
    data.update({"model": "bm_x", "data.train": "dv_y", "parallel.data": "2", "parallel.fsdp": " 4 ",
                 "parallel.tensor": "", "hosts": "2", "pool": "tpu"})
    spec = specform.spec_from_form("sft", data)
    # Numbers as numbers (the YAML view writes them back); anything else as typed, for the spec to name.
    assert spec["parallel"] == {"data": 2, "fsdp": 4} and spec["hosts"] == 2 and spec["pool"] == "tpu"
    data["parallel.fsdp"] = "four"
    assert specform.spec_from_form("sft", data)["parallel"]["fsdp"] == "four"
    initial = specform.spec_initial({"model": "bm_x", "parallel": {"data": 2, "fsdp": 4, "tensor": 1},
                                     "hosts": 2, "pool": "tpu"})
    assert (initial["parallel.data"], initial["parallel.fsdp"], initial["parallel.tensor"]) == (2, 4, 1)
    assert initial["hosts"] == 2 and initial["pool"] == "tpu"


def test_blank_layout_inputs_leave_parallel_out():
    data = QueryDict(mutable=True)
    data.update({"model": "bm_x", "data.train": "dv_y", "parallel.data": "", "parallel.fsdp": "", "hosts": "",
                 "pool": ""})
    spec = specform.spec_from_form("sft", data)
    assert "parallel" not in spec and "hosts" not in spec and "pool" not in spec
    # A spec without parallel (the default layout) shows blank inputs.
    assert "parallel.data" not in specform.spec_initial({"model": "bm_x", "parallel": None, "hosts": 1})


def test_a_sections_subtitle_is_plain_text_without_its_own_name():
    assert specform.section_title("``peft``: full fine-tuning (``none``), or LoRA.\n\nMore.", "peft") == (
        "full fine-tuning (none), or LoRA.")
    assert specform.section_title(None, "train") == "train"
    titles = {section.name: section.title for section in specform.form_sections("grpo")}
    assert titles["data"] == "where the rows come from and how they become token sequences."
    assert not any("``" in title for title in titles.values())
    assert "``" not in specform.scale_out_section("sft").title


def test_data_keys_of_some_tasks_only_are_fields_of_those_tasks_forms():
    """'loss on' (completion / all) was on every task's form, though only sft reads it: a DPO or GRPO
    user who chose 'all' got the engine's refusal after the launch."""
    def data_fields(task):
        return {field.name for section in specform.form_sections(task) for field in section.fields
                if field.name.startswith("data.")}

    assert {"data.loss_on", "data.packing"} <= data_fields("sft")
    assert "data.packing" in data_fields("pretrain") and "data.loss_on" not in data_fields("pretrain")
    for task in ("reward", "dpo", "grpo", "ppo"):
        assert not {"data.loss_on", "data.packing"} & data_fields(task), task
        assert "data.max_seq_len" in data_fields(task)


def test_a_written_dpo_spec_keeps_the_default_of_an_sft_only_key_and_is_told_of_another_value():
    assert specform.keys_the_form_cannot_show("dpo", {"data": {"loss_on": "completion", "packing": False}}) == {}
    assert specform.keys_the_form_cannot_show("dpo", {"data": {"loss_on": "all", "packing": True}}) == {
        "data.loss_on": "only sft read it; remove it", "data.packing": "only pretrain and sft read it; remove it"}


@pytest.mark.parametrize("task", specform.tasks())
def test_the_help_of_every_choice_of_several_options_says_what_they_do(task):
    """QA: dpo.loss, grpo.loss_type, grpo.advantage and grpo.kl_estimator were helped by their choices
    alone ('sigmoid | ipo | hinge | simpo | orpo'), leaving what each does to the README. A select's
    help says more than the names of its choices."""
    for section in specform.form_sections(task):
        for field in section.fields:
            if field.widget != "select":
                continue
            words = field.help
            for choice in sorted(map(str, field.choices), key=len, reverse=True):
                words = words.replace(choice, "")
            assert words.strip(" |.,;:"), f"{field.name}: its help only names its choices: {field.help!r}"


def test_the_batch_size_help_says_what_a_row_of_each_task_is():
    """QA: train.batch_size was 'Sequences per micro-batch' in every task's form, while reward and dpo read
    it as chosen/rejected pairs and grpo as prompts, each sampled num_generations times (8 × 8 = 64
    completions a micro-batch): an engineer sizing memory from the help was off by that factor."""
    train = next(section for section in specform.form_sections("grpo") if section.name == "train")
    help_text = next(field.help for field in train.fields if field.name == "train.batch_size")
    for words in ("sequences (pretrain, sft)", "pairs (reward, dpo)", "prompts (grpo", "num_generations",
                  "ppo"):
        assert words in help_text, help_text


def test_the_group_size_help_says_why_it_is_at_least_two():
    """QA: grpo.num_generations 1 was refused with pydantic's 'input should be greater than or equal to 2'
    beside a help of 'Completions per prompt (G).': nothing said that a completion's advantage is its
    reward against the others of its prompt, so one alone learns nothing."""
    grpo = next(section for section in specform.form_sections("grpo") if section.name == "grpo")
    help_text = next(field.help for field in grpo.fields if field.name == "grpo.num_generations")
    assert "at least 2" in help_text and "the others of its prompt" in help_text, help_text


def test_chat_template_kwargs_are_a_json_field_of_the_launch_form():
    """data.chat_template_kwargs ({"enable_thinking": false} for Qwen3) is edited as JSON and read back as a mapping;
    JSON that does not parse is named at its key."""
    [field] = [field for section in specform.form_sections("grpo") for field in section.fields
               if field.name == "data.chat_template_kwargs"]
    assert field.widget == "json" and field.default == {} and "enable_thinking" in field.help
    data = QueryDict(mutable=True)
    data.update({"model": "bm_x", "data.train": "dv_y", "data.chat_template_kwargs": '{"enable_thinking": false}'})
    spec, errors = specform.read_form("sft", data)
    assert spec["data"]["chat_template_kwargs"] == {"enable_thinking": False} and errors == {}
    data["data.chat_template_kwargs"] = "{enable_thinking: false}"
    assert "data.chat_template_kwargs" in specform.read_form("sft", data)[1]


def test_every_help_text_ends_its_sentence_before_the_default():
    """QA (second first-use pass): the launch form read "… rloo: r − mean of the other completions of its prompt
    Default: group." and "… averaged as grpo Default: grpo.": the choices' descriptions ran into the default."""
    unfinished = {field.name: field.help
                  for task in specform.tasks() for section in specform.form_sections(task) for field in section.fields
                  if field.help and not field.help.rstrip().endswith((".", "!", "?", ")"))}
    assert unfinished == {}
