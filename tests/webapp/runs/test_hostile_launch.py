"""Hostile numbers in the launch form, the YAML view and resume: each is refused naming its field,
with nothing saved, never a 500 page. The engine's schema bounds max_steps from below only; a run
records its steps in PositiveIntegerFields (2**31 - 1 on PostgreSQL), and a larger count used to
fail the INSERT."""
import pytest
from django.core.exceptions import ValidationError

from tests.webapp.factories import make_ready_version
from tests.webapp.runs.conftest import sft_spec, with_checkpoint
from webapp.runs import services
from webapp.runs.models import Run, RunStatus

HUGE = "99999999999999999999999999"


def _form(catalog, **fields) -> dict:
    form = {"mode": "form", "task": "sft", "name": "big", "model": catalog.base_model.public_id,
            "data.train": catalog.sft.public_id, "train.batch_size": "2", "train.max_steps": "5",
            "peft.targets": ["q_proj"]}
    form.update(fields)
    return form


def test_a_step_count_past_what_a_run_records_is_named_in_the_form(team, catalog, client_for, sent_tasks):
    response = client_for(team.teammate).post("/p/alpha/runs/new/", _form(catalog, **{"train.max_steps": HUGE}))
    assert response.status_code == 400
    page = response.content.decode()
    assert "<code>train.max_steps</code>" in page and "more than a run can record; give at most 2,147,483,647" in page
    assert Run.objects.count() == 0 and sent_tasks.calls == []


def test_the_largest_recordable_step_count_is_accepted(team, catalog, client_for, sent_tasks):
    response = client_for(team.teammate).post("/p/alpha/runs/new/",
                                              _form(catalog, **{"train.max_steps": str(services.MAX_RUN_STEPS)}))
    assert response.status_code == 302
    assert Run.objects.get(name="big").total_steps == 2**31 - 1


def test_a_step_count_past_what_a_run_records_is_named_in_the_yaml_view(team, catalog, client_for, sent_tasks):
    spec = sft_spec(catalog, train={"max_steps": int(HUGE), "batch_size": 2})
    response = client_for(team.teammate).post("/p/alpha/runs/new/", {"mode": "yaml", "name": "y",
                                                                     "spec_yaml": services.spec_to_yaml(spec)})
    assert response.status_code == 400 and "more than a run can record" in response.content.decode()
    assert Run.objects.count() == 0


def test_resuming_with_a_step_count_past_what_a_run_records_is_refused(team, catalog, client_for, sent_tasks):
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="r")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED, current_step=3)
    response = client_for(team.teammate).post(f"/p/alpha/runs/{run.public_id}/resume/", {"max_steps": HUGE},
                                              follow=True)
    assert response.status_code == 200 and "more than a run can record" in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.total_steps == 10 and run.attempt == 1


@pytest.mark.parametrize("value, message", [("-5", "-5 is too small: give a whole number"), ("1e400", "is not a finite number")])
def test_negative_and_overflowing_values_are_named(team, catalog, client_for, sent_tasks, value, message):
    response = client_for(team.teammate).post("/p/alpha/runs/new/", _form(catalog, **{"train.max_steps": value}))
    assert response.status_code == 400
    assert "<code>train.max_steps</code>" in response.content.decode() and message in response.content.decode()
    assert Run.objects.count() == 0


@pytest.mark.parametrize("action, field, value", [("resume/", "max_steps", "²"), ("export/", "step", "²"),
                                                  ("export/", "step", HUGE)])
def test_a_number_int_refuses_or_the_database_cannot_hold_is_named(team, catalog, client_for, sent_tasks,
                                                                    action, field, value):
    """'²'.isdigit() is True but int('²') raises: these were 500 pages; a huge step overflowed the query."""
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="r")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED, current_step=3)
    response = client_for(team.teammate).post(f"/p/alpha/runs/{run.public_id}/{action}", {field: value}, follow=True)
    assert response.status_code == 200
    assert f"not {value!r}" in response.content.decode().replace("&#x27;", "'")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.attempt == 1


