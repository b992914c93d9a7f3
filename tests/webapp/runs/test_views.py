"""Run pages with an owner, a teammate, a viewer and an outsider: the launch form built from the
schema, its errors by field, the YAML view, duplicate, the run page and its endpoints, actions,
the table and the compare page."""
import datetime
import html
import io
import json
import os
import re
import shutil
import tarfile

import pytest
from django.db import connection
from django.template.defaultfilters import filesizeformat
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.webapp.factories import du_bytes, make_base_model, make_ready_version
from tests.webapp.runs.conftest import compare_chart_data, drawn_series, make_pool_worker, sft_spec
from webapp.core.bidi import FSI, PDI, isolated
from webapp.core.templatetags.temper import when
from webapp.runs import reporting, selectors, services, views
from webapp.runs.models import Artifact, ArtifactKind, CheckpointExport, MetricPoint, Run, RunStatus, Sample


@pytest.fixture
def run(team, catalog, sent_tasks):
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="first <b>run</b>")
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=10.0 / step, wall_time=100.0 + step,
                                                 tokens=64 * step) for step in range(1, 6)])
    Sample.objects.create(run=run, step=5, position=0, prompt="<script>alert(1)</script>", text="<img src=x onerror=alert(1)>")
    return run


def url(run, suffix=""):
    return f"/p/alpha/runs/{run.public_id}/{suffix}"


def test_the_form_has_every_schema_key_of_the_task(team, catalog, client_for):
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=dpo").content.decode()
    for key in ("optim.learning_rate", "peft.rank", "train.max_steps", "data.max_seq_len", "dpo.beta", "dpo.loss"):
        assert f'name="{key}"' in page
    assert 'name="reward.center_rewards_coefficient"' not in page
    # Only preference datasets are offered to DPO.
    assert catalog.preference.public_id in page and catalog.sft.public_id not in page


def test_launching_from_the_form_queues_a_run(team, catalog, client_for, sent_tasks):
    form = {"mode": "form", "task": "sft", "name": "lora-1", "tags": "a, b", "model": catalog.base_model.public_id,
            "data.train": catalog.sft.public_id, "peft.method": "lora", "peft.rank": "4", "peft.alpha": "8",
            "peft.targets": ["q_proj", "v_proj"], "optim.learning_rate": "0.001", "optim.schedule": "linear",
            "train.max_steps": "12", "train.batch_size": "2", "peft.quant_bits": "4", "data.packing": "on"}
    response = client_for(team.teammate).post("/p/alpha/runs/new/", form)
    assert response.status_code == 302
    run = Run.objects.get(name="lora-1")
    assert run.spec["peft"]["targets"] == ["q_proj", "v_proj"] and run.spec["peft"]["rank"] == 4
    assert run.spec["optim"]["learning_rate"] == 0.001 and run.spec["data"]["packing"] is True
    assert run.spec["data"]["loss_on"] == "completion"  # an untouched key keeps its default
    assert run.tags == ["a", "b"] and response["Location"] == f"/p/alpha/runs/{run.public_id}/"


TRL_DPO_VARIANTS = ("robust", "exo_pair", "nca_pair", "sppo_hard", "apo_zero", "apo_down", "discopop", "kto_pair",
                    "aot", "aot_pair", "bco_pair")


def test_the_dpo_form_offers_and_launches_trls_loss_variants(team, catalog, client_for, sent_tasks):
    """The dpo.loss select and the dpo.discopop_tau input come from the spec schema; each variant the form posts is
    the run's loss, with the settings it reads; a bad tau is named at its field and launches nothing."""
    client = client_for(team.teammate)
    page = client.get("/p/alpha/runs/new/?task=dpo").content.decode()
    select = page.split('name="dpo.loss"')[1].split("</select>")[0]
    for loss in ("sigmoid", *TRL_DPO_VARIANTS):
        assert f'<option value="{loss}" ' in select, loss
    assert 'name="dpo.discopop_tau"' in page
    form = {"mode": "form", "task": "dpo", "model": catalog.base_model.public_id,
            "data.train": catalog.preference.public_id, "train.max_steps": "5", "peft.targets": ["q_proj", "v_proj"],
            "dpo.beta": "0.2"}
    for loss in TRL_DPO_VARIANTS:
        extra = {"robust": {"dpo.label_smoothing": "0.1"}, "exo_pair": {"dpo.label_smoothing": "0.01"},
                 "discopop": {"dpo.discopop_tau": "0.1"}, "aot": {"dpo.label_smoothing": "0.2"},
                 "aot_pair": {"dpo.label_smoothing": "0.3"}}.get(loss, {})
        response = client.post("/p/alpha/runs/new/", {**form, "name": f"dpo-{loss}", "dpo.loss": loss, **extra})
        errors = [line for line in response.content.decode().splitlines() if "error" in line]
        assert response.status_code == 302, errors
        spec = Run.objects.get(name=f"dpo-{loss}").spec["dpo"]
        assert spec["loss"] == loss and spec["beta"] == 0.2, spec
        assert spec["label_smoothing"] == float(extra.get("dpo.label_smoothing", 0)), spec
        assert spec["discopop_tau"] == float(extra.get("dpo.discopop_tau", 0.05)), spec
    launched = Run.objects.count()
    response = client.post("/p/alpha/runs/new/", {**form, "name": "hot", "dpo.loss": "discopop",
                                                  "dpo.discopop_tau": "2"})
    assert response.status_code == 400 and "<code>dpo.discopop_tau</code>" in response.content.decode()
    response = client.post("/p/alpha/runs/new/", {**form, "name": "smooth", "dpo.loss": "kto_pair",
                                                  "dpo.label_smoothing": "0.1"})
    assert response.status_code == 400 and "<code>dpo.label_smoothing</code>" in response.content.decode()
    assert Run.objects.count() == launched


def test_it_rejects_bad_input_naming_each_field(team, catalog, client_for, sent_tasks):
    form = {"mode": "form", "task": "sft", "model": "", "data.train": catalog.sft.public_id,
            "optim.learning_rate": "fast", "train.batch_size": "0", "train.max_steps": "5"}
    response = client_for(team.teammate).post("/p/alpha/runs/new/", form)
    assert response.status_code == 400
    page = response.content.decode()
    assert "<code>model</code>: choose a starting model" in page
    assert "<code>optim.learning_rate</code>" in page and "<code>train.batch_size</code>" in page
    assert 'value="fast"' in page  # what was typed stays in the form
    assert Run.objects.count() == 0


def switched(client, inputs: dict, *, task: str | None = None, preset: str | None = None):
    """The launch page a task tab (``task``) or a preset asks for with the shown editor's ``inputs``, as
    ``static/runs_new.js`` does: a GET, the inputs in the query with ``from_task``, the task they were typed for."""
    query = {**inputs, "from_task": inputs.get("task", "sft"), "task": task or inputs.get("task", "sft")}
    return client.get("/p/alpha/runs/new/", {**query, **({"preset": preset} if preset else {})})


def _layout_form(catalog, **fields) -> dict:
    form = {"mode": "form", "task": "sft", "name": "sharded", "model": catalog.base_model.public_id,
            "data.train": catalog.sft.public_id, "train.max_steps": "5", "train.batch_size": "8",
            "peft.targets": ["q_proj", "v_proj"]}
    form.update(fields)
    return form


def test_the_scale_out_fieldset_offers_the_pools_workers_announce(team, catalog, client_for, tpu_pool):
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=sft").content.decode()
    assert 'id="scale-out"' in page
    for key in ("parallel.data", "parallel.fsdp", "parallel.tensor", "hosts"):
        assert f'name="{key}"' in page
    assert f'<option value="default" data-devices="" data-workers="0" selected>{FSI}default{PDI} — no live workers</option>' in page
    assert f'<option value="tpu" data-devices="4" data-workers="2" >{FSI}tpu{PDI} — 2 workers × 4 cpu devices (cpu)</option>' in page
    assert 'name="hosts" value="1"' in page
    assert 'name="parallel.data" value="" placeholder="default layout"' in page
    grpo = client_for(team.teammate).get("/p/alpha/runs/new/?task=grpo").content.decode()
    assert 'name="parallel.fsdp"' in grpo and 'name="pool"' in grpo and 'name="hosts"' not in grpo


def test_a_pool_name_in_its_option_label_is_isolated(team, catalog, client_for):
    """A pool's name is the queue a worker was started on (``train-<pool>``), any text: inside the
    composed option label it is wrapped in FSI…PDI, its RLO closed inside the isolate, so the summary
    after it is not reordered; and it is still escaped."""
    make_pool_worker("train@evil-0", pool="evil\u202e<b>", devices={"platform": "cpu", "count": 4, "kinds": ["cpu"]})
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=sft").content.decode()
    assert f">{FSI}evil\u202e&lt;b&gt;\u202c{PDI} — 1 worker × 4 cpu devices (cpu)</option>" in page
    assert "<b>" not in page.split('id="spec-pool"')[1].split("</select>")[0]


def test_launching_with_a_layout_on_two_hosts_from_the_form(team, catalog, client_for, sent_tasks, tpu_pool):
    form = _layout_form(catalog, **{"parallel.data": "2", "parallel.fsdp": "4", "parallel.tensor": "",
                                    "hosts": "2", "pool": "tpu"})
    response = client_for(team.teammate).post("/p/alpha/runs/new/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    run = Run.objects.get(name="sharded")
    assert run.spec["parallel"] == {"data": 2, "fsdp": 4, "tensor": 1} and run.spec["hosts"] == 2
    assert run.spec["pool"] == "tpu" and run.hosts == 2
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert "parallel:\n  data: 2\n  fsdp: 4\n  tensor: 1" in page and "hosts: 2\npool: tpu" in page
    # Duplicate fills the fieldset from the run.
    copy = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={run.public_id}").content.decode()
    assert 'name="parallel.data" value="2"' in copy and 'name="parallel.fsdp" value="4"' in copy
    assert 'name="hosts" value="2"' in copy and '<option value="tpu" data-devices="4" data-workers="2" selected>' in copy
    # A pool none of whose workers is alive now stays the duplicate's choice.
    gone = services.run_create(project=team.project, spec=sft_spec(catalog, pool="gone"), user=team.teammate)
    copy = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={gone.public_id}").content.decode()
    assert f'<option value="gone" data-devices="" data-workers="0" selected>{FSI}gone{PDI} — no live workers</option>' in copy
    assert 'name="parallel.data" value=""' in copy  # no parallel section: blank, the default layout


def test_a_copy_says_its_launch_writes_todays_template_date_and_launches_with_it(team, catalog, client_for,
                                                                                  sent_tasks, tmp_path):
    """Follow-up: Duplicate carried the date an old run's launch had fixed in data.chat_template_kwargs, so the copy
    rendered that old day. The copy's form leaves that date out and says its launch writes today's."""
    from datetime import datetime

    from tests.webapp.runs.test_services import _llama_3_2, launched_back_then

    spec = sft_spec(catalog, model=_llama_3_2(team, tmp_path))
    spec["data"]["chat_template_kwargs"] = {"custom": 1}
    original = launched_back_then(services.run_create(project=team.project, spec=spec, user=team.teammate),
                                  "01 Jan 2020")
    today = datetime.now().strftime("%d %b %Y")
    page = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={original.public_id}").content.decode()
    note = page.split('id="copy-notes">')[1].split("</div>")[0]
    assert ("rendered its chats with 01 Jan 2020, the date its launch wrote into data.chat_template_kwargs.date_string"
            in note and f"its launch writes the day it is launched, today, {today}." in note)
    assert "01 Jan 2020" not in page.replace(note, "")  # neither editor holds it
    yaml_text = html.unescape(page.split('name="spec_yaml"')[1].split(">", 1)[1].split("</textarea>")[0])
    assert "chat_template_kwargs:\n    custom: 1\n" in yaml_text
    response = client_for(team.teammate).post("/p/alpha/runs/new/", {
        "mode": "yaml", "task": "sft", "name": "copied", "spec_yaml": yaml_text})
    assert response.status_code == 302, response.content.decode()[:2000]
    copied = Run.objects.get(name="copied")
    assert copied.spec["data"]["chat_template_kwargs"] == {"custom": 1, "date_string": copied.stamped_template_date}
    assert copied.stamped_template_date in {today, datetime.now().strftime("%d %b %Y")}
    # A run whose date its author wrote is copied with it, and nothing is said.
    spec["data"]["chat_template_kwargs"] = {"date_string": "01 Jan 2020"}
    written = services.run_create(project=team.project, spec=spec, user=team.teammate)
    page = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={written.public_id}").content.decode()
    assert 'id="copy-notes"' not in page and "date_string: 01 Jan 2020" in html.unescape(page)


def test_a_layout_that_does_not_fit_the_pool_is_named_and_nothing_is_saved(team, catalog, client_for, sent_tasks,
                                                                        tpu_pool):
    form = _layout_form(catalog, **{"parallel.data": "2", "parallel.fsdp": "2", "hosts": "2", "pool": "tpu"})
    response = client_for(team.teammate).post("/p/alpha/runs/new/", form)
    assert response.status_code == 400 and not Run.objects.exists() and not sent_tasks.calls
    page = response.content.decode()
    assert ('<small class="error" id="parallel-error">data 2 × fsdp 2 × tensor 1 = 4 devices, but a job of 2 hosts '
            'on pool tpu gets 8') in page
    # What was typed stays in the form, and the YAML view holds the same spec.
    assert 'name="parallel.data" value="2"' in page and 'name="hosts" value="2"' in page
    assert "parallel:\n  data: 2\n  fsdp: 2\nhosts: 2\npool: tpu" in page
    bad = client_for(team.teammate).post("/p/alpha/runs/new/", _layout_form(
        catalog, **{"parallel.tensor": "half", "hosts": "0", "pool": "tpu"}))
    errors = bad.context["errors"]
    assert "'half'" in errors["parallel.tensor"][0] and "too small: give a whole number" in errors["hosts"][0]
    page = bad.content.decode()
    tensor_input = page.index('name="parallel.tensor"')
    assert tensor_input < page.index("&#x27;half&#x27;: input should be a valid integer", tensor_input) < page.index(
        'name="hosts"')
    assert not Run.objects.exists()


def test_the_yaml_view_launches_a_layout_the_form_shows_again(team, catalog, client_for, sent_tasks, tpu_pool):
    text = services.spec_to_yaml(sft_spec(catalog, parallel={"data": 1, "fsdp": 4}, pool="tpu",
                                          train={"max_steps": 10, "batch_size": 8}))
    response = client_for(team.teammate).post("/p/alpha/runs/new/", {"mode": "yaml", "name": "yaml-layout",
                                                                     "spec_yaml": text})
    assert response.status_code == 302
    run = Run.objects.get(name="yaml-layout")
    assert run.spec["parallel"] == {"data": 1, "fsdp": 4, "tensor": 1} and run.spec["pool"] == "tpu"
    bad = client_for(team.teammate).post("/p/alpha/runs/new/", {
        "mode": "yaml", "spec_yaml": text.replace("fsdp: 4", "fsdp: 8")})
    assert bad.status_code == 400 and "= 8 devices, but a job of 1 host on pool tpu gets 4" in bad.content.decode()


def test_the_yaml_view_launches_and_reports_lines(team, catalog, client_for, sent_tasks):
    client = client_for(team.teammate)
    bad = client.post("/p/alpha/runs/new/", {"mode": "yaml", "spec_yaml": "task: sft\ntrain:\n  max_stepz: 3\n"})
    assert bad.status_code == 400 and "<li>spec:3: train.max_stepz: unknown key" in bad.content.decode()
    listed = client.post("/p/alpha/runs/new/", {"mode": "yaml", "spec_yaml": "- a\n"}).content.decode()
    assert "<li>spec: the spec must be a mapping of keys, got list</li>" in listed  # not under the field's name
    for text, problem in (("train: {max_steps: " + "9" * 5000 + "}", "more digits than any setting takes"),
                          ("[" * 2000 + "]" * 2000, "it nests too deeply")):  # QA: each was a 500 page
        refused = client.post("/p/alpha/runs/new/", {"mode": "yaml", "spec_yaml": text})
        assert refused.status_code == 400 and problem in refused.content.decode()
    assert client.get(f"/p/alpha/runs/{Run.objects.create(project=team.project, name='x', task='sft', spec={}, resolved_spec={}).public_id}"
                      "/state.json?after_step=-99999999999999999999").status_code == 404
    twice = client.post("/p/alpha/runs/new/", {"mode": "yaml", "spec_yaml": "task: sft\ntask: dpo\n"})
    assert twice.status_code == 400 and "spec:2: task is given twice (first on line 1)" in twice.content.decode()
    good = client.post("/p/alpha/runs/new/", {"mode": "yaml", "name": "from-yaml",
                                              "spec_yaml": services.spec_to_yaml(sft_spec(catalog))})
    assert good.status_code == 302 and Run.objects.filter(name="from-yaml").exists()


def test_switching_editors_carries_what_was_typed_and_launches_nothing(team, catalog, client_for, sent_tasks):
    client = client_for(team.teammate)
    form = {**_layout_form(catalog), "name": "<b>mine</b>", "optim.learning_rate": "0.003", "switch": "yaml"}
    page = client.post("/p/alpha/runs/new/", form).content.decode()
    assert ('<form method="post" class="launch-form card" id="yaml-form" data-check-url="/p/alpha/runs/new/check/" '
            'data-submit-once data-mode="yaml" >') in page
    assert "learning_rate: 0.003\n" in page and 'id="id_yaml_name" name="name" value="&lt;b&gt;mine&lt;/b&gt;"' in page
    page = client.post("/p/alpha/runs/new/", {"mode": "yaml", "switch": "form", "name": "n", "spec_yaml":
                                              "task: dpo\noptim: {learning_rate: 0.0005}\nfoo: [1"}).content.decode()
    assert "spec:3:8: YAML syntax error" in page and "foo: [1</textarea>" in page  # stays in YAML, as typed
    page = client.post("/p/alpha/runs/new/", {"mode": "yaml", "switch": "form", "name": "n", "spec_yaml":
                                              "task: dpo\noptim: {learning_rate: 0.0005}\n"}).content.decode()
    assert 'class="active" aria-current="page" data-task="dpo"' in page and 'name="optim.learning_rate" value="0.0005"' in page
    assert 'id="launch-form" data-check-url="/p/alpha/runs/new/check/" data-submit-once data-mode="form" data-rivals="[[&quot;train.max_steps&quot;, &quot;train.epochs&quot;]]" >' in page
    # An input the form cannot read keeps the form, named.
    response = client.post("/p/alpha/runs/new/", {**form, "data.eval_group_by": "x", "task": "grpo",
                                                  "grpo.rewards.0.name": "length_target",
                                                  "grpo.rewards.0.args.length_target.target": "long"})
    assert response.status_code == 400
    assert "Fix these inputs to switch to YAML" in response.content.decode()
    assert not Run.objects.exists() and not sent_tasks.calls



def test_switching_to_the_form_refuses_keys_it_cannot_show(team, run, client_for, sent_tasks):
    """A misspelt key or choice, a key Temper sets, or an unknown task would vanish in the form and the
    run launch with defaults in their place: the switch keeps the YAML, as typed, and names each."""
    client = client_for(team.teammate)
    typed = ("task: sft\noptim: {lerning_rate: 0.1, schedule: cosin, warmup_steps: 3}\noutput_dir: runs/x\n"
             "dpo: {beta: 0.2}\n")
    response = client.post("/p/alpha/runs/new/", {"mode": "yaml", "switch": "form", "name": "n", "spec_yaml": typed})
    page = response.content.decode()
    assert response.status_code == 400 and "Fix these keys to switch to the form" in page
    assert "<code>optim.lerning_rate</code>: the sft form has no field for it" in page
    assert "<code>optim.schedule</code>: &#x27;cosin&#x27; is not one of constant, linear, cosine" in page
    assert "<code>output_dir</code>: Temper gives every run its own directory" in page
    assert "<code>dpo</code>: the sft form has no field for it" in page
    assert "<code>optim.warmup_steps</code>" not in page
    assert 'data-mode="yaml"' in page and "warmup_steps: 3}" in page  # still the YAML editor, as typed
    page = client.post("/p/alpha/runs/new/", {"mode": "yaml", "switch": "form", "spec_yaml": "task: sfft\n"}).content.decode()
    assert "<code>task</code>: &#x27;sfft&#x27; is not one of pretrain, sft" in page
    # A run's written spec (null sections of other tasks, hosts: 1, pool) switches: nothing is lost.
    response = client.post("/p/alpha/runs/new/", {"mode": "yaml", "switch": "form", "spec_yaml": services.spec_to_yaml(
        {**run.spec, "hosts": 1, "pool": "default", "parallel": None, "ppo": None})})
    assert response.status_code == 200 and 'data-mode="form"' in response.content.decode()
    assert not Run.objects.exclude(pk=run.pk).exists() and not sent_tasks.calls

def test_switching_task_keeps_what_was_changed_and_takes_the_rest_from_the_new_preset(team, catalog, client_for,
                                                                                      sent_tasks):
    """The task tabs were links: a switch lost everything typed. A value someone chose (neither the
    schema's nor a preset's) is kept where the new task has it, the rest is the new task's first preset
    (a DPO form must not inherit the SFT preset's learning rate), and the page says what was left out."""
    client = client_for(team.teammate)
    form = {**_layout_form(catalog), "name": "<b>mine</b>", "tags": "a, b", "optim.learning_rate": "0.003",
            "optim.warmup_steps": "20", "peft.rank": "4", "data.eval": catalog.preference.public_id}
    response = switched(client, form, task="dpo")
    page = response.content.decode()
    assert response.status_code == 200 and 'class="active" aria-current="page" data-task="dpo"' in page
    assert 'name="optim.learning_rate" value="0.003"' in page and 'name="peft.rank" value="4"' in page
    assert 'name="dpo.beta" value="0.1"' in page  # the DPO preset
    assert 'name="train.batch_size" value="8"' in page and 'name="train.max_steps" value="5"' in page
    # The DPO preset runs 1 epoch: with max_steps kept, a launch was refused for giving both.
    epochs = page.split('name="train.epochs"')[1].split(">")[0]
    assert 'value=""' in epochs or "value=" not in epochs, epochs
    assert 'name="optim.warmup_steps" value="10"' in page  # 20 is the full fine-tune preset's: not a choice
    assert f'<option value="{catalog.base_model.public_id}" selected>' in page
    assert f'<option value="{catalog.preference.public_id}" selected>' in page  # data.eval
    assert 'id="id_name" name="name" value="&lt;b&gt;mine&lt;/b&gt;"' in page and 'value="a, b"' in page
    assert ("Kept what you chose: <code>data.eval</code>, <code>model</code>, <code>optim.learning_rate</code>, "
            "<code>peft.rank</code>, <code>peft.targets</code>, <code>train.max_steps</code>.") in page
    assert "<code>data.train</code>: dpo takes preference data" in page
    assert "learning_rate: 0.003\n" in page and "task: dpo\n" in page  # the YAML view agrees

    # GRPO to PPO: keys of GRPO's own section move to PPO's of the same name.
    page = switched(client, {
        "mode": "form", "task": "grpo", "model": catalog.base_model.public_id, "data.train": catalog.prompts.public_id,
        "grpo.rewards.0.name": "length_target", "grpo.rewards.0.weight": "2",
        "grpo.rewards.0.args.length_target.target": "12", "grpo.num_generations": "4", "grpo.epsilon": "0.3"},
        task="ppo").content.decode()
    assert 'class="active" aria-current="page" data-task="ppo"' in page and 'name="ppo.epsilon" value="0.3"' in page
    assert '<option value="length_target" selected>' in page and 'value="12"' in page
    assert "<code>grpo.num_generations</code>: the ppo form has no field for it" in page
    assert not Run.objects.exists() and not sent_tasks.calls


def test_choosing_a_preset_keeps_what_was_chosen_and_takes_the_rest_from_it(team, catalog, client_for, sent_tasks):
    """The presets were links: choosing QLoRA after picking the model and data and naming the run gave
    the bare QLoRA page, everything picked gone without a word. Like a task switch, the page keeps the
    values someone chose and takes the rest from the preset, in the same editor, and says what was kept."""
    client = client_for(team.teammate)
    form = {**_layout_form(catalog), "name": "<b>mine</b>", "tags": "a, b", "peft.method": "lora",
            "train.max_steps": "77", "peft.targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                      "down_proj"]}
    response = switched(client, form, preset="QLoRA")
    page = response.content.decode()
    assert response.status_code == 200 and 'class="active" aria-current="page" data-task="sft"' in page
    assert '<option value="qlora" selected>' in page  # the preset's, where the LoRA preset's value stood
    assert '<a class="button active" aria-current="true" href="?task=sft&preset=QLoRA"' in page
    assert f'<option value="{catalog.base_model.public_id}" selected>' in page
    assert f'<option value="{catalog.sft.public_id}" selected>' in page
    assert 'name="train.max_steps" value="77"' in page
    assert 'id="id_name" name="name" value="&lt;b&gt;mine&lt;/b&gt;"' in page and 'value="a, b"' in page
    assert "Applied the preset QLoRA." in page and "Switched from" not in page
    assert "Kept what you chose: <code>data.train</code>, <code>model</code>, <code>train.max_steps</code>." in page
    # From the YAML editor too, which it stays in.
    served_yaml = client.get("/p/alpha/runs/new/?task=sft").context["yaml_text"]
    response = switched(client, {"mode": "yaml", "task": "sft", "name": "n",
                                 "spec_yaml": served_yaml.replace("learning_rate: 0.0002", "learning_rate: 0.003")},
                        preset="Full fine-tune")
    assert response.status_code == 200 and 'data-mode="yaml" >' in response.content.decode()
    yaml_text = response.context["yaml_text"]
    assert "learning_rate: 0.003\n" in yaml_text and "method: none\n" in yaml_text
    assert not Run.objects.exists() and not sent_tasks.calls


def test_booleans_written_as_strings_in_yaml_show_as_the_schema_reads_them(team, catalog, client_for, sent_tasks):
    """packing: "false" came up ticked in the form (a non-empty string), reversing what a launch from the
    YAML stored; 'maybe' was ticked too, with no word."""
    client = client_for(team.teammate)
    served_yaml = client.get("/p/alpha/runs/new/?task=sft").context["yaml_text"]

    def packing_box(value: str):
        response = client.post("/p/alpha/runs/new/", {"mode": "yaml", "switch": "form", "spec_yaml": served_yaml.replace(
            "data:\n", f"data:\n  packing: {value}\n", 1)})
        page = response.content.decode()
        box = page.split('name="data.packing"')[1].split(">")[0] if response.status_code == 200 else None
        return response.status_code, page, box

    status, _page, box = packing_box('"false"')
    assert status == 200 and "checked" not in box
    status, _page, box = packing_box("'yes'")
    assert status == 200 and "checked" in box
    status, page, _box = packing_box("maybe")
    assert status == 400 and "<code>data.packing</code>: &#x27;maybe&#x27; is not true or false" in page
    assert not Run.objects.exists()


def test_switching_task_from_yaml_keeps_the_values_chosen_in_it(team, catalog, client_for, sent_tasks):
    client = client_for(team.teammate)
    served_yaml = client.get("/p/alpha/runs/new/?task=sft").context["yaml_text"]
    typed = served_yaml.replace("learning_rate: 0.0002", "learning_rate: 0.003") + "epochs: 3\n"
    assert "learning_rate: 0.003" in typed
    response = switched(client, {"mode": "yaml", "task": "sft", "name": "n", "spec_yaml": typed}, task="dpo")
    page = response.content.decode()
    assert response.status_code == 200 and 'data-mode="yaml" >' in page
    yaml_text = response.context["yaml_text"]
    assert "task: dpo\n" in yaml_text and "learning_rate: 0.003\n" in yaml_text and "beta: 0.1\n" in yaml_text
    assert "max_steps: 200" not in yaml_text  # the SFT preset's, not changed by hand: left behind
    # The model too: the form chose the project's only one, and it is carried to the dpo form.
    assert "Kept what you chose: <code>model</code>, <code>optim.learning_rate</code>." in page
    assert "<code>epochs</code>: the dpo form has no field for it" in page
    # YAML that does not parse stays as typed, with its line.
    response = switched(client, {"mode": "yaml", "task": "sft", "spec_yaml": "optim: [1\n"}, task="dpo")
    assert response.status_code == 400 and "YAML syntax error" in response.content.decode()
    assert 'class="active" aria-current="page" data-task="sft"' in response.content.decode()
    # So does a form input that cannot be read.
    response = switched(client, {**_layout_form(catalog), "task": "grpo", "grpo.rewards.0.name": "length_target",
                                 "grpo.rewards.0.args.length_target.target": "long"}, task="ppo")
    page = response.content.decode()
    assert response.status_code == 400 and "Fix these inputs to switch to ppo" in page
    assert 'class="active" aria-current="page" data-task="grpo"' in page
    assert not Run.objects.exists() and not sent_tasks.calls


def test_a_switch_sent_as_a_form_switches_and_launches_nothing(team, catalog, client_for, sent_tasks):
    """A YAML spec too long for an address switches by POST (static/runs_new.js), as pages from before switches were
    GETs do: the switch is made, never read as a launch of what the editor held."""
    client = client_for(team.teammate)
    served_yaml = client.get("/p/alpha/runs/new/?task=sft").context["yaml_text"]
    typed = served_yaml.replace("learning_rate: 0.0002", "learning_rate: 0.003") + "# " + "x" * 7000 + "\n"
    response = client.post("/p/alpha/runs/new/", {"mode": "yaml", "task": "sft", "name": "n", "spec_yaml": typed,
                                                  "switch_task": "dpo"})
    page = response.content.decode()
    assert response.status_code == 200 and "task: dpo\n" in response.context["yaml_text"]
    # The model too: the form chose the project's only one, and it is carried to the dpo form.
    assert "Kept what you chose: <code>model</code>, <code>optim.learning_rate</code>." in page
    preset = client.post("/p/alpha/runs/new/", {**_layout_form(catalog), "apply_preset": "QLoRA"})
    assert preset.status_code == 200 and 'name="name" value="sharded"' in preset.content.decode()
    assert not Run.objects.exists() and not sent_tasks.calls


def test_duplicate_prefills_from_a_run(team, run, client_for):
    page = client_for(team.owner).get(f"/p/alpha/runs/new/?from={run.public_id}").content.decode()
    assert 'value="first &lt;b&gt;run&lt;/b&gt; (copy)"' in page
    assert f'<option value="{run.spec["data"]["train"]}" selected>' in page


def test_the_run_page_draws_loss_first_as_the_compare_page_does(team, run, client_for):
    """The run page made its charts in the names' alphabetical order, eval/loss before loss; the
    compare page draws loss first, then the other training metrics, then the eval ones, eval/loss first
    among them (``selectors.chart_order``)."""
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=5, name=name, value=1.0, wall_time=105.0, tokens=320)
                                     for name in ("eval/loss", "grad_norm", "eval/accuracy")])
    response = client_for(team.viewer).get(url(run))
    series = json.loads(re.search(r'<script id="run-series" type="application/json">(.*?)</script>',
                                  response.content.decode(), re.S).group(1))
    assert list(series) == ["loss", "grad_norm", "eval/loss", "eval/accuracy"]


