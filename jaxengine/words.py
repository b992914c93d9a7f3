"""Counts in messages: "1 row", "2 rows", never "1 rows"; "step 3", "steps 3, 7"; "an sft dataset", never "a sft". One helper for the engine's messages and the web
app's (which imports it, as it imports ``jaxengine.spec``: jax-free, no Django), where a count is built into
an f-string; templates say the same with Django's ``pluralize`` filter."""
from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None, *, grouped: bool = False) -> str:
    """``count`` and ``noun``, the noun in the plural unless the count is 1 (``plural``, else ``noun`` + "s");
    ``grouped``: thousands separated by commas (12,000 rows)."""
    shown = f"{count:,}" if grouped else str(count)
    return f"{shown} {noun if count == 1 else plural or noun + 's'}"


def named(noun: str, items: list, plural: str | None = None) -> str:
    """``noun`` followed by ``items``, the noun in the plural unless there is one: "step 3", "steps 3, 7"."""
    return f"{noun if len(items) == 1 else plural or noun + 's'} {', '.join(str(item) for item in items)}"


# Said letter by letter, so the article goes by the first letter's name: "an sft run", "a dpo run".
INITIALISMS = frozenset({"dpo", "grpo", "ppo", "sft"})
VOWEL_NAMED_LETTERS = "aefhilmnorsx"  # a, e, ef, aitch, i, el, em, en, o, ar, ess, ex


def with_article(word: str) -> str:
    """``word`` after "a" or "an", as it is said: "an sft", "a dpo", "a preference", "an eval"."""
    first = word[:1].lower()
    vowel = first in VOWEL_NAMED_LETTERS if word.lower() in INITIALISMS else first in "aeiou"
    return f"{'an' if vowel else 'a'} {word}"