@pytest.mark.parametrize("model", ["run_x@²", f"run_x@{HUGE}"])
def test_a_checkpoint_reference_with_a_strange_step_is_named(team, catalog, client_for, sent_tasks, model):
    source = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="src")
    response = client_for(team.teammate).post("/p/alpha/runs/new/",
                                              _form(catalog, model=model.replace("run_x", source.public_id)))
    assert response.status_code == 400 and "is not exported" in response.content.decode()


def test_a_reward_row_index_int_refuses_is_ignored_not_a_500(team, catalog, client_for, sent_tasks):
    form = {"mode": "form", "task": "grpo", "name": "g", "model": catalog.base_model.public_id,
            "data.train": catalog.prompts.public_id, "train.max_steps": "5", "grpo.rewards.².function": "exact_match"}
    response = client_for(team.teammate).post("/p/alpha/runs/new/", form)
    assert response.status_code == 400 and Run.objects.filter(name="g").count() == 0


BOMB = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
    f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 9)}]" for level in range(1, 9)]) + "\n"


@pytest.mark.parametrize("path,field", [("/p/alpha/runs/new/", "spec_yaml"), ("/p/alpha/pipelines/new/", "document")])
def test_yaml_aliases_are_refused_before_they_expand(team, catalog, client_for, sent_tasks, path, field):
    """1.5 KB of aliases (9**9 items once expanded) pasted into the launch form took the web process to
    11 GB for two minutes; the same text as a pipeline document too."""
    response = client_for(team.teammate).post(path, {"mode": "yaml", field: BOMB})
    assert response.status_code == 400
    assert ":2:" in response.content.decode() and "aliases (*name) are not allowed in a spec" in response.content.decode()
    assert Run.objects.count() == 0 and sent_tasks.calls == []


def test_values_that_failed_the_run_on_its_worker_are_refused_at_launch(team, catalog, sent_tasks):
    """QA: each of these was taken, and the run then failed on its worker: a seed past 2**32 (a bare
    OverflowError from jax.random), eval samples longer than the model's context (at the first
    evaluation, steps in), GRPO completions longer than data.max_seq_len or the model's context, and an
    eval_group_by column the eval rows lack (naming the server's path of the file)."""
    from webapp.basemodels.models import BaseModel

    BaseModel.objects.filter(pk=catalog.base_model.pk).update(context_length=2048)
    catalog.base_model.refresh_from_db()
    grouped = make_ready_version(team.project, name="held out", kind="prompts",
                                 rows=[{"prompt": "2+2?", "answer": "4", "task": "sum"}, {"prompt": "3?", "answer": "3"}])

    def refused(task="sft", **changes) -> dict:
        spec = sft_spec(catalog) if task == "sft" else {"task": "grpo", "model": catalog.base_model.public_id,
                                                       "data": {"train": catalog.prompts.public_id},
                                                       "train": {"max_steps": 2},
                                                       "grpo": {"rewards": [{"name": "exact_match"}]}}
        for dotted, value in changes.items():
            section, key = dotted.split("__")
            spec.setdefault(section, {})[key] = value
        with pytest.raises(ValidationError) as caught:
            services.run_create(project=team.project, spec=spec, user=team.teammate, name="late failure")
        return caught.value.message_dict

    assert "too large: give a whole number" in refused(train__seed=10**23)["train.seed"][0]
    assert refused(data__eval=catalog.prompts.public_id, train__sample_max_new_tokens=100_000)[
        "train.sample_max_new_tokens"] == ["100000 tokens leave no room for a prompt in the model's context of 2048 "
                                           "tokens; give fewer (the eval samples are short previews: the default is 64)"]
    assert refused("grpo", data__max_seq_len=64, grpo__max_new_tokens=200)["grpo.max_new_tokens"] == [
        "200 completion tokens leave no room for a prompt in data.max_seq_len (64); raise "
        "data.max_seq_len above it or lower grpo.max_new_tokens"]
    # QA: within a data.max_seq_len past the model's context, the first rollout failed with the sampler's traceback.
    assert refused("grpo", data__max_seq_len=4096, grpo__max_new_tokens=2100)["grpo.max_new_tokens"] == [
        "2100 completion tokens leave no room for a prompt in the model's context of 2048 tokens; lower "
        "grpo.max_new_tokens below 2048"]
    [problem] = refused(data__eval=grouped.public_id, data__eval_group_by="task")["data.eval_group_by"]
    assert problem == "row 2 of held out v1 has no 'task' value to group by"
    assert str(grouped.absolute_path) not in problem
    assert Run.objects.count() == 0 and sent_tasks.calls == []


