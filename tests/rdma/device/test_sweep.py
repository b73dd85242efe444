"""`arxtune sweep` with arx and arx2 beside gloo: a run, thresholds and a plot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.rdma
REPO = Path(__file__).parents[3]


@pytest.mark.timeout(1200)  # above the sweep's own 900 s limit, so that limit is what reports a slow guest
def test_sweep_with_arx_and_arx2_writes_run_thresholds_and_plot():
    """The run is kept under .cache/rdma-tier/ (the guest writes through to the host) for inspection."""
    import shutil

    from arxtune.harness.results import load_run
    from arxtune.runtime.thresholds import load

    out_dir = REPO / ".cache" / "rdma-tier"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    # An emulated guest starts two torch ranks in minutes: a rendezvous bound above the launcher's 180 s default.
    config = out_dir / "sweep.toml"
    config.write_text("[sweep]\ntimeout_s = 300\n")
    cmd = [
        sys.executable,
        "-m",
        "arxtune",
        "sweep",
        "-c",
        str(config),
        "--backends",
        "gloo,arx,arx2",
        "--ops",
        "all_reduce,all_gather,reduce_scatter",
        "--dtypes",
        "float32",
        "--views",
        "eager",
        "--min-bytes",
        "4KiB",
        "--max-bytes",
        "1MiB",
        "--step-factor",
        "256",
        "--point-budget-s",
        "0.05",
        "--nproc-per-node",
        "2",
        "--out",
        str(out_dir),
        "--run-id",
        "rdma-tier",
        "--no-progress",
    ]
    env = {**os.environ, "ARXTUNE_RDMA_MAX_BYTES": "1MiB"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    out = proc.stdout + proc.stderr
    print(out)
    assert proc.returncode == 0, out[-4000:]
    run = load_run(out_dir / "rdma-tier")
    assert run.meta.fabric_floor_us and run.meta.fabric_floor_us > 0
    for name in ("arx", "arx2"):
        assert run.meta.backends[name]["available"], run.meta.backends[name]
        statuses = {p.status for p in run.records if p.backend == name}
        assert statuses == {"ok"}, (
            name,
            [(p.op, p.size, p.status, p.error) for p in run.records if p.backend == name and p.status != "ok"],
        )
    # What shaped arx's measurement is recorded, and the thresholds never hand it more than it takes.
    for name in ("arx", "arx2"):
        assert run.meta.backends[name]["capacity"] == {"all_reduce": 1 << 20, "reduce_scatter": 1 << 20}, run.meta.backends[name]
        assert run.meta.backends[name]["options"]["max_bytes"] == 1 << 20
    thresholds = load(out_dir / "rdma-tier" / "thresholds.json")
    assert thresholds.backend_setup["arx"].options["max_bytes"] == 1 << 20
    for table in thresholds.tables:
        for r in table.ranges:
            if r.backend in ("arx", "arx2") and table.op != "all_gather":
                assert r.hi is not None and r.hi <= (1 << 20) + 1, (table.op, table.dtype, r)
    assert (out_dir / "rdma-tier" / "plot.png").stat().st_size > 10_000
    frame = run.frame()
    medians = frame[(frame.op == "all_reduce") & (frame.dtype == "float32")].pivot(index="nbytes", columns="backend", values="median_us")
    print(f"ib_write_lat floor {run.meta.fabric_floor_us:.1f} us; all_reduce float32 medians (us) and ratios to gloo:")
    for nbytes, row in medians.iterrows():
        print(
            f"  {nbytes:>8} B  gloo {row.gloo:9.1f}  arx {row.arx:9.1f} ({row.arx / row.gloo:.2f})  arx2 {row.arx2:9.1f} ({row.arx2 / row.gloo:.2f})"
        )
