"""Min/max step buckets: how long metric series are reduced before they are plotted.

Design note: a series longer than a chart can show is cut into buckets of ``width`` consecutive
steps, bucket ``(step - 1) // width``; each bucket keeps its first and last step, its lowest and
highest value with the step, token count and wall time of the point each was logged at (the low's
earliest step on a tie, the high's latest, so a bucket of one value spans its first step to its last),
and its smallest token count and wall time (a series' times count from its smallest). Spikes stay
visible at any zoom-out. A bucket is drawn as its two extremes at their own steps, in step order, so a
falling loss falls within each bucket too (drawing the low at the bucket's first step and the high at
its last, as before, drew every falling stretch rising), and each at its own tokens and time, so a
tokens or time x-axis is exact too.
Widths are powers of two. That makes the reduction mergeable: two neighbouring buckets of width
``w`` are exactly one bucket of width ``2w`` (min of the mins with its step, max of the maxes with
its step, ...), so

- the train worker can keep a running run's buckets up to date as points arrive (``add``) and
  store them on the run row, doubling the width (``coarsen``) as the run grows, and
- a page reads those stored buckets, coarsens them to its own resolution, and only has to reduce
  the points stored since (the tail), instead of every point of the run on every request.

This module is pure Python (no Django): the selectors and the reporter share it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

# One bucket: [first_step, last_step, low, high, tokens, wall_time, low_step, high_step,
#              low_tokens, low_wall_time, high_tokens, high_wall_time]
# (tokens, wall_time: the bucket's smallest; low_/high_: those of the extremes' own points).
Bucket = list
# Buckets stored before the extremes' steps were kept had six fields, and before the extremes' own
# tokens and times were kept eight: such stored buckets are not read (``SeriesBuckets.in_layout``).


def bucket_width(span: int, max_points: int) -> int:
    """The smallest power of two that cuts ``span`` steps into at most ``max_points // 2`` buckets
    (each bucket is drawn as two points, so a series has at most about ``max_points``)."""
    limit = max(1, max_points // 2)
    width = 1
    while -(-span // width) > limit:
        width *= 2
    return width


def merge_bucket(into: Bucket, other: Bucket) -> None:
    # Comparisons rather than min()/max() calls: pages merge thousands of buckets per request.
    if other[0] < into[0]:
        into[0] = other[0]
    if other[1] > into[1]:
        into[1] = other[1]
    if other[2] < into[2] or (other[2] == into[2] and other[6] < into[6]):
        into[2], into[6], into[8], into[9] = other[2], other[6], other[8], other[9]
    if other[3] > into[3] or (other[3] == into[3] and other[7] > into[7]):
        into[3], into[7], into[10], into[11] = other[3], other[7], other[10], other[11]
    if other[4] < into[4]:
        into[4] = other[4]
    if other[5] < into[5]:
        into[5] = other[5]


@dataclass
class SeriesBuckets:
    """Every metric's buckets of one run at one ``width``, covering the points of steps up to
    ``through_step`` (``buckets[name][index]``, index = (step - 1) // width), which are the run's
    stored points up to id ``through_id`` (0: unknown): the points stored since are those after it."""

    width: int = 1
    through_step: int = 0
    buckets: dict[str, dict[int, Bucket]] = field(default_factory=dict)
    through_id: int = 0

    # Written with the buckets (``to_json``), so that buckets stored in an older layout are known: read in
    # this one, they keep the older drawing (at the bucket's smallest tokens and time), and so does a
    # finished run's series cached from them. Those are read again from the points (``in_layout``).
    LAYOUT: ClassVar[int] = 12

    def add(self, name: str, step: int, value: float, tokens: int, wall_time: float) -> None:
        """Fold one point in (any order; a point of a step already covered is folded in as well).
        Called for every point the train worker stores, so it is written out flat."""
        index = (step - 1) // self.width
        by_index = self.buckets.get(name)
        if by_index is None:
            by_index = self.buckets[name] = {}
        entry = by_index.get(index)
        if entry is None:
            by_index[index] = [step, step, value, value, tokens, wall_time, step, step,
                               tokens, wall_time, tokens, wall_time]
        else:
            # first <= last, so a new point can extend only one end.
            if step < entry[0]:
                entry[0] = step
            elif step > entry[1]:
                entry[1] = step
            if value < entry[2] or (value == entry[2] and step < entry[6]):
                entry[2], entry[6], entry[8], entry[9] = value, step, tokens, wall_time
            if value > entry[3] or (value == entry[3] and step > entry[7]):
                entry[3], entry[7], entry[10], entry[11] = value, step, tokens, wall_time
            if tokens < entry[4]:
                entry[4] = tokens
            if wall_time < entry[5]:
                entry[5] = wall_time
        if step > self.through_step:
            self.through_step = step

    def add_bucket(self, name: str, width: int, index: int, bucket: Bucket) -> None:
        """Fold in a bucket of ``width`` (a multiple of this one's, e.g. from a grouped query)."""
        if width != self.width:
            raise ValueError(f"bucket of width {width} folded into buckets of width {self.width}")
        entry = self.buckets.setdefault(name, {}).get(index)
        if entry is None:
            self.buckets[name][index] = list(bucket)
        else:
            merge_bucket(entry, bucket)
        self.through_step = max(self.through_step, bucket[1])

    def coarsened(self, width: int) -> SeriesBuckets:
        """The same points in buckets of ``width`` (a power-of-two multiple of this width)."""
        if width < self.width or width % self.width:
            raise ValueError(f"buckets of width {self.width} cannot be regrouped to width {width}")
        if width == self.width:
            return SeriesBuckets(width=width, through_step=self.through_step, through_id=self.through_id,
                                 buckets={name: {index: list(bucket) for index, bucket in by_index.items()}
                                          for name, by_index in self.buckets.items()})
        factor = width // self.width
        result = SeriesBuckets(width=width, through_step=self.through_step, through_id=self.through_id)
        for name, by_index in self.buckets.items():
            merged: dict[int, Bucket] = {}
            for index, bucket in by_index.items():
                target = merged.get(index // factor)
                if target is None:
                    merged[index // factor] = list(bucket)
                else:
                    merge_bucket(target, bucket)
            result.buckets[name] = merged
        return result

    def fit(self, span: int, max_points: int) -> None:
        """Coarsen in place while ``span`` steps would need more than ``max_points // 2`` buckets."""
        width = bucket_width(span, max_points)
        if width > self.width:
            self.buckets = self.coarsened(width).buckets
            self.width = width

    def points(self) -> Iterable[tuple[str, int, float, int, float]]:
        """``(name, step, value, tokens, wall_time)`` rows, by name and step: two per bucket, its lowest
        and its highest value at the points they were logged (a bucket of one value: its first step and
        its last), one when both are the same point."""
        for name in sorted(self.buckets):
            by_index = self.buckets[name]
            for index in sorted(by_index):
                (_first, _last, low, high, _tokens, _wall_time, low_step, high_step,
                 low_tokens, low_wall_time, high_tokens, high_wall_time) = by_index[index]
                if low_step == high_step:
                    yield name, low_step, low, low_tokens, low_wall_time
                elif low_step < high_step:
                    yield name, low_step, low, low_tokens, low_wall_time
                    yield name, high_step, high, high_tokens, high_wall_time
                else:
                    yield name, high_step, high, high_tokens, high_wall_time
                    yield name, low_step, low, low_tokens, low_wall_time

    def start_time(self) -> float | None:
        """The smallest wall time of the points folded in (None when none): where a series' times count
        from, which its drawn points need not include."""
        return min((bucket[5] for by_index in self.buckets.values() for bucket in by_index.values()), default=None)

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.LAYOUT, "width": self.width, "through_step": self.through_step,
                "through_id": self.through_id, "buckets": {name: [[index, *bucket] for index, bucket in sorted(by_index.items())]
                            for name, by_index in self.buckets.items()}}

    @classmethod
    def in_layout(cls, data: dict[str, Any] | None) -> bool:
        """Whether stored buckets (``to_json``'s) draw each extreme at its own point: written in the
        current layout, not converted from six or eight fields (a run stored across the change)."""
        return bool(data) and data.get("layout") == cls.LAYOUT

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SeriesBuckets:
        return cls(width=int(data["width"]), through_step=int(data["through_step"]),
                   through_id=int(data.get("through_id", 0)),
                   buckets={name: {int(row[0]): list(row[1:]) for row in rows}
                            for name, rows in data["buckets"].items()})

