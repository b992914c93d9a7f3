"""Inter-rater agreement statistics, as pure functions over plain Python values.

Design note: review labels are nominal categories (``a``, ``b``, ``tie``, ``both_bad``); a skip is
missing data, never a category. Three standard coefficients cover the cases a campaign meets:

- Cohen's kappa for one pair of reviewers over the items both labelled;
- Fleiss' kappa for a fixed number of ratings per item (every item rated the same number of times);
- Krippendorff's alpha (nominal) for any number of reviewers with missing ratings, which is what a
  real campaign looks like, so it is the headline figure.

Each returns ``None`` where the coefficient is undefined (no data, or no variation at all, which
makes the expected disagreement zero) rather than a misleading 0 or 1. The formulas follow
Cohen (1960), Fleiss (1971) and Krippendorff, "Computing Krippendorff's Alpha-Reliability" (2011).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass


def cohen_kappa(labels_1: Sequence[Hashable], labels_2: Sequence[Hashable]) -> float | None:
    """Cohen's kappa of two reviewers' labels of the same items (``labels_1[i]`` and ``labels_2[i]``
    label item ``i``): ``(p_o - p_e) / (1 - p_e)``, with ``p_e`` from each reviewer's own label shares."""
    if len(labels_1) != len(labels_2):
        raise ValueError(f"cohen_kappa needs paired labels: got {len(labels_1)} and {len(labels_2)}")
    count = len(labels_1)
    if count == 0:
        return None
    observed = sum(first == second for first, second in zip(labels_1, labels_2)) / count
    shares_1, shares_2 = Counter(labels_1), Counter(labels_2)
    expected = sum(shares_1[label] * shares_2[label] for label in shares_1) / (count * count)
    if expected == 1:
        return None
    return (observed - expected) / (1 - expected)


def fleiss_kappa(counts: Sequence[Sequence[int]]) -> float | None:
    """Fleiss' kappa from a matrix ``counts[item][category]`` = how many reviewers gave the item that
    category; every item must have the same number of ratings (at least 2)."""
    if not counts:
        return None
    raters = sum(counts[0])
    if raters < 2:
        raise ValueError(f"fleiss_kappa needs at least 2 ratings per item; item 0 has {raters}")
    for index, row in enumerate(counts):
        if sum(row) != raters:
            raise ValueError(f"fleiss_kappa needs the same number of ratings per item: item 0 has {raters}, "
                             f"item {index} has {sum(row)}")
    items = len(counts)
    per_item = [(sum(c * c for c in row) - raters) / (raters * (raters - 1)) for row in counts]
    mean_observed = sum(per_item) / items
    categories = len(counts[0])
    shares = [sum(row[j] for row in counts) / (items * raters) for j in range(categories)]
    expected = sum(share * share for share in shares)
    if expected == 1:
        return None
    return (mean_observed - expected) / (1 - expected)


def krippendorff_alpha_nominal(units: Iterable[Sequence[Hashable | None]]) -> float | None:
    """Krippendorff's alpha for nominal labels. ``units`` holds, per item, the labels its reviewers
    gave (``None`` = missing; the position of a label in the list does not matter). Items with fewer
    than two labels carry no pairable information and are left out, as the coefficient prescribes."""
    # Coincidence matrix o[c][k]: each ordered pair of labels within an item, weighted 1 / (m_u - 1).
    # Items with the same multiset of labels contribute the same, so each multiset is counted once.
    patterns: Counter[tuple[Hashable, ...]] = Counter()
    for unit in units:
        values = [value for value in unit if value is not None]
        if len(values) >= 2:
            patterns[tuple(sorted(values, key=repr))] += 1
    coincidences: Counter[tuple[Hashable, Hashable]] = Counter()
    for values, multiplicity in patterns.items():
        pairable = len(values)
        per_label = Counter(values)
        for label_c, count_c in per_label.items():
            for label_k, count_k in per_label.items():
                pairs = count_c * (count_k - 1) if label_c == label_k else count_c * count_k
                coincidences[label_c, label_k] += multiplicity * pairs / (pairable - 1)
    marginals: Counter[Hashable] = Counter()
    for (label_c, _label_k), weight in coincidences.items():
        marginals[label_c] += weight
    total = sum(marginals.values())
    if total <= 1:
        return None
    disagreement_observed = sum(weight for (c, k), weight in coincidences.items() if c != k)
    disagreement_expected = sum(marginals[c] * marginals[k] for c in marginals for k in marginals if c != k)
    if disagreement_expected == 0:
        return None
    return 1 - (total - 1) * disagreement_observed / disagreement_expected


