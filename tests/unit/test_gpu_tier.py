"""ARXTUNE_REQUIRE_GPU=1 turns the GPU tier's skips on a machine without a GPU into failures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the tier on a machine without a GPU")
@pytest.mark.parametrize("require, code", [("1", 1), ("0", 0)])
def test_the_gpu_tier_fails_instead_of_skipping_when_a_gpu_is_required(require, code):
    environ = {**os.environ, "ARXTUNE_REQUIRE_GPU": require}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "gpu" / "test_ladder_gpu.py")],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
        cwd=TESTS.parent,
    )
    assert result.returncode == code, result.stdout[-2000:]
    if require == "1":
        assert "ARXTUNE_REQUIRE_GPU=1 and this machine has no CUDA GPU" in result.stdout
    else:
        assert " skipped" in result.stdout
