"""The review form as a browser sends it."""
from webapp.review.forms import ReviewForm


def test_a_comment_as_long_as_its_box_allows_is_taken_with_its_line_breaks_as_typed():
    # The box lets 5,000 characters be typed, a line break counting one; the browser sends each as CR LF.
    typed = "ab\n" * 1666 + "ab"
    assert len(typed) == 5000
    form = ReviewForm(data={"item": "it_1", "choice": "first", "comment": typed.replace("\n", "\r\n")})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["comment"] == typed


def test_a_comment_longer_than_its_box_is_refused_naming_the_limit():
    form = ReviewForm(data={"item": "it_1", "choice": "first", "comment": "a" * 5001})
    assert not form.is_valid()
    assert "at most 5000 characters" in form.errors["comment"][0]
