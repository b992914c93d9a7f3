"""Chat templates rendered exactly as ``transformers`` renders them, so that the prompt a model sees is
the same at training, chat and export time, whichever library built it.

The environment mirrors ``transformers.utils.chat_template_utils._cached_compile_jinja_template``
(transformers 5.x): jinja2's ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block tag (rendered as its
body; ``render_chat_template(generation_spans=...)`` also says where each block's text lies in the rendering,
as transformers' ``return_assistant_tokens_mask`` does), ``raise_exception``, ``strftime_now``, a ``tojson`` filter that does not escape HTML, and the
sandbox-safe ``dict``/``namespace`` globals. Messages are passed the way ``apply_chat_template`` passes
them: keys whose value is None are dropped, and a message's reasoning given as ``reasoning_content``,
``thinking`` or ``reasoning`` is visible under the first two names. The named special tokens
(``bos_token``, ``eos_token``, …) are template variables.

Where a template comes from: ``chat_template.jinja`` in the model directory, else
``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{"name", "template"}`` of which
``default`` is used). A model with neither gets ``DEFAULT_CHAT_TEMPLATE`` (ChatML-like).

A template is code its model's author wrote, run in the web process (launch checks, token counts), the serve
worker and the trainer: whatever it raises (its own ``raise_exception``, a ``1/0``, a recursion without end)
comes out as ``ChatTemplateError`` with the template's line and message, and a rendering is bounded: at most
``MAX_RENDER_SECONDS`` (checked at each loop step, call and output chunk) and ``MAX_RENDERED_CHARS`` characters,
with ``*``, ``**`` and ``%`` refused where their result would pass that size, so a loop of 10**10 steps or a
``'x' * 10**10`` is a refusal rather than a hung request or a worker out of memory.

This module does not import jax.
"""
from __future__ import annotations

import contextvars
import functools
import json
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

CHAT_TEMPLATE_FILE = "chat_template.jinja"
# A Temper model's own template variables ({"enable_thinking": false}): the run that exported it rendered its
# chats with them, so loading the model renders with them too. Other tools do not read this file; its name
# says what to pass them (vLLM's and SGLang's request field, transformers' apply_chat_template keywords).
CHAT_TEMPLATE_KWARGS_FILE = "chat_template_kwargs.json"
# How many template variables a spec (data.chat_template_kwargs) or one /v1 request may set.
TEMPLATE_VARIABLES_MAX = 32

# Used when a model ships no template: each message is "<|im_start|>{role}\n{content}<|im_end|>\n", and
# the generation prompt is "<|im_start|>assistant\n". For a tokenizer without these special tokens they
# are encoded as plain text, which is still an unambiguous transcript for a base model to continue.
DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

# How transformers tells a template that marks its assistant text (apply_chat_template's check).
GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")

# While render_chat_template(generation_spans=...) renders: the chunks rendered so far and the spans found.
# A context variable, so that renders on other threads (the web process) never see each other's.
_generation_tracker: contextvars.ContextVar[tuple[list[str], list[tuple[int, int]]] | None] = contextvars.ContextVar(
    "generation_tracker", default=None)

# Far past any real template's rendering (milliseconds; a context of 128k tokens is about half a million
# characters), and short enough that a launch check probing a template a few times still answers.
MAX_RENDER_SECONDS = 2.0
MAX_RENDERED_CHARS = 16_000_000
# While render_chat_template renders: the time.monotonic() past which it stops.
_render_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("render_deadline", default=None)
# Widths and precisions of a '%' format on text, and a text method's int arguments, past this size are refused.
_FORMAT_SIZE = re.compile(r"%[-+ #0]*(?:[0-9]{8,}|[0-9]*\.[0-9]{8,})")


# How a ChatTemplateError for a template's own bug or a rendering past the bounds ends (a template's raise_exception
# message is its own, often about the conversation): a caller adding advice of its own need not repeat it.
BROKEN_TEMPLATE_ADVICE = "fix it or choose a model with another"


