"""Server time of ``BidiBalanceMiddleware`` (``webapp/core/bidi.py``) on a large page.

Builds a page like a long table of runs (``--rows`` rows of about 20 tags each, a script and a
textarea, about 700 kB at the default) in three versions: clean (no bidi control: the bytes fast
path), one hostile name among clean rows, and hostile (every row's name holds an RLO, a stray PDI
and an LRI left open, in the text and in a title attribute). Each is passed through the middleware
``--repeats`` times as an ``HttpResponse``; prints the median and best milliseconds per page.

    .venv/bin/python bench/bidi_balance.py [--rows 2000] [--repeats 30]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RLO, LRI, PDI = "\u202e", "\u2066", "\u2069"
HOSTILE = f"evil{PDI}{RLO}name{LRI}"


def page(*, rows: int, hostile_rows: set[int], hostile_extras: bool = False) -> str:
    """The table page; ``hostile_extras``: its textarea, comment and script hold controls too."""
    extra = HOSTILE if hostile_extras else "notes"
    body = []
    for index in range(rows):
        name = HOSTILE if index in hostile_rows else f"run-{index}"
        body.append(
            f'<tr class="row"><td><input type="checkbox" name="runs" value="r_{index:08d}" aria-label="{name}"></td>'
            f'<td><a href="/p/bench/runs/r_{index:08d}/" title="{name}">{name}</a> <span class="run-id">'
            f'r_{index:08d}</span></td><td><span class="badge status-succeeded">succeeded</span></td>'
            f'<td>sft</td><td class="num">{index * 7}</td><td><span class="tag">{name}</span></td></tr>\n')
    return ("<!doctype html><html><head><title>Runs · Bench · Temper</title></head><body>\n"
            '<table class="table"><tbody>\n' + "".join(body) + "</tbody></table>\n"
            f'<textarea name="notes">{extra}</textarea><!-- {extra} -->\n'
            f'<script>var names = ["{extra}", "a < b"];</script>\n</body></html>\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from django.conf import settings

    settings.configure(DEFAULT_CHARSET="utf-8")
    from django.http import HttpResponse
    from django.test import RequestFactory

    from webapp.core.bidi import BidiBalanceMiddleware

    request = RequestFactory().get("/page/")
    pages = {"clean": page(rows=args.rows, hostile_rows=set()),
             "one hostile name": page(rows=args.rows, hostile_rows={args.rows // 2}),
             "hostile (every row)": page(rows=args.rows, hostile_rows=set(range(args.rows)), hostile_extras=True)}
    print(f"{'page':<22}{'KiB':>6}{'median ms':>11}{'best ms':>9}")
    for label, html in pages.items():
        body = html.encode()
        times = []
        middleware = BidiBalanceMiddleware(lambda request: None)
        for _ in range(args.repeats):
            response = HttpResponse(body, content_type="text/html; charset=utf-8")
            start = time.perf_counter()
            middleware.process_response(request, response)
            times.append((time.perf_counter() - start) * 1000)
        print(f"{label:<22}{len(body) // 1024:>6}{statistics.median(times):>11.2f}{min(times):>9.2f}")


if __name__ == "__main__":
    main()
