"""The start-up ladder's pure parts: what it probes, who wins, where a boundary goes, the run it writes."""

from __future__ import annotations

import json

import pytest
import torch

from arxtune.runtime import env, ladder
from arxtune.runtime.faster import PointTimes, clearly_faster
from arxtune.runtime.ladder import Boundary, Judged, Measured, adjusted, boundaries, judge, move_boundary, placed, probe_sizes, winner
from arxtune.runtime.thresholds import Range, Table, Thresholds, validate_ranges

KiB = 1024


def _table(*ranges, op="all_reduce", dtype="float32", world=2, mode="eager"):
    return Table(op, dtype, world, tuple(Range(lo, hi, b) for lo, hi, b in ranges), mode)


def _ok(name, median, rounds=4, jitter=0.0):
    return Measured(name, "ok", [[median * (1 + jitter * (r % 2))] * 3 for r in range(rounds)])


def test_boundaries_are_the_hand_overs_between_different_backends():
    t = _table((0, 8 * KiB, "arx"), (8 * KiB, 64 * KiB, "gloo"), (64 * KiB, None, "nccl"))
    found = boundaries([t])
    assert [(b.at, b.below, b.above, b.lo, b.hi) for b in found] == [
        (8 * KiB, "arx", "gloo", 0, 64 * KiB),
        (64 * KiB, "gloo", "nccl", 8 * KiB, None),
    ]
    assert boundaries([_table((0, None, "gloo"))]) == []


def test_probe_sizes_sit_either_side_of_the_boundary_within_its_two_ranges():
    b = Boundary("eager", "all_reduce", "float32", 8 * KiB, "arx", "gloo", 0, 64 * KiB)
    assert probe_sizes(b, "all_reduce", 2, 4) == [4 * KiB, 8 * KiB, 16 * KiB]
    assert [b.choice(s) for s in probe_sizes(b, "all_reduce", 2, 4)] == ["arx", "gloo", "gloo"]
    # the range above ends at 12 KiB: 16 KiB belongs to a third backend and is not probed
    tight = Boundary("eager", "all_reduce", "float32", 8 * KiB, "arx", "gloo", 6 * KiB, 12 * KiB)
    assert probe_sizes(tight, "all_reduce", 2, 4) == [8 * KiB]
    # all_gather is sized by the gathered bytes: whole elements per rank of 3 ranks
    odd = Boundary("eager", "all_gather", "float32", 8 * KiB, "arx", "gloo", 0, None)
    assert all(s % (3 * 4) == 0 for s in probe_sizes(odd, "all_gather", 3, 4))


def test_the_shared_rule_needs_the_margin_in_the_median_and_the_paired_rounds():
    base = PointTimes.from_rounds([[10.0, 10.0]] * 4)
    assert clearly_faster(PointTimes.from_rounds([[5.0, 5.0]] * 4), base, 0.05)
    assert not clearly_faster(PointTimes.from_rounds([[9.8, 9.8]] * 4), base, 0.05)  # within the margin: a tie
    # faster pooled, but slower in most paired rounds: no clear win
    assert not clearly_faster(PointTimes.from_rounds([[1.0], [1.0], [20.0], [20.0], [20.0]]), PointTimes.from_rounds([[10.0]] * 5), 0.05)


def test_the_file_keeps_a_size_unless_the_other_side_clearly_wins_or_it_fails():
    assert winner("a", ["b"], {"a": _ok("a", 10), "b": _ok("b", 9.9)}, 0.05) == "a"
    assert winner("a", ["b"], {"a": _ok("a", 10), "b": _ok("b", 2)}, 0.05) == "b"
    assert winner("a", ["b"], {"a": Measured("a", "wrong", error="wrong result"), "b": _ok("b", 50)}, 0.05) == "b"
    assert winner("a", ["b"], {"a": _ok("a", 50), "b": Measured("b", "error", error="TimeoutError")}, 0.05) == "a"