class ChatTemplateError(ValueError):
    """A chat template cannot be read, compiled or rendered; the message says which and why."""


class _RenderLimitError(Exception):
    """A rendering went past ``MAX_RENDER_SECONDS`` or ``MAX_RENDERED_CHARS``; the message says which."""


def _check_deadline() -> None:
    deadline = _render_deadline.get()
    if deadline is not None and time.monotonic() > deadline:
        raise _RenderLimitError(f"it renders for more than {MAX_RENDER_SECONDS:g} seconds (a loop without end?)")


def _check_size(size: int) -> None:
    if size > MAX_RENDERED_CHARS:
        raise _RenderLimitError(f"it makes a text of more than {MAX_RENDERED_CHARS:,} characters")


def read_chat_template(model_dir: str | Path, tokenizer_config: Mapping[str, Any]) -> str | None:
    """The template of a model directory (see the module note for precedence), or None when it has none."""
    template_path = Path(model_dir) / CHAT_TEMPLATE_FILE
    if template_path.is_file():
        try:
            return template_path.read_text(encoding="utf-8")
        except UnicodeDecodeError as problem:  # was a traceback from every reader of the tokenizer
            raise ChatTemplateError(f"{template_path}: not UTF-8 text (byte {problem.start} is not valid UTF-8); "
                                    "fix or remove the file") from None
    template = tokenizer_config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {item.get("name"): item.get("template") for item in template if isinstance(item, Mapping)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ChatTemplateError(
        f"{Path(model_dir) / 'tokenizer_config.json'}: field 'chat_template' must be a string or a list of "
        "{'name', 'template'} objects that includes name 'default'")


@functools.lru_cache(maxsize=1)
def _environment():
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        # transformers uses {% generation %} to find assistant tokens; a rendered prompt is just the body.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

        def _render_body(self, caller):
            body = caller()
            tracker = _generation_tracker.get()
            if tracker is not None:
                # The chunks before this block are already out: the renderer consumes the template's generator.
                chunks, spans = tracker
                start = sum(len(chunk) for chunk in chunks)
                spans.append((start, start + len(body)))
            return body

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(date_format):
        return datetime.now().strftime(date_format)

    class TemplateDict:
        # dict() without attribute access to the type, as in transformers' sandbox.
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        # Namespaces may not hold underscore names (a path to CPython internals), as in transformers.
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attributes = dict(*args, **kwargs)
            for name in attributes:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attributes)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}.")

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        # A call (a macro's too, so a recursion), each loop step (_compile has every loop iterate through
        # bounded_steps) and each output chunk look at the clock; operators that can make a huge value at once
        # are sized first.
        intercepted_binops = frozenset({"*", "**", "%"})

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - the sandbox's own signature
            _check_deadline()
            if isinstance(getattr(__obj, "__self__", None), (str, list, tuple)):  # 'x'.ljust(10**10)
                for argument in (*args, *kwargs.values()):
                    if type(argument) is int:
                        _check_size(argument)
            return super().call(__context, __obj, *args, **kwargs)

        def call_binop(self, context, operator, left, right):
            _check_deadline()
            if operator == "*":
                for sized, count in ((left, right), (right, left)):
                    if isinstance(sized, (str, list, tuple)) and type(count) is int:
                        _check_size(len(sized) * count)
            elif operator == "**" and type(left) is int and type(right) is int and abs(left) > 1:
                _check_size(int(right * math.log10(abs(left))))  # the digits of the result
            elif operator == "%" and isinstance(left, str) and _FORMAT_SIZE.search(left):
                raise _RenderLimitError(f"it formats with a width or precision of more than {MAX_RENDERED_CHARS:,}")
            return super().call_binop(context, operator, left, right)

    def bounded_steps(iterable):
        for item in iterable:
            _check_deadline()
            yield item

    def bounded_width(filter_function):
        @functools.wraps(filter_function)
        def bounded(value, *args, **kwargs):
            width = args[0] if args else kwargs.get("width")
            if type(width) is int:
                _check_size(width)
            return filter_function(value, *args, **kwargs)
        return bounded

    environment = BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    environment.filters[_BOUNDED_STEPS] = bounded_steps
    for name in ("center", "indent"):
        environment.filters[name] = bounded_width(environment.filters[name])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["dict"] = TemplateDict()
    environment.globals["namespace"] = TemplateNamespace
    return environment


