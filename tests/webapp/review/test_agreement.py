"""Agreement statistics against values worked out by hand from textbook examples."""
from fractions import Fraction

import pytest

from webapp.review.agreement import (
    RatedReview, campaign_report, cohen_kappa, fleiss_kappa, krippendorff_alpha_nominal, model_preferences,
    wilson_interval,
)


def test_cohen_kappa_of_the_textbook_table():
    # The classic 2x2 example (50 proposals): yes/yes 20, yes/no 5, no/yes 10, no/no 15.
    # p_o = 35/50 = 0.7; p_e = 0.5·0.6 + 0.5·0.4 = 0.5; kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4.
    first = ["yes"] * 25 + ["no"] * 25
    second = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert cohen_kappa(first, second) == pytest.approx(0.4, abs=1e-12)


def test_cohen_kappa_is_one_for_identical_labels_and_undefined_without_variation():
    assert cohen_kappa(["a", "b", "tie"], ["a", "b", "tie"]) == pytest.approx(1.0)
    assert cohen_kappa(["a", "a"], ["a", "a"]) is None
    assert cohen_kappa([], []) is None


def test_cohen_kappa_rejects_unpaired_labels():
    with pytest.raises(ValueError, match="paired labels: got 2 and 1"):
        cohen_kappa(["a", "b"], ["a"])


# Fleiss (1971) as reworked on Wikipedia: 10 subjects, 14 raters each, 5 categories.
FLEISS_TABLE = [
    [0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7],
]


def test_fleiss_kappa_of_the_textbook_table():
    # Per subject (sum n_ij² - 14) / (14·13): 182, 46, 56, 80, 60, 84, 44, 32, 52, 52 over 182, so
    # P̄ = 688/1820 = 0.378. Column totals 20, 28, 39, 21, 32 of 140, so P̄_e = 4170/19600 = 0.213.
    observed, expected = Fraction(688, 1820), Fraction(4170, 19600)
    kappa = (observed - expected) / (1 - expected)
    assert float(kappa) == pytest.approx(0.2099307, abs=1e-7)
    assert fleiss_kappa(FLEISS_TABLE) == pytest.approx(float(kappa), abs=1e-12)


def test_fleiss_kappa_needs_the_same_number_of_ratings_per_item():
    with pytest.raises(ValueError, match="item 0 has 2, item 1 has 3"):
        fleiss_kappa([[1, 1], [2, 1]])


def test_krippendorff_alpha_of_the_textbook_example_with_missing_values():
    # Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", nominal example: 4 observers,
    # 12 units, missing values (unit 12 has one value and drops out). By hand: pairable values n = 40
    # with n_c = 9, 13, 10, 5, 3 for values 1..5; off-diagonal coincidences: unit 2 (2,2,2,3) gives
    # 6 ordered pairs · 1/3 = 2, unit 6 (1,2,3,4) 12 · 1/3 = 4, unit 8 (1,1,2,1) 6 · 1/3 = 2, total 8;
    # sum_{c≠k} n_c n_k = 40² - (81 + 169 + 100 + 25 + 9) = 1216.
    # alpha = 1 - (n - 1) · 8 / 1216 = 1 - 312/1216 = 0.743 (the paper's value).
    na = None
    observers = [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, na, na, na],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, na, 3],
        [na, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, na],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, na],
    ]
    units = list(zip(*observers))
    assert krippendorff_alpha_nominal(units) == pytest.approx(1 - 312 / 1216, abs=1e-12)


def test_krippendorff_alpha_is_one_for_perfect_agreement_and_undefined_without_variation():
    assert krippendorff_alpha_nominal([["a", "a"], ["b", "b", None]]) == pytest.approx(1.0)
    assert krippendorff_alpha_nominal([["a", "a"], ["a", "a"]]) is None
    assert krippendorff_alpha_nominal([["a"], [None, "b"]]) is None


