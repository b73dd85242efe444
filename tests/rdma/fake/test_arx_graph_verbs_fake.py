"""arxg's native verbs step against the Python one, without a device.

A fake NIC stands behind both loops: an RDMA write is a copy between segments
mapped in this process that lands, and completes, only when its completion
queue is polled, one post per poll (as late as a NIC may), and a write whose
keys do not cover its addresses completes in error. The C loop reaches it
through its table of verbs calls (ctypes callbacks); the Python loop
(proxy.serve) through a transport that posts exactly as rdma.connection.Transport
does. For the same doorbells both must post the same writes in the same order,
land the same bytes at every peer, and advance SENT only after the writes
completed.
"""

from __future__ import annotations

import ctypes
import os
import random
import threading
import time
from collections import deque

import numpy as np
import pytest

from arxtune.runtime.rdma.errors import RdmaError, RdmaTimeout
from arxtune.runtime.rdma.graph import native_verbs as nv
from arxtune.runtime.rdma.graph import proxy
from arxtune.runtime.rdma.graph.segment import BELLS, DESC, DOORBELL, HEARTBEAT, OP_CODES, PARTS, SENT, Segment
from arxtune.runtime.rdma.protocol import FLAG_BYTES, Layout, seq_of, stripes

pytestmark = pytest.mark.timeout(300)

WC_REM_ACCESS_ERR = 10  # IBV_WC_REM_ACCESS_ERR


@pytest.fixture(scope="module")
def lib():
    lib = nv.load()
    if lib is None:
        if os.environ.get("CI"):
            pytest.fail("the native verbs step does not build here: run scripts/install-build-deps.sh")
        pytest.skip("the native verbs step does not build here (no cc or no libibverbs-dev)")
    return lib


class FakeNic:
    """Every rank's devices at once. Handles: qp = 1 + index into self.links, cq = 1000 + rank * 10 + dev."""

    def __init__(self, segments: list[Segment], ndev: int):
        self.segments, self.ndev = segments, ndev
        world = len(segments)
        self.links = [(r, d, p) for r in range(world) for d in range(ndev) for p in range(world) if p != r]
        self.queues: dict[int, deque] = {}
        self.log: list[tuple] = []
        self.fail_post = 0  # errno the next posts return
        self.complete = True  # False: posts never complete (a NIC that stopped)
        self.ops = nv.Ops(nv.POST_FN(self._post), nv.POLL_FN(self._poll))

    # keys: lkey = 100 + 10 * rank + dev, rkey = 500 + 10 * rank + dev, each covering that rank's protocol buffer
    def lkey(self, rank, dev):
        return 100 + 10 * rank + dev

    def rkey(self, rank, dev):
        return 500 + 10 * rank + dev

    def qp(self, rank, dev, peer):
        return 1 + self.links.index((rank, dev, peer))

    def cq(self, rank, dev):
        return 1000 + 10 * rank + dev

    def qp_num(self, qp):
        return 7000 + qp

    def _covers(self, key, base_key, addr, length):
        for r, seg in enumerate(self.segments):
            for d in range(self.ndev):
                if key == base_key(r, d):
                    start = seg.data_address
                    return start <= addr and addr + length <= start + seg.layout.total_bytes
        return False

    def post(self, qp, writes, wr_id):
        """What a QP's post_send does: queue the chain on the QP's CQ (Python-side entry)."""
        if self.fail_post:
            return self.fail_post
        rank, dev, _ = self.links[qp - 1]
        for w in writes:
            self.log.append((self.links[qp - 1], *w, wr_id))
        self.queues.setdefault(self.cq(rank, dev), deque()).append((qp, list(writes), wr_id))
        return 0

    def poll(self, cq):
        """One queued post lands; its completion if its last write was signaled, else None; None when idle."""
        queue = self.queues.get(cq)
        if not queue or not self.complete:
            return None
        qp, writes, wr_id = queue.popleft()
        status = 0
        for laddr, raddr, length, lkey, rkey, _ in writes:
            if not (self._covers(lkey, self.lkey, laddr, length) and self._covers(rkey, self.rkey, raddr, length)):
                status = WC_REM_ACCESS_ERR
                break
            ctypes.memmove(raddr, laddr, length)
        return (wr_id, status, self.qp_num(qp)) if writes[-1][5] or status else None

    # ---- the C loop's table -----------------------------------------------------------
    def _post(self, qp, writes, n, wr_id):
        return self.post(qp, [(w.laddr, w.raddr, w.length, w.lkey, w.rkey, w.signaled) for w in writes[:n]], wr_id)

    def _poll(self, cq, n, out):
        got = self.poll(cq)
        if got is None:
            return 0
        out[0].wr_id, out[0].status, out[0].qp_num = got
        out[0].vendor_err = 0
        return 1


