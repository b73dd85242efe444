"""Real multi-process runs on gloo: arxtune launches torchrun itself, as a user's `arxtune sweep` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from arxtune.results import POINTS_FILE, load_run
from arxtune.thresholds import load

pytestmark = pytest.mark.multiproc
TESTS = Path(__file__).parent
EXTRA = "counting=helpers.backends:CountingGloo,offbyone=helpers.backends:OffByOne,dies=helpers.backends:DiesAtSize"
SMALL = ["--min-bytes", "1KiB", "--max-bytes", "16KiB", "--step-factor", "4", "--point-budget-s", "0.02", "--no-progress"]


def arxtune(*args, env=None, timeout=240):
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    environment.update(PYTHONPATH=os.pathsep.join([str(TESTS), environment.get("PYTHONPATH", "")]), ARXTUNE_EXTRA_BACKENDS=EXTRA,
                       ARXTUNE_DEVICE="cpu", **(env or {}))
    return subprocess.run([sys.executable, "-m", "arxtune", *map(str, args)], env=environment, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("world", [2, 3])
def test_sweep_calibrate_plot(tmp_path, world):
    result = arxtune("sweep", "--nproc-per-node", world, "--backends", "gloo,offbyone,arx", "--dtypes", "float32,bfloat16",
                     "--out", tmp_path, "--run-id", "run", *SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    run = load_run(tmp_path / "run")
    assert run.meta.world_size == world and run.meta.finished
    assert run.meta.backends["arx"]["available"] is False and run.meta.backends["arx"]["reason"]
    frame = run.frame()
    gloo = frame[frame.backend == "gloo"]
    assert len(gloo) == 3 * 2 * 3 and set(gloo.status) == {"ok"}
    assert (gloo.iters >= 10).all() and (gloo.median_us > 0).all()
    wrong = frame[(frame.backend == "offbyone") & (frame.op == "all_reduce")]
    assert set(wrong.status) == {"wrong"} and wrong.error.str.contains("rank 1").all()
    thresholds = load(tmp_path / "run" / "thresholds.json")
    assert "offbyone" not in {r.backend for t in thresholds.tables if t.op == "all_reduce" for r in t.ranges}
    assert (tmp_path / "run" / "plot.png").stat().st_size > 10_000
    assert f"thresholds: {tmp_path / 'run' / 'thresholds.json'}" in result.stdout


def test_interrupted_sweep_resumes(tmp_path):
    result = arxtune("sweep", "--backends", "gloo", "--ops", "all_reduce", "--dtypes", "float32", "--out", tmp_path, "--run-id", "run", *SMALL)
    assert result.returncode == 0, result.stderr
    points = tmp_path / "run" / POINTS_FILE
    lines = points.read_text().splitlines()
    points.write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:20])  # lose the last point and tear the one before
    result = arxtune("sweep", "--resume", tmp_path / "run", *SMALL)
    assert result.returncode == 0, result.stderr
    run = load_run(tmp_path / "run")
    assert sorted(r.size for r in run.records) == [1024, 4096, 16384] and run.meta.finished


def test_a_rank_that_dies_fails_the_sweep_and_keeps_finished_points(tmp_path):
    result = arxtune("sweep", "--backends", "dies", "--ops", "all_reduce", "--dtypes", "float32", "--out", tmp_path,
                     "--run-id", "run", *SMALL, env={"ARXTUNE_TEST_DIE_AT": "8192"}, timeout=300)
    assert result.returncode != 0
    assert "arxtune: error: torchrun exited" in result.stderr
    run = load_run(tmp_path / "run")
    assert [r.size for r in run.records] == [1024, 4096] and not run.meta.finished


def test_communicator_picks_per_call(tmp_path):
    worker = TESTS / "helpers" / "communicator_worker.py"
    for world in (2, 3):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]), ARXTUNE_EXTRA_BACKENDS=EXTRA, OMP_NUM_THREADS="1")
        result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world), str(worker), str(tmp_path)],
                                env=env, capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.count("communicator ok") == world, result.stdout
        assert f"using gloo for every call: the Thresholds given holds tables for world sizes [7], not {world}" in result.stderr
        assert "missing.json not found" in result.stderr
        assert "arx cannot start" in result.stderr
