"""The demo corpus and tokenizer: deterministic, correct answers, a clean held-out split, loadable."""
import json
import random

from jaxengine.data import pipeline
from jaxengine.demo import corpus
from jaxengine.demo import tokenizer as demo_tokenizer
from jaxengine.tokenizer import load_tokenizer


def test_problems_are_deterministic_and_answers_are_right():
    problems = corpus.generate_problems(seed=1, count=400)
    assert problems == corpus.generate_problems(seed=1, count=400)
    assert problems != corpus.generate_problems(seed=2, count=400)
    assert len({p.prompt for p in problems}) == 400
    assert {p.task for p in problems} == set(corpus.TASKS)
    for p in problems:
        assert p.answer != p.wrong, p
        if p.task == "add":
            expression = p.prompt.removeprefix("What is ").removesuffix("?")
            assert str(eval(expression)) == p.answer  # noqa: S307 - our own generated arithmetic
        if p.task in ("largest", "smallest", "even"):
            digits = [int(d) for d in p.prompt.rsplit(" in ", 1)[1].removesuffix("?").split(" ")]
            assert len(digits) == corpus.DIGITS_PER_LIST
            expected = {"largest": max(digits), "smallest": min(digits),
                        "even": sum(d % 2 == 0 for d in digits)}[p.task]
            assert p.answer == str(expected), p
        if p.task == "count":
            letter, word = p.prompt.removeprefix("How many times does ").removesuffix("?").split(" appear in ")
            assert p.answer == str(word.count(letter))


def test_known_problems_have_hand_checked_answers():
    rng = random.Random(0)
    problems = [corpus.TASKS[name](rng) for name in ("largest", "smallest", "even", "add", "count")]
    assert [(p.prompt, p.answer, p.wrong) for p in problems] == [
        ("What is the largest digit in 6 6 0 4?", "6", "0"),
        ("What is the smallest digit in 8 7 6 4?", "4", "8"),
        ("How many even digits are in 7 5 9 3?", "0", "4"),
        ("What is 8 + 2 + 4?", "14", "13"),
        ("How many times does e appear in sheep?", "2", "3"),
    ]


def test_held_out_problems_never_reach_the_training_files(tmp_path):
    problems = corpus.generate_problems(seed=0, count=2000)
    rows = corpus.dataset_rows(problems, max_eval=50)
    eval_prompts = {row["prompt"] for row in rows["eval"]}
    assert len(rows["eval"]) == 50 and all(row["answer"] for row in rows["eval"])
    for name in ("sft", "preference", "prompts"):
        assert not eval_prompts & {row["prompt"] for row in rows[name]}
    text = "\n".join(corpus.pretrain_documents(problems, seed=0))
    assert not any(prompt in text for prompt in eval_prompts)
    paths = corpus.write_datasets(rows, tmp_path)
    first = paths["sft"].read_bytes()
    corpus.write_datasets(corpus.dataset_rows(corpus.generate_problems(seed=0, count=2000), max_eval=50), tmp_path)
    assert paths["sft"].read_bytes() == first
    assert json.loads(paths["prompts"].read_text().splitlines()[0]).keys() == {"prompt", "answer", "task"}
    assert list(pipeline.read_examples(paths["preference"], kind="preference"))[0]["chosen"]


def test_the_demo_tokenizer_loads_with_single_chat_markers(tmp_path):
    problems = corpus.generate_problems(seed=0, count=600)
    texts = list(corpus.pretrain_documents(problems, seed=0))
    proto = demo_tokenizer.train_sentencepiece(texts, vocab_size=400)
    assert proto == demo_tokenizer.train_sentencepiece(texts, vocab_size=400)
    tok = load_tokenizer(demo_tokenizer.write_tokenizer_dir(proto, tmp_path))
    im_start, im_end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert tok.eos_ids == [3, im_end] and tok.bos_id == 2 and tok.pad_id == 0
    chat = [{"role": "user", "content": "What is 17 + 25?"}, {"role": "assistant", "content": "42"}]
    text = tok.apply_chat_template(chat)
    ids = tok.encode(text)
    assert ids.count(im_start) == 2 and ids.count(im_end) == 2
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert [tok.decode([i]) for i in tok.encode("1234")] == ["1", "2", "3", "4"]  # digits split
    assert tok.decode(tok.encode("ünïcødé ✨")) == "ünïcødé ✨"  # byte fallback


def test_the_teacher_answers_right_two_times_in_five_and_otherwise_makes_the_problems_mistake():
    problems = [p for p in corpus.generate_problems(seed=0, count=3000) if not p.held_out]
    rows = corpus.dataset_rows(problems, max_eval=10)["sft_teacher"]
    assert [row["prompt"] for row in rows] == [p.prompt for p in problems]
    for task in corpus.TASKS:
        answers = [(row["completion"], p) for row, p in zip(rows, problems) if p.task == task]
        assert all(completion in (p.answer, p.wrong) for completion, p in answers)
        right = sum(completion == p.answer for completion, p in answers) / len(answers)
        assert 0.33 < right < 0.47, (task, right)  # 40 % by CRC32, a few hundred rows per kind
    # fixed by the prompt alone: the same problem gets the same demonstration in any build
    assert corpus.dataset_rows(problems[::-1], max_eval=10)["sft_teacher"] == rows[::-1]
