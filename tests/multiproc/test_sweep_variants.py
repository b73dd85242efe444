"""Backend variants in a real two-rank sweep on gloo: each variant is opened, timed, checked, recorded and calibrated
like any backend (`tagged[tag=x]` stands in for nccl[proto=LL], which needs GPUs: tests/gpu/test_nccl_variants_gpu.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from arxtune.harness.results import load_run
from arxtune.runtime.thresholds import load

pytestmark = pytest.mark.multiproc
TESTS = Path(__file__).parents[1]


def test_variants_from_the_config_and_the_command_line_are_swept_checked_and_recorded(tmp_path):
    config = tmp_path / "variants.toml"
    config.write_text(
        '[sweep]\nbackends = ["gloo", "tagged"]\nops = ["all_reduce"]\ndtypes = ["float32"]\nmodes = ["eager"]\n'
        'min_bytes = "1KiB"\nmax_bytes = "16KiB"\nstep_factor = 4\npoint_budget_s = 0.02\n'
        '[sweep.backend_options.tagged]\nvariants = ["tag=a", "tag=b"]\n'
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
        ARXTUNE_DEVICE="cpu",
        ARXTUNE_EXTRA_BACKENDS="tagged=helpers.backends:TaggedGloo",
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "arxtune",
            "sweep",
            "-c",
            str(config),
            "--nproc-per-node",
            "2",
            "--backends",
            "gloo,tagged,tagged[tag=c]",
            "--out",
            str(tmp_path),
            "--run-id",
            "run",
            "--no-progress",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    run = load_run(tmp_path / "run")
    names = ["gloo", "tagged", "tagged[tag=a]", "tagged[tag=b]", "tagged[tag=c]"]
    assert list(run.meta.backends) == names
    assert run.meta.config["backend_options"] == {"tagged": {"variants": ["tag=a", "tag=b"]}}
    for name in names[2:]:
        assert run.meta.backends[name]["available"] and run.meta.backends[name]["options"] == {"variant": {"tag": name[-2]}}
    frame = run.frame()
    for name in names:
        rows = frame[frame.backend == name]
        assert len(rows) == 3 and set(rows.status) == {"ok"} and (rows.median_us > 0).all(), (name, rows)
    thresholds = load(tmp_path / "run" / "thresholds.json")
    assert set(thresholds.backend_setup) >= {"tagged[tag=a]", "tagged[tag=b]", "tagged[tag=c]"}
