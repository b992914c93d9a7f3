"""``jaxengine eval``: greedy exact match of the sampler's completions, compared as the ``exact_match`` reward
compares, the figure per value of ``--by``, and the errors a wrong file or flag gets."""
import json

import pytest

from jaxengine.checkpoint.hf import load_hf_model
from jaxengine.cli import main
from jaxengine.data.pipeline import encode_prompt
from jaxengine.demo.build import DemoSettings, build_demo
from jaxengine import evaluate, rewards
from jaxengine.evaluate import answers_match, grouped_metrics, group_labels, mean_by, score_exact_match
from jaxengine.sampler import Sampler, SamplingParams
from jaxengine.tokenizer import load_tokenizer

MICRO = DemoSettings(problems=300, vocab_size=400, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                     num_kv_heads=1, seq_len=64, batch_size=8, steps=2, max_eval=8)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    build_demo(out, MICRO, progress_bar=False)
    return out


@pytest.fixture(scope="module")
def greedy_texts(demo_dir):
    """The micro model's greedy 4-token completions of the demo's eval prompts, straight from the sampler."""
    model, _ = load_hf_model(demo_dir / "model")
    tokenizer = load_tokenizer(demo_dir / "model")
    rows = [json.loads(line) for line in (demo_dir / "data/eval.jsonl").read_text().splitlines()]
    generations = Sampler(model, tokenizer).generate([encode_prompt(tokenizer, row["prompt"]) for row in rows],
                                                     SamplingParams(max_new_tokens=4, temperature=0.0, seed=0))
    return rows, [generation.text for generation in generations]


def eval_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["eval", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_exact_match_by_column_scores_the_samplers_completions(demo_dir, greedy_texts, tmp_path, capsys):
    rows, texts = greedy_texts
    # The micro model (two training steps) answers with blank lines, which match nothing: the figures
    # for known completions are worked out by hand below; here the CLI must score the sampler's own.
    grouped = [{**row, "kind": "first" if index < 3 else "rest"} for index, row in enumerate(rows)]
    data = tmp_path / "grouped.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in grouped))

    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(data),
                              "--metric", "exact_match", "--max-new-tokens", "4", "--by", "kind")
    assert code == 0, err
    result = json.loads(out)
    assert result == score_exact_match(texts, grouped, by="kind")
    assert result["count"] == 8 and {group: figures["count"] for group, figures in result["groups"].items()} == {
        "first": 3, "rest": 5}
    assert [example["text"] for example in result["examples"]] == texts[:5]


def test_exact_match_compares_as_the_exact_match_reward_does():
    texts = ["1,000", " 7 ", "7", "Paris\n", "paris", "  ", "１２"]
    rows = [{"prompt": str(index), "answer": answer, "kind": kind} for index, (answer, kind) in enumerate(
        [("1000", "number"), ("7", "number"), ("8", "number"), ("Paris", "word"), ("Paris", "word"), ("", "word"),
         ("12", "number")])]
    assert answers_match(texts, rows) == [True, True, False, True, False, False, True]
    answerable = [index for index, row in enumerate(rows) if row["answer"]]
    assert [answers_match(texts, rows)[index] for index in answerable] == [
        score == 1.0 for score in rewards.exact_match([texts[index] for index in answerable],
                                                      [rows[index] for index in answerable])]
    # The reward refuses a blank reference (an RL run's rows are checked before it starts); an evaluation
    # counts the row as unmatched, as it always did.
    with pytest.raises(ValueError, match="reference answer='' is empty"):
        rewards.exact_match(texts, rows)
    result = score_exact_match(texts, rows, by="kind")
    assert result["value"] == 4 / 7 and result["count"] == 7
    assert result["groups"] == {"number": {"value": 0.75, "count": 4}, "word": {"value": 1 / 3, "count": 3}}
    assert result["examples"] == [{"prompt": row["prompt"], "answer": row["answer"], "text": text}
                                  for row, text in zip(rows[:5], texts)]


def test_exact_match_without_by_has_no_groups(demo_dir, capsys):
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(demo_dir / "data/eval.jsonl"),
                              "--metric", "exact_match", "--max-new-tokens", "4", "--limit", "3")
    assert code == 0, err
    result = json.loads(out)
    assert result["count"] == 3 and "groups" not in result


