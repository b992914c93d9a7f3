"""The launch form, built from the engine's job-spec schema.

Design note: the form is not written field by field. ``form_sections(task)`` walks the pydantic
models of ``jaxengine.spec`` (the sections a task accepts, per ``TASK_SECTIONS``) and turns every
field into a ``SpecField`` — a select for a ``Literal``, a checkbox for a ``bool``, a number input
for an ``int``/``float``, a set of checkboxes for a tuple of literals — with the schema's default
and description as help text. A task or knob the engine adds appears here without web code; only
the choice of starting model and datasets (``model``, ``data.train``, ``data.eval``) is the web's,
since people pick registered objects by public id rather than typing server paths.

A list of reward terms (``grpo.rewards``, ``grpo.eval_metrics``, ``ppo.rewards``: any key typed
``tuple[RewardTermSpec, ...]``) is a list of rows — a function of the engine's reward registry
(``jaxengine.rewards.reward_catalog``, jax-free), its weight, and an input per keyword argument
its signature declares — posted as ``<key>.<row>.name``, ``<key>.<row>.weight`` and
``<key>.<row>.args.<function>.<argument>`` (the function in the name, so each function's inputs
can sit in the row and only the chosen one's are read). Keys of other types (a mapping) are edited
as JSON. ``spec_from_form(task, data)`` reads a submitted form back into a spec mapping (strings to
typed values where the schema needs it; blanks to the default, or to null for optional keys; bad
JSON or an argument of the wrong type is a ``ValidationError`` on its dotted key, e.g.
``grpo.rewards.1.args.max_length``), and ``spec_initial(spec)`` flattens a spec mapping into
initial form values (Duplicate, presets).

The "Scale-out" fieldset (``scale_out_section(task)``) holds the keys that say where a job runs
rather than what it trains: the mesh layout ``parallel.data/fsdp/tensor`` (all blank: no
``parallel`` section, the engine's default layout), and ``hosts`` (tasks in ``MULTI_HOST_TASKS``)
and ``pool``, the host pool whose workers take the job (a select of the pools live workers announce).
"""
from __future__ import annotations

import json
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

from django.core.exceptions import ValidationError
from pydantic import BaseModel, TypeAdapter
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import PydanticUndefined

from jaxengine.rewards import RewardArgument, RewardDescription, reward_catalog
from jaxengine.spec import MULTI_HOST_TASKS, TASK_ONLY_KEYS, TASK_SECTIONS, JobSpec, RewardTermSpec, Task
from webapp.core.numbers import TOO_MANY_DIGITS, whole_number
from webapp.runs.presets import preset_spec, presets_for

COMMON_SECTIONS = ("data", "peft", "optim", "train")
# Keys the web fills itself: datasets are chosen from lists, and their column names come from the
# dataset versions' own column mappings; a run's model is read as its Run row says (run_spec_template_kwargs).
REFERENCE_KEYS = frozenset({"data.train", "data.eval", "data.columns", "data.run_spec_template_kwargs"})


def tasks() -> tuple[str, ...]:
    """Every task the engine's spec accepts, in its order."""
    return typing.get_args(Task)


@dataclass(frozen=True, kw_only=True)
class SpecField:
    """One form input for one spec key (``name`` is the dotted key, e.g. ``optim.learning_rate``)."""

    name: str
    label: str
    widget: Literal["select", "checkbox", "number", "multi", "text", "json", "rewards"]
    default: Any
    help: str
    optional: bool
    choices: tuple[Any, ...] = ()
    # What a blank input means, shown in it ("none" for optional keys unless said otherwise).
    placeholder: str = ""

    @property
    def input_id(self) -> str:
        return "spec-" + self.name.replace(".", "-")


@dataclass(frozen=True, kw_only=True)
class SpecSection:
    name: str
    title: str
    fields: tuple[SpecField, ...]


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return members[0], True
    return annotation, False


