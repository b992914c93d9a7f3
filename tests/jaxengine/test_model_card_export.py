"""Every export carries its model card: a run's final export and its PEFT adapter, `jaxengine export` of a checkpoint,
and the serving copy's figures added once it is made; transformers still loads the folder, and reads no card file."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from jaxengine.cli import main
from jaxengine.job import run_job
from jaxengine.model_card import CARD_FILE, PROVENANCE_FILE, inline_text
from jaxengine.spec import parse_spec
from tests.factories import build_tiny_model_dir

LICENCE_TEXT = "LLAMA 3.2 COMMUNITY LICENSE AGREEMENT\n"
HOSTILE = "chats\n---\n# <script>alert(1)</script>"
PROVENANCE = {"project": "Team A", "run_name": "card run", "run_id": "run_card1", "author": "ada",
              "temper_version": "0.1.0",
              "datasets": [{"use": "train", "name": HOSTILE, "version": 2, "id": "dv_x", "rows": 6,
                            "source": "HuggingFaceH4/ultrafeedback_binarized", "licence": "mit | <b>x</b>",
                            "description": HOSTILE},
                           {"use": "eval", "name": "held out", "version": 1, "id": "dv_y", "rows": 6,
                            "source": "https://data.example/held-out", "licence": "", "description": ""}]}


def split_card(card: str) -> tuple[dict, str]:
    match = re.fullmatch(r"---\n(.*?)\n---\n\n(.*)", card, flags=re.DOTALL)
    assert match, card[:300]
    return yaml.safe_load(match.group(1)), match.group(2)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A LoRA SFT run of a tiny model whose config names a hub id, trained with the web app's provenance."""
    root = tmp_path_factory.mktemp("card")
    model_dir = build_tiny_model_dir(root / "tiny")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "_name_or_path": "Qwen/Qwen3-0.6B"}))
    (model_dir / "README.md").write_text("---\nlicense: llama3.2\n---\n\n# A base model\n")
    (model_dir / "LICENSE").write_text(LICENCE_TEXT)
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{n} + {n}?", "completion": str(2 * n)}) + "\n"
                            for n in range(6)))
    spec = parse_spec({"task": "sft", "model": str(model_dir), "output_dir": str(root / "run"),
                       "data": {"train": str(data), "eval": str(data), "max_seq_len": 64},
                       "peft": {"method": "lora", "rank": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]},
                       "optim": {"learning_rate": 1e-3},
                       "train": {"max_steps": 2, "batch_size": 2, "save_every": 1, "eval_every": 1,
                                 "eval_samples": 0, "seed": 3}})
    summary = run_job(spec, progress_bar=False, provenance=PROVENANCE)
    assert summary["status"] == "succeeded"
    return root / "run"


def test_a_runs_export_and_adapter_carry_their_cards_with_the_web_apps_provenance(trained_run):
    assert json.loads((trained_run / PROVENANCE_FILE).read_text()) == PROVENANCE
    meta, body = split_card((trained_run / "export" / CARD_FILE).read_text())
    assert meta == {"library_name": "transformers", "license": "llama3.2", "base_model": "Qwen/Qwen3-0.6B",
                    "datasets": ["HuggingFaceH4/ultrafeedback_binarized"],
                    "tags": ["temper", "sft", "lora"], "pipeline_tag": "text-generation", "model_name": "card run"}
    assert f"- train: {inline_text(HOSTILE)}, version 2 (`dv_x`), 6 rows" in body
    assert "<script>" not in body and "\n---\n" not in body
    assert "| LoRA rank | 4 |" in body and "| steps | 2 |" in body and "| seed | 3 |" in body
    assert "Training metrics at step 2:" in body and "Evaluation at step 2:" in body and "| eval/loss |" in body
    assert re.search(r"Best step by eval/loss: [12](, | \(this export\), )", body)
    assert "- run: card run (`run_card1`)" in body and "- exported step: 2" in body
    assert "No serving copy has been made of this export." in body
    # The provenance names two versions, but the spec's data.train and data.eval are one file: its bytes tell.
    assert "**Warning:** The evaluation figures were measured on the training data" in body
    assert "Trained for answering as the replies in its training data do (supervised fine-tuning)" in body
    adapter_meta, _ = split_card((trained_run / "export" / "adapter" / CARD_FILE).read_text())
    assert adapter_meta["library_name"] == "peft" and adapter_meta["tags"] == ["temper", "sft", "lora"]