def test_by_a_column_a_row_lacks_names_the_row(demo_dir, tmp_path, capsys):
    data = tmp_path / "partly.jsonl"
    data.write_text('{"prompt": "a", "answer": "1", "task": "add"}\n{"prompt": "b", "answer": "2"}\n')
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(data),
                              "--metric", "exact_match", "--by", "task")
    assert code == 2 and out == ""
    assert f"--data {data}: row 2 has no 'task' column to group --by" in err


def test_exact_match_on_rows_without_answers_names_the_row(demo_dir, capsys):
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(demo_dir / "data/sft.jsonl"),
                              "--metric", "exact_match")
    assert code == 2 and out == ""
    assert (f"--data {demo_dir / 'data/sft.jsonl'}: row 1 has no 'answer' string (its columns: completion, prompt); "
            "exact_match needs a prompts file with an 'answer' column in every row, or --answer-column naming "
            "another") in err


def test_answer_column_reads_the_references_from_another_column(demo_dir, tmp_path, capsys):
    """QA: exact_match read references from an 'answer' column only, where the rewards take answer_column; a
    prompts file whose answers are in 'solution' could not be scored without rewriting it."""
    data = tmp_path / "solutions.jsonl"
    renamed(demo_dir / "data" / "eval.jsonl", data, {"answer": "solution"})
    common = ["--model", str(demo_dir / "model"), "--metric", "exact_match", "--limit", "3", "--max-new-tokens", "4"]
    code, out, err = eval_cli(capsys, *common, "--data", str(data), "--answer-column", "solution")
    assert code == 0, err
    code, expected, err = eval_cli(capsys, *common, "--data", str(demo_dir / "data" / "eval.jsonl"))
    assert code == 0 and json.loads(out)["value"] == json.loads(expected)["value"]
    code, out, err = eval_cli(capsys, *common, "--data", str(data), "--answer-column", "missing")
    assert code == 2 and "row 1 has no 'missing' string" in err
    assert "exact_match needs the reference answers in column 'missing' (--answer-column) of every row" in err


def test_rewards_scores_the_greedy_completions_with_the_terms_of_a_file(demo_dir, greedy_texts, tmp_path, capsys):
    """As a GRPO run's grpo.rewards: the file's terms score the sampler's own completions, by column too."""
    rows, texts = greedy_texts
    grouped = [{**row, "kind": "first" if index < 3 else "rest"} for index, row in enumerate(rows)]
    data = tmp_path / "grouped.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in grouped))
    terms = tmp_path / "rewards.yaml"
    terms.write_text("- {name: length_target, weight: 2, args: {target: 3}}\n- name: numeric_match\n")
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(data), "--metric", "rewards",
                              "--rewards", str(terms), "--max-new-tokens", "4", "--by", "kind")
    assert code == 0, err
    result = json.loads(out)
    weighted = [rewards.WeightedReward(name="length_target", weight=2.0, args={"target": 3}),
                rewards.WeightedReward(name="numeric_match", args={})]
    assert result == json.loads(json.dumps(evaluate.score_reward_terms(texts, grouped, weighted, by="kind")))
    assert set(result["terms"]) == {"length_target", "numeric_match"} and result["count"] == 8


@pytest.mark.parametrize(("flags", "content", "words"), [
    ([], None, "--metric rewards needs --rewards FILE"),
    (["--rewards", "{file}"], "- {name: format_regex}\n", "--rewards {file}: rewards.0.args.pattern: format_regex: "
                                                         "required argument missing: pattern"),
    (["--rewards", "{file}"], "- {name: contains\n", "--rewards {file}: not YAML or JSON"),
    (["--rewards", "{file}", "--answer-column", "solution"], "[{name: valid_json}]",
     "--answer-column is read by exact_match only"),
    (["--rewards", "{file}"], '[{"name": "numeric_match", "args": {"answer_column": "colour"}}]',
     "row 1 has no 'colour' value, where numeric_match reads the reference answer"),
])
def test_rewards_refuses_a_bad_file_or_flag_naming_it(demo_dir, tmp_path, capsys, flags, content, words):
    terms = tmp_path / "rewards.yaml"
    if content is not None:
        terms.write_text(content)
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(demo_dir / "data/eval.jsonl"),
                              "--metric", "rewards", *[flag.format(file=terms) for flag in flags])
    assert code == 2 and out == ""
    assert words.format(file=terms) in err and "Traceback" not in err