def test_the_run_page_says_which_metrics_ended_not_finite(team, run, client_for):
    """A chart ends at its metric's last finite point: a run whose eval loss went NaN at the end looked as if
    it had stopped evaluating."""
    Run.objects.filter(pk=run.pk).update(
        final_metrics={"eval/loss": {"last": 2.0, "step": 2}, "grad_norm": {"last": 0.5, "step": 6}},
        not_finite_metrics={"eval/loss": {"step": 4, "value": "nan"}, "grad_norm": {"step": 5, "value": "inf"},
                            "<b>x</b>": {"step": 3, "value": "-inf"}})
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert ('<p class="error" id="not-finite">Not drawn: &lt;b&gt;x&lt;/b&gt; was minus infinity at step 3; '
            'eval/loss was NaN at step 4.') in page  # grad_norm was finite again at step 6
    Run.objects.filter(pk=run.pk).update(not_finite_metrics={})
    assert 'id="not-finite"' not in client_for(team.viewer).get(url(run)).content.decode()


def test_the_run_page_escapes_model_text(team, run, client_for):
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert "first &lt;b&gt;run&lt;/b&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img src=x" not in page
    assert "<script>alert(1)" not in page
    assert 'id="run-series"' in page and 'id="cancel-confirm"' not in page  # viewers see no actions


def succeeded_with_export(run):
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    run.refresh_from_db()
    (run.output_dir / "export").mkdir(parents=True)
    return run


def test_the_run_page_reports_the_serving_copys_memory_perplexity_and_agreement(team, run, client_for, settings):
    settings.TEMPER_SERVE_QUANTIZE = "int8"
    assert 'id="serving-copy"' not in client_for(team.viewer).get(url(run)).content.decode()  # not succeeded
    run = succeeded_with_export(run)
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert 'id="serving-copy"' in page and "int8 serving copy being written" in page
    assert "Make it again" not in page  # nothing to make again while the automatic copy is written
    copy = run.output_dir / "export" / "quantized"
    copy.mkdir()
    # What jaxengine.quantize writes (tests/worker/test_serve.py runs the real one).
    (copy / "quantization.json").write_text(json.dumps({
        "scheme": "int8", "bits": 8, "group_size": None, "modules": [{"name": "a-module-name"}], "model_bytes": 3 * 2**20,
        "bfloat16_bytes": 5 * 2**20, "ratio_to_bfloat16": 0.6, "eval_sequences": 16, "perplexity_reference": 4.25,
        "perplexity_quantized": 4.3, "perplexity_increase": 0.30 / 25, "eval_prompts": 16, "greedy_agreement": 0.9375}))
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert "being written" not in page and 'data-copy-state="ready"' in page
    assert "<dt>Memory</dt><dd>3.0 MiB, 60% of the bfloat16 model&#x27;s 5.0 MiB</dd>" in page
    assert "<dt>Perplexity</dt><dd>4.3 against 4.25 unquantized (+1.2%), on 16 evaluation rows</dd>" in page
    assert "94% of greedy tokens the same as the unquantized model&#x27;s, on 16 prompts" in page
    assert f"<code>{copy}</code>" in page and "a-module-name" not in page


def test_a_serving_copy_that_failed_says_why_escaped(team, run, client_for, settings):
    settings.TEMPER_SERVE_QUANTIZE = "int8"
    run = succeeded_with_export(run)
    (run.output_dir / "serving-copy-error.txt").write_text("ValueError: <img src=x onerror=alert(1)> too small")
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert "int8 serving copy failed" in page and "ValueError: &lt;img src=x onerror=alert(1)&gt; too small" in page
    assert f"jaxengine export --run {run.output_dir} --quantize int8" in page
    settings.TEMPER_SERVE_QUANTIZE = "none"  # nothing writes copies, but this one's failure is still told
    assert "serving copy failed" in client_for(team.viewer).get(url(run)).content.decode()
    partial = client_for(team.viewer).get(url(run, "serving-copy/")).content.decode()  # what the page asks again
    assert 'data-state="failed"' in partial and "&lt;img src=x" in partial and "<img" not in partial
    (run.output_dir / "serving-copy-error.txt").unlink()
    partial = client_for(team.viewer).get(url(run, "serving-copy/")).content.decode()
    assert 'data-state="none"' in partial and "No serving copy" in partial and "<form" not in partial


def test_with_automatic_copies_off_a_member_makes_the_first_serving_copy(team, run, client_for, settings,
                                                                          django_capture_on_commit_callbacks,
                                                                          monkeypatch):
    """With TEMPER_SERVE_QUANTIZE=none the run page had no serving copy card at all: the card only offered to
    make a copy again once one existed, so a run's final model could not get its first one from the page."""
    from webapp.celery import app as celery_app
    from webapp.runs.models import ServingCopy, ServingCopyStatus
    from webapp.runs.serving_copies import MAKE_COPY_TASK

    sent = []
    monkeypatch.setattr(celery_app, "send_task", lambda name, args=None, queue=None, **kwargs: sent.append((name, args)))
    settings.TEMPER_SERVE_QUANTIZE = "none"
    run = succeeded_with_export(run)
    page = client_for(team.teammate).get(url(run)).content.decode()
    card = page[page.index('id="serving-copy"'):]
    card = card[:card.index("</section>")]
    assert "No serving copy" in card and "TEMPER_SERVE_QUANTIZE=none" in card
    assert f'action="{url(run, "serving-copy/")}"' in card and "Make serving copy" in card
    assert '<option value="int8" selected>' in card and '<option value="int4">' in card
    viewer_page = client_for(team.viewer).get(url(run)).content.decode()
    assert "No serving copy" in viewer_page and "Make serving copy" not in viewer_page
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(team.teammate).post(url(run, "serving-copy/"), {"scheme": "int4"}, follow=True)
    copy = ServingCopy.objects.get(run=run, step__isnull=True)
    assert (copy.scheme, copy.status) == ("int4", ServingCopyStatus.WRITING) and sent == [(MAKE_COPY_TASK, [copy.pk])]
    page = response.content.decode()
    assert "Making the int4 serving copy of this run&#x27;s final model;" in page and "int4 serving copy being written" in page


def test_a_reward_run_is_not_served_as_a_chat_model(team, run, client_for, settings):
    """QA: a reward run's page offered its 'serving copy' (perplexity 1.956e+05 against 1.956e+05), the chat
    listed it among its models, and its Samples card waited for generations it never writes."""
    from webapp.chat.selectors import model_choices
    from webapp.runs.models import Artifact, ArtifactKind

    settings.TEMPER_SERVE_QUANTIZE = "int8"
    Run.objects.filter(pk=run.pk).update(task="reward")
    run = succeeded_with_export(run)
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(run.output_dir / "export"))
    from django.template.loader import render_to_string

    assert 'id="serving-copy"' not in client_for(team.viewer).get(url(run)).content.decode()
    assert "A reward model scores text and writes none" in render_to_string("runs/_samples.html", {"run": run})
    assert run.public_id not in [choice.ref for choice in model_choices(project=team.project)]
    Run.objects.filter(pk=run.pk).update(task="sft")
    assert run.public_id in [choice.ref for choice in model_choices(project=team.project)]
    assert 'id="serving-copy"' in client_for(team.viewer).get(url(run)).content.decode()


def test_cancel_asks_first(team, run, client_for):
    run.status = RunStatus.RUNNING
    run.save(update_fields=["status"])
    page = client_for(team.teammate).get(url(run)).content.decode()
    confirmation = page[page.index('<details class="confirm" id="cancel-confirm">'):]
    confirmation = confirmation[:confirmation.index("</details>")]
    assert "<summary>Cancel…</summary>" in confirmation and "Resume continues from the last saved checkpoint" in confirmation
    assert '<button type="submit" class="danger">Cancel <bdi>first &lt;b&gt;run&lt;/b&gt;</bdi></button>' in confirmation


def test_a_succeeded_run_offers_to_train_further_and_an_ended_one_to_resume(team, run, client_for):
    """A succeeded run's page showed "Resume" beside an empty "new total" box: nothing said it meant training the
    run further, past the steps it had done."""
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=20)
    page = client_for(team.teammate).get(url(run)).content.decode()
    form = page[page.index('class="inline resume-form"'):]
    form = form[:form.index("</form>")]
    assert '<button type="submit">Train further</button>' in form and ">Resume<" not in form
    assert "All 20 steps done: give a new total above 20 to train it further." in form
    assert 'aria-label="New total of steps to train to"' in form
    for status in (RunStatus.CANCELLED, RunStatus.FAILED):
        Run.objects.filter(pk=run.pk).update(status=status, current_step=12)
        page = client_for(team.teammate).get(url(run)).content.decode()
        form = page[page.index('class="inline resume-form"'):]
        form = form[:form.index("</form>")]
        assert '<button type="submit">Resume</button>' in form and "Train further" not in form
        assert 'id="train-further-hint"' not in form


def test_a_running_run_whose_cancel_was_asked_says_it_is_stopping(team, run, client_for):
    # It said "running" and offered Cancel again until the worker ended its step, on the page the
    # Cancel button came back to, in the runs table and on a teammate's page.
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, cancel_requested=True)
    client = client_for(team.teammate)
    page = client.get(url(run)).content.decode()
    assert 'id="cancel-confirm"' not in page
    assert '<span class="badge status status-stopping badge-warn" data-status="stopping">stopping</span>' in page
    assert "Cancel asked: the worker stops after its current step" in page
    assert json.loads(client.get(url(run, "state.json")).content)["progress"]["stopping"] is True
    table = client.get("/p/alpha/runs/").content.decode()
    assert 'data-status="stopping"' in table


def test_a_resumed_run_waiting_in_the_queue_names_no_worker(team, run, client_for, sent_tasks, monkeypatch):
    # It read "Worker train@host-1 (attempt 2)" and that worker's devices while it waited in the queue,
    # as if it were on it (it starts on whichever train worker is free), as the reaper's re-queue does not.
    monkeypatch.setattr(services, "_clear_cancel_flag", lambda public_id: None)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED, worker_name="train@host-1")
    client_for(team.teammate).post(url(run, "resume/"))
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.worker_name == ""
    assert "train@host-1" not in client_for(team.viewer).get(url(run)).content.decode()


def test_notes_are_rendered_safely(team, run, client_for):
    services.run_update_details(run=run, notes="**bold** <script>x()</script> [a](javascript:alert(1))")
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert "<strong>bold</strong>" in page and "<script>x()" not in page and "javascript:" not in page


def test_the_yaml_views_ids_include_evaluation_only_data(team, catalog, client_for):
    """An sft run may evaluate on a prompts version (the demo's demo-eval), and the form offers it, but the
    YAML view's 'Ids you can use' listed the training versions only, so its dv_ id was nowhere to copy."""
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=sft").content.decode()
    ids = page[page.index('<details class="ids">'):]
    ids = ids[:ids.index("</details>")]
    assert f"<code>{catalog.sft.public_id}</code>" in ids
    assert f"<code>{catalog.prompts.public_id}</code> \u2068questions\u2069 v1 (prompts, 1 row) — <code>data.eval</code> only" in ids
    assert catalog.preference.public_id not in ids


def test_state_endpoint_returns_points_after_a_step(team, run, client_for):
    state = client_for(team.viewer).get(url(run, "state.json") + "?after_step=3").json()
    assert state["series"]["loss"]["step"] == [4, 5] and state["series"]["loss"]["value"] == [2.5, 2.0]
    assert state["progress"]["status"] == "queued" and state["sample_steps"] == [5]


def test_the_run_page_and_the_state_endpoint_say_what_the_series_times_count_from(team, run, client_for):
    """The run page draws by time too: the live points carry wall times, counted from the run's first point, which
    the page says (data-start-time) and a page opened before that point asks the state endpoint for (start_time=1)."""
    client = client_for(team.viewer)
    assert 'data-start-time="101.0"' in client.get(url(run)).content.decode()
    assert client.get(url(run, "state.json") + "?after_step=5&start_time=1").json()["series_start_time"] == 101.0
    assert "series_start_time" not in client.get(url(run, "state.json") + "?after_step=5").json()
    MetricPoint.objects.filter(run=run).delete()
    assert 'data-start-time=""' in client.get(url(run)).content.decode()
    assert client.get(url(run, "state.json") + "?start_time=1").json()["series_start_time"] is None


def test_a_poll_of_a_run_with_nothing_new_reads_neither_its_series_cache_nor_every_point(team, run, client_for):
    """Page speed: a run page polls ``state.json`` every 2 s when events do not get through, and every 30 s
    once its run is finished. Each poll read the run's series_cache (most of a megabyte for a finished run)
    and, before finding no point after the step it sent, every point of the run for the time they count from.
    Neither is read now while nothing is new; a new point still comes, timed from the run's first point."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=5,
                                         series_cache=selectors.series_cache_for(run))
    client = client_for(team.viewer)
    client.get(url(run, "state.json"))  # the first load over (sessions read)
    with CaptureQueriesContext(connection) as queries:
        state = client.get(url(run, "state.json") + "?after_step=5").json()
    assert state["series"] == {} and state["progress"]["step"] == 5
    read = [query["sql"] for query in queries.captured_queries]
    assert not [sql for sql in read if "series_cache" in sql or "MIN(" in sql.upper()], read
    MetricPoint.objects.create(run=run, step=6, name="loss", value=1.5, wall_time=107.0, tokens=384)
    state = client.get(url(run, "state.json") + "?after_step=5").json()
    assert state["series"]["loss"] == {"step": [6], "value": [1.5], "tokens": [384], "time": [6.0], "downsampled": False}
    # A page without points yet asks for the whole run.
    assert client.get(url(run, "state.json")).json()["series"]["loss"]["step"] == [1, 2, 3, 4, 5, 6]


def test_a_catch_up_reads_each_metric_after_its_own_last_step(team, run, client_for):
    """Page speed: the run page asked ``state.json`` for every point after the smallest last step of its
    metrics, so one metric logged rarely (an eval every 500 steps) made each catch-up send again every
    other metric's points since that eval. ``after_steps`` gives a metric's own last step; the metrics it
    leaves out (the rare one, a metric the page has not seen) still come after ``after_step``."""
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name=name, value=1.0, wall_time=100.0 + step,
                                                 tokens=64 * step)
                                     for step in range(6, 11) for name in ("loss",)]
                                    + [MetricPoint(run=run, step=step, name=name, value=0.5, wall_time=100.0 + step)
                                       for step in (5, 10) for name in ("eval/loss", "eval/new")])
    client = client_for(team.viewer)
    state = client.get(url(run, "state.json") + '?after_step=5&after_steps={"loss":%209}').json()
    assert {name: entry["step"] for name, entry in state["series"].items()} == {
        "loss": [10], "eval/loss": [10], "eval/new": [10]}
    assert state["series"]["loss"]["time"] == [9.0]  # from the run's first point, as every poll's
    # A name's own step may lie before after_step: its points from there come.
    state = client.get(url(run, "state.json") + '?after_step=8&after_steps={"eval/loss":%204}').json()
    assert {name: entry["step"] for name, entry in state["series"].items()} == {
        "loss": [9, 10], "eval/loss": [5, 10], "eval/new": [10]}
    # More different steps than a WHERE should hold: every listed metric comes after the smallest.
    many = json.dumps({"loss": 9, **{f"other/{step}": step for step in range(10, 10 + selectors.AFTER_STEPS_MAX_STEPS)}})
    state = client.get(url(run, "state.json") + "?after_step=8&after_steps=" + many).json()
    assert {name: entry["step"] for name, entry in state["series"].items()} == {
        "loss": [9, 10], "eval/loss": [10], "eval/new": [10]}


def test_state_endpoint_rejects_after_steps_that_are_not_steps_by_metric(team, run, client_for):
    client = client_for(team.viewer)
    for after_steps in ("[1]", '{"loss":"3"}', '{"loss":3.0}', '{"loss":true}', '{"loss":-2}', "{", '{"loss":1e99}'):
        answer = client.get(url(run, "state.json") + "?after_step=1&after_steps=" + after_steps)
        assert answer.status_code == 404, after_steps

def test_an_api_read_of_the_points_after_a_step_leaves_the_runs_series_cache_unread(team, run):
    """Page speed: a script that follows a run through the API (``metrics/?after_step=``) loaded the run's
    series_cache (most of a megabyte for a finished run) at each read, which only a whole run's series use."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from webapp.api.services import token_create

    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=5,
                                         series_cache=selectors.series_cache_for(run))
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=team.viewer, name='follow')[1]}")
    address = f"/api/v1/projects/alpha/runs/{run.public_id}/metrics/"
    with CaptureQueriesContext(connection) as queries:
        part = api.get(address + "?after_step=3").json()["series"]
    assert part["loss"]["step"] == [4, 5] and part["loss"]["time"] == [3.0, 4.0]
    assert not [query["sql"] for query in queries.captured_queries if "series_cache" in query["sql"]]
    assert api.get(address).json()["series"]["loss"]["step"] == [1, 2, 3, 4, 5]  # a whole run reads it


