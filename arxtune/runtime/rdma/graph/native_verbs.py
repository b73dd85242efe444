"""The verbs proxy's hot loop, compiled from serve_verbs.c on first use.

Over verbs the Python loop spends microseconds a step building nothing but
pyverbs calls (post_send, cq.poll) and dict lookups; the C loop polls the
bells, posts the cached writes and reaps completions without the interpreter.
Set-up stays in pyverbs; this module hands the C loop the raw `ibv_qp *` and
`ibv_cq *` behind pyverbs's objects (`handles`), and plans each (op, bytes,
slot) once into the writes the Python transport would post (`plan_writes`).
Where the loop cannot be built (no compiler, no <infiniband/verbs.h>) or the
handles cannot be found, the proxy keeps its Python loop and says why once;
`ARXTUNE_ARXG_NATIVE=0` keeps the Python loop.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from arxtune.runtime import native as _native
from arxtune.runtime.rdma.errors import RdmaError, RdmaTimeout
from arxtune.runtime.rdma.graph.native import open_loop, wait_policy
from arxtune.runtime.rdma.graph.segment import BELLS, DESC, DOORBELL, HEARTBEAT, OP_NAMES, PARTS, SENT, Segment
from arxtune.runtime.rdma.protocol import FLAG_BYTES, Layout, stripes

SOURCE = Path(__file__).with_name("serve_verbs.c")
MAX_POSTS = 32  # ARXG_MAX_POSTS in serve_verbs.c
IDLE, MISS, FAILED, TIMEOUT = 0, 1, 2, 3
FAILED_POST = 0
TABLE_SIZE = 64  # planned (op, bytes, slot) keys kept at once; a full table starts over
REAP_SPINS = 1024  # polls of the CQs before each further poll yields the CPU (a software NIC needs it)
IDLE_NS = 500_000_000
i64, u32, u64 = ctypes.c_int64, ctypes.c_uint32, ctypes.c_uint64


class Write(ctypes.Structure):
    _fields_ = [("laddr", u64), ("raddr", u64), ("length", u32), ("lkey", u32), ("rkey", u32), ("signaled", u32)]


class Completion(ctypes.Structure):
    _fields_ = [("wr_id", u64), ("status", u32), ("vendor_err", u32), ("qp_num", u32), ("pad", u32)]


POST_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(Write), ctypes.c_int, u64)
POLL_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(Completion))


class Ops(ctypes.Structure):
    _fields_ = [("post", POST_FN), ("poll", POLL_FN)]


class Post(ctypes.Structure):
    _fields_ = [("qp", i64), ("nwrites", i64), ("writes", Write * 2)]


class VStep(ctypes.Structure):
    _fields_ = [("op", i64), ("nbytes", i64), ("slot", i64), ("nposts", i64), ("flag_src", ctypes.c_void_p), ("posts", Post * MAX_POSTS)]


class Loop(ctypes.Structure):
    _fields_ = [
        ("ctrl", ctypes.c_void_p),
        ("doorbell", i64),
        ("desc", i64),
        ("parts", i64),
        ("bells", i64),
        ("sent", i64),
        ("heartbeat", i64),
        ("slots", i64),
        ("qps", ctypes.POINTER(ctypes.c_void_p)),
        ("cqs", ctypes.POINTER(ctypes.c_void_p)),
        ("ncqs", i64),
        ("ops", ctypes.c_void_p),
        ("wait", ctypes.c_void_p),
        ("reap_spins", i64),
        ("idle_ns", i64),
        ("timeout_ns", i64),
    ]


@dataclass
class Wiring:
    """What the C loop needs of a connected transport: raw handles, and the addresses and keys of every write.

    Devices are indexed as in the transport (`dev`), peers by rank."""

    layout: Layout
    rank: int
    base: int  # the registered buffer's address (protocol offsets start here)
    stripe_min_bytes: int
    qps: dict[tuple[int, int], int]  # (dev, peer) -> struct ibv_qp *
    cqs: list[int]  # dev -> struct ibv_cq *
    lkeys: list[int]  # dev -> lkey of the registered buffer
    remote: dict[tuple[int, int], tuple[int, int]]  # (dev, peer) -> (peer's buffer address, rkey)
    devices: list[str]  # dev -> device name, for error messages
    link_of_qpn: dict[int, tuple[int, int]]  # qp_num -> (dev, peer), for error messages
    lanes: dict[int, list[int]]  # peer -> the dev of each stripe (the transport's links to it, in order)


class Unavailable(Exception):
    """The native loop cannot run here; the message says why (the proxy falls back to Python)."""


def build() -> Path:
    """The compiled loop's path, compiling it if this source has not been built here. Raises OSError."""
    return _native.build(SOURCE)