def test_a_name_too_long_is_refused_not_cut(team, catalog, client_for, sent_tasks):
    """A 600-character name was saved cut to 120 without a word; a retry of a 120-character name then lost
    its ' (retry)' and could not be told from the original."""
    response = client_for(team.teammate).post("/p/alpha/runs/new/", _form(catalog, name="n" * 600))
    assert response.status_code == 400 and "600 characters; a run name has at most 120" in response.content.decode()
    assert Run.objects.count() == 0
    full = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="m" * 120)
    retried = services.run_retry(run=full, user=team.teammate)
    assert retried.name == "m" * 112 + " (retry)"
    with pytest.raises(ValidationError, match="121 characters"):
        services.run_update_details(run=full, name="x" * 121)


def test_launch_messages_say_what_to_do_in_the_users_words(team, catalog, client_for, sent_tasks):
    """QA's wording notes: a NaN learning rate was 'input should be less than or equal to 1'; the unknown-key
    list offered output_dir, which the launch refuses; no target module was pydantic's 'tuple should have at
    least 1 item after validation, not 0'; a tab said nothing of spaces; the reward functions' help showed
    their ``double backquotes``."""
    client = client_for(team.teammate)
    page = client.post("/p/alpha/runs/new/", _form(catalog, **{"optim.learning_rate": "nan"})).content.decode()
    assert "<code>optim.learning_rate</code>: &#x27;nan&#x27; is not a finite number" in page
    page = client.post("/p/alpha/runs/new/", {"mode": "yaml", "spec_yaml": "task: sft\nmodle: x\ndata: {colums: 1}\n"
                                              }).content.decode()
    unknown_top = page.split("modle: unknown key; allowed keys here: ")[1].split("<")[0]
    assert "task" in unknown_top and "output_dir" not in unknown_top
    unknown_data = page.split("data.colums: unknown key; allowed keys here: ")[1].split("<")[0]
    assert "train" in unknown_data and "columns" not in unknown_data.split(", ")
    page = client.post("/p/alpha/runs/new/", {"mode": "yaml", "spec_yaml": "task: sft\ntrain:\n\tmax_steps: 3\n"
                                              }).content.decode()
    assert "(indent with spaces: YAML does not take tabs)" in page
    form = _form(catalog)
    form.pop("peft.targets")
    page = client.post("/p/alpha/runs/new/", {**form, "peft.method": "lora"}).content.decode()
    assert "<code>peft.targets</code>: [] : give at least 1".replace("] :", "]:") in page
    launch = client.get("/p/alpha/runs/new/?task=grpo").content.decode()
    assert "<code>normalize_answer</code>" in launch and "<code>allow_fence</code>" in launch
    assert "``normalize_answer``" not in launch
    assert Run.objects.count() == 0