def test_state_endpoint_takes_step_and_line_numbers_as_ascii_digits(team, run, client_for):
    """int() took ' 3', '+3', '3_0' and Arabic-Indic '٣' as numbers; they are no step nor line number."""
    client = client_for(team.viewer)
    assert client.get(url(run, "state.json") + "?after_step=-1").json()["series"]["loss"]["step"] == [1, 2, 3, 4, 5]
    for query in ("after_step=%203", "after_step=%2B3", "after_step=%D9%A3", "after_step=-%D9%A3", "after_log=1_0",
                  "after_log=-1", "after_step=3.0"):
        assert client.get(url(run, "state.json") + f"?{query}").status_code == 404, query


def test_the_samples_step_is_ascii_digits(team, run, client_for):
    client = client_for(team.viewer)
    assert client.get(url(run, "samples/") + "?step=%D9%A3").content == client.get(url(run, "samples/") + "?step=abc").content


def test_state_endpoint_gives_the_latest_tokens_per_second(team, run, client_for):
    assert client_for(team.viewer).get(url(run, "state.json")).json()["progress"]["tokens_per_second"] is None
    run.final_metrics = {"tokens_per_second": {"last": 2512.4, "min": 35.7, "max": 3464.0, "step": 19}}
    run.save(update_fields=["final_metrics"])
    assert client_for(team.viewer).get(url(run, "state.json")).json()["progress"]["tokens_per_second"] == 2512.4


def test_samples_partial_picks_the_nearest_step(team, run, client_for):
    page = client_for(team.viewer).get(url(run, "samples/") + "?step=3").content.decode()
    assert 'data-step="5"' in page and "&lt;img src=x" in page


def test_viewers_cannot_launch_or_act(team, run, client_for, catalog):
    client = client_for(team.viewer)
    assert client.get("/p/alpha/runs/new/").status_code == 403
    for action in ("cancel/", "resume/", "retry/", "edit/"):
        assert client.post(url(run, action)).status_code == 403
    assert client.post("/p/alpha/runs/archive/", {"runs": [run.public_id]}).status_code == 403


def test_it_requires_access(team, run, client_for):
    client = client_for(team.outsider)
    for path in ("", "state.json", "samples/", "events/", "checkpoints/", "serving-copy/"):
        assert client.get(url(run, path)).status_code == 404, path
    for action in ("cancel/", "resume/", "retry/", "edit/"):
        assert client.post(url(run, action)).status_code == 404
    for path in ("/p/alpha/runs/", "/p/alpha/runs/new/", f"/p/alpha/runs/compare/?runs={run.public_id}",
                 f"/p/alpha/runs/compare/metrics.csv?runs={run.public_id}"):
        assert client.get(path).status_code == 404, path
    # A run id of this project under the outsider's own project is not found either.
    assert client.get(f"/p/alpha-elsewhere/runs/{run.public_id}/").status_code == 404


def test_members_cancel_and_retry(team, run, client_for, sent_tasks):
    client = client_for(team.teammate)
    assert client.post(url(run, "cancel/")).status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    response = client.post(url(run, "retry/"))
    retried = Run.objects.exclude(pk=run.pk).get()
    assert response["Location"] == f"/p/alpha/runs/{retried.public_id}/"


def test_runs_table_search_finds_runs_by_a_part_of_a_tag_or_of_the_notes(team, run, client_for, catalog, sent_tasks):
    """QA (a W&B user's search box): a search matched a run's name and id alone, so a run read by its tag ("ablation")
    or by what its notes say ("diverged") was not found. It matches a part of a tag or of the notes, case aside, on
    the page as in the REST API; the JSON of the tags is not searched (a comma or a quote matches no run)."""
    tagged = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="second",
                                 tags="Ablation-LR, café")
    noted = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="third")
    Run.objects.filter(pk=noted.pk).update(notes="The loss **diverged** at step 40.")
    client = client_for(team.viewer)
    for query, found in (("ablation", tagged), ("CAFÉ", tagged), ("Diverged", noted)):
        page = client.get("/p/alpha/runs/", {"q": query}).content.decode()
        assert [other.public_id in page for other in (run, tagged, noted)] == [
            other == found for other in (run, tagged, noted)], query
    for query in (",", '"', "[", "%"):
        page = client.get("/p/alpha/runs/", {"q": query}).content.decode()
        assert tagged.public_id not in page and run.public_id not in page, query


def test_the_search_and_the_tag_menu_follow_a_runs_tags_as_they_are_edited(team, run, client_for, catalog, sent_tasks):
    """The table's search and tag menu read the runs' tags from rows of their own (``RunTag``), written with the run's
    list: after an edit they find the tags the run now has, and none it had."""
    tagged = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="second",
                                 tags="Ablation-LR, café")
    client = client_for(team.teammate)

    def found(query: str) -> list[bool]:
        page = client.get("/p/alpha/runs/", {"q": query}).content.decode()
        return [other.public_id in page for other in (run, tagged)]

    def tag_menu() -> list[str]:
        page = client.get("/p/alpha/runs/").content.decode()
        return re.findall(r"<option >([^<]*)</option>", page.split('<select name="tag"')[1].split("</select>")[0])

    # "-lr": no public id holds a hyphen (a bare "lr" found the first run by its random id now and then)
    assert found("-lr") == [False, True] and tag_menu() == ["Ablation-LR", "café"]
    response = client.post(url(tagged, "edit/"), {"name": "second", "tags": 'Dropout 50%, "quoted" tag', "notes": ""})
    assert response.status_code == 302
    for query, hits in (("ablation", [False, False]), ("CAFÉ", [False, False]), ("dropout 5", [False, True]),
                        ("50%", [False, True]), ('"QUOTED"', [False, True]), ("0%", [False, True]),
                        ("%", [False, True])):
        assert found(query) == hits, query
    assert tag_menu() == ["&quot;quoted&quot; tag", "Dropout 50%"]
    assert client.post(url(tagged, "edit/"), {"name": "second", "tags": "", "notes": ""}).status_code == 302
    assert found("dropout") == [False, False] and tag_menu() == []


def test_the_sort_menu_offers_a_final_metric_once_a_run_logs_it_until_no_run_left_holds_it(
        team, catalog, client_for, sent_tasks, django_capture_on_commit_callbacks):
    """The sort menu's final metrics are kept as runs log them (``ProjectMetricName``), not read from every run on
    each page: a metric an external run logs through the API is offered at once, while it runs, and one a Temper
    run's worker logs when it reports it; an archived run's stay offered (the table lists archived runs and sorts
    them by those), a deleted run's go once no run of the project holds them."""
    client = client_for(team.viewer)

    def sort_menu() -> list[str]:
        page = client.get("/p/alpha/runs/").content.decode()
        return re.findall(r'<option value="metric:([^"]+)"', page.split('<select name="sort"')[1].split("</select>")[0])

    assert sort_menu() == []
    external = services.run_create_external(project=team.project, name="laptop", config={}, user=team.owner)
    services.metrics_log(run=external, points=[{"step": 1, "metrics": {"eval/bleu": 0.25, "loss": 2.0}},
                                               {"step": 2, "metrics": {"loss": float("nan")}}])
    assert sort_menu() == ["eval/bleu", "loss"]
    trained = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="trained")
    finished_with_points(trained, {"loss": [2.0, 1.0], "grad_norm": [0.5, 0.25]})
    assert sort_menu() == ["eval/bleu", "grad_norm", "loss"]
    services.run_finish_external(run=external, status=RunStatus.SUCCEEDED)
    assert client_for(team.owner).post("/p/alpha/runs/archive/", {"runs": [external.public_id], "archived": "1"}
                                       ).status_code == 302
    assert sort_menu() == ["eval/bleu", "grad_norm", "loss"]
    page = client.get("/p/alpha/runs/", {"archived": "1", "sort": "-metric:eval/bleu"}).content.decode()
    assert external.public_id in page and "Ignored" not in page
    with django_capture_on_commit_callbacks(execute=True):
        services.run_delete(run=external)
    assert sort_menu() == ["grad_norm", "loss"]  # loss: the trained run logged it too


def test_runs_table_filters_and_archives(team, run, client_for, catalog, sent_tasks):
    other = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="second", tags="sweep")
    client = client_for(team.teammate)
    page = client.get("/p/alpha/runs/?tag=sweep").content.decode()
    assert other.public_id in page and run.public_id not in page
    assert run.public_id in client.get("/p/alpha/runs/?q=first").content.decode()
    # Part of an id finds its run, case aside (only the whole id did).
    part = other.public_id[4:10]
    for query in (part, part.upper(), other.public_id.upper()):
        page = client.get(f"/p/alpha/runs/?q={query}").content.decode()
        assert other.public_id in page and run.public_id not in page, query
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)  # an active run is not archived
    client.post("/p/alpha/runs/archive/", {"runs": [run.public_id], "archived": "1"})
    assert run.public_id not in client.get("/p/alpha/runs/").content.decode()
    assert run.public_id in client.get("/p/alpha/runs/?archived=1").content.decode()


def test_compare_page_and_csv(team, run, client_for, catalog, sent_tasks):
    other = services.run_create(project=team.project, spec=sft_spec(catalog, optim={"learning_rate": 0.01}),
                                user=team.owner, name="second")
    MetricPoint.objects.create(run=other, step=1, name="loss", value=3.0, wall_time=5.0, tokens=64)
    Sample.objects.create(run=other, step=1, position=0, prompt="<script>alert(1)</script>", text="other answer")
    client = client_for(team.viewer)
    response = client.get(f"/p/alpha/runs/compare/?runs={run.public_id}&runs={other.public_id}")
    page = response.content.decode()
    assert response.status_code == 200
    assert '<tr class="differs"><td><code>optim.learning_rate</code></td><td>0.0001</td><td>0.01</td></tr>' in page
    train = f'<td><bdi>chats v{catalog.sft.number}</bdi> <small class="muted">{catalog.sft.public_id}</small></td>'
    assert f'<tr class="same"><td><code>data.train</code></td>{train}{train}</tr>' in page
    data = compare_chart_data(page)
    assert drawn_series(data, run.public_id)["loss"]["step"] == [1, 2, 3, 4, 5]
    assert "other answer" in page and page.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 1  # one prompt row
    csv_text = client.get(f"/p/alpha/runs/compare/metrics.csv?runs={run.public_id}&runs={other.public_id}").content.decode()
    assert csv_text.splitlines()[0] == "run_id,run_name,step,metric,value,tokens,wall_time"
    assert len(csv_text.splitlines()) == 1 + 5 + 1
    one = client.get(f"/p/alpha/runs/compare/?runs={run.public_id}")
    assert one.status_code == 302


def test_the_run_page_shows_the_workers_devices(team, run, client_for):
    from django.utils import timezone

    from webapp.workers.models import Worker

    now = timezone.now()
    Worker.objects.create(name="train@gpu", host="gpu", pid=1, started_at=now, last_seen=now,
                          devices={"platform": "gpu", "count": 8, "kinds": ["NVIDIA H200"], "memory_bytes": 150 * 2**30})
    Run.objects.filter(pk=run.pk).update(worker_name="train@gpu")
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert '<dd id="devices">8 × NVIDIA H200, 150.0\xa0GB each</dd>' in page


def test_the_run_page_downloads_each_export_as_a_tar(team, run, client_for, tmp_path):
    run = succeeded_with_export(run)
    export = run.output_dir / "export"
    (export / "config.json").write_text('{"model_type": "llama"}')
    (export / "quantized").mkdir()  # the chat's serving copy stays on the server
    (export / "quantized" / "model.safetensors").write_bytes(b"int8 codes")
    (export / "adapter").mkdir()
    (export / "adapter" / "adapter_config.json").write_text("{}")
    checkpoint = run.output_dir / "export-step-3"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (run.output_dir / "checkpoints" / "3").mkdir(parents=True)  # the training checkpoint it was exported from
    for kind, step, path in ((ArtifactKind.MODEL, 5, export), (ArtifactKind.ADAPTER, 5, export / "adapter"),
                             (ArtifactKind.CHECKPOINT, 3, checkpoint)):
        Artifact.objects.create(run=run, kind=kind, step=step, path=str(path))
    viewer = client_for(team.viewer)
    page = viewer.get(url(run)).content.decode()
    links = re.findall(r'<a class="download" href="([^"]+)" download>Download \(tar\)</a>', page)
    # The checkpoints list (which the page reads again when an export ends) offers the export's download too.
    partial = viewer.get(url(run, "checkpoints/")).content.decode()
    assert re.findall(r'<a class="download" href="([^"]+)" download>', partial) == [url(run, "artifacts/checkpoint/?step=3")]
    links = list(dict.fromkeys(links))  # the lineage and the checkpoints list both link the checkpoint
    model_link, adapter_link, checkpoint_link = (url(run, "artifacts/model/"), url(run, "artifacts/adapter/"),
                                                 url(run, "artifacts/checkpoint/?step=3"))
    assert sorted(links) == sorted([model_link, adapter_link, checkpoint_link])
    links = [model_link, adapter_link, checkpoint_link]

    def names_in(response):
        with tarfile.open(fileobj=io.BytesIO(b"".join(response))) as archive:
            return archive.getnames()

    response = viewer.get(links[0])
    assert response.status_code == 200 and response["Content-Disposition"] == (
        f'attachment; filename="{run.public_id}-model.tar"')
    assert response.is_async  # sent as read under uvicorn, not first gathered whole (test_artifacts.py)
    # The merged model only: the LoRA adapter the engine writes inside it was in the tar, yet has its own download.
    assert names_in(response) == ["export/config.json"]
    assert names_in(viewer.get(links[1])) == ["adapter/adapter_config.json"]
    response = viewer.get(links[2])
    assert response["Content-Disposition"].endswith(f'"{run.public_id}-checkpoint-step-3.tar"')
    assert names_in(response) == ["export-step-3/config.json"]
    # A step nobody exported, a kind the run has not, a directory gone from disk: 404s that say which.
    assert viewer.get(url(run, "artifacts/checkpoint/?step=4")).status_code == 404
    assert viewer.get(url(run, "artifacts/checkpoint/")).status_code == 404
    shutil.rmtree(checkpoint)
    assert viewer.get(links[2]).status_code == 404
    # A path recorded outside the data root is never served.
    Artifact.objects.filter(run=run, kind=ArtifactKind.ADAPTER).update(path=str(tmp_path))
    assert viewer.get(links[1]).status_code == 404
    assert client_for(team.outsider).get(links[0]).status_code == 404


def test_checkpoints_are_listed_with_an_export_button(team, run, client_for, sent_tasks):
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    (run.output_dir / "checkpoints" / "3").mkdir(parents=True)
    client = client_for(team.teammate)
    page = client.get(url(run)).content.decode()
    assert '<li data-step="3" data-state="">step 3' in page and "Export as a starting model" in page
    assert "Export as a starting model" not in client_for(team.viewer).get(url(run)).content.decode()
    assert client.post(url(run, "export/"), {"step": "3"}).status_code == 302
    assert client_for(team.viewer).post(url(run, "export/"), {"step": "3"}).status_code == 403
    assert client_for(team.outsider).post(url(run, "export/"), {"step": "3"}).status_code == 404


def test_the_final_steps_checkpoint_is_shown_once_as_the_final_model(team, run, client_for, sent_tasks):
    """A succeeded run's last checkpoint holds its final model, exported when the run succeeded and listed in its
    lineage, yet the checkpoints offered to export it again: the same model twice, once as run_…@6 and once as
    run_…. It is shown as the final model, with no export button, and an export asked for all the same is refused
    saying what to start runs from; an earlier checkpoint is offered as before."""
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=6)
    for step in (3, 6):
        (run.output_dir / "checkpoints" / str(step)).mkdir(parents=True)
    (run.output_dir / "export").mkdir()  # an export deleted since is no final model any more: its step is exported
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=6, path=str(run.output_dir / "export"))
    client = client_for(team.teammate)
    partial = client.get(url(run, "checkpoints/")).content.decode()
    items = {step: partial.split(f'<li data-step="{step}"')[1].split("</li>")[0] for step in (3, 6)}
    assert "Export as a starting model" in items[3]
    assert "Export as a starting model" not in items[6] and f'action="{url(run, "export/")}"' not in items[6]
    assert "final model" in items[6] and f"start runs from <code>{run.public_id}</code>" in items[6]
    assert partial.count(f'action="{url(run, "export/")}"') == 1
    response = client.post(url(run, "export/"), {"step": "6"}, follow=True)
    assert (f"checkpoint 6 of {run.public_id} is the run&#x27;s final model, exported when it succeeded: start runs "
            f"from {run.public_id}") in response.content.decode()
    assert not CheckpointExport.objects.filter(run=run).exists()
    # Resumed since (no longer succeeded), its earlier final model is not offered: that checkpoint may be exported.
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)
    assert "Export as a starting model" in client.get(url(run, "checkpoints/")).content.decode().split(
        '<li data-step="6"')[1]
    assert client.post(url(run, "export/"), {"step": "6"}).status_code == 302
    assert CheckpointExport.objects.filter(run=run, step=6).exists()


def test_each_checkpoint_offers_a_run_from_it_exporting_it_first_where_it_is_not_exported(
        team, run, client_for, sent_tasks, monkeypatch):
    """First-use pass: only the succeeded run's final model had *Launch a run from it*; to go on from a checkpoint
    a user exported it, then found it among every model of the launch form. An exported checkpoint and the final
    model link the launch form with them chosen; a checkpoint not exported has the action as a button that exports
    it first (the launch resolves run_…@N to its export) and comes back with ?launch=N, for the page to open the
    form once the export is done. For members, of runs whose models write text and are not archived."""
    monkeypatch.setattr("webapp.runs.reporting.publish_event", lambda public_id, event: None)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=9)
    run.refresh_from_db()
    for step in (3, 6, 9):
        (run.output_dir / "checkpoints" / str(step)).mkdir(parents=True)
    (run.output_dir / "export").mkdir()
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=9, path=str(run.output_dir / "export"))
    (run.output_dir / "export-step-3").mkdir()
    services.checkpoint_export_request(run=run, step=3, user=team.teammate)
    services.checkpoint_export_finish(run=run, step=3, export_dir=run.output_dir / "export-step-3")
    client = client_for(team.teammate)

    def items(client):
        partial = client.get(url(run, "checkpoints/")).content.decode()
        return {step: partial.split(f'<li data-step="{step}"')[1].split("</li>")[0] for step in (3, 6, 9)}

    shown = items(client)
    assert f'<a class="launch-from-checkpoint" href="/p/alpha/runs/new/?model={run.public_id}@3&amp;task=sft">Launch a run from it</a>' in shown[3]
    assert f'<a class="launch-from-checkpoint" href="/p/alpha/runs/new/?model={run.public_id}&amp;task=sft">Launch a run from it</a>' in shown[9]
    assert '<button type="submit" name="then" value="launch">Launch a run from it</button>' in shown[6]
    assert "exports it first" in shown[6]
    form = client.get(f"/p/alpha/runs/new/?model={run.public_id}@3").content.decode()
    assert f'<option value="{run.public_id}@3" selected>' in form

    # The button exports checkpoint 6 and brings the page back with ?launch=6.
    response = client.post(url(run, "export/"), {"step": "6", "then": "launch"})
    assert response.status_code == 302 and response["Location"] == url(run) + "?launch=6"
    assert CheckpointExport.objects.get(run=run, step=6).status == "exporting"
    assert "Exporting checkpoint 6 first: a run starts from an exported checkpoint" in client.get(url(run)).content.decode()
    # From a page shown before: one exported since (or the final model) opens the form at once; one being exported is
    # waited for, not refused as being exported.
    assert client.post(url(run, "export/"), {"step": "3", "then": "launch"})["Location"] == (
        f"/p/alpha/runs/new/?model={run.public_id}%403&task=sft")
    assert client.post(url(run, "export/"), {"step": "9", "then": "launch"})["Location"] == (
        f"/p/alpha/runs/new/?model={run.public_id}&task=sft")
    assert client.post(url(run, "export/"), {"step": "6", "then": "launch"})["Location"] == url(run) + "?launch=6"
    assert "Checkpoint 6 is being exported already" in client.get(url(run)).content.decode()
    response = client.post(url(run, "export/"), {"step": "6"}, follow=True)  # plain Export: refused, as before
    assert "is being exported; it is listed on the run&#x27;s page once it is done" in response.content.decode()

    # Viewers launch nothing; an archived run's models are not offered by the form; a reward model scores text.
    assert "Launch a run from it" not in client_for(team.viewer).get(url(run, "checkpoints/")).content.decode()
    Run.objects.filter(pk=run.pk).update(archived=True)
    assert "Launch a run from it" not in client.get(url(run, "checkpoints/")).content.decode()
    Run.objects.filter(pk=run.pk).update(archived=False, task="reward")
    assert "Launch a run from it" not in client.get(url(run, "checkpoints/")).content.decode()


def test_each_checkpoint_shows_the_eval_loss_to_choose_it_by_and_the_best_is_marked(team, run, client_for):
    """The checkpoints list gave steps only, nothing to choose one by: each now shows the run's ranking metric
    (eval loss for sft) as last evaluated at or before it, and the one the trainer keeps as best is marked."""
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    for step in (100, 200, 300, 400):
        (run.output_dir / "checkpoints" / str(step)).mkdir(parents=True)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="eval/loss", value=value, wall_time=step)
                                     for step, value in ((100, 2.5), (250, 1.25), (300, 1.75), (400, 2.0))])
    partial = client_for(team.viewer).get(url(run, "checkpoints/")).content.decode()
    items = {step: partial.split(f'<li data-step="{step}"')[1].split("</li>")[0] for step in (100, 200, 300, 400)}
    assert "eval/loss 2.5<" in items[100] and "(at step" not in items[100]
    assert "eval/loss 2.5 " in items[200] and "(at step 100)" in items[200]
    assert "eval/loss 1.75<" in items[300] and "best" in items[300]  # 250's 1.25 was no checkpoint's own
    assert "eval/loss 2<" in items[400]
    assert [step for step, item in items.items() if "badge-ok\">best" in item] == [300]


def test_each_checkpoint_says_when_it_was_saved_and_its_size_on_disk(team, run, client_for, sent_tasks, monkeypatch):
    """First-use pass: the checkpoints list gave a step, its score and its export, nothing of how big it is (a
    checkpoint holds the optimizer's state too: several times the model) or when it was saved. Each says both; an
    export says its download's size; one whose training checkpoint a resume deleted says so, and when it was exported.
    A running run's checkpoints say when they can be exported."""
    monkeypatch.setattr("webapp.runs.reporting.publish_event", lambda public_id, event: None)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    run.refresh_from_db()
    saved_at = datetime.datetime(2026, 12, 5, 14, 5, tzinfo=datetime.timezone.utc).timestamp()
    for step, sizes in ((100, (1000, 536)), (200, (3 * 2**20,))):
        directory = run.output_dir / "checkpoints" / str(step) / "state"
        directory.mkdir(parents=True)
        for index, size in enumerate(sizes):
            (directory / f"part-{index}").write_bytes(b"\0" * size)
            os.utime(directory / f"part-{index}", (saved_at + step, saved_at + step))
    (run.output_dir / "export-step-3").mkdir()
    (run.output_dir / "export-step-3" / "model.safetensors").write_bytes(b"\0" * 2048)
    (run.output_dir / "checkpoints" / "3").mkdir()
    services.checkpoint_export_request(run=run, step=3, user=team.teammate)
    services.checkpoint_export_finish(run=run, step=3, export_dir=run.output_dir / "export-step-3")
    (run.output_dir / "checkpoints" / "3").rmdir()  # a resume rotated it out; its export stays
    partial = client_for(team.viewer).get(url(run, "checkpoints/")).content.decode()
    items = {step: partial.split(f'<li data-step="{step}"')[1].split("</li>")[0] for step in (3, 100, 200)}
    # The disk each takes, as du and the Storage page count it, not its files' lengths (1.5 KB and 3.0 MB).
    on_disk = {step: filesizeformat(du_bytes(run.output_dir / "checkpoints" / str(step))) for step in (100, 200)}
    assert f"saved 2026-12-05 14:06 UTC, {on_disk[100]} on disk" in items[100] and on_disk[100] != "1.5\xa0KB"
    assert f"saved 2026-12-05 14:08 UTC, {on_disk[200]} on disk" in items[200]
    exported_at = when(Artifact.objects.get(run=run, kind=ArtifactKind.CHECKPOINT).created_at)
    assert f"exported {exported_at}; its training checkpoint was deleted since" in items[3]
    assert "Download (tar, 2.0\xa0KB)" in items[3]
    # A running run's checkpoint offered nothing, and nothing said why: it is exported once the run has ended.
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    running = client_for(team.teammate).get(url(run, "checkpoints/")).content.decode().split('<li data-step="100"')[1]
    assert "wait for the run to end (or cancel it)" in running.split("</li>")[0] and "<form" not in running.split("</li>")[0]


