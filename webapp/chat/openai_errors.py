"""A request body the OpenAI-compatible API refuses, in Temper's words and OpenAI's error shape.

pydantic says what is wrong in Python's terms ("Input should be a valid integer", "Field required", "Input
should be a valid dictionary or instance of _Message"), at a location that is a tuple holding the member of
a union it tried (``("temperature", "float")``). A client needs three things: the field, by the path it wrote
(``messages[2].content``, as OpenAI's own errors name it); what was wrong with what it sent; and what to give
instead: the field's ``description`` where the schema gives one, else its type and range as the schema
declares them. Every problem of the body is said (``body_problems``), so that a client mends them all at once rather
than one per request: OpenAI's error is one object naming one ``param``, so its ``message`` holds one line per problem
and ``param`` and ``code`` are the first one's. A value that no member of a union takes is one problem, said once. A
``code`` is OpenAI's for the kind of problem (``missing_required_parameter``, ``invalid_type``, ``invalid_value``),
or ``unsupported_value`` for a field asking for what the answers cannot hold.

A field the schema does not read is ignored (clients send OpenAI's fields that Temper has no use for, ``user``),
but not one that is a near miss of a field it reads (``misspelt_field``: ``temprature``, ``max_token``, ``top-p``,
``stop_sequences``): ignored, it left the answer to that field's default without a word. It is refused with code
``unknown_parameter``, OpenAI's for a field it does not know, saying which field was meant; the body's other fields
are checked all the same (``with_misspellings``), and a field left missing by its misspelling is said once, as the
misspelling.
"""
from __future__ import annotations

import difflib
import json
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pydantic
import pydantic_core
from pydantic.fields import FieldInfo

from webapp.api.problems import value_as_sent
from webapp.core.text import SHOWN_TEXT_MAX_CHARS

# What a value of each kind is, for "5 is not text (a JSON string)", by pydantic's error type and by Python type.
_NOUNS = {str: "text (a JSON string)", int: "a whole number", float: "a number", bool: "true or false",
          list: "a JSON array", dict: "a JSON object"}
_TYPE_ERRORS = {"string_type": str, "int_type": int, "float_type": float, "bool_type": bool, "list_type": list,
                "dict_type": dict, "model_type": dict, "model_attributes_type": dict}
_RANGE_ERRORS = {"greater_than": "too small", "greater_than_equal": "too small", "less_than": "too large",
                 "less_than_equal": "too large"}


@dataclass(frozen=True, kw_only=True)
class BodyProblem:
    """What OpenAI's error body says of a refused request body: ``{"message", "param", "code"}``."""

    message: str
    param: str | None  # the field's path as the client wrote it; None: the body as a whole
    code: str


def body_problems(error: pydantic.ValidationError, *, schema: type[pydantic.BaseModel]) -> list[BodyProblem]:
    """Every problem of ``error``, raised validating a request body against ``schema``, in the schema's order of
    fields, one per field: its path, what was wrong and what to give instead ("messages[1].role: "robot" is not a
    value taken here; give one of system, developer, user, assistant"). A union's members each refuse a value
    (temperature "0.5": float's error and int's): the first one's words say it."""
    problems: dict[str | None, BodyProblem] = {}
    for one in error.errors(include_url=False):
        problem = _body_problem(one, schema=schema)
        problems.setdefault(problem.param, problem)
    return list(problems.values())


