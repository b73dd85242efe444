import numpy as np
import pandas as pd

from arxtune.harness.winners import measured_winners, sustained


def _frame(rows):
    """rows: (nbytes, backend, median, ci_low, ci_high)."""
    return pd.DataFrame(rows, columns=["nbytes", "backend", "median_us", "ci_low_us", "ci_high_us"])


def _clear_win(nbytes, fast=True):
    base = (nbytes, "gloo", 100.0, 95.0, 105.0)
    other = (nbytes, "fast", 50.0, 45.0, 55.0) if fast else (nbytes, "fast", 150.0, 140.0, 160.0)
    return [base, other]


def test_a_sustained_win_displaces_the_baseline():
    frame = _frame(_clear_win(1024) + _clear_win(2048) + _clear_win(4096, fast=False))
    assert measured_winners(frame, "gloo", 0.05) == [(1024, "fast"), (2048, "fast"), (4096, "gloo")]


def test_a_lone_win_is_noise():
    frame = _frame(_clear_win(1024, fast=False) + _clear_win(2048) + _clear_win(4096, fast=False))
    assert [b for _, b in measured_winners(frame, "gloo", 0.05)] == ["gloo"] * 3
    assert [b for _, b in measured_winners(frame, "gloo", 0.05, min_run=1)] == ["gloo", "fast", "gloo"]


def test_within_the_margin_keeps_the_baseline():
    rows = [(n, "gloo", 100.0, 99.0, 101.0) for n in (1024, 2048)] + [(n, "fast", 96.0, 95.0, 97.0) for n in (1024, 2048)]
    assert {b for _, b in measured_winners(_frame(rows), "gloo", 0.05)} == {"gloo"}
    assert {b for _, b in measured_winners(_frame(rows), "gloo", 0.01)} == {"fast"}


def test_overlapping_round_spreads_keep_the_baseline():
    rows = [(n, "gloo", 100.0, 70.0, 130.0) for n in (1024, 2048)] + [(n, "fast", 80.0, 60.0, 100.0) for n in (1024, 2048)]
    assert {b for _, b in measured_winners(_frame(rows), "gloo", 0.05)} == {"gloo"}


def test_without_a_baseline_result_the_fastest_serves_even_alone():
    frame = _frame(_clear_win(1024, fast=False) + [(2048, "fast", 150.0, 140.0, 160.0)] + _clear_win(4096, fast=False))
    assert [b for _, b in measured_winners(frame, "gloo", 0.05)] == ["gloo", "fast", "gloo"]


def test_sustained_keeps_runs_long_enough():
    assert sustained(["b", "a", "a", "b", "c"], "b", set()) == ["b", "a", "a", "b", "b"]


def test_one_noisy_size_does_not_cut_a_sustained_win_in_two():
    noisy = [(4096, "gloo", 100.0, 95.0, 105.0), (4096, "fast", 50.0, 45.0, 400.0)]  # one bad round: intervals overlap
    frame = _frame(_clear_win(1024) + _clear_win(2048) + noisy + _clear_win(8192) + _clear_win(16384))
    assert [b for _, b in measured_winners(frame, "gloo", 0.05)] == ["fast"] * 5
    # Not where the baseline is as fast there, nor at the ends of the grid, nor across two noisy sizes.
    tie = [(4096, "gloo", 100.0, 95.0, 105.0), (4096, "fast", 98.0, 45.0, 400.0)]
    frame = _frame(_clear_win(1024) + _clear_win(2048) + tie + _clear_win(8192) + _clear_win(16384))
    assert [b for _, b in measured_winners(frame, "gloo", 0.05)] == ["fast", "fast", "gloo", "fast", "fast"]
    frame = _frame([(512, "gloo", 100.0, 95.0, 105.0), (512, "fast", 50.0, 45.0, 400.0)] + _clear_win(1024) + _clear_win(2048))
    assert [b for _, b in measured_winners(frame, "gloo", 0.05)] == ["gloo", "fast", "fast"]
    twice = [(n, "gloo", 100.0, 95.0, 105.0) for n in (4096, 8192)] + [(n, "fast", 50.0, 45.0, 400.0) for n in (4096, 8192)]
    frame = _frame(_clear_win(1024) + _clear_win(2048) + twice + _clear_win(16384) + _clear_win(32768))
    assert [b for _, b in measured_winners(frame, "gloo", 0.05)] == ["fast", "fast", "gloo", "gloo", "fast", "fast"]


def test_bridged_leaves_runs_it_does_not_sit_between():
    from arxtune.harness.winners import bridged

    everywhere = [{"a", "b"}] * 5
    assert bridged(["a", "gloo", "b", "b", "b"], "gloo", everywhere) == ["a", "gloo", "b", "b", "b"]
    assert bridged(["a", "a", "gloo", "a", "a"], "gloo", everywhere) == ["a"] * 5
    assert bridged(["a", "a", "gloo", "a", "a"], "gloo", everywhere, min_run=1) == ["a", "a", "gloo", "a", "a"]


