"""The runtime's router: overrides, mode tables, resolution, per-call picks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.router import Override, Router, mode_tables, overlay, parse_overrides, resolve
from arxtune.runtime.thresholds import Range, Table, Thresholds

TESTS = Path(__file__).parents[1]
KiB = 1024


def test_overrides_are_read_and_bad_ones_are_one_line():
    assert parse_overrides("all_reduce:0-64KiB=arx; all_gather/bfloat16@graph:1MiB-=nccl") == (
        Override("all_reduce", 0, 64 * KiB, "arx"),
        Override("all_gather", 1 << 20, None, "nccl", "bfloat16", "graph"),
    )
    assert parse_overrides("") == ()
    for bad, needle in [
        ("all_reduce=arx", "cannot read"),
        ("all_to_all:0-=arx", "unknown op"),
        ("all_reduce@prefill:0-=arx", "unknown op, dtype or mode"),
        ("all_reduce:8KiB-4KiB=arx", "empty range"),
        ("all_reduce:0-lots=arx", "cannot read size"),
    ]:
        with pytest.raises(ArxtuneError, match=needle):
            parse_overrides(bad)


def test_an_override_is_laid_over_the_calibrated_ranges():
    ranges = (Range(0, 4096, "arx"), Range(4096, None, "gloo"))
    assert overlay(ranges, 1000, 8192, "x") == (Range(0, 1000, "arx"), Range(1000, 8192, "x", "override"), Range(8192, None, "gloo"))
    assert overlay(ranges, 0, None, "x") == (Range(0, None, "x", "override"),)


def _file():
    return Thresholds(
        "gloo",
        0.05,
        {},
        (
            Table("all_reduce", "float32", 2, (Range(0, 4096, "arx"), Range(4096, None, "gloo")), "eager"),
            Table("all_gather", "float32", 2, (Range(0, None, "graphy"),), "graph"),
            Table("all_reduce", "float32", 4, (Range(0, None, "arx"),), "eager"),
        ),
    )


def test_a_missing_mode_borrows_the_other_and_says_so():
    tables, notes = mode_tables(_file(), 2)
    assert tables[("graph", "all_reduce", "float32")] == tables[("eager", "all_reduce", "float32")]
    assert tables[("eager", "all_gather", "float32")] == (Range(0, None, "graphy"),)
    assert notes == ["eager uses graph's table for 1 (op, dtype)", "graph uses eager's table for 1 (op, dtype)"]
    overridden, _ = mode_tables(_file(), 2, parse_overrides("all_reduce@graph:0-1KiB=x, reduce_scatter/int32:0-=y"))
    assert overridden[("graph", "all_reduce", "float32")][0] == Range(0, 1024, "x", "override")
    assert overridden[("eager", "all_reduce", "float32")][0] == Range(0, 4096, "arx")
    assert overridden[("eager", "reduce_scatter", "int32")] == (
        Range(0, None, "y", "override"),
    )  # no table: the baseline's, then the override


class Stub:
    def __init__(self, name, capturable=False, ops=("all_reduce", "all_gather", "reduce_scatter"), limit=None):
        self.name, self.capturable, self.ops, self.limit = name, capturable, ops, limit

    def supports(self, op, dtype, nbytes):
        return self.limit is None or nbytes <= self.limit


def test_routes_respect_capture_op_support_capacity_and_count_every_call():
    arx, graphy = Stub("arx", limit=2048), Stub("graphy", capturable=True, ops=("all_gather",))
    tables, _ = mode_tables(_file(), 2)
    capturing = [False]
    router = Router(resolve(tables, {"arx": arx, "graphy": graphy}, native=lambda name: name == "gloo"), "gloo", lambda: capturing[0])
    f32 = torch.float32
    assert router.pick("all_reduce", f32, 1024) is arx
    assert router.pick("all_reduce", f32, 3000) is None  # in arx's range but beyond what it takes
    assert router.pick("all_reduce", f32, 4096) is None  # the baseline's range
    assert router.pick("all_gather", f32, 1 << 20) is graphy
    capturing[0] = True
    assert router.pick("all_reduce", f32, 1024) is None  # arx cannot be captured
    assert router.pick("all_gather", f32, 1 << 20) is graphy
    assert router.pick("all_reduce", torch.int32, 16) is None  # no table
    assert router.calls == {("all_reduce", "arx"): 1, ("all_reduce", "gloo"): 4, ("all_gather", "graphy"): 2}


def test_constructing_the_communicator_imports_no_harness():
    code = (
        "import os, sys, torch.distributed as dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='29641')\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "from arxtune.runtime.communicator import Communicator\n"
        "comm = Communicator.from_env(sys.argv[1])\n"
        "print(sorted(m for m in ('pandas', 'matplotlib', 'arxtune.harness.sweep', 'arxtune.harness.results', 'arxtune.harness.stats', 'arxtune.harness.calibrate') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, "missing.json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_an_excluded_backend_serves_nothing_of_that_op_and_dtype_in_any_mode():
    arx, graphy = Stub("arx", capturable=True), Stub("graphy", capturable=True)
    tables, _ = mode_tables(_file(), 2, parse_overrides("all_reduce@graph:0-1KiB=arx"))
    opened = {"arx": arx, "graphy": graphy}
    excluded = {("arx", "all_reduce", "float32"): "wrong at 2KiB"}
    capturing = [False]
    router = Router(
        resolve(tables, opened, lambda name: name == "gloo", excluded),
        "gloo",
        lambda: capturing[0],
        lambda now: resolve(tables, opened, lambda name: name == "gloo", now),
        excluded,
    )
    f32 = torch.float32
    assert router.pick("all_reduce", f32, 512) is None  # the file's range and the override's alike go to the baseline
    capturing[0] = True
    assert router.pick("all_reduce", f32, 512) is None
    assert router.pick("all_gather", f32, 512) is graphy
    assert router.exclude("graphy", "all_gather", "float32", "wrong while serving") is True
    assert router.exclude("graphy", "all_gather", "float32", "again") is False
    assert router.pick("all_gather", f32, 512) is None
    assert router.excluded == {
        ("arx", "all_reduce", "float32"): "wrong at 2KiB",
        ("graphy", "all_gather", "float32"): "wrong while serving",
    }
    router.close()
    capturing[0] = False
    assert router.pick("all_gather", f32, 512) is None


def test_agreed_variables_that_differ_are_named():
    from arxtune.runtime import env

    same = env.agreed_values({"ARXTUNE_OVERRIDES": "all_reduce:0-=gloo"})
    assert env.differences([same, same]) == ""
    other = env.agreed_values({"ARXTUNE_OVERRIDES": "", "ARXTUNE_BOOT": "off"})
    assert env.differences([same, other]) == (
        "ARXTUNE_OVERRIDES differs between ranks (rank 0: 'all_reduce:0-=gloo', rank 1: ''); "
        "ARXTUNE_BOOT differs between ranks (rank 0: '', rank 1: 'off'); set the same value on every rank"
    )
    assert {name for name, _ in same} == {
        "ARXTUNE_OVERRIDES",
        "ARXTUNE_FINGERPRINT",
        "ARXTUNE_EXTRA_BACKENDS",
        "ARXTUNE_BOOT",
        "ARXTUNE_BOOT_BUDGET_S",
        "ARXTUNE_VERIFY",
    }


def test_a_result_differs_from_the_baselines_beyond_rounding_only():
    from arxtune.runtime.ops import differs

    want = torch.tensor([1.0, 2.0, 3.0e6, -4.0], dtype=torch.bfloat16)
    assert differs(want.clone(), want, "all_reduce", 2) is None
    assert differs(want + torch.tensor([0, 0, 2.0e4, 0], dtype=torch.bfloat16), want, "all_reduce", 2) is None  # within 2 x eps x 3e6
    assert differs(want + torch.tensor([0, 0, 0, 1.0e5], dtype=torch.bfloat16), want, "all_reduce", 2).startswith(
        "1 of 4 elements differ by more than "
    )
    gathered = torch.tensor([1.0, 2.0], dtype=torch.float32)
    assert "1 of 2 elements wrong" in differs(gathered + torch.tensor([0, 1e-6]), gathered, "all_gather", 2)  # gathers are exact
    assert differs(torch.tensor([3], dtype=torch.int32), torch.tensor([2], dtype=torch.int32), "all_reduce", 2) is not None


def test_verify_reads_a_call_count(monkeypatch, caplog):
    from arxtune.runtime.dispatch import verify_every

    for value, every in (("", 0), ("0", 0), ("1", 1), (" 100 ", 100), ("abc", 0), ("-2", 0), ("9" * 400, 0)):
        monkeypatch.setenv("ARXTUNE_VERIFY", value)
        assert verify_every() == every, value
    assert sum("is not a whole number of calls" in r.getMessage() for r in caplog.records) == 3
