"""Chat templates: rendered text and prompt ids identical to transformers' apply_chat_template."""
import json
import time

import pytest
import transformers

from jaxengine import chat_template
from jaxengine.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplateError, render_chat_template
from jaxengine.tokenizer import load_tokenizer
from tests import factories

CONVERSATIONS = {
    "user only": [{"role": "user", "content": "Hello!"}],
    "system and user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi  there 🙂"}],
    "multi-turn": [
        {"role": "system", "content": "  Answer in French.\n"},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "Quatre.\n"},
        {"role": "user", "content": "And 你好?"},
        {"role": "assistant", "content": "Bonjour, with <b>html</b> & \"quotes\"", "tool_calls": None},
        {"role": "user", "content": "\tThanks\n\n"},
    ],
    "no system, several turns": [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
    ],
}


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("templates")
    return {
        "gemma (sentencepiece)": factories.build_sentencepiece_tokenizer_dir(root / "gemma"),
        "chatml (qwen)": factories.build_bpe_tokenizer_dir(root / "qwen", style="qwen"),
        "llama3": factories.build_bpe_tokenizer_dir(root / "llama3", style="llama3", template_file=True),
    }


@pytest.fixture(scope="module", params=["gemma (sentencepiece)", "chatml (qwen)", "llama3"])
def pair(request, tokenizer_dirs):
    model_dir = tokenizer_dirs[request.param]
    return load_tokenizer(model_dir), transformers.AutoTokenizer.from_pretrained(str(model_dir))


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_rendering_matches_transformers(pair, conversation, add_generation_prompt):
    ours, reference = pair
    messages = CONVERSATIONS[conversation]
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    rendered = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert rendered == expected
    # The prompt ids too: transformers encodes the rendered text without adding special tokens.
    expected_ids = reference.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                                 return_dict=False)
    assert ours.encode(rendered) == list(expected_ids)


def test_template_features_match_transformers(tokenizer_dirs):
    # tojson (no HTML escaping, unicode kept) and a caller-supplied variable, through the Llama 3 template.
    ours = load_tokenizer(tokenizer_dirs["llama3"])
    reference = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dirs["llama3"]))
    messages = [{"role": "user", "content": "x", "metadata": {"a": "<tag> & é", "n": [1, 2]}}]
    expected = reference.apply_chat_template(messages, tokenize=False, date_string="01 Jan 2030")
    assert ours.apply_chat_template(messages, date_string="01 Jan 2030") == expected
    assert '{"a": "<tag> & é", "n": [1, 2]}' in expected


def test_raise_exception_reaches_the_caller(tokenizer_dirs):
    ours = load_tokenizer(tokenizer_dirs["gemma (sentencepiece)"])
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        ours.apply_chat_template(messages)


def test_chat_template_file_wins_over_config(tmp_path):
    model_dir = factories.build_bpe_tokenizer_dir(tmp_path, style="qwen", template_file=True)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ 'from the config' }}"
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    messages = CONVERSATIONS["user only"]
    expected = transformers.AutoTokenizer.from_pretrained(str(model_dir)).apply_chat_template(messages, tokenize=False)
    assert load_tokenizer(model_dir).apply_chat_template(messages) == expected
    assert expected.startswith("<|im_start|>system")


def test_named_templates_use_default(tmp_path):
    model_dir = factories.build_bpe_tokenizer_dir(tmp_path, style="qwen")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "{{ 'tools' }}"},
                               {"name": "default", "template": "{{ messages[0].content }}!"}]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(model_dir).apply_chat_template(CONVERSATIONS["user only"]) == "Hello!!"


def test_model_without_template_gets_the_chatml_default(tmp_path):
    model_dir = factories.build_sentencepiece_tokenizer_dir(tmp_path, chat_template=None)
    tokenizer = load_tokenizer(model_dir)
    assert tokenizer.chat_template == DEFAULT_CHAT_TEMPLATE
    rendered = tokenizer.apply_chat_template(CONVERSATIONS["system and user"], add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nYou are terse.<|im_end|>\n"
                        "<|im_start|>user\nHi  there 🙂<|im_end|>\n"
                        "<|im_start|>assistant\n")


