"""The model card's text from hand-written facts (``jaxengine.model_card.build_model_card``, a pure function), and the
results it reads from a run's metrics records."""
from __future__ import annotations

import re

import markdown
import pytest
import yaml

from jaxengine.model_card import (build_model_card, evaluated_on_training_data, format_number, inline_text, results_at,
                                  with_serving_copy)

HOSTILE = "chats\n---\n# <script>alert(1)</script> | [x](javascript:alert(1)) *bold*"


def lora_spec(**overrides):
    spec = {
        "task": "dpo", "model": "/models/base", "output_dir": "/runs/r1",
        "data": {"train": "/data/train.jsonl", "eval": "/data/eval.jsonl", "max_seq_len": 1024},
        "peft": {"method": "lora", "rank": 16, "alpha": 32.0, "dropout": 0.05, "targets": ["q_proj", "v_proj"]},
        "optim": {"learning_rate": 2e-05, "schedule": "cosine", "warmup_steps": 10},
        "train": {"max_steps": 1200, "epochs": None, "batch_size": 8, "grad_accum": 4, "seed": 7,
                  "param_dtype": "bfloat16", "compute_dtype": "auto"},
        "dpo": {"beta": 0.25, "loss": "ipo", "label_smoothing": 0.0},
    }
    return {**spec, **overrides}


def facts(**overrides):
    return {
        "kind": "merged", "spec": lora_spec(), "base_model": "Qwen/Qwen3-0.6B", "step": 1200,
        "train_metrics": {"step": 1200, "loss": 0.123456, "grad_norm": 1.5, "learning_rate": 2e-05},
        "eval_metrics": {"step": 1200, "eval/loss": 0.4567, "eval/accuracy": 0.75},
        "best": {"metric": "eval/loss", "step": 1000, "value": 0.41},
        "tokens_trained": 12345678,
        "data": {"train": {"rows": 5000, "truncated": 3, "dropped": 1}, "eval": {"rows": 200}},
        "provenance": {"project": "Team <b>A</b>", "run_name": "dpo | beta sweep", "run_id": "run_abc123",
                       "author": "ada", "temper_version": "0.1.0",
                       "datasets": [{"use": "train", "name": "prefs", "version": 3, "id": "dv_1", "rows": 5000},
                                    {"use": "eval", "name": "held out", "version": 1, "id": "dv_2", "rows": 200}]},
        "engine_version": "0.1.0", "exported_at": "2026-12-07T10:00:00+00:00",
        **overrides,
    }


def split_card(card: str) -> tuple[dict, str]:
    match = re.fullmatch(r"---\n(.*?)\n---\n\n(.*)", card, flags=re.DOTALL)
    assert match, card[:200]
    return yaml.safe_load(match.group(1)), match.group(2)


