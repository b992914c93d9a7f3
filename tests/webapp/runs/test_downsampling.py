"""Min/max step buckets (webapp.runs.downsampling): widths, merging, and the drawn envelope,
against values worked out by hand."""
import random

import pytest

from webapp.runs.downsampling import SeriesBuckets, bucket_width


def test_bucket_width_is_the_smallest_power_of_two_that_fits():
    # At most max_points // 2 buckets: 1000 steps in 500 buckets of 2; 1001 steps need width 4.
    assert bucket_width(1000, 1000) == 2
    assert bucket_width(1001, 1000) == 4
    assert bucket_width(500, 1000) == 1
    assert bucket_width(25_000, 2000) == 32  # ceil(25000 / 32) = 782 <= 1000; / 16 = 1563 > 1000
    assert bucket_width(0, 1000) == 1


def test_buckets_keep_first_last_low_high_their_points_and_earliest_tokens_and_time():
    buckets = SeriesBuckets(width=4)
    for step, value in ((1, 3.0), (2, -1.0), (3, 7.0), (5, 2.0)):
        buckets.add("loss", step, value, tokens=10 * step, wall_time=100.0 + step)
    # [first step, last step, low, high, smallest tokens, smallest wall time, the low's step, the high's
    #  step, the low's tokens and wall time, the high's tokens and wall time]
    assert buckets.buckets["loss"] == {0: [1, 3, -1.0, 7.0, 10, 101.0, 2, 3, 20, 102.0, 30, 103.0],
                                       1: [5, 5, 2.0, 2.0, 50, 105.0, 5, 5, 50, 105.0, 50, 105.0]}
    assert buckets.through_step == 5 and buckets.start_time() == 101.0
    # Each bucket is drawn as its low and its high where they were logged; a one-point bucket once.
    assert list(buckets.points()) == [("loss", 2, -1.0, 20, 102.0), ("loss", 3, 7.0, 30, 103.0),
                                      ("loss", 5, 2.0, 50, 105.0)]


def test_a_falling_bucket_is_drawn_falling_and_a_flat_one_flat():
    buckets = SeriesBuckets(width=4)
    for step, value in ((1, 9.0), (2, 5.0), (3, 6.0), (4, 1.0), (5, 2.0), (6, 2.0), (7, 2.0)):
        buckets.add("loss", step, value, tokens=step, wall_time=float(step))
    assert list(buckets.points()) == [("loss", 1, 9.0, 1, 1.0), ("loss", 4, 1.0, 4, 4.0),
                                      ("loss", 5, 2.0, 5, 5.0), ("loss", 7, 2.0, 7, 7.0)]


def test_ties_keep_the_lows_earliest_step_and_the_highs_latest_in_any_order_and_through_merges():
    forward, backward = SeriesBuckets(width=8), SeriesBuckets(width=8)
    points = [(step, [3.0, 1.0, 5.0, 1.0, 5.0, 2.0][step - 1]) for step in range(1, 7)]
    for step, value in points:
        forward.add("m", step, value, step, 0.0)
    for step, value in reversed(points):
        backward.add("m", step, value, step, 0.0)
    halves = SeriesBuckets(width=4)
    for step, value in points:
        halves.add("m", step, value, step, 0.0)
    assert forward.buckets == backward.buckets == halves.coarsened(8).buckets == {
        "m": {0: [1, 6, 1.0, 5.0, 1, 0.0, 2, 5, 2, 0.0, 5, 0.0]}}


def test_stored_buckets_of_an_older_layout_are_known_as_such():
    """Six- and eight-field buckets (and twelve-field ones written out again from them, with no layout)
    drew each extreme at its bucket's smallest tokens and time: they are not read, the points are."""
    six = {"width": 4, "through_step": 3, "through_id": 0, "buckets": {"loss": [[0, 1, 3, -1.0, 7.0, 10, 101.0]]}}
    eight = {**six, "buckets": {"loss": [[0, 1, 3, -1.0, 7.0, 10, 101.0, 3, 2]]}}
    current = SeriesBuckets(width=4)
    current.add("loss", 1, -1.0, 10, 101.0)
    unmarked = {key: value for key, value in current.to_json().items() if key != "layout"}
    assert [SeriesBuckets.in_layout(data) for data in (six, eight, unmarked, {}, None, current.to_json())] == [
        False, False, False, False, False, True]


def test_coarsening_merges_neighbours_exactly_as_reducing_at_the_wider_width():
    rng = random.Random(3)
    points = [(step, rng.uniform(-5, 5)) for step in range(1, 1001)]
    fine, coarse = SeriesBuckets(width=2), SeriesBuckets(width=16)
    for step, value in points:
        fine.add("m", step, value, step, float(step))
        coarse.add("m", step, value, step, float(step))
    assert fine.coarsened(16).buckets == coarse.buckets
    assert fine.coarsened(2).buckets == fine.buckets and fine.coarsened(2) is not fine
    with pytest.raises(ValueError, match="cannot be regrouped"):
        coarse.coarsened(8)


def test_fit_doubles_the_width_as_the_run_grows():
    buckets = SeriesBuckets(width=1)
    for step in range(1, 11):
        buckets.add("m", step, float(step), step, 0.0)
    buckets.fit(10, max_points=4)  # at most 2 buckets: width 8 (ceil(10 / 8) = 2)
    assert buckets.width == 8
    assert buckets.buckets["m"] == {0: [1, 8, 1.0, 8.0, 1, 0.0, 1, 8, 1, 0.0, 8, 0.0],
                                    1: [9, 10, 9.0, 10.0, 9, 0.0, 9, 10, 9, 0.0, 10, 0.0]}


def test_json_round_trip():
    buckets = SeriesBuckets(width=2)
    buckets.add("a", 3, 1.5, 7, 9.0)
    assert SeriesBuckets.from_json(buckets.to_json()) == buckets