def test_environment_matches_transformers_details(tokenizer_dirs):
    messages = [{"role": "user", "content": "hi", "reasoning": "because", "extra": None}]
    template = (
        "{% for m in messages %}{{ m.thinking }}|{{ m.reasoning_content }}|{{ m.extra is defined }}{% endfor %}\n"
        "{% set ns = namespace(count=0) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% endfor %}"
        "{{ ns.count }}{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
        "{% generation %}[{{ eos_token }}]{% endgeneration %}"
    )
    model_dir = tokenizer_dirs["gemma (sentencepiece)"]
    ours = render_chat_template(template, messages, **load_tokenizer(model_dir).special_tokens_map)
    reference = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    expected = reference.apply_chat_template(messages, chat_template=template, tokenize=False)
    # None-valued keys are dropped, reasoning is aliased, trim_blocks eats the newline after a block tag.
    assert ours == expected == "because|because|False101[</s>]"
    with pytest.raises(Exception, match="underscore-prefixed"):
        render_chat_template("{% set ns = namespace(_private=1) %}", messages)
    with pytest.raises(ChatTemplateError, match="line 1"):
        render_chat_template("{% if %}", messages)
    with pytest.raises(ChatTemplateError, match="empty conversation"):
        render_chat_template(DEFAULT_CHAT_TEMPLATE, [])


def test_generation_spans_say_where_each_marked_block_lies():
    template = ("{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
                "{% if loop.last %}.{% endif %}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "bb"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": "dd"}]
    spans = []
    rendered = render_chat_template(template, messages, generation_spans=spans)
    assert rendered == render_chat_template(template, messages) == "<user>a<assistant>bb<user>c<assistant>dd."
    # By hand: "<user>a<assistant>" is 18 characters, "bb" 18..20; "<user>c<assistant>" 20..38, "dd." 38..41.
    assert spans == [(18, 20), (38, 41)]
    assert [rendered[start:end] for start, end in spans] == ["bb", "dd."]


@pytest.mark.parametrize("template,message", factories.HOSTILE_CHAT_TEMPLATES.values(),
                         ids=factories.HOSTILE_CHAT_TEMPLATES.keys())
def test_whatever_a_template_raises_is_a_chat_template_error_naming_its_file_and_line(tmp_path, template, message):
    """ZeroDivisionError, TypeError, RecursionError and the sandbox's OverflowError escaped as themselves (a crashed
    worker, a 500 page); an endless loop or a 'x' * 10**10 hung or ate the memory."""
    model_dir = factories.build_bpe_tokenizer_dir(tmp_path, chat_template=template)
    tokenizer = load_tokenizer(model_dir)
    started = time.monotonic()
    with pytest.raises(ChatTemplateError) as raised:
        tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
    assert str(raised.value).startswith(f"{model_dir / 'tokenizer_config.json'}: chat template")
    assert message in str(raised.value)
    assert "Traceback" not in str(raised.value)
    assert time.monotonic() - started < chat_template.MAX_RENDER_SECONDS + 2


def test_a_rendering_past_the_bound_on_its_length_is_refused_as_it_grows():
    # Each chunk alone is small: only the running length catches it, before it holds the memory of 10**10.
    template = "{% for i in range(100000) %}{% for j in range(100000) %}{{ messages[0].content }}{% endfor %}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="more than 16,000,000 characters; a real template renders"):
        render_chat_template(template, [{"role": "user", "content": "0123456789" * 100}])


@pytest.mark.parametrize("expression", ["'x'.ljust(10**10)", "'x' | center(10**10)", "'%10000000000s' % 'x'",
                                        "[1] * 10**10", "9 ** 100000000"])
def test_an_operation_whose_result_would_pass_the_bound_is_refused_before_it_runs(expression):
    with pytest.raises(ChatTemplateError, match="16,000,000"):
        render_chat_template("{{ " + expression + " }}", [{"role": "user", "content": "x"}])