def test_checkpoints_show_each_exports_state_on_the_page_its_partial_and_the_state_endpoint(
        team, run, client_for, sent_tasks, monkeypatch):
    """What the run page needs to follow an export to its end without a reload: the partial it loads
    again, and the states it compares with what it shows."""
    monkeypatch.setattr("webapp.runs.reporting.publish_event", lambda public_id, event: None)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    run.refresh_from_db()
    for step in (3, 6, 9):
        (run.output_dir / "checkpoints" / str(step)).mkdir(parents=True)
    (run.output_dir / "export-step-9").mkdir()
    for step in (3, 6, 9):
        services.checkpoint_export_request(run=run, step=step, user=team.teammate)
    services.checkpoint_export_finish(run=run, step=6, error=ValueError("<b>no</b> weights for layer 2"))
    services.checkpoint_export_finish(run=run, step=9, export_dir=run.output_dir / "export-step-9")

    state = client_for(team.viewer).get(url(run, "state.json")).json()
    assert state["checkpoints"] == {"3": "exporting", "6": "failed", "9": "exported"}
    partial = client_for(team.teammate).get(url(run, "checkpoints/")).content.decode()
    assert '<li data-step="3" data-state="exporting">' in partial and "exporting…" in partial
    assert '<li data-step="6" data-state="failed">' in partial and "export failed" in partial
    assert "ValueError: &lt;b&gt;no&lt;/b&gt; weights for layer 2" in partial and "<b>no</b>" not in partial
    assert "Export again" in partial
    assert '<li data-step="9" data-state="exported">' in partial and f"{run.public_id}@9" in partial
    # Neither the running nor the exported one is offered again; the exported one offers its serving copy.
    assert partial.count(f'action="{url(run, "export/")}"') == 1
    assert partial.count(f'action="{url(run, "checkpoints/serving-copy/")}"') == 1 and "Make serving copy" in partial
    page = client_for(team.teammate).get(url(run)).content.decode()  # the page renders the same partial
    assert '<li data-step="3" data-state="exporting">' in page and "ValueError: &lt;b&gt;no&lt;/b&gt;" in page
    assert "<form" not in client_for(team.viewer).get(url(run, "checkpoints/")).content.decode()
    assert client_for(team.outsider).get(url(run, "checkpoints/")).status_code == 404


def test_an_exported_checkpoint_stays_listed_after_a_resume_deletes_its_training_checkpoint(
        team, run, client_for, sent_tasks, monkeypatch):
    """QA: a resumed run keeps its last checkpoints only (train.keep_last), and an exported one went from the
    page with its serving copy card (the chat and specs still use it; its copy could not be made again)."""
    monkeypatch.setattr("webapp.runs.reporting.publish_event", lambda public_id, event: None)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    run.refresh_from_db()
    (run.output_dir / "checkpoints" / "3").mkdir(parents=True)
    (run.output_dir / "export-step-3").mkdir()
    services.checkpoint_export_request(run=run, step=3, user=team.teammate)
    services.checkpoint_export_finish(run=run, step=3, export_dir=run.output_dir / "export-step-3")
    (run.output_dir / "checkpoints" / "3").rmdir()  # the resumed run saved later ones in its place
    (run.output_dir / "checkpoints" / "250").mkdir()
    partial = client_for(team.teammate).get(url(run, "checkpoints/")).content.decode()
    assert '<li data-step="3" data-state="exported">' in partial and f"{run.public_id}@3" in partial
    assert "Make serving copy" in partial and '<li data-step="250" data-state="">' in partial
    assert partial.count(f'action="{url(run, "export/")}"') == 1  # step 250 only: 3 has no checkpoint to export
    assert client_for(team.viewer).get(url(run, "state.json")).json()["checkpoints"] == {"3": "exported", "250": ""}


def _grpo_form(catalog, **fields) -> dict:
    data = {"mode": "form", "task": "grpo", "model": catalog.base_model.public_id,
            "data.train": catalog.prompts.public_id, "train.max_steps": "5", "train.batch_size": "2",
            "grpo.num_generations": "2", "grpo.max_new_tokens": "8", "peft.targets": ["q_proj", "v_proj"]}
    data.update(fields)
    return data


def test_the_grpo_form_offers_the_reward_registry(team, catalog, client_for):
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=grpo").content.decode()
    # The preset's exact_match row, and a blank row to copy with every registered function.
    assert 'name="grpo.rewards.0.name"' in page and '<option value="exact_match" selected>' in page
    assert 'name="grpo.rewards.__row__.args.format_regex.pattern"' in page
    assert 'name="grpo.eval_metrics.__row__.name"' in page
    assert 'name="grpo.beta"' in page and "KL coefficient" in page
    # An eval metric is scored alone: its row offers no weight, which would change nothing (QA: it did).
    assert 'name="grpo.rewards.__row__.weight"' in page and 'name="grpo.eval_metrics.__row__.weight"' not in page


def test_launching_grpo_from_the_form_with_two_reward_functions(team, catalog, client_for, sent_tasks):
    data = _grpo_form(catalog, **{
        "grpo.rewards.0.name": "exact_match", "grpo.rewards.0.weight": "1",
        "grpo.rewards.0.args.exact_match.extract": "last_number",
        # Another function's inputs in the same row are not read.
        "grpo.rewards.0.args.format_regex.pattern": "ignored",
        "grpo.rewards.3.name": "format_regex", "grpo.rewards.3.weight": "0.5",
        "grpo.rewards.3.args.format_regex.pattern": r"^\d+$", "grpo.rewards.3.args.format_regex.full_match": "true",
        "grpo.rewards.4.name": "",  # a blank row added and left empty
        "grpo.eval_metrics.0.name": "contains", "grpo.eval_metrics.0.args.contains.keywords": "four\n4\n",
        "data.eval": catalog.prompts.public_id,  # which the eval metrics score
    })
    response = client_for(team.teammate).post("/p/alpha/runs/new/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    run = Run.objects.get(task="grpo")
    assert run.spec["grpo"]["rewards"] == [
        {"name": "exact_match", "weight": 1.0, "args": {"extract": "last_number"}},
        {"name": "format_regex", "weight": 0.5, "args": {"pattern": r"^\d+$", "full_match": True}}]
    assert run.spec["grpo"]["eval_metrics"] == [{"name": "contains", "weight": 1.0, "args": {"keywords": ["four", "4"]}}]
    assert run.status == RunStatus.QUEUED


def test_the_grpo_form_names_each_wrong_row_and_argument(team, catalog, client_for, sent_tasks):
    data = _grpo_form(catalog, **{
        "grpo.rewards.0.name": "length_penalty", "grpo.rewards.0.args.length_penalty.max_length": "long",
        "grpo.rewards.1.name": "format_regex", "grpo.rewards.1.weight": "heavy",
        "grpo.rewards.2.name": "format_regex",  # twice, and without its required pattern
        "grpo.beta": "-1",
    })
    response = client_for(team.teammate).post("/p/alpha/runs/new/", data)
    assert response.status_code == 400 and not Run.objects.exists()
    errors = response.context["errors"]
    assert errors["grpo.rewards.0.args.max_length"] == ["'long' is not a whole number"]
    assert errors["grpo.rewards.1.weight"] == ["'heavy' is not a number"]
    assert "grpo.beta" in errors  # the spec's own check still runs on the rest
    page = response.content.decode()
    assert "&#x27;long&#x27; is not a whole number" in page
    assert 'value="long"' in page  # what was typed is shown again, in its row
    # Fixed, the same rows reach the spec check: the missing pattern is named by row.
    data.update({"grpo.rewards.0.args.length_penalty.max_length": "40", "grpo.rewards.1.weight": "1",
                 "grpo.beta": "0.04"})
    errors = client_for(team.teammate).post("/p/alpha/runs/new/", data).context["errors"]
    assert errors["grpo.rewards.1.args.pattern"] == ["format_regex: required argument missing: pattern (a text)"]


def test_a_launch_whose_warmup_outlasts_the_run_says_so_on_the_run_page(team, catalog, client_for, sent_tasks):
    text = (f"task: sft\nmodel: {catalog.base_model.public_id}\ndata: {{train: {catalog.sft.public_id}}}\n"
            "optim: {warmup_steps: 10}\ntrain: {max_steps: 5}\n")
    response = client_for(team.teammate).post("/p/alpha/runs/new/", {"mode": "yaml", "spec_yaml": text}, follow=True)
    assert response.status_code == 200 and Run.objects.get().status == RunStatus.QUEUED
    page = response.content.decode()
    assert ('<li class="message message-warning">optim.warmup_steps: 10 is not below the run&#x27;s 5 optimizer '
            "steps (train.max_steps), so the learning rate never reaches optim.learning_rate 0.0001") in page


def test_a_launch_warning_temper_can_act_on_links_there_in_its_message_and_the_runs_log(team, catalog, client_for,
                                                                                       sent_tasks):
    """As the launch page's live check does (``core.warnings.ActionWarning``): the warning's text and its link both
    escaped, the link the app's own page that removes the shared rows."""
    sharing = make_ready_version(team.project, name="<b>held</b>", rows=[{"prompt": "q3", "completion": "answer 3"}])
    response = client_for(team.teammate).post("/p/alpha/runs/new/", _layout_form(
        catalog, **{"data.eval": sharing.public_id}), follow=True)
    assert response.status_code == 200 and Run.objects.get().status == RunStatus.QUEUED
    page = response.content.decode()
    action = (f'<a class="warning-action" href="/p/alpha/datasets/{catalog.sft.dataset.public_id}/v/1/?derive='
              f'decontaminate&amp;against={sharing.public_id}#remove-shared">Remove them from chats v1</a>')
    said = f"data.eval: {isolated('&lt;b&gt;held&lt;/b&gt; v1')} shares 1 row of its 1 with data.train"
    message = page[page.index('<li class="message message-warning">'):]
    assert message.startswith(f'<li class="message message-warning">{said}') and action in message.split("</li>")[0]
    logged = page[page.index('<ol class="log" id="log">'):].split("</ol>")[0]
    assert said in logged and action in logged
    assert "<b>held</b>" not in page


def test_the_grpo_form_names_eval_metrics_without_eval_data_at_their_list(team, catalog, client_for, sent_tasks):
    data = _grpo_form(catalog, **{"grpo.rewards.0.name": "exact_match", "grpo.eval_metrics.0.name": "valid_json"})
    response = client_for(team.teammate).post("/p/alpha/runs/new/", data)
    assert response.status_code == 400 and not Run.objects.exists() and not sent_tasks.calls
    message = ("['valid_json'] are scored on data.eval only, and data.eval is not set, so they would never be "
               "scored; add data.eval (held-out prompts) or remove grpo.eval_metrics")
    assert response.context["errors"]["grpo.eval_metrics"] == [message]
    page = response.content.decode()
    assert page.index(message.replace("'", "&#x27;"), page.index('data-key="grpo.eval_metrics"')) > 0


def test_an_argument_a_reward_function_rejects_is_named_at_its_input(team, catalog, client_for, sent_tasks):
    data = _grpo_form(catalog, **{
        "grpo.rewards.0.name": "length_penalty", "grpo.rewards.0.args.length_penalty.max_length": "0",
        "grpo.rewards.1.name": "format_regex", "grpo.rewards.1.args.format_regex.pattern": "(",
    })
    response = client_for(team.teammate).post("/p/alpha/runs/new/", data)
    assert response.status_code == 400 and not Run.objects.exists() and not sent_tasks.calls
    errors = response.context["errors"]
    assert errors["grpo.rewards.0.args.max_length"] == ["length_penalty: max_length must be positive, got 0"]
    assert errors["grpo.rewards.1.args.pattern"] == [
        "format_regex: pattern '(' is not a regular expression (missing ), unterminated subpattern at position 0)"]
    page = response.content.decode()
    # In the row, under the argument's own input (not only in the list at the top).
    max_length_input = page.index('name="grpo.rewards.0.args.length_penalty.max_length"')
    assert page.index("max_length must be positive, got 0", max_length_input) < page.index(
        'name="grpo.rewards.1.name"')


def test_the_samples_browser_shows_a_steps_rollouts_with_rewards_per_function_in_pages(team, run, client_for,
                                                                                       monkeypatch):
    monkeypatch.setattr("webapp.runs.views.SAMPLES_PER_PAGE", 2)
    Sample.objects.bulk_create([
        Sample(run=run, step=3, position=index, prompt="<b>sum</b>", text=f"rollout {index}", reward=index / 2,
               rewards={"exact_match": float(index % 2), "format_regex": 0.25}, extra={"kind": "rollout",
                                                                                      "advantage": index - 1.5})
        for index in range(4)])
    client = client_for(team.viewer)
    page = client.get(url(run, "samples/?step=3&kind=rollout")).content.decode()
    assert "rollout 0" in page and "rollout 1" in page and "rollout 2" not in page
    assert "exact_match 1.000" in page and "format_regex 0.250" in page and "<th class=\"num\">Advantage</th>" in page
    assert "-0.500" in page and "page 1 of 2 (4 samples)" in page and 'data-page="2"' in page
    assert "&lt;b&gt;sum&lt;/b&gt;" in page and "<b>sum</b>" not in page
    second = client.get(url(run, "samples/?step=3&kind=rollout&page=2&order=reward")).content.decode()
    assert second.index("rollout 1") < second.index("rollout 0") and "rollout 3" not in second
    # A click on a chart at step 4 opens the nearest step with rollouts, filtered by reward.
    near = client.get(url(run, "samples/?step=4&kind=rollout&min_reward=1")).content.decode()
    assert '<option value="3" selected>' in near and "rollout 2" in near and "rollout 0" not in near
    assert client_for(team.outsider).get(url(run, "samples/?step=3")).status_code == 404
    # A PPO rollout also carries its summed KL to the reference.
    Sample.objects.create(run=run, step=6, position=0, prompt="p", text="ppo rollout", reward=0.5,
                          rewards={"reward_model": 0.5}, extra={"kind": "rollout", "advantage": 0.25, "kl": 0.0625})
    ppo = client.get(url(run, "samples/?step=6&kind=rollout")).content.decode()
    assert "reward_model 0.500" in ppo and "0.250" in ppo and "kl 0.063" in ppo


@pytest.mark.parametrize(("query", "problem"), [
    ("min_reward=abc", "Reward from <bdi>abc</bdi> is not a number; the samples are shown without it."),
    ("min_reward=0.5&max_reward=%3Cb%3E", "Reward to <bdi>&lt;b&gt;</bdi> is not a number; the samples are shown "
                                          "without it."),
    ("min_reward=2&max_reward=1", "No reward is from 2 to 1: give the lower bound first."),
])
def test_the_samples_browser_says_when_its_reward_range_cannot_be_used(team, run, client_for, query, problem):
    """A reward bound that is not a number was left out without a word, the samples shown as if it had
    not been typed (and kept in its box); a range whose ends were swapped showed 'No samples match.'."""
    Sample.objects.bulk_create([Sample(run=run, step=3, position=index, prompt="p", text=f"rollout {index}",
                                       reward=index / 2) for index in range(4)])
    page = client_for(team.viewer).get(url(run, f"samples/?step=3&{query}")).content.decode()
    assert f'<p class="error reward-range-problem" role="alert">{problem}</p>' in page


def test_the_samples_browser_says_nothing_of_a_usable_reward_range(team, run, client_for):
    Sample.objects.create(run=run, step=3, position=0, prompt="p", text="rollout", reward=0.5)
    page = client_for(team.viewer).get(url(run, "samples/?step=3&min_reward=0.25&max_reward=0.5")).content.decode()
    assert "reward-range-problem" not in page and "rollout" in page


def test_the_samples_browser_shows_a_rollouts_reference_answer(team, run, client_for):
    # Records as jaxengine.grpo writes them to samples.jsonl: the reference the reward read as "answer".
    records = [{"step": 2, "kind": "rollout", "prompt": "What is 49 + 97?", "text": "146", "answer": "146",
                "rewards": {"exact_match": 1.0}, "reward": 1.0, "advantage": 0.5, "finish_reason": "stop"},
               {"step": 2, "kind": "rollout", "prompt": "Say <b>", "text": "b", "answer": "<b>",
                "rewards": {"exact_match": 0.0}, "reward": 0.0, "advantage": -0.5, "finish_reason": "stop"}]
    Sample.objects.bulk_create([reporting.sample_row(run, 2, position, record) for position, record in enumerate(records)])
    page = client_for(team.viewer).get(url(run, "samples/?step=2&kind=rollout")).content.decode()
    assert '<td class="text muted">146</td>' in page
    assert '<td class="text muted">&lt;b&gt;</td>' in page and '<td class="text muted"><b></td>' not in page


def test_the_ppo_form_offers_reward_rows_and_its_knobs(team, catalog, client_for):
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=ppo").content.decode()
    assert 'name="ppo.rewards.0.name"' in page and '<option value="exact_match" selected>' in page
    assert 'name="ppo.rewards.__row__.args.contains.keywords"' in page
    for key in ("ppo.gamma", "ppo.lam", "ppo.value_clip", "ppo.vf_coef", "ppo.kl_coef", "ppo.reward_model"):
        assert f'name="{key}"' in page


def test_duplicating_a_grpo_run_fills_its_reward_rows(team, catalog, client_for, sent_tasks):
    spec = {"task": "grpo", "model": catalog.base_model.public_id, "data": {"train": catalog.prompts.public_id},
            "train": {"max_steps": 5}, "grpo": {"rewards": [
                {"name": "format_regex", "weight": 0.5, "args": {"pattern": "^<b>$", "full_match": True}},
                {"name": "contains", "args": {"keywords": ["four", "4"]}}]}}
    original = services.run_create(project=team.project, spec=spec, user=team.teammate)
    page = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={original.public_id}").content.decode()
    assert 'name="grpo.rewards.0.weight" value="0.5"' in page
    assert 'name="grpo.rewards.0.args.format_regex.pattern" value="^&lt;b&gt;$"' in page  # escaped
    assert '<option value="true" selected>true</option>' in page
    assert "four\n4</textarea>" in page


def test_launching_ppo_from_the_form_with_a_reward_run_of_the_project(team, catalog, client_for, sent_tasks, tmp_path):
    reward_run = services.run_create(project=team.project, user=team.teammate, spec={
        "task": "reward", "model": catalog.base_model.public_id, "data": {"train": catalog.preference.public_id},
        "train": {"max_steps": 5}})
    Run.objects.filter(pk=reward_run.pk).update(status=RunStatus.SUCCEEDED)
    Artifact.objects.create(run=reward_run, kind=ArtifactKind.MODEL, path=str(tmp_path))
    data = {"mode": "form", "task": "ppo", "model": catalog.base_model.public_id,
            "data.train": catalog.prompts.public_id, "train.max_steps": "5", "train.batch_size": "2",
            "peft.targets": ["q_proj", "v_proj"], "ppo.max_new_tokens": "8", "ppo.kl_coef": "0.1",
            "ppo.reward_model": reward_run.public_id}
    client = client_for(team.teammate)
    # The form's reward row and a reward model: the spec takes exactly one.
    both = client.post("/p/alpha/runs/new/", {**data, "ppo.rewards.0.name": "exact_match"}).content.decode()
    # QA: it said what was wrong but not what to do, which for a form's preset row is to remove it.
    assert ("give exactly one of reward_model and rewards (both given): remove the reward functions, "
            "or choose no reward model") in both
    response = client.post("/p/alpha/runs/new/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    run = Run.objects.get(task="ppo")
    assert run.spec["ppo"]["reward_model"] == reward_run.public_id and run.spec["ppo"]["rewards"] == []
    assert run.resolved_spec["ppo"]["reward_model"] == str(tmp_path) and run.spec["ppo"]["kl_coef"] == 0.1
    assert run.status == RunStatus.QUEUED


def reward_spec(catalog) -> dict:
    return {"task": "reward", "model": catalog.base_model.public_id, "data": {"train": catalog.preference.public_id},
            "train": {"max_steps": 2}}


def exported_reward_run(team, catalog, *, name: str, export=None, step: int = 0) -> Run:
    """A teammate's succeeded reward run whose model was exported to ``export`` (at ``step``; 0: its final model;
    by default its own ``export/``, made on disk as the run page looks for it)."""
    scorer = services.run_create(project=team.project, spec=reward_spec(catalog), user=team.teammate, name=name)
    Run.objects.filter(pk=scorer.pk).update(status=RunStatus.SUCCEEDED)
    if export is None:
        export = scorer.output_dir / "export"
        export.mkdir(parents=True)
    Artifact.objects.create(run=scorer, kind=ArtifactKind.MODEL, path=str(export), step=step)
    return scorer


def test_the_ppo_form_chooses_its_reward_model_among_the_projects_reward_runs(team, catalog, client_for, sent_tasks,
                                                                             tmp_path):
    scorer = exported_reward_run(team, catalog, name="scorer <i>", export=tmp_path / "export")
    unfinished = services.run_create(project=team.project, spec=reward_spec(catalog), user=team.teammate,
                                     name="still training")
    client = client_for(team.teammate)
    page = client.get("/p/alpha/runs/new/?task=ppo").content.decode()
    assert f'<option value="{scorer.public_id}" >{FSI}scorer &lt;i&gt;{PDI} — reward model of {scorer.public_id}</option>' in page
    assert f'value="{unfinished.public_id}"' not in page
    form = {"mode": "form", "task": "ppo", "model": catalog.base_model.public_id, "data.train": catalog.prompts.public_id,
            "train.max_steps": "4", "train.batch_size": "2", "peft.targets": ["q_proj"], "ppo.max_new_tokens": "8",
            "ppo.reward_model": scorer.public_id}
    assert client.post("/p/alpha/runs/new/", form).status_code == 302
    run = Run.objects.get(task="ppo")
    assert run.spec["ppo"]["reward_model"] == scorer.public_id and run.spec["ppo"]["rewards"] == []
    assert run.resolved_spec["ppo"]["reward_model"] == str(tmp_path / "export")


def test_the_runs_selection_reaches_compare_by_post_and_a_clean_address(team, run, client_for, catalog, sent_tasks):
    """The Runs page's checkbox form carries a CSRF token (it also archives); sent by GET, the token
    landed in the compare page's address, history and the server's logs. It posts, and compare
    answers with the address of the runs alone."""
    other = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="second")
    client = client_for(team.viewer)
    page = client.get("/p/alpha/runs/").content.decode()
    assert '<form method="post" action="/p/alpha/runs/compare/" id="runs-form">' in page
    response = client.post("/p/alpha/runs/compare/", {"runs": [run.public_id, other.public_id],
                                                      "csrfmiddlewaretoken": "anything"})
    assert response.status_code == 302
    assert response["Location"] == f"/p/alpha/runs/compare/?runs={run.public_id}&runs={other.public_id}"
    assert client.get(response["Location"]).status_code == 200
    assert client_for(team.outsider).post("/p/alpha/runs/compare/", {"runs": [run.public_id]}).status_code == 404


def test_the_yaml_view_shows_text_as_typed_not_escaped(team, catalog, client_for):
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=dpo").content.decode()
    assert "model: bm_…" in page and "\\u2026" not in page
    assert services.spec_to_yaml({"grpo": {"pattern": "−?\\d+ é"}}) == "grpo:\n  pattern: −?\\d+ é\n"


def test_dataset_choices_say_one_row_not_one_rows(team, client_for):
    from tests.webapp.factories import make_ready_version
    from webapp.runs import selectors

    version = make_ready_version(team.project, name="single", kind="sft")
    version.row_count = 1
    version.save(update_fields=["row_count"])
    assert selectors.dataset_choices(project=team.project, kinds=("sft",)) == [
        (version.public_id, f"{isolated('single')} v1 (sft, 1 row)")]


def test_compare_final_metrics_show_the_range_in_readable_figures(team, run, client_for, catalog, sent_tasks):
    """The table said 'last (best)' but 'best' was always the minimum (an exact match of 0.75 that fell to
    0.5 showed a best of 0.25), and four decimals showed a 2e-4 learning rate as 0.0000."""
    other = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="second")
    points = {"eval/exact_match": [0.25, 0.75, 0.5], "learning_rate": [0.0002, 0.0001, 0.00002], "tokens": [212, 424, 636]}
    for target in (run, other):
        MetricPoint.objects.bulk_create([MetricPoint(run=target, step=step, name=name, value=value, wall_time=float(step),
                                                     tokens=0)
                                         for name, values in points.items() for step, value in enumerate(values, 1)])
        target.final_metrics = reporting.metric_summary(target)
        target.save(update_fields=["final_metrics"])
    page = client_for(team.viewer).get(f"/p/alpha/runs/compare/?runs={run.public_id}&runs={other.public_id}").content.decode()
    table = page.split('class="table final-table"')[1].split("</table>")[0]
    assert "last (best)" not in table and table.count("last<br>min – max") == 4  # loss, eval/exact_match, learning_rate, tokens
    # (the runs' equal exact match is each one's best: a ★ before it)
    assert '<span class="visually-hidden">best: </span>0.5<br><small class="muted">0.25 – 0.75</small></td>' in table
    assert '<td class="num" data-value="2e-05">2e-05<br><small class="muted">2e-05 – 0.0002</small></td>' in table
    assert '<td class="num" data-value="636.0">636<br><small class="muted">212 – 636</small></td>' in table


