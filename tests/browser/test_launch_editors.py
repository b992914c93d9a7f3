"""The launch page's two editors, the schema-built form and the YAML view, in a browser: what is typed
in one is there when switching to the other, and a launch from either runs it."""
from __future__ import annotations

import pytest

from tests.browser.test_projects import log_in
from tests.browser.test_runs import fill_launch_form, launch
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.runs.models import Run

pytestmark = pytest.mark.browser


def test_switching_editors_keeps_what_was_typed_and_launches_it(page, live_server, monkeypatch):
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)  # queued, not trained
    team = make_team()
    base_model = make_base_model(team.project, name="tiny")
    chats = make_ready_version(team.project, name="chats", kind="sft")
    prefs = make_ready_version(team.project, name="prefs", kind="preference",
                               rows=[{"prompt": "p", "chosen": "c", "rejected": "r"}] * 4)
    log_in(page, live_server.url, team.teammate.username)

    fill_launch_form(page, live_server.url, project="alpha", task="sft", model=base_model, data=chats,
                     name="typed in the form", fields={"#spec-optim-learning_rate": "0.003", "#spec-train-max_steps": "7"})
    page.get_by_role("link", name="YAML (advanced)").click()
    page.locator("#yaml-form").wait_for()
    assert page.locator("#launch-form").is_hidden()
    yaml_text = page.locator("#id_spec_yaml").input_value()
    assert f"model: {base_model.public_id}" in yaml_text and f"train: {chats.public_id}" in yaml_text
    assert "learning_rate: 0.003\n" in yaml_text and "max_steps: 7\n" in yaml_text
    assert page.locator("#id_yaml_name").input_value() == "typed in the form"

    # Edited in YAML (another task, too), back in the form.
    yaml_text = (yaml_text.replace("task: sft", "task: dpo").replace(chats.public_id, prefs.public_id)
                 .replace("learning_rate: 0.003", "learning_rate: 0.0005").replace("  eval_samples: 16\n", "")
                 .replace("  sample_max_new_tokens: 64\n", ""))
    page.fill("#id_spec_yaml", yaml_text)
    page.fill("#id_yaml_name", "typed in YAML")
    page.get_by_role("link", name="Form", exact=True).click()
    page.locator("#launch-form").wait_for()
    assert page.locator("#yaml-form").is_hidden()
    assert page.locator("nav.tabs a.active[data-task]").inner_text() == "dpo"
    assert page.locator("#id_name").input_value() == "typed in YAML"
    assert page.locator("#spec-data-train").input_value() == prefs.public_id
    assert page.locator("#spec-optim-learning_rate").input_value() == "0.0005"
    assert page.locator("#spec-train-max_steps").input_value() == "7"
    assert Run.objects.count() == 0  # switching launches nothing

    launch(page)
    run = Run.objects.get()
    assert (run.name, run.task, run.spec["optim"]["learning_rate"], run.spec["train"]["max_steps"]) == (
        "typed in YAML", "dpo", 0.0005, 7)


def test_a_refused_launch_puts_the_keyboard_on_its_problems(page, live_server):
    """Launched from the keyboard (Enter in the name field) with no data chosen, the page came back
    with the problems listed above the form, but the focus at the top of the page: some thirty Tabs
    through the navigation, tabs and presets before a field, and nothing read the problems out first."""
    team = make_team()
    make_base_model(team.project, name="tiny")
    log_in(page, live_server.url, team.teammate.username)

    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    page.focus("#id_name")
    page.keyboard.type("from the keyboard")
    page.keyboard.press("Enter")
    page.locator("#launch-errors").wait_for()
    assert page.evaluate("() => document.activeElement.id") == "launch-errors"
    # The project's only model is chosen for it (test_views' only_model test): no data is what is refused.
    assert "data.train: choose a ready dataset version" in page.locator("#launch-errors").inner_text()
    for _ in range(3):  # the editor tabs, then the form's first field
        page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.id") == "id_name"
    assert page.locator("#id_name").input_value() == "from the keyboard"


