"""Reward functions on edge cases: no answer, Unicode digits, empty completions, signs, commas; the combinator's errors."""
import math

import numpy as np
import pytest

from jaxengine import rewards
from jaxengine.rewards import RewardError, WeightedReward, extract_answer, reference_answer, score_rewards
from tests.factories import on_a_thread

REF = [{"answer": "42"}]


@pytest.mark.parametrize(("text", "extract", "expected"), [
    ("so 3 + 4 = 7", "last_number", "7"),
    ("the total is 1,234,567 apples", "last_number", "1,234,567"),
    ("list: 1, 2, 3", "last_number", "3"),
    ("it is -12.5 degrees", "last_number", "-12.5"),
    ("from 3-5", "last_number", "5"),  # a hyphen glued to a digit is not a sign
    ("it is \u221212", "last_number", "\u221212"),  # typographic minus
    ("\u0664\u0662 in Arabic-Indic", "last_number", "\u0664\u0662"),
    ("no digits here", "last_number", None),
    ("", "last_number", None),
    ("Reasoning.\nAnswer: Paris\nmore", "answer_line", "Paris"),
    ("answer： 7", "answer_line", "7"),  # full-width colon
    ("Answer:   ", "answer_line", None),
    ("x \\boxed{\\frac{1}{2}} and \\boxed{3}", "boxed", "3"),
    ("\\boxed{\\frac{1}{2}}", "boxed", "\\frac{1}{2}"),
    ("\\boxed{unclosed", "boxed", None),
    ("  spaced  ", "full", "spaced"),
    ("   ", "full", None),
])
def test_extract_answer(text, extract, expected):
    assert extract_answer(text, extract=extract) == expected


def test_extract_regex_takes_the_group_of_the_last_match():
    assert extract_answer("<a>1</a><a>2</a>", extract="regex", pattern=r"<a>(\d)</a>") == "2"
    assert extract_answer("none", extract="regex", pattern=r"<a>(\d)</a>") is None


@pytest.mark.parametrize(("text", "expected"), [
    ("1,234", 1234.0), ("-7", -7.0), ("\u22127", -7.0), ("+3.5", 3.5), ("\uff11\uff12", 12.0),
    ("\u0664\u0662", 42.0), ("abc", None), ("", None), (None, None), ("inf", None),
])
def test_parse_number(text, expected):
    assert rewards.parse_number(text) == expected


def test_exact_match_normalises_numbers_and_whitespace():
    completions = ["42", " 42 ", "42.0", "4 2", "", "the answer is 42", "\uff14\uff12"]
    assert rewards.exact_match(completions, REF * 7) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert rewards.exact_match(["the answer is 42", "it is 43"], REF * 2, extract="last_number") == [1.0, 0.0]
    assert rewards.exact_match(["1,000"], [{"answer": "1000"}], extract="last_number") == [1.0]
    assert rewards.exact_match(["x = -5"], [{"answer": "-5"}], extract="last_number") == [1.0]
    assert rewards.exact_match(["Answer: PARIS"], [{"a": "Paris"}], answer_column="a", extract="answer_line",
                               case_sensitive=False) == [1.0]
    assert rewards.exact_match(["Answer: PARIS"], [{"a": "Paris"}], answer_column="a",
                               extract="answer_line") == [0.0]


def test_exact_match_missing_reference_column_is_an_error():
    with pytest.raises(KeyError, match="sample 0 has no reference column 'answer'"):
        rewards.exact_match(["42"], [{"solution": "42"}])


def test_a_null_reference_is_a_missing_one_not_the_text_none():
    """QA: a prompts row with "answer": null kept it, and the reward compared completions with the text "None"
    (a completion saying "None" scored 1.0); the launch checks only the first rows for a missing answer."""
    for reward in (rewards.exact_match, rewards.numeric_match):
        with pytest.raises(KeyError, match="sample 1: reference column 'answer' is null; give the row its answer"):
            reward(["4", "None"], [{"answer": "4"}, {"answer": None}])


