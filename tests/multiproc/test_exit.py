"""A process that uses the communicator exits cleanly, whether it calls close() or not.

The README's usage (tests/helpers/usage_worker.py), 30 torchrun jobs of 2 ranks, two at a time (load
widens the window this guards: a gloo thread still letting go of a collective's tensors while the
interpreter finalizes aborts the process, "terminate called without an active exception"). Every job
must end with exit code 0 and no abort. The file gives a test backend a boundary, so the start-up
ladder's collectives run too.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.workers import torchrun

TESTS = Path(__file__).parents[1]
RUNS = 30
KiB = 1024


def _thresholds(world: int) -> dict:
    ranges = [
        {"lo": 0, "hi": 64 * KiB, "backend": "counting", "source": "measured"},
        {"lo": 64 * KiB, "hi": None, "backend": "gloo", "source": "measured"},
    ]
    return {
        "kind": "arxtune-thresholds",
        "version": 2,
        "baseline": "gloo",
        "margin": 0.05,
        "provenance": {},
        "tables": [{"op": "all_reduce", "dtype": "float32", "world_size": world, "mode": "eager", "ranges": ranges}],
        "models": [],
        "runs": [],
        "backend_setup": {},
    }


@pytest.mark.multiproc
def test_the_readme_usage_exits_cleanly_30_times(tmp_path):
    path = tmp_path / "thresholds.json"
    path.write_text(json.dumps(_thresholds(2)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARXTUNE_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        ARXTUNE_EXTRA_BACKENDS="counting=helpers.backends:CountingGloo",
        ARXTUNE_THRESHOLDS=str(path),
        ARXTUNE_BOOT_OUT=str(tmp_path / "boot"),
        ARXTUNE_BOOT_BUDGET_S="0.2",
    )

    def job(i: int) -> tuple[int, subprocess.CompletedProcess]:
        args = ["close"] if i % 2 else []  # half close, half just end
        return i, torchrun("usage_worker.py", 2, *args, env=env, timeout=240)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(job, range(RUNS)))
    failed = [
        (i, r.returncode) for i, r in results if r.returncode != 0 or "terminate called" in r.stderr or r.stdout.count("usage ok") != 2
    ]
    assert not failed, f"{len(failed)} of {RUNS} jobs did not exit cleanly {failed}:\n" + next(
        r.stdout + r.stderr for i, r in results if (i, r.returncode) in failed
    )
