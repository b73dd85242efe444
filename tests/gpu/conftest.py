"""GPU tier: without a CUDA GPU its tests skip on a developer machine, but under ARXTUNE_REQUIRE_GPU=1
(scripts/gpu-arxg.sh, a lent GPU) every skip on a machine without one is a failure: the tier must never pass by
skipping where a GPU was promised. Skips a GPU machine gives (a memory mode the device refuses, one GPU where a
test wants two) stay skips, with their reasons."""

from __future__ import annotations

import pytest
import torch

from arxtune.runtime import env


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and env.REQUIRE_GPU.get() == "1" and not torch.cuda.is_available():
        report.outcome = "failed"
        report.longrepr = f"skipped, but {env.REQUIRE_GPU.name}=1 and this machine has no CUDA GPU: {report.longrepr}"
