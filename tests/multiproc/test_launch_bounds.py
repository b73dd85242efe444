"""Bounded start-up with the real torchrun: a node that never comes, and a rank frozen with SIGSTOP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arxtune.harness.launch import _descendants
from arxtune.harness.results import POINTS_FILE

pytestmark = pytest.mark.multiproc
TESTS = Path(__file__).parents[1]


def _environment():
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    environment.update(PYTHONPATH=os.pathsep.join([str(TESTS), environment.get("PYTHONPATH", "")]), ARXTUNE_DEVICE="cpu")
    return environment


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_a_node_that_never_comes_ends_the_sweep_at_its_timeout(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[sweep]\ntimeout_s = 5\nbackends = ["gloo"]\n')
    endpoint = f"127.0.0.1:{_free_port()}"
    started = time.monotonic()
    sweep = subprocess.run(
        [
            sys.executable,
            "-m",
            "arxtune",
            "sweep",
            "-c",
            str(config),
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-endpoint",
            endpoint,
            "--out",
            str(tmp_path / "out"),
        ],
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=100,
    )
    took = time.monotonic() - started
    assert sweep.returncode == 2 and took < 60, (took, sweep.stderr)
    assert sweep.stderr.splitlines()[-1] == (
        f"arxtune: error: the rendezvous at {endpoint} did not complete within timeout_s (5 s): "
        "not all 2 nodes came (--nnodes); nothing was measured"
    ), sweep.stderr
    assert "Traceback" not in sweep.stderr.splitlines()[-1] and not list((tmp_path / "out").iterdir())


@pytest.mark.timeout(180)
def test_a_frozen_rank_ends_the_sweep_at_the_timeout(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(
        '[sweep]\ntimeout_s = 8\nbackends = ["gloo"]\nviews = ["eager"]\ndtypes = ["float32", "bfloat16", "float16"]\n'
        'min_bytes = "1KiB"\nmax_bytes = "16KiB"\nstep_factor = 4\npoint_budget_s = 0.3\n'
    )
    sweep = subprocess.Popen(
        [sys.executable, "-m", "arxtune", "sweep", "-c", str(config), "--out", str(tmp_path), "--run-id", "run", "--no-progress"],
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    points = tmp_path / "run" / POINTS_FILE
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sweep.poll() is None and not (points.exists() and points.read_text().count("\n") >= 2):
        time.sleep(0.1)
    assert sweep.poll() is None, "the sweep ended before a rank could be frozen"
    ranks = [
        pid
        for pid in _descendants(sweep.pid)
        if "arxtune" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        and "torch.distributed.run" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    ]
    assert len(ranks) == 2, ranks
    os.kill(max(ranks), signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        _, stderr = sweep.communicate(timeout=60)
    finally:
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    took = time.monotonic() - frozen
    # timeout_s (8 s) for the other rank to notice, the launcher's grace (5 s), and start-up noise; not torchrun's extra 30 s.
    assert sweep.returncode != 0 and took < 8 + 5 + 17, (took, stderr)
    assert [line for line in stderr.splitlines() if line.startswith("arxtune: error:")], stderr