def section_model(section: str) -> type[BaseModel]:
    """The pydantic model of spec section ``section`` (``data``, ``optim``, ``dpo``, ...)."""
    model, _ = _strip_optional(JobSpec.model_fields[section].annotation)
    return model


def _spec_field(section: str, key: str, info) -> SpecField:
    annotation, optional = _strip_optional(info.annotation)
    default = None if info.default is PydanticUndefined else info.default
    origin = typing.get_origin(annotation)
    common = dict(name=f"{section}.{key}", label=key.replace("_", " "), help=info.description or "",
                  optional=optional)
    if origin is Literal:
        return SpecField(widget="select", default=default, choices=typing.get_args(annotation), **common)
    if origin in (tuple, list):
        item, _ = _strip_optional(typing.get_args(annotation)[0])
        if typing.get_origin(item) is Literal:
            return SpecField(widget="multi", default=list(default or ()), choices=typing.get_args(item), **common)
        if item is RewardTermSpec:
            return SpecField(widget="rewards", default=_json_default(list(default or ())), **common)
    if annotation is bool:
        return SpecField(widget="checkbox", default=bool(default), **common)
    if annotation in (int, float):
        return SpecField(widget="number", default=default, **common)
    if annotation is str:
        return SpecField(widget="text", default=default, **common)
    # Lists of sub-sections (e.g. grpo.rewards: [{name, weight, args}]) and mappings: edited as JSON.
    if default is None and info.default_factory is not None:
        default = info.default_factory()
    return SpecField(widget="json", default=_json_default(default), **common)


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_json_default(item) for item in value]
    return value


def task_section_names(task: str) -> tuple[str, ...]:
    """Sections of a ``task`` spec: the common ones, then the task's own (``dpo``, ``reward``, ...)."""
    return COMMON_SECTIONS + tuple(TASK_SECTIONS.get(task, ()))


def form_sections(task: str) -> list[SpecSection]:
    """The form of ``task``: one section per spec section, one field per schema key."""
    sections = []
    for name in task_section_names(task):
        model = section_model(name)
        fields = tuple(
            _spec_field(name, key, info)
            for key, info in model.model_fields.items()
            if f"{name}.{key}" not in REFERENCE_KEYS and task in TASK_ONLY_KEYS.get(f"{name}.{key}", (task,))
        )
        sections.append(SpecSection(name=name, title=section_title(model.__doc__, name), fields=fields))
    return sections


def section_title(docstring: str | None, name: str) -> str:
    """A fieldset's subtitle from its schema's docstring, as plain text: the first line, without the
    section's own name it opens with (the legend shows it already) and without reST double backticks."""
    line = (docstring or "").strip().partition("\n")[0]
    line = re.sub(rf"^``{re.escape(name)}``:\s*", "", line)
    return line.replace("``", "") or name


SCALE_OUT = "scale-out"


def scale_out_section(task: str) -> SpecSection:
    """The Scale-out fieldset of ``task``'s form: ``parallel.data``, ``parallel.fsdp``,
    ``parallel.tensor`` (blank by default: no ``parallel`` section), ``hosts`` where the task runs on
    several hosts, and ``pool``."""
    parallel = section_model("parallel")
    fields = [SpecField(name=f"parallel.{key}", label=key, widget="number", default=None, optional=True,
                        placeholder="default layout", help=info.description or "")
              for key, info in parallel.model_fields.items()]
    top_level = ("hosts", "pool") if task in MULTI_HOST_TASKS else ("pool",)
    for key in top_level:
        info = JobSpec.model_fields[key]
        fields.append(SpecField(name=key, label=key, widget="number" if key == "hosts" else "text",
                                default=info.default, optional=False, help=info.description or ""))
    return SpecSection(name=SCALE_OUT, title=section_title(parallel.__doc__, "parallel"), fields=tuple(fields))


