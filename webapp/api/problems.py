"""A REST API body's pydantic errors in a user's words, keyed by the field as the client wrote it.

pydantic's own words name Python, not the JSON a client sends ("Input should be a valid dictionary",
"Extra inputs are not permitted" without the fields that are), and its error locations hold the
members of a union (``samples.0.prompt.str``), a key no client sent. The job spec (``jaxengine.spec``)
and pipeline documents (``webapp.runs.pipelines``) already read 'required key is missing' and
'unknown key; allowed keys here: ...'; the API's bodies read the same.
"""
from __future__ import annotations

import difflib
import json
import types
import typing
from typing import Any

import pydantic

from jaxengine.spec import out_of_range, wrongly_written_value
from jaxengine.words import counted

# What a value of each strict pydantic type is, in JSON's words: "5 is not text (a JSON string)".
_EXPECTED = {"dict_type": "a JSON object ({...})", "model_type": "a JSON object ({...})",
             "model_attributes_type": "a JSON object ({...})", "list_type": "a JSON array ([...])",
             "string_type": "text (a JSON string)", "bool_type": "true or false", "int_type": "a whole number",
             "float_type": "a number", "finite_number": "a finite number"}


def problems_by_field(error: pydantic.ValidationError, *,
                      schema: type[pydantic.BaseModel] | None) -> dict[str, list[str]]:
    """``{field path: [messages]}`` for ``error``, raised validating a body against ``schema``; ``__all__``
    for the body as a whole. A value that no member of a union takes is one problem, said once."""
    problems: dict[str, list[str]] = {}
    refused_unions: dict[str, tuple[Any, tuple]] = {}  # key → (the value every member refused, its loc)
    deeper: set[str] = set()  # unions whose value one member took in part: its own problems are the ones to say
    for problem in error.errors(include_url=False):
        loc, union_depth = _as_sent(schema, problem["loc"])
        if union_depth is None:
            problems.setdefault(_key(loc), []).append(_in_words(problem, schema=schema, loc=loc))
            continue
        union_key = _key(loc[:union_depth])
        if len(loc) > union_depth:
            deeper.add(union_key)
            problems.setdefault(_key(loc), []).append(_in_words(problem, schema=schema, loc=loc))
        else:
            refused_unions.setdefault(union_key, (problem["input"], loc))
    for key, (value, loc) in refused_unions.items():
        if key not in deeper:
            problems.setdefault(key, []).append(f"{value_as_sent(value)} is not {_union_expects(schema, loc)}")
    return problems


