"""The start-up ladder on a live gloo group of 2 and 3 ranks (tests/helpers/ladder_worker.py runs the scenarios).

A file claims 'slowabove' (a sleep of 20 ms a call from 8 KiB) fast up to
64 KiB: `check` warns and keeps the file, `adjust` moves the boundary below
the sizes where gloo won and every rank ends with the same tables, `off`
changes nothing; with no file `adjust` builds tables and `check` says it has
nothing to check; a backend caught giving a wrong result serves nothing of that
(op, dtype) in any mode, under check and adjust alike; a backend that waits 3 s
and times out is out as well, and start-up takes no longer than the budget
plus that wait. The runs rank 0 wrote read
back with the harness, and calibrate takes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arxtune.harness.calibrate import calibrate
from arxtune.harness.results import load_run
from helpers.workers import torchrun

TESTS = Path(__file__).parents[1]
KiB = 1024
BUDGET_S, HANG_S = 1.0, 3.0
#: What a loaded 2-core box adds to start-up beyond the budget and the hang: opening backends, collectives.
SLACK_S = 3.0


def _launch(world: int, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARXTUNE_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        ARXTUNE_EXTRA_BACKENDS="slowabove=helpers.backends:SlowAbove,hangs=helpers.backends:Hangs,"
        "capwrong=helpers.backends:CapturableWrong",
        ARXTUNE_BOOT_OUT=str(tmp_path / "boot"),
        ARXTUNE_BOOT_BUDGET_S=str(BUDGET_S),
        ARXTUNE_TEST_HANG_S=str(HANG_S),
    )
    return torchrun("ladder_worker.py", world, tmp_path, env=env, timeout=300)


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [2, 3])
def test_the_ladder_checks_adjusts_builds_and_keeps_its_budget(world, tmp_path):
    result = _launch(world, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ladder ok") == world, result.stdout
    # Another rank's "ladder ok" may land on the end of rank 0's last line: read the JSON document alone.
    results = (json.JSONDecoder().raw_decode(x[len("RESULT ") :])[0] for x in result.stdout.splitlines() if x.startswith("RESULT "))
    got = {r["scenario"]: r for r in results}
    assert all(r["same_tables"] for r in got.values()), got
    mid, big = str(48 * KiB), str(1024 * KiB)

    off = got["off"]
    assert "ladder" not in off["line"] and off["picks"][mid] == "slowabove"

    check = got["check"]
    assert "ladder check: 1 boundaries, 1 contradicted (all_reduce/float32 slowabove|gloo 64KiB contradicted (ladder: " in check["line"]
    assert "takes eager all_reduce/float32 [0B, 64KiB) -> slowabove" in check["line"] and check["picks"][mid] == "slowabove"
    warning = "start-up ladder contradicts eager all_reduce/float32 slowabove|gloo at 64KiB: the other side wins (32KiB: slowabove "
    assert result.stderr.count(warning) == 2, result.stderr  # once in check, once in adjust: rank 0 alone warns

    adjust = got["adjust"]
    assert "ladder adjust: 1 boundaries, 1 moved (all_reduce/float32 slowabove|gloo 64KiB -> " in adjust["line"]
    assert adjust["picks"] == {str(2 * KiB): "slowabove", mid: "gloo", big: "gloo"}

    built = got["nofile-adjust"]
    assert "ladder adjust: no thresholds file; built 3 eager tables" in built["line"]
    assert built["picks"][mid] == "gloo" and built["picks"][big] == "gloo"  # slowabove, the baseline, loses above 8 KiB
    assert "ladder check: no thresholds file, nothing to check" in got["nofile-check"]["line"]
    assert set(got["nofile-check"]["picks"].values()) == {"slowabove"}

    for policy in ("check", "adjust"):  # wrong is out: every mode, check and adjust alike, one warning each
        wrong = got[f"wrong-{policy}"]
        assert (
            f"ladder {policy}: 2 boundaries, " in wrong["line"]
            and "all_reduce/float32 capwrong|gloo 64KiB out (capwrong failed)" in wrong["line"]
        )
        assert "out 1 (capwrong all_reduce/float32)" in wrong["line"]
        assert "all_reduce/float32 [0B, 64KiB) -> capwrong" not in wrong["line"]
        assert wrong["picks"][str(2 * KiB)] == "gloo" and wrong["in_graph"]["all_reduce"] == "gloo"
        assert wrong["all_gather"] == "capwrong" and wrong["in_graph"]["all_gather"] == "capwrong"  # right there: the file's choice
    said = [line for line in result.stderr.splitlines() if "capwrong is out of all_reduce/float32" in line]
    assert len(said) == 2, said  # once per policy, from rank 0
    assert all(
        "in every mode for the life of this process: start-up ladder, eager at 32KiB: rank 1: wrong result: "
        "1 of 8192 elements wrong; first at 0: got "
        in line
        and line.endswith("; those calls use gloo")
        for line in said
    ), said

    hangs = got["hangs"]  # a backend that times out at start-up is out as well
    assert HANG_S <= hangs["took_s"] < BUDGET_S + HANG_S + SLACK_S, hangs
    assert (
        "hangs is out of all_reduce/float32 in every mode for the life of this process: start-up ladder, eager at 32KiB: "
        "rank 0: TimeoutError: gave up after 3 s"
    ) in result.stderr
    assert "-> hangs" not in hangs["line"] and hangs["picks"][str(2 * KiB)] == "gloo"

    runs = [load_run(p) for p in sorted((tmp_path / "boot").iterdir())]
    assert len(runs) == 6, [r.path for r in runs]  # check, adjust, wrong x2, nofile-adjust, hangs; off, nofile-check measure nothing
    assert all(r.meta.world_size == world and len(r.meta.hostnames) == world for r in runs)
    assert {r.backend for run in runs for r in run.records} == {"gloo", "slowabove", "capwrong", "hangs"}
    assert any(r.status == "wrong" for run in runs for r in run.records if r.backend == "capwrong")
    assert calibrate(runs[0]).table("all_reduce", "float32", world) is not None
    if world == 2:
        shown = subprocess.run([sys.executable, "-m", "arxtune", "show", str(runs[0].path)], capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0 and "slowabove" in shown.stdout, shown.stdout + shown.stderr
