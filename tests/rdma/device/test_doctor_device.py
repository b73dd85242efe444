"""arxtune doctor on the lab's soft-RoCE devices (the RDMA tier)."""

from __future__ import annotations

import pytest

from arxtune.harness.doctor import doctor, format_rows
from arxtune.harness.doctor.rows import OK


@pytest.mark.rdma
def test_doctor_on_the_device_says_arx_can_run():
    """The lab's soft-RoCE devices through the rdma extra's pyverbs: listed, their ports read, 4 KiB registered."""
    rows = doctor()
    print(format_rows(rows))
    got = {r.item: r for r in rows}
    assert got["pyverbs"].status == OK and got["pyverbs"].data["bundled"], got["pyverbs"]
    assert set(got["pyverbs"].data["seen"]) >= {"rxe0", "rxe1"}
    assert got["backend arx"].finding == "can run (under torchrun)"
    assert got["memory registration"].status == OK, got["memory registration"]
    assert got["rxe0 port 1"].data["active_mtu"] in (1024, 4096) and got["rxe0 port 1"].data["gid_index"] is not None