def _body_problem(problem: Any, *, schema: type[pydantic.BaseModel]) -> BodyProblem:
    place = _place(schema, problem["loc"])
    kind, value = problem["type"], problem["input"]
    shown, expected = value_as_sent(value), _expected(place.annotation, place.field)
    code = "invalid_value"
    if kind == "unknown_parameter":  # misspelt_problem's, raised for a key of the object at loc
        key = _key_shown(problem["ctx"]["field"])
        path = f"{place.path}.{key}" if place.path else key
        return BodyProblem(message=f"{path}: {problem['msg']}", param=path, code=kind)
    if kind in ("value_error", "unsupported_value"):  # our validators' own words
        words = problem["msg"].removeprefix("Value error, ")
        code = kind if kind == "unsupported_value" else code
    elif kind == "missing":
        words, code = f"missing (it is required); give {expected}", "missing_required_parameter"
    elif kind in _TYPE_ERRORS:
        # A union's member refused the value (temperature "0.5": float's and int's errors): the field's type is
        # what it is not.
        noun = _noun(place.annotation) if place.in_union else _NOUNS[_TYPE_ERRORS[kind]]
        code = "invalid_type"
        if not place.path:
            words = "the body must be a JSON object"
        elif _written_in_quotes(value, place.annotation):
            words = f"{shown} is text (in quotes), not {noun}; give {expected}, without quotes"
        else:
            words = f"{shown} is not {noun}; give {expected}"
    elif kind == "finite_number":
        words = f"{shown} is not a finite number; give {expected}"
    elif kind in _RANGE_ERRORS:
        words = f"{shown} is {_RANGE_ERRORS[kind]}; give {expected}"
    elif kind == "literal_error":
        words = f"{shown} is not a value taken here; give {expected}"
    elif kind == "too_short":
        words = f"{shown} is too short; give {expected}"
    else:
        words = f"{shown} is not taken here; give {expected}"
    return BodyProblem(message=f"{place.path}: {words}" if place.path else words, param=place.path or None, code=code)


# How close (difflib's ratio, on names folded by ``_folded``) a field not read must be to one read to be taken for it:
# at difflib's default, 0.6, OpenAI's own ``store`` was taken for ``stream`` and ``system`` for ``stream``.
NEAR_MISS_CUTOFF = 0.8
# The names other APIs give fields read here, which a client ported from one of them sends (Anthropic's and
# Gemini's stop sequences, Gemini's and OpenAI's Responses API's output budget), by their folded names: too far from
# ours for difflib.
_OTHER_APIS_NAMES = {"stopsequences": "stop", "maxoutputtokens": "max_completion_tokens"}


def _folded(name: str) -> str:
    """``name`` in lower case without ``-`` and ``_``: ``top-p``, ``topP`` and ``top_p`` are one name."""
    return re.sub(r"[-_]", "", name).lower()


def misspelt_field(key: str, *, read: Iterable[str]) -> str | None:
    """The field of ``read`` that ``key``, a field not read, was meant as: the same name once folded (``top-p``,
    ``maxTokens``), another API's name for it (``stop_sequences``), or a name as close as ``NEAR_MISS_CUTOFF``
    (``temprature``, ``max_token``); None for an unrelated field."""
    by_folded = {_folded(name): name for name in read}
    folded = _folded(key)
    if folded in by_folded:
        return by_folded[folded]
    if _OTHER_APIS_NAMES.get(folded) in by_folded.values():
        return _OTHER_APIS_NAMES[folded]
    close = difflib.get_close_matches(folded, list(by_folded), n=1, cutoff=NEAR_MISS_CUTOFF)
    return by_folded[close[0]] if close else None


def misspelt_problem(key: str, meant: str) -> pydantic_core.PydanticCustomError:
    """The error a body model's validator raises for ``key``, a near miss of ``meant`` (``misspelt_field``):
    ``body_problems`` says it with the key's path."""
    return pydantic_core.PydanticCustomError(
        "unknown_parameter", "not a field read here; did you mean {meant}? (A field not read here is ignored: the "
        "answer would have been made without it.)", {"field": key, "meant": meant})


