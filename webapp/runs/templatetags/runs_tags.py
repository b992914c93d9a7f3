"""Template helpers of the run pages."""
from __future__ import annotations

import json
from typing import Any

from django import template

from webapp.runs.models import fold_tag
from webapp.runs.specform import argument_input_value, one_of_errors, reward_functions

register = template.Library()


@register.filter
def get_item(mapping: Any, key: str) -> Any:
    """``mapping[key]`` for keys a template cannot spell (``final_metrics|get_item:"eval/loss"``)."""
    if isinstance(mapping, dict):
        return mapping.get(key)
    return None


@register.filter
def same_tag(typed: str, tag: str) -> bool:
    """Whether the ``?tag=`` filter ``typed`` is ``tag``, case aside, as the filter matches it (the tag menu picks
    the project's spelling of a tag typed in another)."""
    return fold_tag(typed) == fold_tag(tag)


@register.filter
def metric_value(value: float | None) -> str:
    """A logged metric as a person reads it: whole numbers whole (``6336``), magnitudes of a thousand and
    more to the unit (``5304``), others to 4 significant digits (``9.473``, ``0.0002``, ``2e-05``), so a
    learning rate is not shown as ``0.0000``."""
    if value is None:
        return "—"
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if value.is_integer() or abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.4g}"


@register.filter
def duration_short(seconds: float | None) -> str:
    """``3725`` → ``1h 2m``; ``75`` → ``1m 15s``; ``9.4`` → ``9s``."""
    if seconds is None:
        return "—"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def _reward_row(field, index: Any, term: dict, errors: dict, functions,
                reference_choices: dict | None = None) -> dict[str, Any]:
    """What one reward row shows: its function, weight, each function's argument inputs (only the
    chosen function's visible; an argument keyed ``<function>.<argument>`` in ``reference_choices``,
    such as ``reward_model.model``, a select of those) and the errors under ``<key>.<index>``."""
    prefix = f"{field.name}.{index}"
    chosen = term.get("name", "")
    args = term.get("args") or {}
    groups = [{
        "function": function, "hidden": function.name != chosen,
        "arguments": [{
            "argument": argument, "input_name": f"{prefix}.args.{function.name}.{argument.name}",
            "input_id": f"spec-{field.name.replace('.', '-')}-{index}-{function.name}-{argument.name}",
            "value": (value := argument_input_value(argument, args.get(argument.name)) if function.name == chosen
                      else ""),
            "choices": _with_current(reference_choices, f"{function.name}.{argument.name}", value),
            "default": "" if argument.required else argument_input_value(argument, argument.default),
            "errors": errors.get(f"{prefix}.args.{argument.name}", []) if function.name == chosen else [],
        } for argument in function.arguments],
    } for function in functions.values()]
    row_errors = [f"{key.removeprefix(prefix + '.') if key != prefix else 'row'}: {message}"
                  for key, messages in errors.items()
                  if key == prefix or (key.startswith(prefix + ".") and not key.startswith(prefix + ".args."))
                  for message in messages]
    weight = term.get("weight", "")
    return {"index": index, "prefix": prefix, "name": chosen, "weight": "" if weight in (None, "") else weight,
            # An eval metric is scored alone: a weight there would change nothing, so none is offered.
            "weighted": field.name.rsplit(".", 1)[-1] != "eval_metrics",
            "groups": groups, "errors": row_errors}


def default_text(value: Any) -> str:
    """A key's default as a spec (or the YAML view) writes it: ``false``, ``q_proj, k_proj`` rather than
    Python's ``False`` and ``['q_proj', 'k_proj']``; ``""`` for no default."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(item) for item in value) or "none"
    return str(value)


@register.inclusion_tag("runs/_spec_field.html")
def spec_field(field, initial: dict, errors: dict, reference_choices: dict | None = None,
               model_limits: dict | None = None, labelled: bool = True) -> dict[str, Any]:
    """One schema-built input with its value, help text and errors; a key of ``reference_choices``
    (``ppo.reward_model``) is a select of those ``(id, label)`` choices instead. A key of ``model_limits``
    (``views._model_limits``) says the chosen model's limit in its help, which the page's script keeps up.
    ``labelled=False``: no label of its own, where the box around it names it (the evaluation form's reward rows
    under their fieldset's legend read "Reward functions" twice)."""
    value = initial.get(field.name, field.default)
    if field.widget == "rewards":
        functions = reward_functions()
        terms = value if isinstance(value, list) else []
        return {
            "field": field, "functions": list(functions.values()), "errors": errors.get(field.name, []),
            "default": None,
            "rows": [_reward_row(field, index, term if isinstance(term, dict) else {}, errors, functions,
                                 reference_choices) for index, term in enumerate(terms)],
            "blank_row": _reward_row(field, "__row__", {}, {}, functions, reference_choices),
            "labelled": labelled,
        }
    field_errors = [*errors.get(field.name, []), *one_of_errors(errors, field.name)]
    # The input is described by its help and its errors (ids as the template numbers them), so that a
    # screen reader reaching it hears why it was refused, as for Django's own forms.
    described_by = " ".join([f"{field.input_id}-help",
                             *(f"{field.input_id}-error-{number}" for number in range(1, len(field_errors) + 1))])
    return {
        "json_value": json.dumps(value) if field.widget == "json" and value not in (None, "") else (value or ""),
        "field": field,
        "value": "" if value is None else value,
        "selected": [str(item) for item in value] if isinstance(value, (list, tuple)) else [str(value)],
        "errors": field_errors, "described_by": described_by,
        "default": default_text(field.default), "default_is_list": isinstance(field.default, (list, tuple)),
        "reference_choices": _with_current(reference_choices, field.name, value),
        "model_limit": (model_limits or {}).get(field.name),
        "labelled": labelled,
    }


def _with_current(reference_choices: dict | None, key: str, value: Any) -> list | None:
    """The choices of ``key``, keeping a value given before (Duplicate, a rejected form) selectable."""
    choices = (reference_choices or {}).get(key)
    if choices is None or value in (None, "") or value in {choice for choice, _label in choices}:
        return choices
    return [(value, value), *choices]
