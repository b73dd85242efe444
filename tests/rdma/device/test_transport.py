"""Transport on a real (soft-RoCE) device: two Transports in one process, connected
to each other. The NIC delivers asynchronously, so one thread can play both ranks."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from arxtune.runtime.rdma import reach
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.connection import Transport, open_transport
from arxtune.runtime.rdma.device import read_devices
from arxtune.runtime.rdma.errors import RdmaError, RdmaTimeout, RdmaUnavailable
from arxtune.runtime.rdma.protocol import seq_of

pytestmark = pytest.mark.rdma


def pair(**kw):
    """Two ranks on this host: each device links to itself in the other rank (reach.routes)."""
    cfg = RdmaConfig(max_bytes=kw.pop("max_bytes", 64 << 10), timeout_s=kw.pop("timeout_s", 10.0), **kw)
    facts = reach.local_facts(cfg, 0)
    group = [facts, replace(facts, rank=1)]
    ts = [Transport(cfg, reach.routes(group, r), r, 2) for r in range(2)]
    infos = [t.local_info() for t in ts]
    for t in ts:
        t.connect(infos)
    return ts


@pytest.fixture
def ts():
    ts = pair()
    yield ts
    for t in ts:
        t.close()


def send(t, step, peer, payload: torch.Tensor, op="test"):
    L = t.layout
    t.begin(step, op)
    t.buf[L.staging(step) : L.staging(step) + payload.numel()].copy_(payload)
    t.put(step, peer, L.staging(step), L.inbox(step, t.rank), payload.numel(), op)


def received(t, step, src, nbytes):
    return t.buf[t.layout.inbox(step, src) : t.layout.inbox(step, src) + nbytes]


def test_connect_write_and_flag(ts):
    a, b = ts
    data = torch.arange(1000, dtype=torch.int32).view(torch.uint8)
    send(a, 0, 1, data)
    b.wait(0, 0, data.numel(), "test")
    assert torch.equal(received(b, 0, 0, data.numel()), data)
    assert b.flags[b.layout.flag_index(0, 0, 0)] == seq_of(0)
    a.wait_sends(0, "test")
    assert a._done[(0, 1)] == 0


def test_slot_reuse_over_many_steps_in_both_directions(ts):
    """Both ranks write every step; alternating slots are overwritten many times with
    different sizes and contents, and each step must see exactly its own bytes."""
    steps = 400
    for k in range(steps):
        n = (1, 64, 4096, 65536)[k % 4]
        payloads = [torch.full((n,), (k * 7 + r) % 251, dtype=torch.uint8) for r in range(2)]
        for r, t in enumerate(ts):
            send(t, k, 1 - r, payloads[r])
        for r, t in enumerate(ts):
            t.wait(k, 1 - r, n, "test")
            assert torch.equal(received(t, k, 1 - r, n), payloads[1 - r]), k
    for t in ts:
        t.wait_sends(steps - 1, "test")


def test_zero_byte_put_sends_only_the_flag(ts):
    a, b = ts
    a.buf[a.layout.staging(0) : a.layout.staging(0) + 64].fill_(7)  # would show up in b's inbox if any byte travelled
    inbox = received(b, 0, 0, 64).clone()
    send(a, 0, 1, torch.empty(0, dtype=torch.uint8))
    b.wait(0, 0, 0, "test")
    assert b.flags[b.layout.flag_index(0, 0, 0)] == seq_of(0)
    assert torch.equal(received(b, 0, 0, 64), inbox)
    a.wait_sends(0, "test")
    assert a._done[(0, 1)] == 0


def test_silent_peer_becomes_a_timeout_naming_device_peer_and_op():
    a, b = pair(timeout_s=1.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(RdmaTimeout) as info:
            a.wait(0, 1, 64, "all_reduce")
        assert time.monotonic() - t0 < 5
        msg = str(info.value)
        assert "peer rank 1" in msg and "op all_reduce" in msg and f"device {a.nics[0].name}" in msg and "QP state RTS" in msg
    finally:
        a.close()
        b.close()


def test_queue_pair_in_error_state_is_reported_not_hung():
    from arxtune.runtime.rdma.connection import e
    from pyverbs.qp import QPAttr

    a, b = pair(timeout_s=2.0)
    try:
        a.nics[0].qps[1].modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
        t0 = time.monotonic()
        with pytest.raises(RdmaError) as info:
            send(a, 0, 1, torch.ones(64, dtype=torch.uint8), op="all_gather")
            a.wait_sends(0, "all_gather")
        assert time.monotonic() - t0 < 5
        msg = str(info.value)
        assert "peer rank 1" in msg and "op all_gather" in msg and a.nics[0].name in msg
        assert "ERROR" in msg or "flush" in msg.lower()
    finally:
        a.close()
        b.close()


def test_peer_that_went_away_is_an_error_within_the_timeout():
    a, b = pair(timeout_s=5.0)
    b.close()
    try:
        t0 = time.monotonic()
        with pytest.raises(RdmaError, match="peer rank 1"):
            send(a, 0, 1, torch.ones(64, dtype=torch.uint8))
            a.wait(0, 1, 64, "test")
        assert time.monotonic() - t0 < 10
    finally:
        a.close()


def test_striping_across_two_devices_sets_both_flags():
    names = [d.name for d in read_devices()]
    if len(names) < 2:
        pytest.fail(f"the lab guest should have two RDMA devices (twins); found {names}")
    a, b = pair(devices=tuple(names[:2]), stripe_min_bytes=4096)
    try:
        data = (torch.arange(50_000) % 253).to(torch.uint8)
        send(a, 0, 1, data)
        b.wait(0, 0, data.numel(), "test")
        assert torch.equal(received(b, 0, 0, data.numel()), data)
        assert [int(b.flags[b.layout.flag_index(0, 0, d)]) for d in range(2)] == [seq_of(0)] * 2
    finally:
        a.close()
        b.close()


def test_unknown_device_is_unavailable_with_the_names_present():
    with pytest.raises(RdmaUnavailable, match="nope not found; present: rxe"):
        open_transport(RdmaConfig(devices=("nope",)), 0, 1, exchange=lambda obj: [obj])


def test_a_rank_that_cannot_run_makes_every_rank_unavailable():
    """Ranks exchange their set-up outcome first, so nobody waits for a broken peer."""

    def exchange(obj):
        return [obj, {"error": "arx: no RDMA devices (simulated on rank 1)"}]

    with pytest.raises(RdmaUnavailable, match="rank 1: arx: no RDMA devices"):
        open_transport(RdmaConfig(max_bytes=4096), 0, 2, exchange)
