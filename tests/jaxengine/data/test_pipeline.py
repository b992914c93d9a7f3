"""Data pipeline: exact loss masks, truncation counts, packing boundaries, deterministic shuffling.

A character-level toy tokenizer with a ChatML-like template makes every expected token position
computable by hand: one character is one token, and the specials are single tokens.
"""
import json

import jax.numpy as jnp
import numpy as np
import pytest

from jaxengine.data import pipeline
from jaxengine.data.pipeline import DataPosition, Example, encode_rows
from tests import factories


class CharTokenizer:
    """ids: 0 pad, 1 <s>, 2 </s>, 3 <|im_start|>, 4 <|im_end|>, then one id per character."""

    SPECIALS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

    def __init__(self, *, chat: bool):
        self.bos_id, self.eos_ids, self.pad_id = 1, [2], 0
        self.chat_template = "chatml-like" if chat else None

    def encode(self, text, *, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            special = next((s for s in self.SPECIALS if text.startswith(s, i)), None)
            if special:
                ids.append(self.SPECIALS.index(special))
                i += len(special)
            else:
                ids.append(len(self.SPECIALS) + ord(text[i]))
                i += 1
        return ids

    def decode(self, ids):
        return "".join(self.SPECIALS[i] if i < len(self.SPECIALS) else chr(i - len(self.SPECIALS)) for i in ids)

    def apply_chat_template(self, messages, *, add_generation_prompt=False):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def trained_text(tokenizer, example: Example) -> list[str]:
    """The maximal runs of trained tokens, decoded."""
    runs, current = [], []
    for token, trained in zip(example.ids.tolist(), example.loss_mask.tolist()):
        if trained:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_chat_mask_covers_exactly_the_assistant_turns():
    tok = CharTokenizer(chat=True)
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "2+2"},
        {"role": "assistant", "content": "4"},
    ]
    [example], stats = encode_rows([{"messages": messages}], task="sft", tokenizer=tok, max_seq_len=512)
    text = tok.decode(example.ids.tolist())
    assert text == "<s>" + tok.apply_chat_template(messages)
    # By hand: <s> at 0; "<|im_start|>system\nS<|im_end|>\n" is 1 + 7 + 1 + 1 + 1 = 11 tokens (1..11);
    # "<|im_start|>user\nhi<|im_end|>\n" 1 + 5 + 2 + 1 + 1 = 10 (12..21); "<|im_start|>assistant\n" 11
    # (22..32); so the trained "yo<|im_end|>\n" is 33..36.
    trained_positions = np.flatnonzero(example.loss_mask).tolist()
    first_turn = list(range(33, 37))
    # "<|im_start|>user\n2+2<|im_end|>\n" 11 (37..47), the assistant header 11 (48..58), "4<|im_end|>\n" 59..61.
    second_turn = list(range(59, 62))
    assert trained_positions == first_turn + second_turn
    assert trained_text(tok, example) == ["yo<|im_end|>\n", "4<|im_end|>\n"]
    assert stats.loss_tokens == 7 and stats.truncated == 0 and stats.dropped == 0


def test_prompt_completion_uses_the_chat_template_and_encode_prompt_matches_it():
    tok = CharTokenizer(chat=True)
    [example], _ = encode_rows([{"prompt": "1+1?", "completion": "2"}], task="sft", tokenizer=tok, max_seq_len=64)
    assert trained_text(tok, example) == ["2<|im_end|>\n"]
    prompt_ids = pipeline.encode_prompt(tok, "1+1?")
    # The generation prompt is exactly the untrained prefix the model saw in training.
    assert example.ids[: len(prompt_ids)].tolist() == prompt_ids
    assert not example.loss_mask[: len(prompt_ids)].any() and example.loss_mask[len(prompt_ids)]


def test_without_a_template_it_is_bos_prompt_completion_eos():
    tok = CharTokenizer(chat=False)
    [example], _ = encode_rows([{"prompt": "ab", "completion": "c"}], task="sft", tokenizer=tok, max_seq_len=64)
    assert example.ids.tolist() == [1, 5 + ord("a"), 5 + ord("b"), 5 + ord("c"), 2]
    assert example.loss_mask.tolist() == [False, False, False, True, True]


