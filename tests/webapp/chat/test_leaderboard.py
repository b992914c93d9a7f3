"""Bradley–Terry ratings, bootstrap intervals and win rates, by hand."""
import math

import pytest

from webapp.chat.leaderboard import MIN_VOTES_FOR_INTERVAL, Vote, leaderboard, win_rates


def votes(a, b, outcome, times):
    return [Vote(model_a=a, model_b=b, outcome=outcome)] * times


def test_two_models_rate_by_their_odds():
    # 3 wins to 1: p_A / p_B = 3, so the gap is 400 log10 3 and the ratings sit symmetrically around 1000.
    board = leaderboard(votes("A", "B", "a", 3) + votes("A", "B", "b", 1), prior=0.0, rounds=20)
    assert [rating.model for rating in board] == ["A", "B"]
    assert board[0].rating == pytest.approx(1000 + 200 * math.log10(3), abs=1e-6)
    assert board[1].rating == pytest.approx(1000 - 200 * math.log10(3), abs=1e-6)
    assert board[0].votes == board[1].votes == 4


def test_ties_and_both_bad_count_half_to_each():
    board = leaderboard(votes("A", "B", "tie", 3) + votes("B", "A", "both_bad", 2), prior=0.0, rounds=20)
    assert [rating.rating for rating in board] == pytest.approx([1000.0, 1000.0], abs=1e-9)


def test_three_models_satisfy_the_likelihood_equations():
    # Maximum likelihood: each model's wins equal its expected wins, sum_j n_ij p_i / (p_i + p_j).
    data = (votes("A", "B", "a", 4) + votes("A", "B", "b", 2) + votes("B", "C", "a", 3) + votes("B", "C", "b", 1)
            + votes("A", "C", "a", 2) + votes("A", "C", "tie", 2))
    board = {rating.model: 10 ** ((rating.rating - 1000) / 400) for rating in leaderboard(data, prior=0.0, rounds=5)}
    wins = {"A": 4 + 2 + 1, "B": 2 + 3, "C": 1 + 1}
    games = {("A", "B"): 6, ("B", "C"): 4, ("A", "C"): 4}
    for model in "ABC":
        expected = sum(count * board[model] / (board[model] + board[other])
                       for pair, count in games.items() if model in pair for other in pair if other != model)
        assert expected == pytest.approx(wins[model], rel=1e-8)


def test_the_prior_keeps_an_unbeaten_model_finite():
    few = leaderboard(votes("A", "B", "a", 5), rounds=20)
    many = leaderboard(votes("A", "B", "a", 50), rounds=20)
    assert math.isfinite(few[0].rating) and few[0].model == "A"
    assert many[0].rating - many[1].rating > few[0].rating - few[1].rating > 0


def test_bootstrap_intervals_hold_the_rating_and_narrow_with_more_votes():
    def data(scale):
        return (votes("A", "B", "a", 6 * scale) + votes("A", "B", "b", 4 * scale) + votes("B", "C", "a", 7 * scale)
                + votes("B", "C", "b", 3 * scale))

    small, large = leaderboard(data(1), rounds=300, seed=1), leaderboard(data(10), rounds=300, seed=1)
    for rating in small + large:
        assert rating.low <= rating.rating <= rating.high
    width = lambda board: sum(rating.high - rating.low for rating in board)
    assert width(large) < width(small) / 2  # about 1/sqrt(10) as wide


def test_an_interval_is_shown_only_from_the_minimum_number_of_votes_per_model():
    # B plays every vote, A and C share them: with one vote fewer than the minimum A has none to show.
    few = MIN_VOTES_FOR_INTERVAL - 1
    board = {rating.model: rating for rating in
             leaderboard(votes("A", "B", "a", few) + votes("B", "C", "a", MIN_VOTES_FOR_INTERVAL), rounds=20)}
    assert (board["A"].votes, board["B"].votes, board["C"].votes) == (few, 2 * MIN_VOTES_FOR_INTERVAL - 1,
                                                                      MIN_VOTES_FOR_INTERVAL)
    assert [board[model].has_interval for model in "ABC"] == [False, True, True]


def test_a_single_vote_has_no_interval_to_show():
    # One vote resamples to itself every round: the bootstrap "interval" is one point.
    [first, second] = leaderboard(votes("A", "B", "a", 1), rounds=20)
    assert first.low == first.high and not first.has_interval and not second.has_interval


def test_win_rates_by_hand():
    data = votes("A", "B", "a", 2) + votes("A", "B", "tie", 1) + votes("B", "A", "a", 1)
    rates = win_rates(data)
    assert rates[("A", "B")] == (0.625, 4)  # (2 + 0.5) / 4
    assert rates[("B", "A")] == (0.375, 4)


def test_without_the_prior_a_model_that_never_won_cannot_be_fitted():
    with pytest.raises(ValueError, match="every model needs a win or a tie"):
        leaderboard(votes("A", "B", "a", 3), prior=0.0)


def test_it_rejects_a_bad_vote():
    with pytest.raises(ValueError, match="'maybe' is not one of a, b, tie, both_bad"):
        Vote(model_a="A", model_b="B", outcome="maybe")
    with pytest.raises(ValueError, match="two different models"):
        Vote(model_a="A", model_b="A", outcome="a")