def test_exact_match_refuses_an_empty_reference():
    """QA: a blank reference answer silently scored every completion 0 (no answer can equal it), so the rows
    gave no signal; it is an error, which ``unscorable_reference`` finds before the run starts."""
    for blank in ("", "  \n"):
        with pytest.raises(ValueError) as raised:
            rewards.exact_match(["", "42"], [{"answer": "42"}, {"answer": blank}])
        assert str(raised.value) == f"sample 1: reference answer={blank!r} is empty, so no completion can match it"
    rows = [{"prompt": "a", "answer": "4"}, {"prompt": "b", "answer": ""}]
    assert rewards.unscorable_reference([WeightedReward(name="exact_match")], rows) == (
        "exact_match", 2, "reference answer='' is empty, so no completion can match it")


def test_numeric_closeness_by_hand_and_on_edge_cases():
    refs = [{"answer": "67"}] * 6
    scores = rewards.numeric_closeness(["67", "57", "it is 77", "none", "", "\u0666\u0667"], refs)
    np.testing.assert_allclose(scores, [1.0, math.exp(-1.0), math.exp(-1.0), 0.0, 0.0, 1.0], atol=1e-12)
    assert rewards.numeric_closeness(["77"], [{"answer": "67"}], scale=5.0) == [pytest.approx(math.exp(-2.0))]
    # extract full: a number with words around it is no answer
    assert rewards.numeric_closeness(["it is 67"], [{"answer": "67"}], extract="full") == [0.0]
    with pytest.raises(ValueError, match="reference answer='SHEEP' is not a number"):
        rewards.numeric_closeness(["1"], [{"answer": "SHEEP"}])
    assert rewards.numeric_closeness(["1"], [{"answer": "SHEEP"}], non_numeric_reference="zero") == [0.0]
    with pytest.raises(ValueError, match="scale must be > 0"):
        rewards.numeric_closeness(["1"], [{"answer": "1"}], scale=0.0)


def test_numeric_match_tolerances():
    refs = [{"answer": "0.5"}] * 4
    assert rewards.numeric_match(["0.5", "0.50000001", "0.51", "none"], refs) == [1.0, 1.0, 0.0, 0.0]
    assert rewards.numeric_match(["1,011"], [{"answer": "1000"}], tolerance=0.01, relative=True) == [0.0]
    assert rewards.numeric_match(["1,010"], [{"answer": "1000"}], tolerance=0.01, relative=True) == [1.0]
    assert rewards.numeric_match(["it is \u22123"], [{"answer": "-3"}]) == [1.0]
    with pytest.raises(ValueError, match="not a number"):
        rewards.numeric_match(["3"], [{"answer": "three"}])


def test_format_regex():
    assert rewards.format_regex(["Answer: 5", "5", "", "x\nAnswer: y"], [{}] * 4, pattern="Answer: .+") == [
        1.0, 0.0, 0.0, 1.0]
    assert rewards.format_regex(["<t>a</t>", "<t>a</t> extra"], [{}] * 2, pattern=r"<t>.*</t>",
                                full_match=True) == [1.0, 0.0]


def test_length_rewards():
    texts = ["", "abcd", "abcdefgh", "ab\u00e9\u00e9"]  # Unicode characters count once each
    assert rewards.length_penalty(texts, [{}] * 4, max_length=4) == [0.0, 0.0, -1.0, 0.0]
    assert rewards.length_target(texts, [{}] * 4, target=4) == [0.0, 1.0, 0.0, 1.0]
    assert rewards.length_target(["a b c", "a"], [{}] * 2, target=2, unit="words") == [0.5, 0.5]


def test_valid_json():
    texts = ['{"a": 1}', "[1, 2]", "```json\n{\"a\": 1}\n```", "{a: 1}", "", "null"]
    assert rewards.valid_json(texts, [{}] * 6) == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert rewards.valid_json(texts, [{}] * 6, require_object=True) == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]


