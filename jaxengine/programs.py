"""The compiled programs of a process, held by model structure, and dropped once no model of it is in use.

Design note. A jitted function keeps one compiled XLA program per shape and static argument it met, for as long as
the function lives, and each program maps memory regions of its own (3-40 on CPU): a process may map only
``vm.max_map_count`` (65,530 by default), and past it XLA's compiler segfaults (bench/RESULTS.md, "The compiler's
segfault", "The serve worker's compiled programs"). A module-level jit whose arguments carry a model's graph (an
``nnx.jit``, or ``jax.jit`` with the graph static) therefore grows by a model structure's programs for every
structure it meets, for the process's life: harmless in a train worker's child, which runs one job, not in the serve
worker, which serves and quantizes many models for days.

So the engine's programs that depend on a model's structure live in jitted functions held by an object per
structure (``serving._Compiled``, ``sampler._CompiledGenerate``, ``quantize._ScoringPrograms``), got from the one
``PROGRAMS`` store of the process by a key naming its kind and structure. Whoever stops using a structure's programs
``forget``s them: retired, they are kept among the few last retired (a user going back to a model just evicted finds
its programs; a warm-up is a minute of CPU), or dropped at once (a deleted model, a finished export). A dropped
holder is freed with its jitted functions and their programs once the last caller using it lets go (a holder and its
jitted methods form a reference cycle: Python's cycle collector frees them). The ``kept`` most recently asked for
stay held whatever is forgotten, as a bound on callers that never forget (a training process's samplers).
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from typing import TypeVar

Held = TypeVar("Held")


class ProgramsByStructure:
    """Holders of compiled programs by key (their kind and model structure): the ``kept`` most recently asked for
    in use, and the ``retired_kept`` last retired. Thread-safe."""

    def __init__(self, kept: int = 16, retired_kept: int = 2):
        self.kept = kept
        self.retired_kept = retired_kept
        self._in_use: collections.OrderedDict[Hashable, object] = collections.OrderedDict()
        self._retired: collections.OrderedDict[Hashable, object] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], Held]) -> Held:
        """The holder under ``key``: in use, or retired (then in use again), else ``make()``'s."""
        with self._lock:
            if key not in self._in_use:
                held = self._retired.pop(key, None)
                self._in_use[key] = held if held is not None else make()
            self._in_use.move_to_end(key)
            while len(self._in_use) > self.kept:
                self._in_use.popitem(last=False)
            return self._in_use[key]

    def forget(self, held: object, *, retire: bool = True) -> None:
        """Hold ``held`` no longer as in use: among the last retired (``retire``), else not at all; its programs go
        once neither this nor a caller holds it."""
        with self._lock:
            for key in [key for key, holder in self._in_use.items() if holder is held]:
                del self._in_use[key]
                if retire:
                    self._retired[key] = held
            for key in [key for key, holder in self._retired.items() if holder is held and not retire]:
                del self._retired[key]
            while len(self._retired) > self.retired_kept:
                self._retired.popitem(last=False)

    def drop_retired(self) -> int:
        """Drop every retired holder (a process near its limit on memory maps); returns how many."""
        with self._lock:
            dropped = len(self._retired)
            self._retired.clear()
            return dropped

    def held(self) -> list:
        """What is held, in use and retired."""
        with self._lock:
            return [*self._in_use.values(), *self._retired.values()]

    def clear(self) -> None:
        with self._lock:
            self._in_use.clear()
            self._retired.clear()


PROGRAMS = ProgramsByStructure()
