"""Multi-turn SFT on real chat templates: where the loss mask of each assistant turn comes from.

Qwen3's template renders an assistant turn after the last user message with its ``<think>`` block and earlier
ones without, so a conversation's prefixes are not where its full rendering begins: each assistant turn is an
example of its own, rendered as a chat asks for it. A template with ``{% generation %}`` markers is trained on
exactly the marked text, as transformers' ``return_assistant_tokens_mask`` reads it.
"""
from pathlib import Path

import pytest
import transformers

from jaxengine.data import formats, pipeline
from jaxengine.data.pipeline import DataError, encode_rows
from jaxengine.tokenizer import load_tokenizer
from tests import factories

TEMPLATES_DIR = Path(__file__).parents[1] / "tokenizer" / "real_templates"

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6"},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "content": "You are welcome."},
]


@pytest.fixture(scope="module")
def template_dirs(tmp_path_factory):
    """template file name -> a small Qwen-style tokenizer directory with that template."""
    return {name: factories.build_bpe_tokenizer_dir(
                tmp_path_factory.mktemp(name.split(".")[0]), style="qwen",
                chat_template=(TEMPLATES_DIR / name).read_text(encoding="utf-8"))
            for name in ("qwen3.jinja", "qwen2_5_generation.jinja")}


def tokenizer_for(template_dirs, name, **template_kwargs):
    tokenizer = load_tokenizer(template_dirs[name])
    tokenizer.template_kwargs.update(template_kwargs)  # as a job's data.chat_template_kwargs (build_job_model)
    return tokenizer


def split_at_the_mask(tokenizer, example):
    """(untrained text, trained text) of an example trained on one span at its end."""
    ids, mask = example.ids.tolist(), example.loss_mask.tolist()
    start = mask.index(True)
    assert all(mask[start:]), "the trained span is not one run to the end"
    return (tokenizer.decode(ids[:start], skip_special_tokens=False),
            tokenizer.decode(ids[start:], skip_special_tokens=False))


@pytest.mark.parametrize(("template_kwargs", "think"), [
    ({}, "<think>\n\n</think>\n\n"),  # thinking on (the default): the model writes the think block
    ({"enable_thinking": True}, "<think>\n\n</think>\n\n"),
    ({"enable_thinking": False}, ""),  # off: the prompt ends with the empty think block, the answer follows
], ids=["default", "thinking on", "thinking off"])
def test_qwen3_trains_each_assistant_turn_from_the_prompt_a_chat_sends_for_it(template_dirs, template_kwargs, think):
    tokenizer = tokenizer_for(template_dirs, "qwen3.jinja", **template_kwargs)
    examples, stats = encode_rows([{"messages": CONVERSATION}], task="sft", tokenizer=tokenizer, max_seq_len=1024)
    assert (stats.rows, stats.examples, stats.split_by_turn, stats.dropped, stats.truncated) == (1, 3, 1, 0, 0)
    header = "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    # By hand: earlier turns as the template renders history (no think block), the trained turn last.
    gen_prompt = "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if not think else "")
    expected = [
        (header + gen_prompt, think + "4<|im_end|>\n"),
        (header + "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n" + gen_prompt,
         think + "6<|im_end|>\n"),
        (header + "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
         "<|im_start|>assistant\n6<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n" + gen_prompt,
         think + "You are welcome.<|im_end|>\n"),
    ]
    assert [split_at_the_mask(tokenizer, example) for example in examples] == expected
    for example, index in zip(examples, (2, 4, 6)):
        # The untrained part is token for token what the chat panel sends for that turn.
        prompt_ids = pipeline.encode_prompt(tokenizer, CONVERSATION[:index])
        assert example.ids[: len(prompt_ids)].tolist() == prompt_ids
        assert not example.loss_mask[: len(prompt_ids)].any() and example.loss_mask[len(prompt_ids):].all()


def test_qwen3_turns_reasoning_is_trained_where_the_turn_is_the_latest(template_dirs):
    tokenizer = tokenizer_for(template_dirs, "qwen3.jinja")
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "add"},
                {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "<think>\nadd again\n</think>\n\n6"}]
    examples, _ = encode_rows([{"messages": messages}], task="sft", tokenizer=tokenizer, max_seq_len=1024)
    assert [split_at_the_mask(tokenizer, example)[1] for example in examples] == [
        "<think>\nadd\n</think>\n\n4<|im_end|>\n", "<think>\nadd again\n</think>\n\n6<|im_end|>\n"]
    # The second turn's history is as a chat sends it: the first turn's reasoning dropped.
    assert "add\n" not in split_at_the_mask(tokenizer, examples[1])[0]


def test_qwen3_refuses_a_turn_with_reasoning_while_thinking_is_off(template_dirs):
    tokenizer = tokenizer_for(template_dirs, "qwen3.jinja", enable_thinking=False)
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "add"}]
    with pytest.raises(DataError) as raised:
        encode_rows([{"messages": messages}], task="sft", tokenizer=tokenizer, max_seq_len=1024, source="chats.jsonl")
    message = str(raised.value)
    assert message.startswith("chats.jsonl: row 1: message 2 (assistant): the chat template asks for this turn with a "
                              "prompt ending ")
    assert "enable_thinking is false" in message and "<think>\\nadd" in message


