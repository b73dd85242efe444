"""The start-up ladder at world 1 on a GPU: eager and graph boundaries timed with the runtime's CUDA timers.

PYTHONPATH=$PWD python -m pytest -q tests/gpu/test_ladder_gpu.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from arxtune.harness.results import load_run
from helpers.workers import torchrun

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TESTS = Path(__file__).parents[1]


def test_the_ladder_times_eager_and_graph_boundaries_on_one_gpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARXTUNE_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]), ARXTUNE_BOOT_OUT=str(tmp_path), ARXTUNE_BOOT_BUDGET_S="2"
    )
    result = torchrun("ladder_gpu_worker.py", 1, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {r["policy"]: r["line"] for r in (json.loads(x[7:]) for x in result.stdout.splitlines() if x.startswith("RESULT "))}
    for policy, line in lines.items():
        assert f"ladder {policy}: 2 boundaries" in line, line
        assert "all_reduce/bfloat16@graph torch_nccl|nccl" in line and "cannot be captured" not in line, line
        assert "budget spent" not in line, line  # both boundaries were measured within the budget
    runs = [load_run(p) for p in sorted(tmp_path.iterdir())]
    assert len(runs) == 2 and {r.view for r in runs[0].records} == {"eager", "graph"}
    assert all(r.status == "ok" for run in runs for r in run.records), [(r.key, r.error) for run in runs for r in run.records]
    print("\n".join(lines.values()))