def wiring(nic: FakeNic, rank: int, stripe_min_bytes: int) -> nv.Wiring:
    """Device d is every peer's stripe d (twins on a switch), or, where the segments' layout has one flag per peer
    and the NIC two devices, a ring: rank+1 reached through device 0 only, rank+2 through device 1 only."""
    world, ndev = len(nic.segments), nic.ndev
    peers = [p for p in range(world) if p != rank]
    ring = nic.segments[rank].layout.ndev < ndev
    lanes = {p: [(p - rank) % world - 1] if ring else list(range(ndev)) for p in peers}
    return nv.Wiring(
        nic.segments[rank].layout,
        rank,
        nic.segments[rank].data_address,
        stripe_min_bytes,
        {(d, p): nic.qp(rank, d, p) for d in range(ndev) for p in peers},
        [nic.cq(rank, d) for d in range(ndev)],
        [nic.lkey(rank, d) for d in range(ndev)],
        {(d, p): (nic.segments[p].data_address, nic.rkey(p, d)) for d in range(ndev) for p in peers},
        [f"fake{d}" for d in range(ndev)],
        {nic.qp_num(nic.qp(rank, d, p)): (d, p) for d in range(ndev) for p in peers},
        lanes,
    )


class _Stop(Exception):
    pass


class PythonTransport:
    """rdma.connection.Transport's hot path (begin / put / wait_sends), posting to the fake NIC."""

    def __init__(self, nic: FakeNic, w: nv.Wiring):
        self.nic, self.w, self.layout = nic, w, w.layout
        self.posted: dict[tuple[int, int], int] = {}
        self.done: dict[tuple[int, int], int] = {}
        self.stop = False

    def begin(self, step, op):
        if self.stop:
            raise _Stop
        self.wait_sends(step - self.layout.slots, op)
        ctypes.c_int64.from_address(self.w.base + self.layout.flag_source(step)).value = seq_of(step)

    def put(self, step, peer, src_off, dst_off, nbytes, op):
        L, slot, lanes = self.layout, self.layout.slot(step), self.w.lanes[peer]
        for k, off, length in stripes(nbytes, len(lanes), self.w.stripe_min_bytes):
            dev = lanes[k]
            addr, rkey = self.w.remote[(dev, peer)]
            lkey = self.w.lkeys[dev]
            flag = (self.w.base + L.flag_source(slot), addr + L.flag(slot, self.w.rank, k), 8, lkey, rkey, 1)
            payload = [(self.w.base + src_off + off, addr + dst_off + off, length, lkey, rkey, 0)] if length else []
            assert self.nic.post(self.w.qps[(dev, peer)], payload + [flag], step) == 0
            self.posted[(dev, peer)] = step
            self.done.setdefault((dev, peer), -1)

    def wait_sends(self, step, op):
        deadline = time.monotonic() + 10
        while any(self.done[k] < min(step, p) for k, p in self.posted.items()):
            for cq in self.w.cqs:
                got = self.nic.poll(cq)
                if got is not None:
                    wr_id, status, qp_num = got
                    assert status == 0
                    self.done[self.w.link_of_qpn[qp_num]] = wr_id
            assert time.monotonic() < deadline