def _read_scale_out(task: str, data: Any) -> dict[str, Any]:
    """The spec keys of the Scale-out fieldset that were given: typed values are left to the spec
    (which names a wrong one, e.g. ``parallel.fsdp``), blanks to the default."""
    spec: dict[str, Any] = {}
    for field in scale_out_section(task).fields:
        raw = data.get(field.name, "").strip()
        if not raw:
            continue
        section, _, key = field.name.rpartition(".")
        value = _typed_number(raw) if field.widget == "number" else raw
        if section:
            spec.setdefault(section, {})[key] = value
        else:
            spec[key] = value
    return spec


def _coerce_choice(raw: str, choices: tuple[Any, ...]) -> Any:
    # Literal[4, 8] arrives as "4": give pydantic the schema's own value, or the raw text to reject.
    for choice in choices:
        if str(choice) == raw:
            return choice
    return raw


def spec_from_form(task: str, data: Any) -> dict[str, Any]:
    """A spec mapping from submitted form ``data`` (a QueryDict): ``task``, ``model``, ``data.train``,
    ``data.eval`` and every schema field of the task's sections. Validation is left to the spec;
    inputs that cannot be read (bad JSON, an argument of the wrong type) raise ``ValidationError``."""
    spec, errors = read_form(task, data)
    if errors:
        raise ValidationError(errors)
    return spec


