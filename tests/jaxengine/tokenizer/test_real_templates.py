"""Conformance: real models' chat templates (fixtures in real_templates/, sources in its SOURCES.md) render
exactly as transformers' apply_chat_template renders them, template variables included."""
from pathlib import Path

import pytest
import transformers

from jaxengine.chat_template import (ChatTemplateError, chat_variables, render_chat_template, stamped_date,
                                     template_variables)
from jaxengine.tokenizer import load_tokenizer
from tests import factories

TEMPLATES_DIR = Path(__file__).parent / "real_templates"
TEMPLATES = sorted(path.name for path in TEMPLATES_DIR.glob("*.jinja"))

CONVERSATIONS = {
    "user only": [{"role": "user", "content": "Hello!"}],
    "system and user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi 🙂"}],
    "multi-turn, reasoning in earlier assistant turns": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "two and two make four"},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nthree and three\n</think>\n\n6"},
        {"role": "user", "content": "Thanks <b>&</b>"},
    ],
    "no system, ends with an assistant turn that reasoned": [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two", "reasoning_content": "count up"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four", "reasoning_content": "count up again"},
    ],
}

# enable_thinking absent, on and off; date_string given (Llama's templates read it; the others must ignore it).
TEMPLATE_KWARGS = {
    "none": {},
    "thinking on": {"enable_thinking": True},
    "thinking off": {"enable_thinking": False},
    "date_string": {"date_string": "01 Feb 2031"},
}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    model_dir = factories.build_bpe_tokenizer_dir(tmp_path_factory.mktemp("real-templates"), style="qwen")
    return load_tokenizer(model_dir), transformers.AutoTokenizer.from_pretrained(str(model_dir))


def _render_both(tokenizers, template, messages, add_generation_prompt, kwargs):
    ours, reference = tokenizers
    special_tokens = {**ours.special_tokens_map, "bos_token": "<s>", "eos_token": "</s>"}
    try:
        expected = reference.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt,
            **special_tokens, **kwargs)
    except Exception as error:  # transformers' TemplateError: ours must refuse the same conversation
        with pytest.raises(ChatTemplateError, match=str(error)[:40].replace("(", r"\(").replace(")", r"\)")):
            render_chat_template(template, messages, add_generation_prompt=add_generation_prompt,
                                 **special_tokens, **kwargs)
        return None, None
    rendered = render_chat_template(template, messages, add_generation_prompt=add_generation_prompt,
                                    **special_tokens, **kwargs)
    return rendered, expected


@pytest.mark.parametrize("kwargs_name", list(TEMPLATE_KWARGS))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("template_name", TEMPLATES)
def test_real_template_renders_as_transformers_does(tokenizers, template_name, conversation,
                                                    add_generation_prompt, kwargs_name):
    template = (TEMPLATES_DIR / template_name).read_text(encoding="utf-8")
    rendered, expected = _render_both(tokenizers, template, CONVERSATIONS[conversation], add_generation_prompt,
                                      TEMPLATE_KWARGS[kwargs_name])
    assert rendered == expected


def test_qwen3_thinking_switch_and_dropped_reasoning(tokenizers):
    # What a Qwen3 user relies on, spelled out: the empty think block when thinking is off, and earlier
    # turns' reasoning left out of the prompt while the latest turn's stays.
    template = (TEMPLATES_DIR / "qwen3.jinja").read_text(encoding="utf-8")
    messages = CONVERSATIONS["multi-turn, reasoning in earlier assistant turns"]
    off, expected_off = _render_both(tokenizers, template, messages, True, {"enable_thinking": False})
    on, _ = _render_both(tokenizers, template, messages, True, {"enable_thinking": True})
    assert off == expected_off
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n")
    assert "two and two" not in off and "three and three" not in off
    assert "<|im_start|>assistant\n4<|im_end|>" in off
    finished, _ = _render_both(tokenizers, template, CONVERSATIONS["no system, ends with an assistant turn that reasoned"],
                               False, {})
    assert "count up again" in finished and "<think>\ncount up\n</think>" not in finished


@pytest.mark.parametrize(("template_name", "reads"), [
    ("qwen3.jinja", {"enable_thinking", "tools"}),  # not content or reasoning_content: it sets those itself
    ("qwen2_5_generation.jinja", {"tools"}),
    ("llama3_2.jinja", {"bos_token", "date_string", "tools", "tools_in_user_message", "custom_tools"}),
    ("llama3_3.jinja", {"bos_token", "date_string", "tools", "tools_in_user_message", "custom_tools", "builtin_tools"}),
    ("gemma2.jinja", {"bos_token"}),
    ("phi3_5.jinja", {"eos_token"}),
])
def test_template_variables_lists_what_a_template_reads(template_name, reads):
    # The names a caller can set: not messages or add_generation_prompt, nor the environment's functions
    # (raise_exception, strftime_now), nor what the template sets itself without asking if it is defined.
    assert template_variables((TEMPLATES_DIR / template_name).read_text(encoding="utf-8")) == reads


@pytest.mark.parametrize(("template_name", "offered"), [
    ("qwen3.jinja", {"enable_thinking": "boolean"}),
    # not bos_token, date_string; custom_tools is the list of tools the template iterates (set tools = custom_tools)
    ("llama3_2.jinja", {"custom_tools": "structured", "tools_in_user_message": "boolean"}),
    # builtin_tools goes through reject and join, and is asked whether it holds a tool call's name
    ("llama3_3.jinja", {"builtin_tools": "structured", "custom_tools": "structured", "tools_in_user_message": "boolean"}),
    ("gemma2.jinja", {}),
    ("phi3_5.jinja", {}),
])
def test_chat_variables_of_real_templates_leave_out_what_each_rendering_passes(template_name, offered):
    assert chat_variables((TEMPLATES_DIR / template_name).read_text(encoding="utf-8")) == offered


@pytest.mark.parametrize(("template_name", "stamps"), [("llama3_2.jinja", True), ("llama3_3.jinja", False),
                                                       ("qwen3.jinja", False), ("gemma2.jinja", False)])
def test_stamped_date_is_the_day_as_a_template_writes_it_where_it_stamps_one(template_name, stamps):
    """Llama 3.2's template writes the day it renders when date_string is unset: stamped_date is that day as it
    writes it, for a launch to fix; Llama 3.3's writes a fixed date, and the others read none."""
    from datetime import datetime

    template = (TEMPLATES_DIR / template_name).read_text(encoding="utf-8")
    before = datetime.now().strftime("%d %b %Y")
    date = stamped_date(template)
    if not stamps:
        assert date is None
        return
    assert date in {before, datetime.now().strftime("%d %b %Y")}
    system = "<|start_header_id|>system<|end_header_id|>\n\n"
    chat = [{"role": "user", "content": "Hello!"}]
    assert f"{system}Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n" in render_chat_template(
        template, chat, bos_token="<|begin_of_text|>")  # what it renders today
    assert "Today Date: 01 Feb 2031\n" in render_chat_template(template, chat, bos_token="", date_string="01 Feb 2031")