def test_a_template_too_deeply_nested_to_parse_is_a_chat_template_error():
    template = "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}"
    with pytest.raises(ChatTemplateError, match="cannot be read: maximum recursion depth exceeded"):
        render_chat_template(template, [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="cannot be read"):
        chat_template.template_variables(template)


def test_the_bounds_leave_a_long_conversation_and_a_template_with_loops_as_they_were():
    messages = [{"role": "user" if index % 2 == 0 else "assistant", "content": "word " * 20000} for index in range(40)]
    rendered = render_chat_template(factories.CHATML_CHAT_TEMPLATE, messages, add_generation_prompt=True)
    assert rendered.count("<|im_start|>") == 42 and len(rendered) > 4_000_000
    assert render_chat_template("{{ 3 * 'ab' }}{{ 2 ** 10 }}{{ '%5s' % 'x' }}", messages) == "ababab1024    x"
    assert render_chat_template("{{ 'a\nb' | indent }}|{{ 'a' | center(5) }}|{{ 'a'.ljust(3) }}.", messages) == (
        "a\n    b|  a  |a  .")


def test_chat_variables_are_what_a_person_may_set_each_with_its_kind():
    """The chat panel offers these: the template's own free variables, not what every rendering passes it (the
    conversation, the special tokens, tools and documents, the environment's functions, the date a run fixes)."""
    passed = ("{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}{% if tools %}"
              "{{ documents }}{% endif %}{{ raise_exception('no') if pad_token is none }}{{ strftime_now('%Y') }}"
              "{{ date_string }}{% if add_generation_prompt %}A:{% endif %}")
    thinking = passed + "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}"
    custom = passed + ("{% if persona %}You are {{ persona }}.{% endif %}{% if terse %}Be brief.{% endif %}"
                       "{% if not reasoning_effort is defined %}{% set reasoning_effort = 'low' %}{% endif %}"
                       "{% if reasoning_effort == 'high' %}Think hard.{% endif %}{% if strict == true %}!{% endif %}")
    assert chat_template.chat_variables(passed) == {}
    assert chat_template.chat_variables(DEFAULT_CHAT_TEMPLATE) == {}
    assert chat_template.chat_variables(thinking) == {"enable_thinking": "boolean"}
    assert chat_template.chat_variables(custom) == {"persona": "text", "reasoning_effort": "text", "strict": "boolean",
                                                    "terse": "boolean"}
    assert chat_template.CHAT_PASSED_VARIABLES >= {"messages", "add_generation_prompt", "tools", "documents",
                                                   "bos_token", "eos_token", "date_string"}
    # the names the tokenizer passes as special tokens are this one list
    from jaxengine.tokenizer import NAMED_SPECIAL_TOKENS
    assert set(NAMED_SPECIAL_TOKENS) <= chat_template.CHAT_PASSED_VARIABLES
    with pytest.raises(ChatTemplateError, match="line 1"):
        chat_template.chat_variables("{% if persona %}")


@pytest.mark.parametrize("use", [
    "{% for tool in extra %}{{ tool.name }}{% endfor %}",  # the iterable of a for
    "{{ extra[0] }}", "{{ extra['name'] }}", "{{ extra.name }}",  # indexed
    "{{ extra | length }}", "{{ extra | join(', ') }}", "{{ extra | map(attribute='name') | list }}",  # list filters
    "{% for key, value in extra.items() %}{{ key }}{% endfor %}",  # a mapping's items
    "{% if extra %}{{ extra | first }}{% endif %}",  # a truth value too: still a list
    "{% set listed = extra %}{% for tool in listed %}{{ tool }}{% endfor %}",  # through a name the template sets
])
def test_a_variable_a_template_reads_as_a_list_or_mapping_is_structured(use):
    """Not a text box's value: a chat leaves it out (tools reach a template through a /v1 request's tools)."""
    assert chat_template.chat_variables(use + "{{ persona.upper() }}{{ persona | trim }}") == {
        "extra": "structured", "persona": "text"}