# steps as the ranks stage them: (op, bytes, parts); every slot is used several times
SCRIPT = [
    ("all_reduce", 1024, 1),
    ("all_gather", 64, 1),
    ("handshake", 0, 1),
    ("reduce_scatter", 3 * 6 * 64, 3),
    ("all_reduce", 8192, 2),
    ("all_reduce", 1024, 1),
    ("all_gather", 4096, 1),
    ("reduce_scatter", 3 * 6 * 64, 1),
    ("all_reduce", 8192, 1),
    ("handshake", 0, 1),
    ("all_gather", 64, 1),
]


def _segments(tmp_path, world, ndev, tag):
    L = Layout(world=world, slots=2, slot_bytes=16 << 10, ndev=ndev)
    return [Segment(str(tmp_path / f"{tag}-{r}"), L, create=True) for r in range(world)]


def _drive(nic: FakeNic, rank: int, start_loop, stop_loop, seed: int):
    """Play rank `rank`'s GPU side through SCRIPT against a loop running in a thread; after each step, what landed."""
    seg, L = nic.segments[rank], nic.segments[rank].layout
    world, rng, landed = len(nic.segments), random.Random(seed), []
    errors = []
    thread = threading.Thread(target=lambda: _catch(start_loop, errors), daemon=True)
    thread.start()
    ctrl = seg.control
    for k, (op, nbytes, parts) in enumerate(SCRIPT):
        if op == "reduce_scatter":
            nbytes = nbytes // 6 * world  # divisible by world, a multiple of 64 per piece
        slot, seq = L.slot(k), seq_of(k)
        data = bytes(rng.getrandbits(8) for _ in range(nbytes))
        seg.data[L.staging(k) : L.staging(k) + nbytes] = np.frombuffer(data, dtype=np.uint8)
        ctrl[DESC + 2 * slot], ctrl[DESC + 2 * slot + 1], ctrl[PARTS + slot] = OP_CODES[op], nbytes, parts
        ctrl[DOORBELL] = seq
        time.sleep(0.002)
        assert ctrl[SENT] == seq - 1 or parts == 1, "a step was sent before all its parts rang"
        for p in range(1, parts):
            ctrl[BELLS + p] = seq
        deadline = time.monotonic() + 20
        while ctrl[SENT] < seq and not errors:
            assert time.monotonic() < deadline, f"step {k} not sent"
            time.sleep(0.0005)
        assert not errors, errors
        snap = {
            p: bytes(nic.segments[p].data[L.inbox(k, rank) : L.inbox(k, rank) + L.slot_bytes])
            + bytes(nic.segments[p].data[L.flag(k, rank, 0) : L.flag(k, rank, 0) + L.ndev * FLAG_BYTES])
            for p in range(world)
            if p != rank
        }
        landed.append((op, nbytes, data, snap))
    stop_loop()
    thread.join(10)
    assert not thread.is_alive() and not errors, errors
    return landed


def _catch(fn, errors):
    try:
        fn()
    except _Stop:
        pass
    except BaseException as exc:  # reported to the driver
        errors.append(exc)


def _run_native(lib, nic, rank, stripe_min):
    stop = threading.Event()
    loop = nv.NativeLoop(
        lib,
        nic.segments[rank],
        wiring(nic, rank, stripe_min),
        _planner(nic, rank),
        ops_address=ctypes.addressof(nic.ops),
        timeout_s=10,
        idle_ns=2_000_000,
    )
    return _drive(nic, rank, lambda: loop.run(lambda: not stop.is_set()), stop.set, seed=rank)


def _run_python(nic, rank, stripe_min):
    t = PythonTransport(nic, wiring(nic, rank, stripe_min))
    world, seg = len(nic.segments), nic.segments[rank]

    def stop():
        t.stop = True
        ctrl, slot = seg.control, seg.layout.slot(int(seg.control[SENT]))
        ctrl[DESC + 2 * slot], ctrl[DESC + 2 * slot + 1], ctrl[PARTS + slot] = OP_CODES["handshake"], 0, 1
        ctrl[DOORBELL] = ctrl[SENT] + 1  # a step the transport refuses: serve() returns by raising

    return _drive(nic, rank, lambda: proxy.serve(seg, t, rank, world, os.getppid()), stop, seed=rank)


