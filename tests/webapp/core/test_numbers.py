import pytest

from webapp.core.numbers import MAX_STORED_INT, whole_number


@pytest.mark.parametrize("text, expected", [("0", 0), ("42", 42), (str(2**31 - 1), 2**31 - 1), (str(2**31), None),
                                            ("²", None), ("٣", None), ("-1", None), ("1.5", None), (" 3", None),
                                            ("3 ", None), ("+3", None), ("1_000", None), ("", None), (None, None)])
def test_whole_number(text, expected):
    assert whole_number(text) == expected


def test_whole_number_without_a_bound_and_with_another():
    assert whole_number("9" * 30, maximum=None) == int("9" * 30)
    assert whole_number("11", maximum=10) is None and MAX_STORED_INT == 2**31 - 1


def test_a_number_past_pythons_digit_limit_is_not_one():
    """int() refuses 5,000 digits with a ValueError: a resume or export form's 500 page."""
    assert whole_number("9" * 5000) is None and whole_number("9" * 5000, maximum=None) is None


@pytest.mark.parametrize("text, expected", [("-1", -1), ("7", 7), (f"-{2**31 - 1}", -(2**31 - 1)), (f"-{2**31}", None),
                                            ("--1", None), ("-", None), ("- 1", None), ("-٣", None), ("+1", None)])
def test_a_signed_whole_number(text, expected):
    assert whole_number(text, signed=True) == expected