@dataclass(frozen=True, kw_only=True)
class Proportion:
    """``successes`` out of ``trials``, with a Wilson score interval at ``confidence``."""

    successes: int
    trials: int
    share: float | None
    low: float | None
    high: float | None
    confidence: float = 0.95


# Two-sided standard normal quantiles for the confidence levels the pages use.
_Z = {0.90: 1.6448536269514722, 0.95: 1.959963984540054, 0.99: 2.5758293035489004}


def wilson_interval(successes: int, trials: int, *, confidence: float = 0.95) -> Proportion:
    """The share ``successes / trials`` with its Wilson score interval (binomial; good for small
    ``trials`` and shares near 0 or 1, unlike the normal approximation)."""
    if confidence not in _Z:
        raise ValueError(f"confidence must be one of {sorted(_Z)}, got {confidence}")
    if not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    if trials == 0:
        return Proportion(successes=0, trials=0, share=None, low=None, high=None, confidence=confidence)
    z = _Z[confidence]
    share = successes / trials
    denominator = 1 + z * z / trials
    centre = (share + z * z / (2 * trials)) / denominator
    half_width = z * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials)) / denominator
    return Proportion(successes=successes, trials=trials, share=share, low=max(0.0, centre - half_width),
                      high=min(1.0, centre + half_width), confidence=confidence)


# --- A campaign's figures ------------------------------------------------------------------------------

NOMINAL_LABELS = ("a", "b", "tie", "both_bad")


@dataclass(frozen=True, kw_only=True)
class RatedReview:
    """One review as the statistics see it: ``label`` in item terms (a/b/tie/both_bad; skips are not
    passed in), ``first_chosen`` whether the reviewer picked the response shown first (None for tie
    and both-bad), ``original_label`` the source's own pick for the item (``""`` when it has none),
    ``model_a``/``model_b`` the models behind the responses, when known."""

    item: Hashable
    reviewer: Hashable
    label: str
    first_chosen: bool | None
    original_label: str = ""
    # The models that wrote the item's responses a and b (arena and run items; "" for dataset rows).
    model_a: str = ""
    model_b: str = ""


@dataclass(frozen=True, kw_only=True)
class PairAgreement:
    reviewers: tuple[Hashable, Hashable]
    items: int
    agreement: float | None
    kappa: float | None


@dataclass(frozen=True, kw_only=True)
class ModelPreference:
    """How reviewers judged two models against each other: ``preferred_first`` is the share of the
    decisive reviews (a or b) that preferred ``models[0]``; ``undecided`` counts ties and both-bad."""

    models: tuple[str, str]
    preferred_first: Proportion
    undecided: int


def model_preferences(reviews: Iterable[RatedReview]) -> tuple[ModelPreference, ...]:
    """Per pair of models (in name order), the reviewers' preference between them, from the reviews
    of items whose two responses come from two different known models."""
    wins: dict[tuple[str, str], list[int]] = {}  # models -> [decisive reviews, of which for models[0], undecided]
    for review in reviews:
        if not review.model_a or not review.model_b or review.model_a == review.model_b:
            continue
        models = tuple(sorted((review.model_a, review.model_b)))
        counts = wins.setdefault(models, [0, 0, 0])
        if review.label in ("a", "b"):
            winner = review.model_a if review.label == "a" else review.model_b
            counts[0] += 1
            counts[1] += winner == models[0]
        else:
            counts[2] += 1
    return tuple(ModelPreference(models=models, preferred_first=wilson_interval(first, decisive), undecided=undecided)
                 for models, (decisive, first, undecided) in sorted(wins.items()))


