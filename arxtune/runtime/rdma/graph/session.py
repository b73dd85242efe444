"""A rank's side of the graph engine: its segment, its proxy, and their errors.

Shared by the GPU rank (gpu.py) and the tests' CPU stand-in (tests/helpers/arxg_cpu_rank.py): both open a
Session, then run the same protocol against it. `check()` turns the segment's
error word, or a proxy that died, into the same errors as the eager arx path,
naming peer and op. `source()` says where a peer's part of a step is read:
over verbs the peer's proxy wrote it into this rank's inbox; over shared memory
it stays in the peer's staging slot, which this rank maps (as NCCL's SHM
transport has the receiving GPU read the sender's buffer), and the peer's proxy
only stores the flag.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import time
import socket
from dataclasses import dataclass, field

from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.errors import RdmaError, RdmaTimeout, RdmaUnavailable
from arxtune.runtime.rdma.protocol import Layout, stripes
from arxtune.runtime.rdma.graph.native import policy_ns
from arxtune.runtime.rdma.graph.plan import inbox_bytes
from arxtune.runtime.rdma.graph.proxy import ProxyArgs, ProxyHandle
from arxtune.runtime.rdma.graph.segment import (
    DESC,
    DOORBELL,
    ERR_PEER_TIMEOUT,
    ERR_PROXY_FAILED,
    ERR_PROXY_TIMEOUT,
    ERROR,
    HEARTBEAT,
    OP_NAMES,
    SENT,
    Segment,
    segment_path,
)

TRANSPORTS = ("auto", "shm", "verbs")
#: a proxy imports torch before it answers: seconds on a loaded machine, minutes in an emulated guest
SETUP_TIMEOUT_S = 300.0
#: a heartbeat older than this sends quick_check to the full check (a process poll): the proxy stores one
#: at least every few milliseconds while it runs, even when it only waits
HEARTBEAT_STALE_NS = 250_000_000


@dataclass
class Session:
    cfg: RdmaConfig
    rank: int
    world: int
    transport: str
    segment: Segment
    proxy: ProxyHandle
    #: shm: every peer's segment, mapped here, where its staged steps are read (verbs: none)
    peers: dict[int, Segment] = field(default_factory=dict)
    #: (error word, heartbeat word) as ctypes views, made on the first quick_check
    _words: tuple = field(default=(), repr=False, compare=False)

    @property
    def layout(self) -> Layout:
        return self.segment.layout

    def reads_staging(self, src: int) -> bool:
        """Whether rank `src`'s steps are read from its own staging (which holds every piece of a reduce-scatter)."""
        return src in self.peers

    def source(self, src: int, step: int, op: str, nbytes: int) -> tuple[Segment, int]:
        """(segment, byte offset in its protocol buffer) of rank `src`'s part of `step` for this rank.

        `nbytes` as on the wire (the op's input bytes). A reduce-scatter reads its own piece."""
        L = self.layout
        if not self.reads_staging(src):
            return self.segment, L.inbox(step, src)
        piece = self.rank * inbox_bytes(op, nbytes, self.world) if op == "reduce_scatter" else 0
        return self.peers[src], L.staging(step) + piece

    def flag_devices(self, op: str, nbytes: int) -> int:
        """How many per-device flags a receiver waits for (the transport stripes large writes)."""
        return len(stripes(inbox_bytes(op, nbytes, self.world), self.layout.ndev, self.cfg.stripe_min_bytes))

    def quick_check(self) -> None:
        """check() for every eager call: two words of the segment and the clock (no system call) while the
        error word is clear and the proxy's heartbeat is fresh; otherwise the full check."""
        words = self._words
        if not words:
            address = self.segment.address
            words = self._words = (ctypes.c_int64.from_address(address + 8 * ERROR), ctypes.c_int64.from_address(address + 8 * HEARTBEAT))
        error, beat = words
        if error.value or time.monotonic_ns() - beat.value > HEARTBEAT_STALE_NS:
            self.check()

    def check(self) -> None:
        """Raise the first recorded failure, or the proxy's death; return quietly if all is well."""
        code, peer, seq, message = self.segment.error()
        if code != ERR_PROXY_FAILED and not self.proxy.alive():
            # a dead proxy sends nothing, so the kernels time out on the peers: name the cause, not the symptom
            raise RdmaError(f"arxg: this rank's proxy exited ({self._proxy_state()}); nothing is sent any more")
        if code:
            step = seq - 1
            op = OP_NAMES.get(int(self.segment.control[DESC + 2 * self.layout.slot(max(step, 0))]), "unknown")
            t = f"{self.cfg.timeout_s:g} s"
            if code == ERR_PEER_TIMEOUT:
                raise RdmaTimeout(
                    f"arxg: rank {peer} sent nothing for step {step} within {t}: the peer stopped, "
                    f"crashed or runs a different sequence of collectives",
                    peer=peer,
                    op=op,
                )
            if code == ERR_PROXY_TIMEOUT:
                raise RdmaTimeout(f"arxg: this rank's proxy did not send step {step} within {t} ({self._proxy_state()})", op=op)
            raise RdmaError(f"arxg: the proxy failed at step {step}: {message}", peer=None if peer < 0 else peer, op=op)

    def _proxy_state(self) -> str:
        code = self.proxy.proc.poll()
        return "proxy running" if code is None else f"proxy exited with code {code}"

    def close(self) -> None:
        """Let the proxy send what was staged (bounded), then stop it and remove the segment."""
        self._words = ()  # views of the segment's memory go before it is unmapped
        ctrl, deadline = self.segment.control, time.monotonic() + self.cfg.timeout_s
        while ctrl[SENT] < ctrl[DOORBELL] and self.proxy.alive() and time.monotonic() < deadline:
            time.sleep(0.0005)
        self.proxy.close()
        for peer in self.peers.values():
            peer.close()
        self.peers = {}
        self.segment.close()