def test_contains_and_excludes():
    texts = ["Paris is in France", "paris", "", "Zürich"]
    assert rewards.contains(texts, [{}] * 4, keywords=["paris", "france"]) == [1.0, 0.0, 0.0, 0.0]
    assert rewards.contains(texts, [{}] * 4, keywords=["paris", "france"], mode="any") == [1.0, 1.0, 0.0, 0.0]
    assert rewards.contains(texts, [{}] * 4, keywords=["paris", "france"], mode="fraction") == [1.0, 0.5, 0.0, 0.0]
    assert rewards.contains(texts, [{}] * 4, keywords=["Paris"], case_sensitive=True) == [1.0, 0.0, 0.0, 0.0]
    assert rewards.contains(texts, [{}] * 4, keywords=["zürich"]) == [0.0, 0.0, 0.0, 1.0]
    assert rewards.excludes(texts, [{}] * 4, keywords=["france", "ZÜRICH"]) == [0.0, 1.0, 1.0, 0.0]


def test_reference_answer_is_the_column_the_reward_reads():
    row = {"prompt": "p", "answer": "42", "solution": 7}
    length_then_match = [WeightedReward(name="length_penalty", args={"max_length": 10}),
                         WeightedReward(name="numeric_match", args={"answer_column": "solution"})]
    assert reference_answer(length_then_match, row) == "7"  # the first term with an answer column
    assert reference_answer([WeightedReward(name="exact_match")], row) == "42"  # its default column
    assert reference_answer([WeightedReward(name="contains", args={"keywords": ["x"]})], row) == "42"
    assert reference_answer([WeightedReward(name="exact_match", args={"answer_column": "gold"})], row) is None
    assert reference_answer([WeightedReward(name="exact_match")], {"prompt": "p", "answer": None}) is None


def test_score_rewards_weights_and_keys():
    terms = [WeightedReward(name="exact_match", weight=1.0, args={"extract": "last_number"}),
             WeightedReward(name="format_regex", weight=0.2, args={"pattern": "Answer: .+"})]
    totals, by_key = score_rewards(terms, ["Answer: 42", "42", "Answer: 1"], REF * 3)
    assert by_key == {"exact_match": [1.0, 1.0, 0.0], "format_regex": [1.0, 0.0, 1.0]}
    assert totals == pytest.approx([1.2, 1.0, 0.2], abs=1e-12)


def test_a_raising_reward_names_the_function_and_the_sample():
    refs = [{"answer": "1"}, {"answer": "x"}, {"answer": "3"}]
    with pytest.raises(RewardError, match=r"reward 'numeric_match' failed on sample 1 .*: ValueError: sample 1: "
                                          r"reference answer='x' is not a number"):
        score_rewards([WeightedReward(name="numeric_match")], ["1", "2", "3"], refs)


def test_a_non_finite_or_miscounted_reward_is_an_error(monkeypatch):
    monkeypatch.setitem(rewards.REWARDS, "broken", lambda completions, references: [1.0, math.nan])
    with pytest.raises(RewardError, match="'broken' returned nan for sample 1"):
        score_rewards([WeightedReward(name="broken")], ["a", "b"], [{}, {}])
    monkeypatch.setitem(rewards.REWARDS, "short", lambda completions, references: [1.0])
    with pytest.raises(RewardError, match="returned 1 score for 2 completions"):
        score_rewards([WeightedReward(name="short")], ["a", "b"], [{}, {}])


def test_check_args_names_unknown_and_missing_args():
    rewards.check_args("exact_match", {"answer_column": "answer", "extract": "boxed"})
    with pytest.raises(rewards.RewardArgumentError, match="unknown argument colum; allowed: answer_column") as error:
        rewards.check_args("exact_match", {"colum": "answer"})
    assert error.value.argument == "colum"
    with pytest.raises(rewards.RewardArgumentError, match=r"required argument missing: pattern \(a text\)") as error:
        rewards.check_args("format_regex", {})
    assert error.value.argument == "pattern"
    with pytest.raises(ValueError, match="'exactmatch' is not a reward function"):
        rewards.check_args("exactmatch", {})


