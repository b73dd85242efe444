import math

import numpy as np
import pytest

from arxtune.harness.calibrate import calibrate, fit_alpha_beta
from arxtune.runtime.errors import ArxtuneError

from helpers.routes import FileRoutes
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
    lookup = FileRoutes(t, 2)
    assert lookup.choose("all_reduce", torch.float32, 1024) == "fast"
    assert lookup.choose("all_reduce", torch.float32, boundary - 1) == "fast"
    assert lookup.choose("all_reduce", torch.float32, boundary) == "gloo"  # lower bound inclusive


def test_margin_keeps_the_baseline_when_the_gain_is_small(tmp_path):
    run = make_run(tmp_path, lambda b, n: 100.0 if b == "gloo" else 97.0, [1024, 2048, 4096], spread=0.001)
    assert _measured_winners(calibrate(run, margin=0.05)) == {"gloo"}
    assert _measured_winners(calibrate(run, margin=0.01)) == {"fast"}


def test_without_paired_rounds_overlapping_intervals_keep_the_baseline(tmp_path):
    run = make_run(tmp_path, lambda b, n: 100.0 if b == "gloo" else 80.0, [1024, 2048], spread=0.6, n=20, rounds=1)
    thresholds = calibrate(run, margin=0.0)
    assert {r.backend for r in thresholds.tables[0].ranges} == {"gloo"}  # nor does the model pick 'fast' beyond the grid


def test_a_wrong_result_never_wins(tmp_path):
    run = make_run(
        tmp_path, lambda b, n: 100.0 if b == "gloo" else 10.0, [1024, 2048, 4096, 8192, 16384], statuses={("fast", 4096): "wrong"}
    )
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
    lookup = FileRoutes(t, 2)
    assert lookup.choose("all_reduce", torch.float32, 1 << 30) == "gloo"
    assert lookup.choose("all_reduce", torch.float32, 8) == "fast"


def test_provenance_names_the_run_and_its_fingerprint(crossover_run):
    t = calibrate(crossover_run)
    assert t.provenance["runs"] == ["fixture"] and t.provenance["views"] == {"fixture": {"eager": "eager"}}
    (source,) = t.runs
    assert source.run_id == "fixture" and source.fingerprint.world_size == 2 and source.fingerprint.hostnames == ("a", "b")
    assert {(tb.mode, tb.run_id, tb.view) for tb in t.tables} == {("eager", "fixture", "eager")}


def test_a_run_with_nothing_correct_is_an_error(tmp_path):
    run = make_run(tmp_path, lambda b, n: 1.0, [1024], backends=("gloo",), statuses={("gloo", 1024): "wrong"})
    with pytest.raises(ArxtuneError, match="no correct"):
        calibrate(run)


def test_only_the_asked_mode_is_calibrated(tmp_path):
    """Eager and graph disagree: each mode's table follows its own points."""
    run = make_run(
        tmp_path,
        lambda b, n: 100.0 if b == "gloo" else 200.0,
        [1024, 2048, 4096],
        spread=0.001,
        graph_latency=lambda b, n: 100.0 if b == "gloo" else 20.0,
    )
    t = calibrate(run)
    assert {r.backend for r in t.table("all_reduce", "float32", 2, mode="eager").ranges} == {"gloo"}
    assert {r.backend for r in t.table("all_reduce", "float32", 2, mode="graph").ranges if r.source == "measured"} == {"fast"}


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
    assert FileRoutes(strict, 2).choose("all_reduce", torch.float32, 8192) == "gloo"
    assert FileRoutes(loose, 2).choose("all_reduce", torch.float32, 8192) == "fast"


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"margin": float("nan")}, "--margin must be a number"),
        ({"margin": -0.1}, "--margin must be a number"),
        ({"baseline": "unknown"}, "baseline 'unknown' was not measured"),
        ({"views": {"lazy": "eager"}}, "unknown runtime mode"),
        ({"views": {"graph": "eager"}}, "graph table can be fed by the graph timing view"),
    ],
)
def test_bad_calibration_settings_are_refused(crossover_run, kwargs, needle):
    with pytest.raises(ArxtuneError, match=needle):
        calibrate(crossover_run, **kwargs)


