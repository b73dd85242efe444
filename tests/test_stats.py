import numpy as np
import pytest

from arxtune.stats import bandwidths, median_ci_ranks, summarize


def test_summary_of_a_tight_distribution():
    samples = 100 + np.random.default_rng(1).normal(0, 1, 500)
    s = summarize(samples)
    assert s.n == 500
    assert s.ci_low_us <= s.median_us <= s.ci_high_us
    assert s.p10_us < s.median_us < s.p90_us
    assert 99 < s.median_us < 101
    assert not s.unstable


def test_wide_or_short_samples_are_flagged_unstable():
    assert summarize(np.r_[np.full(50, 10.0), np.full(50, 40.0)]).unstable
    assert summarize([10.0, 10.1, 9.9]).unstable


def test_median_interval_covers_the_true_median_about_95_percent():
    rng = np.random.default_rng(2)
    hits = 0
    for _ in range(400):
        s = summarize(rng.exponential(1.0, 101))
        hits += s.ci_low_us <= np.log(2) <= s.ci_high_us
    assert 0.90 <= hits / 400 <= 0.995


def test_ci_ranks_stay_in_bounds():
    assert median_ci_ranks(1) == (0, 0)
    low, high = median_ci_ranks(100)
    assert 0 <= low < 50 < high <= 99


def test_empty_samples_raise():
    with pytest.raises(ValueError):
        summarize([])


def test_bandwidths():
    algbw, busbw = bandwidths(1_000_000, 1e-3, 1.5)
    assert algbw == pytest.approx(1.0) and busbw == pytest.approx(1.5)