def test_loss_on_all_trains_every_token():
    tok = CharTokenizer(chat=False)
    [example], _ = encode_rows([{"prompt": "ab", "completion": "c"}], task="sft", tokenizer=tok, max_seq_len=64,
                               loss_on="all")
    assert example.loss_mask.all()


def test_truncation_cuts_the_prompt_from_the_left_and_keeps_the_completion():
    tok = CharTokenizer(chat=False)
    rows = [
        {"prompt": "0123456789", "completion": "ab"},  # 1 + 10 + 2 + 1 = 14 > 8: prompt keeps its last 5 tokens
        {"prompt": "p", "completion": "abcdefghijk"},  # 1 + 1 + 11 + 1 = 14: prompt keeps 2, completion cut to 6
        {"prompt": "p", "completion": "ok"},  # fits
    ]
    examples, stats = encode_rows(rows, task="sft", tokenizer=tok, max_seq_len=8)
    assert stats.truncated == 2 and stats.dropped == 0 and stats.examples == 3
    assert tok.decode(examples[0].ids.tolist()) == "56789ab</s>"
    assert trained_text(tok, examples[0]) == ["ab</s>"]
    assert tok.decode(examples[1].ids.tolist()) == "<s>pabcdef"
    assert trained_text(tok, examples[1]) == ["abcdef"]
    assert all(len(example) <= 8 for example in examples)


def test_a_long_prompt_never_pushes_the_assistant_turn_out():
    tok = CharTokenizer(chat=True)
    long_user = [{"role": "user", "content": "x" * 40}, {"role": "assistant", "content": "y"}]
    [example], stats = encode_rows([{"messages": long_user}], task="sft", tokenizer=tok, max_seq_len=16)
    assert stats.truncated == 1 and stats.dropped == 0
    assert len(example) == 16 and trained_text(tok, example) == ["y<|im_end|>\n"]


def test_rows_without_any_trained_token_are_dropped_and_counted():
    tok = CharTokenizer(chat=False)
    tok.eos_ids = []  # no EOS to train on: an empty completion leaves nothing to learn
    rows = [{"prompt": "p", "completion": ""}, {"prompt": "p", "completion": "c"}]
    examples, stats = encode_rows(rows, task="sft", tokenizer=tok, max_seq_len=8)
    assert (stats.rows, stats.examples, stats.dropped) == (2, 1, 1)
    assert trained_text(tok, examples[0]) == ["c"]


def test_pretrain_splits_long_texts_into_windows():
    tok = CharTokenizer(chat=False)
    examples, stats = encode_rows([{"text": "abcdefghij"}], task="pretrain", tokenizer=tok, max_seq_len=5)
    # <s> a..j </s> = 12 tokens -> windows of 5, 5, 2
    assert [len(e) for e in examples] == [5, 5, 2]
    assert stats.split == 1 and stats.tokens == 12


def test_preference_pairs_share_the_prompt_and_train_the_continuations():
    tok = CharTokenizer(chat=True)
    rows = [{"prompt": "q", "chosen": "good", "rejected": "bad"}]
    [pair], stats = encode_rows(rows, task="dpo", tokenizer=tok, max_seq_len=64)
    assert trained_text(tok, pair.chosen) == ["good<|im_end|>\n"]
    assert trained_text(tok, pair.rejected) == ["bad<|im_end|>\n"]
    prompt_len = len(pipeline.encode_prompt(tok, "q"))
    assert pair.chosen.ids[:prompt_len].tolist() == pair.rejected.ids[:prompt_len].tolist()
    batch = pipeline.make_batch([pair], max_seq_len=64, pad_id=0)
    assert batch.chosen.input_ids.shape == batch.rejected.input_ids.shape == (1, 32)