def open_session(cfg: RdmaConfig, rank: int, world: int, exchange, transport: str = "auto") -> Session:
    """Collective: agree on a segment name and a transport, create this rank's segment, start its proxy.

    `transport`: "shm" (every rank on this host), "verbs" (RDMA), "auto" (shm when
    every rank is on one host, else verbs)."""
    if transport not in TRANSPORTS:
        raise RdmaUnavailable(f"arxg: unknown transport {transport!r}; use one of {', '.join(TRANSPORTS)}")
    try:
        policy_ns()  # the proxy's wait policy, checked here where a bad setting can be named
    except ValueError as exc:
        raise RdmaUnavailable(f"arxg: {exc}") from None
    infos = exchange({"host": socket.gethostname(), "token": secrets.token_hex(6), "pid": os.getpid()})
    if transport == "auto":
        transport = "shm" if len({i["host"] for i in infos}) == 1 else "verbs"
    ndev = 1
    if transport == "verbs":  # the proxy's transport finds the same links; every peer is striped over as many
        from arxtune.runtime.rdma.connection import share_facts
        from arxtune.runtime.rdma.reach import narrowest

        ndev = narrowest(share_facts(cfg, rank, exchange))
    layout = Layout(world=world, slots=2, slot_bytes=cfg.max_bytes, ndev=ndev)
    segment = Segment(segment_path(infos[0]["token"], rank), layout, create=True)
    try:
        args = ProxyArgs(segment.path, (world, 2, cfg.max_bytes, ndev), rank, world, transport, cfg)
        proxy = ProxyHandle.start(args, exchange, max(cfg.timeout_s, SETUP_TIMEOUT_S))
    except BaseException:
        segment.close()
        raise
    session = Session(cfg, rank, world, transport, segment, proxy)
    if transport == "shm":  # every segment exists once every proxy is ready (their set-up is one exchange)
        try:
            session.peers = {r: Segment(segment_path(infos[0]["token"], r), layout) for r in range(world) if r != rank}
        except BaseException:
            session.close()
            raise
    return session


def local_exchanges(world: int) -> list:
    """Exchanges for `world` ranks that live in one process (threads): tests and benchmarks."""
    import threading

    box: dict[int, object] = {}
    barrier = threading.Barrier(world)

    def make(rank: int):
        def exchange(obj):
            box[rank] = obj
            barrier.wait()
            out = [box[r] for r in range(world)]
            barrier.wait()
            return out

        return exchange

    return [make(r) for r in range(world)]


def store_exchange(store, rank: int, world: int):
    """An exchange over a torch.distributed Store (a TCPStore): ranks in separate processes, no process group."""
    import pickle

    rounds = [0]

    def exchange(obj):
        n = rounds[0]
        rounds[0] += 1
        store.set(f"arxg/{n}/{rank}", pickle.dumps(obj))
        return [pickle.loads(store.get(f"arxg/{n}/{r}")) for r in range(world)]

    return exchange


def open_local(cfg: RdmaConfig, world: int, transport: str = "shm") -> list[Session]:
    """Open `world` sessions in this process at once (each rank's set-up blocks on the others)."""
    from concurrent.futures import ThreadPoolExecutor

    exchanges = local_exchanges(world)
    with ThreadPoolExecutor(world) as pool:
        futures = [pool.submit(open_session, cfg, r, world, exchanges[r], transport) for r in range(world)]
        return [f.result() for f in futures]