def sections(body: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", body, flags=re.MULTILINE)
    return {parts[index]: parts[index + 1] for index in range(1, len(parts), 2)}


def test_it_writes_front_matter_and_every_section_in_order():
    meta, body = split_card(build_model_card(facts()))
    assert meta == {"library_name": "transformers", "base_model": "Qwen/Qwen3-0.6B", "tags": ["temper", "dpo", "lora"],
                    "pipeline_tag": "text-generation", "model_name": "dpo | beta sweep"}
    assert list(sections(body)) == ["Intended use and limitations", "Licence", "Training", "Data", "Results",
                                    "Serving copy", "How to use", "Provenance"]
    assert body.startswith("# dpo \\| beta sweep\n\nA model post-trained from `Qwen/Qwen3-0.6B` with Temper by the run "
                           "dpo \\| beta sweep: dpo by LoRA, checkpoint of step 1,200.\n")


def test_training_lists_the_method_the_schedule_and_the_tasks_knobs_with_numbers_formatted():
    training = sections(split_card(build_model_card(facts()))[1])["Training"]
    for row in ("| method | lora |", "| LoRA rank | 16 |", "| LoRA alpha | 32 |", "| LoRA targets | q\\_proj, v\\_proj |",
                "| LoRA dropout | 0.05 |", "| steps | 1,200 |", "| learning rate | 2e-05 |",
                "| schedule | cosine after 10 warmup steps |", "| batch size | 8 (× 4 accumulated) |",
                "| sequence length | 1,024 |", "| dtype | weights bfloat16, compute auto (bfloat16 on accelerators, float32 on CPU) |", "| seed | 7 |",
                "| dpo.beta | 0.25 |", "| dpo.loss | ipo |", "| dpo.label\\_smoothing | 0 |"):
        assert row in training, row
    assert "epochs" not in training  # not set: max_steps was


def test_a_full_fine_tune_is_tagged_full_and_says_so():
    card = build_model_card(facts(spec=lora_spec(task="sft", peft={"method": "none"}, dpo=None)))
    meta, body = split_card(card)
    assert meta["tags"] == ["temper", "sft", "full"]
    assert "| method | full fine-tuning (every weight trained) |" in body and "LoRA" not in sections(body)["Training"]
    assert "dpo." not in body


def test_an_adapter_card_says_peft_and_loads_with_peft():
    meta, body = split_card(build_model_card(facts(kind="adapter")))
    assert meta["library_name"] == "peft" and meta["tags"] == ["temper", "dpo", "lora"]
    assert "AutoPeftModelForCausalLM.from_pretrained" in sections(body)["How to use"]


def test_base_model_is_left_out_when_not_a_hub_id():
    meta, body = split_card(build_model_card(facts(base_model=None)))
    assert "base_model" not in meta and "from `" not in body


def test_data_results_and_provenance_carry_their_figures():
    parts = sections(split_card(build_model_card(facts()))[1])
    assert "- train: prefs, version 3 (`dv_1`), 5,000 rows" in parts["Data"]
    assert "- eval: held out, version 1 (`dv_2`), 200 rows" in parts["Data"]
    assert "- train: 3 rows cut to the sequence length, 1 left out" in parts["Data"]
    assert "- tokens trained: 12,345,678" in parts["Data"]
    results = parts["Results"]
    assert "Training metrics at step 1,200:" in results and "| loss | 0.1235 |" in results
    assert "| grad\\_norm | 1.5 |" in results and "Evaluation at step 1,200:" in results
    assert "| eval/loss | 0.4567 |" in results and "| eval/accuracy | 0.75 |" in results
    assert "Best step by eval/loss: 1,000, 0.41." in results
    assert "No serving copy has been made of this export." in parts["Serving copy"]
    provenance = parts["Provenance"]
    for line in ("- project: Team &lt;b&gt;A&lt;/b&gt;", "- run: dpo \\| beta sweep (`run_abc123`)",
                 "- launched by: ada", "- Temper version: 0.1.0", "- exported: 2026-12-07T10:00:00+00:00",
                 "- exported step: 1,200"):
        assert line in provenance, line


def test_without_the_web_apps_provenance_the_data_is_named_by_its_files():
    card = build_model_card(facts(provenance={}))
    meta, body = split_card(card)
    assert "model_name" not in meta and body.startswith("# Temper model\n")
    data = sections(body)["Data"]
    assert "- train: train.jsonl, 5,000 rows" in data and "- eval: eval.jsonl, 200 rows" in data
    assert "- Temper version: 0.1.0" in sections(body)["Provenance"]


def test_an_earlier_evaluation_says_so_and_a_run_with_no_metrics_says_that():
    results = sections(split_card(build_model_card(facts(eval_metrics={"step": 900, "eval/loss": 0.5})))[1])["Results"]
    assert "Evaluation at step 900 (the last before step 1,200):" in results
    empty = build_model_card(facts(train_metrics={}, eval_metrics={}, best=None))
    assert "No metrics were recorded." in sections(split_card(empty)[1])["Results"]


def test_hostile_names_stay_text_in_the_markdown_and_the_yaml():
    hostile = facts(provenance={**facts()["provenance"], "run_name": HOSTILE, "author": HOSTILE, "project": HOSTILE,
                                "datasets": [{"use": "train", "name": HOSTILE, "version": 1, "id": "dv_1",
                                              "rows": 10}]})
    card = build_model_card(hostile)
    meta, body = split_card(card)
    assert meta["model_name"] == " ".join(HOSTILE.split())  # one line, read back as written
    assert card.count("\n---\n") == 1 and "<script>" not in body  # the YAML holds it as a quoted string
    assert list(sections(body)) == ["Intended use and limitations", "Licence", "Training", "Data", "Results",
                                    "Serving copy", "How to use", "Provenance"]
    assert [line for line in body.splitlines() if line.startswith("# ")] == [f"# {inline_text(HOSTILE)}"]
    html = markdown.markdown(body, extensions=["tables"])  # as the run page's renderer reads it
    assert "<script>" not in html and "<a " not in html and "<strong>" not in html and html.count("<h1>") == 1
    data_line = next(line for line in body.splitlines() if line.startswith("- train:") and "version" in line)
    assert markdown.markdown(data_line, extensions=["tables"]) == (
        "<ul>\n<li>train: chats --- # &lt;script&gt;alert(1)&lt;/script&gt; | [x](javascript:alert(1)) *bold*, "
        "version 1 (<code>dv_1</code>), 10 rows</li>\n</ul>")


@pytest.mark.parametrize("value, shown", [(12345, "12,345"), (16.0, "16"), (0.123456, "0.1235"), (2e-05, "2e-05"),
                                          (1e-4, "0.0001"), (float("nan"), "nan"), (True, "True")])
def test_numbers_are_formatted(value, shown):
    assert format_number(value) == shown


def test_a_serving_copy_adds_its_figures_to_its_section_only():
    card = build_model_card(facts())
    description = {"scheme": "int4", "group_size": 64, "model_bytes": 3 * 1024**3 // 2, "ratio_to_bfloat16": 0.3,
                   "perplexity_reference": 10.0, "perplexity_quantized": 10.25, "perplexity_increase": 0.025,
                   "eval_sequences": 64, "greedy_agreement": 0.9375, "eval_prompts": 16}
    updated = with_serving_copy(card, description)
    assert updated == build_model_card(facts(serving_copy=description))
    section = sections(split_card(updated)[1])["Serving copy"]
    assert "int4, groups of 64." in section and "- memory: 1.5 GiB (30.00% of bfloat16)" in section
    assert "- perplexity change: +2.50% (10 → 10.25 on 64 eval rows)" in section
    assert "- greedy agreement with this model: 93.75% (on 16 prompts)" in section
    assert with_serving_copy("# someone else's card\n", description) == "# someone else's card\n"


def test_results_read_the_exported_step_the_last_evaluation_before_it_and_the_best_step():
    rows = [{"step": 1, "loss": 3.0, "tokens": 100}, {"step": 2, "loss": 2.0, "tokens": 200, "eval/loss": 2.5},
            {"step": 3, "loss": 1.5, "tokens": 300}, {"step": 4, "loss": 1.0, "tokens": 400, "eval/loss": 2.7},
            {"step": 3, "loss": 1.4, "tokens": 300}]  # a resume logged step 3 again
    results = results_at(rows, step=3, best_metric="eval/loss", higher_is_better=False)
    assert results == {"train_metrics": {"loss": 1.4, "step": 3}, "eval_metrics": {"eval/loss": 2.5, "step": 2},
                       "best": {"metric": "eval/loss", "step": 2, "value": 2.5}, "tokens_trained": 300}
    best = results_at(rows, step=4, best_metric="eval/loss", higher_is_better=True)["best"]
    assert best == {"metric": "eval/loss", "step": 4, "value": 2.7}


def test_a_serving_copys_figures_are_renamed_into_the_card_leaving_nothing_beside_it(tmp_path):
    from jaxengine.model_card import note_serving_copy, write_model_card

    card = write_model_card(tmp_path, build_model_card(facts()))
    before = card.stat().st_ino
    note_serving_copy(tmp_path, {"scheme": "int8", "model_bytes": 2048})
    assert "int8." in card.read_text() and "- memory: 2.0 KiB" in card.read_text()
    assert card.stat().st_ino != before and [path.name for path in tmp_path.iterdir()] == ["README.md"]
    (tmp_path / "README.md").write_text("# not ours\n")
    note_serving_copy(tmp_path, {"scheme": "int8"})
    assert (tmp_path / "README.md").read_text() == "# not ours\n"


def test_a_base_model_with_no_hub_id_is_named_as_the_web_app_registered_it():
    """QA (a team handed the folder): a base model registered from a local folder (its config.json names no hub id, as
    most do) left the card without a word of what was post-trained; the web app's name and id of it, and of the run
    a run started from, are in the summary and the provenance now."""
    provenance = facts()["provenance"] | {"base_model": {"name": "qwen <local>", "id": "bm_1"},
                                          "source_run": {"name": "sft | first", "id": "run_0"}}
    body = split_card(build_model_card(facts(base_model=None, provenance=provenance)))[1]
    assert "post-trained from the base model qwen &lt;local&gt; (`bm_1`) with Temper" in body
    lines = sections(body)["Provenance"]
    assert "- base model: qwen &lt;local&gt; (`bm_1`)" in lines and "- started from the run: sft \\| first (`run_0`)" in lines
    hub = split_card(build_model_card(facts(provenance=provenance)))[1]
    assert "post-trained from `Qwen/Qwen3-0.6B` with Temper" in hub
    assert "- base model: qwen &lt;local&gt; (`bm_1`), `Qwen/Qwen3-0.6B` on the Hugging Face hub" in hub


def test_compute_auto_is_spelt_out():
    """QA (a reader of the card): "compute auto" left them to know what auto means; the card says it."""
    training = sections(split_card(build_model_card(facts()))[1])["Training"]
    assert "| dtype | weights bfloat16, compute auto (bfloat16 on accelerators, float32 on CPU) |" in training
    explicit = facts(spec=lora_spec(train={**lora_spec()["train"], "compute_dtype": "float32"}))
    assert "| dtype | weights bfloat16, compute float32 |" in build_model_card(explicit)


LLAMA = {"license": "llama3.2", "license_name": "llama3.2", "license_link": "https://www.llama.com/llama3_2/license/",
         "files": ["LICENSE", "USE_POLICY.md"], "not_copied": []}


def test_the_base_models_licence_is_in_the_front_matter_and_its_section():
    meta, body = split_card(build_model_card(facts(licence=LLAMA)))
    assert (meta["license"], meta["license_name"], meta["license_link"]) == (
        "llama3.2", "llama3.2", "https://www.llama.com/llama3_2/license/")
    licence = sections(body)["Licence"]
    assert "The base model's licence: `llama3.2`, named llama3.2, terms at <https://www.llama.com/llama3_2/license/>." in licence
    assert "- `LICENSE`\n- `USE_POLICY.md`" in licence
    assert "\nBuilt with Llama\n" in licence
    html = markdown.markdown(licence)
    assert '<a href="https://www.llama.com/llama3_2/license/">' in html and "<p>Built with Llama</p>" in html


@pytest.mark.parametrize("licence", [None, {"files": [], "not_copied": []}])
def test_a_base_with_no_licence_facts_says_so_plainly(licence):
    meta, body = split_card(build_model_card(facts(licence=licence)))
    assert "license" not in meta
    assert sections(body)["Licence"].strip() == (
        "The base model's folder states no licence: check its terms before sharing this model.")


def test_only_a_llama_licence_asks_for_built_with_llama_and_a_big_file_is_named_as_not_copied():
    apache = {"license": "apache-2.0", "files": ["LICENSE"], "not_copied": [{"name": "NOTICE", "bytes": 3 << 20}]}
    meta, body = split_card(build_model_card(facts(licence=apache)))
    licence = sections(body)["Licence"]
    assert meta["license"] == "apache-2.0" and "Built with Llama" not in body
    assert "Not copied: `NOTICE` (3.0 MiB, over 1.0 MiB); copy it from the base model's folder" in licence
    unnamed = sections(split_card(build_model_card(facts(licence={"files": ["COPYING"]})))[1])["Licence"]
    assert "The base model's README.md names no licence." in unnamed and "- `COPYING`" in unnamed
    no_file = sections(split_card(build_model_card(facts(licence={"license": "gemma"})))[1])["Licence"]
    assert "holds no licence file to copy" in no_file


def test_a_hostile_licence_name_and_link_stay_text():
    hostile = {"license": "other", "license_name": HOSTILE, "license_link": "javascript:alert(1)//<script>",
               "files": ["LICENSE `x` <b>"]}
    card = build_model_card(facts(licence=hostile))
    meta, body = split_card(card)
    assert meta["license_name"] == " ".join(HOSTILE.split()) and card.count("\n---\n") == 1
    html = markdown.markdown(body, extensions=["tables"])
    assert "<script>" not in html and "<a " not in html and "<b>" not in html and html.count("<h1>") == 1
    assert list(sections(body)) == ["Intended use and limitations", "Licence", "Training", "Data", "Results",
                                    "Serving copy", "How to use", "Provenance"]


def with_datasets(*datasets):
    return facts(provenance={**facts()["provenance"], "datasets": list(datasets)})


def test_the_data_section_lists_each_datasets_source_licence_and_description():
    card = build_model_card(with_datasets(
        {"use": "train", "name": "prefs", "version": 3, "id": "dv_1", "rows": 5000, "source": "https://data.example/prefs",
         "licence": "cc-by-4.0", "description": "Ranked answers\nby our support team."},
        {"use": "eval", "name": "held out", "version": 1, "id": "dv_2", "rows": 200, "source": "", "licence": "",
         "description": ""}))
    data = sections(split_card(card)[1])["Data"]
    assert ("- train: prefs, version 3 (`dv_1`), 5,000 rows\n  - source: <https://data.example/prefs>\n"
            "  - licence: cc-by-4.0\n  - description: Ranked answers by our support team.\n"
            "- eval: held out, version 1 (`dv_2`), 200 rows\n"
            "  - licence: not stated: check the data's terms before sharing this model\n") in data
    html = markdown.markdown(data)
    assert '<a href="https://data.example/prefs">https://data.example/prefs</a>' in html
    assert "<li>licence: cc-by-4.0</li>" in html  # a sub-item of its dataset's line


def test_a_source_that_is_no_web_address_stays_text():
    for source in ("javascript:alert(1)", "data:text/html,<script>alert(1)</script>", "ftp://files.example/x",
                   "our S3 bucket"):
        card = build_model_card(with_datasets({"use": "train", "name": "prefs", "id": "dv_1", "source": source,
                                               "licence": "mit"}))
        html = markdown.markdown(sections(split_card(card)[1])["Data"])
        assert "<a " not in html and "<script>" not in html, source


def test_hostile_sources_licences_and_descriptions_stay_text_and_the_yaml_parses():
    card = build_model_card(with_datasets({"use": "train", "name": HOSTILE, "version": 1, "id": "dv_1", "rows": 10,
                                           "source": HOSTILE, "licence": HOSTILE, "description": HOSTILE},
                                          {"use": "eval", "name": "x", "id": "dv_2", "source": "org/name\n---\nx: 1",
                                           "licence": "---\nlicense: mit", "description": "---"}))
    meta, body = split_card(card)
    assert card.count("\n---\n") == 1 and "datasets" not in meta
    assert list(sections(body)) == ["Intended use and limitations", "Licence", "Training", "Data", "Results",
                                    "Serving copy", "How to use", "Provenance"]
    html = markdown.markdown(body, extensions=["tables"])
    assert "<script>" not in html and "<a " not in html and "<strong>" not in html and html.count("<h1>") == 1
    assert "<hr" not in html and "<h2>Data</h2>" in html
    assert f"  - licence: {inline_text(HOSTILE)}" in body.splitlines()


def test_only_hub_id_sources_go_into_the_front_matters_datasets_each_once():
    card = build_model_card(with_datasets(
        {"use": "train", "name": "a", "id": "dv_1", "source": "HuggingFaceH4/ultrafeedback_binarized"},
        {"use": "eval", "name": "b", "id": "dv_2", "source": "HuggingFaceH4/ultrafeedback_binarized"},
        {"use": "data", "name": "c", "id": "dv_3", "source": "https://huggingface.co/datasets/org/name"},
        {"use": "data", "name": "d", "id": "dv_4", "source": "./local/folder"},
        {"use": "data", "name": "e", "id": "dv_5", "source": "scraped from our wiki"}))
    meta, _body = split_card(card)
    assert meta["datasets"] == ["HuggingFaceH4/ultrafeedback_binarized"]
    assert list(meta)[:3] == ["library_name", "base_model", "datasets"]
    no_hub = split_card(build_model_card(with_datasets({"use": "train", "name": "a", "id": "dv_1",
                                                        "source": "our wiki"})))[0]
    assert "datasets" not in no_hub


def test_intended_use_says_what_it_was_trained_for_on_what_and_that_safety_was_not_evaluated():
    use = sections(split_card(build_model_card(facts()))[1])["Intended use and limitations"]
    assert use.startswith("\n\nTrained for preferring replies like the chosen ones of its preference pairs over the "
                          "rejected ones (DPO), on prefs. ")
    assert "- Not evaluated for safety: Temper measured only the figures under Results." in use
    assert "- It inherits the licence and the limitations of `Qwen/Qwen3-0.6B`:" in use
    assert "measured on the training data" not in use and "notes" not in use
    reward = sections(split_card(build_model_card(facts(spec=lora_spec(task="reward", dpo=None), provenance={})))[1])
    assert reward["Intended use and limitations"].startswith(
        "\n\nTrained for scoring replies to a prompt as its preference data ranks them (a reward model: it writes no "
        "text), on train.jsonl. ")
    registered = facts(base_model=None, provenance={**facts()["provenance"], "base_model": {"name": "our base",
                                                                                           "id": "bm_1"}})
    assert ("the limitations of our base (`bm_1`):"
            in sections(split_card(build_model_card(registered))[1])["Intended use and limitations"])


def test_the_runs_notes_are_quoted_short_and_as_text():
    notes = "# Goal\n\nTeach the <script>alert(1)</script> bot *refunds* [x](javascript:alert(1)).\n\n" + "word " * 200
    card = build_model_card(facts(provenance={**facts()["provenance"], "notes": notes}))
    use = sections(split_card(card)[1])["Intended use and limitations"]
    quoted = use.split("From the run's notes:\n\n> ")[1].strip()
    assert "\n" not in quoted and quoted.endswith("word…") and len(quoted) < 400
    html = markdown.markdown(use)
    assert "<script>" not in html and "<a " not in html and "<em>" not in html and "<h1>" not in html
    assert "<blockquote>" in html and "Teach the &lt;script&gt;alert(1)&lt;/script&gt; bot *refunds*" in html


def test_evaluation_on_the_training_data_is_said_in_results_and_limitations():
    card = build_model_card(facts(evaluated_on_training_data=True))
    parts = sections(split_card(card)[1])
    warning = "measured on the training data (data.eval is data.train)"
    assert warning in parts["Intended use and limitations"]
    assert parts["Results"].index(warning) < parts["Results"].index("Evaluation at step 1,200:")


def test_the_evaluation_data_is_the_training_data_for_one_version_or_the_same_bytes(tmp_path):
    train, copy, other = tmp_path / "train.jsonl", tmp_path / "copy.jsonl", tmp_path / "other.jsonl"
    train.write_text('{"prompt": "a", "completion": "b"}\n')
    copy.write_text(train.read_text())
    other.write_text('{"prompt": "a", "completion": "c"}\n')
    one_version = {"datasets": [{"use": "train", "id": "dv_1"}, {"use": "eval", "id": "dv_1"}]}
    assert evaluated_on_training_data({"train": "/gone/a", "eval": "/gone/b"}, one_version)
    assert evaluated_on_training_data({"train": str(train), "eval": str(train)}, {})
    assert evaluated_on_training_data({"train": str(train), "eval": str(copy)}, {})
    assert not evaluated_on_training_data({"train": str(train), "eval": str(other)}, {})
    assert not evaluated_on_training_data({"train": str(train), "eval": None}, {})
    assert not evaluated_on_training_data({"train": str(train), "eval": str(tmp_path / "missing")}, {})
    two_versions = {"datasets": [{"use": "train", "id": "dv_1"}, {"use": "eval", "id": "dv_2"}]}
    assert not evaluated_on_training_data({"train": str(train), "eval": str(other)}, two_versions)
