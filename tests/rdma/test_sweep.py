"""`arxtune sweep` with arx and arx2 beside gloo: a run, thresholds and a plot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.rdma
REPO = Path(__file__).parents[2]


def test_sweep_with_arx_and_arx2_writes_run_thresholds_and_plot(tmp_path):
    from arxtune.results import load_run

    cmd = [sys.executable, "-m", "arxtune", "sweep", "--backends", "gloo,arx,arx2",
           "--ops", "all_reduce,all_gather,reduce_scatter", "--dtypes", "float32,bfloat16",
           "--min-bytes", "4KiB", "--max-bytes", "256KiB", "--step-factor", "8", "--point-budget-s", "0.05",
           "--nproc-per-node", "2", "--out", str(tmp_path), "--run-id", "rdma-tier", "--no-progress"]
    env = {**os.environ, "ARXTUNE_RDMA_MAX_BYTES": "256KiB"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    out = proc.stdout + proc.stderr
    print(out)
    assert proc.returncode == 0, out[-4000:]
    run = load_run(tmp_path / "rdma-tier")
    for name in ("arx", "arx2"):
        assert run.meta.backends[name]["available"], run.meta.backends[name]
        statuses = {p.status for p in run.records if p.backend == name}
        assert statuses == {"ok"}, (name, [(p.op, p.size, p.status, p.error) for p in run.records if p.backend == name and p.status != "ok"])
    assert (tmp_path / "rdma-tier" / "thresholds.json").is_file()
    assert any(f.suffix in (".png", ".svg") for f in (tmp_path / "rdma-tier").iterdir())