def test_rewards_is_read_with_metric_rewards_only(demo_dir, tmp_path, capsys):
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(demo_dir / "data/eval.jsonl"),
                              "--metric", "exact_match", "--rewards", str(tmp_path / "rewards.yaml"))
    assert code == 2 and "--rewards is read with --metric rewards only (not exact_match)" in err


@pytest.mark.parametrize("flag, metric", [("--limit", "exact_match"), ("--max-new-tokens", "exact_match"),
                                          ("--max-seq-len", "loss")])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_it_rejects_a_size_below_one_naming_the_flag(demo_dir, capsys, flag, metric, value):
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(demo_dir / "data/eval.jsonl"),
                              "--metric", metric, flag, value)
    assert code == 2 and out == ""
    assert err == f"jaxengine eval: error: {flag} must be at least 1, got {value}\n"


@pytest.mark.parametrize("metric", ["exact_match", "loss"])
def test_a_missing_data_file_is_named(demo_dir, tmp_path, capsys, metric):
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(tmp_path / "missing.jsonl"),
                              "--metric", metric)
    assert code == 2 and out == ""
    assert err == f"jaxengine eval: error: --data {tmp_path / 'missing.jsonl'}: no such file\n"


@pytest.mark.parametrize("content, problem", [("", "the file is empty (0 bytes)"), ("\n\n", "no rows to score")],
                         ids=["0 bytes", "blank lines"])
@pytest.mark.parametrize("metric, need", [
    ("exact_match", "exact_match needs a prompts file with an 'answer' column"),
    ("loss", "loss needs an sft file (prompt and completion) or a prompts file with an 'answer' column")])
def test_an_empty_data_file_is_named_with_what_the_metric_needs(demo_dir, tmp_path, capsys, content, problem,
                                                                 metric, need):
    """QA: an empty --data file was told to 'upload a file with rows', the web app's words."""
    data = tmp_path / "empty.jsonl"
    data.write_text(content)
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(data), "--metric", metric)
    assert code == 2 and out == ""
    assert err == f"jaxengine eval: error: --data {data}: {problem}; {need}\n"


NEEDS_LOSS = "loss needs an sft file (prompt and completion) or a prompts file with an 'answer' column"


@pytest.mark.parametrize(("content", "problem"), [
    ('{"prompt": "What is 2 + 2?", "answer": "4"}\n{"prompt": "What is 3 + 3?", "answer": "6"}\n'
     '{"prompt": "What is 1 + 3?", "answer": "4"\n',
     "line 3, row 3: broken JSON at column 43: Expecting ',' delimiter; each line must be one JSON object"),
    ('{"prompt": "What is 2 + 2?", "completion": "4"}\n{"prompt": "What is 3 + 3?", "completion": 6}\n',
     "line 2, row 2, field 'completion': must be a string, got a number: write it as text, in quotes (\"6\")"),
], ids=["prompts with answers", "sft"])
def test_loss_names_the_bad_row_of_a_file_of_either_kind_it_takes(demo_dir, tmp_path, capsys, content, problem):
    """--metric loss reads prompts with answers or sft rows: read as prompts and, failing that, as sft, a prompts
    file whose third line was broken was told the sft reading's error, that its first row lacked a 'completion'.
    The error of the kind that read further is the file's."""
    data = tmp_path / "rows.jsonl"
    data.write_text(content)
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(data), "--metric", "loss")
    assert code == 2 and out == ""
    assert err == f"jaxengine eval: error: --data {data}: {problem}; {NEEDS_LOSS}\n"


def renamed(source, target, names: dict[str, str]) -> None:
    """``source``'s rows with their columns renamed (old -> new) written to ``target``."""
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    target.write_text("".join(json.dumps({names.get(key, key): value for key, value in row.items()}) + "\n"
                              for row in rows))


@pytest.mark.parametrize("metric, source, names, flags", [
    ("exact_match", "eval.jsonl", {"prompt": "question"}, ["--map", "prompt=question"]),
    ("loss", "sft.jsonl", {"prompt": "question", "completion": "response"},
     ["--map", "prompt=question", "--map", "completion=response"]),
], ids=["exact_match", "loss"])
def test_map_reads_fields_from_differently_named_columns(demo_dir, tmp_path, capsys, metric, source, names, flags):
    """QA: eval's error suggested a column mapping that the command had no way to give."""
    data = tmp_path / "renamed.jsonl"
    renamed(demo_dir / "data" / source, data, names)
    common = ["--model", str(demo_dir / "model"), "--metric", metric, "--limit", "3", "--max-new-tokens", "4"]
    code, unmapped, err = eval_cli(capsys, *common, "--data", str(data))
    assert code == 2 and "(map a differently named column to it: --map FIELD=COLUMN)" in err
    code, out, err = eval_cli(capsys, *common, "--data", str(data), *flags)
    assert code == 0, err
    code, expected, err = eval_cli(capsys, *common, "--data", str(demo_dir / "data" / source))
    assert code == 0 and json.loads(out) == json.loads(expected)


