import math

import numpy as np
import pytest

from arxtune.calibrate import calibrate, fit_alpha_beta
from arxtune.errors import ArxtuneError
from arxtune.thresholds import Lookup

from helpers.runs import make_run

import torch


def _measured_winners(thresholds):
    return {r.backend for r in thresholds.tables[0].ranges if r.source == "measured"}


def test_fast_backend_wins_small_sizes_and_the_boundary_is_geometric(crossover_run):
    t = calibrate(crossover_run)
    table = t.table("all_reduce", "float32", 2)
    measured = [r for r in table.ranges if r.source == "measured"]
    assert [r.backend for r in measured] == ["fast", "gloo"]
    # fast: 5 + n/1000, gloo: 50 + n/4000 -> equal at n = 60000; with a 5% margin fast stops winning
    # just below that; the boundary must sit at the geometric midpoint of 32 KiB and 64 KiB.
    boundary = measured[0].hi
    assert boundary == math.ceil(math.sqrt(32768 * 65536))
    lookup = Lookup(t, 2)
    assert lookup.choose("all_reduce", torch.float32, 1024) == "fast"
    assert lookup.choose("all_reduce", torch.float32, boundary - 1) == "fast"
    assert lookup.choose("all_reduce", torch.float32, boundary) == "gloo"  # lower bound inclusive


def test_margin_keeps_the_baseline_when_the_gain_is_small(tmp_path):
    run = make_run(tmp_path, lambda b, n: 100.0 if b == "gloo" else 97.0, [1024, 2048, 4096], spread=0.001)
    assert _measured_winners(calibrate(run, margin=0.05)) == {"gloo"}
    assert _measured_winners(calibrate(run, margin=0.01)) == {"fast"}


def test_overlapping_intervals_keep_the_baseline(tmp_path):
    run = make_run(tmp_path, lambda b, n: 100.0 if b == "gloo" else 80.0, [1024, 2048], spread=0.6, n=20)
    thresholds = calibrate(run, margin=0.0)
    assert {r.backend for r in thresholds.tables[0].ranges} == {"gloo"}  # nor does the model pick 'fast' beyond the grid


def test_a_wrong_result_never_wins(tmp_path):
    run = make_run(tmp_path, lambda b, n: 100.0 if b == "gloo" else 10.0, [1024, 2048, 4096, 8192, 16384],
                   statuses={("fast", 4096): "wrong"})
    ranges = [r for r in calibrate(run).tables[0].ranges if r.source == "measured"]
    assert [r.backend for r in ranges] == ["fast", "gloo", "fast"]


def test_without_a_baseline_point_the_fastest_correct_backend_wins(tmp_path):
    run = make_run(tmp_path, lambda b, n: 100.0 if b == "gloo" else 50.0, [1024, 2048], statuses={("gloo", 2048): "error"})
    measured = [r for r in calibrate(run).tables[0].ranges if r.source == "measured"]
    assert measured[-1].backend == "fast"


def test_alpha_beta_fit_recovers_the_model():
    nbytes = np.array([1 << k for k in range(10, 24)], dtype=float)
    alpha, bw = fit_alpha_beta(nbytes, 12.0 + nbytes / (25.0 * 1e3))
    assert alpha == pytest.approx(12.0, rel=1e-6) and bw == pytest.approx(25.0, rel=1e-6)
    assert fit_alpha_beta(nbytes[:1], np.array([1.0])) is None


def test_sizes_beyond_the_grid_follow_the_models(crossover_run):
    t = calibrate(crossover_run)
    table = t.table("all_reduce", "float32", 2)
    assert table.ranges[0].lo == 0 and table.ranges[-1].hi is None
    assert table.ranges[-1].source == "model" and table.ranges[-1].backend == "gloo"
    assert {m.backend for m in t.models} == {"gloo", "fast"}
    lookup = Lookup(t, 2)
    assert lookup.choose("all_reduce", torch.float32, 1 << 30) == "gloo"
    assert lookup.choose("all_reduce", torch.float32, 8) == "fast"


def test_provenance_names_the_run(crossover_run):
    p = calibrate(crossover_run).provenance
    assert p["run_id"] == "fixture" and p["world_size"] == 2 and p["hostnames"] == ["a", "b"]


def test_a_run_with_nothing_correct_is_an_error(tmp_path):
    run = make_run(tmp_path, lambda b, n: 1.0, [1024], backends=("gloo",), statuses={("gloo", 1024): "wrong"})
    with pytest.raises(ArxtuneError, match="no correct"):
        calibrate(run)


def test_only_the_asked_mode_is_calibrated(tmp_path):
    """Eager and graph disagree: each mode's table follows its own points."""
    run = make_run(tmp_path, lambda b, n: 100.0 if b == "gloo" else 200.0, [1024, 2048, 4096], spread=0.001,
                   graph_latency=lambda b, n: 100.0 if b == "gloo" else 20.0)
    assert {r.backend for r in calibrate(run, mode="eager").tables[0].ranges} == {"gloo"}
    assert _measured_winners(calibrate(run, mode="graph")) == {"fast"}


def test_the_fastest_of_several_winners_wins(tmp_path):
    speeds = {"gloo": 100.0, "fast": 50.0, "faster": 20.0, "quick": 35.0}
    run = make_run(tmp_path, lambda b, n: speeds[b], [1024, 2048], backends=tuple(speeds), spread=0.001)
    assert _measured_winners(calibrate(run)) == {"faster"}
    without_baseline = make_run(tmp_path / "b", lambda b, n: speeds[b], [1024], backends=("fast", "faster", "quick"), spread=0.001)
    assert _measured_winners(calibrate(without_baseline)) == {"faster"}


def test_the_margin_decides_beyond_the_grid_too(tmp_path):
    """'fast' wins every measured size by more than the margin; at the next size its model is faster
    than gloo's by less than the margin (70 vs 100 us), so gloo keeps that size."""
    run = make_run(tmp_path, lambda b, n: 100.0 if b == "gloo" else 10.0 + 30.0 * n / 4096, [1024, 2048, 4096], spread=0.001)
    strict, loose = calibrate(run, margin=0.5), calibrate(run, margin=0.0)
    assert _measured_winners(strict) == _measured_winners(loose) == {"fast"}
    assert Lookup(strict, 2).choose("all_reduce", torch.float32, 8192) == "gloo"
    assert Lookup(loose, 2).choose("all_reduce", torch.float32, 8192) == "fast"


@pytest.mark.parametrize("kwargs, needle", [
    ({"margin": float("nan")}, "--margin must be a number"),
    ({"margin": -0.1}, "--margin must be a number"),
    ({"baseline": "unknown"}, "baseline 'unknown' was not measured"),
    ({"mode": "lazy"}, "unknown mode"),
])
def test_bad_calibration_settings_are_refused(crossover_run, kwargs, needle):
    with pytest.raises(ArxtuneError, match=needle):
        calibrate(crossover_run, **kwargs)


def test_the_fit_ignores_samples_that_are_not_times():
    nbytes = np.array([1024.0, 2048.0, 4096.0, 8192.0])
    alpha, bw = fit_alpha_beta(nbytes, np.array([np.nan, 0.0, 12.0 + 4096 / 25e3, 12.0 + 8192 / 25e3]))
    assert alpha == pytest.approx(12.0, rel=1e-6) and bw == pytest.approx(25.0, rel=1e-6)
    assert fit_alpha_beta(nbytes, np.array([np.inf, 0.0, np.nan, 5.0])) is None
