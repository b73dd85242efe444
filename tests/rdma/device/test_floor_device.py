"""ib_write_lat's floor on the lab's soft-RoCE devices (the RDMA tier)."""

from __future__ import annotations

import pytest

from arxtune.runtime.rdma.floor import measure_write_latency_us


@pytest.mark.rdma
def test_measure_write_latency_on_the_device():
    us = measure_write_latency_us(timeout_s=60)
    print(f"ib_write_lat 2 B typical: {us} us")
    assert 0 < us < 10_000
