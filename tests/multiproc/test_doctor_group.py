"""`arxtune doctor` across ranks on this CPU machine: two ranks under the launcher, and a rank that never comes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.multiproc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_print_one_table_and_a_verdict(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "arxtune", "doctor", "--nproc-per-node", "2", "--timeout-s", "60", "--report", str(tmp_path / "group.tgz")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.split()[:4] == ["what", "rank", "0", f"({socket.gethostname()})"] for line in lines), out.stdout
    assert any(line.startswith("doctor: rank 1: the table and the verdicts are on rank 0") for line in lines), out.stdout
    assert any(line.startswith("torch ") and line.rstrip().endswith("same") for line in lines)
    assert any(line.startswith("verdict 0<->1") and " ok " in line for line in lines), out.stdout
    assert (tmp_path / "group.tgz").is_file()


def test_a_rank_that_never_comes_is_named_within_the_timeout(tmp_path):
    env = dict(
        os.environ,
        RANK="0",
        WORLD_SIZE="2",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        TORCHELASTIC_RUN_ID="doctor-test",
    )
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "arxtune", "doctor", "--timeout-s", "5"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "the group stopped answering during the rendezvous within 5 s" in out.stdout
    assert time.monotonic() - t0 < 60