def test_a_switch_from_the_keyboard_keeps_the_keyboard_where_it_was(page, live_server):
    """QA: Enter on the YAML tab, a task tab or a preset loads the page again (the server carries what was
    typed), and the focus was back at the top of the page: some thirty Tabs from the editor, every switch."""
    team = make_team()
    make_base_model(team.project, name="tiny")
    log_in(page, live_server.url, team.teammate.username)

    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    page.focus('nav.tabs a[data-mode="yaml"]')
    page.keyboard.press("Enter")
    page.locator("#yaml-form").wait_for()
    assert page.evaluate("() => document.activeElement.dataset.mode") == "yaml"
    page.focus('nav.tabs a[data-mode="form"]')
    page.keyboard.press("Enter")
    page.locator("#launch-form").wait_for()
    assert page.evaluate("() => document.activeElement.dataset.mode") == "form"
    # A task or a preset: on the notice that says what was kept, the editor a Tab or two on.
    page.focus('nav.tabs a[data-task="dpo"]')
    page.keyboard.press("Enter")
    page.locator("#task-switched").wait_for()
    assert page.evaluate("() => document.activeElement.id") == "task-switched"
    page.focus('.presets a[data-preset="SimPO"]')
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('#task-switched').innerText.includes('SimPO')")
    assert page.evaluate("() => document.activeElement.id") == "task-switched"
    # A page loaded afresh starts at the top as usual.
    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    assert page.evaluate("() => document.activeElement.tagName") == "BODY"


def test_switching_task_keeps_what_was_changed_in_either_editor_and_launches_it(page, live_server, monkeypatch):
    """The task tabs were links: choosing DPO after filling in the SFT form gave an empty DPO form."""
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)  # queued, not trained
    team = make_team()
    base_model = make_base_model(team.project, name="tiny")
    make_ready_version(team.project, name="chats", kind="sft")
    prefs = make_ready_version(team.project, name="prefs", kind="preference",
                               rows=[{"prompt": "p", "chosen": "c", "rejected": "r"}] * 4)
    log_in(page, live_server.url, team.teammate.username)

    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    page.fill("#id_name", "picked on sft")
    page.select_option("#spec-model", base_model.public_id)
    page.fill("#spec-optim-learning_rate", "0.003")
    page.fill("#spec-peft-rank", "4")
    page.locator("nav.tabs a[data-task=dpo]").click()
    page.locator("#task-switched").wait_for()
    assert page.locator("nav.tabs a.active[data-task]").inner_text() == "dpo"
    assert page.locator("#id_name").input_value() == "picked on sft"
    assert page.locator("#spec-model").input_value() == base_model.public_id
    assert page.locator("#spec-optim-learning_rate").input_value() == "0.003"
    assert page.locator("#spec-peft-rank").input_value() == "4"
    assert page.locator("#spec-dpo-beta").input_value() == "0.1"  # the DPO preset, for what was not changed
    notice = page.locator("#task-switched").inner_text()
    assert "Switched from sft to dpo" in notice and "model, optim.learning_rate, peft.rank" in notice
    # The switch was a GET (a POST left ?task=sft in the address, and a reload sent the form again): the address
    # holds the page, without the tokens that guard a launch, so reloading it shows it again and back goes back.
    assert "task=dpo" in page.url and "from_task=sft" in page.url
    assert "csrfmiddlewaretoken" not in page.url and "submission_token" not in page.url
    page.reload()
    assert page.locator("nav.tabs a.active[data-task]").inner_text() == "dpo"
    assert page.locator("#spec-optim-learning_rate").input_value() == "0.003"
    assert "Switched from sft to dpo" in page.locator("#task-switched").inner_text()
    page.go_back()
    page.locator("nav.tabs a.active[data-task=sft]").wait_for()
    page.go_forward()
    page.locator("nav.tabs a.active[data-task=dpo]").wait_for()

    # In the YAML editor: a changed key goes along to GRPO and back, and a launch runs it.
    page.get_by_role("link", name="YAML (advanced)").click()
    page.locator("#yaml-form").wait_for()
    page.fill("#id_spec_yaml", page.locator("#id_spec_yaml").input_value().replace("warmup_steps: 10", "warmup_steps: 3"))
    page.locator("nav.tabs a[data-task=grpo]").click()
    page.locator("#task-switched").wait_for()
    assert page.locator("#yaml-form").is_visible()
    yaml_text = page.locator("#id_spec_yaml").input_value()
    assert "task: grpo\n" in yaml_text and "warmup_steps: 3\n" in yaml_text and "num_generations: 8\n" in yaml_text
    # A spec too long for an address (a long comment here) switches as a form, still keeping what was changed.
    page.fill("#id_spec_yaml", page.locator("#id_spec_yaml").input_value() + "# " + "x" * 7000 + "\n")
    page.locator("nav.tabs a[data-task=dpo]").click()
    page.locator("#task-switched", has_text="from grpo to dpo").wait_for()
    assert "xxxx" not in page.url and "warmup_steps: 3\n" in page.locator("#id_spec_yaml").input_value()
    # The address is the page's, not the grpo page's of the switch before (where the form was posted to).
    assert page.url.endswith("/p/alpha/runs/new/?task=dpo"), page.url
    page.fill("#id_spec_yaml", page.locator("#id_spec_yaml").input_value().replace("train: dv_…", f"train: {prefs.public_id}"))
    page.locator("#yaml-form button[type=submit]").click()
    page.wait_for_url("**/runs/run_*/")
    run = Run.objects.get()
    assert (run.name, run.task, run.spec["optim"]["warmup_steps"], run.spec["model"]) == (
        "picked on sft", "dpo", 3, base_model.public_id)