def _paired(nbytes, base_rounds, fast_rounds):
    """Two points at one size with their round medians (pooled median: the median of the rounds)."""

    def row(name, rounds):
        return {
            "nbytes": nbytes,
            "backend": name,
            "median_us": float(np.median(rounds)),
            "ci_low_us": min(rounds),
            "ci_high_us": max(rounds),
            "round_medians_us": tuple(rounds),
        }

    return [row("gloo", base_rounds), row("fast", fast_rounds)]


def test_a_win_in_most_rounds_displaces_the_baseline_despite_bad_rounds():
    # 'fast' is 5-10x faster in most of 15 rounds (5 and 10 extra); in a few a descheduled rank made it slower.
    good, bad = [90, 100, 300, 90, 95] * 3, [3400, 3500]
    rows = _paired(1024, [800, 700, 3000, 3000, 600] * 3, bad + good[2:])
    rows += _paired(2048, [3600, 600, 700, 3900, 800] * 3, good[:10] + bad + good[12:])
    assert [b for _, b in measured_winners(pd.DataFrame(rows), "gloo", 0.05)] == ["fast", "fast"]


def test_a_win_in_three_or_four_rounds_of_five_is_not_yet_clear_and_asks_for_more_rounds():
    from arxtune.runtime.faster import PointTimes, clearly_faster, rounds_needed, undecided

    base = PointTimes.from_rounds([[800], [700], [3000], [3000], [600]])
    four = PointTimes.from_rounds([[3400], [90], [100], [300], [90]])
    assert not clearly_faster(four, base, 0.05) and undecided(four, base, 0.05)
    fast = PointTimes.from_rounds([[3400], [90], [100], [3500], [90]])
    assert not clearly_faster(fast, base, 0.05) and undecided(fast, base, 0.05)
    # Ten more rounds like the good ones settle it; a tie that wins about half its rounds never wins.
    more = lambda t, extra: PointTimes.from_rounds([[m] for m in t.round_medians_us] + [[extra]] * 10)  # noqa: E731
    assert clearly_faster(more(fast, 90.0), more(base, 700.0), 0.05)
    tie = PointTimes.from_rounds([[90.0 if k % 2 else 110.0] for k in range(20)])
    assert not clearly_faster(tie, PointTimes.from_rounds([[100.0]] * 20), 0.05)
    assert [rounds_needed(n) for n in (2, 4, 5, 10, 15, 20)] == [2, 4, 5, 8, 11, 14]


def test_clear_wins_and_clear_losses_are_decided():
    from arxtune.runtime.faster import PointTimes, undecided

    base = PointTimes.from_rounds([[100.0]] * 5)
    assert not undecided(PointTimes.from_rounds([[50.0]] * 5), base, 0.05)
    assert not undecided(PointTimes.from_rounds([[150.0]] * 5), base, 0.05)
    assert undecided(PointTimes.from_rounds([[96.0]] * 5), base, 0.05)  # right at the margin's edge


def test_a_win_in_a_minority_of_rounds_keeps_the_baseline():
    rows = _paired(1024, [100, 100, 100, 100, 100], [50, 50, 120, 120, 120])
    rows += _paired(2048, [100, 100, 100, 100, 100], [50, 50, 120, 120, 120])
    for row in rows[1::2]:
        row["median_us"] = 60.0  # pooled over rounds of unequal length, the median alone would say 'fast'
    assert {b for _, b in measured_winners(pd.DataFrame(rows), "gloo", 0.05)} == {"gloo"}
    for row in rows[1::2]:
        row["round_medians_us"] = (50, 50, 50, 120, 120)  # three of five: not enough to be sure
    assert {b for _, b in measured_winners(pd.DataFrame(rows), "gloo", 0.05)} == {"gloo"}
    for row in rows[1::2]:
        row["round_medians_us"] = (50, 50, 50, 50, 50)
    assert {b for _, b in measured_winners(pd.DataFrame(rows), "gloo", 0.05)} == {"fast"}


def test_round_ratios_within_the_margin_keep_the_baseline():
    from arxtune.harness.winners import clearly_faster

    base, fast = (pd.Series(r) for r in _paired(1024, [100, 110, 90, 100, 105], [97, 106, 86, 96, 101]))
    assert not clearly_faster(fast, base, 0.05) and clearly_faster(fast, base, 0.01)


def test_rounds_that_do_not_pair_fall_back_to_the_intervals():
    from arxtune.harness.winners import clearly_faster

    base, fast = (pd.Series(r) for r in _paired(1024, [100, 100, 100, 100, 100], [50, 50, 50, 150]))
    assert not clearly_faster(fast, base, 0.05)  # four rounds against five: 150 > 100 overlaps
    base, fast = (pd.Series(r) for r in _paired(1024, [100, 100, 100, 100, 100], [50, 50, 50, 60]))
    assert clearly_faster(fast, base, 0.05)
