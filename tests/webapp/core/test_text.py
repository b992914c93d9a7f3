"""The shared checks of text people send: NUL characters and lengths, by field."""
import pytest
from django.core.exceptions import ValidationError

from webapp.core.text import checked_json, checked_name, checked_text


def test_it_passes_text_that_fits():
    assert checked_text("héllo", field="name", max_length=5) == "héllo"
    assert checked_json({"a": ["b", {"c": 1}]}, field="config") == {"a": ["b", {"c": 1}]}


def test_it_rejects_a_nul_naming_its_position():
    with pytest.raises(ValidationError) as refused:
        checked_text("ab\x00", field="name")
    assert refused.value.message_dict == {"name": ["a NUL character (\\x00) at position 3; remove it: "
                                                   "text here cannot hold one"]}


def test_it_rejects_text_past_its_length():
    with pytest.raises(ValidationError) as refused:
        checked_text("x" * 101, field="name", max_length=100)
    assert refused.value.message_dict == {"name": ["101 characters; at most 100"]}


def test_it_names_the_key_of_json_that_holds_a_nul():
    for value, field in (({"a": [1, {"b": "x\x00"}]}, "config.a.1.b"), ({"k\x00": 1}, "config"), ("\x00", "config")):
        with pytest.raises(ValidationError) as refused:
            checked_json(value, field="config")
        assert list(refused.value.message_dict) == [field]


def test_a_name_holding_an_invisible_character_is_refused_saying_which_and_where():
    """'qa3-sft' + U+200B was a second dataset beside 'qa3-sft' that no one could tell from it."""
    for character, name in (("\u200b", "ZERO WIDTH SPACE"), ("\u200d", "ZERO WIDTH JOINER"),
                            ("\ufeff", "ZERO WIDTH NO-BREAK SPACE"), ("\u202e", "RIGHT-TO-LEFT OVERRIDE")):
        with pytest.raises(ValidationError) as refused:
            checked_name(f"qa3-sft{character}x", field="name", max_length=100)
        assert refused.value.message_dict == {"name": [
            f"an invisible character, U+{ord(character):04X} ({name}), at position 8: remove it (it makes names "
            "that look alike but differ)"]}


def test_a_name_is_stripped_and_composed():
    assert checked_name("  cafe\u0301 ", field="name", max_length=100) == "café"
    with pytest.raises(ValidationError, match="101 characters; at most 100"):
        checked_name("x" * 101, field="name", max_length=100)
