"""Hyperparameter sweeps: one launch makes a run for every combination of a few spec keys' values.

Design note: a sweep is no model of its own. Its runs share a tag ``sweep-<8 hex digits>`` (the runs
table filters by it, and its ticks compare them) and each one's spec is the launch's spec with the
sweep's keys set, checked by ``services.plan_run`` as a single launch is. ``services.sweep_create``
plans every combination before it saves any run, in one transaction, so a sweep with one bad
combination makes no run and queues nothing; this module holds the pure parts around it: reading the
sweep, checking its keys against the task's spec, the product, the run names and the error messages.

A sweep is written one key a line (``optim.learning_rate: 1e-4, 3e-4``), the values read as a YAML
flow sequence by the engine's hardened reader (quotes, as in ``"a, b"``, keep a comma in a value); the
REST API sends the same as a mapping of lists (``{"optim.learning_rate": [1e-4, 3e-4]}``).
"""
from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml
from django.conf import settings
from django.core.exceptions import ValidationError

from jaxengine.spec import TASK_ONLY_KEYS
from jaxengine.spec import load_yaml as load_spec_yaml
from jaxengine.words import with_article
from webapp.core.text import checked_text
from webapp.runs.specform import SET_BY_TEMPER, section_model, task_section_names

FIELD = "sweep"
MAX_TEXT_CHARS = 10_000
# Spec keys outside any section that a sweep may set (task is the launch page's tab; output_dir is Temper's).
TOP_LEVEL_KEYS = ("model", "hosts", "pool")
EXAMPLE = "optim.learning_rate: 1e-4, 3e-4"


@dataclass(frozen=True, kw_only=True)
class SweepAxis:
    """One key of a sweep and its values in order, with the text each is shown by in run names;
    ``line``: the line of the sweep text it was written on (None when it came from the API)."""

    key: str
    values: tuple[Any, ...]
    labels: tuple[str, ...]
    line: int | None = None

    @property
    def place(self) -> str:
        """Where the axis was given, for messages: ``line 2: peft.rank``, or the key alone."""
        return f"line {self.line}: {self.key}" if self.line is not None else self.key


@dataclass(frozen=True, kw_only=True)
class Combination:
    """One run of a sweep: its ``number`` (1-based, in product order) and a value per axis."""

    number: int
    values: tuple[Any, ...]
    labels: tuple[str, ...]


# The tag every run of one sweep launch shares (``services.new_sweep_tag``).
SWEEP_TAG = re.compile(r"sweep-[0-9a-f]{8}")


def tags_of_a_copy(tags: list[str]) -> list[str]:
    """The tags a duplicate of a run is offered: its own, without its sweep's. A copy is launched with other
    settings, and its sweep's tag would put it in that sweep's table and comparison as one of its combinations."""
    return [tag for tag in tags if not SWEEP_TAG.fullmatch(tag)]


def max_runs() -> int:
    return settings.TEMPER_SWEEP_MAX_RUNS


