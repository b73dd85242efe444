import pandas as pd

from arxtune.decision import measured_winners, sustained


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