def _planner(nic, rank):
    world = len(nic.segments)
    return lambda key: proxy._plan_step(key, nic.segments[rank].layout, rank, world)


@pytest.mark.parametrize("world, ndev, width", [(2, 1, 1), (3, 1, 1), (3, 2, 2), (3, 2, 1)])
def test_the_native_step_posts_and_lands_what_the_python_step_does(lib, tmp_path, world, ndev, width):
    """width: links per peer (the layout's flags per peer); 2 devices and width 1 is a ring of three."""
    stripe_min = 2048  # 4 KiB and 8 KiB writes are striped over both devices when there are two
    results = {}
    for name in ("python", "native"):
        segments = _segments(tmp_path, world, width, name)
        nic = FakeNic(segments, ndev)
        try:
            landed = {
                r: (_run_native(lib, nic, r, stripe_min) if name == "native" else _run_python(nic, r, stripe_min)) for r in range(world)
            }
            bases = [s.data_address for s in segments]
            # the log with addresses made relative to each segment, so the two runs compare
            log = [
                (link, _rel(laddr, bases), _rel(raddr, bases), length, lkey, rkey, sig, wr_id)
                for link, laddr, raddr, length, lkey, rkey, sig, wr_id in nic.log
            ]
            results[name] = (landed, log)
        finally:
            for s in segments:
                s.close()
    assert results["native"][1] == results["python"][1]
    assert results["native"][0] == results["python"][0]
    # and what landed is right: each peer's inbox holds its piece of the staged step, each flag the step's number
    landed = results["native"][0]
    for rank in range(world):
        L = Layout(world=world, slots=2, slot_bytes=16 << 10, ndev=width)
        for k, (op, nbytes, data, snap) in enumerate(landed[rank]):
            if op == "handshake":
                continue
            for p, raw in snap.items():
                piece = nbytes // world
                want = data[p * piece : (p + 1) * piece] if op == "reduce_scatter" else data
                assert raw[: len(want)] == want, (rank, k, p)
                flags = [int.from_bytes(raw[L.slot_bytes + 8 * d : L.slot_bytes + 8 * d + 8], "little") for d in range(width)]
                devs = {d for d, _, _ in stripes(len(want), width, stripe_min)}
                assert all(flags[d] == seq_of(k) for d in devs), (rank, k, p, flags)
    if width < ndev:  # the ring: every write to a peer went over the one device that reaches it
        used = {(rank, dev, peer) for (rank, dev, peer), *_ in results["native"][1]}
        assert used == {(r, (p - r) % world - 1, p) for r in range(world) for p in range(world) if p != r}, used


def _rel(addr, bases):
    r = max((i for i, b in enumerate(bases) if b <= addr), key=lambda i: bases[i])
    return r, addr - bases[r]


def _one_step(lib, tmp_path, nic_setup, timeout_s=5.0):
    segments = _segments(tmp_path, 2, 1, "fail")
    nic = FakeNic(segments, 1)
    w = wiring(nic, 0, 1 << 30)
    nic_setup(nic, w)
    loop = nv.NativeLoop(
        lib, segments[0], w, _planner(nic, 0), ops_address=ctypes.addressof(nic.ops), timeout_s=timeout_s, idle_ns=2_000_000
    )
    ctrl = segments[0].control
    ctrl[DESC], ctrl[DESC + 1], ctrl[PARTS], ctrl[DOORBELL] = OP_CODES["all_reduce"], 256, 1, 1
    try:
        start = time.monotonic()
        loop.run(lambda: False)
        return None, time.monotonic() - start, ctrl[SENT]
    except RdmaError as exc:
        return exc, time.monotonic() - start, int(ctrl[SENT])
    finally:
        for s in segments:
            s.close()


