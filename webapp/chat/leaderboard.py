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
with fewer than ``MIN_VOTES_FOR_INTERVAL`` votes would look precise without being so: it is not shown. Nor is that of
a model whose every opponent's votes went one way (``Rating.one_sided``: all won, all lost or all tied): each pair is
resampled from its own outcomes, so those votes resample to themselves and the interval has no width, however many.

The votes are read once, into counts per pair of models and outcome (``_tally``): resampling the votes
with replacement is drawing those counts from a multinomial (the same distribution, without going back
to the votes), and every round is fitted at once, Newton's steps taken on a stack of matrices. The cost
grows with the number of models, not with the votes times the rounds (10,000 votes of 8 models: 0.6 s
when each round resampled and counted the votes in Python, 5 ms now; ``bench/leaderboard.py``).
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
    # Every opponent's votes went one way (all won, all lost, or all tied): the bootstrap resamples each pair from
    # its own outcomes, so such votes resample to themselves and the interval says nothing ("1343 – 1343").
    one_sided: bool = False

    @property
    def has_interval(self) -> bool:
        return self.votes >= MIN_VOTES_FOR_INTERVAL and not self.one_sided


@dataclasses.dataclass(frozen=True)
class _Tally:
    """The votes counted once: for each pair of models that met (``first`` < ``second``, by position in
    ``models``), the votes the first won, the second won, and the ties ("both bad" counts as a tie).
    That is all the fit reads of the votes, so resampling them with replacement is drawing these counts
    from a multinomial: the bootstrap never goes back to the votes."""

    models: list[str]
    first: np.ndarray  # [P]
    second: np.ndarray  # [P]
    counts: np.ndarray  # [P, 3]: first won, second won, tied

    def wins(self, counts: np.ndarray) -> np.ndarray:
        """wins[..., i, j]: wins of model i over model j, ties counting half to each, from ``counts`` [..., P, 3]."""
        size = len(self.models)
        wins = np.zeros((*counts.shape[:-2], size, size))
        wins[..., self.first, self.second] = counts[..., 0] + counts[..., 2] / 2
        wins[..., self.second, self.first] = counts[..., 1] + counts[..., 2] / 2
        return wins

    def one_sided(self) -> np.ndarray:
        """[M] bool: whether every pair the model is in holds votes of one outcome only (A won, B won, or tied)."""
        mixed_pairs = (self.counts > 0).sum(axis=-1) > 1
        size = len(self.models)
        mixed = (np.bincount(self.first, weights=mixed_pairs, minlength=size)
                 + np.bincount(self.second, weights=mixed_pairs, minlength=size))
        return mixed == 0

    def votes_per_model(self) -> np.ndarray:
        games = self.counts.sum(axis=-1)
        size = len(self.models)
        return (np.bincount(self.first, weights=games, minlength=size)
                + np.bincount(self.second, weights=games, minlength=size)).astype(int)


_OUTCOME_CODE = {"a": 0, "b": 1, "tie": 2, "both_bad": 2}


def _tally(votes: Sequence[Vote]) -> _Tally:
    models = sorted({vote.model_a for vote in votes} | {vote.model_b for vote in votes})
    index = {model: position for position, model in enumerate(models)}
    size = len(models)
    # One pass over the votes, each as one integer: (model A, model B, how it went).
    coded = np.fromiter(((index[vote.model_a] * size + index[vote.model_b]) * 3 + _OUTCOME_CODE[vote.outcome]
                         for vote in votes), dtype=np.int64, count=len(votes))
    pair, outcome = np.divmod(coded, 3)
    model_a, model_b = np.divmod(pair, size)
    # Each pair in index order: when a vote's model A is the later one, "A won" is a win of the pair's
    # second model and "B won" of its first.
    swapped = model_a > model_b
    outcome = np.where(swapped & (outcome < 2), 1 - outcome, outcome)
    counts = np.bincount((np.minimum(model_a, model_b) * size + np.maximum(model_a, model_b)) * 3 + outcome,
                         minlength=size * size * 3).reshape(size * size, 3)
    met = np.flatnonzero(counts.sum(axis=1))
    first, second = np.divmod(met, size)
    return _Tally(models=models, first=first, second=second, counts=counts[met].astype(float))