def test_compare_final_metrics_put_a_quantity_two_kinds_log_under_their_own_names_in_one_column(
        team, run, client_for, catalog, sent_tasks):
    """The charts drew a reward model's accuracy and a DPO run's rewards/accuracies as one preference accuracy, but
    the final table gave each name a column of its own, each a dash in the other run's row."""
    from webapp.runs.models import Run

    dpo = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="second")
    logged = {run: {"accuracy": [0.5, 0.75], "margin": [0.1, 0.3]},
              dpo: {"rewards/accuracies": [0.25, 0.5], "rewards/margins": [0.2, 0.4]}}
    for target, task in ((run, "reward"), (dpo, "dpo")):
        Run.objects.filter(pk=target.pk).update(task=task)
        target.refresh_from_db()
        MetricPoint.objects.bulk_create([MetricPoint(run=target, step=step, name=name, value=value, wall_time=float(step),
                                                     tokens=0)
                                         for name, values in logged[target].items()
                                         for step, value in enumerate(values, 1)])
        target.final_metrics = reporting.metric_summary(target)
        target.save(update_fields=["final_metrics"])
    response = client_for(team.viewer).get(f"/p/alpha/runs/compare/?runs={run.public_id}&runs={dpo.public_id}")
    table = response.content.decode().split('class="table final-table"')[1].split("</table>")[0]
    assert ('<th class="num literal" data-sort="preference accuracy" data-best="highest"><button type="button" '
            'class="sort-final">preference accuracy</button><br><small class="muted">accuracy · rewards/accuracies<br>'
            'last<br>min – max</small></th>') in table
    assert table.count("</th>") == 4 and table.count("—") == 1  # Run, loss and the two shared; the second run's loss
    assert ('<td class="num best" data-value="0.75"><span aria-hidden="true">★ </span><span class="visually-hidden">best: '
            '</span>0.75<br><small class="muted">0.5 – 0.75</small></td>') in table
    assert '<td class="num" data-value="0.5">0.5<br><small class="muted">0.25 – 0.5</small></td>' in table
    assert [column["label"] for column in response.context["final"]["columns"]] == [
        "loss", "preference accuracy", "reward margin"]  # the run fixture's loss: the first run's alone


def test_the_launch_page_of_an_empty_project_says_where_models_and_data_come_from(team, client_for):
    """Training data said 'None yet: upload one' with a link; the empty Model list said nothing."""
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=sft").content.decode()
    assert 'None yet: <a href="/p/alpha/models/register/">register one</a>.' in page
    assert 'None yet: <a href="/p/alpha/datasets/new/">upload one</a>.' in page


def test_the_launch_page_says_nothing_of_registering_once_there_is_a_model(team, client_for, catalog):
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=sft").content.decode()
    assert "register one" not in page and "upload one" not in page


def test_compare_says_when_the_runs_have_no_metrics_or_the_same_config(team, client_for, catalog, sent_tasks):
    """Two queued runs of one config: the charts' card showed its controls over nothing, the final
    metrics a column of run names, and the config (differences only) a header over no rows."""
    runs = [services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name=name)
            for name in ("first", "second")]
    page = client_for(team.viewer).get(f"/p/alpha/runs/compare/?runs={runs[0].public_id}&runs={runs[1].public_id}"
                                       ).content.decode()
    assert '<p class="muted no-metrics" id="no-metrics">None of these runs has logged metrics yet.</p>' in page
    assert 'class="table final-table"' not in page
    assert ('<tr class="no-differences"><td colspan="3" class="muted">These runs have the same config: '
            'untick <i>differences only</i> to read it.</td></tr>') in page


def test_compare_names_the_runs_of_its_address_it_cannot_show(team, client_for, catalog, sent_tasks):
    """An id of the address that is no run of the project (mistyped, or of another project) was left out
    without a word: 'Compare 2 runs' for an address naming three."""
    runs = [services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name=name)
            for name in ("first", "second")]
    query = f"runs={runs[0].public_id}&runs=run_%3Cb%3Enope&runs={runs[1].public_id}"
    page = client_for(team.viewer).get(f"/p/alpha/runs/compare/?{query}").content.decode()
    assert ('<p class="card message-error missing-runs" role="alert">Not shown: <code>run_&lt;b&gt;nope</code> '
            "is not a run of this project.</p>") in page
    assert "<h1>Compare 2 runs</h1>" in page


def test_compare_shows_no_empty_state_when_runs_differ_and_have_metrics(team, run, client_for, catalog, sent_tasks):
    other = services.run_create(project=team.project, spec=sft_spec(catalog, optim={"learning_rate": 0.01}),
                                user=team.owner, name="second")
    run.final_metrics = reporting.metric_summary(run)
    run.save(update_fields=["final_metrics"])
    page = client_for(team.viewer).get(f"/p/alpha/runs/compare/?runs={run.public_id}&runs={other.public_id}"
                                       ).content.decode()
    assert 'id="no-metrics" hidden>' in page and "no-differences" not in page and 'class="table final-table"' in page


@pytest.mark.parametrize(("value", "shown"), [
    (None, "—"), (6336.0, "6336"), (5304.0729, "5304"), (9.47291, "9.473"), (0.0002, "0.0002"), (2e-05, "2e-05"),
    (0.0, "0"), (-1.23456, "-1.235"), (float("nan"), "nan")])
def test_metric_value(value, shown):
    from webapp.runs.templatetags.runs_tags import metric_value

    assert metric_value(value) == shown


def test_compare_headers_that_are_names_are_set_as_written(team, run, client_for, catalog, sent_tasks):
    """Run and metric names in the compare tables' headers keep their case (class literal, which undoes
    the headers' capitals: 'lr 1e-3' read 'LR 1E-3')."""
    other = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="lr 1e-3")
    Sample.objects.create(run=other, step=5, position=0, prompt="<script>alert(1)</script>", text="x")
    run.final_metrics = reporting.metric_summary(run)
    run.save(update_fields=["final_metrics"])
    page = client_for(team.viewer).get(f"/p/alpha/runs/compare/?runs={run.public_id}&runs={other.public_id}").content.decode()
    assert '<th class="num literal" data-sort="loss" data-best="lowest"><button type="button" class="sort-final">loss</button><br>' in page
    assert page.count('<th class="literal">lr 1e-3</th>') == 1  # config
    assert page.count('<th class="literal">lr 1e-3<br>') == 1  # generations


def test_the_runs_table_and_lineage_say_which_data_trains_and_which_evaluates(team, client_for, catalog, sent_tasks):
    """Both listed the run's dataset versions in the order they were uploaded, unlabelled: a held-out set
    uploaded first read as the first (training) dataset."""
    from tests.webapp.factories import make_ready_version

    held_out = make_ready_version(team.project, name="held-out", kind="sft")
    training = make_ready_version(team.project, name="train-set", kind="sft")
    run = services.run_create(project=team.project, user=team.teammate, name="r",
                              spec=sft_spec(catalog, data={"train": training.public_id, "eval": held_out.public_id}))
    client = client_for(team.viewer)
    table = client.get("/p/alpha/runs/").content.decode()
    assert ('<td class="name-cell"><div><bdi>train-set</bdi> v1</div><div><bdi>held-out</bdi> v1 <small class="muted">(eval)</small>'
            '</div></td>') in table
    lineage = client.get(url(run)).content.decode().split('<ol class="lineage">')[1].split("</ol>")[0]
    assert lineage.index("Training data <a") < lineage.index("train-set") < lineage.index("Evaluation data <a") \
        < lineage.index("held-out")
    assert lineage.count("data <a") == 2


def test_a_refused_edit_keeps_what_was_typed(team, run, client_for):
    """A blank name sent the page back with 'a run needs a name' at the top and the edit gone: the
    notes just written, and the tags, were lost. The form comes back open, as it was sent, the error
    at its field; nothing of it is saved."""
    notes = "## Result\n\nLoss fell to **1.08** <script>x()</script>"
    response = client_for(team.teammate).post(url(run, "edit/"), {"name": " ", "tags": "best, ünï", "notes": notes})
    assert response.status_code == 400
    page = response.content.decode()
    form = page.split('<details open><summary>Edit</summary>')[1].split("</details>")[0]
    assert f'action="{url(run, "edit/")}#edit-form" id="edit-form"' in form  # the answer opens at the form
    assert ('<input type="text" id="edit-name" name="name" value=" " maxlength="120" aria-invalid="true" '
            'aria-describedby="edit-name-error-1"><small class="error" id="edit-name-error-1">a run needs a name') in form
    assert 'value="best, ünï"' in form
    assert "Loss fell to **1.08** &lt;script&gt;x()&lt;/script&gt;</textarea>" in form
    run.refresh_from_db()
    assert run.name == "first <b>run</b>" and run.tags == [] and run.notes == ""
    response = client_for(team.teammate).post(url(run, "edit/"), {"name": "x", "tags": "y" * 41, "notes": notes})
    assert 'class="field has-error"><label for="edit-tags">' in response.content.decode()
    ok = client_for(team.teammate).post(url(run, "edit/"), {"name": "renamed", "tags": "best", "notes": notes})
    assert ok.status_code == 302 and ok["Location"] == url(run)
    run.refresh_from_db()
    assert (run.name, run.tags, run.notes) == ("renamed", ["best"], notes)
    assert "<details><summary>Edit</summary>" in client_for(team.teammate).get(url(run)).content.decode()
    assert client_for(team.viewer).post(url(run, "edit/"), {"name": "v"}).status_code == 403
    assert client_for(team.outsider).post(url(run, "edit/"), {"name": "v"}).status_code == 404


def test_archive_with_nothing_ticked_says_so(team, run, client_for):
    """It answered 'Archived 0 runs.' as a success."""
    client = client_for(team.teammate)
    response = client.post("/p/alpha/runs/archive/", {"archived": "1"}, follow=True)
    assert "tick the runs to archive first" in response.content.decode() and "Archived 0" not in response.content.decode()
    response = client.post("/p/alpha/runs/archive/", {"archived": "0"}, follow=True)
    assert response.redirect_chain[-1][0] == "/p/alpha/runs/?archived=1"
    assert "tick the runs to restore first" in response.content.decode()
    assert not Run.objects.filter(archived=True).exists()


def test_the_sort_select_says_what_each_order_is(team, run, client_for):
    """Its options were the query's keys: 'name' and '-name', 'steps' (most first?)."""
    page = client_for(team.viewer).get("/p/alpha/runs/?sort=-name").content.decode()
    select = page.split('<select name="sort"')[1].split("</select>")[0]
    assert '<option value="-name" selected>name Z–A</option>' in select
    assert '<option value="steps" >most steps first</option>' in select and select.count("<option") == 11
    assert '<option value="eval_loss" >lowest eval loss first</option>' in select



def finished_with_points(run: Run, points: dict[str, list[float]]) -> Run:
    """``run`` started, its ``points`` ({metric: values at steps 10, 20, ...}) stored as its worker stores them, and
    finished as its worker finishes it: final metrics and the sort menu's names from those points."""
    started = reporting.run_start(run_pk=run.pk, attempt=run.attempt, worker_name="train@test")
    reporting.insert_metric_rows([(run.pk, step, name, value, float(step), 0) for name, values in points.items()
                                  for step, value in zip(range(10, 10 * len(values) + 1, 10), values)])
    return reporting.run_finish(run=started, summary={"status": RunStatus.SUCCEEDED, "step": 10 * max(map(len, points.values()))})


def test_the_runs_table_reads_a_page_of_runs_however_many_the_project_has(team, catalog, client_for, sent_tasks):
    """A project of thousands of runs: each load of the table read every run's final metrics for its sort menu and
    every tagged run's tags for a search, so both grew with the project. The menus and the search read the
    project's own indexes (``ProjectMetricName``, ``RunTag``): the page makes as many queries for 70 runs as for 10,
    and no query of it reads those columns of more runs than the page shows."""
    template = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="template")
    client = client_for(team.viewer)
    table = {"q": "sweep", "sort": "-metric:loss"}

    def add_runs(count: int) -> None:
        start = Run.objects.count()
        runs = Run.objects.bulk_create(
            Run(project=team.project, name=f"run {index}", task="sft", spec=template.spec,
                resolved_spec=template.resolved_spec, status=RunStatus.SUCCEEDED,
                final_metrics={"loss": {"last": 1.0 / (index + 1), "min": 0.1, "max": 3.0, "step": 10}})
            for index in range(start, start + count))
        for index, run in enumerate(runs):
            services.run_tags_write(run=run, tags=[f"sweep-{index % 3}"])
        services.metric_names_note(project_id=team.project.pk, names=["loss"])

    def page_queries(*, rows: int) -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            page = client.get("/p/alpha/runs/", table).content.decode()
        assert '<option value="metric:loss" >' in page and page.count('class="badge tag"') == rows
        return [query["sql"] for query in captured.captured_queries]

    add_runs(10)
    few = page_queries(rows=10)
    add_runs(60)
    many = page_queries(rows=views.RUNS_PER_PAGE)
    assert len(many) == len(few)
    wide = [sql for sql in many if re.search(r'"runs_run"\."(final_metrics|tags)"', sql)
            and "LIMIT" not in sql and not sql.startswith("SELECT COUNT(")]
    assert wide == []


def test_the_runs_table_sorts_by_any_final_metric_and_shows_its_column(team, catalog, client_for, sent_tasks):
    """QA (a W&B user on a sweep): the table sorted by loss, eval loss and reward only, and showed no other metric,
    so the sweep's best run by eval/exact_match (an SFT run's score) took opening every run. The sort offers every
    final metric the project's runs logged, both ways, and a sort by one adds its column."""
    logged = {"low": {"eval/exact_match": [0.0, 0.5, 0.25]}, "high": {"eval/exact_match": [0.0, 0.5, 0.75]},
              "none": {"loss": [2.0, 1.5, 1.0]}}
    for name, points in logged.items():
        run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name=name)
        finished_with_points(run, points)
    client = client_for(team.viewer)

    def table(sort: str) -> tuple[list[str], str]:
        page = client.get("/p/alpha/runs/", {"sort": sort}).content.decode()
        assert "Ignored" not in page
        rows = page.split('<tbody>')[1].split('</tbody>')[0]
        return re.findall(r'/">(low|high|none)</a>', rows), page

    order, page = table("-metric:eval/exact_match")
    assert order == ["high", "low", "none"]  # runs without it last
    select = page.split('<select name="sort"')[1].split("</select>")[0]
    assert '<option value="-metric:eval/exact_match" selected>eval/exact_match: highest first</option>' in select
    assert '<option value="metric:loss" >loss: lowest first</option>' in select
    head = page.split("<thead>")[1].split("</thead>")[0]
    assert '<th class="num literal">eval/exact_match<br><small class="muted">last<br>min – max</small></th>' in head
    assert "0.75<br><small class=\"muted\">0 – 0.75</small>" in page
    assert table("metric:eval/exact_match")[0] == ["low", "high", "none"]
    # The table's own columns are not shown twice; a sort by nothing (metric:) is ignored with a note.
    assert "loss<br><small" not in table("metric:loss")[1].split("<thead>")[1].split("</thead>")[0]
    ignored = client.get("/p/alpha/runs/", {"sort": "metric:"}).content.decode()
    assert "Ignored sort=&#x27;metric:&#x27;: not a sort order; use one of newest, " in ignored
    assert "or metric:&lt;final metric&gt;" in ignored


def test_the_table_s_pages_keep_its_filters_and_order(team, catalog, client_for, sent_tasks, monkeypatch):
    """The page links were '?page=N': the next page of a filtered table listed every run, newest first."""
    from webapp.runs import views

    monkeypatch.setattr(views, "RUNS_PER_PAGE", 1)
    for name in ("b-sweep", "a-sweep"):
        services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name=name, tags="sweep")
    outside = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="c-other")
    client = client_for(team.viewer)
    first = client.get("/p/alpha/runs/?tag=sweep&sort=name").content.decode()
    assert "Page 1 of 2 · 2 in all" in first and 'href="?tag=sweep&amp;sort=name&amp;page=2"' in first
    second = client.get("/p/alpha/runs/?tag=sweep&sort=name&page=2").content.decode()
    assert "b-sweep" in second and outside.public_id not in second
    assert 'href="?tag=sweep&amp;sort=name&amp;page=1"' in second


def test_the_task_filter_offers_external_runs_once_the_project_has_some(team, run, client_for):
    client = client_for(team.viewer)
    assert "<option >external</option>" not in client.get("/p/alpha/runs/").content.decode()
    logged = services.run_create_external(project=team.project, name="elsewhere", config={"lr": 0.1}, user=team.owner)
    assert "<option >external</option>" in client.get("/p/alpha/runs/").content.decode()
    page = client.get("/p/alpha/runs/?task=external").content.decode()
    assert "<option selected>external</option>" in page
    assert logged.public_id in page and run.public_id not in page


def test_compare_and_archive_come_back_to_the_table_as_it_was_left(team, run, client_for, catalog, sent_tasks):
    """Both went back to the whole table, newest first: a Compare with one run ticked lost the tick and the
    table's filters, an Archive from a tag's runs showed every run."""
    other = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="second", tags="sweep")
    client = client_for(team.teammate)
    table = client.get("/p/alpha/runs/?tag=sweep&sort=name").content.decode()
    assert '<input type="hidden" name="back" value="tag=sweep&amp;sort=name">' in table
    response = client.post("/p/alpha/runs/compare/", {"runs": [other.public_id], "back": "tag=sweep&sort=name"})
    assert response["Location"] == f"/p/alpha/runs/?tag=sweep&sort=name&runs={other.public_id}"
    page = client.get(response["Location"]).content.decode()
    assert "choose between 2 and 16 runs" in page
    assert f'value="{other.public_id}" aria-label="Select second" checked>' in page
    assert '<input type="hidden" name="back" value="tag=sweep&amp;sort=name">' in page  # the tick is not carried on
    both = client.post("/p/alpha/runs/compare/", {"runs": [run.public_id, other.public_id], "back": "tag=sweep"})
    assert both["Location"] == f"/p/alpha/runs/compare/?runs={run.public_id}&runs={other.public_id}"
    Run.objects.filter(pk=other.pk).update(status=RunStatus.FAILED)  # an active run is not archived
    archived = client.post("/p/alpha/runs/archive/", {"runs": [other.public_id], "archived": "1", "back": "tag=sweep"})
    assert archived["Location"] == "/p/alpha/runs/?tag=sweep"
    restored = client.post("/p/alpha/runs/archive/", {"runs": [other.public_id], "archived": "0",
                                                      "back": "archived=1&q=sec"})
    assert restored["Location"] == "/p/alpha/runs/?archived=1&q=sec"


def test_a_lost_and_requeued_runs_page_says_why_until_its_next_attempt_starts(team, run, client_for):
    """QA: a run whose worker was killed went from "running" to "queued" with no word on its page."""
    from datetime import timedelta

    from django.utils import timezone

    from django.test import Client

    from webapp.api.services import token_create
    from webapp.runs.reporting import run_start

    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, worker_name="train@gone", current_step=5,
                                         last_heartbeat=timezone.now() - timedelta(seconds=61))
    services.runs_reap_lost()
    page = client_for(team.viewer).get(url(run)).content.decode()
    # Told as a notice, not in the failed card's place: the run has not failed.
    assert 'class="card run-message run-notice">attempt 1 was lost at step 5 on worker train@gone, last heard from at ' in page
    assert " UTC (silent for 6" in page
    assert " s); re-queued to start over from step 0, as it had saved no checkpoint</p>" in page
    run.refresh_from_db()
    secret = token_create(user=team.viewer, name="reader")[1]
    answer = Client(HTTP_AUTHORIZATION=f"Bearer {secret}").get(f"/api/v1/projects/alpha/runs/{run.public_id}/").json()
    assert (answer["status"], answer["error_message"], answer["notice"]) == ("queued", "", run.notice)
    run_start(run_pk=run.pk, attempt=2, worker_name="train@next")
    assert "was lost at step 5" not in client_for(team.viewer).get(url(run)).content.decode().split('id="log"')[0]


def test_archiving_an_active_run_is_refused_on_its_page_and_in_the_table(team, run, client_for):
    """A queued or running run could be archived, and went on training hidden under "archived"."""
    client = client_for(team.teammate)
    response = client.post("/p/alpha/runs/archive/", {"runs": run.public_id, "archived": "1", "from": "run"},
                           follow=True)
    assert response.redirect_chain[-1][0] == url(run)
    page = response.content.decode()
    assert "is queued: cancel it first, then archive it. Nothing was archived" in page and "Archived 1" not in page
    response = client.post("/p/alpha/runs/archive/", {"runs": [run.public_id], "archived": "1", "back": "q=first"},
                           follow=True)
    assert response.redirect_chain[-1][0] == "/p/alpha/runs/?q=first"
    assert "cancel it first, then archive it" in response.content.decode()
    assert not Run.objects.get(pk=run.pk).archived


def test_an_archived_runs_page_says_so_and_restores_it_in_place(team, run, client_for):
    """QA: an archived run's page looked like any other; it was found again only through the table's filter."""
    assert 'id="archived-note"' not in client_for(team.viewer).get(url(run)).content.decode()
    Run.objects.filter(pk=run.pk).update(archived=True)
    viewer_page = client_for(team.viewer).get(url(run)).content.decode()
    assert "This run is archived" in viewer_page and 'name="archived" value="0"' not in viewer_page  # viewers read
    member = client_for(team.teammate)
    assert 'name="archived" value="0"' in member.get(url(run)).content.decode()
    response = member.post("/p/alpha/runs/archive/", {"runs": run.public_id, "archived": "0", "from": "run"})
    assert response.status_code == 302 and response["Location"] == url(run)
    assert not Run.objects.get(pk=run.pk).archived


def test_lineage_says_the_step_of_the_export_and_why_a_cancelled_runs_is_not_offered(team, run, client_for):
    """QA: a run resumed and then cancelled listed its earlier export, with no step and no word on why the
    launch form did not offer it."""
    from webapp.runs.models import Artifact, ArtifactKind

    run = succeeded_with_export(run)
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=40, path=str(run.output_dir / "export"))
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert f"Exported model at step 40 <span class=\"muted\">(start runs from <code>{run.public_id}</code>)" in page
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED)
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert "Exported model at step 40 <span class=\"muted\">(from when the run last succeeded" in page