_BOUNDED_STEPS = "temper_bounded_steps"


def _parse(template: str):
    import jinja2

    try:
        return _environment().parse(template)
    except jinja2.exceptions.TemplateSyntaxError as error:
        raise ChatTemplateError(f"chat template line {error.lineno}: {error.message}") from None
    except Exception as error:  # a nesting too deep for the parser (RecursionError), ...
        raise ChatTemplateError(f"chat template: cannot be read: {_described(error)}") from None


@functools.lru_cache(maxsize=32)
def _compile(template: str):
    import jinja2.nodes

    parsed = _parse(template)
    for loop in parsed.find_all(jinja2.nodes.For):  # each step looks at the clock (BoundedEnvironment)
        loop.iter = jinja2.nodes.Filter(loop.iter, _BOUNDED_STEPS, [], [], None, None, lineno=loop.lineno)
    try:
        return _environment().from_string(parsed)
    except Exception as error:
        raise ChatTemplateError(f"chat template: cannot be compiled: {_described(error)}") from None


def _described(error: BaseException) -> str:
    """An exception a template raised, in words: its own message, with the type where the message alone may not
    say what happened (``division by zero`` does; ``0`` from a KeyError does not)."""
    message = str(error) or type(error).__name__
    return message if type(error).__module__.startswith("jinja2") else f"{message} ({type(error).__name__})"


def _template_line(error: BaseException) -> int | None:
    # jinja2 rewrites a rendering's traceback so that the template's frames carry its own line numbers.
    line, traceback = None, error.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code.co_filename == "<template>":
            line = traceback.tb_lineno
        traceback = traceback.tb_next
    return line


# Set by render_chat_template itself, never by a caller's template variables (generation_spans is its own
# argument, which a variable of that name would collide with).
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "add_generation_prompt", "tools", "documents", "generation_spans"})


def template_variable_problem(name: Any, value: Any) -> str | None:
    """What is wrong with one chat template variable (a spec's ``data.chat_template_kwargs``, a chat request's
    ``chat_template_kwargs``, a model's ``chat_template_kwargs.json``), or None: a name a template can read,
    not one the renderer sets, and a JSON scalar."""
    if not isinstance(name, str) or not name.isidentifier():
        return f"{name!r} is not a variable name a template can read; give letters, digits and '_'"
    if name in RESERVED_TEMPLATE_VARIABLES:
        return (f"{name!r} is set by the renderer itself (from the conversation), not by a template variable; "
                "remove it")
    if value is not None and not isinstance(value, (str, int, float, bool)):
        shape = "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, (list, tuple)) else "not a scalar"
        return f"{value!r} is {shape}; give a JSON scalar: a string, a number, true/false or null"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    return None


@functools.lru_cache(maxsize=32)
def template_variables(template: str) -> frozenset[str]:
    """The variables ``template`` reads from its context, other than ``messages`` and ``add_generation_prompt``
    and the environment's globals (``raise_exception``, ``strftime_now``, ...): the names a caller can set
    (``enable_thinking``, ``date_string``, the special tokens, ``tools``...).

    jinja2.meta sees every name looked up where the template may not have set it yet. That is a caller's
    variable when the template asks whether it is defined (Llama's ``{% if not date_string is defined %}{% set
    date_string = ... %}``); a name the template sets and never asks about is its own (Qwen3's ``content``, set
    in both branches of an if, which jinja2.meta still counts)."""
    import jinja2
    import jinja2.meta
    import jinja2.nodes

    environment = _environment()
    parsed = _parse(template)
    names = jinja2.meta.find_undeclared_variables(parsed)
    assigned = {node.name for node in parsed.find_all(jinja2.nodes.Name) if node.ctx in ("store", "param")}
    asked = {node.node.name for node in parsed.find_all(jinja2.nodes.Test)
             if node.name in ("defined", "undefined") and isinstance(node.node, jinja2.nodes.Name)}
    own = assigned - asked
    return frozenset(names - own - {"messages", "add_generation_prompt"} - set(environment.globals))


