"""Timing for the micro-benchmarks: one function called again and again, each call's wall seconds."""
from __future__ import annotations

import time
from collections.abc import Callable


def timed(function: Callable[[], object], repeats: int, *, expected: type[BaseException] | None = None
          ) -> list[float]:
    """The wall seconds of ``repeats`` calls of ``function``, in order; an ``expected`` exception (a refusal that
    is the very thing measured) ends a call as a return would."""
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        try:
            function()
        except BaseException as error:
            if expected is None or not isinstance(error, expected):
                raise
        seconds.append(time.perf_counter() - started)
    return seconds