def _edit_form(page: str) -> dict[str, str]:
    """The run page's edit form as a browser would send it untouched."""
    import html
    import re

    form = page.split('id="edit-form"')[1].split("</form>")[0]
    values = {name: html.unescape(value) for name, value in re.findall(r'name="([a-z_]+)" value="([^"]*)"', form)}
    values["notes"] = html.unescape(form.split('name="notes"')[1].split(">", 1)[1].split("</textarea>")[0])
    return values


def test_an_edit_from_an_older_tab_keeps_what_a_teammate_saved_meanwhile(team, run, client_for):
    """QA: bob saved notes; alice, in a tab opened before, changed only the tags and saved: bob's notes
    were gone, without a word (the form sent every field as the page had loaded it)."""
    alice, bob = client_for(team.owner), client_for(team.teammate)
    alice_form = _edit_form(alice.get(url(run)).content.decode())
    bob_form = _edit_form(bob.get(url(run)).content.decode())
    assert bob.post(url(run, "edit/"), {**bob_form, "notes": "bob's findings"}).status_code == 302
    assert alice.post(url(run, "edit/"), {**alice_form, "tags": "baseline"}).status_code == 302
    run.refresh_from_db()
    assert run.notes == "bob's findings" and run.tags == ["baseline"]
    # Both changed the notes: the later is told, keeps its text, and replaces the other's only when sent again.
    refused = alice.post(url(run, "edit/"), {**alice_form, "notes": "alice's view"})
    page = refused.content.decode()
    assert refused.status_code == 400 and "someone else changed the notes since this page was opened" in page
    run.refresh_from_db()
    assert run.notes == "bob's findings"
    again = _edit_form(page)
    assert again["notes"] == "alice's view"
    assert alice.post(url(run, "edit/"), again).status_code == 302
    run.refresh_from_db()
    assert run.notes == "alice's view" and run.tags == ["baseline"]


def test_a_deleted_base_model_or_dataset_is_named_in_the_runs_history(team, run, client_for, catalog):
    """QA: after a dataset and a base model were deleted in the admin, the runs' lineage and table
    dropped their lines, as if the run had been trained on nothing."""
    catalog.sft.dataset.delete()
    catalog.base_model.delete()
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert f"Starting model <code>{catalog.base_model.public_id}</code> <span class=\"muted\">(deleted since)</span>" in page
    assert (f"Training data <bdi>chats</bdi> v1 <code>{catalog.sft.public_id}</code> "
            '<span class="muted">(deleted since)</span>') in page
    table = client_for(team.viewer).get("/p/alpha/runs/").content.decode()
    row = table.split(f'data-run="{run.public_id}"')[1].split("</tr>")[0]
    assert "deleted starting model" in row and "deleted data" in row
    # Duplicate says which of its fields came up empty, and why.
    form = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={run.public_id}").content.decode()
    assert "Some of what the run used is gone" in form
    assert f"{catalog.base_model.public_id}, which first &lt;b&gt;run&lt;/b&gt; used, was deleted since; choose another" in form
    assert f"<code>data.train</code>: {catalog.sft.public_id}, which" in form


def test_a_deleted_dataset_version_is_named_as_it_was_at_launch(team, client_for, catalog, sent_tasks):
    """A run whose training data was deleted showed only ``dv_… (deleted since)``: its name and version number,
    recorded at launch, say what it trained on (the name escaped). A run launched before they were recorded
    keeps the id alone."""
    catalog.sft.dataset.name = "<i>chats</i>"
    catalog.sft.dataset.save()
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate)
    older = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate)
    Run.objects.filter(pk=older.pk).update(dataset_names={})
    catalog.sft.delete()
    page = client_for(team.viewer).get(url(run)).content.decode()
    assert (f"Training data <bdi>&lt;i&gt;chats&lt;/i&gt;</bdi> v1 <code>{catalog.sft.public_id}</code> "
            '<span class="muted">(deleted since)</span>') in page
    page = client_for(team.viewer).get(url(older)).content.decode()
    assert f"Training data <code>{catalog.sft.public_id}</code> <span class=\"muted\">(deleted since)</span>" in page


def test_a_run_whose_model_directory_was_deleted_since_shows_its_pages_in_project_terms(team, catalog, client_for,
                                                                                       sent_tasks, tmp_path):
    """Item checked: a run whose resolved spec names a model directory deleted on disk since (its base model's folder
    removed, the row kept; the export of the run it started from removed). Its run page, the chat's model picker and
    the compare page read no file of it: each answers, naming the model as the project does, never by its path."""
    from tests.webapp.factories import make_base_model as registered

    model_dir = tmp_path / "models" / "mine"
    model_dir.mkdir(parents=True)  # what the launch reads of it: no page reads any of it
    (model_dir / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                       "max_position_embeddings": 2048}))
    base = registered(team.project, name="mine", path=str(model_dir))
    first = services.run_create(project=team.project, spec={**sft_spec(catalog), "model": base.public_id},
                                user=team.owner, name="first")
    export = first.output_dir / "export"
    shutil.copytree(model_dir, export)
    Run.objects.filter(pk=first.pk).update(status=RunStatus.RUNNING)
    reporting.run_finish(run=Run.objects.get(pk=first.pk), summary={"status": "succeeded", "step": 10,
                                                                      "export": {"model": str(export)}})
    second = services.run_create(project=team.project, spec={**sft_spec(catalog), "model": first.public_id},
                                 user=team.owner, name="second")
    assert second.resolved_spec["model"] == str(export.resolve())
    for run in (first, second):
        MetricPoint.objects.create(run=run, step=1, name="loss", value=2.0, wall_time=5.0, tokens=64)
    shutil.rmtree(model_dir)
    shutil.rmtree(export)
    client = client_for(team.viewer)
    second_page = client.get(url(second)).content.decode()
    assert f'Started from run <a href="/p/alpha/runs/{first.public_id}/"><bdi>first</bdi></a>' in second_page
    compare = client.get(f"/p/alpha/runs/compare/?runs={first.public_id}&runs={second.public_id}")
    assert (f'<td><code>model</code></td><td><bdi>mine</bdi> <small class="muted">{base.public_id}</small></td>'
            f'<td><bdi>first</bdi> <small class="muted">{first.public_id}</small></td>') in compare.content.decode()
    chat = client_for(team.teammate).get("/p/alpha/chat/")
    # Listed as gone, as the launch form lists a gone base model (its export is what the chat would serve).
    assert (f'<option value="{first.public_id}">Run: {isolated("first")} (its folder is gone)</option>'
            in chat.content.decode())
    for response in (client.get(url(first)), client.get(url(second)), compare, chat):
        assert response.status_code == 200
        assert str(model_dir) not in response.content.decode() and str(export) not in second_page


def test_it_rejects_notes_past_the_cap_keeping_what_was_typed(team, run, client_for):
    """Notes of any length were stored (9 MB was) and rendered on every view of the run page. Past
    20,000 characters they are refused at the notes field, the text kept in the form; the textarea
    says its limit to the browser too."""
    client = client_for(team.teammate)
    assert 'name="notes" rows="6" maxlength="20000"' in client.get(url(run)).content.decode()
    notes = "x" * 20_001
    response = client.post(url(run, "edit/"), {"name": "renamed", "tags": "", "notes": notes})
    assert response.status_code == 400
    page = response.content.decode()
    assert '<small class="error" id="edit-notes-error-1">20,001 characters; at most 20,000' in page
    assert f">{notes}</textarea>" in page
    run.refresh_from_db()
    assert run.notes == "" and run.name != "renamed"
    ok = client.post(url(run, "edit/"), {"name": "renamed", "notes": "x" * 20_000})
    assert ok.status_code == 302


def test_it_rejects_a_nul_in_the_name_or_tags(team, run, client_for):
    """The edit form stored a name and tags holding NUL (PostgreSQL refuses them: a 500 there)."""
    client = client_for(team.teammate)
    for fields, field in (({"name": "a\x00b"}, "name"), ({"name": "ok", "tags": "x, y\x00"}, "tags"),
                          ({"name": "ok", "notes": "n\x00"}, "notes")):
        response = client.post(url(run, "edit/"), fields)
        assert response.status_code == 400
        assert f'class="field has-error"><label for="edit-{field}">' in response.content.decode()
        assert "NUL character (\\x00)" in response.content.decode()
    run.refresh_from_db()
    assert run.name == "first <b>run</b>" and run.tags == [] and run.notes == ""


def test_the_compare_csv_writes_formulas_as_text(team, catalog, client_for, sent_tasks):
    """Run and metric names went into the CSV as they were: '=HYPERLINK(…)' ran as a formula when the file
    was opened in a spreadsheet. Such cells start with a quote; numbers (a negative value too) stay numbers."""
    import csv
    import io

    runs = [services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name=name)
            for name in ('=HYPERLINK("http://evil.example","click")', "@plain")]
    MetricPoint.objects.create(run=runs[0], step=1, name="+cmd|' /C calc'!A0", value=-1.5, wall_time=1.0, tokens=0)
    MetricPoint.objects.create(run=runs[1], step=1, name="loss", value=2.0, wall_time=1.0, tokens=0)
    ids = "&".join(f"runs={run.public_id}" for run in runs)
    rows = list(csv.reader(io.StringIO(client_for(team.teammate).get(
        f"/p/alpha/runs/compare/metrics.csv?{ids}").content.decode())))
    assert rows[1][1:5] == ['\'=HYPERLINK("http://evil.example","click")', "1", "'+cmd|' /C calc'!A0", "-1.5"]
    assert rows[2][1:5] == ["'@plain", "1", "loss", "2.0"]


def _sweep_tag(location: str) -> str:
    match = re.fullmatch(r"/p/alpha/runs/\?tag=(sweep-[0-9a-f]{8})&sort=oldest", location)
    assert match, location
    return match.group(1)


def test_launching_a_sweep_from_the_form_lists_its_runs(team, catalog, client_for, sent_tasks):
    client = client_for(team.teammate)
    form = {**_layout_form(catalog), "name": "lr", "tags": "mine", "peft.method": "lora",
            "sweep": "optim.learning_rate: 1e-4, 3e-4, 1e-3\r\npeft.rank: 8, 16\r\n"}
    response = client.post("/p/alpha/runs/new/", form)
    assert response.status_code == 302
    tag = _sweep_tag(response["Location"])
    runs = list(Run.objects.order_by("id"))
    assert [run.name for run in runs] == [f"lr · learning_rate={lr} rank={rank}"
                                          for lr in ("1e-4", "3e-4", "1e-3") for rank in (8, 16)]
    assert all(run.tags == [tag, "mine"] and run.spec["train"]["batch_size"] == 8 for run in runs)
    page = client.get(response["Location"]).content.decode()
    assert f"Sweep {tag}: 6 runs queued." in page
    # The table lists the sweep's runs in the order they were queued, and only them.
    assert [page.index(run.public_id) for run in runs] == sorted(page.index(run.public_id) for run in runs)
    other = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="not swept")
    assert other.public_id not in client.get(response["Location"]).content.decode()


def test_a_table_filtered_by_a_tag_links_to_the_comparison_of_its_runs(team, catalog, client_for, sent_tasks):
    client = client_for(team.teammate)
    response = client.post("/p/alpha/runs/new/", {**_layout_form(catalog), "sweep": "train.batch_size: 1, 2, 4"})
    tag = _sweep_tag(response["Location"])
    swept = [run.public_id for run in Run.objects.order_by("id")]
    services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="not swept")
    link = re.search(r'<a class="button" href="([^"]+)">Compare the 3 runs tagged ' + tag + "</a>",
                     client.get(response["Location"]).content.decode())
    assert link, "no link to compare the sweep"
    compare_url = html.unescape(link.group(1))
    assert compare_url == "/p/alpha/runs/compare/?" + "&".join(f"runs={run_id}" for run_id in swept)
    page = client.get(compare_url)
    assert page.status_code == 200 and all(run_id in page.content.decode() for run_id in swept)
    # Unfiltered, or a tag with one run, or with more runs than a comparison takes: no such link.
    assert "Compare the" not in client.get("/p/alpha/runs/").content.decode()
    services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="one", tags="alone")
    assert "Compare the" not in client.get("/p/alpha/runs/?tag=alone").content.decode()
    for _ in range(views.MAX_COMPARE + 1):
        services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="many", tags="many")
    assert "Compare the" not in client.get("/p/alpha/runs/?tag=many").content.decode()


def test_a_sweep_of_one_value_says_one_run(team, catalog, client_for, sent_tasks):
    """It said "1 runs queued"."""
    client = client_for(team.teammate)
    response = client.post("/p/alpha/runs/new/", {**_layout_form(catalog), "sweep": "train.batch_size: 4"})
    assert response.status_code == 302
    assert f"Sweep {_sweep_tag(response['Location'])}: 1 run queued." in client.get(response["Location"]).content.decode()


def test_launching_a_sweep_from_the_yaml_view(team, catalog, client_for, sent_tasks):
    response = client_for(team.teammate).post("/p/alpha/runs/new/", {
        "mode": "yaml", "spec_yaml": services.spec_to_yaml(sft_spec(catalog)), "sweep": "train.batch_size: 1, 4"})
    assert response.status_code == 302
    tag = _sweep_tag(response["Location"])
    assert [(run.name, run.spec["train"]["batch_size"], run.tags) for run in Run.objects.order_by("id")] == [
        ("sft-tiny · batch_size=1", 1, [tag]), ("sft-tiny · batch_size=4", 4, [tag])]


def test_a_refused_sweep_names_its_line_escaped_keeps_what_was_typed_and_makes_nothing(team, catalog, client_for,
                                                                                       sent_tasks):
    client = client_for(team.teammate)
    typed = "peft.rank: 8, <b>16</b>\noptim.lr: 1e-3"
    for mode, form in (("form", _layout_form(catalog)),
                       ("yaml", {"mode": "yaml", "spec_yaml": services.spec_to_yaml(sft_spec(catalog))})):
        response = client.post("/p/alpha/runs/new/", {**form, "sweep": typed})
        page = response.content.decode()
        assert response.status_code == 400, mode
        assert "The sweep was not launched: none of its runs was made" in page
        assert "line 2: optim.lr: not a key of optim in an sft spec; its keys: learning_rate," in page
        assert "<b>16</b>" not in page and "peft.rank: 8, &lt;b&gt;16&lt;/b&gt;\noptim.lr: 1e-3</textarea>" in page
    # Its keys fixed, the value is plan_run's to refuse, by line and combination, still escaped.
    page = client.post("/p/alpha/runs/new/", {**_layout_form(catalog), "sweep": "peft.rank: 8, <b>16</b>"}).content.decode()
    assert ("line 1: peft.rank = &lt;b&gt;16&lt;/b&gt;: &#x27;&lt;b&gt;16&lt;/b&gt;&#x27;: input should be a valid "
            "integer (combination 2 of 2: rank=&lt;b&gt;16&lt;/b&gt;)") in page
    assert not Run.objects.exists() and not sent_tasks.calls


def test_a_sweep_needs_a_member_of_the_project(team, catalog, client_for, sent_tasks):
    form = {**_layout_form(catalog), "sweep": "peft.rank: 4, 8"}
    assert client_for(team.outsider).post("/p/alpha/runs/new/", form).status_code == 404
    assert client_for(team.viewer).post("/p/alpha/runs/new/", form).status_code == 403
    assert not Run.objects.exists() and not sent_tasks.calls


def test_switching_editors_and_tasks_keeps_the_sweep(team, catalog, client_for, sent_tasks):
    client = client_for(team.teammate)
    sweep = "peft.rank: 4, 8"
    page = client.post("/p/alpha/runs/new/", {**_layout_form(catalog), "sweep": sweep, "switch": "yaml"}).content.decode()
    assert 'name="sweep" rows="3" spellcheck="false" class="code" aria-describedby="id_sweep-help" placeholder' in page
    assert page.count(f">{sweep}</textarea>") == 2  # both editors hold it; the YAML one is shown
    page = switched(client, {**_layout_form(catalog), "sweep": sweep}, task="dpo").content.decode()
    assert page.count(f">{sweep}</textarea>") == 2
    assert not Run.objects.exists()


def test_the_live_check_says_what_a_launch_would_warn_of_and_saves_nothing(team, catalog, client_for, sent_tasks):
    """The launch page asks this as its editors are filled in: the launch's own checks, nothing saved."""
    client = client_for(team.teammate)
    form = {**_layout_form(catalog), "optim.warmup_steps": "5", "train.eval_every": "2"}
    answer = client.post("/p/alpha/runs/new/check/", form).json()
    assert answer["errors"] == {}
    assert [warning.split(":")[0] for warning in answer["warnings"]] == ["optim.warmup_steps", "train.eval_every"]
    assert answer["warnings"][0].startswith("optim.warmup_steps: 5 is not below the run's 5 optimizer steps")
    assert answer["warnings"][1].startswith("train.eval_every: 2 evaluates nothing, as data.eval is not given")
    fitting = {**form, "optim.warmup_steps": "1", "data.eval": catalog.prompts.public_id}
    assert client.post("/p/alpha/runs/new/check/", fitting).json() == {"errors": {}, "warnings": [], "actions": [],
                                                                           "memory": [], "counting": False}
    # Evaluating on the training version itself is said too.
    on_itself = client.post("/p/alpha/runs/new/check/", {**fitting, "data.eval": catalog.sft.public_id}).json()
    assert [warning.split(":")[0] for warning in on_itself["warnings"]] == ["data.eval"]
    assert on_itself["actions"] == [None]  # nothing in Temper does what it advises
    # A warning Temper can act on says where: evaluation rows that data.train holds too, removed from it.
    sharing = make_ready_version(team.project, name="held", rows=[{"prompt": "q3", "completion": "answer 3"}])
    overlap = client.post("/p/alpha/runs/new/check/", {**fitting, "data.eval": sharing.public_id}).json()
    assert [warning.split(" shares")[0] for warning in overlap["warnings"]] == [f"data.eval: {isolated('held v1')}"]
    assert overlap["actions"] == [{
        "url": f"/p/alpha/datasets/{catalog.sft.dataset.public_id}/v/1/?derive=decontaminate&against="
               f"{sharing.public_id}#remove-shared", "label": "Remove them from chats v1"}]
    assert not Run.objects.exists() and not sent_tasks.calls


def test_the_live_check_names_what_a_launch_would_be_refused_for(team, catalog, client_for, sent_tasks):
    client = client_for(team.teammate)
    refused = client.post("/p/alpha/runs/new/check/", {**_layout_form(catalog), "model": "",
                                                        "optim.learning_rate": "fast", "train.batch_size": "0"}).json()
    assert refused["warnings"] == []
    assert set(refused["errors"]) == {"model", "optim.learning_rate", "train.batch_size"}
    assert refused["errors"]["model"][0].startswith("choose a starting model")
    # The YAML editor, with the line of its problem, as the launch reports it.
    text = (f"task: sft\nmodel: {catalog.base_model.public_id}\ndata: {{train: {catalog.sft.public_id}}}\n"
            "train: {max_steps: 5, batch_sise: 2}\n")
    yaml_errors = client.post("/p/alpha/runs/new/check/", {"mode": "yaml", "spec_yaml": text}).json()["errors"]
    assert list(yaml_errors) == ["spec_yaml"] and yaml_errors["spec_yaml"][0].startswith("spec:4: train.batch_sise:")
    # A sweep: each combination checked, the bad one named under the sweep field.
    sweep = client.post("/p/alpha/runs/new/check/", {**_layout_form(catalog), "sweep": "train.batch_size: 2, 0"}).json()
    assert sweep["errors"] == {"sweep": ["line 1: train.batch_size = 0: 0 is too small: give a whole number from 1 "
                                         "to 65536 (combination 2 of 2: batch_size=0)"]}
    assert not Run.objects.exists() and not sent_tasks.calls


def test_viewers_and_outsiders_cannot_ask_the_live_check(team, catalog, client_for):
    assert client_for(team.viewer).post("/p/alpha/runs/new/check/", _layout_form(catalog)).status_code == 403
    assert client_for(team.outsider).post("/p/alpha/runs/new/check/", _layout_form(catalog)).status_code == 404
    assert client_for(team.teammate).get("/p/alpha/runs/new/check/").status_code == 405


def test_a_reward_reading_a_column_the_data_lacks_is_refused_at_its_input(team, catalog, client_for, sent_tasks):
    """QA: exact_match with answer_column 'solution' on prompts data with an 'answer' column was launched,
    and the run failed at its start, naming the file's path under the data root."""
    data = _grpo_form(catalog, **{"grpo.rewards.0.name": "exact_match",
                                  "grpo.rewards.0.args.exact_match.answer_column": "solution"})
    response = client_for(team.teammate).post("/p/alpha/runs/new/", data)
    assert response.status_code == 400 and not Run.objects.exists() and not sent_tasks.calls
    assert response.context["errors"]["grpo.rewards.0.args.answer_column"] == [
        "exact_match reads the reference answer from column 'solution', and row 1 of questions v1 has none; give "
        "the column that holds the answers, or other data"]
    # The data's own column: launched.
    data["grpo.rewards.0.args.exact_match.answer_column"] = "answer"
    assert client_for(team.teammate).post("/p/alpha/runs/new/", data).status_code == 302


def test_a_reference_the_reward_cannot_score_is_refused_at_its_input(team, catalog, client_for, sent_tasks):
    """QA: numeric_match on held-out answers that are words was launched, and the run failed at its first
    evaluation, after eval_every steps of rollouts."""
    from tests.webapp.factories import make_ready_version

    worded = make_ready_version(team.project, name="worded", kind="prompts",
                                rows=[{"prompt": "2+2?", "answer": "4"}, {"prompt": "3+3?", "answer": "six"}])
    data = _grpo_form(catalog, **{"data.eval": worded.public_id, "grpo.rewards.0.name": "numeric_match"})
    response = client_for(team.teammate).post("/p/alpha/runs/new/", data)
    assert response.status_code == 400 and not Run.objects.exists() and not sent_tasks.calls
    assert response.context["errors"]["grpo.rewards.0.args.answer_column"] == [
        "numeric_match cannot score row 2 of worded v1: reference answer='six' is not a number; correct the row, "
        "or give another column"]
    # The same reward on numeric answers: launched.
    data["data.eval"] = catalog.prompts.public_id
    assert client_for(team.teammate).post("/p/alpha/runs/new/", data).status_code == 302