def test_a_boundary_goes_between_the_last_lower_win_and_the_first_upper_win():
    s = [4 * KiB, 8 * KiB, 16 * KiB]
    assert placed(s, ["a", "b", "b"], "a", "b") == 5793  # held where it was probed: midpoint of 4 and 8 KiB
    assert placed(s, ["a", "a", "b"], "a", "b") == 11586  # up, between 8 and 16 KiB
    assert placed(s, ["b", "b", "b"], "a", "b") == 2897  # below every probe: one step under
    assert placed(s, ["a", "a", "a"], "a", "b") == 23171  # above every probe: one step over
    assert placed(s, ["b", "a", "b"], "a", "b") is None  # interleaved: no clear place


def test_judging_a_boundary():
    b = Boundary("eager", "all_reduce", "float32", 8 * KiB, "slow", "gloo", 0, None)
    sizes = [4 * KiB, 8 * KiB, 16 * KiB]
    held = {s: {"slow": _ok("slow", 10), "gloo": _ok("gloo", 30)} for s in sizes[:1]}
    held.update({s: {"slow": _ok("slow", 30), "gloo": _ok("gloo", 10)} for s in sizes[1:]})
    assert judge(b, sizes, held, 0.05).verdict == "held"
    wrong = {s: {"slow": _ok("slow", 20000), "gloo": _ok("gloo", 300)} for s in sizes}
    j = judge(b, sizes, wrong, 0.05)
    assert (j.verdict, j.new) == ("moved", 2897)
    assert "4KiB: slow 20000.0 us, gloo 300.0 us" in j.evidence
    assert judge(b, sizes, {}, 0.05).verdict == "not judged"


def test_moving_a_boundary_keeps_the_table_whole():
    ranges = (Range(0, 8 * KiB, "a"), Range(8 * KiB, 64 * KiB, "b"), Range(64 * KiB, None, "c"))
    down = move_boundary(ranges, 8 * KiB, 3 * KiB)
    assert down == (Range(0, 3 * KiB, "a"), Range(3 * KiB, 64 * KiB, "b"), Range(64 * KiB, None, "c"))
    gone = move_boundary(ranges, 8 * KiB, 100 * KiB)  # past the next boundary: b's range empties
    assert gone == (Range(0, 64 * KiB, "a"), Range(64 * KiB, None, "c"))
    assert move_boundary(ranges, 5, 1) == ranges  # no hand-over there
    for moved in (down, gone, move_boundary(ranges, 64 * KiB, 0)):
        validate_ranges(moved, "table", "test")


def test_adjusted_moves_only_the_judged_table_of_this_world():
    t2, t3 = _table((0, 8 * KiB, "a"), (8 * KiB, None, "b")), _table((0, 8 * KiB, "a"), (8 * KiB, None, "b"), world=3)
    file = Thresholds("b", 0.05, {}, (t2, t3))
    j = Judged(boundaries([t2])[0], "moved", 2 * KiB)
    out = adjusted(file, [j], 2)
    assert out.table("all_reduce", "float32", 2).ranges[0].hi == 2 * KiB
    assert out.table("all_reduce", "float32", 3).ranges == t3.ranges


def test_bad_policy_and_budget_values_warn_and_use_the_defaults(monkeypatch, caplog):
    monkeypatch.setenv(env.BOOT.name, "sometimes")
    monkeypatch.setenv(env.BOOT_BUDGET_S.name, "soon")
    assert ladder.policy() == "check" and ladder.budget_s() == 1.0
    assert "ARXTUNE_BOOT='sometimes'" in caplog.text and "ARXTUNE_BOOT_BUDGET_S='soon'" in caplog.text
    monkeypatch.setenv(env.BOOT.name, "ADJUST")
    assert ladder.policy() == "adjust"


class _Prober:
    def __init__(self, points):
        self.points = points