def unread_variables(names: Iterable[str], template: str | None) -> tuple[str, ...]:
    """Those of ``names`` that ``template`` (None: ``DEFAULT_CHAT_TEMPLATE``, as rendering takes it) never reads,
    sorted: variables that render nothing, which a job leaves out of what it carries on (the engine's
    ``job._without_unread_own_variables``, the web launch's ``runs.services.plan_run``). A template that cannot be
    read has none (rendering says what is wrong with it)."""
    try:
        reads = template_variables(template or DEFAULT_CHAT_TEMPLATE)
    except ChatTemplateError:
        return ()
    return tuple(sorted(set(names) - reads))



# Llama 3.1-3.2's templates write "Today Date: <date_string>" into every system turn, and Llama 3.2's stamps the
# day it renders (strftime_now) when date_string is unset: a run's prompts would change from day to day, a resumed
# attempt's from the first's, and its chat's from its training. A launch fixes it (``date_to_fix``).
DATE_VARIABLE = "date_string"
_DEFAULT_DATE_FORMAT = "%d %b %Y"  # Llama's own


def stamped_date(template: str) -> str | None:
    """Today's date as ``template`` writes it where ``date_string`` is left unset and the template stamps the day it
    renders (Llama 3.2's ``strftime_now("%d %b %Y")``), for a launch to fix in the run's variables; None for a
    template that never reads ``date_string``, or writes a fixed date without it (Llama 3.3's "26 Jul 2024")."""
    date_format = stamp_format(template)
    return datetime.now().strftime(date_format) if date_format is not None else None


def stamp_format(template: str) -> str | None:
    """The ``strftime`` format in which ``template`` stamps the day it renders when ``date_string`` is unset
    (``stamped_date``); None where it stamps none."""
    import jinja2.nodes

    if DATE_VARIABLE not in template_variables(template):
        return None
    calls = [node for node in _parse(template).find_all(jinja2.nodes.Call)
             if isinstance(node.node, jinja2.nodes.Name) and node.node.name == "strftime_now"]
    if not calls:
        return None
    written = [call.args[0].value for call in calls
               if call.args and isinstance(call.args[0], jinja2.nodes.Const) and isinstance(call.args[0].value, str)]
    return written[0] if written else _DEFAULT_DATE_FORMAT


def date_to_fix(template: str | None, *, variables: Mapping[str, Any], model_variables: Mapping[str, Any]
                ) -> str | None:
    """The ``date_string`` a run writes into its variables (``data.chat_template_kwargs``) so that every attempt,
    evaluation and export renders one day: today's as ``template`` (None: ``DEFAULT_CHAT_TEMPLATE``) writes it
    (``stamped_date``), where neither the run's ``variables`` nor the model's own (``model_variables``, its
    ``chat_template_kwargs.json``) set it. None where nothing is to fix, or where the template cannot be read (the
    run's start says what is wrong with it). The web app's launch and ``jaxengine train`` both fix it with this."""
    if DATE_VARIABLE in variables or DATE_VARIABLE in model_variables:
        return None
    try:
        return stamped_date(template or DEFAULT_CHAT_TEMPLATE)
    except ChatTemplateError:
        return None