def test_the_grpo_forms_reward_model_function_chooses_its_model_among_the_projects_reward_runs(
        team, catalog, client_for, sent_tasks, tmp_path):
    """QA: the ``reward_model`` reward function's ``model`` was a bare text input, so scoring GRPO
    rollouts with a trained reward model meant finding and pasting its run id (left blank: 'required
    argument missing: model (a text)'). It is a select of the project's succeeded reward runs, as
    ``ppo.reward_model`` is, and a launch keeps the chosen one."""
    scorer = exported_reward_run(team, catalog, name="scorer <i>", export=tmp_path / "export")
    unfinished = services.run_create(project=team.project, spec=reward_spec(catalog), user=team.teammate,
                                     name="still training")
    client = client_for(team.teammate)
    page = client.get("/p/alpha/runs/new/?task=grpo").content.decode()
    option = f'<option value="{scorer.public_id}" >{FSI}scorer &lt;i&gt;{PDI} — reward model of {scorer.public_id}</option>'
    blank_row_select = page.index('<select id="spec-grpo-rewards-__row__-reward_model-model" '
                                  'name="grpo.rewards.__row__.args.reward_model.model">')
    assert page.index(option, blank_row_select) < page.index("</select>", blank_row_select)
    assert f'value="{unfinished.public_id}"' not in page
    data = _grpo_form(catalog, **{"grpo.rewards.0.name": "reward_model",
                                  "grpo.rewards.0.args.reward_model.model": scorer.public_id})
    response = client.post("/p/alpha/runs/new/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    run = Run.objects.get(task="grpo")
    assert run.spec["grpo"]["rewards"] == [{"name": "reward_model", "weight": 1.0,
                                            "args": {"model": scorer.public_id}}]
    # Duplicate shows it chosen in its row.
    again = client.get(f"/p/alpha/runs/new/?from={run.public_id}").content.decode()
    chosen = again.index('name="grpo.rewards.0.args.reward_model.model"')
    assert again.index(f'<option value="{scorer.public_id}" selected>', chosen) < again.index("</select>", chosen)


def test_an_archived_reward_run_leaves_the_reward_model_pickers_but_a_duplicate_keeps_it(
        team, catalog, client_for, sent_tasks, tmp_path):
    """QA: archiving puts a run's models away from the launch form's pickers, but an archived reward run
    was still offered as ``ppo.reward_model`` and as a ``reward_model`` function's model. A spec that
    names it (a duplicate) still shows it chosen."""
    scorer = exported_reward_run(team, catalog, name="old scorer", export=tmp_path / "export")
    client = client_for(team.teammate)
    form = {"mode": "form", "task": "ppo", "model": catalog.base_model.public_id, "data.train": catalog.prompts.public_id,
            "train.max_steps": "4", "train.batch_size": "2", "peft.targets": ["q_proj"], "ppo.max_new_tokens": "8",
            "ppo.reward_model": scorer.public_id}
    assert client.post("/p/alpha/runs/new/", form).status_code == 302
    ppo_run = Run.objects.get(task="ppo")
    Run.objects.filter(pk=scorer.pk).update(archived=True)
    for task in ("ppo", "grpo"):
        page = client.get(f"/p/alpha/runs/new/?task={task}").content.decode()
        assert f'value="{scorer.public_id}"' not in page, task
    again = client.get(f"/p/alpha/runs/new/?from={ppo_run.public_id}").content.decode()
    chosen = again.index('name="ppo.reward_model"')
    assert again.index(f'<option value="{scorer.public_id}" selected>', chosen) < again.index("</select>", chosen)


def test_the_samples_browser_of_a_run_without_scores_offers_no_reward_filters(team, run, client_for):
    """QA: a DPO run's page offered 'Show: rollouts', a reward range, ordering by reward and a Reward column
    of dashes beside its eval generations, none of which it has: those belong to runs whose samples are
    scored (GRPO, PPO)."""
    Sample.objects.bulk_create([Sample(run=run, step=5, position=index, prompt="p", text=f"generation {index}",
                                       extra={"kind": "eval"}) for index in (1, 2)])
    client = client_for(team.viewer)
    for address in (url(run), url(run, "samples/?step=5")):
        page = client.get(address).content.decode()
        assert "generation 1" in page and 'name="step"' in page
        for offered in ('name="kind"', 'name="min_reward"', 'name="max_reward"', "highest reward first",
                        '<th class="num">Reward</th>'):
            assert offered not in page, (address, offered)
    # Scored once one sample is: the filters come with it.
    Sample.objects.create(run=run, step=6, position=0, prompt="p", text="rollout", reward=0.5,
                          extra={"kind": "rollout", "advantage": 0.0})
    page = client.get(url(run, "samples/?step=5")).content.decode()
    assert 'name="kind"' in page and 'name="min_reward"' in page and '<th class="num">Reward</th>' in page


def test_the_model_picker_says_which_kind_of_run_exported_each_model(team, catalog, client_for, sent_tasks, tmp_path):
    """QA: the starting-model picker listed a reward run's export like any other ('scorer — exported by
    run_…'): nothing told a reward model, whose head scores and whose text no page serves, from a DPO
    policy. Each run's export names its task."""
    scorer = services.run_create(project=team.project, spec=reward_spec(catalog), user=team.teammate, name="scorer")
    policy = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="policy")
    for finished in (scorer, policy):
        Run.objects.filter(pk=finished.pk).update(status=RunStatus.SUCCEEDED)
        Artifact.objects.create(run=finished, kind=ArtifactKind.MODEL, path=str(tmp_path / finished.public_id))
    page = client_for(team.teammate).get("/p/alpha/runs/new/?task=dpo").content.decode()
    assert f'<option value="{scorer.public_id}" >{FSI}scorer{PDI} — reward model exported by {scorer.public_id}' in page
    assert f'<option value="{policy.public_id}" >{FSI}policy{PDI} — sft model exported by {policy.public_id}' in page


def test_a_reward_runs_page_says_its_model_scores_rollouts(team, catalog, client_for, sent_tasks, tmp_path):
    """QA: a reward run's page offered its export with '(start runs from run_…)', as a policy's does, and
    said nothing of what a reward model is for: scoring PPO and GRPO rollouts."""
    scorer = exported_reward_run(team, catalog, name="scorer", step=2)
    page = client_for(team.viewer).get(url(scorer)).content.decode()
    assert (f'Exported model at step 2 <span class="muted">(scores PPO and GRPO rollouts as <code>{scorer.public_id}'
            '</code>: choose it as ppo.reward_model, or as the model of a reward_model reward function)') in page


def test_an_empty_runs_table_offers_what_fits_its_filters(team, run, client_for):
    """Filtered to nothing, the table offered "Launch one" (a new run matches no filter of a search that found
    none); it now offers the table without its filters, and an unfiltered empty table the launch."""
    client = client_for(team.teammate)
    filtered = client.get("/p/alpha/runs/?q=nothing-is-named-so").content.decode()
    assert "No runs match these filters." in filtered
    assert 'href="/p/alpha/runs/" id="runs-unfiltered"' in filtered and "Launch one" not in filtered
    archived = client.get("/p/alpha/runs/?archived=1").content.decode()
    assert "No archived runs." in archived and "Launch one" not in archived


def test_a_succeeded_runs_page_offers_a_chat_with_its_model(team, run, client_for):
    """QA: a first-time user whose run succeeded found no way from its page to talk to the model: the chat
    lived on another page, in a menu of every model of the project, the base model first."""
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(run.output_dir / "export"))
    chat_link = f'href="/p/alpha/chat/?model={run.public_id}#new-conversation"'
    assert chat_link not in client_for(team.teammate).get(url(run)).content.decode()  # still queued
    run = succeeded_with_export(run)
    assert chat_link in client_for(team.teammate).get(url(run)).content.decode()
    # The chat is for members: a viewer's page does not offer it, nor does an archived run's (the chat lists
    # no archived run's model).
    assert chat_link not in client_for(team.viewer).get(url(run)).content.decode()
    Run.objects.filter(pk=run.pk).update(archived=True)
    assert chat_link not in client_for(team.teammate).get(url(run)).content.decode()
    Run.objects.filter(pk=run.pk).update(archived=False)
    # The link's chat page starts with that model chosen.
    chat = client_for(team.teammate).get(f"/p/alpha/chat/?model={run.public_id}").content.decode()
    assert f'<option value="{run.public_id}" selected>' in chat
    # A reward model writes no text: nothing to chat with.
    Run.objects.filter(pk=run.pk).update(task="reward")
    assert chat_link not in client_for(team.teammate).get(url(run)).content.decode()


def test_a_succeeded_runs_page_offers_a_run_from_its_model(team, run, client_for):
    """QA (second first-use pass): an SFT run had succeeded and the next stage (DPO from its model) started on
    the Runs page, the model found again among every base model, exported model and checkpoint; the page offered
    a chat with the model and a duplicate of the run, not a run from it. It links the launch form, its model
    chosen, as a base model's page does."""
    launch_link = f'href="/p/alpha/runs/new/?model={run.public_id}&amp;task=sft" id="launch-from-run"'
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(run.output_dir / "export"))
    assert launch_link not in client_for(team.teammate).get(url(run)).content.decode()  # still queued
    run = succeeded_with_export(run)
    assert launch_link in client_for(team.teammate).get(url(run)).content.decode()
    form = client_for(team.teammate).get(f"/p/alpha/runs/new/?task=dpo&model={run.public_id}").content.decode()
    assert f'<option value="{run.public_id}" selected>' in form
    # Viewers launch nothing; an archived run's model is not offered by the form; a reward model scores text.
    assert launch_link not in client_for(team.viewer).get(url(run)).content.decode()
    Run.objects.filter(pk=run.pk).update(archived=True)
    assert launch_link not in client_for(team.teammate).get(url(run)).content.decode()
    Run.objects.filter(pk=run.pk).update(archived=False, task="reward")
    assert launch_link not in client_for(team.teammate).get(url(run)).content.decode()


def test_the_evaluation_data_help_of_a_reward_run_promises_no_generations(team, catalog, client_for):
    """QA: the reward form's evaluation data said 'eval loss, and generations on its prompts', and the run
    then showed none: a reward model scores text and writes none; nor has pretraining's plain text prompts."""
    eval_help = r'data-key="data.eval">.*?<small class="help" id="spec-data-eval-help">(.*?)</small>'
    reward_page = client_for(team.teammate).get("/p/alpha/runs/new/?task=reward").content.decode()
    help_text = re.search(eval_help, reward_page, re.S).group(1)
    assert "generations" not in help_text and "accuracy" in help_text
    pretrain_page = client_for(team.teammate).get("/p/alpha/runs/new/?task=pretrain").content.decode()
    assert "generations" not in re.search(eval_help, pretrain_page, re.S).group(1)
    sft_page = client_for(team.teammate).get("/p/alpha/runs/new/?task=sft").content.decode()
    assert "generations on its prompts" in re.search(eval_help, sft_page, re.S).group(1)


def test_lineage_isolates_the_names_of_models_and_runs_as_it_does_datasets(team, run, client_for, catalog, sent_tasks):
    """The lineage wrapped a dataset's name in <bdi> but not the base model's, the starting run's or a
    derived run's: a right-to-left name ran into the text around it."""
    from webapp.runs.models import Artifact, ArtifactKind

    source = succeeded_with_export(run)
    Artifact.objects.create(run=source, kind=ArtifactKind.MODEL, path=str(source.output_dir / "export"))
    derived = services.run_create(project=team.project, user=team.teammate, name="نموذج (copy)",
                                  spec=sft_spec(catalog, model=source.public_id))
    client = client_for(team.viewer)
    lineage = client.get(url(derived)).content.decode().split('<ol class="lineage">')[1].split("</ol>")[0]
    assert f"><bdi>{html.escape(source.name, quote=False)}</bdi></a>" in lineage
    lineage = client.get(url(source)).content.decode().split('<ol class="lineage">')[1].split("</ol>")[0]
    assert f"><bdi>{catalog.base_model.name}</bdi></a>" in lineage
    assert "><bdi>نموذج (copy)</bdi></a>" in lineage


def test_a_runs_table_filter_it_does_not_understand_is_ignored_with_a_note(team, run, client_for):
    """QA: ``?status=bogus`` (an old bookmark, a hand-typed address) showed "No runs match these filters", as if
    the project had no run of that status; the table now ignores the value it cannot read and says so."""
    page = client_for(team.teammate).get("/p/alpha/runs/?status=bogus&task=nonsense").content.decode()
    assert "No runs match" not in page and run.public_id in page
    assert "Ignored status=&#x27;bogus&#x27;: not a run status; use one of queued, " in page
    assert "Ignored task=&#x27;nonsense&#x27;: not a run task; use one of pretrain, sft, " in page
    # A value it reads is no note, and still filters.
    filtered = client_for(team.teammate).get("/p/alpha/runs/?status=succeeded").content.decode()
    assert "Ignored" not in filtered and "No runs match these filters." in filtered


def test_giving_both_max_steps_and_epochs_is_said_at_both_fields(team, catalog, client_for, sent_tasks):
    """QA: "give exactly one of max_steps and epochs" was listed at the top of the form only, the two fields it
    is about unmarked; it is now at each of them too."""
    form = {"mode": "form", "task": "sft", "model": catalog.base_model.public_id, "data.train": catalog.sft.public_id,
            "train.max_steps": "5", "train.epochs": "1"}
    response = client_for(team.teammate).post("/p/alpha/runs/new/", form)
    assert response.status_code == 400
    page = response.content.decode()
    message = "give exactly one of max_steps and epochs (both given)"
    for key in ("train.max_steps", "train.epochs"):
        field = re.search(rf'<div class="field spec-field[^"]*" data-key="{re.escape(key)}">.*?</div>', page, re.S)
        assert "has-error" in field.group(0), key
        assert re.search(f'<small class="error" id="[^"]+">{re.escape(message)}</small>', field.group(0)), key
    assert page.count(message) == 3  # the two fields, and the list at the top


def test_switching_to_yaml_keeps_a_peft_method_of_none(team, catalog, client_for, sent_tasks):
    """QA: after Form→YAML, a spec whose peft.method was "none" (full fine-tuning) had no method line: the
    form read the choice "none" as an input left empty."""
    form = {"mode": "form", "task": "sft", "model": catalog.base_model.public_id, "data.train": catalog.sft.public_id,
            "train.max_steps": "5", "peft.method": "none", "switch": "yaml"}
    page = html.unescape(client_for(team.teammate).post("/p/alpha/runs/new/", form).content.decode())
    assert "peft:\n  method: none\n" in page


def test_an_sft_run_evaluated_on_prompts_with_answers_calls_its_references_answers(team, catalog, client_for,
                                                                                    sent_tasks):
    """QA (the demo's first SFT run, evaluated on demo-eval's prompts and answers): its samples' Reference
    column was headed "(completion)" over answers such as "9", named by the run's task, not by its texts."""
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="tune")
    reporting.sample_row(run, 2, 0, {"step": 2, "prompt": "Largest digit in 9 2 3?", "text": "3", "answer": "9"}).save()
    page = client_for(team.viewer).get(url(run, "samples/") + "?step=2").content.decode()
    assert "<th>Reference (answer)</th>" in page and '<td class="text muted">9</td>' in page
    # Texts of two kinds at one step: the column says neither.
    reporting.sample_row(run, 2, 1, {"step": 2, "prompt": "Say hi", "text": "hello", "completion": "Hi"}).save()
    page = client_for(team.viewer).get(url(run, "samples/") + "?step=2").content.decode()
    assert "<th>Reference</th>" in page


def test_a_dpo_runs_eval_samples_show_the_chosen_answer_as_their_reference(team, catalog, client_for, sent_tasks):
    """QA: a DPO run's eval samples showed "—" in the Reference column: its rows hold a chosen answer, not an
    ``answer``. The engine records the chosen one, shown under a column that says so."""
    spec = {"task": "dpo", "model": catalog.base_model.public_id, "data": {"train": catalog.preference.public_id},
            "train": {"max_steps": 4}}
    run = services.run_create(project=team.project, spec=spec, user=team.teammate, name="prefer")
    reporting.sample_row(run, 2, 0, {"step": 2, "prompt": "Say hi", "text": "hello", "chosen": "Hi <b>there</b>"}).save()
    page = client_for(team.viewer).get(url(run, "samples/") + "?step=2").content.decode()
    assert "<th>Reference (chosen answer)</th>" in page
    assert '<td class="text muted">Hi &lt;b&gt;there&lt;/b&gt;</td>' in page


def test_an_sft_runs_eval_samples_show_the_completion_as_their_reference(team, catalog, client_for, sent_tasks):
    """QA: an SFT run's eval samples showed "—" in the Reference column, though its eval rows hold the
    completion it is taught to write. The engine records it, shown under a column that says so."""
    spec = {"task": "sft", "model": catalog.base_model.public_id, "data": {"train": catalog.sft.public_id},
            "train": {"max_steps": 4}}
    run = services.run_create(project=team.project, spec=spec, user=team.teammate, name="tune")
    reporting.sample_row(run, 2, 0, {"step": 2, "prompt": "Say hi", "text": "hello", "completion": "Hi <b>there</b>"}).save()
    page = client_for(team.viewer).get(url(run, "samples/") + "?step=2").content.decode()
    assert "<th>Reference (completion)</th>" in page
    assert '<td class="text muted">Hi &lt;b&gt;there&lt;/b&gt;</td>' in page


TINY_CONFIG = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
               "intermediate_size": 32, "vocab_size": 64}


def test_the_launch_check_and_the_run_page_estimate_the_memory_a_device_needs(team, catalog, client_for, sent_tasks):
    """QA: the launch form gave no idea of the memory a run would need, nor whether the workers' devices held
    it. The live check and the run page now say ``jaxengine.memory``'s estimate (tests/jaxengine/test_memory.py
    works it out by hand: 186,624 bytes for this spec on this model), and warn where it exceeds the smallest
    device of the pool's live train workers."""
    type(catalog.base_model).objects.filter(pk=catalog.base_model.pk).update(parameter_count=10_000, config=TINY_CONFIG)
    worker = make_pool_worker("train@small", pool="default",
                              devices={"platform": "gpu", "count": 1, "kinds": ["Tiny GPU"], "memory_bytes": 100_000})
    form = {"mode": "form", "task": "sft", "model": catalog.base_model.public_id, "data.train": catalog.sft.public_id,
            "train.max_steps": "3", "train.batch_size": "2", "data.max_seq_len": "8", "peft.method": "none",
            "peft.targets": ["q_proj"]}
    client = client_for(team.teammate)
    check = client.post("/p/alpha/runs/new/check/", form).json()
    assert check["errors"] == {}
    [memory] = check["memory"]
    assert memory.startswith("≈ 182 KiB per device for weights + optimizer + activations (weights 39.1 KiB, ")
    assert memory.endswith(": more than the 97.7 KiB of each Tiny GPU of pool default")
    assert [warning for warning in check["warnings"] if warning.startswith("memory: ")] == [
        f"memory: the run needs {memory.split(': more than')[0]}, more than the 97.7 KiB of each Tiny GPU of "
        "pool default; lower train.batch_size (and raise train.grad_accum to keep the batch), set train.remat, lower "
        "data.max_seq_len, or use peft.method lora or qlora"]
    # A device that holds it: no warning, and the estimate says it fits.
    worker.devices = {**worker.devices, "memory_bytes": 1024**3}
    worker.save()
    check = client.post("/p/alpha/runs/new/check/", form).json()
    assert not any(warning.startswith("memory: ") for warning in check["warnings"])
    assert check["memory"][0].endswith(": fits the 1 GiB of each Tiny GPU of pool default")
    response = client.post("/p/alpha/runs/new/", form)
    run = Run.objects.get(public_id=response["Location"].split("/")[-2])
    page = html.unescape(client.get(url(run)).content.decode())
    assert f'<dd id="memory-estimate">{check["memory"][0]} <span class="muted">(an estimate)</span></dd>' in page


def test_a_sweeps_memory_estimates_name_the_combinations_they_are_for(team, catalog, client_for):
    """Found launching a sweep over peft.rank from the form: its check listed two bare estimates ("Memory: ≈ 1.07
    MiB …", "Memory: ≈ 1.21 MiB …"), leaving the reader to guess which runs needed which. Combinations that need
    different amounts are named with their estimate; one estimate for every run stays bare, as for a single run."""
    type(catalog.base_model).objects.filter(pk=catalog.base_model.pk).update(parameter_count=10_000, config=TINY_CONFIG)
    form = {"mode": "form", "task": "sft", "model": catalog.base_model.public_id, "data.train": catalog.sft.public_id,
            "train.max_steps": "3", "train.batch_size": "2", "data.max_seq_len": "8", "peft.method": "lora",
            "peft.targets": ["q_proj"], "sweep": "optim.learning_rate: 1e-4, 1e-3\npeft.rank: 4, 8"}
    client = client_for(team.teammate)
    check = client.post("/p/alpha/runs/new/check/", form).json()
    assert check["errors"] == {}
    rank_4, rank_8 = check["memory"]
    assert rank_4.startswith("learning_rate=1e-4 rank=4; learning_rate=1e-3 rank=4: ≈ ")
    assert rank_8.startswith("learning_rate=1e-4 rank=8; learning_rate=1e-3 rank=8: ≈ ")
    single = client.post("/p/alpha/runs/new/check/", {**form, "sweep": "", "peft.rank": "8"}).json()["memory"]
    assert single == [rank_8.split(": ", 1)[1]]
    same = client.post("/p/alpha/runs/new/check/", {**form, "sweep": "optim.learning_rate: 1e-4, 1e-3"}).json()
    assert same["memory"] == [client.post("/p/alpha/runs/new/check/", {**form, "sweep": ""}).json()["memory"][0]]


def test_a_ppo_runs_memory_estimate_counts_its_reward_model(team, catalog, client_for, sent_tasks, tmp_path):
    """QA: a PPO run scoring with ppo.reward_model holds that whole model on a device, and the estimate left it
    out. The launch check and the run page now count it from the reward run's base model (10,000 float32
    parameters + a 16-wide head = 40,064 bytes, tests/jaxengine/test_memory.py)."""
    type(catalog.base_model).objects.filter(pk=catalog.base_model.pk).update(parameter_count=10_000, config=TINY_CONFIG)
    reward_spec = {"task": "reward", "model": catalog.base_model.public_id,
                   "data": {"train": catalog.preference.public_id}, "train": {"max_steps": 10, "batch_size": 2}}
    reward_run = services.run_create(project=team.project, spec=reward_spec, user=team.teammate)
    Run.objects.filter(pk=reward_run.pk).update(status=RunStatus.SUCCEEDED)
    Artifact.objects.create(run=reward_run, kind=ArtifactKind.MODEL, path=str(tmp_path / reward_run.public_id))
    spec = {"task": "ppo", "model": catalog.base_model.public_id, "data": {"train": catalog.prompts.public_id},
            "train": {"max_steps": 10, "batch_size": 2}, "ppo": {"reward_model": reward_run.public_id}}
    [memory] = services.launch_check(project=team.project, spec=spec, axes=[]).memory
    # Then the KL reference (kl_coef 0.04, full fine-tuning): a frozen copy of the 40,000 bytes of weights.
    assert ", reward model 39.1 KiB, KL reference 39.1 KiB)" in memory
    ppo_run = services.run_create(project=team.project, spec=spec, user=team.teammate)
    page = html.unescape(client_for(team.teammate).get(url(ppo_run)).content.decode())
    assert f'<dd id="memory-estimate">{memory} <span class="muted">(an estimate)</span></dd>' in page
    # The lookup is scoped: a reward run of another project is nobody's reward model here.
    written = {"task": "ppo", "ppo": {"reward_model": reward_run.public_id}}
    assert selectors.reward_base_model(project=team.project, spec=written) == catalog.base_model
    assert selectors.reward_base_model(project=team.outsider_project, spec=written) is None


def test_the_compare_page_reads_as_many_rows_for_six_runs_as_for_two(team, catalog, client_for, sent_tasks,
                                                                       django_assert_num_queries):
    """QA (page speed): the generations side by side read each run's last evaluated step and then its samples,
    two queries a run, so comparing a sweep's runs cost dozens of queries more than comparing two."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def finished_runs(indices: range) -> list[Run]:
        runs = []
        for index in indices:
            run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name=f"sweep {index}")
            MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=1.0 / step,
                                                         wall_time=float(step), tokens=step) for step in (1, 2)])
            for step in (1, 2):
                Sample.objects.bulk_create([Sample(run=run, step=step, position=position, prompt=f"prompt {position}",
                                                   text=f"{run.name} at {step}") for position in range(2)])
            Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=2,
                                                 series_cache=selectors.series_cache_for(run))
            runs.append(run)
        return runs

    client = client_for(team.viewer)

    def compare(runs: list[Run]):
        return client.get("/p/alpha/runs/compare/?" + "&".join(f"runs={run.public_id}" for run in runs))

    few, many = finished_runs(range(2)), finished_runs(range(2, 8))
    compare(few), compare(many)  # the pages' first loads over (series caches renewed, sessions read)
    with CaptureQueriesContext(connection) as for_two:
        page = compare(few).content.decode()
    assert "sweep 1 at 2" in page and "sweep 1 at 1" not in page  # each run at its last evaluated step
    with django_assert_num_queries(len(for_two)):
        page = compare(many).content.decode()
    assert all(f"sweep {index} at 2" in page for index in range(2, 8))


def test_the_run_page_reads_as_many_rows_for_three_datasets_as_for_one(team, catalog, client_for, sent_tasks,
                                                                        django_assert_num_queries):
    """QA (page speed): the run page read the run's dataset versions once for its history and once for its
    deleted references, then each version's dataset on its own: a query more for every version."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.webapp.factories import make_ready_version

    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="tuned")
    client = client_for(team.viewer)
    client.get(url(run))  # the first load over (series caches renewed, sessions read)
    with CaptureQueriesContext(connection) as for_one:
        page = client.get(url(run)).content.decode()
    assert f"<bdi>chats</bdi> v{catalog.sft.number}" in page
    run.dataset_versions.add(*(make_ready_version(team.project, name=f"extra {index}") for index in range(2)))
    with django_assert_num_queries(len(for_one)):
        page = client.get(url(run)).content.decode()
    assert "<bdi>extra 0</bdi> v1" in page and "<bdi>extra 1</bdi> v1" in page