def test_the_fit_ignores_samples_that_are_not_times():
    nbytes = np.array([1024.0, 2048.0, 4096.0, 8192.0])
    alpha, bw = fit_alpha_beta(nbytes, np.array([np.nan, 0.0, 12.0 + 4096 / 25e3, 12.0 + 8192 / 25e3]))
    assert alpha == pytest.approx(12.0, rel=1e-6) and bw == pytest.approx(25.0, rel=1e-6)
    assert fit_alpha_beta(nbytes, np.array([np.inf, 0.0, np.nan, 5.0])) is None


def _crossover(crossover_at):
    """'fast' wins below about `crossover_at` bytes, gloo above."""
    return lambda b, n, *mode: 5 + n / 1000 if b == "fast" else 5 + crossover_at / 1000


SIZES = [1 << k for k in range(10, 21)]


def test_runs_of_two_world_sizes_merge_into_one_file(tmp_path):
    w2 = make_run(tmp_path, _crossover(8192), SIZES, world=2, run_id="w2")
    w3 = make_run(tmp_path, _crossover(65536), SIZES, world=3, run_id="w3")
    t = calibrate([w2, w3])
    assert t.world_sizes == {2, 3} and [r.run_id for r in t.runs] == ["w2", "w3"]
    assert FileRoutes(t, 2).choose("all_reduce", torch.float32, 32768) == "gloo"
    assert FileRoutes(t, 3).choose("all_reduce", torch.float32, 32768) == "fast"
    assert t.table("all_reduce", "float32", 3).run_id == "w3"


def test_eager_and_graph_tables_from_one_run(tmp_path):
    def latency(b, n, mode, op):  # in graphs 'fast' wins everywhere; eagerly only small sizes
        return 1.0 if (b == "fast" and mode == "graph") else _crossover(8192)(b, n)

    t = calibrate(make_run(tmp_path, latency, SIZES, views=("eager", "graph")))
    assert {tb.mode for tb in t.tables} == {"eager", "graph"}
    assert FileRoutes(t, 2, mode="graph").choose("all_reduce", torch.float32, 1 << 19) == "fast"
    assert FileRoutes(t, 2, mode="eager").choose("all_reduce", torch.float32, 1 << 19) == "gloo"
    assert {m.mode for m in t.models} == {"eager", "graph"}


def test_the_eager_table_can_come_from_another_view(tmp_path):
    def latency(b, n, mode, op):
        return 1.0 if (b == "fast" and mode == "isolated") else _crossover(8192)(b, n)

    run = make_run(tmp_path, latency, SIZES, views=("eager", "isolated"))
    default = calibrate(run)
    assert default.table("all_reduce", "float32", 2).view == "eager"
    isolated = calibrate(run, views={"eager": "isolated"})
    assert isolated.table("all_reduce", "float32", 2).view == "isolated"
    assert FileRoutes(isolated, 2).choose("all_reduce", torch.float32, 1 << 19) == "fast"


def test_a_run_with_the_decode_view_feeds_the_eager_table_from_it_and_the_file_says_so(tmp_path):
    from arxtune.runtime.thresholds import load

    def latency(b, n, mode, op):  # 'fast' wins behind a busy kernel only, as a proxy kept awake would
        return 1.0 if (b == "fast" and mode == "decode") else _crossover(8192)(b, n)

    run = make_run(tmp_path, latency, SIZES, views=("eager", "decode"))
    default = calibrate(run)
    assert default.table("all_reduce", "float32", 2).view == "decode"
    assert FileRoutes(default, 2).choose("all_reduce", torch.float32, 1 << 19) == "fast"
    back = load(default.save(tmp_path / "thresholds.json"))
    assert back.table("all_reduce", "float32", 2).view == "decode"
    assert calibrate(run, views={"eager": "eager"}).table("all_reduce", "float32", 2).view == "eager"
    with pytest.raises(ArxtuneError, match="the graph table can be fed by the graph timing view, not 'decode'"):
        calibrate(run, views={"graph": "decode"})


def test_the_same_key_twice_is_an_error_unless_one_run_is_preferred(tmp_path):
    first = make_run(tmp_path, _crossover(8192), SIZES, run_id="first")
    second = make_run(tmp_path, _crossover(65536), SIZES, run_id="second")
    with pytest.raises(
        ArxtuneError, match="runs first and second both measure all_reduce/float32 at world size 2 for eager; pass --prefer"
    ):
        calibrate([first, second])
    t = calibrate([first, second], prefer="second")
    assert t.table("all_reduce", "float32", 2).run_id == "second" and [r.run_id for r in t.runs] == ["second"]
    assert FileRoutes(t, 2).choose("all_reduce", torch.float32, 32768) == "fast"
    with pytest.raises(ArxtuneError, match="--prefer third is none of the runs"):
        calibrate([first, second], prefer="third")