@pytest.mark.parametrize(("name", "args", "argument", "message"), [
    ("length_penalty", {"max_length": "long"}, "max_length", "max_length must be a whole number, got 'long'"),
    ("length_penalty", {"max_length": True}, "max_length", "max_length must be a whole number, got True"),
    ("length_penalty", {"max_length": 4, "unit": "lines"}, "unit", "unit must be one of chars, words, got 'lines'"),
    ("numeric_match", {"tolerance": "small"}, "tolerance", "tolerance must be a number, got 'small'"),
    ("format_regex", {"pattern": "x", "full_match": "yes"}, "full_match", "full_match must be true or false, got 'yes'"),
    ("contains", {"keywords": "four"}, "keywords", "keywords must be a list of texts, got 'four'"),
    ("exact_match", {"pattern": None, "group": None}, "group", "group must be a whole number, got None"),
    # QA: NaN and infinity passed as numbers: a NaN tolerance scored every completion 0, an infinite scale 1.
    ("numeric_match", {"tolerance": math.nan}, "tolerance", "tolerance must be a finite number, got nan"),
    ("numeric_closeness", {"scale": math.inf}, "scale", "scale must be a finite number, got inf"),
])
def test_check_args_names_an_argument_of_the_wrong_kind_and_what_it_takes(name, args, argument, message):
    with pytest.raises(rewards.RewardArgumentError) as error:
        rewards.check_args(name, args)
    assert (error.value.argument, str(error.value)) == (argument, message)


@pytest.mark.parametrize(("name", "args", "argument", "message"), [
    ("length_penalty", {"max_length": 0}, "max_length", "max_length must be positive, got 0"),
    ("length_target", {"target": -1}, "target", "target must be positive, got -1"),
    ("numeric_closeness", {"scale": 0.0}, "scale", "scale must be > 0, got 0.0"),
    ("contains", {"keywords": []}, "keywords", "keywords must name at least one keyword"),
    ("excludes", {"keywords": []}, "keywords", "keywords must name at least one keyword"),
    ("format_regex", {"pattern": "("}, "pattern",
     "pattern '(' is not a regular expression (missing ), unterminated subpattern at position 0)"),
    # Checked before any completion is read: scoring nothing (as the spec check does) finds them too.
    ("exact_match", {"extract": "regex"}, "pattern", "extract 'regex' needs a pattern (a regular expression)"),
    ("numeric_match", {"extract": "regex", "pattern": "[0-9"}, "pattern",
     "pattern '[0-9' is not a regular expression (unterminated character set at position 0)"),
    # QA: a group the pattern does not have passed the spec and failed the run at the first completion
    # the pattern matched ("IndexError: no such group"), however many steps in.
    ("exact_match", {"extract": "regex", "pattern": r"\d+"}, "group",
     r"group 1: pattern '\\d+' has no group (parentheses); give group 0 for the whole match, or put the answer "
     "in parentheses"),
    ("numeric_match", {"extract": "regex", "pattern": r"(\d+) (\d+)", "group": 3}, "group",
     r"group 3: pattern '(\\d+) (\\d+)' has 2 groups; give a group from 0 (the whole match) to 2"),
    ("numeric_closeness", {"extract": "regex", "pattern": r"(\d+)", "group": -1}, "group",
     r"group -1: pattern '(\\d+)' has 1 group; give a group from 0 (the whole match) to 1"),
    # QA: a pattern without extract: regex was silently ignored (the whole text, or the last number, was read).
    ("exact_match", {"pattern": r"(\d+)"}, "pattern",
     "pattern is read only with extract: regex (extract is 'full'); set extract to regex, or remove pattern"),
    ("numeric_match", {"pattern": r"(\d+)", "extract": "last_number"}, "pattern",
     "pattern is read only with extract: regex (extract is 'last_number'); set extract to regex, or remove pattern"),
    # QA: reward_model's batch_size and max_seq_len of 0 passed the spec check and failed the first scoring.
    ("reward_model", {"model": "runs/r", "batch_size": 0}, "batch_size", "batch_size must be at least 1, got 0"),
    ("reward_model", {"model": "runs/r", "max_seq_len": 0}, "max_seq_len", "max_seq_len must be at least 1, got 0"),
    # QA: a negative tolerance scored every completion 0, so the run stopped on frac_reward_zero_std.
    ("numeric_match", {"tolerance": -0.5}, "tolerance", "tolerance must be 0 or more, got -0.5"),
    # QA: an empty keyword is in every completion: contains scored all 1 and excludes all 0.
    ("contains", {"keywords": ["Answer", ""]}, "keywords",
     "keywords must not hold an empty keyword (one occurs in every completion); remove it"),
    ("excludes", {"keywords": [" "]}, "keywords",
     "keywords must not hold an empty keyword (one occurs in every completion); remove it"),
])
def test_a_function_rejecting_an_argument_value_names_the_argument(name, args, argument, message):
    with pytest.raises(rewards.RewardArgumentError) as error:
        rewards.REWARDS[name]([], [], **args)
    assert (error.value.argument, str(error.value)) == (argument, message)