def test_qwen3_one_turn_and_loss_on_all_stay_one_example(template_dirs):
    tokenizer = tokenizer_for(template_dirs, "qwen3.jinja")
    rows = [{"prompt": "2+2?", "completion": "4"}, {"messages": CONVERSATION}]
    examples, stats = encode_rows(rows[:1], task="sft", tokenizer=tokenizer, max_seq_len=1024)
    assert (stats.examples, stats.split_by_turn) == (1, 0)
    assert split_at_the_mask(tokenizer, examples[0])[1] == "<think>\n\n</think>\n\n4<|im_end|>\n"
    # loss_on: all trains the whole conversation as the template renders it, no turn to locate.
    [example], stats = encode_rows(rows[1:], task="sft", tokenizer=tokenizer, max_seq_len=1024, loss_on="all")
    assert stats.split_by_turn == 0 and example.loss_mask.all()
    assert tokenizer.decode(example.ids.tolist(), skip_special_tokens=False) == tokenizer.apply_chat_template(CONVERSATION)


def test_qwen3_preference_pairs_of_several_turns_are_refused_with_the_way_out(template_dirs):
    tokenizer = tokenizer_for(template_dirs, "qwen3.jinja")
    rejected = [*CONVERSATION[:-1], {"role": "assistant", "content": "No."}]
    with pytest.raises(DataError, match=r"^row 1: chosen: the chat template renders earlier assistant turns "
                                        r"otherwise than the latest .* give the shared turns as the row's prompt"):
        encode_rows([{"prompt": None, "chosen": CONVERSATION, "rejected": rejected}], task="dpo",
                    tokenizer=tokenizer, max_seq_len=1024)
    # The shared turns as the prompt: one assistant turn a side, which Qwen3 renders as a chat does.
    [pair], _ = encode_rows([{"prompt": CONVERSATION[:-1], "chosen": "You are welcome.", "rejected": "No."}],
                            task="dpo", tokenizer=tokenizer, max_seq_len=1024)
    assert split_at_the_mask(tokenizer, pair.rejected)[1] == "<think>\n\n</think>\n\nNo.<|im_end|>\n"


def test_generation_markers_train_exactly_what_transformers_masks(template_dirs):
    tokenizer = tokenizer_for(template_dirs, "qwen2_5_generation.jinja")
    reference = transformers.AutoTokenizer.from_pretrained(str(template_dirs["qwen2_5_generation.jinja"]))
    [example], stats = encode_rows([{"messages": CONVERSATION}], task="sft", tokenizer=tokenizer, max_seq_len=1024)
    expected = reference.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True)
    assert example.ids.tolist() == expected["input_ids"]
    assert example.loss_mask.astype(int).tolist() == expected["assistant_masks"]
    assert stats.split_by_turn == 0
    # The marked text of TRL's template opens with the newline after the role.
    decoded = [tokenizer.decode(example.ids[start:end].tolist(), skip_special_tokens=False)
               for start, end in runs(example.loss_mask.tolist())]
    assert decoded == ["\n4<|im_end|>\n", "\n6<|im_end|>\n", "\nYou are welcome.<|im_end|>\n"]


def test_generation_markers_leave_a_prompts_own_assistant_turns_untrained(template_dirs):
    tokenizer = tokenizer_for(template_dirs, "qwen2_5_generation.jinja")
    [example], _ = encode_rows([{"prompt": CONVERSATION[:-1], "completion": "You are welcome."}], task="sft",
                               tokenizer=tokenizer, max_seq_len=1024)
    [(start, end)] = runs(example.loss_mask.tolist())
    assert end == len(example)
    assert tokenizer.decode(example.ids[start:].tolist(), skip_special_tokens=False) == "\nYou are welcome.<|im_end|>\n"


def runs(mask):
    """[start, end) of each run of True in ``mask``."""
    found, start = [], None
    for index, value in enumerate([*mask, False]):
        if value and start is None:
            start = index
        elif not value and start is not None:
            found.append((start, index))
            start = None
    return found


@pytest.mark.parametrize(("name", "splits"), [("qwen3.jinja", True), ("llama3_2.jinja", False), (None, False)],
                         ids=["qwen3", "llama3.2", "chatml"])
def test_the_launchs_probe_says_whether_the_pipeline_splits_a_conversation(template_dirs, tmp_path, name, splits):
    """The launch warns of conversations trained one turn per example from a probe chat (jax-free,
    formats.turns_split_apart): it agrees with what the pipeline does with such a conversation."""
    directory = (template_dirs[name] if name in template_dirs else factories.build_bpe_tokenizer_dir(
        tmp_path, style="qwen", chat_template=(TEMPLATES_DIR / name).read_text(encoding="utf-8") if name else None))
    tokenizer = load_tokenizer(directory)
    _, stats = encode_rows([{"messages": CONVERSATION}], task="sft", tokenizer=tokenizer, max_seq_len=1024)
    assert stats.split_by_turn == int(splits)
    assert formats.turns_split_apart(
        lambda messages, add_generation_prompt: tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt)) is splits