def test_runs_from_different_clusters_need_a_preference(tmp_path):
    here = make_run(tmp_path, _crossover(8192), SIZES, run_id="here", device_names=["GB10", "GB10"])
    there = make_run(tmp_path, _crossover(8192), SIZES, world=3, run_id="there", device_names=["H200"] * 3)
    with pytest.raises(ArxtuneError, match="different clusters"):
        calibrate([here, there])
    assert calibrate([here, there], prefer="here").world_sizes == {2, 3}


def test_model_ranges_stop_at_the_backends_capacity(tmp_path):
    # 'fast' is faster everywhere, but was opened with 64 KiB of buffer for all_reduce.
    status = {"fast": {"options": {"max_bytes": 65536}, "capacity": {"all_reduce": 65536}}}
    run = make_run(
        tmp_path,
        lambda b, n: 1 + n / 1e5 if b == "fast" else 50 + n / 1e4,
        SIZES,
        statuses={("fast", s): "unsupported" for s in SIZES if s > 65536},
        status_extra=status,
    )
    t = calibrate(run)
    lookup = FileRoutes(t, 2)
    assert lookup.choose("all_reduce", torch.float32, 65536) == "fast"  # capacity is inclusive
    assert lookup.choose("all_reduce", torch.float32, 65537) == "gloo"
    assert lookup.choose("all_reduce", torch.float32, 1 << 30) == "gloo"
    assert t.backend_setup["fast"].options == {"max_bytes": 65536}


def test_different_backend_options_are_a_conflict(tmp_path):
    small = make_run(tmp_path, _crossover(8192), SIZES, run_id="small", status_extra={"fast": {"options": {"max_bytes": 4096}}})
    big = make_run(tmp_path, _crossover(8192), SIZES, world=3, run_id="big", status_extra={"fast": {"options": {"max_bytes": 8192}}})
    with pytest.raises(ArxtuneError, match="opened fast with different options"):
        calibrate([small, big])
    assert calibrate([small, big], prefer="big").backend_setup["fast"].options == {"max_bytes": 8192}


def _three_way(b, n):
    """'fast' beats 'quick', which beats gloo, at every size."""
    return {"fast": 10.0, "quick": 20.0}.get(b, 40.0)


def test_each_range_says_whether_its_backend_gave_the_baselines_bits(tmp_path):
    # 'fast' gave gloo's bits up to 64 KiB only; 'quick' everywhere.
    run = make_run(
        tmp_path,
        lambda b, n: (10.0 if n <= 65536 else 40.0) if b == "fast" else _three_way(b, n),
        SIZES,
        backends=("gloo", "fast", "quick"),
        bitwise=lambda b, n: b != "fast" or n <= 16384,
    )
    ranges = calibrate(run).table("all_reduce", "float32", 2).ranges
    measured = [(r.backend, r.bitwise) for r in ranges if r.source == "measured"]
    assert measured == [("fast", True), ("fast", False), ("quick", True)]
    # Beyond the grid a range claims the bits only where its backend gave them at every measured size.
    models = [(r.backend, r.bitwise) for r in ranges if r.source == "model"]
    assert models[0] == ("fast", False) and ("quick", True) in models


def test_invariant_tables_use_only_backends_that_gave_the_baselines_bits(tmp_path):
    run = make_run(tmp_path, _three_way, SIZES, backends=("gloo", "fast", "quick"), bitwise=lambda b, n: b != "fast")
    plain, invariant = calibrate(run), calibrate(run, invariant=True)
    assert {r.backend for r in plain.table("all_reduce", "float32", 2).ranges} == {"fast"}
    assert {(r.backend, r.bitwise) for r in invariant.table("all_reduce", "float32", 2).ranges} == {("quick", True)}
    assert invariant.provenance["invariant"] is True and plain.provenance["invariant"] is False
    vllm_own = lambda name: name.startswith("vllm_")  # noqa: E731
    assert plain.not_bitwise(2, vllm_own)[1] == "eager all_reduce/float32 [725B, 1.4MiB) -> fast"  # model, measured, model
    assert invariant.not_bitwise(2, vllm_own) == []


