"""arx / arx2 collectives across processes under torchrun (2 and 3 ranks, one device)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.rdma
HERE = Path(__file__).parent


def torchrun(nproc: int, *args: str, timeout: int = 600) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(HERE / "mp_check.py"), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parents[1]), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    out = proc.stdout + proc.stderr
    print(out)
    assert proc.returncode == 0, out[-4000:]
    return out


def test_two_ranks_all_ops_dtypes_sizes_and_latency_ratios():
    out = torchrun(2, "--bench")
    assert "MP_CHECK PASS world=2" in out


def test_three_ranks_all_ops_dtypes_sizes():
    out = torchrun(3, "--quick")  # fewer sizes: the two-rank run has them all, and the twins
    assert "MP_CHECK PASS world=3" in out