# The special tokens a tokenizer names (``tokenizer.NAMED_SPECIAL_TOKENS``): every rendering passes those the model sets
# as template variables, as transformers' ``apply_chat_template`` does.
SPECIAL_TOKEN_VARIABLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# What a chat's rendering fills in itself, so no person sets it in a chat: the renderer's own arguments, the special
# tokens, the environment's globals (``raise_exception``, ``strftime_now``, which ``template_variables`` leaves out),
# and ``date_string``, which a run fixes at its launch (``date_to_fix``) and a base model's template stamps itself.
CHAT_PASSED_VARIABLES = RESERVED_TEMPLATE_VARIABLES | frozenset(SPECIAL_TOKEN_VARIABLES) | {DATE_VARIABLE}
# Tests that ask a value whether it is a boolean (``x is false``); ``defined``/``none`` ask nothing of its kind.
_BOOLEAN_TESTS = frozenset({"true", "false", "boolean", "sameas"})
_KIND_BLIND_TESTS = frozenset({"defined", "undefined", "none"})
# Filters that take a list (or a mapping): a variable passed to one is a list, whatever else jinja2 lets them take.
_LIST_FILTERS = frozenset({"batch", "count", "dictsort", "first", "groupby", "items", "join", "last", "length", "list",
                           "map", "max", "min", "reject", "rejectattr", "select", "selectattr", "slice", "sort", "sum",
                           "unique"})
_MAPPING_METHODS = frozenset({"items", "keys", "values", "get"})


def _structured_names(parsed) -> set[str]:
    """The names ``parsed`` reads as a list or mapping: the iterable of a ``for``, indexed (``x[0]``, ``x.name``),
    passed to a list filter (``x | join``) or asked its ``.items()``, and a name set from one of those (Llama 3's
    ``{% set tools = custom_tools %}`` before ``{% for t in tools %}``)."""
    import jinja2.nodes

    def name_of(node) -> str | None:
        return node.name if isinstance(node, jinja2.nodes.Name) else None

    called = {id(node.node) for node in parsed.find_all(jinja2.nodes.Call)}
    structured = {name_of(node.iter) for node in parsed.find_all(jinja2.nodes.For)}
    structured |= {name_of(node.node) for node in parsed.find_all(jinja2.nodes.Getitem)}
    structured |= {name_of(node.node) for node in parsed.find_all(jinja2.nodes.Getattr)
                   if id(node) not in called or node.attr in _MAPPING_METHODS}  # not a text's own method, .upper()
    structured |= {name_of(node.node) for node in parsed.find_all(jinja2.nodes.Filter) if node.name in _LIST_FILTERS}
    aliases = [(node.target.name, node.node.name) for node in parsed.find_all(jinja2.nodes.Assign)
               if isinstance(node.target, jinja2.nodes.Name) and isinstance(node.node, jinja2.nodes.Name)]
    while sources := {source for target, source in aliases if target in structured and source not in structured}:
        structured |= sources
    return structured - {None}