def load():
    """The compiled library with its signatures set, or None (with the reason on stderr)."""
    lib = open_loop(SOURCE, "the verbs proxy's C loop (it needs libibverbs-dev)")
    if lib is None:
        return None
    lib.arxg_serve_verbs.restype = i64
    lib.arxg_serve_verbs.argtypes = [ctypes.POINTER(Loop), ctypes.POINTER(VStep), i64, ctypes.POINTER(i64)]
    lib.arxg_verbs_real_ops.restype = ctypes.c_void_p
    lib.arxg_verbs_real_ops.argtypes = []
    lib.arxg_verbs_layout.restype = None
    lib.arxg_verbs_layout.argtypes = [ctypes.POINTER(i64)]
    return lib


# ---- handles behind pyverbs's objects ---------------------------------------------------
def _read(mem, address: int, nbytes: int) -> bytes | None:
    """`nbytes` at `address` of this process, or None where it is not mapped (no fault: read through /proc)."""
    if address <= 0 or address % 8:
        return None
    try:
        data = os.pread(mem, nbytes, address)
    except (OSError, OverflowError):
        return None
    return data if len(data) == nbytes else None


def qp_handle(lib, qp) -> int:
    """The `struct ibv_qp *` behind a pyverbs QP.

    rdma-core 61 and later expose it (`qp.qp`); older pyverbs (Debian 12 and
    Ubuntu 24.04 ship 44 and 50) keep it in the object's C struct only. There it
    is the one pointer-sized word of the object that points at an ibv_qp whose
    qp_num and type are this QP's and whose send CQ belongs to the same device
    context; candidates are read through /proc/self/mem, so a wrong guess cannot
    fault. Raises Unavailable when no single word fits."""
    shape = (i64 * 8)()
    lib.arxg_verbs_layout(shape)
    qp_size, ctx_at, scq_at, num_at, type_at, cq_size, cq_ctx_at, rc_type = list(shape)
    want = int(qp.qp_num)

    def fits(addr: int) -> bool:
        raw = _read(mem, addr, qp_size)
        if raw is None or int.from_bytes(raw[num_at : num_at + 4], "little") != want:
            return False
        if int.from_bytes(raw[type_at : type_at + 4], "little") != rc_type:
            return False
        ctx, scq = (int.from_bytes(raw[a : a + 8], "little") for a in (ctx_at, scq_at))
        cq = _read(mem, scq, cq_size)
        return ctx != 0 and cq is not None and int.from_bytes(cq[cq_ctx_at : cq_ctx_at + 8], "little") == ctx

    mem = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        exposed = getattr(qp, "qp", None)
        if isinstance(exposed, int):
            if fits(exposed):
                return exposed
            raise Unavailable(f"pyverbs's QP.qp ({exposed:#x}) is not an RC ibv_qp with qp_num {want}")
        words = ctypes.string_at(id(qp), type(qp).__basicsize__)
        found = {w for i in range(0, len(words) - 7, 8) if fits(w := int.from_bytes(words[i : i + 8], "little"))}
    finally:
        os.close(mem)
    if len(found) != 1:
        raise Unavailable(f"cannot find the ibv_qp of QP {want} in pyverbs's object ({len(found)} candidates)")
    return found.pop()


def cq_handle(qp_ptr: int, lib) -> int:
    """The send CQ (`struct ibv_cq *`) of a queue pair found by qp_handle."""
    shape = (i64 * 8)()
    lib.arxg_verbs_layout(shape)
    return ctypes.c_void_p.from_address(qp_ptr + shape[2]).value


def wiring_of(transport, lib) -> Wiring:
    """The C loop's view of a connected rdma.connection.Transport. Raises Unavailable."""
    qps, cqs, links = {}, [], {}
    for dev, nic in enumerate(transport.nics):
        for peer, qp in nic.qps.items():
            qps[(dev, peer)] = qp_handle(lib, qp)
            links[int(qp.qp_num)] = (dev, peer)
        found = {cq_handle(qps[(dev, p)], lib) for p in nic.qps}
        if len(found) != 1:
            raise Unavailable(f"the QPs of {nic.name} complete on {len(found)} CQs; the transport opens one")
        cqs.append(found.pop())
    remote = {}
    for peer in transport.peers:
        for dev, link in zip(transport.lanes[peer], transport.links[peer]):
            theirs = transport.remote[peer]["nics"][link.remote]
            remote[(dev, peer)] = (int(theirs["addr"]), int(theirs["rkey"]))
    return Wiring(
        transport.layout,
        transport.rank,
        transport.base,
        transport.cfg.stripe_min_bytes,
        qps,
        cqs,
        [int(n.mr.lkey) for n in transport.nics],
        remote,
        [n.name for n in transport.nics],
        links,
        {peer: list(transport.lanes[peer]) for peer in transport.peers},
    )


