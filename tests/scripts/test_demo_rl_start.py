"""bench/demo_rl_start.py's statistics against hand-computed values (the model scoring is a bench)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "demo_rl_start.py"
_spec = importlib.util.spec_from_file_location("demo_rl_start", _PATH)
demo_rl_start = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo_rl_start)


def test_group_stats_greedy_sampled_pass_and_variance():
    stats = demo_rl_start.group_stats([1.0, 0.0, 0.0], [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
    assert stats == {"greedy": pytest.approx(1 / 3), "sampled_mean": pytest.approx((1 + 0.5 + 0) / 3),
                     "pass_at_g": pytest.approx(2 / 3), "groups_with_variance": pytest.approx(1 / 3), "count": 3}


def test_prompt_blind_mean_is_the_kind_wide_share_of_each_reference():
    # Samples over the kind: "9" three times, "7" once -> q(9) = 0.75, q(7) = 0.25, q(5) = 0.
    # References 9, 7, 5: (0.75 + 0.25 + 0) / 3.
    assert demo_rl_start.prompt_blind_mean(["9", "9", "7", "9"], ["9", " 7", "5"]) == pytest.approx(1 / 3)


def test_prompt_blind_mean_of_no_rows_is_zero():
    assert demo_rl_start.prompt_blind_mean([], []) == 0.0