def test_invariant_sends_unchecked_and_unknown_ranges_to_the_baseline(tmp_path):
    # 'fast' was not checked at 1 KiB (unknown is not equal) and gave other bits from 512 KiB on.
    run = make_run(tmp_path, _three_way, SIZES, bitwise=lambda b, n: None if n == 1024 else (b == "gloo" or n < 1 << 19))
    ranges = calibrate(run, invariant=True).table("all_reduce", "float32", 2).ranges
    assert [(r.backend, r.source, r.bitwise) for r in ranges if r.source == "measured"] == [
        ("gloo", "measured", True),
        ("fast", "measured", True),
        ("gloo", "measured", True),
    ]
    assert all(r.backend == "gloo" for r in ranges if r.hi is None or r.lo >= 1 << 19)


def test_invariant_refuses_runs_without_the_bitwise_check(tmp_path):
    import json

    run = make_run(tmp_path, _three_way, SIZES)
    meta = json.loads((run.path / "meta.json").read_text())
    (run.path / "meta.json").write_text(json.dumps(meta | {"version": 3}))
    points = run.path / "points.csv"
    points.write_text("".join(line.rsplit(",", 1)[0] + "\n" for line in points.read_text().splitlines()))
    from arxtune.harness.results import load_run

    old = load_run(run.path)
    assert calibrate(old).table("all_reduce", "float32", 2).ranges[0].bitwise is None  # still calibrates: not known
    with pytest.raises(ArxtuneError, match="run fixture \\(results format 3\\) has no bitwise check.*sweep again"):
        calibrate(old, invariant=True)


def test_runs_of_three_world_sizes_merge_into_one_file_each_world_reads(tmp_path):
    """TP=2, 3 and 4 runs in one file: a group of each size gets its own tables; another size gets a reason."""
    from arxtune.runtime.dispatch import read_thresholds

    runs = [
        make_run(tmp_path, _crossover(crossover), SIZES, world=w, run_id=f"w{w}") for w, crossover in ((2, 4096), (3, 16384), (4, 65536))
    ]
    path = calibrate(runs).save(tmp_path / "thresholds.json")
    for world, fast_up_to in ((2, 4096), (3, 16384), (4, 65536)):
        thresholds, _, why = read_thresholds(world, path, torch.float32)
        assert not why
        routes = FileRoutes(thresholds, world)
        assert routes.choose("all_reduce", torch.float32, fast_up_to // 2) == "fast"
        assert routes.choose("all_reduce", torch.float32, 4 * fast_up_to) == "gloo"
    assert read_thresholds(8, path)[2] == f"{path} holds tables for world sizes [2, 3, 4], not 8"


def test_bits_checked_against_the_runs_baseline_say_nothing_against_another(tmp_path):
    run = make_run(tmp_path, _three_way, SIZES, backends=("gloo", "fast", "quick"), bitwise=lambda b, n: True)
    assert {r.bitwise for r in calibrate(run, baseline="quick").table("all_reduce", "float32", 2).ranges if r.backend != "quick"} == {None}
    with pytest.raises(ArxtuneError, match="checked bits against its baseline gloo, not quick; with --invariant keep --baseline gloo"):
        calibrate(run, baseline="quick", invariant=True)


def test_cli_calibrate_invariant_writes_a_file_of_bitwise_equal_ranges_and_refuses_an_old_run(tmp_path):
    import json

    from typer.testing import CliRunner

    from arxtune.cli import app
    from arxtune.runtime.thresholds import load

    run = make_run(tmp_path, _three_way, SIZES, backends=("gloo", "fast", "quick"), bitwise=lambda b, n: b != "fast")
    result = CliRunner().invoke(app, ["calibrate", str(run.path), "--invariant", "--out", str(tmp_path / "inv.json")])
    assert result.exit_code == 0, result.output
    written = load(tmp_path / "inv.json")
    assert written.provenance["invariant"] and written.backends == {"quick"} and written.not_bitwise(2, lambda n: False) == []
    meta = json.loads((run.path / "meta.json").read_text())
    (run.path / "meta.json").write_text(json.dumps(meta | {"version": 3}))
    points = run.path / "points.csv"
    points.write_text("".join(line.rsplit(",", 1)[0] + "\n" for line in points.read_text().splitlines()))
    result = CliRunner().invoke(app, ["calibrate", str(run.path), "--invariant", "--out", str(tmp_path / "old.json")])
    assert result.exit_code == 2 and "has no bitwise check" in result.output and not (tmp_path / "old.json").exists()
