"""The bootstrap intervals the engine judges constraints and ties on."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.stats import Interval, bootstrap, paired_difference, point


def test_the_interval_holds_the_estimate_and_repeats_exactly() -> None:
    values = list(np.random.default_rng(1).normal(0.99, 0.01, size=32))
    a, b = bootstrap(values, "mean", 0.95), bootstrap(values, "mean", 0.95)
    assert a == b
    assert a.low < a.estimate < a.high
    assert a.estimate == pytest.approx(float(np.mean(values)))


def test_more_samples_give_a_narrower_interval() -> None:
    rng = np.random.default_rng(2)
    small = bootstrap(list(rng.normal(0, 1, 16)), "mean")
    large = bootstrap(list(rng.normal(0, 1, 1024)), "mean")
    assert large.half_width < small.half_width / 4


def test_a_higher_confidence_gives_a_wider_interval() -> None:
    values = list(np.random.default_rng(3).normal(0, 1, 64))
    assert bootstrap(values, "mean", 0.99).half_width > bootstrap(values, "mean", 0.8).half_width


def test_the_median_resists_one_wild_round() -> None:
    values = [1.5] * 9 + [40.0]
    interval = bootstrap(values, "median")
    assert interval.estimate == 1.5
    assert point(values, "mean") > 5


def test_identical_samples_give_a_zero_width_interval() -> None:
    assert bootstrap([1.0, 1.0, 1.0]) == Interval(1.0, 1.0, 1.0, 0.95)
    assert bootstrap([0.5]).half_width == 0


def test_a_paired_difference_is_tighter_than_two_separate_intervals() -> None:
    rng = np.random.default_rng(4)
    shared = rng.normal(0.9, 0.05, 200)  # per-sample difficulty, common to both models
    a = shared + rng.normal(0, 0.002, 200)
    b = shared - 0.01 + rng.normal(0, 0.002, 200)
    paired = paired_difference(list(a), list(b))
    assert paired.low > 0  # a is better, and the paired test can tell
    assert bootstrap(list(a)).overlaps(bootstrap(list(b)))  # separate intervals cannot


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        bootstrap([1.0, 2.0], confidence=1.0)
    with pytest.raises(ValueError, match="no samples"):
        bootstrap([])
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0], [1.0, 2.0])


def test_a_clustered_interval_covers_the_spread_between_groups() -> None:
    rng = np.random.default_rng(5)
    values, groups = [], []
    for group, effect in enumerate([0.977, 0.959, 1.09, 0.951]):  # four openings of one pair of sessions
        for _ in range(8):
            values.append(effect * (1 + rng.normal(0, 0.02)))
            groups.append(group)
    flat = bootstrap(values, "median")
    clustered = bootstrap(values, "median", groups=groups)
    assert clustered.estimate == flat.estimate
    assert clustered.half_width > 2 * flat.half_width
    assert clustered.high > 1.05  # the high group is inside the interval, not excluded by it
    assert bootstrap(values, "median", groups=groups) == clustered  # seeded


def test_group_labels_must_match_the_values() -> None:
    with pytest.raises(ValueError, match="group labels"):
        bootstrap([1.0, 2.0], groups=[0])


def test_the_clustered_bootstrap_gives_the_same_interval_whatever_its_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.core import stats

    rng = np.random.default_rng(4)
    values = rng.standard_normal(300).tolist()
    groups = sorted(rng.integers(0, 12, 300).tolist())
    whole = [stats.bootstrap(values, statistic, 0.9, 0, groups) for statistic in ("mean", "median")]
    monkeypatch.setattr(stats, "CHUNK_VALUES", 1000)  # a few resamples per chunk
    assert [stats.bootstrap(values, statistic, 0.9, 0, groups) for statistic in ("mean", "median")] == whole