def test_batch_targets_are_shifted_within_each_packed_segment():
    a = Example(ids=np.array([10, 11, 12], np.int32), loss_mask=np.array([False, True, True]))
    b = Example(ids=np.array([20, 21], np.int32), loss_mask=np.array([False, True]))
    batch = pipeline.rows_to_batch([[a, b], [b]], length=6, pad_id=0)
    assert batch.input_ids.tolist() == [[10, 11, 12, 20, 21, 0], [20, 21, 0, 0, 0, 0]]
    assert batch.targets.tolist() == [[11, 12, 0, 21, 0, 0], [21, 0, 0, 0, 0, 0]]
    # The last token of segment 1 (12) must not be trained to predict segment 2's first token (20).
    assert batch.loss_mask.tolist() == [[True, True, False, True, False, False],
                                        [True, False, False, False, False, False]]
    assert batch.segment_ids.tolist() == [[1, 1, 1, 2, 2, 0], [1, 1, 0, 0, 0, 0]]
    assert batch.positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 0, 0, 0, 0]]
    assert pipeline.last_token_index(batch).tolist() == [4, 1]


def test_attention_never_crosses_segment_boundaries():
    mask = np.asarray(pipeline.attention_mask(jnp.array([[1, 1, 2, 2, 2, 0]])))[0]
    expected = np.array([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],  # padding attends to itself only, so no row is fully masked
    ], bool)
    np.testing.assert_array_equal(mask, expected)


def examples_of_lengths(lengths):
    return [Example(ids=np.full((n,), i + 5, np.int32), loss_mask=np.ones((n,), np.bool_))
            for i, n in enumerate(lengths)]


def test_packed_stream_fills_rows_without_splitting_examples():
    examples = examples_of_lengths([3, 4, 2, 5, 1, 6, 2])
    stream = pipeline.BatchStream(examples=examples, batch_size=2, max_seq_len=8, pad_id=0, seed=0, packing=True)
    for _ in range(5):
        batch = stream.next_batch()
        assert batch.input_ids.shape == (2, 8)
        for row_ids, row_segments in zip(batch.input_ids, batch.segment_ids):
            for segment in set(row_segments.tolist()) - {0}:
                values = set(row_ids[row_segments == segment].tolist())
                assert len(values) == 1  # every segment is one whole example (all its ids are equal)
                assert (row_segments == segment).sum() == examples[values.pop() - 5].ids.size


def collect(stream, n):
    return [np.asarray(stream.next_batch().input_ids).tolist() for _ in range(n)]


def test_shuffling_is_seeded_covers_each_epoch_and_resumes_exactly():
    examples = examples_of_lengths([2] * 5)
    make = lambda **kw: pipeline.BatchStream(examples=examples, batch_size=2, max_seq_len=16, pad_id=0, **kw)
    first = make(seed=3)
    batches = collect(first, 5)  # 10 examples = exactly two epochs
    assert batches == collect(make(seed=3), 5)
    assert batches != collect(make(seed=4), 5)
    seen = [row[0] for batch in batches for row in batch]
    assert sorted(seen[:5]) == sorted(seen[5:]) == [5, 6, 7, 8, 9]
    assert seen[:5] != seen[5:]  # a new order each epoch (fixed by (seed, epoch))
    resumed_from = make(seed=3)
    collect(resumed_from, 3)
    position = resumed_from.position
    assert position == DataPosition(epoch=1, cursor=1)
    assert collect(make(seed=3, position=position), 2) == batches[3:]


def test_eval_batches_pad_the_last_batch_with_empty_rows():
    batches = list(pipeline.eval_batches(examples_of_lengths([3, 3, 3]), batch_size=2, max_seq_len=16, pad_id=0))
    assert len(batches) == 2
    assert batches[1].loss_mask[1].sum() == 0 and batches[1].loss_mask[0].sum() == 2


def test_pad_length_is_a_power_of_two_capped_at_the_budget():
    assert [pipeline.pad_length(n, 100) for n in (1, 16, 17, 33, 64, 65, 99)] == [16, 16, 32, 64, 64, 100, 100]