def test_a_quoted_number_is_refused_in_the_yaml_view_and_the_form_still_takes_typed_numbers(
        team, catalog, client_for, sent_tasks):
    """QA: batch_size: "64" (in quotes) launched a run of batch size 64. The form's inputs are text, which
    the form turns into numbers itself, so typing 4 there still launches."""
    client = client_for(team.teammate)
    spec_yaml = services.spec_to_yaml(sft_spec(catalog)).replace("batch_size: 2", "batch_size: '2'")
    response = client.post("/p/alpha/runs/new/", {"mode": "yaml", "name": "y", "spec_yaml": spec_yaml})
    assert response.status_code == 400
    assert ("spec:7: train.batch_size: &#x27;2&#x27; is text (in quotes); write the number without quotes: 2"
            in response.content.decode())
    assert Run.objects.count() == 0
    with pytest.raises(ValidationError, match="write the number without quotes"):
        services.run_create(project=team.project, spec=sft_spec(catalog, train={"max_steps": "10", "batch_size": 2}),
                            user=team.teammate, name="api")
    response = client.post("/p/alpha/runs/new/", _form(catalog, **{"train.batch_size": "4", "peft.method": "lora",
                                                                     "peft.rank": "4", "peft.alpha": "8",
                                                                     "data.packing": "on"}))
    assert response.status_code == 302
    run = Run.objects.get(name="big")
    assert run.spec["train"]["batch_size"] == 4 and run.spec["peft"]["alpha"] == 8.0 and run.spec["data"]["packing"] is True


def test_launch_checks_read_an_eval_file_once_until_it_changes(team, catalog, monkeypatch, sent_tasks):
    """The eval_group_by check read the whole eval file for every combination of a sweep and on every live
    check of the launch page (each edit); it reads it once now, and again only once the file changes."""
    import json
    import os

    from jaxengine.data import formats
    from webapp.runs import sweeps

    grouped = make_ready_version(team.project, name="grouped eval", kind="prompts",
                                 rows=[{"prompt": "2+2?", "answer": "4", "task": "sum"},
                                       {"prompt": "3?", "answer": "3", "task": "count"}])
    reads = []
    real_iter_examples = formats.iter_examples
    monkeypatch.setattr(formats, "iter_examples", lambda path, **kw: reads.append(path) or real_iter_examples(path, **kw))
    spec = {**sft_spec(catalog), "data": {**sft_spec(catalog)["data"], "eval": grouped.public_id,
                                          "eval_group_by": "task"}}
    sweep = sweeps.axes_from_text("optim.learning_rate: 1e-4, 2e-4, 3e-4")
    for _ in range(2):
        assert services.launch_check(project=team.project, spec=spec, axes=sweep).warnings == []
        assert services.launch_check(project=team.project, spec=spec, axes=[]).warnings == []
    assert reads.count(grouped.absolute_path) == 1

    grouped.absolute_path.write_text(json.dumps({"prompt": "no label", "answer": "x"}) + "\n")
    os.utime(grouped.absolute_path, ns=(1, 1))  # another modification time, whatever the clock's resolution
    with pytest.raises(ValidationError) as caught:
        services.launch_check(project=team.project, spec=spec, axes=sweep)
    assert caught.value.message_dict["data.eval_group_by"] == ["row 1 of grouped eval v1 has no 'task' value to group by"]
    assert reads.count(grouped.absolute_path) == 2