def test_the_exported_cards_name_each_datasets_source_and_licence(trained_run):
    for folder in (trained_run / "export", trained_run / "export" / "adapter"):
        meta, body = split_card((folder / CARD_FILE).read_text())
        assert meta["datasets"] == ["HuggingFaceH4/ultrafeedback_binarized"]
        data = body.split("## Data\n\n")[1].split("\n## ")[0]
        assert data.startswith(
            f"- train: {inline_text(HOSTILE)}, version 2 (`dv_x`), 6 rows\n"
            f"  - source: HuggingFaceH4/ultrafeedback\\_binarized\n  - licence: mit \\| &lt;b&gt;x&lt;/b&gt;\n"
            f"  - description: {inline_text(HOSTILE)}\n"
            "- eval: held out, version 1 (`dv_y`), 6 rows\n  - source: <https://data.example/held-out>\n"
            "  - licence: not stated: check the data's terms before sharing this model\n"), data


def test_transformers_loads_the_folder_and_chats_with_its_template_as_the_card_says(trained_run):
    pytest.importorskip("torch")
    export = trained_run / "export"
    snippet = (export / CARD_FILE).read_text().split("```python\n")[1].split("```")[0]
    snippet = snippet.replace('"path/to/this/folder"', repr(str(export))).replace("max_new_tokens=128", "max_new_tokens=3")
    printed, namespace = [], {"print": lambda text: printed.append(text)}
    exec(snippet, namespace)  # the card's own snippet, run as written on the folder
    assert namespace["model"].config.model_type == "qwen3" and len(printed) == 1 and isinstance(printed[0], str)
    assert namespace["output"].shape[1] > namespace["inputs"]["input_ids"].shape[1]


def test_jaxengine_export_of_a_checkpoint_writes_its_card_and_a_serving_copy_adds_its_figures(trained_run, capsys):
    from jaxengine.quantize import quantize_run_export

    assert main(["export", "--run", str(trained_run), "--step", "1"]) == 0, capsys.readouterr().err
    card = (trained_run / "export" / CARD_FILE).read_text()
    assert "- exported step: 1" in card and "Training metrics at step 1:" in card and "Evaluation at step 1:" in card
    assert f"- train: {inline_text(HOSTILE)}, version 2" in card  # the provenance.json the run's launch wrote
    description = quantize_run_export(trained_run, scheme_name="int8", eval_limit=2)
    updated = (trained_run / "export" / CARD_FILE).read_text()
    assert updated.replace(updated[updated.index("## Serving copy"):updated.index("## How to use")], "") == (
        card.replace(card[card.index("## Serving copy"):card.index("## How to use")], ""))
    assert f"greedy agreement with this model: {100 * description['greedy_agreement']:.2f}%" in updated
    assert "A quantized copy for serving lies in `quantized/`" in updated and "- memory: " in updated
    assert not (trained_run / "export" / "quantized" / CARD_FILE).exists()  # not a transformers folder


def test_an_export_carries_the_base_models_licence_and_says_built_with_llama(trained_run):
    for folder in (trained_run / "export", trained_run / "export" / "adapter"):
        assert (folder / "LICENSE").read_text() == LICENCE_TEXT
        meta, body = split_card((folder / CARD_FILE).read_text())
        assert meta["license"] == "llama3.2"
        assert "- `LICENSE`" in body and "\nBuilt with Llama\n" in body


def test_a_run_from_that_export_carries_the_licence_on(trained_run):
    """The facts of a run started from another run's export come from that export, which carries them."""
    spec = parse_spec({"task": "sft", "model": str(trained_run / "export"), "output_dir": str(trained_run.parent / "chained"),
                       "data": {"train": str(trained_run.parent / "train.jsonl"), "max_seq_len": 64},
                       "train": {"max_steps": 1, "batch_size": 2, "save_every": 1, "eval_samples": 0}})
    assert run_job(spec, progress_bar=False)["status"] == "succeeded"
    export = trained_run.parent / "chained" / "export"
    assert (export / "LICENSE").read_text() == LICENCE_TEXT
    meta, body = split_card((export / CARD_FILE).read_text())
    assert meta["license"] == "llama3.2" and "- `LICENSE`" in body and "\nBuilt with Llama\n" in body
