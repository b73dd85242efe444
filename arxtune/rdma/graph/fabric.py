"""The shared-memory fabric: the transport for proxies whose peers are on the same host.

Each proxy maps the peers' segments and, for a write, copies the payload into the
peer's inbox and then stores the sequence word: one thread, payload before flag,
and x86-64 stores become visible in program order, so a peer that sees the flag
sees the payload. Addresses are worked out once per (peer, slot, size). It has
the same hot-path methods as rdma.connection.Transport.
"""

from __future__ import annotations

import ctypes
import platform
import socket

from ..errors import RdmaUnavailable
from ..protocol import Layout, seq_of
from .segment import Segment


class ShmFabric:
    def __init__(self, own: Segment, peers: dict[int, Segment], rank: int, world: int):
        self.own, self.segments, self.rank, self.world = own, peers, rank, world
        self.layout: Layout = own.layout
        self._puts: dict[tuple, tuple] = {}  # (peer, slot, src, dst, bytes) -> (dst address, src address, bytes, flag)

    def begin(self, step: int, op: str) -> None:
        pass  # copies complete synchronously: a staging slot is free as soon as put() returns

    def put(self, step: int, peer: int, src_off: int, dst_off: int, nbytes: int, op: str) -> None:
        key = (peer, self.layout.slot(step), src_off, dst_off, nbytes)
        target = self._puts.get(key)
        if target is None:
            dst, src, n, flag = self.addresses(*key)
            target = self._puts[key] = dst, src, n, ctypes.c_int64.from_address(flag)
        dst, src, n, flag = target
        ctypes.memmove(dst, src, n)
        flag.value = seq_of(step)

    def addresses(self, peer: int, slot: int, src_off: int, dst_off: int, nbytes: int) -> tuple[int, int, int, int]:
        """(destination, source, bytes, the peer's flag word) of a write from slot `slot`, bounds checked."""
        own, dst = self.own, self.segments[peer]
        for seg, off in ((own, src_off), (dst, dst_off)):
            if not 0 <= off <= off + nbytes <= len(seg.data):
                raise ValueError(f"a put of {nbytes} bytes at {off} falls outside the {len(seg.data)}-byte buffer")
        flag = dst.data_address + self.layout.flag(slot, self.rank, 0)
        return dst.data_address + dst_off, own.data_address + src_off, nbytes, flag

    def wait_sends(self, step: int, op: str) -> None:
        pass

    def close(self) -> None:
        self._puts = {}
        for seg in self.segments.values():
            seg.close()
        self.segments = {}


def open_fabric(own: Segment, rank: int, world: int, exchange) -> ShmFabric:
    """Swap (host, segment path) with every rank in one exchange and map the peers' segments.

    A rank that cannot take part still joins the exchange with its reason, so every
    rank raises the same error instead of waiting for it."""
    error = None if platform.machine() in ("x86_64", "AMD64") else (
        f"arxg: the shared-memory fabric relies on x86-64 store order; this is {platform.machine()}: use transport = 'verbs'")
    infos = exchange({"host": socket.gethostname(), "path": own.path, "error": error})
    hosts = sorted({i.get("host") for i in infos})
    if len(hosts) > 1 and error is None:
        error = f"arxg: the shared-memory fabric needs every rank on one host, ranks are on {hosts}; use transport = 'verbs'"
    bad = [f"rank {r}: {i['error']}" for r, i in enumerate(infos) if i.get("error")]
    if bad or error:
        raise RdmaUnavailable("; ".join(bad) if bad else error)
    peers = {r: Segment(infos[r]["path"], own.layout) for r in range(world) if r != rank}
    return ShmFabric(own, peers, rank, world)