def test_read_examples_reads_the_task_kind_and_names_bad_rows(tmp_path):
    good = tmp_path / "sft.jsonl"
    good.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    assert list(pipeline.read_examples(good, kind="sft")) == [{"prompt": "a", "completion": "b"}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n" + json.dumps({"prompt": "a"}) + "\n")
    with pytest.raises(pipeline.DataError, match=r"bad.jsonl: line 2.*completion"):
        list(pipeline.read_examples(bad, kind="sft"))


def test_read_examples_maps_the_files_own_column_names(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "a", "reply": "b"}) + "\n")
    rows = list(pipeline.read_examples(path, kind="sft", columns={"prompt": "question", "completion": "reply"}))
    assert rows == [{"prompt": "a", "completion": "b"}]


@pytest.mark.parametrize("batches", [1, 3, 5, 9])
def test_examples_drawn_are_the_ones_a_stream_reads(batches):
    examples = examples_of_lengths([2] * 10)  # example i holds the id i + 5
    stream = pipeline.BatchStream(examples=examples, batch_size=2, max_seq_len=16, pad_id=0, seed=7)
    read = {row[0] - 5 for batch in collect(stream, batches) for row in batch}
    drawn = pipeline.examples_drawn(len(examples), seed=7, draws=2 * batches)
    assert drawn.tolist() == sorted(read)
    assert len(drawn) == min(2 * batches, 10)  # from an epoch on, every example


@pytest.mark.parametrize("template,message", factories.HOSTILE_CHAT_TEMPLATES.values(),
                         ids=factories.HOSTILE_CHAT_TEMPLATES.keys())
@pytest.mark.parametrize("task,row", [("sft", {"prompt": "q", "completion": "a"}),
                                      ("dpo", {"prompt": "q", "chosen": "a", "rejected": "b"})])
def test_a_row_a_hostile_chat_template_fails_on_stops_training_naming_the_row_and_file(tmp_path, template, message,
                                                                                       task, row):
    """Only jinja2's own errors were a ChatTemplateError: a template's 1/0 or RecursionError stopped the run with a
    traceback naming no row, and an endless loop held the worker."""
    from jaxengine.tokenizer import load_tokenizer

    model_dir = factories.build_bpe_tokenizer_dir(tmp_path, chat_template=template)
    with pytest.raises(pipeline.DataError) as raised:
        encode_rows([row], task=task, tokenizer=load_tokenizer(model_dir), max_seq_len=64, source="train.jsonl")
    assert str(raised.value).startswith(f"train.jsonl: row 1: {model_dir / 'tokenizer_config.json'}: chat template")
    assert message in str(raised.value)


def test_a_dpo_batch_of_ultrafeedbacks_layout_holds_the_prompt_once(tmp_path):
    """UltraFeedback's layout (a prompt, and chosen and rejected as whole conversations that begin with its turn)
    is read as TRL reads it (``formats.read_prompt_once``): the token ids of the DPO batch hold the prompt once per
    side, the conversation rendered as the chat template renders it, and train on the answer alone. Training put the
    prompt before each side (the model read [user: q, user: q, assistant: a]); then commit 89b691ae refused the
    rows."""
    tok = CharTokenizer(chat=True)
    question = {"role": "user", "content": "Name a prime."}
    path = tmp_path / "ultrafeedback.jsonl"
    path.write_text(json.dumps({"prompt": "Name a prime.",
                                "chosen": [question, {"role": "assistant", "content": "7"}],
                                "rejected": [question, {"role": "assistant", "content": "8"}]}) + "\n")
    rows = list(pipeline.read_examples(path, kind="preference"))
    [pair], stats = encode_rows(rows, task="dpo", tokenizer=tok, max_seq_len=64)
    batch = pipeline.make_batch([pair], max_seq_len=64, pad_id=tok.pad_id)
    for side, answer in ((batch.chosen, "7"), (batch.rejected, "8")):
        ids = side.input_ids[0][side.segment_ids[0] > 0].tolist()
        text = tok.decode(ids)
        assert text.count("Name a prime.") == 1
        assert ids == [tok.bos_id] + tok.encode(tok.apply_chat_template([question, {"role": "assistant",
                                                                                     "content": answer}]))
        trained = [target for target, trained in zip(side.targets[0].tolist(), side.loss_mask[0].tolist()) if trained]
        assert tok.decode(trained) == f"{answer}<|im_end|>\n"
    assert stats.examples == 1 and stats.dropped == 0
