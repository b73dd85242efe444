import numpy as np
import pytest

from arxtune.harness.stats import bandwidths, median_ci_ranks, summarize


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


def test_interval_is_the_spread_of_round_medians():
    rounds = [np.full(20, 10.0), np.full(20, 12.0), np.full(20, 11.0)]
    s = summarize(np.concatenate(rounds), (20, 20, 20))
    assert s.rounds == 3 and (s.ci_low_us, s.ci_high_us) == (10.0, 12.0) and s.median_us == 11.0


def test_drift_between_rounds_widens_the_interval_beyond_one_block():
    rng = np.random.default_rng(3)
    rounds = [level + rng.normal(0, 0.1, 50) for level in (10.0, 11.0, 10.0, 11.0, 10.5)]
    pooled = summarize(np.concatenate(rounds))
    by_round = summarize(np.concatenate(rounds), (50,) * 5)
    assert by_round.ci_high_us - by_round.ci_low_us > 2 * (pooled.ci_high_us - pooled.ci_low_us)


def test_p99_sits_above_p90():
    s = summarize(np.arange(1000.0))
    assert s.p90_us < s.p99_us == pytest.approx(989.01)


def test_round_lengths_must_add_up():
    with pytest.raises(ValueError, match="do not add up"):
        summarize([1.0, 2.0, 3.0], (1, 1))