def chat_variables(template: str) -> dict[str, str]:
    """The variables of ``template`` a person may set in a chat (``template_variables`` less
    ``CHAT_PASSED_VARIABLES``), in name order, each with its kind: ``"structured"`` where it reads a list or mapping
    (``_structured_names``: Llama 3's ``custom_tools`` and ``builtin_tools``, which a chat's text box cannot hold;
    tools reach a template through a request's ``tools``), ``"boolean"`` where the template only asks
    whether it holds (``{% if verbose %}``, ``enable_thinking is false``, ``x == true``) and asks that at least
    once, ``"text"`` where it reads its value (``{{ persona }}``, ``reasoning_effort == "high"``). Raises
    ``ChatTemplateError`` for a template that cannot be read."""
    import jinja2.nodes

    settable = template_variables(template) - CHAT_PASSED_VARIABLES
    parsed = _parse(template)
    as_condition: set[int] = set()  # the Name nodes read as a truth value (ids)
    kind_blind: set[int] = set()  # those only asked whether they are defined

    def conditions(node) -> None:  # a truth value: the Names in it are switches
        if isinstance(node, jinja2.nodes.Name):
            as_condition.add(id(node))
        elif isinstance(node, jinja2.nodes.Not):
            conditions(node.node)
        elif isinstance(node, (jinja2.nodes.And, jinja2.nodes.Or)):
            conditions(node.left)
            conditions(node.right)

    for node in parsed.find_all((jinja2.nodes.If, jinja2.nodes.CondExpr)):
        conditions(node.test)
    for node in parsed.find_all((jinja2.nodes.Not, jinja2.nodes.And, jinja2.nodes.Or)):
        conditions(node)
    for node in parsed.find_all(jinja2.nodes.Test):
        if isinstance(node.node, jinja2.nodes.Name):
            if node.name in _BOOLEAN_TESTS:
                as_condition.add(id(node.node))
            elif node.name in _KIND_BLIND_TESTS:
                kind_blind.add(id(node.node))
    for node in parsed.find_all(jinja2.nodes.Compare):
        operands = [node.expr, *(operand.expr for operand in node.ops)]
        if len(operands) == 2 and all(operand.op in ("eq", "ne") for operand in node.ops):
            constants = [operand for operand in operands if isinstance(operand, jinja2.nodes.Const)]
            if constants and isinstance(constants[0].value, bool):
                as_condition.update(id(operand) for operand in operands if isinstance(operand, jinja2.nodes.Name))
    structured = _structured_names(parsed)
    kinds = {}
    for name in sorted(settable):
        if name in structured:
            kinds[name] = "structured"
            continue
        reads = [node for node in parsed.find_all(jinja2.nodes.Name) if node.name == name and node.ctx == "load"]
        telling = [node for node in reads if id(node) not in kind_blind]
        boolean = bool(telling) and all(id(node) in as_condition for node in telling)
        kinds[name] = "boolean" if boolean else "text"
    return kinds


def _prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    prepared = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"message {index}: expected a mapping with 'role' and 'content', got {message!r}")
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    generation_spans: list[tuple[int, int]] | None = None,
    **template_kwargs: Any,
) -> str:
    """Renders one conversation; ``template_kwargs`` carries the special tokens and any extra variables.
    ``generation_spans``, a list, receives the character span [start, end) of each ``{% generation %}`` block's
    text in the rendering, in order (transformers' ``return_assistant_tokens_mask`` reads the same spans).

    Whatever the template raises surfaces as ``ChatTemplateError`` with its message and the template's line (its
    own ``raise_exception(...)``'s message as it gave it), and so does a rendering past ``MAX_RENDER_SECONDS`` or
    ``MAX_RENDERED_CHARS`` (see the module note).
    """
    import jinja2

    if not messages:
        raise ChatTemplateError("cannot apply a chat template to an empty conversation; give at least one message")
    compiled = _compile(template)
    context = dict(
        messages=_prepare_messages(messages),
        tools=None if tools is None else [dict(tool) for tool in tools],
        documents=None if documents is None else [dict(document) for document in documents],
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )
    chunks: list[str] = []
    size = 0
    deadline = _render_deadline.set(time.monotonic() + MAX_RENDER_SECONDS)
    tracker = _generation_tracker.set(None if generation_spans is None else (chunks, generation_spans))
    try:
        for chunk in compiled.generate(**context):
            chunks.append(chunk)
            size += len(chunk)
            _check_size(size)
            _check_deadline()
    except jinja2.exceptions.TemplateError as error:  # raise_exception's, an undefined name, the sandbox's refusal
        raise ChatTemplateError(f"chat template{_where(error)}: {error}") from None
    except _RenderLimitError as error:
        raise ChatTemplateError(f"chat template{_where(error)}: cannot be rendered: {error}; a real template renders "
                                f"a conversation in milliseconds, so {BROKEN_TEMPLATE_ADVICE}") from None
    except Exception as error:  # a bug of the template's own: 1/0, a recursion without end, None + 'text'
        raise ChatTemplateError(f"chat template{_where(error)}: {_described(error)}; the template fails on this "
                                f"conversation: {BROKEN_TEMPLATE_ADVICE}") from None
    finally:
        _generation_tracker.reset(tracker)
        _render_deadline.reset(deadline)
    return "".join(chunks)


def _where(error: BaseException) -> str:
    line = _template_line(error)
    return f" line {line}" if line is not None else ""