# ---- planning ---------------------------------------------------------------------------
def plan_writes(w: Wiring, slot: int, puts) -> list[tuple[tuple[int, int], list[tuple[int, int, int, int, int, int]]]]:
    """The chained posts of one step, as the Python transport posts them: for each put (peer, src, dst, bytes) and
    each of its stripes k, the payload (unsignaled) then this rank's flag word k (signaled), on the QP of the
    peer's k-th link. Each post is ((dev, peer), [(laddr, raddr, length, lkey, rkey, signaled), ...])."""
    L, posts = w.layout, []
    for peer, src, dst, nbytes in puts:
        lanes = w.lanes[peer]
        for k, off, length in stripes(nbytes, len(lanes), w.stripe_min_bytes):
            dev = lanes[k]
            addr, rkey = w.remote[(dev, peer)]
            lkey = w.lkeys[dev]
            flag = (w.base + L.flag_source(slot), addr + L.flag(slot, w.rank, k), FLAG_BYTES, lkey, rkey, 1)
            payload = [(w.base + src + off, addr + dst + off, length, lkey, rkey, 0)] if length else []
            posts.append(((dev, peer), payload + [flag]))
    return posts


class NativeLoop:
    """The C loop bound to one segment and one wiring; `run` serves until `alive()` says no."""

    def __init__(
        self,
        lib,
        seg: Segment,
        wiring: Wiring,
        plan_step: Callable,
        ops_address: int | None = None,
        timeout_s: float = 10.0,
        idle_ns: int = IDLE_NS,
    ):
        self.lib, self.seg, self.w, self.plan_step = lib, seg, wiring, plan_step
        keys = sorted(wiring.qps)
        self.qp_index = {k: i for i, k in enumerate(keys)}
        self.qps = (ctypes.c_void_p * max(len(keys), 1))(*[wiring.qps[k] for k in keys])
        self.cqs = (ctypes.c_void_p * max(len(wiring.cqs), 1))(*wiring.cqs)
        ops = lib.arxg_verbs_real_ops() if ops_address is None else ops_address
        L = seg.layout
        self.wait = wait_policy(seg)
        self.loop = Loop(
            seg.address,
            DOORBELL,
            DESC,
            PARTS,
            BELLS,
            SENT,
            HEARTBEAT,
            L.slots,
            self.qps,
            self.cqs,
            len(wiring.cqs),
            ops,
            ctypes.addressof(self.wait),
            REAP_SPINS,
            idle_ns,
            int(timeout_s * 1e9),
        )
        self.table, self.used = (VStep * TABLE_SIZE)(), 0
        self.out = (i64 * 4)()

    def run(self, alive: Callable[[], bool]) -> None:
        """Serve doorbells until alive() is false (asked whenever the loop has idled); raise what the loop reports."""
        while True:
            rc = self.lib.arxg_serve_verbs(ctypes.byref(self.loop), self.table, self.used, self.out)
            if rc == IDLE:
                if not alive():
                    return
            elif rc == MISS:
                self._add(int(self.out[0]), int(self.out[1]), int(self.out[2]))
            elif rc == FAILED:
                raise self._failure()
            elif rc == TIMEOUT:
                step, pending = int(self.out[0]), int(self.out[1])
                raise RdmaTimeout(
                    f"arx: writes of step {step} not acknowledged within {self.loop.timeout_ns / 1e9:g} s ({pending} completions missing)",
                    op=self._op(step),
                )
            else:
                raise RdmaError(f"arxg: the verbs loop returned {rc}")

    def _add(self, code: int, nbytes: int, slot: int) -> None:
        _, puts = self.plan_step((code, nbytes, slot))
        posts = plan_writes(self.w, slot, puts)
        if len(posts) > MAX_POSTS:
            raise ValueError(f"arxg: a step of {len(posts)} posts exceeds the C loop's {MAX_POSTS}")
        if self.used == TABLE_SIZE:
            self.used = 0
        entry = self.table[self.used]
        entry.op, entry.nbytes, entry.slot, entry.nposts = code, nbytes, slot, len(posts)
        entry.flag_src = self.w.base + self.w.layout.flag_source(slot) if posts else None
        for post, (key, writes) in zip(entry.posts, posts):
            post.qp, post.nwrites = self.qp_index[key], len(writes)
            for dst, fields in zip(post.writes, writes):
                dst.laddr, dst.raddr, dst.length, dst.lkey, dst.rkey, dst.signaled = fields
        self.used += 1

    def _op(self, step: int) -> str:
        ctrl, slot = self.seg.control, self.seg.layout.slot(max(step, 0))
        return OP_NAMES.get(int(ctrl[DESC + 2 * slot]), "unknown")

    def _failure(self) -> RdmaError:
        kind, code, vendor, where = (int(v) for v in self.out)
        op = self._op(int(self.seg.control[SENT]))
        if kind == FAILED_POST:
            dev, peer = next(k for k, i in self.qp_index.items() if i == where)
            return RdmaError(
                f"arx: posting a write failed: {os.strerror(code)} (errno {code})", device=self.w.devices[dev], peer=peer, op=op
            )
        if code < 0:
            return RdmaError("arx: polling the completion queue failed", op=op)
        dev, peer = self.w.link_of_qpn.get(where, (None, None))
        return RdmaError(
            f"arx: RDMA write failed: completion status {code} (vendor error {vendor}, qp {where})",
            device=None if dev is None else self.w.devices[dev],
            peer=peer,
            op=op,
        )