def _label(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _read_values(text: str) -> tuple[list[Any], list[str]]:
    """The values of one line and their labels (as typed, without quotes); ``yaml.YAMLError`` or
    ``ValueError`` naming what is not a single value."""
    flow = f"[{text}\n]"  # the bracket on a line of its own: a comment after the values ends at the line's end
    values = load_spec_yaml(flow)
    if not isinstance(values, list):
        raise ValueError("write the values separated by commas")
    # load_spec_yaml took it (no aliases, not deeply nested): the plain reader's nodes say what was quoted.
    nodes = yaml.compose(flow, Loader=yaml.SafeLoader).value
    labels = []
    for value, node in zip(values, nodes):
        if not isinstance(node, yaml.ScalarNode):
            raise ValueError(f"{_label(value)} is not a single value; separate the values by commas")
        labels.append(node.value)
    return values, labels


def axes_from_text(text: str) -> list[SweepAxis]:
    """The sweep written on the launch page, one ``key: value, value`` a line (blank lines and ``#``
    comments skipped); every malformed line is a ``ValidationError`` on ``sweep`` naming its line."""
    text = checked_text(text, field=FIELD, max_length=MAX_TEXT_CHARS)
    axes, problems = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, colon, rest = stripped.partition(":")
        key = key.strip()
        if not colon or not key:
            problems.append(f"line {number}: {stripped!r} is not a key and its values; write them as {EXAMPLE}")
            continue
        if not rest.strip():
            problems.append(f"line {number}: {key} has no values; give one or more after the colon, separated "
                            f"by commas ({EXAMPLE})")
            continue
        try:
            values, labels = _read_values(rest)
        except (yaml.YAMLError, ValueError) as error:
            problems.append(f"line {number}: {key}: the values cannot be read: "
                            f"{getattr(error, 'problem', None) or error}")
            continue
        axes.append(SweepAxis(key=key, values=tuple(values), labels=tuple(labels), line=number))
    if problems:
        raise ValidationError({FIELD: problems})
    return axes


def axes_from_mapping(sweep: dict[str, list[Any]]) -> list[SweepAxis]:
    """The sweep an API request sends, ``{key: [values]}`` in the request's order."""
    problems = [f"{key}: {_label(value)} is not a single value; give a list of numbers, text, true or false"
                for key, values in sweep.items() for value in values if isinstance(value, (list, dict))]
    if problems:
        raise ValidationError({FIELD: problems})
    return [SweepAxis(key=key, values=tuple(values), labels=tuple(map(_label, values))) for key, values in sweep.items()]


def spec_keys(task: str) -> dict[str, tuple[str, ...]]:
    """The keys a ``task`` spec takes, by section (``""`` for the top-level ones)."""
    keys: dict[str, tuple[str, ...]] = {"": TOP_LEVEL_KEYS}
    for section in (*task_section_names(task), "parallel"):
        keys[section] = tuple(name for name in section_model(section).model_fields
                              if task in TASK_ONLY_KEYS.get(f"{section}.{name}", (task,)))
    return keys


def _key_problem(key: str, task: str) -> str | None:
    if key in SET_BY_TEMPER:
        return SET_BY_TEMPER[key]
    if key == "task":
        return "a sweep varies the keys of one task; launch a sweep per task"
    keys = spec_keys(task)
    section, dot, name = key.rpartition(".")
    if section in keys and name in keys[section]:
        return None
    if section in keys and dot:
        return f"not a key of {section} in {with_article(task)} spec; its keys: {', '.join(keys[section])}"
    sections = [name for name in keys if name]
    return (f"not a key of {with_article(task)} spec; write a section and its key ({', '.join(sections)}), e.g. "
            f"optim.learning_rate, or one of {', '.join(TOP_LEVEL_KEYS)}")


def _repeated_values(axis: SweepAxis) -> list[list[str]]:
    """The ways each value given more than once was written (``["1e-4", "0.0001"]``, or ``["8"]``):
    numbers are compared as numbers, since 1e-4 and 0.0001 (or 1 and 1.0) set a float key alike and
    made two runs of one config; a boolean or a text is never the number it may look like."""
    written: dict[tuple[str, Any], list[str]] = {}
    for value, label in zip(axis.values, axis.labels):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        same = ("number", float(value)) if number else (type(value).__name__, json.dumps(value))
        written.setdefault(same, []).append(label)
    return [list(dict.fromkeys(labels)) for labels in written.values() if len(labels) > 1]


def check_axes(axes: list[SweepAxis], *, task: str | None) -> None:
    """Refuse, each by its line, a key the ``task`` spec does not take (any task when ``task`` is not
    one: the spec's own check names that), one Temper sets, one given twice, a line without values,
    a value given twice in a line, and more combinations than ``TEMPER_SWEEP_MAX_RUNS``."""
    if not axes:
        raise ValidationError({FIELD: [f"give at least one key and its values ({EXAMPLE})"]})
    problems = []
    first_place: dict[str, SweepAxis] = {}
    for axis in axes:
        if axis.key in first_place:
            first = first_place[axis.key]
            where = f" (first on line {first.line})" if first.line is not None else ""
            problems.append(f"{axis.place} is given twice{where}; give all its values on one line")
            continue
        first_place[axis.key] = axis
        if task is not None and (problem := _key_problem(axis.key, task)):
            problems.append(f"{axis.place}: {problem}")
        if not axis.values:
            problems.append(f"{axis.place}: no values; give one or more ({EXAMPLE})")
        for written in _repeated_values(axis):
            if len(written) == 1:
                problems.append(f"{axis.place}: {written[0]} is given twice; each value makes its own runs")
            else:
                problems.append(f"{axis.place}: {' and '.join(written)} are the same value; give it once")
    total = math.prod(len(axis.values) for axis in axes)
    if total > max_runs():
        counts = " × ".join(f"{len(axis.values)} ({axis.place})" for axis in axes if len(axis.values) > 1)
        problems.append(f"{counts} = {total} runs; a sweep launches at most {max_runs()} (TEMPER_SWEEP_MAX_RUNS): "
                        "give fewer values")
    if problems:
        raise ValidationError({FIELD: problems})


def combinations(axes: list[SweepAxis]) -> list[Combination]:
    """Every combination of the axes' values, the last axis varying fastest (the order runs are queued in)."""
    indices = itertools.product(*(range(len(axis.values)) for axis in axes))
    return [Combination(number=number, values=tuple(axis.values[i] for axis, i in zip(axes, chosen)),
                        labels=tuple(axis.labels[i] for axis, i in zip(axes, chosen)))
            for number, chosen in enumerate(indices, start=1)]


def with_values(spec: dict[str, Any], axes: list[SweepAxis], combination: Combination) -> dict[str, Any]:
    """``spec`` with each axis' key set to the combination's value (a section made where it is missing)."""
    spec = {key: dict(value) if isinstance(value, dict) else value for key, value in spec.items()}
    for axis, value in zip(axes, combination.values):
        section, dot, name = axis.key.rpartition(".")
        if dot:
            spec[section] = {**(spec.get(section) if isinstance(spec.get(section), dict) else {}), name: value}
        else:
            spec[name] = value
    return spec


def short_keys(axes: list[SweepAxis]) -> list[str]:
    """Each axis' key as run names show it: its last part (``rank``), or the whole key where two
    axes end alike."""
    last = [axis.key.rpartition(".")[2] for axis in axes]
    return [name if last.count(name) == 1 else axis.key for name, axis in zip(last, axes)]


def values_text(axes: list[SweepAxis], combination: Combination) -> str:
    """``lr=0.0001 rank=8``: the combination's values as run names and messages show them."""
    return " ".join(f"{key}={label}" for key, label in zip(short_keys(axes), combination.labels))


def run_name(base: str, axes: list[SweepAxis], combination: Combination, *, max_length: int) -> str:
    """``<base> · lr=0.0001 rank=8``, within ``max_length``: the base is cut first, then the values."""
    values = values_text(axes, combination)
    room = max_length - len(values) - len(" · ")
    if room >= 1:
        return f"{base[:room].rstrip()} · {values}"
    return values[:max_length - 1].rstrip() + "…"


def describe(axes: list[SweepAxis], combination: Combination, total: int) -> str:
    return f"combination {combination.number} of {total}: {values_text(axes, combination)}"


def errors(axes: list[SweepAxis], failures: list[tuple[Combination, dict[str, list[str]]]],
           total: int) -> dict[str, list[str]]:
    """The errors of a sweep whose ``failures`` (each combination that ``plan_run`` refused, with its
    errors by key) make it fail. A problem every combination has, of a key no axis sets, is the launch
    spec's, and is kept under its key as for a single run; the others are the sweep's, each said once,
    naming the line, key and value (or, for a problem of another key, the combination) it came with."""
    swept = {axis.key: index for index, axis in enumerate(axes)}
    common = None
    if len(failures) == total:
        common = {(key, message) for key, messages in failures[0][1].items() for message in messages}
        for _combination, found in failures[1:]:
            common &= {(key, message) for key, messages in found.items() for message in messages}
    result: dict[str, list[str]] = {}
    said: set[str] = set()
    for combination, found in failures:
        for key, messages in found.items():
            axis_index = next((index for name, index in swept.items() if key == name or key.startswith(name + ".")),
                              None)
            for message in messages:
                if axis_index is None and common and (key, message) in common:
                    if message not in result.get(key, []):
                        result.setdefault(key, []).append(message)
                    continue
                if axis_index is not None:
                    axis = axes[axis_index]
                    text = f"{axis.place} = {combination.labels[axis_index]}: {message}"
                else:
                    text = f"{key}: {message}"
                if text in said:
                    continue
                said.add(text)
                result.setdefault(FIELD, []).append(f"{text} ({describe(axes, combination, total)})")
    return result


def _unused_keys(resolved: dict[str, Any]) -> dict[str, str]:
    """Keys of a run's resolved spec that its other settings leave unread, each with the reason: a sweep
    over one of them makes runs that differ in nothing the engine does."""
    unused: dict[str, str] = {}
    method = (resolved.get("peft") or {}).get("method", "none")
    if method == "none":
        for name in ("rank", "alpha", "dropout", "targets", "quant_bits", "group_size"):
            unused[f"peft.{name}"] = "peft.method is none (full fine-tuning trains no adapter)"
    elif method == "lora":
        for name in ("quant_bits", "group_size"):
            unused[f"peft.{name}"] = "peft.method is lora (they set qlora's quantized base)"
    if not (resolved.get("data") or {}).get("eval"):
        for key in ("train.eval_every", "train.eval_samples", "train.sample_max_new_tokens"):
            unused[key] = "there is no data.eval to evaluate on"
    return unused


def _flat(spec: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in spec.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def same_runs(axes: list[SweepAxis], planned: list[tuple[Combination, dict[str, Any]]]) -> list[str]:
    """Problems of combinations that would train the same run as an earlier one: their resolved specs
    (``planned``: each combination with its run's resolved spec) differ only in keys the run does not read
    (``_unused_keys``). Each is named with the keys and why they change nothing."""
    total = len(planned)
    seen: dict[str, Combination] = {}
    problems = []
    for combination, resolved in planned:
        unused = _unused_keys(resolved)
        effective = {key: value for key, value in _flat(resolved).items() if key not in unused and key != "output_dir"}
        fingerprint = json.dumps(effective, sort_keys=True, default=str)
        if (first := seen.get(fingerprint)) is None:
            seen[fingerprint] = combination
            continue
        differing = [axis.key for axis, mine, theirs in zip(axes, combination.values, first.values) if mine != theirs]
        reasons = "; ".join(f"{key} changes nothing: {unused[key]}" for key in differing if key in unused)
        problems.append(f"{describe(axes, combination, total)} would train the same run as "
                        f"{describe(axes, first, total)} ({reasons or 'their specs are the same'}); drop the key "
                        "from the sweep, or sweep what makes it count")
    return problems