@dataclass(frozen=True, kw_only=True)
class AgreementReport:
    """A campaign's agreement figures. ``fleiss_kappa`` is over the items that have exactly
    ``fleiss_raters`` labels (the campaign's reviews per item); ``alpha`` over every item with two
    labels or more."""

    reviews: int
    items_rated_twice: int
    alpha: float | None
    fleiss_kappa: float | None
    fleiss_items: int
    fleiss_raters: int
    pairs: tuple[PairAgreement, ...]
    original: Proportion
    position_bias: Proportion
    models: tuple[ModelPreference, ...] = ()


def _share_equal(labels_1: list[str], labels_2: list[str]) -> float | None:
    return sum(x == y for x, y in zip(labels_1, labels_2)) / len(labels_1) if labels_1 else None


def campaign_report(reviews: Iterable[RatedReview], *, required_reviews: int) -> AgreementReport:
    """Every agreement figure of a campaign from its (non-skip) reviews."""
    reviews = list(reviews)
    by_item: dict[Hashable, dict[Hashable, str]] = {}
    for review in reviews:
        by_item.setdefault(review.item, {})[review.reviewer] = review.label
    alpha = krippendorff_alpha_nominal(list(labels.values()) for labels in by_item.values())
    fixed = Counter(tuple(sorted(labels.values())) for labels in by_item.values() if len(labels) == required_reviews)
    fleiss = None
    if required_reviews >= 2 and fixed:
        fleiss = fleiss_kappa([[labels.count(category) for category in NOMINAL_LABELS]
                               for labels, multiplicity in fixed.items() for _ in range(multiplicity)])
    # One pass over the items collects every pair's shared items (cost: items × reviewers per item²).
    pair_labels: dict[tuple[Hashable, Hashable], tuple[list[str], list[str]]] = {}
    for labels in by_item.values():
        names = sorted(labels, key=str)
        for index, first in enumerate(names):
            for second in names[index + 1:]:
                firsts, seconds = pair_labels.setdefault((first, second), ([], []))
                firsts.append(labels[first])
                seconds.append(labels[second])
    pairs = [PairAgreement(reviewers=names, items=len(firsts), agreement=_share_equal(firsts, seconds),
                           kappa=cohen_kappa(firsts, seconds))
             for names, (firsts, seconds) in sorted(pair_labels.items(), key=lambda entry: tuple(map(str, entry[0])))]
    with_original = [review for review in reviews if review.original_label and review.label in ("a", "b")]
    decisive = [review for review in reviews if review.first_chosen is not None]
    return AgreementReport(
        reviews=len(reviews),
        items_rated_twice=sum(len(labels) >= 2 for labels in by_item.values()),
        alpha=alpha,
        fleiss_kappa=fleiss,
        fleiss_items=sum(fixed.values()) if fleiss is not None else 0,
        fleiss_raters=required_reviews,
        pairs=tuple(pairs),
        original=wilson_interval(sum(review.label == review.original_label for review in with_original),
                                 len(with_original)),
        position_bias=wilson_interval(sum(bool(review.first_chosen) for review in decisive), len(decisive)),
        models=model_preferences(reviews),
    )


def report_to_dict(report: AgreementReport) -> dict:
    """``report`` as JSON-ready data (for an export's provenance)."""

    def proportion(value: Proportion) -> dict:
        return {"successes": value.successes, "trials": value.trials, "share": value.share,
                "low": value.low, "high": value.high, "confidence": value.confidence}

    return {
        "reviews": report.reviews, "items_rated_twice": report.items_rated_twice,
        "krippendorff_alpha": report.alpha, "fleiss_kappa": report.fleiss_kappa,
        "fleiss_items": report.fleiss_items, "fleiss_raters": report.fleiss_raters,
        "pairs": [{"reviewers": [str(name) for name in pair.reviewers], "items": pair.items,
                   "agreement": pair.agreement, "cohen_kappa": pair.kappa} for pair in report.pairs],
        "original_label_agreement": proportion(report.original),
        "position_bias_first_chosen": proportion(report.position_bias),
        "model_preferences": [{"models": list(preference.models), "undecided": preference.undecided,
                               "preferred_first": proportion(preference.preferred_first)}
                              for preference in report.models],
    }
