"""The model card (``README.md``) written into every exported model, so a team that hands the folder on keeps the record
of how it was made.

Design note. Three steps, kept apart so the text is tested without a model: ``card_facts`` gathers a plain dict from the
run directory (the spec as run, ``metrics.jsonl``, the exported step, the base model's config, and the web app's
``provenance.json``); ``build_model_card`` turns such a dict into the card's text and reads nothing (a pure function);
``write_model_card`` puts the text in the export folder. A later serving copy adds its figures to the card
(``note_serving_copy``) by rebuilding one section, so the card never needs the run's facts gathered again.

Everything a user typed (run, project and dataset names, a dataset's source, licence and description, the author)
reaches the Markdown through ``inline_text``: one line, Markdown's punctuation escaped, ``< > &`` as entities, so a name
cannot open a heading, a table row, a second front matter or an HTML tag; a source is a link only when it is an http(s)
address (``is_web_address``). The YAML front matter is written by ``yaml.safe_dump``, which quotes what needs quoting;
its ``datasets:`` lists only sources that read as Hugging Face hub ids (``hub_repo_id``).

Loaders never read ``README.md`` (it is neither in ``checkpoint.hf.TOKENIZER_FILES`` nor a weight or config file), so
the export's other files stay what they were; nor the base model's licence files copied beside it (``licence``),
which the card's Licence section lists.
"""
from __future__ import annotations

import datetime
import filecmp
import json
import math
import os
import re
import uuid
from pathlib import Path
from typing import Any, Iterable

import yaml

from jaxengine.licence import (BUILT_WITH_LLAMA, LICENCE_FILE_MAX_BYTES, is_llama_licence, read_licence,
                               states_a_licence)

CARD_FILE = "README.md"
# Written by the web app's worker beside spec.yaml (``run_job(provenance=...)``): what the engine cannot know.
PROVENANCE_FILE = "provenance.json"
SERVING_COPY_HEADING = "## Serving copy"
# What opens emphasis, code, a link, a heading's closing, an image or a table cell inside a line (``inline_text`` never
# starts one, so list and heading markers cannot begin there).
_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_\[\]#!|])")
_HTML_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# Spec sections whose knobs the card lists for the task that has one.
_TASK_SECTIONS = ("dpo", "reward", "grpo", "ppo")
# What each task trains a model to do, for the "Intended use and limitations" section.
_TASK_PURPOSES = {
    "pretrain": "continuing text like its training data (next-token prediction, not tuned to follow instructions)",
    "sft": "answering as the replies in its training data do (supervised fine-tuning)",
    "reward": "scoring replies to a prompt as its preference data ranks them (a reward model: it writes no text)",
    "dpo": "preferring replies like the chosen ones of its preference pairs over the rejected ones (DPO)",
    "grpo": "writing replies that its reward scores highly (reinforcement learning by GRPO)",
    "ppo": "writing replies that its reward scores highly (reinforcement learning by PPO)",
}
# The run's notes are the team's own words on its purpose; the card quotes their start only, as one line of text.
NOTES_EXCERPT_CHARACTERS = 300
EVALUATED_ON_TRAINING_DATA = ("The evaluation figures were measured on the training data (data.eval is data.train): "
                              "they say how well the model fits what it was trained on, not how it does on rows it "
                              "has not seen.")


# ----------------------------------------------------------------------------------------------- gathering the facts