def fit_strengths(wins: np.ndarray, *, prior: float = 0.5, iterations: int = 100, tolerance: float = 1e-12
                  ) -> np.ndarray:
    """Bradley–Terry strengths (geometric mean 1) from a wins matrix [M, M] (see the module note), or from a
    stack of them [R, M, M] fitted together (the bootstrap's resamples), each to its own strengths [R, M].

    With ``prior`` 0 (the plain maximum-likelihood fit) every model needs at least one win or tie.
    """
    wins = np.asarray(wins, dtype=float)
    games = wins + np.swapaxes(wins, -1, -2)
    total_wins = wins.sum(axis=-1) + prior / 2  # half of each virtual tie against the reference
    if not np.all(total_wins > 0):
        raise ValueError("with prior 0 every model needs a win or a tie; a model that never won has no finite "
                         "Bradley–Terry strength (use a prior > 0)")
    log_strengths = np.zeros(wins.shape[:-1])
    diagonal = np.arange(wins.shape[-1])
    for _ in range(iterations):
        # [..., i, j]: P(i beats j)
        beats = 1.0 / (1.0 + np.exp(log_strengths[..., None, :] - log_strengths[..., :, None]))
        beats_reference = 1.0 / (1.0 + np.exp(-log_strengths))
        gradient = total_wins - (games * beats).sum(axis=-1) - prior * beats_reference
        curvature = games * beats * np.swapaxes(beats, -1, -2)
        hessian = curvature.copy()
        hessian[..., diagonal, diagonal] -= curvature.sum(axis=-1) + prior * beats_reference * (1 - beats_reference)
        if prior > 0:  # the prior makes the Hessian negative definite
            step = np.linalg.solve(hessian, -gradient[..., None])[..., 0]
        else:
            # Without the prior the likelihood is flat along "all strengths times c": the pseudo-inverse takes
            # the minimum-norm step, which leaves that direction alone.
            step = (np.linalg.pinv(hessian) @ -gradient[..., None])[..., 0]
        log_strengths = log_strengths + step
        if np.max(np.abs(step)) < tolerance:
            break
    return np.exp(log_strengths - log_strengths.mean(axis=-1, keepdims=True))


def leaderboard(votes: Sequence[Vote], *, prior: float = 0.5, rounds: int = 200, seed: int = 0) -> list[Rating]:
    """Every model that has a vote, best first, with its rating and 95% bootstrap interval."""
    if not votes:
        return []
    tally = _tally(votes)
    ratings = _ratings(fit_strengths(tally.wins(tally.counts), prior=prior))
    # Each round draws len(votes) votes with replacement: as counts of the (pair, outcome) cells that hold
    # votes, a multinomial with their shares; the other cells stay 0.
    cells = tally.counts.ravel()
    held = np.flatnonzero(cells)
    resampled_counts = np.zeros((rounds, cells.size))
    resampled_counts[:, held] = np.random.default_rng(seed).multinomial(len(votes), cells[held] / len(votes),
                                                                         size=rounds)
    resampled_wins = tally.wins(resampled_counts.reshape(rounds, *tally.counts.shape))
    # With prior 0, a resample in which some model never won has no finite fit: it is left out.
    fittable = np.all(resampled_wins.sum(axis=-1) + prior / 2 > 0, axis=-1)
    resampled = _ratings(fit_strengths(resampled_wins[fittable], prior=prior)) if fittable.any() else []
    low, high = np.percentile(resampled, [2.5, 97.5], axis=0) if len(resampled) else (ratings, ratings)
    votes_per_model, one_sided = tally.votes_per_model(), tally.one_sided()
    board = [Rating(model=model, rating=float(ratings[i]), low=float(low[i]), high=float(high[i]),
                    votes=int(votes_per_model[i]), one_sided=bool(one_sided[i])) for i, model in enumerate(tally.models)]
    return sorted(board, key=lambda rating: -rating.rating)


def _ratings(strengths: np.ndarray) -> np.ndarray:
    return ELO_BASE + ELO_SCALE * np.log10(strengths)


def win_rates(votes: Sequence[Vote]) -> dict[tuple[str, str], tuple[float, int]]:
    """(share of wins of the first over the second, ties counting half; games) for every pair that met."""
    tally = _tally(votes)
    wins = tally.wins(tally.counts)
    games = wins + wins.T
    return {(first, second): (float(wins[i, j] / games[i, j]), int(games[i, j]))
            for i, first in enumerate(tally.models) for j, second in enumerate(tally.models)
            if i != j and games[i, j] > 0}
