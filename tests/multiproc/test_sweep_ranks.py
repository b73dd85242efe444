"""Real multi-process runs on gloo: arxtune launches torchrun itself, as a user's `arxtune sweep` does."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arxtune.harness.launch import _descendants, _kill_tree
from arxtune.harness.results import POINTS_FILE, load_run
from arxtune.runtime.thresholds import load

pytestmark = pytest.mark.multiproc
TESTS = Path(__file__).parents[1]
EXTRA = (
    "counting=helpers.backends:CountingGloo,offbyone=helpers.backends:OffByOne,dies=helpers.backends:DiesAtSize,"
    "laterwrong=helpers.backends:WrongAfterCheck,smallonly=helpers.backends:SmallOnly,reversed=helpers.backends:ReversedSum"
)
SMALL = ["--min-bytes", "1KiB", "--max-bytes", "16KiB", "--step-factor", "4", "--point-budget-s", "0.02", "--no-progress"]


def environment(env=None):
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    environment.update(
        PYTHONPATH=os.pathsep.join([str(TESTS), environment.get("PYTHONPATH", "")]),
        ARXTUNE_EXTRA_BACKENDS=EXTRA,
        ARXTUNE_DEVICE="cpu",
        **(env or {}),
    )
    return environment


def arxtune(*args, env=None, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "arxtune", *map(str, args)], env=environment(env), capture_output=True, text=True, timeout=timeout
    )


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("arxtune: error:")]


@pytest.mark.parametrize("world", [2, 3])
def test_sweep_calibrate_plot(tmp_path, world):
    result = arxtune(
        "sweep",
        "--nproc-per-node",
        world,
        "--backends",
        "gloo,offbyone,laterwrong,arx",
        "--dtypes",
        "float32,bfloat16",
        "--out",
        tmp_path,
        "--run-id",
        "run",
        *SMALL,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    run = load_run(tmp_path / "run")
    assert run.meta.world_size == world and run.meta.finished
    assert run.meta.backends["arx"]["available"] is False and run.meta.backends["arx"]["reason"]
    frame = run.frame()
    gloo = frame[frame.backend == "gloo"]
    assert len(gloo) == 3 * 2 * 3 * 2 and set(gloo.status) == {"ok"} and set(gloo["view"]) == {"eager", "isolated"}
    assert (gloo.iters >= 10).all() and (gloo.median_us > 0).all()
    wrong = frame[(frame.backend == "offbyone") & (frame.op == "all_reduce")]
    assert set(wrong.status) == {"wrong"} and wrong.error.str.contains("rank 1").all()
    later = frame[(frame.backend == "laterwrong") & (frame.op == "all_reduce")]
    assert set(later.status) == {"wrong"}
    # Its call count carries over to the view timed next (isolated), whose first check then fails.
    assert later[later["view"] == "eager"].error.str.contains("rank 1: after timing").all()
    # Once more on random data: whether each passing backend gave gloo's bits (test_bitwise_at_world_3 below).
    passed = frame[frame.status == "ok"]
    assert passed.bitwise.map(lambda v: v is True or v is False).all(), "every passing point is checked"
    assert passed[passed.backend == "gloo"].bitwise.all()
    assert passed[(passed.backend == "laterwrong") & (passed.op == "reduce_scatter")].bitwise.all()  # gloo itself there
    assert frame[frame.status != "ok"].bitwise.isna().all()
    thresholds = load(tmp_path / "run" / "thresholds.json")
    assert not {"offbyone", "laterwrong"} & {r.backend for t in thresholds.tables if t.op == "all_reduce" for r in t.ranges}
    assert (tmp_path / "run" / "plot.png").stat().st_size > 10_000
    assert f"thresholds: {tmp_path / 'run' / 'thresholds.json'}" in result.stdout


def test_bitwise_at_world_3_tells_a_backend_that_adds_in_another_order(tmp_path):
    """Three ranks: adding in reverse rank order rounds float sums otherwise than gloo, and `show` says so per
    point. Small on purpose: all_reduce at two dtypes and two sizes, as few samples as a run may hold."""
    config = tmp_path / "few.toml"
    config.write_text("[sweep]\nwarmup_iters = 1\nrounds = 1\nmax_extra_rounds = 0\nmin_iters = 3\nmax_iters = 3\n")
    result = arxtune(
        "sweep",
        "-c",
        config,
        "--nproc-per-node",
        3,
        "--backends",
        "gloo,reversed",
        "--ops",
        "all_reduce",
        "--dtypes",
        "float32,bfloat16",
        "--views",
        "eager",
        "--min-bytes",
        "1KiB",
        "--max-bytes",
        "4KiB",
        "--step-factor",
        "4",
        "--no-progress",
        "--out",
        tmp_path,
        "--run-id",
        "run",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    frame = load_run(tmp_path / "run").frame()
    assert len(frame) == 2 * 2 * 2 and set(frame.status) == {"ok"}
    assert set(zip(frame.backend, frame.bitwise)) == {("gloo", True), ("reversed", False)}  # at every point
    from rich.console import Console

    from arxtune.harness.report import run_table

    console = Console(width=200, record=True)
    console.print(run_table(tmp_path / "run"))
    shown = console.export_text()
    assert "bits = gloo" in shown
    assert [line.split("│")[12].strip() for line in shown.splitlines() if line.startswith("│ reversed │")] == ["no"] * 4


def test_ctrl_c_keeps_every_point_and_resume_finishes_the_run_where_it_was_measured(tmp_path):
    slow = [
        "--backends",
        "gloo",
        "--dtypes",
        "float32,bfloat16,float16",
        "--views",
        "eager",
        "--min-bytes",
        "1KiB",
        "--max-bytes",
        "16KiB",
        "--step-factor",
        "4",
        "--point-budget-s",
        "0.3",
        "--no-progress",
    ]
    run = tmp_path / "run"
    points = run / POINTS_FILE
    # As from a terminal's foreground: Ctrl-C's SIGINT not ignored, though a shell's background job (where this
    # test may run) starts its children with it ignored.
    sweep = subprocess.Popen(
        [sys.executable, "-m", "arxtune", "sweep", *slow, "--out", str(tmp_path), "--run-id", "run"],
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sweep.poll() is None and not (points.exists() and points.read_text().count("\n") >= 3):
        time.sleep(0.1)
    assert sweep.poll() is None, "the sweep ended before it could be interrupted"
    sweep.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the foreground process
    # The ranks stop in a few seconds; a rank left in a barrier would hold the pipes for its whole 120 s timeout.
    _, stderr = sweep.communicate(timeout=25)
    assert sweep.returncode == 130, stderr
    assert error_lines(stderr) == [
        f"arxtune: error: interrupted; finished points are kept: continue with `arxtune sweep --resume {run}`"
    ], stderr
    assert "Traceback" not in stderr
    interrupted = points.read_bytes()
    complete = interrupted[: interrupted.rfind(b"\n") + 1]
    before = load_run(run)
    assert len(before.records) >= 2 and not before.meta.finished
    meta_bytes = (run / "meta.json").read_bytes()

    # Refused without touching anything: a changed flag, and a run measured on other hosts.
    refused = arxtune("sweep", "--resume", run, *slow[:-3], "--point-budget-s", "0.1", "--no-progress")
    assert refused.returncode == 2 and error_lines(refused.stderr) == [
        f"arxtune: error: --resume continues {run} with its own config; drop --point-budget-s (the run has 0.3) or start a new sweep"
    ]
    moved = json.loads(meta_bytes)
    moved["hostnames"] = ["elsewhere"] * 2
    (run / "meta.json").write_text(json.dumps(moved))
    refused = arxtune("sweep", "--resume", run, "--no-progress", timeout=120)
    assert refused.returncode == 2 and len(error_lines(refused.stderr)) == 1 and "resume it there" in refused.stderr, refused.stderr
    assert points.read_bytes() == interrupted
    (run / "meta.json").write_bytes(meta_bytes)

    result = arxtune("sweep", "--resume", run, *slow)
    assert result.returncode == 0, result.stderr
    assert points.read_bytes().startswith(complete)
    after = load_run(run)
    assert after.records[: len(before.records)] == before.records
    assert sorted(r.key for r in after.records) == sorted({*(r.key for r in after.records)})
    assert len(after.records) == 3 * 3 * 3 and all(r.status == "ok" and len(r.samples_us) >= 10 for r in after.records)
    assert after.meta.finished and (
        after.meta.run_id,
        after.meta.started,
        after.meta.hostnames,
        after.meta.device_names,
        after.meta.config,
    ) == (before.meta.run_id, before.meta.started, before.meta.hostnames, before.meta.device_names, before.meta.config)
    again = arxtune("sweep", "--resume", run)
    assert again.returncode == 2 and "nothing to resume" in again.stderr


def test_killing_the_launcher_tree_reaches_ranks_in_sessions_of_their_own():
    """The launcher's last resort: torchrun starts each rank with setsid, so killing its group alone would orphan them."""
    tree = subprocess.Popen(["bash", "-c", "setsid sleep 300 & sleep 300 & wait"], stdout=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while len(_descendants(tree.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_descendants(tree.pid)) == 2
    _kill_tree(tree.pid)
    assert select.select([tree.stdout], [], [], 10)[0] and tree.stdout.read() == b""  # nothing below it still holds the pipe
    assert tree.wait(timeout=10) == -signal.SIGKILL


def test_a_start_up_failure_on_rank_0_reaches_every_rank_at_once(tmp_path):
    """--out naming a file fails inside rank 0 (torchrun started directly, so no parent check runs first)."""
    (tmp_path / "file").write_text("")
    config = tmp_path / "c.toml"
    config.write_text("[sweep]\ntimeout_s = 300\n")  # a rank left waiting would outlive the test's own timeout
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "arxtune",
        "sweep",
        "-c",
        config,
        "--backends",
        "gloo",
        "--out",
        tmp_path / "file",
        "--no-progress",
    ]
    result = subprocess.run(list(map(str, command)), env=environment(), capture_output=True, text=True, timeout=90)
    assert result.returncode != 0
    assert (
        error_lines(result.stderr).count(f"arxtune: error: --out directory {tmp_path / 'file'} is a file, not a directory; choose another")
        == 2
    )


def test_a_rank_that_dies_fails_the_sweep_and_keeps_finished_points(tmp_path):
    result = arxtune(
        "sweep",
        "--backends",
        "dies",
        "--ops",
        "all_reduce",
        "--dtypes",
        "float32",
        "--out",
        tmp_path,
        "--run-id",
        "run",
        *SMALL,
        env={"ARXTUNE_TEST_DIE_AT": "8192"},
        timeout=300,
    )
    assert result.returncode == 2
    [line] = error_lines(result.stderr)
    assert "a rank failed (torchrun exit" in line and line.endswith(f"continue with `arxtune sweep --resume {tmp_path / 'run'}`")
    assert "Traceback" not in result.stderr
    run = load_run(tmp_path / "run")
    assert [r.size for r in run.records] == [1024, 4096] and not run.meta.finished


def test_communicator_picks_per_call(tmp_path):
    worker = TESTS / "helpers" / "communicator_worker.py"
    for world in (2, 3):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]), ARXTUNE_EXTRA_BACKENDS=EXTRA, OMP_NUM_THREADS="1")
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world), str(worker), str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.count("communicator ok") == world, result.stdout
        assert f"using gloo for every call: the Thresholds given holds tables for world sizes [7], not {world}" in result.stderr
        assert "missing.json not found" in result.stderr
        assert "arx cannot start" in result.stderr