def test_the_runs_table_leaves_each_runs_series_cache_unread(team, catalog, client_for, sent_tasks,
                                                              django_assert_num_queries):
    """QA (page speed): the runs table and the API's list of runs read every row's series_cache, the
    downsampled series a finished run keeps for its own page and the compare page (about a megabyte for ten
    metrics over 5,000 steps): at a busy team's 500 runs the table took 1.3 s and the API's page 3.7 s. Neither
    reads the column now, for the runs listed, the runs they started from or the pipelines' result runs, and
    neither reads it row by row."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from webapp.api.services import token_create

    def finished_runs(indices: range) -> None:
        for index in indices:
            run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name=f"done {index}")
            MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=1.0 / step,
                                                         wall_time=float(step), tokens=step) for step in (1, 2)])
            Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=2,
                                                 series_cache=selectors.series_cache_for(run))

    from django.test import Client

    page_client = client_for(team.viewer)
    api_client = Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=team.viewer, name='list')[1]}")
    addresses = ((page_client, "/p/alpha/runs/"), (api_client, "/api/v1/projects/alpha/runs/"))
    finished_runs(range(2))
    counts = []
    for client, address in addresses:
        client.get(address)  # the first load over (sessions read)
        with CaptureQueriesContext(connection) as queries:
            assert client.get(address).status_code == 200
        assert not [query["sql"] for query in queries.captured_queries if "series_cache" in query["sql"]]
        counts.append(len(queries))
    finished_runs(range(2, 6))
    for (client, address), count in zip(addresses, counts):
        with django_assert_num_queries(count):
            response = client.get(address)
        assert response.status_code == 200 and "done 5" in response.content.decode()


def test_the_launch_form_reads_only_the_labels_of_the_runs_it_offers_to_start_from(
        team, catalog, client_for, sent_tasks, django_assert_num_queries):
    """QA (page speed): the launch form's starting models (each succeeded run's exported model and every
    exported checkpoint) and PPO's reward models read each run's whole row, its series_cache with it (about a
    megabyte for a finished run): with a busy team's hundred exported runs the form took 11 s to open. It
    reads the run's id, name and task now, as many queries for six runs as for two."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def exported_runs(indices: range) -> None:
        for index in indices:
            run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner,
                                      name=f"exported {index}")
            MetricPoint.objects.create(run=run, step=1, name="loss", value=1.0, wall_time=1.0, tokens=1)
            Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=1,
                                                 series_cache=selectors.series_cache_for(run),
                                                 task="reward" if index % 2 else "sft")  # odd ones score
            Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=f"/models/{index}", size_bytes=1)
            Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=1, path=f"/checkpoints/{index}",
                                    size_bytes=1)

    client = client_for(team.teammate)
    exported_runs(range(2))
    client.get("/p/alpha/runs/new/?task=ppo")  # the first load over (sessions read)
    with CaptureQueriesContext(connection) as for_two:
        page = client.get("/p/alpha/runs/new/?task=ppo").content.decode()
    assert not [query["sql"] for query in for_two.captured_queries if "series_cache" in query["sql"]]
    assert f"{isolated('exported 1')} — reward model of" in page and f"{isolated('exported 0')} — checkpoint 1" in page
    exported_runs(range(2, 6))
    with django_assert_num_queries(len(for_two)):
        page = client.get("/p/alpha/runs/new/?task=ppo").content.decode()
    assert f"{isolated('exported 5')} — reward model of" in page and f"{isolated('exported 4')} — checkpoint 1" in page


def test_the_run_page_reads_the_runs_before_and_after_it_by_name_only(team, catalog, client_for, sent_tasks,
                                                                      django_assert_num_queries):
    """QA (page speed): the run page's lineage read the run it started from and every run started from it
    whole, each one's series_cache with it (most of a megabyte for a finished run): a run that a sweep of 16
    started from decoded 16 of them to print 16 names. Only the run's own series_cache is read now (its
    charts), and as many queries for six runs started from it as for two."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    cache = {"buckets": {"width": 1, "metrics": {}}, "max_points": 1000, "series": {}}
    source = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="base sft")
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="middle")
    Run.objects.filter(pk__in=[source.pk, run.pk]).update(status=RunStatus.SUCCEEDED, series_cache=cache)
    Run.objects.filter(pk=run.pk).update(source_run=source)

    def derived(indices: range) -> None:
        for index in indices:
            started = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner,
                                          name=f"sweep {index}")
            Run.objects.filter(pk=started.pk).update(source_run=run, series_cache=cache)

    client = client_for(team.viewer)
    derived(range(2))
    client.get(url(run))  # the first load over (series caches renewed, sessions read)
    with CaptureQueriesContext(connection) as for_two:
        page = client.get(url(run)).content.decode()
    assert sum(query["sql"].count('"series_cache"') for query in for_two.captured_queries) == 1  # the run's own
    assert "<bdi>base sft</bdi>" in page and "<bdi>sweep 1</bdi>" in page
    derived(range(2, 6))
    with django_assert_num_queries(len(for_two)):
        page = client.get(url(run)).content.decode()
    assert "<bdi>sweep 5</bdi>" in page


def _compared_running_runs(team, catalog, first: int, count: int) -> list[Run]:
    """Running runs of the three ways a compare page reads a live run's series, ``count`` of each: a short
    one (every point), a long one whose worker stored its buckets 200 steps ago (the buckets plus the points
    since), and one logged from elsewhere with no stored buckets and no current step (every point, reduced
    by the database). Their values differ run by run, so a series read under another run's id would show."""
    runs = []
    for index in range(first, first + count):
        for kind, steps in (("short", 3), ("long", 1200), ("external", 1100)):
            run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner,
                                      name=f"{kind} {index}")
            points = [MetricPoint(run=run, step=step, name=name, value=((step * 7919 + index * 31 + offset) % 101) / 7,
                                  wall_time=1000.0 * index + step, tokens=step * (index + 1))
                      for name, offset in (("loss", 0), ("learning_rate", 5)) for step in range(1, steps + 1)]
            MetricPoint.objects.bulk_create([point for point in points if point.step <= 1000])
            series_cache = {"buckets": selectors.series_buckets(run=run).to_json()} if kind == "long" else {}
            MetricPoint.objects.bulk_create([point for point in points if point.step > 1000])
            Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, current_step=0 if kind == "external" else steps,
                                                 series_cache=series_cache)
            runs.append(run)
    return runs


def test_the_compare_page_reads_running_runs_series_in_as_many_queries_for_six_as_for_three(
        team, catalog, client_for, sent_tasks, django_assert_num_queries):
    """Page speed: the compare page read each running run's series on its own (its points, or its stored
    buckets' tail and its extremes, or its last step), a few queries more for every run compared. It reads
    them together now, as many queries for six runs as for three, each run's series as it reads alone."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = client_for(team.viewer)

    def compare(runs: list[Run]) -> dict:
        page = client.get("/p/alpha/runs/compare/?" + "&".join(f"runs={run.public_id}" for run in runs)).content.decode()
        return compare_chart_data(page)

    few, many = _compared_running_runs(team, catalog, 0, 1), _compared_running_runs(team, catalog, 1, 2)
    compare(few), compare(many)  # the pages' first loads over (sessions read)
    with CaptureQueriesContext(connection) as for_three:
        compare(few)
    with django_assert_num_queries(len(for_three)):
        data = compare(many)
    for run in many:
        alone = selectors.metric_series(run=Run.objects.get(pk=run.pk), max_points=selectors.COMPARE_MAX_POINTS)
        assert drawn_series(data, run.public_id) == json.loads(json.dumps(alone)), run.name
    assert data["series"][many[1].public_id]["loss"]["downsampled"]
    assert len(drawn_series(data, many[0].public_id)["loss"]["step"]) == 3


def test_a_chat_template_variable_that_is_no_scalar_is_named_on_the_launch_form(team, catalog, client_for, sent_tasks):
    form = {"mode": "form", "task": "sft", "model": catalog.base_model.public_id, "data.train": catalog.sft.public_id,
            "train.max_steps": "5", "train.batch_size": "8", "peft.targets": ["q_proj", "v_proj"],
            "data.chat_template_kwargs": '{"enable_thinking": [false]}'}
    response = client_for(team.teammate).post("/p/alpha/runs/new/", form)
    assert response.status_code == 400
    page = response.content.decode()
    assert "<code>data.chat_template_kwargs.enable_thinking</code>: [False] is a list; give a JSON scalar" in page
    assert Run.objects.count() == 0
    form["data.chat_template_kwargs"] = '{"enable_thinking": false}'
    again = client_for(team.teammate).post("/p/alpha/runs/new/", form)
    assert again.status_code == 302, re.findall(r"<code>[^<]*</code>[^<]*", again.content.decode())
    assert Run.objects.get().spec["data"]["chat_template_kwargs"] == {"enable_thinking": False}


def test_counts_on_pages_have_their_thousands_separated(team, run, catalog, client_for):
    """"10838 rows" was hard to read: every count of rows, tokens and steps a page shows goes through |grouped."""
    from webapp.datasets.models import DatasetVersion

    DatasetVersion.objects.filter(pk=catalog.sft.pk).update(row_count=10838)
    Run.objects.filter(pk=run.pk).update(tokens_seen=1234567, current_step=1500, total_steps=12000)
    client = client_for(team.teammate)
    dataset = catalog.sft.dataset
    for address in ("/p/alpha/datasets/", f"/p/alpha/datasets/{dataset.public_id}/",
                    f"/p/alpha/datasets/{dataset.public_id}/v/{catalog.sft.number}/", "/p/alpha/"):
        page = client.get(address).content.decode()
        assert "10,838" in page and "10838" not in page, address
    for address in ("/p/alpha/runs/", url(run), "/p/alpha/"):
        page = client.get(address).content.decode()
        assert "1,500" in page and "12,000" in page and "12000<" not in page, address
    # The pickers' labels too: the launch form's data, the review forms' versions.
    DatasetVersion.objects.filter(pk=catalog.preference.pk).update(row_count=2500)
    assert "(sft, 10,838 rows)" in html.unescape(client.get("/p/alpha/runs/new/?task=sft").content.decode())
    owner = client_for(team.owner)
    assert "(2,500 rows)" in html.unescape(owner.get(reverse("review:create", args=["alpha"])).content.decode())
    assert "(sft, 10,838 rows)" in html.unescape(owner.get(reverse("review:generate", args=["alpha"])).content.decode())
    run_page = client.get(url(run)).content.decode()
    assert ">1,234,567<" in run_page
    assert 'aria-valuenow="1500"' in run_page  # an attribute read as a number keeps the bare one


def test_samples_are_numbered_from_1_as_dataset_rows_are(team, run, client_for):
    """The samples table numbered a step's generations from 0 while a dataset's preview numbers rows from 1: people
    read both, so both count from 1 (a sample's stored position stays 0-based, as the API and samples.jsonl give it)."""
    Sample.objects.create(run=run, step=5, position=1, prompt="second", text="two")
    page = client_for(team.viewer).get(url(run, "samples/") + "?step=5").content.decode()
    assert re.findall(r'<td class="num muted">(\d+)</td>', page) == ["1", "2"]


def test_a_resumed_attempt_says_it_is_starting_until_its_own_first_step(run, team, client_for):
    """A resumed attempt showed no "Starting: loading the model and compiling…" note (a fresh one did): its step is
    its checkpoint's, not 0. Until it reports a step of its own the page says it is starting, and Elapsed counts on
    from the earlier attempts' time; its first step's points end that."""
    from datetime import timedelta

    from django.utils import timezone

    started = timezone.now() - timedelta(seconds=20)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, current_step=5, train_seconds=100.0, attempt=2,
                                         started_at=started)
    client = client_for(team.viewer)
    page = client.get(url(run)).content.decode()
    assert re.search(r'<p class="muted" id="progress-starting">Starting: loading the model and compiling', page)
    progress = client.get(url(run, "state.json")).json()["progress"]
    assert progress["starting"] is True and 120 <= progress["elapsed"] < 140
    MetricPoint.objects.create(run=run, step=6, name="loss", value=1.0, wall_time=started.timestamp() + 25, tokens=400)
    Run.objects.filter(pk=run.pk).update(current_step=6, train_seconds=125.0)
    progress = client.get(url(run, "state.json")).json()["progress"]
    assert progress["starting"] is False and progress["elapsed"] == 125.0
    assert 'id="progress-starting" hidden' in client.get(url(run)).content.decode()


def test_an_external_run_before_its_first_point_is_not_said_to_be_compiling(team, client_for):
    """An external run (a process outside Temper reporting into it) showed "Starting: loading the model and
    compiling" until its first point: Temper loads and compiles nothing for it."""
    external = services.run_create_external(project=team.project, name="elsewhere", config={"lr": 0.1}, user=team.owner)
    client = client_for(team.viewer)
    assert client.get(url(external, "state.json")).json()["progress"]["starting"] is False
    assert 'id="progress-starting" hidden' in client.get(url(external)).content.decode()


def test_the_launch_form_opened_without_a_preset_marks_the_one_whose_values_it_holds(team, client_for):
    """QA: the launch form opened bare (the Runs page's Launch, a task tab) showed its task's first preset's values
    with no preset marked, as if they were nobody's; one named that no longer exists did the same. The preset whose
    values the form holds is marked, as when its link is clicked."""
    from webapp.runs.presets import presets_for

    client = client_for(team.teammate)
    marked = r'class="button active" aria-current="true" [^>]*data-preset="([^"]*)"'
    for task, query in (("sft", ""), ("dpo", "?task=dpo"), ("grpo", "?task=grpo&preset=gone")):
        first = presets_for(task)[0]
        page = client.get(f"/p/alpha/runs/new/{query}").content.decode()
        assert re.findall(marked, page) == [first["name"]], task


def test_the_launch_form_opened_on_the_demo_model_shows_the_demo_preset(team, catalog, client_for):
    """First run: the LoRA preset's learning rate, 2e-4 (right for models of 1 B parameters and more), moved the 2.6 M
    parameter demo model from a loss of 11.6 to only 9.5 in 30 steps. The form opened on the demo model (Getting
    started, its base model page) starts from the demo model's preset, whose values it shows; another model's form
    keeps the LoRA preset."""
    from webapp.basemodels.selectors import demo_model_dir
    from webapp.runs.presets import DEMO_PRESET, preset_spec

    demo = make_base_model(team.project, name="demo-base", path=str(demo_model_dir()))
    client = client_for(team.teammate)
    overview = client.get("/p/alpha/").content.decode()
    assert f'href="/p/alpha/runs/new/?model={demo.public_id}" id="launch-on-demo-model"' in overview
    page = client.get(f"/p/alpha/runs/new/?model={demo.public_id}").content.decode()
    chosen = preset_spec("sft", DEMO_PRESET)
    assert chosen["optim"]["learning_rate"] == 1e-3 and chosen["peft"] == {"method": "lora", "rank": 16, "alpha": 32}
    assert re.search(r'class="button active" aria-current="true" [^>]*data-preset="LoRA, demo model"', page)
    assert re.search(r'name="optim.learning_rate"[^>]*value="0.001"', page)
    assert re.search(r'name="peft.rank"[^>]*value="16"', page) and re.search(r'name="peft.alpha"[^>]*value="32"', page)
    assert re.search(r'name="train.max_steps"[^>]*value="200"', page)
    assert f'<option value="{demo.public_id}" selected' in page
    other = client.get(f"/p/alpha/runs/new/?model={catalog.base_model.public_id}").content.decode()
    assert re.search(r'name="optim.learning_rate"[^>]*value="0.0002"', other)
    assert re.findall(r'class="button active" aria-current="true" [^>]*data-preset="([^"]*)"', other) == ["LoRA"]

    # A run trained from the demo model is as small: its Launch a run from it (its model, or a checkpoint's) opens
    # the form on the demo preset too; the LoRA preset's 2e-4 went on at a fifth of the pace its first run had.
    demo_run = Run.objects.create(project=team.project, name="first", task="sft", status=RunStatus.SUCCEEDED,
                                  spec={"task": "sft", "model": demo.public_id}, resolved_spec={"output_dir": "/x"},
                                  base_model=demo, created_by=team.owner)
    demo_run.artifacts.create(kind="model", step=9, path="/x/export")
    demo_run.artifacts.create(kind="checkpoint", step=3, path="/x/export-step-3")
    for model in (demo_run.public_id, f"{demo_run.public_id}@3"):
        page = client.get(f"/p/alpha/runs/new/?model={model}&task=sft").content.decode()
        assert re.search(r'class="button active" aria-current="true" [^>]*data-preset="LoRA, demo model"', page), model
        assert re.search(r'name="optim.learning_rate"[^>]*value="0.001"', page)
        assert f'<option value="{model}" selected' in page


def test_the_runs_table_and_the_overview_show_a_tiny_loss_as_a_figure_not_zero(team, client_for):
    """QA (second first-use pass): a GRPO run's loss of 1.043e-07 read "0.0000" in the Runs table and on the
    project's page (four decimals), where the compare page read 1.043e-07; and a learning-rate-sized reward alike."""
    Run.objects.create(project=team.project, name="grpo", task="grpo", status=RunStatus.SUCCEEDED, spec={},
                       resolved_spec={}, final_metrics={"loss": {"last": 1.043e-07, "min": -5.215e-08},
                                                        "eval/loss": {"last": 2.5, "min": 2.25},
                                                        "reward": {"last": 0.375, "max": 0.000125}})
    table = client_for(team.viewer).get("/p/alpha/runs/").content.decode()
    assert "0.0000" not in table
    assert "1.043e-07 / -5.215e-08" in table and "2.5 / 2.25" in table and "0.375 / 0.000125" in table
    overview = client_for(team.viewer).get("/p/alpha/").content.decode()
    assert "1.043e-07" in overview and "0.0000" not in overview


def test_the_compare_page_reads_finished_runs_series_without_their_buckets_in_as_many_queries_for_eight_as_for_two(
        team, catalog, client_for, sent_tasks, django_assert_num_queries):
    """Page speed: a finished run's series cache is its buckets (three quarters of its JSON, about 1 MB for a run of
    8 metrics) and its series at the compare page's resolution. The page read and decoded every cache whole, 0.3 s
    of its 0.5 s for 8 such runs; it reads the series alone now, in one query for all (a cache of an older layout is
    written again first, as before), and draws what each run's own page would."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    runs = []
    for index in range(8):
        run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name=f"finished {index}")
        MetricPoint.objects.bulk_create([
            MetricPoint(run=run, step=step, name=name, value=((step * 7919 + index * 31 + offset) % 101) / 7,
                        wall_time=1000.0 * index + step, tokens=step * (index + 1))
            for name, offset in (("loss", 0), ("learning_rate", 5)) for step in range(1, 1501)])
        Run.objects.filter(pk=run.pk).update(current_step=1500)
        cache = selectors.series_cache_for(Run.objects.get(pk=run.pk))
        if index in (2, 5):  # cached in an older bucket layout: written again from the points on the first read
            cache = {**cache, "buckets": {**cache["buckets"], "layout": cache["buckets"]["layout"] - 1}}
        Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, series_cache=cache)
        runs.append(run)
    client = client_for(team.viewer)

    def compare(compared: list[Run]) -> dict:
        page = client.get("/p/alpha/runs/compare/?" + "&".join(f"runs={run.public_id}" for run in compared)).content.decode()
        return compare_chart_data(page)

    compare(runs[:2]), compare(runs)  # the pages' first loads over (sessions read, old caches written again)
    assert all(selectors.series_cache_current(run=Run.objects.get(pk=run.pk)) for run in runs)
    with CaptureQueriesContext(connection) as for_two:
        compare(runs[:2])
    with django_assert_num_queries(len(for_two)) as for_eight:
        data = compare(runs)
    whole_cache = re.compile(r'(SELECT|,)\s*"runs_run"\."series_cache"\s*(,|FROM)')  # the column, not a key of it
    assert not [query["sql"] for query in for_eight.captured_queries if whole_cache.search(query["sql"])]
    for run in runs:
        alone = selectors.metric_series(run=Run.objects.get(pk=run.pk), max_points=selectors.COMPARE_MAX_POINTS)
        assert drawn_series(data, run.public_id) == json.loads(json.dumps(alone)), run.name
        assert data["series"][run.public_id]["loss"]["downsampled"], run.name


def test_the_tag_filter_matches_a_tag_case_aside(team, catalog, client_for, sent_tasks):
    """A project spells each tag one way, case aside (migration 0025, ``services.run_tags_write``), but ``?tag=``
    matched the spelling exactly: ``?tag=Baseline`` missed the runs tagged "baseline", and its Compare link with them.
    It finds them, and the tag menu shows the project's spelling picked, so that filtering again keeps the tag."""
    first = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="first",
                                tags="baseline")
    second = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="second",
                                 tags="BASELINE")
    untagged = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="untagged")
    client = client_for(team.viewer)
    for typed in ("Baseline", "BASELINE", "baseline"):
        page = client.get("/p/alpha/runs/", {"tag": typed}).content.decode()
        assert first.public_id in page and second.public_id in page and untagged.public_id not in page, typed
        assert "<option selected>baseline</option>" in page, typed
        assert f"Compare the 2 runs tagged {typed}</a>" in page, typed
    assert selectors.sweep_runs(project=team.project, tag="Baseline") == [first, second]
    assert selectors.sweep_runs(project=team.outsider_project, tag="Baseline") == []


def test_the_404_page_shows_the_views_message_escaped(team, run, client_for, settings):
    """Views raise Http404 saying what is missing and what to do ("'x' is not a kind of artifact; download model,
    adapter, or checkpoint?step=N"), but the 404 page dropped it for its one general sentence. It shows the message,
    as text (a part of the address the message repeats is no markup), under DEBUG off as served; an address no view
    answers, which carries no message, keeps the general page."""
    settings.DEBUG = False
    client = client_for(team.viewer)
    response = client.get(url(run, "artifacts/<b>bold/"))
    page = response.content.decode()
    assert response.status_code == 404
    assert f"&#x27;{FSI}&lt;b&gt;bold{PDI}&#x27; is not a kind of artifact; download model, adapter, or " in page
    assert "<b>bold" not in page
    page = client.get("/p/alpha/runs/run_missing/").content.decode()
    assert ("<p>No such run in this project: if it was deleted, the project&#x27;s activity log says who deleted it "
            "and when (its Activity page, /p/alpha/activity/, or GET /api/v1/projects/alpha/activity/?kind=run&amp;"
            "action=deleted)</p>") in page
    page = client.get("/p/alpha/no-such-page/").content.decode()
    assert "<h1>Not found</h1>" in page and "Resolver404" not in page and "tried" not in page


def test_a_dataset_versions_launch_link_starts_from_the_projects_only_model(team, client_for, sent_tasks):
    """First-hour walk: the demo dataset version's "Launch an sft run on it" opened the form with Model blank, though
    the demo base model was the only model a run could start from, and Launch refused ("model: choose a starting
    model"). The only model is chosen (with the demo preset, as its own Launch link gives); with several the field
    stays blank and says a choice is wanted."""
    from webapp.basemodels.selectors import demo_model_dir

    demo_model_dir().mkdir(parents=True)  # the folder the demo model was registered from is there, as it is in use
    demo = make_base_model(team.project, name="demo-base", path=str(demo_model_dir()))
    chats = make_ready_version(team.project, name="chats", kind="sft")
    client = client_for(team.teammate)
    page = client.get(f"/p/alpha/runs/new/?task=sft&data={chats.public_id}").content.decode()
    assert re.search(rf'<option value="{demo.public_id}"[^>]* selected>', page)
    assert re.search(r'class="button active" aria-current="true" [^>]*data-preset="LoRA, demo model"', page)
    assert "choose the one to start from" not in page

    other = make_base_model(team.project, name="other")
    page = client.get(f"/p/alpha/runs/new/?task=sft&data={chats.public_id}").content.decode()
    assert not re.search(r'<option value="(bm_[^"]*)"[^>]* selected>', page)
    assert "2 models: choose the one to start from." in page
    assert other.public_id in page