def with_misspellings(*, model: str, data: dict[str, Any], misspelt: dict[str, str],
                      error: pydantic.ValidationError | None) -> pydantic.ValidationError:
    """The error of the object ``data``, validated as ``model``, whose keys ``misspelt`` (key → the field meant) are
    near misses: a problem for each, then those of its fields (``error``; None when they were all good), but not
    the "missing" of a field that a misspelling was meant as: it is missing because of it."""
    meant = {(field,) for field in misspelt.values()}
    fields = [problem for problem in (error.errors(include_url=False) if error is not None else [])
              if not (problem["type"] == "missing" and problem["loc"] in meant)]
    return pydantic.ValidationError.from_exception_data(model, [
        *({"type": misspelt_problem(key, field), "loc": (), "input": data} for key, field in misspelt.items()),
        *map(said_again, fields)])


def said_again(problem: Any) -> dict[str, Any]:
    """A problem of a ``ValidationError`` (``errors()``), to be raised again among others
    (``pydantic.ValidationError.from_exception_data``) in its own words: pydantic makes a line of an error only from
    its type and context, and those of our validators (value_error, unsupported_value) it cannot make from their
    names alone."""
    return {"type": pydantic_core.PydanticCustomError(problem["type"], problem["msg"], problem.get("ctx")),
            "loc": problem["loc"], "input": problem["input"]}


@dataclass(frozen=True)
class _Place:
    path: str  # as the client wrote it: messages[2].content, logit_bias["5"]
    annotation: Any  # what the schema declares there (None where it cannot be told)
    # The model field there, if the path ends at one, or the ``Field()`` an item's type is annotated with
    # (``dict[str, Annotated[Number, Field(description=...)]]``): its description and range.
    field: FieldInfo | None
    in_union: bool  # the location ended at a union member: the value is refused by every member


def _place(schema: type[pydantic.BaseModel], loc: tuple) -> _Place:
    """Where ``loc`` points in ``schema``, walked part by part: a union member's name in it (pydantic's "float",
    "dict[str,any]") is not a part the client wrote, and is left out of the path."""
    path, annotation, field, in_union = "", schema, None, False
    for part in loc:
        annotation = _unwrapped(annotation)
        members = _union_members(annotation)
        if members and isinstance(part, str):
            annotation, in_union = _member(members, part), True
            continue
        in_union = False
        if _is_model(annotation) and isinstance(part, str):
            field = annotation.model_fields.get(part)
            path += f".{part}" if path else part
            annotation = field.annotation if field is not None else None
            continue
        path += f"[{part}]" if isinstance(part, int) else f"[{json.dumps(_key_shown(part), ensure_ascii=False)}]"
        arguments = typing.get_args(annotation)
        annotation = arguments[-1] if typing.get_origin(annotation) in (list, dict) and arguments else None
        field = _item_field(annotation)
    return _Place(path, annotation if not in_union else _union_at(schema, loc), field, in_union)


def _key_shown(key: str) -> str:
    """A key the client sent, as a path shows it: cut to ``SHOWN_TEXT_MAX_CHARS`` characters and "…" (a 5,000-character
    key of logit_bias was the error's whole path)."""
    return key if len(key) <= SHOWN_TEXT_MAX_CHARS else key[:SHOWN_TEXT_MAX_CHARS] + "…"


def _item_field(annotation: Any) -> FieldInfo | None:
    """The ``Field()`` an item's type is annotated with, where it is: an item has no model field of its own."""
    if typing.get_origin(annotation) is typing.Annotated:
        return next((one for one in annotation.__metadata__ if isinstance(one, FieldInfo)), None)
    return None


def _union_at(schema: type[pydantic.BaseModel], loc: tuple) -> Any:
    """The union whose member's name ends ``loc``: the annotation at ``loc`` without it."""
    return _place(schema, loc[:-1]).annotation


def _unwrapped(annotation: Any) -> Any:
    """``annotation`` without what says nothing of its JSON type: ``Annotated`` (StrictInt) and ``| None``."""
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        members = _union_members(annotation)
        if len(members) == 1:
            annotation = members[0]
            continue
        return annotation


