"""Sweeps: one launch, a run for every combination of a few spec keys' values, planned all before any
is made; each bad line, key, value and combination named, and then no run made and nothing queued."""
import re

import pytest
from django.core.exceptions import ValidationError

from tests.webapp.runs.conftest import sft_spec
from webapp.runs import selectors, services, sweeps
from webapp.runs.models import Run, RunLogLine

LR_AND_RANK = "optim.learning_rate: 1e-4, 3e-4, 1e-3\npeft.rank: 8, 16\n"


def lora_spec(catalog):
    # LoRA: the sweeps here vary peft.rank, which full fine-tuning does not read (such a sweep is refused).
    return sft_spec(catalog, peft={"method": "lora"})


def launch(team, catalog, text, *, spec=None, **details):
    return services.sweep_create(project=team.project, spec=spec or lora_spec(catalog), user=team.teammate,
                                 axes=sweeps.axes_from_text(text), **details)


def refusal(team, catalog, text, **details) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        launch(team, catalog, text, **details)
    return caught.value.message_dict


def test_it_launches_the_product_in_order_named_tagged_and_queued(team, catalog, sent_tasks,
                                                                  django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        launched = launch(team, catalog, LR_AND_RANK, name="base", tags="a, b")
    runs = launched.runs
    assert [(run.spec["optim"]["learning_rate"], run.spec["peft"]["rank"]) for run in runs] == [
        (1e-4, 8), (1e-4, 16), (3e-4, 8), (3e-4, 16), (1e-3, 8), (1e-3, 16)]
    assert [run.name for run in runs] == [f"base · learning_rate={lr} rank={rank}"
                                          for lr in ("1e-4", "3e-4", "1e-3") for rank in (8, 16)]
    assert launched.tag.startswith("sweep-") and len(launched.tag) == len("sweep-") + 8
    assert all(run.tags == [launched.tag, "a", "b"] for run in runs)
    # Queued in product order, one message each, after the one commit.
    assert sent_tasks.calls == [(services.TRAIN_TASK, [run.pk, 1], "train") for run in runs]
    # The rest of the spec is the launch's, as plan_run fills it for a single run.
    assert {run.spec["train"]["max_steps"] for run in runs} == {10}
    assert all(run.resolved_spec["output_dir"].endswith(run.public_id) for run in runs)
    assert set(Run.objects.filter(tags__icontains=launched.tag)) == set(runs)
    # The table's search finds them by a part of their sweep's tag, case aside, as by their other tags.
    for text in (launched.tag.upper(), launched.tag[-5:], "B"):
        found = selectors.run_list(project=team.project, filters=selectors.RunFilters(search=text))
        assert set(found) == set(runs), text


def test_a_blank_name_takes_the_default_and_a_long_one_is_cut_to_fit(team, catalog, sent_tasks):
    runs = launch(team, catalog, "peft.rank: 4, 8").runs
    assert [run.name for run in runs] == ["sft-tiny · rank=4", "sft-tiny · rank=8"]
    long = launch(team, catalog, LR_AND_RANK, name="n" * 120).runs
    assert all(len(run.name) == services.RUN_NAME_MAX for run in long)
    assert long[0].name.endswith("n · learning_rate=1e-4 rank=8") and long[1].name.endswith("rank=16")


def test_one_bad_combination_in_the_middle_makes_no_run_and_queues_nothing(team, catalog, sent_tasks,
                                                                           django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        errors = refusal(team, catalog, "optim.learning_rate: 1e-4, 2.0, 1e-3\npeft.rank: 8, 16")
    assert set(errors) == {"sweep"}
    # Said once (it fails with both ranks), at its line, key and value, with plan_run's words and the
    # first combination it fails in.
    assert errors["sweep"] == [
        "line 1: optim.learning_rate = 2.0: 2.0 is too large: give a number above 0 and at most 1 "
        "(combination 3 of 6: learning_rate=2.0 rank=8)"]
    assert Run.objects.count() == 0 and RunLogLine.objects.count() == 0
    assert sent_tasks.calls == []


def test_a_problem_of_the_launch_spec_is_named_at_its_key_as_for_one_run(team, catalog, sent_tasks):
    errors = refusal(team, catalog, "peft.rank: 4, 8", spec={**sft_spec(catalog), "model": ""})
    assert set(errors) == {"model"} and errors["model"][0].startswith("choose a starting model")
    # A swept key overrides the launch spec's value, so its problem there is none of the sweep's.
    spec = sft_spec(catalog, optim={"learning_rate": 5.0})
    assert len(launch(team, catalog, "optim.learning_rate: 1e-4, 1e-3", spec=spec).runs) == 2


def test_a_value_of_another_project_is_refused_by_line(team, catalog, sent_tasks):
    from tests.webapp.factories import make_ready_version

    elsewhere = make_ready_version(team.outsider_project, name="theirs", kind="sft")
    errors = refusal(team, catalog, f"data.train: {catalog.sft.public_id}, {elsewhere.public_id}")
    assert errors["sweep"] == [f"line 1: data.train = {elsewhere.public_id}: '{elsewhere.public_id}' is not a "
                               f"dataset version of alpha (combination 2 of 2: train={elsewhere.public_id})"]
    assert Run.objects.count() == 0


@pytest.mark.parametrize(("text", "problem"), [
    ("peft.rank 8, 16", "line 1: 'peft.rank 8, 16' is not a key and its values; write them as "
                        "optim.learning_rate: 1e-4, 3e-4"),
    ("peft.rank: 8\n\noptim.learning_rate:", "line 3: optim.learning_rate has no values"),
    ("peft.rnak: 8, 16", "line 1: peft.rnak: not a key of peft in an sft spec; its keys: method, rank, alpha,"),
    ("learning_rate: 1e-4", "line 1: learning_rate: not a key of an sft spec; write a section and its key (data, "
                            "peft, optim, train, parallel)"),
    ("dpo.beta: 0.1, 0.2", "line 1: dpo.beta: not a key of an sft spec"),
    ("peft.rank: 8\npeft.rank: 16", "line 2: peft.rank is given twice (first on line 1); give all its values on "
                                    "one line"),
    ("output_dir: /tmp/a, /tmp/b", "line 1: output_dir: Temper gives every run its own directory; remove output_dir"),
    ("data.columns: x", "line 1: data.columns: set from the dataset versions' column mappings"),
    ("task: sft, dpo", "line 1: task: a sweep varies the keys of one task; launch a sweep per task"),
    ("peft.rank: 8, 16, 8", "line 1: peft.rank: 8 is given twice; each value makes its own runs"),
    # One number written two ways made two runs of one config.
    ("optim.learning_rate: 1e-4, 3e-4, 0.0001", "line 1: optim.learning_rate: 1e-4 and 0.0001 are the same value; "
                                                "give it once"),
    ("optim.weight_decay: 1, 0.5, 1.0", "line 1: optim.weight_decay: 1 and 1.0 are the same value; give it once"),
    ("peft.rank: [8, 16]", "line 1: peft.rank: the values cannot be read: [8, 16] is not a single value"),
    ("peft.rank: 8,, 16", "line 1: peft.rank: the values cannot be read: expected the node content, but found ','"),
    ("peft.rank: *big", "line 1: peft.rank: the values cannot be read: aliases (*name) are not allowed"),
])
def test_it_rejects_each_bad_line_by_number(team, catalog, sent_tasks, text, problem):
    with pytest.raises(ValidationError) as caught:
        launch(team, catalog, text)
    assert any(message.startswith(problem) for message in caught.value.message_dict["sweep"]), caught.value
    assert Run.objects.count() == 0


def test_more_combinations_than_the_cap_are_refused_naming_the_setting(team, catalog, sent_tasks, settings):
    assert settings.TEMPER_SWEEP_MAX_RUNS == 16  # the default
    errors = refusal(team, catalog, "optim.learning_rate: 1e-4, 2e-4, 3e-4\npeft.rank: 4, 8, 16\n"
                                    "peft.alpha: 8\ntrain.batch_size: 1, 2")
    assert errors["sweep"] == ["3 (line 1: optim.learning_rate) × 3 (line 2: peft.rank) × 2 (line 4: "
                               "train.batch_size) = 18 runs; a sweep launches at most 16 (TEMPER_SWEEP_MAX_RUNS): "
                               "give fewer values"]
    settings.TEMPER_SWEEP_MAX_RUNS = 6
    assert len(launch(team, catalog, LR_AND_RANK).runs) == 6
    assert "= 8 runs; a sweep launches at most 6" in refusal(team, catalog, "peft.rank: 1, 2, 3, 4, 5, 6, 7, 8")["sweep"][0]
    assert Run.objects.count() == 6


def test_the_tags_leave_room_for_the_sweeps_own(team, catalog, sent_tasks):
    errors = refusal(team, catalog, "peft.rank: 4, 8", tags=[f"t{number}" for number in range(services.MAX_TAGS)])
    assert errors == {"tags": ["a sweep adds its own tag to the 20 a run may have: give at most 19"]}
    assert Run.objects.count() == 0


def test_values_are_yaml_scalars_with_exponents_read_as_numbers():
    axis, = sweeps.axes_from_text('data.eval_group_by: 1e-4, "1e-4", "a, b", true, ~, 7')
    assert axis.values == (1e-4, "1e-4", "a, b", True, None, 7)
    assert axis.labels == ("1e-4", "1e-4", "a, b", "true", "~", "7")
    assert sweeps.axes_from_text("\n# a comment\n   \n") == []
    # A comment after the values, as YAML allows: it swallowed the closing bracket of the values' list,
    # and the line was refused with "expected ',' or ']', but got '<stream end>'".
    axis, = sweeps.axes_from_text('optim.learning_rate: 1e-4, "3e-4 # text"  # the lr sweep')
    assert axis.values == (1e-4, "3e-4 # text") and axis.labels == ("1e-4", "3e-4 # text")


def test_an_api_sweep_is_checked_like_the_pages():
    axes = sweeps.axes_from_mapping({"optim.learning_rate": [0.0001, 0.001], "peft.rank": [8]})
    assert [(axis.key, axis.values, axis.labels, axis.place) for axis in axes] == [
        ("optim.learning_rate", (0.0001, 0.001), ("0.0001", "0.001"), "optim.learning_rate"),
        ("peft.rank", (8,), ("8",), "peft.rank")]
    with pytest.raises(ValidationError) as caught:
        sweeps.axes_from_mapping({"peft.rank": [8, [16]]})
    assert caught.value.message_dict == {"sweep": ["peft.rank: [16] is not a single value; give a list of numbers, "
                                                   "text, true or false"]}
    with pytest.raises(ValidationError) as caught:
        sweeps.check_axes(sweeps.axes_from_mapping({"peft.rank": []}), task="sft")
    assert caught.value.message_dict == {"sweep": ["peft.rank: no values; give one or more "
                                                   "(optim.learning_rate: 1e-4, 3e-4)"]}


def test_keys_that_end_alike_are_named_whole_in_run_names():
    axes = sweeps.axes_from_mapping({"dpo.beta": [0.1], "grpo.beta": [0.2], "peft.rank": [8]})
    combination, = sweeps.combinations(axes)
    assert sweeps.run_name("x", axes, combination, max_length=120) == "x · dpo.beta=0.1 grpo.beta=0.2 rank=8"


def test_a_problem_of_another_key_in_some_combinations_names_the_combination():
    axes = sweeps.axes_from_mapping({"data.max_seq_len": [64, 512]})
    first, second = sweeps.combinations(axes)
    problem = {"grpo.max_new_tokens": ["128 completion tokens leave no room"]}
    assert sweeps.errors(axes, [(first, problem)], total=2) == {"sweep": [
        "grpo.max_new_tokens: 128 completion tokens leave no room (combination 1 of 2: max_seq_len=64)"]}
    # In every combination and of no swept key: the launch spec's own problem, at its key.
    assert sweeps.errors(axes, [(first, problem), (second, problem)], total=2) == problem


def test_combinations_that_differ_only_in_keys_the_run_does_not_read_are_refused(team, catalog, sent_tasks):
    """QA: peft.rank swept under full fine-tuning, or quant_bits under LoRA, launched runs that trained the
    same thing, each spending the worker's time."""
    full = sft_spec(catalog)  # peft.method none by default
    errors = refusal(team, catalog, "optim.learning_rate: 1e-4, 1e-3\npeft.rank: 8, 16", spec=full)
    assert errors == {"sweep": [
        "combination 2 of 4: learning_rate=1e-4 rank=16 would train the same run as combination 1 of 4: "
        "learning_rate=1e-4 rank=8 (peft.rank changes nothing: peft.method is none (full fine-tuning trains no "
        "adapter)); drop the key from the sweep, or sweep what makes it count",
        "combination 4 of 4: learning_rate=1e-3 rank=16 would train the same run as combination 3 of 4: "
        "learning_rate=1e-3 rank=8 (peft.rank changes nothing: peft.method is none (full fine-tuning trains no "
        "adapter)); drop the key from the sweep, or sweep what makes it count"]}
    assert "peft.method is lora" in refusal(team, catalog, "peft.quant_bits: 4, 8")["sweep"][0]
    assert "there is no data.eval" in refusal(team, catalog, "train.eval_samples: 4, 8")["sweep"][0]
    assert Run.objects.count() == 0 and sent_tasks.calls == []
    # Swept with what makes it count, only the combinations that do not read it are named: qlora's two
    # runs differ, lora's do not.
    assert refusal(team, catalog, "peft.method: lora, qlora\npeft.quant_bits: 4, 8")["sweep"] == [
        "combination 2 of 4: method=lora quant_bits=8 would train the same run as combination 1 of 4: method=lora "
        "quant_bits=4 (peft.quant_bits changes nothing: peft.method is lora (they set qlora's quantized base)); "
        "drop the key from the sweep, or sweep what makes it count"]
    assert len(launch(team, catalog, "peft.method: qlora\npeft.quant_bits: 4, 8").runs) == 2


def test_a_duplicate_of_a_sweeps_run_leaves_the_sweep(team, catalog, sent_tasks, client_for):
    """Duplicate filled the form with the run's tags, its sweep's among them: the copy, launched with other
    settings, joined the sweep's table and its "Compare the N runs tagged sweep-…" (and a copy launched as a
    sweep of its own was in two). The copy keeps the other tags."""
    launched = launch(team, catalog, "peft.rank: 4, 8", tags="mine")
    page = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={launched.runs[0].public_id}").content.decode()
    tags_input = re.search(r'<input[^>]*name="tags"[^>]*>', page).group(0)
    assert 'value="mine"' in tags_input and launched.tag not in page