def read_provenance(run_dir: str | Path) -> dict[str, Any]:
    """The web app's ``provenance.json`` of ``run_dir``; ``{}`` for a run started from the command line (none written)
    or one whose file is not a JSON object."""
    try:
        provenance = json.loads((Path(run_dir) / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return provenance if isinstance(provenance, dict) else {}


def write_provenance(run_dir: str | Path, provenance: dict[str, Any]) -> None:
    (Path(run_dir) / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")


def hub_repo_id(name: Any) -> str | None:
    """``name`` when it reads as a Hugging Face hub id (``org/name``), None when it is a local path or anything else:
    a path on the training host means nothing to whoever reads the card."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", name):
        return None
    return None if name.startswith((".", "~")) or Path(name).exists() else name


def hub_id(base_config: dict[str, Any]) -> str | None:
    """The Hugging Face hub id the base model's ``config.json`` names as ``_name_or_path`` (``hub_repo_id``)."""
    return hub_repo_id(base_config.get("_name_or_path"))


def is_web_address(value: Any) -> bool:
    """Whether ``value`` is an http(s) address that may be shown as a link: anything else (a ``javascript:`` link, a
    path, words) is shown as text, inert."""
    return isinstance(value, str) and re.fullmatch(r"https?://[^\s<>`]+", value) is not None


def read_metric_rows(metrics_path: str | Path) -> list[dict[str, Any]]:
    """``metrics.jsonl``'s records, skipping a line a crash left half-written."""
    rows = []
    try:
        lines = Path(metrics_path).read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            rows.append(record)
    return rows


def results_at(rows: Iterable[dict[str, Any]], *, step: int, best_metric: str, higher_is_better: bool
               ) -> dict[str, Any]:
    """From ``metrics.jsonl``'s records: the training metrics at ``step`` (the last record up to it), the latest
    evaluation up to ``step``, the best evaluated step by ``best_metric``, and the tokens trained up to ``step``.
    A resumed run logs a step again: the later record wins."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in rows:
        by_step[row["step"]] = row
    upto = [by_step[number] for number in sorted(by_step) if number <= step]
    training = next((row for row in reversed(upto)), None)
    evaluated = [row for row in upto if any(key.startswith("eval/") for key in row)]
    scored = [row for row in by_step.values() if _finite(row.get(best_metric))]
    best = None
    if scored:
        pick = max if higher_is_better else min
        row = pick(scored, key=lambda record: (record[best_metric], -record["step"] if higher_is_better
                                               else record["step"]))
        best = {"metric": best_metric, "step": row["step"], "value": row[best_metric]}
    return {
        "train_metrics": {key: value for key, value in (training or {}).items()
                          if key not in ("step", "tokens") and not key.startswith("eval/")} | (
            {"step": training["step"]} if training else {}),
        "eval_metrics": ({key: value for key, value in evaluated[-1].items() if key.startswith("eval/")}
                         | {"step": evaluated[-1]["step"]}) if evaluated else {},
        "best": best,
        "tokens_trained": training.get("tokens") if training else None,
    }


def same_content(first: str | Path, second: str | Path) -> bool:
    """Whether two data files hold the same bytes (the same file, or a copy of it); False when either cannot be
    read. Compared byte by byte, which stops at the first difference and at differing sizes before reading."""
    try:
        return os.path.samefile(first, second) or filecmp.cmp(first, second, shallow=False)
    except OSError:
        return False


def evaluated_on_training_data(spec_data: dict[str, Any], provenance: dict[str, Any]) -> bool:
    """Whether a run's ``data.eval`` is its ``data.train``: the web app's provenance names the same dataset version
    for both uses, or the two files hold the same bytes (a run from the command line, or a version uploaded twice)."""
    datasets = [dataset for dataset in provenance.get("datasets") or [] if isinstance(dataset, dict)]
    ids = {use: {dataset.get("id") for dataset in datasets if dataset.get("use") == use and dataset.get("id")}
           for use in ("train", "eval")}
    if ids["train"] & ids["eval"]:
        return True
    return bool(spec_data.get("eval")) and same_content(spec_data["train"], spec_data["eval"])


def card_facts(*, run_dir: str | Path, spec: Any, step: int, base_model_dir: str | Path, adapter: bool,
               data_summary: dict[str, Any] | None = None, provenance: dict[str, Any] | None = None,
               exported_at: datetime.datetime | None = None) -> dict[str, Any]:
    """The plain dict ``build_model_card`` reads, for the export of checkpoint ``step`` of the run in ``run_dir`` whose
    spec (a ``JobSpec``) is ``spec``; ``adapter``: the PEFT adapter folder's card rather than the merged model's.
    ``data_summary``: the engine's counts of the data (``summary.json``'s ``data``; read from there when not given);
    ``provenance``: the web app's (default: the run's ``provenance.json``). ``licence``: the base model folder's
    (``licence.read_licence``), the files of which the export copies (``licence.copy_licence_files``).
    ``evaluated_on_training_data``: ``evaluated_on_training_data``'s answer, read while the data files are there."""
    import jaxengine
    from jaxengine.spec import best_metric_for

    run_dir = Path(run_dir)
    try:
        base_config = json.loads((Path(base_model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        base_config = {}
    if data_summary is None:
        try:
            data_summary = json.loads((run_dir / "summary.json").read_text()).get("data")
        except (OSError, ValueError, AttributeError):
            data_summary = None
    metric, higher_is_better = best_metric_for(spec)
    provenance = read_provenance(run_dir) if provenance is None else provenance
    return {
        "kind": "adapter" if adapter else "merged",
        "spec": spec.model_dump(mode="json"),
        "base_model": hub_id(base_config if isinstance(base_config, dict) else {}),
        "licence": read_licence(base_model_dir),
        "step": step,
        **results_at(read_metric_rows(run_dir / "metrics.jsonl"), step=step, best_metric=metric,
                     higher_is_better=higher_is_better),
        "data": data_summary if isinstance(data_summary, dict) else {},
        "provenance": provenance,
        "evaluated_on_training_data": evaluated_on_training_data(spec.data.model_dump(mode="json"), provenance),
        "engine_version": jaxengine.__version__,
        "exported_at": (exported_at or datetime.datetime.now(datetime.timezone.utc)).isoformat(timespec="seconds"),
    }


# ------------------------------------------------------------------------------------------------ the text (pure)

def inline_text(value: Any) -> str:
    """``value`` as one line of Markdown that shows it as written: whitespace runs (newlines too) become one space,
    Markdown's punctuation is backslash-escaped and ``< > &`` are entities (no tag, heading, list or table cell
    opens)."""
    text = " ".join(str(value).split())
    text = "".join(_HTML_ENTITIES.get(character, character) for character in text)
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", text)


def code_span(value: Any) -> str:
    """``value`` (an id) as one line of inline code: a code span shows its text as written, escapes and tags too, so
    only a backtick, which would close it, is replaced."""
    return "`" + " ".join(str(value).split()).replace("`", "'") + "`"


def format_number(value: Any) -> str:
    """Integers with thousands separators (12,345), other numbers to 4 significant digits (0.0001, 1.235, 2e-05)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return inline_text(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.4g}"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _percent(fraction: float, *, signed: bool = False) -> str:
    return f"{100 * fraction:{'+' if signed else ''}.2f}%"


def _bytes(size: int) -> str:
    if size < 1024:
        return f"{size:,} bytes"
    exponent = min(int(math.log(size, 1024)), 3)
    return f"{size / 1024 ** exponent:.1f} {('KiB', 'MiB', 'GiB')[exponent - 1]}"


def _method(spec: dict[str, Any]) -> str:
    return (spec.get("peft") or {}).get("method", "none")


def _method_tag(spec: dict[str, Any]) -> str:
    return {"none": "full"}.get(_method(spec), _method(spec))


def front_matter(facts: dict[str, Any]) -> str:
    """The card's YAML front matter (between ``---`` lines)."""
    spec = facts["spec"]
    meta: dict[str, Any] = {"library_name": "peft" if facts["kind"] == "adapter" else "transformers"}
    meta |= {key: " ".join(str(value).split()) for key, value in (facts.get("licence") or {}).items()
             if key in ("license", "license_name", "license_link")}
    if facts.get("base_model"):
        meta["base_model"] = facts["base_model"]
    if datasets := dataset_hub_ids(facts):
        meta["datasets"] = datasets
    meta["tags"] = ["temper", spec["task"], _method_tag(spec)]
    meta["pipeline_tag"] = "text-generation"
    if run_name := (facts.get("provenance") or {}).get("run_name"):
        meta["model_name"] = " ".join(str(run_name).split())
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=math.inf) + "---\n"


def _table(rows: Iterable[tuple[str, str]], header: tuple[str, str] = ("setting", "value")) -> list[str]:
    lines = [f"| {header[0]} | {header[1]} |", "| --- | --- |"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return lines


def _compute_dtype(train: dict[str, Any]) -> str:
    """The spec's compute dtype, ``auto`` spelt out (``jaxengine.job.resolve_dtypes``): the card may be read far from
    the spec's documentation, and an export need not be made on the kind of host that trained."""
    asked = train.get("compute_dtype")
    return "auto (bfloat16 on accelerators, float32 on CPU)" if asked == "auto" else inline_text(asked)


def _training_rows(spec: dict[str, Any]) -> list[tuple[str, str]]:
    train, optim, data, peft = spec["train"], spec.get("optim") or {}, spec["data"], spec.get("peft") or {}
    rows = [("task", inline_text(spec["task"]))]
    if _method(spec) in ("lora", "qlora"):
        rows.append(("method", inline_text(_method(spec))))
        rows += [("LoRA rank", format_number(peft["rank"])), ("LoRA alpha", format_number(peft["alpha"])),
                 ("LoRA targets", inline_text(", ".join(peft.get("targets") or ())))]
        if peft.get("dropout"):
            rows.append(("LoRA dropout", format_number(peft["dropout"])))
        if _method(spec) == "qlora":
            rows.append(("frozen weights", f"{peft['quant_bits']}-bit, groups of {format_number(peft['group_size'])}"))
    else:
        rows.append(("method", "full fine-tuning (every weight trained)"))
    if train.get("max_steps") is not None:
        rows.append(("steps", format_number(train["max_steps"])))
    if train.get("epochs") is not None:
        rows.append(("epochs", format_number(train["epochs"])))
    schedule = inline_text(optim.get("schedule", "cosine"))
    if optim.get("warmup_steps"):
        schedule += f" after {format_number(optim['warmup_steps'])} warmup steps"
    rows += [("learning rate", format_number(optim.get("learning_rate"))), ("schedule", schedule)]
    batch = format_number(train["batch_size"])
    if train.get("grad_accum", 1) > 1:
        batch += f" (× {format_number(train['grad_accum'])} accumulated)"
    rows += [("batch size", batch), ("sequence length", format_number(data["max_seq_len"])),
             ("dtype", f"weights {inline_text(train.get('param_dtype'))}, "
                       f"compute {_compute_dtype(train)}"),
             ("seed", format_number(train.get("seed", 0)))]
    return rows


def _knob_value(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_number(value)
    if isinstance(value, list) and all(isinstance(item, dict) and "name" in item for item in value):
        return inline_text(", ".join(f"{item['name']} × {item.get('weight', 1)}" for item in value))
    return inline_text(json.dumps(value) if isinstance(value, (dict, list)) else value)


def _task_knobs(spec: dict[str, Any]) -> list[tuple[str, str]]:
    section = spec.get(spec["task"]) if spec["task"] in _TASK_SECTIONS else None
    if not isinstance(section, dict):
        return []
    return [(f"{spec['task']}.{inline_text(key)}", _knob_value(value)) for key, value in section.items()
            if value is not None and value != [] and value != {}]


def _source_text(source: str) -> str:
    """A dataset's source as the card shows it: an http(s) address as an autolink, anything else as text."""
    return f"<{source}>" if is_web_address(source) else inline_text(source)


def _about_lines(dataset: dict[str, Any]) -> list[str]:
    """A dataset's source, licence and description (as its "About this dataset" said at launch), each a sub-item of
    its line; a licence not stated is said to be, as the base model's is."""
    lines = []
    if dataset.get("source"):
        lines.append(f"  - source: {_source_text(str(dataset['source']))}")
    if "licence" in dataset:  # provenance written before datasets had a licence says nothing of it
        lines.append(f"  - licence: {inline_text(dataset['licence'])}" if dataset["licence"]
                     else "  - licence: not stated: check the data's terms before sharing this model")
    if dataset.get("description"):
        lines.append(f"  - description: {inline_text(dataset['description'])}")
    return lines


def dataset_hub_ids(facts: dict[str, Any]) -> list[str]:
    """The Hugging Face hub ids (``hub_repo_id``) of the provenance's dataset sources, each once, for the front
    matter's ``datasets:``; an address or words name no hub dataset and are left to the Data section."""
    datasets = (facts.get("provenance") or {}).get("datasets") or []
    found = (hub_repo_id(dataset.get("source")) for dataset in datasets if isinstance(dataset, dict))
    return list(dict.fromkeys(hub for hub in found if hub))


def _datasets_lines(facts: dict[str, Any]) -> list[str]:
    datasets = (facts.get("provenance") or {}).get("datasets") or []
    data = facts.get("data") or {}
    lines = []
    for dataset in datasets:
        rows = dataset.get("rows")
        line = f"- {inline_text(dataset.get('use') or 'data')}: {inline_text(dataset.get('name'))}"
        if dataset.get("version") is not None:
            line += f", version {format_number(dataset['version'])}"
        if dataset.get("id"):
            line += f" ({code_span(dataset['id'])})"
        if rows is not None:
            line += f", {format_number(rows)} rows"
        lines += [line, *_about_lines(dataset)]
    if not datasets:
        spec_data = facts["spec"]["data"]
        for use in ("train", "eval"):
            if spec_data.get(use):
                rows = (data.get(use) or {}).get("rows")
                lines.append(f"- {use}: {inline_text(Path(spec_data[use]).name)}"
                             + (f", {format_number(rows)} rows" if rows is not None else ""))
    for use in ("train", "eval"):
        stats = data.get(use) or {}
        if stats.get("truncated") or stats.get("dropped"):
            lines.append(f"- {use}: {format_number(stats.get('truncated') or 0)} rows cut to the sequence length, "
                         f"{format_number(stats.get('dropped') or 0)} left out")
    if facts.get("tokens_trained") is not None:
        lines.append(f"- tokens trained: {format_number(facts['tokens_trained'])}")
    return lines or ["No record of the data."]


def _metric_rows(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    return [(inline_text(name), format_number(value)) for name, value in sorted(metrics.items())
            if name != "step" and _finite(value)]


def _results_lines(facts: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    train_metrics, eval_metrics, best = facts.get("train_metrics") or {}, facts.get("eval_metrics") or {}, facts.get("best")
    if train_metrics:
        lines += [f"Training metrics at step {format_number(train_metrics['step'])}:", ""]
        lines += _table(_metric_rows(train_metrics), header=("metric", "value")) + [""]
    if eval_metrics:
        if facts.get("evaluated_on_training_data"):
            lines += [f"**Warning:** {EVALUATED_ON_TRAINING_DATA}", ""]
        lines += [f"Evaluation at step {format_number(eval_metrics['step'])}"
                  + ("" if eval_metrics["step"] == facts["step"] else f" (the last before step {format_number(facts['step'])})")
                  + ":", ""]
        lines += _table(_metric_rows(eval_metrics), header=("metric", "value")) + [""]
    if best:
        exported = " (this export)" if best["step"] == facts["step"] else ""
        lines.append(f"Best step by {inline_text(best['metric'])}: {format_number(best['step'])}{exported}, "
                     f"{format_number(best['value'])}.")
    return lines or ["No metrics were recorded."]


def serving_copy_lines(description: dict[str, Any] | None) -> list[str]:
    """The "Serving copy" section's body from the copy's ``quantization.json``."""
    if not description:
        return ["No serving copy has been made of this export."]
    scheme = inline_text(description.get("scheme"))
    if description.get("group_size"):
        scheme += f", groups of {format_number(description['group_size'])}"
    lines = [f"A quantized copy for serving lies in `quantized/` (Temper's format, not loaded by transformers): "
             f"{scheme}."]
    if _finite(description.get("model_bytes")):
        lines.append(f"- memory: {_bytes(int(description['model_bytes']))}"
                     + (f" ({_percent(description['ratio_to_bfloat16'])} of bfloat16)"
                        if _finite(description.get("ratio_to_bfloat16")) else ""))
    if _finite(description.get("perplexity_increase")):
        lines.append(f"- perplexity change: {_percent(description['perplexity_increase'], signed=True)} "
                     f"({format_number(description.get('perplexity_reference'))} → "
                     f"{format_number(description.get('perplexity_quantized'))} on "
                     f"{format_number(description.get('eval_sequences'))} eval rows)")
    if _finite(description.get("greedy_agreement")):
        lines.append(f"- greedy agreement with this model: {_percent(description['greedy_agreement'])} "
                     f"(on {format_number(description.get('eval_prompts'))} prompts)")
    return lines


def _usage_lines(facts: dict[str, Any]) -> list[str]:
    if facts["kind"] == "adapter":
        load = ["from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer", "",
                'model = AutoPeftModelForCausalLM.from_pretrained("path/to/this/folder")',
                'tokenizer = AutoTokenizer.from_pretrained("path/to/the/merged/export")']
        note = ("This folder is a LoRA adapter in the PEFT format: its `adapter_config.json` names the base model "
                "by the path it had on the training host; point it at your copy of the base.")
    else:
        load = ["from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")',
                'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")']
        note = ""
    code = ["```python", *load,
            'messages = [{"role": "user", "content": "Hello!"}]',
            "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,",
            '                                       return_tensors="pt")',
            "output = model.generate(**inputs, max_new_tokens=128)",
            'print(tokenizer.decode(output[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True))', "```"]
    if facts["spec"]["task"] == "reward":
        note = (note + " " if note else "") + ("A reward model: `reward_head.safetensors` holds its score head, "
                                               "which transformers does not load; the folder alone is the backbone.")
    return ([note, ""] if note else []) + code


def _named(record: Any) -> str | None:
    """A ``{"name": ..., "id": ...}`` of the web app's provenance (a base model, a run) as ``name (`id`)``."""
    if not isinstance(record, dict) or not (record.get("name") or record.get("id")):
        return None
    return inline_text(record.get("name") or "") + (f" ({code_span(record['id'])})" if record.get("id") else "")


def _base_model_line(facts: dict[str, Any]) -> str | None:
    """The base model as Temper registered it and by its hub id, whichever are known: a local folder's config.json
    names no hub id, and without the registered name the card would not say what was post-trained."""
    registered = _named((facts.get("provenance") or {}).get("base_model"))
    hub = f"{code_span(facts['base_model'])} on the Hugging Face hub" if facts.get("base_model") else None
    shown = ", ".join(part for part in (registered, hub) if part)
    return f"- base model: {shown}" if shown else None


def _licence_link(link: str) -> str:
    """An http(s) address as a Markdown autolink; anything else as text (a ``javascript:`` link stays inert)."""
    return f"<{link}>" if is_web_address(link) else inline_text(link)


def licence_lines(licence: dict[str, Any] | None) -> list[str]:
    """The Licence section's body from the base model's licence facts (``licence.read_licence``): the licence it
    names, the files copied beside this card, those too large to copy, and "Built with Llama" where a Llama
    licence asks a derivative to display it."""
    if not states_a_licence(licence):
        return ["The base model's folder states no licence: check its terms before sharing this model."]
    named = []
    if licence.get("license"):
        named.append(code_span(licence["license"]))
    if licence.get("license_name"):
        named.append(f"named {inline_text(licence['license_name'])}")
    if licence.get("license_link"):
        named.append(f"terms at {_licence_link(licence['license_link'])}")
    lines = [f"The base model's licence: {', '.join(named)}." if named
             else "The base model's README.md names no licence."]
    files = licence.get("files") or []
    lines += ["", "Its terms travel with this model; copied from the base model's folder:" if files
              else "The base model's folder holds no licence file to copy: read its terms before sharing this model."]
    if files:
        lines += ["", *(f"- {code_span(name)}" for name in files)]
    for big in licence.get("not_copied") or []:
        lines += ["", f"Not copied: {code_span(big['name'])} ({_bytes(int(big['bytes']))}, over "
                      f"{_bytes(LICENCE_FILE_MAX_BYTES)}); copy it from the base model's folder before sharing this "
                      "model."]
    if is_llama_licence(licence):
        lines += ["", BUILT_WITH_LLAMA]
    return lines


def _training_data_names(facts: dict[str, Any]) -> str:
    """The training data as the Data section names it: the web app's dataset names, else the spec's file name."""
    datasets = (facts.get("provenance") or {}).get("datasets") or []
    names = [str(dataset.get("name")) for dataset in datasets
             if isinstance(dataset, dict) and dataset.get("use") == "train" and dataset.get("name")]
    if not names and facts["spec"]["data"].get("train"):
        names = [Path(facts["spec"]["data"]["train"]).name]
    return inline_text(", ".join(dict.fromkeys(names))) if names else "data the card has no record of"


def notes_excerpt(notes: Any, *, limit: int = NOTES_EXCERPT_CHARACTERS) -> str:
    """The start of a run's Markdown notes as one line of plain text (``inline_text``): whitespace runs become one
    space, cut at a word before ``limit`` characters with an ellipsis; '' for no notes."""
    text = " ".join(str(notes or "").split())
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0].rstrip(" .,;:") + "…"
    return inline_text(text) if text else ""


def intended_use_lines(facts: dict[str, Any]) -> list[str]:
    """The "Intended use and limitations" section's body: what the run trained the model for and on, that nothing
    evaluated its safety, that it inherits the base model's licence and limitations, a warning where its evaluation
    data is its training data, and the start of the run's notes where it has some (the team's word on its purpose)."""
    spec = facts["spec"]
    task = spec["task"]
    purpose = _TASK_PURPOSES.get(task, inline_text(task))
    registered = _named((facts.get("provenance") or {}).get("base_model"))
    base = (code_span(facts["base_model"]) if facts.get("base_model")
            else registered if registered else "the base model")
    lines = [f"Trained for {purpose}, on {_training_data_names(facts)}. Use it for that kind of task on data like "
             "that; for anything else it has not been trained or measured.", "",
             "- Not evaluated for safety: Temper measured only the figures under Results. No test of harmful, biased "
             "or false output was run; evaluate it for your use before deploying it.",
             f"- It inherits the licence and the limitations of {base}: what that model must not be used for, or "
             "does badly, holds for this one too. Read its card and the Licence section below."]
    if facts.get("evaluated_on_training_data"):
        lines.append(f"- {EVALUATED_ON_TRAINING_DATA}")
    if excerpt := notes_excerpt((facts.get("provenance") or {}).get("notes")):
        lines += ["", "From the run's notes:", "", f"> {excerpt}"]
    return lines


def _provenance_lines(facts: dict[str, Any]) -> list[str]:
    provenance = facts.get("provenance") or {}
    lines = []
    if provenance.get("project"):
        lines.append(f"- project: {inline_text(provenance['project'])}")
    if provenance.get("run_name") or provenance.get("run_id"):
        lines.append(f"- run: {inline_text(provenance.get('run_name') or '')}"
                     + (f" ({code_span(provenance['run_id'])})" if provenance.get("run_id") else ""))
    if base_model := _base_model_line(facts):
        lines.append(base_model)
    if source_run := _named(provenance.get("source_run")):
        lines.append(f"- started from the run: {source_run}")
    if provenance.get("author"):
        lines.append(f"- launched by: {inline_text(provenance['author'])}")
    version = provenance.get("temper_version") or facts.get("engine_version")
    lines += [f"- Temper version: {inline_text(version)}",
              f"- exported: {inline_text(facts['exported_at'])}",
              f"- exported step: {format_number(facts['step'])}"]
    return lines


def _summary_line(facts: dict[str, Any]) -> str:
    spec = facts["spec"]
    what = {"merged": "A model", "adapter": "A LoRA adapter"}[facts["kind"]]
    method = {"none": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}.get(_method(spec), _method(spec))
    registered = _named((facts.get("provenance") or {}).get("base_model"))
    base = (f" from {code_span(facts['base_model'])}" if facts.get("base_model")
            else f" from the base model {registered}" if registered else "")
    run = (facts.get("provenance") or {}).get("run_name")
    named = f" by the run {inline_text(run)}" if run else ""
    return (f"{what} post-trained{base} with Temper{named}: {inline_text(spec['task'])} by {method}, "
            f"checkpoint of step {format_number(facts['step'])}.")


def build_model_card(facts: dict[str, Any]) -> str:
    """The model card's text (``README.md``) from ``facts`` (``card_facts``' dict, or one written by hand): YAML front
    matter, a summary line, then Intended use and limitations, Licence, Training, Data, Results, Serving copy, How to use
    and Provenance sections."""
    spec = facts["spec"]
    knobs = _task_knobs(spec)
    lines = [front_matter(facts), f"# {inline_text((facts.get('provenance') or {}).get('run_name') or 'Temper model')}",
             "", _summary_line(facts), "", "## Intended use and limitations", "", *intended_use_lines(facts), "",
             "## Licence", "", *licence_lines(facts.get("licence")), "",
             "## Training", "", *_table(_training_rows(spec) + knobs), "",
             "## Data", "", *_datasets_lines(facts), "", "## Results", "", *_results_lines(facts), "",
             SERVING_COPY_HEADING, "", *serving_copy_lines(facts.get("serving_copy")), "",
             "## How to use", "", *_usage_lines(facts), "", "## Provenance", "", *_provenance_lines(facts)]
    return "\n".join(lines) + "\n"


def with_serving_copy(card: str, description: dict[str, Any] | None) -> str:
    """``card`` with its Serving copy section's body replaced by the one ``description`` gives; ``card`` as it is
    when it has no such section (not one this module wrote)."""
    start = card.find(f"\n{SERVING_COPY_HEADING}\n")
    if start < 0:
        return card
    body_start = start + len(SERVING_COPY_HEADING) + 2
    end = card.find("\n## ", body_start)
    end = len(card) if end < 0 else end
    return card[:body_start] + "\n" + "\n".join(serving_copy_lines(description)) + "\n" + card[end:]


# ---------------------------------------------------------------------------------------------------------- writing

def write_model_card(folder: str | Path, text: str) -> Path:
    path = Path(folder) / CARD_FILE
    path.write_text(text, encoding="utf-8")
    return path


def note_serving_copy(export_dir: str | Path, description: dict[str, Any]) -> None:
    """Add the serving copy's figures to the card of the export it was made from (nothing when it has none).

    The new card is written beside the old one and renamed over it: an export changes inside only by renames (the web
    app's disk usage keeps a sealed folder's sum under its stamp, which a rename renews and a rewrite in place does
    not), and a reader never meets half a card."""
    path = Path(export_dir) / CARD_FILE
    try:
        card = path.read_text(encoding="utf-8")
    except OSError:
        return
    if (updated := with_serving_copy(card, description)) == card:
        return
    staging = path.with_name(f".{CARD_FILE}.writing-{uuid.uuid4().hex}")
    try:
        staging.write_text(updated, encoding="utf-8")
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)
