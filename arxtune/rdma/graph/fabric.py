"""The shared-memory fabric: the transport for proxies whose peers are on the same host.

Each proxy maps the peers' segments and, for a write, copies the payload into the
peer's inbox and then stores the sequence word: one thread, payload before flag,
and x86-64 stores become visible in program order, so a peer that sees the flag
sees the payload. It has the same hot-path methods as rdma.connection.Transport.
"""

from __future__ import annotations

import socket

from ..errors import RdmaUnavailable
from ..protocol import Layout, seq_of
from .segment import Segment


class ShmFabric:
    def __init__(self, own: Segment, peers: dict[int, Segment], rank: int, world: int):
        self.own, self.segments, self.rank, self.world = own, peers, rank, world
        self.layout: Layout = own.layout

    def begin(self, step: int, op: str) -> None:
        pass  # copies complete synchronously: a staging slot is free as soon as put() returns

    def put(self, step: int, peer: int, src_off: int, dst_off: int, nbytes: int, op: str) -> None:
        dst = self.segments[peer]
        dst.data[dst_off : dst_off + nbytes] = self.own.data[src_off : src_off + nbytes]
        dst.flags[self.layout.flag_index(step, self.rank, 0)] = seq_of(step)

    def wait_sends(self, step: int, op: str) -> None:
        pass

    def close(self) -> None:
        for seg in self.segments.values():
            seg.close()
        self.segments = {}


def open_fabric(own: Segment, rank: int, world: int, exchange) -> ShmFabric:
    """Swap (host, segment path) with every rank in one exchange and map the peers' segments.

    A rank that cannot take part still joins the exchange with its reason, so every
    rank raises the same error instead of waiting for it."""
    error = None
    infos = exchange({"host": socket.gethostname(), "path": own.path})
    hosts = sorted({i.get("host") for i in infos})
    if len(hosts) > 1:
        error = f"arxg: the shared-memory fabric needs every rank on one host, ranks are on {hosts}; use transport = 'verbs'"
    bad = [f"rank {r}: {i['error']}" for r, i in enumerate(infos) if i.get("error")]
    if bad or error:
        raise RdmaUnavailable("; ".join(bad) if bad else error)
    peers = {r: Segment(infos[r]["path"], own.layout) for r in range(world) if r != rank}
    return ShmFabric(own, peers, rank, world)
