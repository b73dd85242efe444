"""The shared-memory fabric: the transport for proxies whose peers are on the same host.

Nothing is copied: a peer reads a step's payload straight from this rank's
staging slot (Session.source), which it maps, so the proxy's part of a put is
the peer's flag word alone. The rank's release store of the doorbell puts its
staging before the doorbell; the proxy stores the flag after reading the
doorbell (x86-64 keeps a store after an earlier load; the C loop also says so
with acquire/release atomics); the peer reads the staging after its acquire of
the flag. Why the slot may then be reused: see kernels.collective_kernel. It
has the same hot-path methods as rdma.connection.Transport.
"""

from __future__ import annotations

import ctypes
import platform
import socket

from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.protocol import Layout, seq_of
from arxtune.runtime.rdma.graph.segment import Segment


class ShmFabric:
    def __init__(self, own: Segment, peers: dict[int, Segment], rank: int, world: int):
        self.own, self.segments, self.rank, self.world = own, peers, rank, world
        self.layout: Layout = own.layout
        self._flags: dict[tuple[int, int], ctypes.c_int64] = {}  # (peer, slot) -> that peer's flag word for us

    def begin(self, step: int, op: str) -> None:
        pass

    def put(self, step: int, peer: int, src_off: int, dst_off: int, nbytes: int, op: str) -> None:
        """Tell `peer` that this rank's part of `step` is staged: its flag word, nothing copied."""
        key = (peer, self.layout.slot(step))
        flag = self._flags.get(key)
        if flag is None:
            flag = self._flags[key] = ctypes.c_int64.from_address(self.flag_address(*key))
        flag.value = seq_of(step)

    def flag_address(self, peer: int, slot: int) -> int:
        """Where `peer` waits for this rank's steps in `slot`."""
        return self.segments[peer].data_address + self.layout.flag(slot, self.rank, 0)

    def wait_sends(self, step: int, op: str) -> None:
        pass

    def close(self) -> None:
        self._flags = {}
        for seg in self.segments.values():
            seg.close()
        self.segments = {}


def open_fabric(own: Segment, rank: int, world: int, exchange) -> ShmFabric:
    """Swap (host, segment path) with every rank in one exchange and map the peers' segments.

    A rank that cannot take part still joins the exchange with its reason, so every
    rank raises the same error instead of waiting for it."""
    error = (
        None
        if platform.machine() in ("x86_64", "AMD64")
        else (f"arxg: the shared-memory fabric relies on x86-64 memory order; this is {platform.machine()}: use transport = 'verbs'")
    )
    infos = exchange({"host": socket.gethostname(), "path": own.path, "error": error})
    hosts = sorted({i.get("host") for i in infos})
    if len(hosts) > 1 and error is None:
        error = f"arxg: the shared-memory fabric needs every rank on one host, ranks are on {hosts}; use transport = 'verbs'"
    bad = [f"rank {r}: {i['error']}" for r, i in enumerate(infos) if i.get("error")]
    if bad or error:
        raise RdmaUnavailable("; ".join(bad) if bad else error)
    peers = {r: Segment(infos[r]["path"], own.layout) for r in range(world) if r != rank}
    return ShmFabric(own, peers, rank, world)