def test_an_error_completion_names_the_peer_and_device_and_sends_nothing_more(lib, tmp_path):
    def bad_key(nic, w):
        w.remote[(0, 1)] = (w.remote[(0, 1)][0], 999)  # the peer's rkey is wrong: a remote access error

    exc, _, sent = _one_step(lib, tmp_path, bad_key)
    assert isinstance(exc, RdmaError) and not isinstance(exc, RdmaTimeout)
    assert "completion status 10" in str(exc) and exc.peer == 1 and exc.device == "fake0" and exc.op == "all_reduce"
    assert sent == 0


def test_a_failed_post_is_an_error(lib, tmp_path):
    def no_memory(nic, w):
        nic.fail_post = 12

    exc, _, sent = _one_step(lib, tmp_path, no_memory)
    assert isinstance(exc, RdmaError) and "posting a write failed" in str(exc) and "errno 12" in str(exc)
    assert exc.peer == 1 and sent == 0


def test_missing_completions_time_out(lib, tmp_path):
    def stalled(nic, w):
        nic.complete = False

    exc, took, sent = _one_step(lib, tmp_path, stalled, timeout_s=0.5)
    assert isinstance(exc, RdmaTimeout) and "not acknowledged within 0.5 s" in str(exc)
    assert 0.4 < took < 10 and sent == 0


class FakeQP(ctypes.c_void_p):
    """Stands in for pyverbs's QP object: the ibv_qp pointer sits in the object's C struct, not as an attribute."""

    qp_num = 0


def test_the_qp_handle_is_found_in_the_objects_struct_and_checked(lib):
    shape = (ctypes.c_int64 * 8)()
    lib.arxg_verbs_layout(shape)
    qp_size, ctx_at, scq_at, num_at, type_at, cq_size, cq_ctx_at, rc_type = list(shape)
    context, qp_mem, cq_mem = ctypes.create_string_buffer(64), ctypes.create_string_buffer(qp_size), ctypes.create_string_buffer(cq_size)
    ctypes.c_void_p.from_buffer(qp_mem, ctx_at).value = ctypes.addressof(context)
    ctypes.c_void_p.from_buffer(qp_mem, scq_at).value = ctypes.addressof(cq_mem)
    ctypes.c_uint32.from_buffer(qp_mem, num_at).value = 4242
    ctypes.c_uint32.from_buffer(qp_mem, type_at).value = rc_type
    ctypes.c_void_p.from_buffer(cq_mem, cq_ctx_at).value = ctypes.addressof(context)
    qp = FakeQP(ctypes.addressof(qp_mem))
    qp.qp_num = 4242
    assert nv.qp_handle(lib, qp) == ctypes.addressof(qp_mem)
    assert nv.cq_handle(ctypes.addressof(qp_mem), lib) == ctypes.addressof(cq_mem)
    qp.qp_num = 4243  # no word of the object points at this QP: refuse, do not guess
    with pytest.raises(nv.Unavailable, match="cannot find the ibv_qp of QP 4243"):
        nv.qp_handle(lib, qp)
    qp.qp_num = 4242
    ctypes.c_void_p.from_buffer(cq_mem, cq_ctx_at).value = 0  # its CQ is another device's
    with pytest.raises(nv.Unavailable):
        nv.qp_handle(lib, qp)


def test_the_native_loop_keeps_the_heartbeat_fresh_for_eager_calls(lib, tmp_path):
    """A rank's eager call trusts a fresh heartbeat instead of asking the kernel about the proxy process."""
    segments = _segments(tmp_path, 2, 1, "beat")
    nic = FakeNic(segments, 1)
    loop = nv.NativeLoop(
        lib, segments[0], wiring(nic, 0, 1 << 30), _planner(nic, 0), ops_address=ctypes.addressof(nic.ops), timeout_s=5, idle_ns=2_000_000
    )
    ctrl = segments[0].control
    try:
        ctrl[HEARTBEAT] = 0
        before = time.monotonic_ns()
        ctrl[DESC], ctrl[DESC + 1], ctrl[PARTS], ctrl[DOORBELL] = OP_CODES["all_reduce"], 256, 1, 1
        loop.run(lambda: False)
        assert ctrl[SENT] == 1
        assert before <= ctrl[HEARTBEAT] <= time.monotonic_ns()
    finally:
        for s in segments:
            s.close()