def _key(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "__all__"


def _as_sent(schema: type[pydantic.BaseModel] | None, loc: tuple) -> tuple[tuple, int | None]:
    """``loc`` without the union members pydantic puts in it (``samples.0.prompt.str``: ``samples.0.prompt``),
    found by walking ``schema`` (a metric named "str" is a key, not a member), and how many of its parts
    lead to the first union, None when it goes through none."""
    sent: list = []
    union_depth = None
    annotation: Any = schema
    for part in loc:
        annotation = _optional_unwrapped(annotation)
        members = _union_members(annotation)
        if members and isinstance(part, str):
            member = next((one for one in members if _member_tag(one) == part), None)
            if member is not None:
                union_depth = len(sent) if union_depth is None else union_depth
                annotation = member
                continue
        sent.append(part)
        annotation = _inside(annotation, part)
    return tuple(sent), union_depth


def _member_tag(member: Any) -> str:
    origin = typing.get_origin(member)
    return member.__name__ if origin is None and isinstance(member, type) else str(member).replace(" ", "")


def _union_members(annotation: Any) -> tuple:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(member for member in typing.get_args(annotation) if member is not type(None))
    return ()


def _optional_unwrapped(annotation: Any) -> Any:
    """``X | None`` as ``X``: pydantic names no member for a nullable field."""
    members = _union_members(annotation)
    return members[0] if len(members) == 1 else annotation


def _inside(annotation: Any, part: Any) -> Any:
    """The annotation of what ``part`` (a field name, an index, a key) holds within ``annotation``."""
    if _is_model(annotation):
        field = annotation.model_fields.get(part)
        return field.annotation if field is not None else None
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and arguments:
        return arguments[0]
    if origin is dict and len(arguments) == 2:
        return arguments[1]
    return None


def _in_words(problem: dict[str, Any], *, schema: type[pydantic.BaseModel] | None, loc: tuple) -> str:
    kind, value = problem["type"], problem["input"]
    if not loc and kind in ("model_type", "model_attributes_type", "dict_type"):
        return "the body must be a JSON object"
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        holder = _model_at(schema, loc[:-1])
        return "unknown key" + (f"; allowed keys here: {', '.join(holder.model_fields)}" if holder else "")
    if kind == "value_error":
        return problem["msg"].removeprefix("Value error, ")
    if kind == "literal_error":
        allowed = problem["ctx"]["expected"].replace("'", "").replace(" or ", ", ")  # "'a', 'b' or 'c'"
        return f"{value_as_sent(value)} is not one of {allowed}"
    if wrong := wrongly_written_value(kind, value):
        return wrong
    if kind in _EXPECTED:
        return f"{value_as_sent(value)} is not {_EXPECTED[kind]}"
    context = problem.get("ctx", {})
    if kind == "too_short":
        return f"give at least {counted(context['min_length'], 'item', grouped=True)} (got {context['actual_length']:,})"
    if kind == "too_long":
        return (f"give at most {counted(context['max_length'], 'item', grouped=True)} (got "
                f"{context['actual_length']:,}); send the rest in another request")
    holder = _model_at(schema, loc[:-1]) if loc and isinstance(loc[-1], str) else None
    if words := out_of_range(kind, context=context, field=holder.model_fields.get(loc[-1]) if holder else None):
        return f"{value_as_sent(value)} {words}"
    return problem["msg"]


def value_as_sent(value: Any) -> str:
    """``value`` as the client wrote it (JSON), cut short: a whole sent object is no help in a message (the REST
    API's problems and /v1's, ``webapp.chat.openai_errors``)."""
    try:
        written = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        written = repr(value)
    return written if len(written) <= 60 else written[:57] + "..."


def _union_expects(schema: type[pydantic.BaseModel] | None, loc: tuple) -> str:
    """What the union field at ``loc`` takes, in JSON's words: 'text (a JSON string) or a JSON array ([...])'."""
    words = {str: "string_type", int: "int_type", float: "float_type", bool: "bool_type", list: "list_type",
             dict: "dict_type"}
    named = [_EXPECTED.get(words.get(typing.get_origin(member) or member, ""))
             for member in _union_members(_optional_unwrapped(_annotation_at(schema, loc)))]
    return " or ".join(word for word in named if word) or "a value this field takes"


def _model_at(schema: type[pydantic.BaseModel] | None, loc: tuple) -> type[pydantic.BaseModel] | None:
    """The body model whose keys are at ``loc`` (``("points", 0)``: MetricsPoint), if one is."""
    annotation = _optional_unwrapped(_annotation_at(schema, loc))
    return annotation if _is_model(annotation) else None


def _annotation_at(schema: type[pydantic.BaseModel] | None, loc: tuple) -> Any:
    annotation: Any = schema
    for part in loc:
        annotation = _inside(_optional_unwrapped(annotation), part)
    return annotation


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, pydantic.BaseModel)


def query_problems(query: dict[str, list[str]], *, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    """``{parameter: [message]}`` for each query parameter of ``query`` (a QueryDict's lists) that the address
    does not read, or that is given more than once; {} when there is none. A misspelt parameter
    (``stauts=running``) was left unread, and the answer looked like the one asked for (every run)."""
    problems: dict[str, list[str]] = {}
    listed = f"allowed here: {', '.join(allowed)}" if allowed else "this address takes no query parameters"
    for name, values in query.items():
        if name not in allowed:
            near = difflib.get_close_matches(name, allowed, n=1)
            problems[name] = [f"unknown query parameter{f' (did you mean {near[0]}?)' if near else ''}; {listed}"]
        elif len(values) > 1:
            problems[name] = [f"given {len(values)} times; give it once (only one value is read)"]
    return problems
