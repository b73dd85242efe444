"""An RDMA write ping-pong between two ranks on one twin, through pyverbs: the fabric's floor.

As perftest's ib_write_lat measures it: one side writes a message into the other's
buffer, the other polls the message's last bytes for the iteration's number and writes
it back; half the round trip is the latency, the typical (median) of all iterations is
the figure. Here the polling and posting run in Python, which adds its own microseconds
a step (on real hardware; hundreds under software emulation), so the figure is an upper
bound on the wire's floor, and `floor.sh` (perftest in C) is the one to compare with.

Every wait has a deadline: a peer that stops answering becomes an error naming it.
"""

from __future__ import annotations

import ctypes
import os
import random
import statistics
import time
from dataclasses import dataclass

import numpy as np

#: Message sizes of the ping-pong: a flag's worth, and a decode-sized all-reduce.
SIZES = (2, 16 << 10)
#: Iterations per size: untimed, then timed.
WARMUP, ITERS = 5, 50
_MAX = max(SIZES)
_YIELD_AFTER = 4096  # spins before each further poll yields the CPU


@dataclass
class Link:
    """One RC queue pair to one peer on one device, with its two buffers registered."""

    device: str
    peer: int
    ctx: object
    pd: object
    cq: object
    qp: object
    mr: object
    mem: object  # ctypes buffer: [receive area | send area]
    psn: int
    gid_index: int
    mtu: int

    @property
    def base(self) -> int:
        return ctypes.addressof(self.mem)  # type: ignore[arg-type]

    def info(self, gid: str) -> dict:
        return {
            "device": self.device,
            "qpn": self.qp.qp_num,  # type: ignore[attr-defined]
            "psn": self.psn,
            "gid": gid,
            "addr": self.base,
            "rkey": self.mr.rkey,  # type: ignore[attr-defined]
            "mtu": self.mtu,
        }

    def close(self) -> None:
        for obj in (self.qp, self.mr, self.cq, self.pd, self.ctx):
            try:
                obj.close()  # type: ignore[attr-defined]
            except Exception:
                pass


def open_link(device: str, port: int, gid_index: int, peer: int) -> Link:
    """Open `device`, register 2 x 16 KiB and make an RC QP toward `peer` (connected by `connect`)."""
    from arxtune.runtime.rdma.connection import e
    from pyverbs.cq import CQ
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPCap, QPInitAttr

    ctx = Context(name=device)
    try:
        mtu = ctx.query_port(port).active_mtu
        pd = PD(ctx)
        cq = CQ(ctx, 16, None, None, 0)
        mem = ctypes.create_string_buffer(2 * _MAX)
        mr = MR(pd, 2 * _MAX, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE, address=ctypes.addressof(mem))
        cap = QPCap(max_send_wr=4, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0))
    except BaseException:
        ctx.close()
        raise
    return Link(device, peer, ctx, pd, cq, qp, mr, mem, random.getrandbits(24), gid_index, mtu)


def connect(link: Link, port: int, remote: dict) -> None:
    """RESET -> RTS against the peer's `Link.info`."""
    from arxtune.runtime.rdma.connection import e
    from pyverbs.addr import AHAttr, GID, GlobalRoute
    from pyverbs.qp import QPAttr

    attr = QPAttr(port_num=port, path_mtu=min(link.mtu, remote["mtu"]))
    attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
    attr.dest_qp_num, attr.rq_psn, attr.sq_psn = remote["qpn"], remote["psn"], link.psn
    attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
    attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
    gr = GlobalRoute(dgid=GID(remote["gid"]), sgid_index=link.gid_index, hop_limit=64)
    attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=port)
    link.qp.to_rts(attr)  # type: ignore[attr-defined]


class PeerSilent(Exception):
    """The peer did not answer within the deadline."""


def run(link: Link, remote: dict, initiator: bool, timeout_s: float, sizes=SIZES, warmup=WARMUP, iters=ITERS) -> dict:
    """Ping-pong every size; the initiator returns {size: median half round trip in us}, the other side {}."""
    from arxtune.runtime.rdma.connection import e
    from pyverbs.wr import SGE, SendWR

    view = np.frombuffer(link.mem, dtype=np.uint8)  # type: ignore[call-overload]
    recv, send = view[:_MAX], view[_MAX:]
    results, seq = {}, 0
    for size in sizes:
        wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, send_flags=e.IBV_SEND_SIGNALED, sg=[SGE(link.base + _MAX, size, link.mr.lkey)])  # type: ignore[attr-defined]
        wr.set_wr_rdma(remote["rkey"], remote["addr"])
        halves = []
        for i in range(warmup + iters):
            seq = seq % 65535 + 1
            tag = seq.to_bytes(2, "little")
            if initiator:
                t0 = time.perf_counter_ns()
                _post(link, wr, send, size, tag, timeout_s)
                _wait(link, recv, size, tag, timeout_s)
                if i >= warmup:
                    halves.append((time.perf_counter_ns() - t0) / 2000)
            else:
                _wait(link, recv, size, tag, timeout_s)
                _post(link, wr, send, size, tag, timeout_s)
        if initiator:
            results[size] = statistics.median(halves)
    return results


def _post(link: Link, wr, send, size: int, tag: bytes, timeout_s: float) -> None:
    """Write the message whose last two bytes are `tag`, and reap its completion."""
    from arxtune.runtime.rdma.connection import cqe_status_to_str, e

    send[size - 2 : size] = np.frombuffer(tag, dtype=np.uint8)
    link.qp.post_send(wr)  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    spins = 0
    while True:
        spins += 1
        n, wcs = link.cq.poll(1)  # type: ignore[attr-defined]
        if n:
            if wcs[0].status != e.IBV_WC_SUCCESS:
                raise RuntimeError(
                    f"RDMA write to rank {link.peer} on {link.device} failed: {cqe_status_to_str(wcs[0].status)} (status {wcs[0].status})"
                )
            return
        if spins > _YIELD_AFTER:
            os.sched_yield()
        if time.monotonic() > deadline:
            raise PeerSilent(f"rank {link.peer}'s {link.device} did not acknowledge a write within {timeout_s:g} s")


def _wait(link: Link, recv, size: int, tag: bytes, timeout_s: float) -> None:
    """Poll the message's last two bytes until they hold `tag`."""
    want = np.frombuffer(tag, dtype=np.uint8)
    deadline = time.monotonic() + timeout_s
    spins = 0
    while not (recv[size - 2] == want[0] and recv[size - 1] == want[1]):
        spins += 1
        if spins % 256 == 0:
            if spins > _YIELD_AFTER:
                os.sched_yield()  # a software NIC (soft-RoCE) needs the CPU this loop would take
            if time.monotonic() > deadline:
                raise PeerSilent(f"rank {link.peer} sent nothing on {link.device} within {timeout_s:g} s")