def _union_members(annotation: Any) -> tuple:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(member for member in typing.get_args(annotation) if member is not type(None))
    return ()


def _member(members: tuple, tag: str) -> Any:
    """The member pydantic names ``tag``: "float", "int", "dict[str,any]", "list[str]", or a model's name."""
    name = tag.split("[", 1)[0]
    for member in members:
        base = _unwrapped(member)
        origin = typing.get_origin(base) or base
        if getattr(origin, "__name__", None) == name:
            return member
    return None


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel)


def _json_type(annotation: Any) -> Any:
    base = _unwrapped(annotation)
    if _is_model(base):
        return dict
    return typing.get_origin(base) or base


def _noun(annotation: Any) -> str:
    """What a value of ``annotation`` is: "a number", "text (a JSON string) or a JSON object"."""
    members = _union_members(_unwrapped(annotation)) or (annotation,)
    kinds = list(dict.fromkeys(_json_type(member) for member in members))
    if int in kinds and float in kinds:  # a whole number is a number ("a number or a whole number" said it twice)
        kinds.remove(int)
    return " or ".join(_NOUNS[kind] for kind in kinds if kind in _NOUNS) or "a value this field takes"


def _expected(annotation: Any, field: FieldInfo | None) -> str:
    """What to give: the field's description, else its type (and range) as the schema declares it."""
    if field is not None and field.description:
        return field.description
    base = _unwrapped(annotation)
    if typing.get_origin(base) is typing.Literal:
        return "one of " + ", ".join(str(value) for value in typing.get_args(base))
    if _is_model(base):
        keys = [name for name, one in base.model_fields.items() if one.is_required()] or list(base.model_fields)
        return "a JSON object {" + ", ".join(f'"{key}": ...' for key in keys) + "}"
    if typing.get_origin(base) is list and typing.get_args(base) and typing.get_args(base)[0] is not Any:
        return f"a JSON array, each item {_expected(typing.get_args(base)[0], None)}"
    words = _noun(base)
    if words in (_NOUNS[int], _NOUNS[float]) and (bounds := _range(field, whole=words == _NOUNS[int])):
        words += f" {bounds}"
    return words


def _range(field: FieldInfo | None, *, whole: bool) -> str:
    """The field's range in words: "from 1 to 8192", "above 0 and at most 1"; "" where it has none."""
    bounds: dict[str, Any] = {}
    for constraint in field.metadata if field is not None else ():
        bounds.update({name: getattr(constraint, name) for name in ("ge", "gt", "le", "lt")
                       if getattr(constraint, name, None) is not None})
    if whole:  # a whole number below 2**63 is one up to 2**63 - 1: said as the bound it can be
        if "gt" in bounds:
            bounds["ge"] = bounds.pop("gt") + 1
        if "lt" in bounds:
            bounds["le"] = bounds.pop("lt") - 1
    shown = {name: _number(value) for name, value in bounds.items()}
    if "ge" in shown and "le" in shown:
        return f"from {shown['ge']} to {shown['le']}"
    lower = f"at least {shown['ge']}" if "ge" in shown else f"above {shown['gt']}" if "gt" in shown else ""
    upper = f"at most {shown['le']}" if "le" in shown else f"below {shown['lt']}" if "lt" in shown else ""
    return " and ".join(words for words in (lower, upper) if words)


def _number(value: Any) -> str:
    """A bound as a person writes it: 0, not 0.0."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _written_in_quotes(value: Any, annotation: Any) -> bool:
    """A number or true/false sent as text ("0.5", "true"): the remedy is to leave the quotes out."""
    if not isinstance(value, str):
        return False
    kinds = {_json_type(member) for member in _union_members(_unwrapped(annotation)) or (annotation,)}
    if bool in kinds and value.strip() in ("true", "false"):
        return True
    if kinds & {int, float}:
        try:
            float(value)
        except ValueError:
            return False
        return True
    return False
