"""Many answers from one model through the serve worker's batching server, a slice at a time: the loop that review
campaigns' answers (``worker.tasks.review``) and evaluations' greedy completions (``worker.tasks.evals``) share.

Design note. Both generate on the ``serve`` queue through ``worker.tasks.serve.server_for``, so that a model the chat
serves is not loaded a second time beside it. The requests go in slices of the server's batch size and each slice is
awaited before the next is submitted: chats arriving meanwhile join the next batch instead of waiting behind the
whole job. After each slice the caller records its progress and says whether to go on (a cancel stops the worker at
the next slice, not after every row). Each slice has a deadline, so that one slice cannot hold the serve worker (and
the chats behind it) unboundedly; a cut answer would be read as whole, so it ends the job in words the caller writes.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence


class GenerationError(Exception):
    """An answer that cannot be had: its message names the model, the row and what to do."""


class GenerationStopped(Exception):
    """The caller said not to go on (its job was cancelled or deleted): the rest is not asked."""


def answers_in_slices(server, requests: Sequence, *, timeout: float, on_progress: Callable[[int], bool],
                      cut_answer: Callable[[int], str]) -> list[str]:
    """The text of the answer to each of ``requests`` (``jaxengine.serving.ServeRequest``, checked already), generated
    by ``server`` (a ``BatchingServer``) ``server.max_batch`` at a time, each slice's answers with a deadline
    ``timeout`` seconds after the slice's submission. ``on_progress`` is told the answers so far after each slice and
    says whether to go on (``GenerationStopped`` when not). An answer cut by its deadline raises ``GenerationError``
    with ``cut_answer(index)``, ``index`` that of its request."""
    answers: list[str] = []
    for start in range(0, len(requests), server.max_batch):
        deadline = time.monotonic() + timeout
        futures = [server.submit(dataclasses.replace(request, deadline=deadline))
                   for request in requests[start:start + server.max_batch]]
        results = [future.result() for future in futures]
        for index, result in enumerate(results, start):
            if result.finish_reason == "timeout":
                raise GenerationError(cut_answer(index))
        answers += [result.text for result in results]
        if not on_progress(len(answers)):
            raise GenerationStopped
    return answers
