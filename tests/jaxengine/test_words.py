"""jaxengine.words: a count and its noun, for messages built in f-strings."""
from __future__ import annotations

from jaxengine.words import counted, named, with_article


def test_the_noun_is_plural_unless_the_count_is_one():
    assert [counted(count, "row") for count in (0, 1, 2)] == ["0 rows", "1 row", "2 rows"]
    assert counted(1, "is", "are") == "1 is" and counted(3, "is", "are") == "3 are"
    assert counted(12000, "token", grouped=True) == "12,000 tokens" and counted(1, "token", grouped=True) == "1 token"


def test_a_noun_naming_items_is_plural_unless_there_is_one():
    assert named("step", [7]) == "step 7" and named("step", [3, 7]) == "steps 3, 7"


def test_the_article_goes_by_the_words_sound():
    """Messages said "is a sft dataset": a task's or kind's initialism takes the article of its first letter's name."""
    assert [with_article(word) for word in ("sft", "dpo", "grpo", "ppo", "SFT")] == [
        "an sft", "a dpo", "a grpo", "a ppo", "an SFT"]
    assert [with_article(word) for word in ("preference", "text", "prompts", "reward", "eval", "owner")] == [
        "a preference", "a text", "a prompts", "a reward", "an eval", "an owner"]