def test_choosing_a_preset_keeps_the_model_data_and_name_picked(page, live_server, monkeypatch):
    """The presets were links: choosing QLoRA after picking the model and data and naming the run gave
    the bare QLoRA page, with nothing picked left."""
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)  # queued, not trained
    team = make_team()
    base_model = make_base_model(team.project, name="tiny")
    chats = make_ready_version(team.project, name="chats", kind="sft")
    log_in(page, live_server.url, team.teammate.username)

    fill_launch_form(page, live_server.url, project="alpha", task="sft", model=base_model, data=chats,
                     name="picked before the preset", fields={"#spec-train-max_steps": "7"})
    page.locator(".presets a[data-preset=QLoRA]").click()
    page.locator("#task-switched", has_text="Applied the preset QLoRA").wait_for()
    assert page.locator(".presets a.active").inner_text() == "QLoRA"
    assert page.locator("#spec-peft-method").input_value() == "qlora"
    assert page.locator("#id_name").input_value() == "picked before the preset"
    assert page.locator("#spec-model").input_value() == base_model.public_id
    assert page.locator("#spec-data-train").input_value() == chats.public_id
    assert page.locator("#spec-train-max_steps").input_value() == "7"
    assert "preset=QLoRA" in page.url and "task=sft" in page.url  # a GET: the address is the page's
    assert Run.objects.count() == 0  # choosing a preset launches nothing
    launch(page)
    run = Run.objects.get()
    assert (run.name, run.spec["peft"]["method"], run.spec["train"]["max_steps"]) == ("picked before the preset", "qlora", 7)


def test_a_sweep_typed_in_the_form_launches_a_run_per_combination_listed_together(page, live_server, monkeypatch):
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)  # queued, not trained
    team = make_team()
    base_model = make_base_model(team.project, name="tiny")
    chats = make_ready_version(team.project, name="chats", kind="sft")
    log_in(page, live_server.url, team.teammate.username)

    fill_launch_form(page, live_server.url, project="alpha", task="sft", model=base_model, data=chats, name="sweep",
                     fields={"#spec-train-max_steps": "5", "#id_sweep": "optim.learning_rate: 1e-4, 1e-3\npeft.rank: 8, 16"})
    page.locator("#launch-form button[type=submit]").click()
    page.wait_for_url("**/runs/?tag=sweep-*&sort=oldest")

    names = [f"sweep · learning_rate={lr} rank={rank}" for lr in ("1e-4", "1e-3") for rank in (8, 16)]
    assert page.locator(".runs-table tbody tr td:nth-child(2) a").all_inner_texts() == names
    tag = Run.objects.order_by("id").first().tags[0]
    assert f"Sweep {tag}: 4 runs queued." in page.locator("main").inner_text()
    assert page.locator(".runs-table tbody tr").count() == Run.objects.filter(tags__icontains=tag).count() == 4