@pytest.mark.parametrize("metric, flag, message", [
    ("exact_match", "prompt", "--map 'prompt': write FIELD=COLUMN, e.g. --map prompt=question"),
    ("exact_match", "completion=response", "--map: column mapping: 'completion' is not a field of kind 'prompts'; "
                                           "map one of: prompt (exact_match reads a prompts file)"),
    ("loss", "chosen=better", "--map: column mapping: 'chosen' is not a field of kind 'sft'; "
                              "map one of: prompt, completion, messages (loss reads an sft file)"),
], ids=["no equals sign", "not a prompts field", "not an sft field"])
def test_it_rejects_a_map_it_cannot_apply(demo_dir, capsys, metric, flag, message):
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(demo_dir / "data/eval.jsonl"),
                              "--metric", metric, "--map", flag)
    assert code == 2 and out == ""
    assert err == f"jaxengine eval: error: {message}\n"


def test_by_with_loss_is_refused(demo_dir, capsys):
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(demo_dir / "data/eval.jsonl"),
                              "--metric", "loss", "--by", "task")
    assert code == 2 and out == ""
    assert "--by groups exact_match and rewards only" in err


def test_mean_by_hand_computed():
    groups = mean_by([True, False, True, True, False], ["b", "a", "b", "c", "b"])
    assert groups == {"a": {"value": 0.0, "count": 1}, "b": {"value": 2 / 3, "count": 3},
                      "c": {"value": 1.0, "count": 1}}
    assert list(groups) == ["a", "b", "c"]
    with pytest.raises(ValueError):
        mean_by([True], ["a", "b"])


def test_eval_group_labels_and_grouped_metrics():
    rows = [{"task": "add"}, {"task": 3}, {"task": "add"}]
    assert group_labels(rows, "task", source="e.jsonl") == ["add", "3", "add"]
    assert grouped_metrics("eval/m", [1.0, 0.5, 0.0], ["add", "3", "add"]) == {"eval/m/3": 0.5, "eval/m/add": 0.5}
    assert grouped_metrics("eval/m", [1.0], None) == {}
    with pytest.raises(ValueError, match="row 2 of e.jsonl has no 'task' value"):
        group_labels([{"task": "a"}, {"other": 1}], "task", source="e.jsonl")
    with pytest.raises(ValueError, match="row 1 of e.jsonl has 'task' 'two words'; group labels are 1-40"):
        group_labels([{"task": "two words"}], "task", source="e.jsonl")
    with pytest.raises(ValueError, match="'task' has 33 values in e.jsonl; at most 32 groups"):
        group_labels([{"task": f"t{index}"} for index in range(33)], "task", source="e.jsonl")
    assert group_labels([{"task": "ü.b-1+"}], "task", source="e.jsonl") == ["ü.b-1+"]


def test_loss_on_data_it_cannot_read_is_one_line(demo_dir, tmp_path, capsys):
    """QA: --metric loss printed a traceback for data exact_match names in one line (DataError)."""
    broken = tmp_path / "bad.jsonl"
    broken.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": \n')
    no_extension = tmp_path / "rows.txt"
    no_extension.write_text('{"prompt": "a", "completion": "b"}\n')
    for data, message in ((demo_dir / "data/preference.jsonl", "missing 'completion'"),
                          (broken, "line 2"), (no_extension, "cannot tell the format")):
        code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(data), "--metric", "loss")
        assert code == 2 and out == "" and message in err and "Traceback" not in err, err