def test_the_catalog_describes_every_function_and_its_arguments_from_the_signature():
    catalog = {entry.name: entry for entry in rewards.reward_catalog()}
    assert set(catalog) == set(rewards.REWARDS)
    format_regex = {argument.name: argument for argument in catalog["format_regex"].arguments}
    assert format_regex["pattern"] == rewards.RewardArgument(name="pattern", kind="text", required=True)
    assert format_regex["full_match"] == rewards.RewardArgument(name="full_match", kind="boolean", required=False,
                                                                default=False)
    exact = {argument.name: argument for argument in catalog["exact_match"].arguments}
    assert exact["extract"].kind == "choice" and exact["extract"].choices == rewards.EXTRACTIONS
    assert exact["extract"].default == "full" and exact["pattern"].nullable and exact["group"].kind == "integer"
    assert [argument.kind for argument in catalog["contains"].arguments] == ["text_list", "choice", "boolean"]
    assert catalog["numeric_match"].arguments[4].kind == "number"
    assert catalog["excludes"].summary == "1.0 when none of ``keywords`` occurs, else 0.0."


def test_the_readme_table_names_every_reward_function_and_its_arguments():
    import inspect
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    table = readme.split("| name | args (default) | score |\n", 1)[1].split("\n\n", 1)[0]
    rows = {match[1]: match[2] for match in re.finditer(r"^\| `(\w+)` \| (.*?) \|", table, flags=re.MULTILINE)}
    assert sorted(rows) == sorted(rewards.REWARDS)
    for name, function in rewards.REWARDS.items():
        arguments = [parameter.name for parameter in inspect.signature(function).parameters.values()
                     if parameter.kind == parameter.KEYWORD_ONLY]
        assert [argument for argument in arguments if f"`{argument}`" not in rows[name]] == [], name


def test_a_reference_a_reward_cannot_score_is_found_before_any_completion():
    """QA: numeric_match on data whose reference is no number failed the run at the first step (data.train)
    or the first evaluation (data.eval, possibly hours in); ``unscorable_reference`` finds the row first."""
    rows = [{"prompt": "a", "answer": "4"}, {"prompt": "b", "answer": "four"}]
    numeric = WeightedReward(name="numeric_match")
    assert rewards.unscorable_reference([WeightedReward(name="exact_match"), numeric], rows) == (
        "numeric_match", 2, "reference answer='four' is not a number")
    assert rewards.unscorable_reference([numeric], rows[:1]) is None
    closeness = WeightedReward(name="numeric_closeness", args={"non_numeric_reference": "zero"})
    assert rewards.unscorable_reference([closeness], rows) is None
    # A reward model scores with a model: it is not run here.
    assert rewards.unscorable_reference([WeightedReward(name="reward_model", args={"model": "/nowhere"})], rows) is None


def test_a_reward_that_takes_too_long_fails_naming_the_function(monkeypatch):
    """QA: a format_regex pattern with nested repetition takes time exponential in a completion's length
    (40 characters: hours), and the run hung at its first rollout's scoring, never reaching a cancel check."""
    monkeypatch.setattr(rewards, "REWARD_TIME_LIMIT_SECONDS", 0.5)
    term = WeightedReward(name="format_regex", args={"pattern": r"^(\w+\s?)*$"})
    with pytest.raises(RewardError) as raised:
        score_rewards([term], ["ok", "ab" * 20 + "!"], [{}, {}])
    assert str(raised.value) == (
        "reward 'format_regex' took more than 0.5 s to score 2 completions; a regular expression with nested "
        "repetition, such as (\\w+\\s?)*, takes time exponential in a completion's length: simplify its pattern")
    # The timer is gone afterwards: quick scoring still works.
    assert score_rewards([WeightedReward(name="format_regex", args={"pattern": "ok"})], ["ok"], [{}])[0] == [1.0]


