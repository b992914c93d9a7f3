"""Ratings from pairwise votes (the arena's leaderboard): Bradley–Terry with bootstrap intervals.

Design note. Model i has strength ``p_i`` and beats model j with probability ``p_i / (p_i + p_j)``.
A decisive vote is one win; a tie or a "both bad" vote is half a win for each side (both say the two
answers were equally good, or equally bad). Strengths are the maximum-likelihood fit (Newton's method
on log-strengths, where the log-likelihood is concave), with ``prior`` virtual ties of every model
against a fixed reference of strength 1 so that a model that never lost still gets a finite rating. Ratings are on the Elo scale, ``1000 + 400 log10 p_i`` with the strengths'
geometric mean fixed at 1 (ratings average 1000); a 400-point gap means 10:1 odds. The interval
of each rating is the 2.5th–97.5th percentile over fits to votes resampled with replacement (a
resample that cannot be fitted, possible only without the prior, is left out). With few votes the
resamples barely differ (one vote resamples to itself every round), so the interval of a model
with fewer than ``MIN_VOTES_FOR_INTERVAL`` votes would look precise without being so: it is not shown.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

OUTCOMES = ("a", "b", "tie", "both_bad")
ELO_BASE = 1000.0
ELO_SCALE = 400.0
MIN_VOTES_FOR_INTERVAL = 5  # per model; below it the bootstrap interval is too narrow to mean anything


@dataclasses.dataclass(frozen=True, kw_only=True)
class Vote:
    model_a: str
    model_b: str
    outcome: str  # one of OUTCOMES

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise ValueError(f"vote outcome {self.outcome!r} is not one of {', '.join(OUTCOMES)}")
        if self.model_a == self.model_b:
            raise ValueError(f"a vote compares two different models, got {self.model_a!r} twice")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rating:
    model: str
    rating: float
    low: float  # 95% bootstrap interval
    high: float
    votes: int

    @property
    def has_interval(self) -> bool:
        return self.votes >= MIN_VOTES_FOR_INTERVAL


def _wins_matrix(votes: Sequence[Vote], index: dict[str, int]) -> np.ndarray:
    """wins[i, j]: wins of model i over model j, ties counting half to each."""
    wins = np.zeros((len(index), len(index)))
    for vote in votes:
        a, b = index[vote.model_a], index[vote.model_b]
        if vote.outcome == "a":
            wins[a, b] += 1
        elif vote.outcome == "b":
            wins[b, a] += 1
        else:
            wins[a, b] += 0.5
            wins[b, a] += 0.5
    return wins


def fit_strengths(wins: np.ndarray, *, prior: float = 0.5, iterations: int = 100, tolerance: float = 1e-12
                  ) -> np.ndarray:
    """Bradley–Terry strengths (geometric mean 1) from a wins matrix (see the module note).

    With ``prior`` 0 (the plain maximum-likelihood fit) every model needs at least one win or tie.
    """
    games = wins + wins.T
    total_wins = wins.sum(axis=1) + prior / 2  # half of each virtual tie against the reference
    if not np.all(total_wins > 0):
        raise ValueError("with prior 0 every model needs a win or a tie; a model that never won has no finite "
                         "Bradley–Terry strength (use a prior > 0)")
    log_strengths = np.zeros(len(wins))
    for _ in range(iterations):
        beats = 1.0 / (1.0 + np.exp(log_strengths[None, :] - log_strengths[:, None]))  # [i, j]: P(i beats j)
        beats_reference = 1.0 / (1.0 + np.exp(-log_strengths))
        gradient = total_wins - (games * beats).sum(axis=1) - prior * beats_reference
        curvature = games * beats * beats.T
        hessian = curvature - np.diag(curvature.sum(axis=1) + prior * beats_reference * (1 - beats_reference))
        # Without the prior the likelihood is flat along "all strengths times c": lstsq takes the
        # minimum-norm step, which leaves that direction alone.
        step = np.linalg.lstsq(hessian, -gradient, rcond=None)[0]
        log_strengths = log_strengths + step
        if np.max(np.abs(step)) < tolerance:
            break
    return np.exp(log_strengths - log_strengths.mean())


def leaderboard(votes: Sequence[Vote], *, prior: float = 0.5, rounds: int = 200, seed: int = 0) -> list[Rating]:
    """Every model that has a vote, best first, with its rating and 95% bootstrap interval."""
    models = sorted({vote.model_a for vote in votes} | {vote.model_b for vote in votes})
    if not models:
        return []
    index = {model: position for position, model in enumerate(models)}
    ratings = _ratings(fit_strengths(_wins_matrix(votes, index), prior=prior))
    rng = np.random.default_rng(seed)
    resampled = []
    for _ in range(rounds):
        sample = [votes[i] for i in rng.integers(0, len(votes), len(votes))]
        try:
            resampled.append(_ratings(fit_strengths(_wins_matrix(sample, index), prior=prior)))
        except ValueError:  # prior 0 and a resample where some model never won: no finite fit, left out
            continue
    low, high = np.percentile(np.array(resampled), [2.5, 97.5], axis=0) if resampled else (ratings, ratings)
    counts = {model: 0 for model in models}
    for vote in votes:
        counts[vote.model_a] += 1
        counts[vote.model_b] += 1
    board = [Rating(model=model, rating=float(ratings[i]), low=float(low[i]), high=float(high[i]),
                    votes=counts[model]) for model, i in index.items()]
    return sorted(board, key=lambda rating: -rating.rating)


def _ratings(strengths: np.ndarray) -> np.ndarray:
    return ELO_BASE + ELO_SCALE * np.log10(strengths)


def win_rates(votes: Sequence[Vote]) -> dict[tuple[str, str], tuple[float, int]]:
    """(share of wins of the first over the second, ties counting half; games) for every pair that met."""
    models = sorted({vote.model_a for vote in votes} | {vote.model_b for vote in votes})
    index = {model: position for position, model in enumerate(models)}
    wins = _wins_matrix(votes, index)
    games = wins + wins.T
    return {(first, second): (wins[i, j] / games[i, j], int(games[i, j]))
            for first, i in index.items() for second, j in index.items() if i != j and games[i, j] > 0}