def test_a_max_seq_len_past_the_models_positions_is_a_field_error_of_the_launch_form(team, catalog, client_for,
                                                                                    sent_tasks, tmp_path):
    """Issue 9: data.max_seq_len past the model's max_position_embeddings (256 in this model's config.json) was
    launched without a word, and trained on positions the model never saw. The form shows it at its field, naming
    both numbers, and saves nothing; a RoPE scaling that extends the model's range raises the limit to it."""
    import json
    import re

    from tests.webapp.factories import write_model_dir
    from webapp.basemodels.models import BaseModel

    model_dir = write_model_dir(tmp_path / "model")
    BaseModel.objects.filter(pk=catalog.base_model.pk).update(path=str(model_dir))
    message = ("300 is past the model's 256 positions (max_position_embeddings 256 in its config.json): tokens "
               "after position 256 would sit at positions the model was never trained on; give data.max_seq_len at "
               "most 256, or choose a model with a longer context")
    response = client_for(team.teammate).post("/p/alpha/runs/new/", _form(catalog, **{"data.max_seq_len": "300"}))
    assert response.status_code == 400
    page = response.content.decode().replace("&#x27;", "'")
    field = re.search(r'<div class="field spec-field has-error" data-key="data.max_seq_len">.*?</div>', page, re.S)
    assert field is not None
    assert f'<small class="error" id="spec-data-max_seq_len-error-1">{message}</small>' in field[0]
    assert Run.objects.count() == 0 and sent_tasks.calls == []
    config = json.loads((model_dir / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    (model_dir / "config.json").write_text(json.dumps(config))
    response = client_for(team.teammate).post("/p/alpha/runs/new/", _form(catalog, **{"data.max_seq_len": "512"}))
    assert response.status_code == 302 and Run.objects.get(name="big").resolved_spec["data"]["max_seq_len"] == 512
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec=sft_spec(catalog, data={"train": catalog.sft.public_id,
                                                                               "max_seq_len": 513}),
                            user=team.teammate, name="past the scaled range")
    assert caught.value.message_dict["data.max_seq_len"] == [
        "513 is past the model's 512 positions (max_position_embeddings 256 × rope_scaling factor 2 (linear) in its "
        "config.json): tokens after position 512 would sit at positions the model was never trained on; give "
        "data.max_seq_len at most 512, or choose a model with a longer context"]


def test_the_launch_form_starts_max_seq_len_within_the_models_context_and_says_its_limit(team, catalog, client_for,
                                                                                       tmp_path):
    """The form started data.max_seq_len at the schema's 512 whatever the model: on a model of 256 positions that
    launch was refused. Opened on such a model (a base model page's "Launch a run from it"), the field starts at the
    model's positions and says they are its limit; each model option carries its limit, for the page's script to
    say it when another model is chosen. A longer model keeps the preset's 512, and the limit is the launch's own
    (a RoPE scaling extends it)."""
    import json
    import re

    from tests.webapp.factories import write_model_dir
    from webapp.basemodels.models import BaseModel

    model_dir = write_model_dir(tmp_path / "model")  # max_position_embeddings 256
    BaseModel.objects.filter(pk=catalog.base_model.pk).update(path=str(model_dir))
    model = catalog.base_model.public_id
    for task in ("sft", "pretrain"):  # the schema's default, and a preset's 512
        page = client_for(team.teammate).get(f"/p/alpha/runs/new/?task={task}&model={model}").content.decode()
        field = re.search(r'<div class="field spec-field" data-key="data.max_seq_len">.*?</div>', page, re.S)[0]
        assert 'value="256"' in field and 'data-unlimited="512"' in field
        assert "At most 256: the model's context." in field
        assert f'<option value="{model}" data-positions="256" selected>' in page
    config = json.loads((model_dir / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    (model_dir / "config.json").write_text(json.dumps(config))
    page = client_for(team.teammate).get(f"/p/alpha/runs/new/?model={model}").content.decode()
    field = re.search(r'<div class="field spec-field" data-key="data.max_seq_len">.*?</div>', page, re.S)[0]
    assert 'value="512"' in field and "At most 2048: the model's context." in field


def test_resuming_a_run_whose_saved_max_seq_len_is_past_the_models_positions_is_refused_up_front(
        team, catalog, client_for, sent_tasks, tmp_path):
    """A run saved before the launch check (or whose model's config.json changed since) kept data.max_seq_len 300
    against the model's 256 positions: Resume queued it, and it failed only when the engine started, after a train
    worker took it. A resume keeps the saved max_seq_len (there is no editing a spec before a resume), so the page
    says so and names the way out step by step: Duplicate, whose launch form marks data.max_seq_len with what to
    give (it came up as if nothing were wrong, the refusal's words gone), and, to keep what the run trained, its
    checkpoint exported as the new run's model."""
    from django.test import Client

    from tests.webapp.factories import write_model_dir
    from webapp.api.services import token_create

    run = services.run_create(project=team.project, spec=sft_spec(catalog, data={
        "train": catalog.sft.public_id, "max_seq_len": 300}), user=team.teammate, name="long rows")
    model_dir = write_model_dir(tmp_path / "model")  # the config.json the engine will read: 256 positions
    resolved = {**run.resolved_spec, "model": str(model_dir)}
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, current_step=3, resolved_spec=resolved)
    with_checkpoint(run, "3")
    sent_before = len(sent_tasks.calls)
    response = client_for(team.teammate).post(f"/p/alpha/runs/{run.public_id}/resume/", follow=True)
    assert response.status_code == 200
    page = response.content.decode().replace("&#x27;", "'")
    assert ("data.max_seq_len: 300 is past the model's 256 positions (max_position_embeddings 256 in its "
            "config.json): tokens after position 256 would sit at positions the model was never trained on. A resume "
            "keeps the run's data.max_seq_len (its checkpoints' place in the data counts in rows of that length, so a "
            "changed one is refused): start a new run with Duplicate, whose launch form holds this run's spec and "
            "marks data.max_seq_len, and give it at most 256, or choose a model with a longer context; to go on from "
            f"what this run trained, first export its checkpoint 3 (Checkpoints: Export as a starting model) and give "
            f"the new run model {run.public_id}@3") in page
    duplicate = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={run.public_id}")
    assert duplicate.status_code == 200
    errors = duplicate.content.decode().replace("&#x27;", "'")
    errors = errors[errors.index('id="launch-errors"'):errors.index("</div>", errors.index('id="launch-errors"'))]
    assert "<h2>This run's spec cannot run again as it is</h2>" in errors
    assert ("<li><code>data.max_seq_len</code>: 300 is past the model's 256 positions (max_position_embeddings 256 "
            "in its config.json): tokens after position 256 would sit at positions the model was never trained on; "
            "give data.max_seq_len at most 256, or choose a model with a longer context</li>") in errors
    _token, secret = token_create(user=team.teammate, name="laptop")
    answer = Client().post(f"/api/v1/projects/alpha/runs/{run.public_id}/resume/", {"max_steps": 20},
                           content_type="application/json", headers={"Authorization": f"Bearer {secret}"})
    assert answer.status_code == 400
    [message] = answer.json()["errors"]["data.max_seq_len"]
    assert message.startswith("data.max_seq_len: 300 is past the model's 256 positions")
    # The API's way out is its address, not the page's button it has not.
    assert (f"changed one is refused): POST runs/{run.public_id}/duplicate/ with a new data.max_seq_len in its spec, "
            "at most 256, or a model with a longer context; to go on") in message and "Duplicate" not in message
    # And its export is the API's address too, which the run's checkpoints/<step>/export/ answers.
    assert message.endswith(f"first export its checkpoint 3 (POST runs/{run.public_id}/checkpoints/3/export/) and "
                            f"give the new run model {run.public_id}@3") and "Checkpoints:" not in message
    run.refresh_from_db()
    assert (run.status, run.attempt, len(sent_tasks.calls)) == (RunStatus.FAILED, 1, sent_before)


def test_a_target_module_outside_the_choices_is_named_at_the_targets_input(team, catalog, client_for, sent_tasks):
    """Session-33 audit: a crafted peft.targets=zz showed "['zz']: give at least 1" at the input, and the
    element's own message (what was given, what is allowed) only under the form as peft.targets.0."""
    page = client_for(team.teammate).post("/p/alpha/runs/new/", _form(catalog, **{
        "peft.method": "lora", "peft.targets": ["zz"]})).content.decode()
    field = page.split('data-key="peft.targets"')[1].split('data-key="')[0]
    assert ("&#x27;zz&#x27; is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"
            in field)
    assert "give at least 1" not in page and "peft.targets.0" not in page
    assert Run.objects.count() == 0 and sent_tasks.calls == []