def test_the_time_limit_holds_off_the_main_thread(monkeypatch, caplog):
    """QA: the limit was a SIGALRM timer, which only the main thread gets: a trainer called from another thread
    (a Celery thread pool, a test) had none, and a run hung in a reward's regular expression for hours."""
    monkeypatch.setattr(rewards, "REWARD_TIME_LIMIT_SECONDS", 0.5)
    slow = WeightedReward(name="format_regex", args={"pattern": r"^(\w+\s?)*$"})
    with caplog.at_level("WARNING", logger="jaxengine.rewards"):
        outcome = on_a_thread(lambda: score_rewards([slow], ["ok", "ab" * 20 + "!"], [{}, {}]))
    assert str(outcome["error"]) == (
        "reward 'format_regex' took more than 0.5 s to score 2 completions; a regular expression with nested "
        "repetition, such as (\\w+\\s?)*, takes time exponential in a completion's length: simplify its pattern")
    assert [record.getMessage() for record in caplog.records] == [
        "reward functions are scored off the main thread (trainer-thread), where a SIGALRM timer cannot stop them: "
        "each is scored in a helper process instead, killed after 0.5 s"]
    # Off the main thread a term scores as on it, and a failing one is named alike.
    terms = [WeightedReward(name="format_regex", args={"pattern": "ok"}), WeightedReward(name="numeric_match")]
    rows = [{"answer": "4"}, {"answer": "4"}]
    assert on_a_thread(lambda: score_rewards(terms, ["ok", "4"], rows)) == {
        "value": score_rewards(terms, ["ok", "4"], rows)}
    broken = [{"answer": "4"}, {"answer": "four"}]
    with pytest.raises(RewardError) as on_main:
        score_rewards(terms, ["ok", "4"], broken)
    assert str(on_a_thread(lambda: score_rewards(terms, ["ok", "4"], broken))["error"]) == str(on_main.value)


def test_a_reward_that_cannot_reach_a_helper_process_is_refused_off_the_main_thread(monkeypatch):
    """A function that cannot be pickled (defined inside a function) cannot be sent to the helper process that
    holds the time limit off the main thread, and was scored in place with no limit at all: a slow one hung the
    run, as the limit exists to prevent. Off the main thread it is refused, naming it; on it the timer holds."""
    monkeypatch.setattr(rewards, "REWARD_TIME_LIMIT_SECONDS", 0.5)

    def local_length(completions, references):
        return [float(len(text)) for text in completions]

    monkeypatch.setitem(rewards.REWARDS, "local_length", local_length)
    term = WeightedReward(name="local_length")
    outcome = on_a_thread(lambda: score_rewards([term], ["ab", "abc"], [{}, {}]))
    assert isinstance(outcome.get("error"), RewardError), outcome
    assert str(outcome["error"]) == (
        "reward 'local_length': its function (test_a_reward_that_cannot_reach_a_helper_process_is_refused_off_the_"
        "main_thread.<locals>.local_length) cannot be scored within its 0.5 s time limit off the main thread "
        "(trainer-thread): there the limit scores it in a helper process, and the function cannot be sent to one; "
        "define it at the top level of a module, or run the trainer on the main thread")
    assert score_rewards([term], ["ab", "abc"], [{}, {}])[0] == [2.0, 3.0]  # on the main thread: its timer
    # What a job checks when it starts (before its model loads), in the same words.
    assert on_a_thread(lambda: rewards.unsendable_reward([WeightedReward(name="exact_match"), term])) == {
        "value": (1, str(outcome["error"]))}
    assert rewards.unsendable_reward([term]) is None