def test_the_form_says_what_a_launch_would_refuse_or_warn_of_as_it_is_filled_in(page, live_server):
    """The warmup and evaluation warnings were shown only on the run page, after the launch; a refused
    value only after pressing Launch. The form now asks the server's launch checks as it is edited."""
    team = make_team()
    base_model = make_base_model(team.project, name="tiny")
    chats = make_ready_version(team.project, name="chats", kind="sft")
    # Rows of its own: rows also in data.train are warned of (tests/webapp/runs/test_views.py).
    held_out = make_ready_version(team.project, name="held-out", kind="sft",
                                  rows=[{"prompt": f"held-out q{i}", "completion": f"answer {i}"} for i in range(4)])
    sharing = make_ready_version(team.project, name="sharing", kind="sft",
                                 rows=[{"prompt": "q3", "completion": "answer 3"}, {"prompt": "own", "completion": "x"}])
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")  # the LoRA preset: 200 steps, eval every 50
    check = page.locator("#launch-check-form")
    assert check.is_hidden(), "nothing is said before anything is typed"

    page.select_option("#spec-model", base_model.public_id)
    page.wait_for_function("() => document.querySelector('#launch-check-form').classList.contains('refused')")
    assert check.locator("li").all_inner_texts() == ["data.train: choose a ready dataset version (dv_…) of kind sft"]

    page.select_option("#spec-data-train", chats.public_id)
    page.wait_for_function("() => document.querySelector('#launch-check-form').classList.contains('warned')")
    assert check.locator("p").inner_text() == "Ready to launch, with a warning:"
    assert check.locator("li").inner_text().startswith("train.eval_every: 50 evaluates nothing")

    page.select_option("#spec-data-eval", chats.public_id)  # the training data itself
    page.wait_for_function("() => document.querySelector('#launch-check-form li').innerText.startsWith('data.eval')")
    assert check.locator("li").inner_text().startswith("data.eval: the same data as data.train")

    # Rows data.train holds too: the warning links to where they are removed from it.
    page.select_option("#spec-data-eval", sharing.public_id)
    page.wait_for_function("() => document.querySelector('#launch-check-form a.warning-action') !== null")
    action = check.locator("li a.warning-action")
    assert action.inner_text() == "Remove them from chats v1"
    assert action.get_attribute("href") == (f"/p/alpha/datasets/{chats.dataset.public_id}/v/1/?derive=decontaminate"
                                            f"&against={sharing.public_id}#remove-shared")

    page.select_option("#spec-data-eval", held_out.public_id)
    page.wait_for_function("() => document.querySelector('#launch-check-form').classList.contains('ready')")
    assert check.inner_text() == "Ready to launch."

    page.fill("#spec-optim-warmup_steps", "200")
    page.wait_for_function("() => document.querySelector('#launch-check-form').classList.contains('warned')")
    assert check.locator("li").inner_text().startswith("optim.warmup_steps: 200 is not below the run's 200 optimizer steps")

    page.fill("#spec-optim-learning_rate", "<b>fast</b>")  # typed text comes back as text
    page.wait_for_function("() => document.querySelector('#launch-check-form').classList.contains('refused')")
    assert check.locator("li").all_inner_texts() == ["optim.learning_rate: '<b>fast</b>': input should be a valid number"]
    assert check.locator("b").count() == 0
    assert Run.objects.count() == 0