def test_it_scores_a_quantized_serving_copy_as_the_chat_serves_it(demo_dir, tmp_path, capsys):
    """QA: eval --model on a run's export/quantized/ (which generate reads) said a tensor was missing and to
    check num_hidden_layers and tie_word_embeddings, as for a broken checkpoint."""
    import jax.numpy as jnp

    from jaxengine import evaluate
    from jaxengine.quantize import QuantScheme, export_quantized
    from jaxengine.serving import load_serving_model

    copy = tmp_path / "quantized"
    export_quantized(demo_dir / "model", copy, scheme=QuantScheme.named("int8"))
    served = load_serving_model(copy, compute_dtype=jnp.float32)
    rows = [json.loads(line) for line in (demo_dir / "data/eval.jsonl").read_text().splitlines()][:4]
    for metric in ("loss", "exact_match"):
        code, out, err = eval_cli(capsys, "--model", str(copy), "--data", str(demo_dir / "data/eval.jsonl"),
                                  "--metric", metric, "--limit", "4", "--max-new-tokens", "4")
        assert code == 0, err
        as_sft = [{"prompt": row["prompt"], "completion": row["answer"]} for row in rows]  # as the CLI reads them
        expected = (evaluate.mean_loss(served.model, served.tokenizer, as_sft, max_seq_len=512) if metric == "loss"
                    else evaluate.exact_match(served.model, served.tokenizer, rows, max_new_tokens=4))
        assert json.loads(out)["value"] == pytest.approx(expected["value"])


def test_loss_is_the_mean_completion_token_loss_transformers_gives(demo_dir, tmp_path, capsys):
    """--metric loss against the reference: transformers' logits for the same token ids, the negative log-prob of
    each trained token (the completions; a chat's assistant turns) averaged over all of them, whatever row holds
    them. 20 rows: a padded last batch of 16; one chat with two assistant turns."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from jaxengine.data import pipeline

    rows = [json.loads(line) for line in (demo_dir / "data/sft.jsonl").read_text().splitlines()[:19]]
    rows.append({"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"},
                              {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "6"}]})
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(data), "--metric", "loss")
    assert code == 0, err
    result = json.loads(out)

    examples, _ = pipeline.encode_rows(rows, task="sft", tokenizer=load_tokenizer(demo_dir / "model"), max_seq_len=512)
    reference = AutoModelForCausalLM.from_pretrained(demo_dir / "model", dtype=torch.float32).eval()
    losses = []
    for example in examples:
        with torch.no_grad():
            logits = reference(torch.tensor(example.ids[None].astype(np.int64))).logits[0].double()
        log_probs = torch.log_softmax(logits, dim=-1)
        losses += [-float(log_probs[i - 1, example.ids[i]]) for i in range(1, len(example.ids)) if example.loss_mask[i]]
    chat_mask = examples[-1].loss_mask.astype(int)
    assert np.sum(np.diff(chat_mask) == 1) == 2  # both assistant turns trained, the user turn between them not
    assert result["loss_tokens"] == len(losses) and result["count"] == 20
    assert result["value"] == pytest.approx(sum(losses) / len(losses), abs=1e-5)


@pytest.mark.parametrize(("content", "advice"), [
    ('{"prompt": "2 + 2?", "chosen": "4", "rejected": "5"}\n',
     "the fields of the preference kind: if the file holds preference rows, jaxengine eval does not score them"),
    ('[{"prompt": "2 + 2?", "answer": "4"},\n {"prompt": "3 + 3?", "answer": "6"}]\n',
     "not one JSON object per line: give the file the .json extension"),
], ids=["kind", "format"])
def test_data_errors_name_what_eval_can_set(demo_dir, tmp_path, capsys, content, advice):
    """Session-33 audit: eval's --data errors told the user to upload the file as a dataset of another kind, or to
    give --format, which eval does not have."""
    data = tmp_path / "rows.jsonl"
    data.write_text(content)
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(data), "--metric", "loss")
    assert code == 2 and out == "" and advice in err
    for elsewhere in ("upload", "--kind", "--format", "data.columns", " API"):
        assert elsewhere not in err


def test_data_errors_name_the_first_five_bad_rows(demo_dir, tmp_path, capsys):
    """Session-33 audit: eval named the first bad row of --data only."""
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "2 + 2?", "answer": "4"}\n' + '{"prompt": "", "answer": "4"}\n' * 7)
    code, out, err = eval_cli(capsys, "--model", str(demo_dir / "model"), "--data", str(data), "--metric",
                              "exact_match")
    assert code == 2 and out == ""
    assert (f"--data {data}: line 2, row 2, field 'prompt': is an empty string; give it text or drop the row; 6 more "
            "bad rows: line 3, row 3, field 'prompt': the same problem; line 4, row 4, field 'prompt': the same "
            "problem; line 5, row 5, field 'prompt': the same problem; line 6, row 6, field 'prompt': the same "
            "problem; and 2 more; exact_match needs") in err