def test_wilson_interval_by_hand():
    # 8 of 10, z = 1.96: centre (0.8 + 0.19208) / 1.38415 = 0.71676; half width
    # 1.96 · sqrt(0.016 + 0.0096040) / 1.38415 = 0.22660 -> [0.4902, 0.9433].
    interval = wilson_interval(8, 10)
    assert interval.share == 0.8
    assert interval.low == pytest.approx(0.490162, abs=1e-6)
    assert interval.high == pytest.approx(0.943318, abs=1e-6)
    assert wilson_interval(0, 0).share is None
    with pytest.raises(ValueError, match="0 <= successes <= trials"):
        wilson_interval(3, 2)


def test_campaign_report_puts_the_figures_together():
    # Two reviewers, four items. Labels: ann a, a, b, tie; bob a, b, b, tie.
    # Cohen: p_o = 3/4; ann shares a 2, b 1, tie 1; bob a 1, b 2, tie 1 -> p_e = (2 + 2 + 1)/16 = 5/16;
    # kappa = (12/16 - 5/16) / (11/16) = 7/11.
    labels = {"ann": ["a", "a", "b", "tie"], "bob": ["a", "b", "b", "tie"]}
    # Whether the response chosen was shown first: ann yes, yes, yes; bob yes, no, no.
    first = {"ann": [True, True, True, None], "bob": [True, False, False, None]}
    reviews = [RatedReview(item=index, reviewer=name, label=labels[name][index], first_chosen=first[name][index],
                           original_label="a")
               for name in labels for index in range(4)]
    report = campaign_report(reviews, required_reviews=2)
    [pair] = report.pairs
    assert pair.reviewers == ("ann", "bob") and pair.items == 4
    assert pair.agreement == pytest.approx(0.75)
    assert pair.kappa == pytest.approx(7 / 11, abs=1e-12)
    # Fleiss over the 4 items with 2 ratings: P̄ = 3/4; category shares a 3/8, b 3/8, tie 2/8 ->
    # P̄_e = (9 + 9 + 4)/64 = 22/64; kappa = (48/64 - 22/64) / (42/64) = 26/42.
    assert report.fleiss_kappa == pytest.approx(26 / 42, abs=1e-12)
    assert report.fleiss_items == 4
    # Decisive votes against the original label a: a, a, b (ann), a, b, b (bob): 3 of 6 agree.
    assert (report.original.successes, report.original.trials) == (3, 6)
    # The response shown first was chosen in 4 of the 6 decisive votes.
    assert (report.position_bias.successes, report.position_bias.trials) == (4, 6)
    # Krippendorff: coincidences o_aa 2, o_ab = o_ba 1, o_bb 2, o_tie,tie 2; n_a 3, n_b 3, n_tie 2, n 8;
    # alpha = 1 - (8 - 1) · 2 / (64 - 9 - 9 - 4) = 1 - 14/42 = 2/3.
    assert report.alpha == pytest.approx(2 / 3, abs=1e-12)
    assert report.items_rated_twice == 4


def test_model_preferences_count_wins_whichever_side_a_model_wrote():
    # Items by (model_a, model_b): three reviews of (falcon, heron), two of (heron, falcon) — the sides
    # swapped — and one of a dataset row (no models), which does not count.
    reviews = [RatedReview(item=index, reviewer="ann", label=label, first_chosen=None, model_a=model_a, model_b=model_b)
               for index, (model_a, model_b, label) in enumerate([
                   ("falcon", "heron", "a"), ("falcon", "heron", "b"), ("falcon", "heron", "tie"),
                   ("heron", "falcon", "b"), ("heron", "falcon", "b"), ("", "", "a")])]
    [preference] = model_preferences(reviews)
    # falcon won items 0, 3 and 4; heron won item 1; item 2 was a tie.
    assert preference.models == ("falcon", "heron")
    assert (preference.preferred_first.successes, preference.preferred_first.trials) == (3, 4)
    assert preference.undecided == 1
    # Wilson at 95 %, n = 4, p = 3/4, z = 1.959964: centre (0.75 + z²/8) / (1 + z²/4) = 0.627527,
    # half-width z·sqrt(0.75·0.25/4 + z²/64) / (1 + z²/4) = 0.326885
    assert preference.preferred_first.low == pytest.approx(0.300642, abs=1e-6)
    assert preference.preferred_first.high == pytest.approx(0.954413, abs=1e-6)
    report = campaign_report(reviews, required_reviews=1)
    assert report.models == (preference,)