def test_the_ladder_run_reads_back_with_the_harness(tmp_path, monkeypatch):
    from arxtune.harness.results import load_run

    monkeypatch.setenv(env.BOOT_OUT.name, str(tmp_path))
    ctx = type("Ctx", (), {"world_size": 2, "device": torch.device("cpu")})()
    points = {
        ("gloo", "all_reduce", "float32", "eager", 4096): _ok("gloo", 30.0),
        ("slow", "all_reduce", "float32", "eager", 4096): Measured("slow", "error", error="TimeoutError: gave up"),
    }
    path = ladder.write_run(ctx, _Prober(points), "gloo", "2026-12-07T00:00:00+00:00", {"gloo": {"available": True, "reason": ""}}, "check")  # type: ignore[arg-type]
    run = load_run(path)
    assert run.meta.baseline == "gloo" and run.meta.world_size == 2 and run.meta.finished
    frame = run.frame()
    ok = frame[frame.backend == "gloo"].iloc[0]
    assert ok.median_us == pytest.approx(30.0) and ok.rounds == 4
    assert frame[frame.backend == "slow"].iloc[0].status == "error"
    assert json.loads((tmp_path / run.meta.run_id / "meta.json").read_text())["command"].startswith("start-up ladder")


def test_a_run_that_cannot_be_written_is_a_warning(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(env.BOOT_OUT.name, str(blocker))
    ctx = type("Ctx", (), {"world_size": 2, "device": torch.device("cpu")})()
    points = {("gloo", "all_reduce", "float32", "eager", 4096): _ok("gloo", 30.0)}
    assert ladder.write_run(ctx, _Prober(points), "gloo", "", {}, "check") == ""  # type: ignore[arg-type]
    assert "cannot write its run" in caplog.text


class _Sleeps:
    """A correct world-of-one all_reduce that takes `seconds` a call."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def all_reduce(self, inp, out):
        import time

        time.sleep(self.seconds)
        out.copy_(inp)


@pytest.mark.parametrize("challenger_s,extra", [(0.00096, True), (0.0002, False)])
def test_the_ladder_adds_rounds_only_where_the_two_sides_are_close(challenger_s, extra):
    import torch.distributed as dist

    from arxtune.runtime.backends import GroupContext

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ctx = GroupContext(0, 1, 0, torch.device("cpu"), dist.group.WORLD)
        prober = ladder.Prober(ctx, {"x": _Sleeps(0.001), "y": _Sleeps(challenger_s)}, budget=10.0)  # type: ignore[dict-item]
        got = prober.measure(["x", "y"], "all_reduce", "float32", "eager", 4 * KiB, 1.0, incumbent="x")
    finally:
        dist.destroy_process_group()
    # 4% apart, at the margin's edge: every extra round; 5x apart: the first rounds settle it, and y wins.
    want = ladder.ROUNDS + (ladder.MAX_EXTRA_ROUNDS if extra else 0)
    assert [len(got[n].rounds) for n in ("x", "y")] == [want, want]
    assert winner("x", ["y"], got, 0.05) == ("x" if extra else "y")


def test_a_candidate_that_would_import_a_framework_is_left_out_unless_named(monkeypatch):
    import importlib.machinery
    import importlib.util
    import sys

    from arxtune.runtime.ladder import within_reach

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    real = importlib.util.find_spec
    installed = importlib.machinery.ModuleSpec("vllm", None, origin="/site-packages/vllm/__init__.py")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: installed if name == "vllm" else real(name, *a))
    assert within_reach(("vllm_cpu", "mine"), set()) == (("mine",), {"vllm_cpu": "vllm"})
    assert within_reach(("vllm_cpu", "mine"), {"vllm_cpu"}) == (("vllm_cpu", "mine"), {})  # the file or a variable names it
    monkeypatch.setitem(sys.modules, "vllm", object())
    assert within_reach(("vllm_cpu",), set()) == (("vllm_cpu",), {})  # already imported: no cost
    monkeypatch.delitem(sys.modules, "vllm")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert within_reach(("vllm_cpu",), set()) == (("vllm_cpu",), {})  # not installed: it fails to open at once, and says so


def test_a_failed_side_makes_a_boundary_out_and_the_backend_failed():
    from arxtune.runtime.ladder import Boundary, Measured, judge

    b = Boundary("eager", "all_reduce", "float32", 64 * 1024, "wrongly", "gloo", 0, None)
    good = Measured("gloo", "ok", [[1.0], [1.0]])
    points = {32 * 1024: {"wrongly": Measured("wrongly", "wrong", [], "rank 1: wrong result: 1 of 8 elements wrong"), "gloo": good}}
    assert judge(b, [32 * 1024], points, 0.05).verdict == "out"
