"""Bradley–Terry ratings, bootstrap intervals and win rates, by hand."""
import math

import numpy as np
import pytest

from webapp.chat.leaderboard import MIN_VOTES_FOR_INTERVAL, Vote, fit_strengths, leaderboard, win_rates


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
             leaderboard(votes("A", "B", "a", few - 1) + votes("A", "B", "b", 1)
                         + votes("B", "C", "a", MIN_VOTES_FOR_INTERVAL - 1) + votes("B", "C", "b", 1), rounds=20)}
    assert (board["A"].votes, board["B"].votes, board["C"].votes) == (few, 2 * MIN_VOTES_FOR_INTERVAL - 1,
                                                                      MIN_VOTES_FOR_INTERVAL)
    assert [board[model].has_interval for model in "ABC"] == [False, True, True]


def test_a_single_vote_has_no_interval_to_show():
    # One vote resamples to itself every round: the bootstrap "interval" is one point.
    [first, second] = leaderboard(votes("A", "B", "a", 1), rounds=20)
    assert first.low == first.high and not first.has_interval and not second.has_interval


def test_votes_all_one_way_show_no_interval():
    """QA (two models, ten votes all for A): the leaderboard showed "1343 – 1343" as A's 95% interval, ten ties
    "1000 – 1000": each bootstrap round resamples the votes of a pair from its own outcomes, so a pair whose votes
    all went one way resamples to itself, and the interval said the rating was known exactly. A model whose every
    opponent's votes went one way has no interval to show; one opponent with mixed votes gives it one."""
    for data in (votes("A", "B", "a", 10), votes("A", "B", "tie", 10),
                 votes("A", "B", "a", 10) + votes("B", "C", "b", 10)):
        board = leaderboard(data, rounds=50)
        assert all(rating.votes >= MIN_VOTES_FOR_INTERVAL and rating.one_sided and not rating.has_interval
                   for rating in board), board
    board = {rating.model: rating for rating in
             leaderboard(votes("A", "B", "a", 10) + votes("B", "C", "a", 6) + votes("B", "C", "b", 4), rounds=50)}
    assert board["A"].one_sided and not board["A"].has_interval
    assert not board["B"].one_sided and board["B"].has_interval and board["B"].high > board["B"].low
    assert not board["C"].one_sided and board["C"].has_interval


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


class CountedVotes(list):
    """Votes that count how many times one is read out of them."""

    def __init__(self, votes):
        super().__init__(votes)
        self.read = 0

    def __iter__(self):
        for vote in super().__iter__():
            self.read += 1
            yield vote

    def __getitem__(self, index):
        self.read += 1
        return super().__getitem__(index)


def drawn_votes(count, *, seed=0):
    """``count`` votes among four models of known strengths, every outcome among them."""
    rng = np.random.default_rng(seed)
    strengths, names, drawn = np.array([1.0, 2.0, 0.5, 4.0]), "ABCD", []
    for _ in range(count):
        a, b = rng.choice(4, 2, replace=False)
        draw = rng.random()
        outcome = ("tie" if draw < 0.1 else "both_bad" if draw < 0.15 else
                   "a" if rng.random() < strengths[a] / (strengths[a] + strengths[b]) else "b")
        drawn.append(Vote(model_a=names[a], model_b=names[b], outcome=outcome))
    return drawn


def test_the_votes_are_read_once_whatever_the_bootstrap_rounds():
    """Each of the 200 rounds drew and counted the votes one by one in Python: 10,000 votes took over half a
    second (bench/leaderboard.py). They are now counted once per pair and outcome, and resampled as counts."""
    data = CountedVotes(drawn_votes(500))
    leaderboard(data, rounds=200)
    assert data.read <= 3 * len(data)


def test_the_bootstrap_resamples_as_resampling_the_votes_one_by_one_would():
    """Reference: each round draws the votes with replacement one by one and credits each drawn vote to its
    round's wins matrix (a win, or half to each side)."""
    data = drawn_votes(300, seed=1)
    index = {model: position for position, model in enumerate("ABCD")}
    first = np.array([index[vote.model_a] for vote in data])
    second = np.array([index[vote.model_b] for vote in data])
    credit_first = np.array([{"a": 1.0, "b": 0.0}.get(vote.outcome, 0.5) for vote in data])
    rounds = 20_000
    drawn = np.random.default_rng(7).integers(0, len(data), (rounds, len(data)))  # [R, N] vote positions
    wins = np.zeros(rounds * 16)
    round_offset = 16 * np.arange(rounds)[:, None]
    np.add.at(wins, (round_offset + first[drawn] * 4 + second[drawn]).ravel(), credit_first[drawn].ravel())
    np.add.at(wins, (round_offset + second[drawn] * 4 + first[drawn]).ravel(), 1 - credit_first[drawn].ravel())
    low, high = np.percentile(1000 + 400 * np.log10(fit_strengths(wins.reshape(rounds, 4, 4))), [2.5, 97.5], axis=0)
    board = {rating.model: rating for rating in leaderboard(data, rounds=rounds)}
    for model, i in index.items():
        # Two bootstraps of 20,000 rounds agree to their Monte Carlo noise, about a point on intervals ~85 wide.
        assert board[model].low == pytest.approx(low[i], abs=2.5)
        assert board[model].high == pytest.approx(high[i], abs=2.5)


def test_without_the_prior_a_resample_that_cannot_be_fitted_is_left_out():
    # 3 wins to 1: about a third of the resamples hold no win of B, and have no finite fit.
    board = leaderboard(votes("A", "B", "a", 3) + votes("A", "B", "b", 1), prior=0.0, rounds=200)
    for rating in board:
        assert all(map(math.isfinite, (rating.rating, rating.low, rating.high)))
        assert rating.low <= rating.rating <= rating.high


def test_the_fit_of_a_stack_of_matrices_is_each_ones_own_fit():
    stack = np.array([[[0, 3, 1], [1, 0, 2], [2, 1, 0]], [[0, 5, 0], [0, 0, 1], [4, 2, 0]]], dtype=float)
    for prior in (0.5, 0.0):
        together = fit_strengths(stack, prior=prior)
        for wins, strengths in zip(stack, together):
            assert strengths == pytest.approx(fit_strengths(wins, prior=prior), rel=1e-12)