def test_the_live_check_says_an_old_versions_turn_splits_are_being_counted_then_how_many(page, live_server, monkeypatch,
                                                                                          tmp_path):
    """The live check counted the turn splits of a version validated before they were counted in its request (one
    pass over the whole file, each check). It queues the count and says it is counting; the page asks again by
    itself, and says how many once the worker has stored the count, with nothing edited meanwhile."""
    from pathlib import Path

    from tests.factories import build_bpe_tokenizer_dir
    from worker.tasks.datasets import count_turn_splits

    sent = []
    monkeypatch.setattr("webapp.celery.app.send_task", lambda name, args=None, **kwargs: sent.append((name, tuple(args))))
    team = make_team()
    template = (Path(__file__).parents[1] / "jaxengine" / "tokenizer" / "real_templates" / "qwen3.jinja").read_text(
        encoding="utf-8")
    qwen3 = make_base_model(team.project, name="qwen3", path=str(build_bpe_tokenizer_dir(tmp_path / "qwen3",
                                                                                       chat_template=template)))

    def chat(*texts):
        return {"messages": [{"role": ("user", "assistant")[index % 2], "content": text}
                             for index, text in enumerate(texts)]}

    # Made as validation made versions before it counted turn splits: none in its statistics.
    old = make_ready_version(team.project, name="turns", kind="sft", rows=[chat("2+2?", "4", "3+3?", "6"), chat("Hi", "Hello")])
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    page.select_option("#spec-model", qwen3.public_id)
    page.select_option("#spec-data-train", old.public_id)
    page.wait_for_function("() => (document.querySelector('#launch-check-form').innerText || '').includes('counting those of')")
    assert sent == [("worker.tasks.datasets.count_turn_splits", (old.pk,))]
    count_turn_splits(old.pk)  # the default queue's worker
    page.wait_for_function("() => document.querySelector('#launch-check-form').innerText.includes("
                           "'1 conversation of the 2 rows')", timeout=10_000)
    assert "counting those of" not in page.locator("#launch-check-form").inner_text()
    assert len(sent) == 1


def test_the_live_check_says_the_memory_a_device_would_need(page, live_server):
    """QA: the launch form offered no estimate of memory: the live check now says ``jaxengine.memory``'s, and
    warns where the pool's devices are smaller."""
    from tests.webapp.runs.conftest import make_pool_worker
    from webapp.basemodels.models import BaseModel

    team = make_team()
    base_model = make_base_model(team.project, name="tiny")
    BaseModel.objects.filter(pk=base_model.pk).update(parameter_count=10_000, config={
        "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "intermediate_size": 32, "vocab_size": 64})
    make_pool_worker("train@small", pool="default",
                     devices={"platform": "gpu", "count": 1, "kinds": ["Tiny GPU"], "memory_bytes": 1_000})
    chats = make_ready_version(team.project, name="chats", kind="sft")
    log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    page.select_option("#spec-model", base_model.public_id)
    page.select_option("#spec-data-train", chats.public_id)
    check = page.locator("#launch-check-form")
    check.locator(".memory-estimate").wait_for(timeout=10_000)
    assert check.locator(".memory-estimate").inner_text().startswith(
        "Memory: ≈ ") and " per device for weights + optimizer + activations" in check.inner_text()
    assert any(item.startswith("memory: the run needs ≈ ") for item in check.locator("li").all_inner_texts())


def test_max_seq_len_follows_the_chosen_models_context_until_typed_in(page, live_server, tmp_path):
    """data.max_seq_len started at 512 whatever the model: on a model of 256 positions the launch was refused.
    Choosing a model says its limit at the field and starts the field within it; once someone types in the
    field, choosing another model leaves their value (the live check names it if it is too long)."""
    import json

    from tests.webapp.factories import write_model_dir

    team = make_team()
    short_dir = write_model_dir(tmp_path / "short")  # max_position_embeddings 256
    long_dir = write_model_dir(tmp_path / "long")
    config = json.loads((long_dir / "config.json").read_text())
    (long_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    short = make_base_model(team.project, name="short", path=str(short_dir))
    long = make_base_model(team.project, name="long", path=str(long_dir))
    log_in(page, live_server.url, team.teammate.username)

    page.goto(f"{live_server.url}/p/alpha/runs/new/?task=sft")
    field, limit = page.locator("#spec-data-max_seq_len"), page.locator("#spec-data-max_seq_len-help .model-limit")
    assert field.input_value() == "512" and limit.inner_text() == ""
    page.select_option("#spec-model", short.public_id)
    assert field.input_value() == "256" and limit.inner_text() == "At most 256: the model's context."
    page.select_option("#spec-model", long.public_id)
    assert field.input_value() == "512" and limit.inner_text() == "At most 4096: the model's context."
    field.fill("2048")
    page.select_option("#spec-model", short.public_id)
    assert field.input_value() == "2048" and limit.inner_text() == "At most 256: the model's context."
