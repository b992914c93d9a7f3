"""CSV cells safe to open in a spreadsheet. Excel, LibreOffice and Google Sheets run a cell that starts
with ``=``, ``+``, ``-`` or ``@`` (or a tab or carriage return before one) as a formula, so a run or metric
named ``=HYPERLINK(…)`` would act when the export is opened. OWASP's advice: start such a text cell with a
single quote, which the spreadsheet shows as text. Numbers are written as numbers (a negative value
is not text a person chose)."""
from __future__ import annotations

from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_cell(value: Any) -> Any:
    """``value`` as a CSV cell: a string that a spreadsheet would read as a formula gets a leading ``'``."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