def read_form(task: str, data: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """``spec_from_form``'s spec and its input errors by dotted key, without raising: the launch
    view shows the form again with what was typed."""
    errors: dict[str, str] = {}
    spec: dict[str, Any] = {"task": task, "model": data.get("model", "").strip()}
    sections: dict[str, dict[str, Any]] = {name: {} for name in task_section_names(task)}
    sections["data"]["train"] = data.get("data.train", "").strip()
    if data.get("data.eval", "").strip():
        sections["data"]["eval"] = data.get("data.eval").strip()
    for section in form_sections(task):
        for field in section.fields:
            key = field.name.split(".", 1)[1]
            if field.widget == "checkbox":
                sections[section.name][key] = field.name in data
                continue
            if field.widget == "multi":
                sections[section.name][key] = [_coerce_choice(value, field.choices) for value in data.getlist(field.name)]
                continue
            if field.widget == "rewards":
                sections[section.name][key], row_errors = reward_rows_from_form(field.name, data)
                errors.update(row_errors)
                continue
            raw = data.get(field.name, "").strip()
            if field.widget == "json":
                if raw:
                    try:
                        sections[section.name][key] = json.loads(raw)
                    except json.JSONDecodeError as error:
                        errors[field.name] = f"not JSON: {error.msg} at column {error.colno}"
                    except ValueError:  # a number past Python's digit limit
                        errors[field.name] = TOO_MANY_DIGITS
                    except RecursionError:
                        errors[field.name] = "it nests too deeply to be read; write it flatter"
                continue
            # "none" is a value of some choices (peft.method: none trains every weight), not an empty input.
            if raw == "" or (raw.lower() in ("none", "null") and raw not in field.choices):
                if field.optional:
                    sections[section.name][key] = None
                continue
            if field.widget == "select":
                sections[section.name][key] = _coerce_choice(raw, field.choices)
            else:
                sections[section.name][key] = _typed_number(raw) if field.widget == "number" else raw
    spec.update(sections)
    spec.update(_read_scale_out(task, data))
    return spec, errors


def _typed_number(raw: str) -> Any:
    # The spec takes numbers only ("512" in quotes is refused), and a form's inputs are text. Text that
    # is no finite number ('abc', '1e400', 'nan') stays as typed, for the spec to name.
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        number = float(raw)
    except ValueError:
        return raw
    return number if math.isfinite(number) else raw


def spec_initial(spec: dict[str, Any]) -> dict[str, Any]:
    """Flatten a spec mapping into ``{"model": ..., "optim.learning_rate": ..., "hosts": ...}`` form values."""
    initial: dict[str, Any] = {"model": spec.get("model", "")}
    for section, values in spec.items():
        if isinstance(values, dict):
            for key, value in values.items():
                initial[f"{section}.{key}"] = value
        elif section in ("hosts", "pool"):
            initial[section] = values
    return initial


# Keys a YAML spec may hold that Temper sets itself, and why they are refused (``services.plan_run``
# refuses them at launch, the switch to the form here).
SET_BY_TEMPER = {"output_dir": "Temper gives every run its own directory; remove output_dir",
                 "data.columns": "set from the dataset versions' column mappings (chosen at upload); remove it",
                 "data.run_spec_template_kwargs": "a run's model renders with the variables its Run row records, "
                                                  "never its directory's spec.yaml; remove it"}


def keys_the_form_cannot_show(task: str, spec: dict[str, Any]) -> dict[str, str]:
    """Keys of a YAML ``spec`` that ``task``'s form has no input for, or holds a value its input cannot
    show (a select's value outside its choices), each with the reason. Switching from YAML to the form
    refuses these rather than dropping them: a misspelt key or choice would otherwise vanish and the run
    launch with the default in its place."""
    fields = {field.name: field for section in form_sections(task) for field in section.fields}
    fields.update((field.name, field) for field in scale_out_section(task).fields)
    sections = set(task_section_names(task)) | {"parallel"}
    problems: dict[str, str] = {}
    for key, value in spec.items():
        if key in ("task", "model"):
            continue
        if key in sections and isinstance(value, dict):
            for sub, sub_value in value.items():
                name = f"{key}.{sub}"
                if name in ("data.train", "data.eval"):
                    continue
                field = fields.get(name)
                if field is None and name in TASK_ONLY_KEYS:
                    if sub_value != section_model(key).model_fields[sub].default:
                        problems[name] = f"only {' and '.join(TASK_ONLY_KEYS[name])} read it; remove it"
                elif field is None:
                    problems[name] = SET_BY_TEMPER.get(name, f"the {task} form has no field for it")
                elif field.widget == "select" and sub_value is not None and not any(
                        str(choice) == str(sub_value) for choice in field.choices):
                    problems[name] = f"{sub_value!r} is not one of {', '.join(map(str, field.choices))}"
                elif field.widget == "checkbox" and _as_bool(sub_value) is None:
                    problems[name] = f"{sub_value!r} is not true or false"
        elif value is None or (key in JobSpec.model_fields and value == JobSpec.model_fields[key].default):
            continue  # what a written spec holds for a section or key the task leaves unset: nothing lost
        elif key not in fields:
            problems[key] = SET_BY_TEMPER.get(key, f"the {task} form has no field for it")
    return problems


_BOOL = TypeAdapter(bool)


def _as_bool(value: Any) -> bool | None:
    """``value`` as a checkbox state (``"false"``, ``"no"`` and 0 are false: pydantic's lax reading; the
    schema itself takes true and false only), None when it is none: a checkbox showed any non-empty string,
    "false" too, as ticked."""
    try:
        return _BOOL.validate_python(value)
    except PydanticValidationError:
        return None


def with_checkbox_values(task: str, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with each value of a checkbox field of ``task``'s form read as its checkbox shows it
    (``_as_bool``; ``keys_the_form_cannot_show`` has refused the ones that are not booleans)."""
    checkboxes = {field.name for section in form_sections(task) for field in section.fields if field.widget == "checkbox"}
    spec = dict(spec)
    for name in checkboxes:
        section, key = name.split(".", 1)
        if isinstance(spec.get(section), dict) and key in spec[section] and _as_bool(spec[section][key]) is not None:
            spec[section] = {**spec[section], key: _as_bool(spec[section][key])}
    return spec


# Keys of which a spec gives exactly one (the schema refuses both): one kept from another task's page
# drops its rival from the new task's preset.
ONE_OF_KEYS = (("train.max_steps", "train.epochs"),)


def one_of_errors(errors: dict[str, list[str]], key: str) -> list[str]:
    """The messages of ``errors`` about the pair of ``ONE_OF_KEYS`` holding ``key``: the spec checks a pair
    in its section ("train: give exactly one of max_steps and epochs"), and the form shows that at both
    inputs, not only in its list of errors."""
    for pair in ONE_OF_KEYS:
        if key in pair:
            section = key.split(".", 1)[0]
            names = [rival.split(".", 1)[1] for rival in pair]
            return [message for message in errors.get(section, []) if all(name in message for name in names)]
    return []


def without_rivals(spec: dict[str, Any], kept: dict[str, Any]) -> dict[str, Any]:
    """``spec`` without the rival of each one-of key in ``kept`` (``ONE_OF_KEYS``)."""
    spec = {key: dict(value) if isinstance(value, dict) else value for key, value in spec.items()}
    for pair in ONE_OF_KEYS:
        for key in pair:
            if kept.get(key) is None:
                continue
            for rival in pair:
                section, name = rival.split(".", 1)
                if rival != key and isinstance(spec.get(section), dict):
                    spec[section].pop(name, None)
    return spec


def merge_spec(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overlay``'s keys, section by section."""
    merged = dict(base)
    for key, value in overlay.items():
        merged[key] = merge_spec(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def with_form_defaults(task: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Every schema default of ``task``'s form, overlaid with ``spec``."""
    defaults: dict[str, Any] = {"task": task}
    for section in form_sections(task):
        defaults[section.name] = {field.name.split(".", 1)[1]: field.default for field in section.fields}
    return merge_spec(defaults, spec)


def changed_from_presets(task: str, values: dict[str, Any]) -> dict[str, Any]:
    """The dotted-key ``values`` of a ``task`` launch page that someone chose: those neither the
    schema nor any preset of ``task`` gives, and the model and data picked."""
    scale_out = {field.name: field.default for field in scale_out_section(task).fields}
    starts = [{**scale_out, **spec_initial(with_form_defaults(task, preset_spec(task, preset["name"])))}
              for preset in presets_for(task)]
    return {key: value for key, value in values.items()
            if value not in ("", None) and all(start.get(key, _ABSENT) != value for start in starts)}


_ABSENT = object()


def carry_to_task(old_task: str, new_task: str, changes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """What a switch of the launch page from ``old_task`` to ``new_task`` keeps of the values someone
    changed there (``changes``, by dotted key as ``spec_initial`` gives them), and what it leaves out
    with the reason. A key keeps its name where the new form has it (``optim.learning_rate``); a key
    of the old task's own section moves to the new task's section of that name (``grpo.rewards`` to
    ``ppo.rewards``). Everything else on the new page is the new task's first preset, so that a DPO
    form does not inherit an SFT learning rate nobody chose."""
    fields = {field.name for section in form_sections(new_task) for field in section.fields}
    fields.update(field.name for field in scale_out_section(new_task).fields)
    fields.update(("model", "data.train", "data.eval"))
    kept: dict[str, Any] = {}
    dropped: dict[str, str] = {}
    for key, value in changes.items():
        section, _, sub = key.partition(".")
        if key in fields:
            kept[key] = value
        elif section in TASK_SECTIONS.get(old_task, ()) and (moved := next(
                (f"{own}.{sub}" for own in TASK_SECTIONS.get(new_task, ()) if f"{own}.{sub}" in fields), None)):
            kept[moved] = value
        else:
            dropped[key] = f"the {new_task} form has no field for it"
    return kept, dropped


# The key whose most is the chosen model's context: the form says that limit at its input and starts within it.
CONTEXT_KEY = "data.max_seq_len"


def within_model_context(task: str, spec: dict[str, Any], positions: int | None) -> dict[str, Any]:
    """``spec`` (a preset's, for a new form) with ``data.max_seq_len`` at most the model's ``positions``: its
    value there, else the schema's default, is the most it starts at. A longer one is refused at launch
    (``services._check_model_positions``), so a form opened on a short model started refused."""
    if positions is None:
        return spec
    data = spec.get("data") or {}
    start = data.get("max_seq_len", with_form_defaults(task, {})["data"]["max_seq_len"])
    if not isinstance(start, int) or start <= positions:
        return spec
    return {**spec, "data": {**data, "max_seq_len": positions}}


def spec_from_keys(values: dict[str, Any]) -> dict[str, Any]:
    """The spec mapping of dotted-key ``values`` (``spec_initial``'s inverse)."""
    spec: dict[str, Any] = {}
    for key, value in values.items():
        section, _, sub = key.partition(".")
        if sub:
            spec.setdefault(section, {})[sub] = value
        else:
            spec[key] = value
    return spec


# ---- reward-term rows -----------------------------------------------------------------------


def reward_functions() -> dict[str, RewardDescription]:
    """The engine's reward functions by name, with their arguments (what a reward row offers)."""
    return {description.name: description for description in reward_catalog()}


def _row_indices(key: str, data: Any) -> list[int]:
    indices = set()
    for name in data:
        if name.startswith(key + "."):
            index = whole_number(name[len(key) + 1:].split(".", 1)[0])
            if index is not None:
                indices.add(index)
    return sorted(indices)


def _argument_value(argument: RewardArgument, raw: str) -> Any:
    """The typed value of one argument input; ValueError says what was expected."""
    if argument.kind == "integer":
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{raw!r} is not a whole number") from None
    if argument.kind == "number":
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{raw!r} is not a number") from None
    if argument.kind == "boolean":
        if raw not in ("true", "false"):
            raise ValueError(f"{raw!r} is not true or false")
        return raw == "true"
    if argument.kind == "choice" and raw not in argument.choices:
        raise ValueError(f"{raw!r} is not one of {', '.join(argument.choices)}")
    if argument.kind == "text_list":
        return [line.strip() for line in raw.splitlines() if line.strip()]
    return raw


def reward_rows_from_form(key: str, data: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The reward terms of rows ``<key>.<row>.*`` in row order, and the errors of their inputs by
    dotted key (``<key>.<n>.weight``, ``<key>.<n>.args.<argument>``, n counting the terms). A row
    without a function is an unused blank one and left out. Blank weights and arguments keep the
    function's defaults; a wrong one stays as typed, so that the form shows it again."""
    functions = reward_functions()
    terms, errors = [], {}
    for index in _row_indices(key, data):
        prefix = f"{key}.{index}"
        name = data.get(f"{prefix}.name", "").strip()
        if not name:
            continue
        # Errors name the row by its place in the list the spec receives.
        place = f"{key}.{len(terms)}"
        term: dict[str, Any] = {"name": name}
        weight = data.get(f"{prefix}.weight", "").strip()
        if weight:
            try:
                term["weight"] = float(weight)
            except ValueError:
                term["weight"] = weight
                errors[f"{place}.weight"] = f"{weight!r} is not a number"
        args = {}
        for argument in functions[name].arguments if name in functions else ():
            raw = data.get(f"{prefix}.args.{name}.{argument.name}", "").strip()
            if raw == "":
                continue
            try:
                args[argument.name] = _argument_value(argument, raw)
            except ValueError as error:
                args[argument.name] = raw
                errors[f"{place}.args.{argument.name}"] = str(error)
        if args:
            term["args"] = args
        terms.append(term)
    return terms, errors


def argument_input_value(argument: RewardArgument, value: Any) -> str:
    """How an argument's value is written back into its input (lists one item per line)."""
    if value is None:
        return ""
    if argument.kind == "text_list" and isinstance(value, (list, tuple)):
        return "\n".join(str(item) for item in value)
    if argument.kind == "boolean" and isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
