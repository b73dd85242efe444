"""RDMA tests, by directory: tests/rdma/fake (an in-process fake fabric, `make test`) and tests/rdma/device
(real RDMA devices and pyverbs, `make test-rdma` in the soft-RoCE guests; every test there is marked `rdma`).

Without an RDMA device the device tests skip on a developer machine, but fail when CI is
set or ARXTUNE_REQUIRE_RDMA=1 (scripts/test-rdma.sh sets it): the RDMA tier must
never pass by skipping. Any skip at all fails under ARXTUNE_REQUIRE_RDMA=1.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
DEVICE = HERE / "device"
sys.path[:0] = [str(HERE / "fake"), str(DEVICE)]  # fakes.py, test_device.py's helpers, mp_check.py

REQUIRE = os.environ.get("ARXTUNE_REQUIRE_RDMA") == "1" or os.environ.get("CI", "").lower() in ("1", "true", "yes")


def rdma_missing_reason() -> str | None:
    from arxtune.runtime.rdma.connection import PYVERBS_IMPORT_ERROR
    from arxtune.runtime.rdma.device import read_devices

    if PYVERBS_IMPORT_ERROR is not None:
        return f"pyverbs not importable: {PYVERBS_IMPORT_ERROR}"
    if not read_devices():
        return "no RDMA device in /sys/class/infiniband (run via scripts/test-rdma.sh)"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "rdma: needs a real RDMA device (run inside the lab guest)")


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if Path(str(item.fspath)).is_relative_to(DEVICE):
            item.add_marker(pytest.mark.rdma)
        if item.get_closest_marker("rdma") is not None:
            reason = reason if reason is not None else (rdma_missing_reason() or "")
            if not reason:
                return
            if REQUIRE:
                item.add_marker(pytest.mark.usefixtures("_fail_no_rdma"))
            else:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def _fail_no_rdma():
    pytest.fail(f"RDMA required (CI / ARXTUNE_REQUIRE_RDMA=1) but unavailable: {rdma_missing_reason()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("ARXTUNE_REQUIRE_RDMA") == "1" and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped, but ARXTUNE_REQUIRE_RDMA=1 forbids skips in the RDMA tier: {report.longrepr}"
