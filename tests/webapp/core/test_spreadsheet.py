"""Cells a spreadsheet would read as a formula are written as text (OWASP's CSV injection advice)."""
import pytest

from webapp.core.spreadsheet import spreadsheet_cell


@pytest.mark.parametrize("text", ["=HYPERLINK(\"http://x\")", "+1", "-2+3", "@SUM(A1)", "\tx", "\rx"])
def test_a_cell_a_spreadsheet_would_run_starts_with_a_quote(text):
    assert spreadsheet_cell(text) == "'" + text


@pytest.mark.parametrize("value", ["loss", "eval/loss", "a=b", "", 3, -1.5, None])
def test_other_cells_are_written_as_they_are(value):
    assert spreadsheet_cell(value) == value
