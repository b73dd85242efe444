"""Triton kernels of the graph engine: one kernel per collective (stage, ring, wait, finish).

It reads the step number from a device-resident counter (step, programs
arrived, unused, verdict) that it advances, so a captured graph replays
correctly any number of times. The segment is host memory the GPU reaches
either registered with CUDA or through the host's page tables (memory.py);
the kernels read and write it directly. Ordering: every program rings
its own bell with a system-scope release store once its share is staged
(program 0 rings the doorbell, after the step's descriptor), so the proxy
that has seen every part's bell sees the whole payload, and no program waits
on another before the proxy may send. Flags are read with system-scope
acquire loads before the payload they guard. Every wait is bounded by
%globaltimer: on timeout it records the error in the segment and the kernel
skips its work instead of spinning forever.
"""

from __future__ import annotations

import triton
import triton.language as tl

from arxtune.runtime.rdma.graph import segment as _seg

# BLOCK: elements per program; MAX_WORLD: ranks the sources table has room for; NUM_WARPS: one warp per
# program, since Triton runs scalar code on every warp, so each extra warp of the polling program adds a
# read of host memory to every poll (4 warps doubled a handshake on the H200).
from arxtune.runtime.rdma.graph.abi import BLOCK, MAX_WORLD, NUM_WARPS  # noqa: F401

# control-word indices and error codes, as compile-time constants for the kernels
DESC = tl.constexpr(_seg.DESC)
_MAX_WORLD = tl.constexpr(MAX_WORLD)
DOORBELL = tl.constexpr(_seg.DOORBELL)
PARTS = tl.constexpr(_seg.PARTS)
BELLS = tl.constexpr(_seg.BELLS)
SENT = tl.constexpr(_seg.SENT)
ERROR = tl.constexpr(_seg.ERROR)
ERROR_PEER = tl.constexpr(_seg.ERROR_PEER)
ERROR_SEQ = tl.constexpr(_seg.ERROR_SEQ)
ERR_PEER_TIMEOUT = tl.constexpr(_seg.ERR_PEER_TIMEOUT)
ERR_PROXY_TIMEOUT = tl.constexpr(_seg.ERR_PROXY_TIMEOUT)


@triton.jit
def _load_sys(ptr):
    """Acquire-load a word of host memory. Triton runs scalar code on every thread, and 128 threads
    polling a host word cost 128 PCIe reads a poll: lane 0 of each warp reads and broadcasts."""
    return tl.inline_asm_elementwise(
        """{
        .reg .pred p;
        .reg .u32 lane;
        .reg .b32 lo, hi;
        mov.u32 lane, %laneid;
        setp.eq.u32 p, lane, 0;
        mov.b64 $0, 0;
        @p ld.acquire.sys.global.u64 $0, [$1];
        mov.b64 {lo, hi}, $0;
        shfl.sync.idx.b32 lo, lo, 0, 0x1f, 0xffffffff;
        shfl.sync.idx.b32 hi, hi, 0, 0x1f, 0xffffffff;
        mov.b64 $0, {lo, hi};
    }""",
        "=l,l",
        [ptr],
        dtype=tl.int64,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _store_sys(ptr, value):
    """Release-store a word of host memory, from thread 0 of the program only."""
    tl.inline_asm_elementwise(
        """{
        .reg .pred p;
        .reg .u32 tid;
        mov.u32 tid, %tid.x;
        setp.eq.u32 p, tid, 0;
        @p st.release.sys.global.u64 [$1], $2;
        mov.u32 $0, 0;
    }""",
        "=r,l,l",
        [ptr, value],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _store_sys_relaxed(ptr, value):
    """Store a word of host memory from thread 0, unordered (a release store follows it)."""
    tl.inline_asm_elementwise(
        """{
        .reg .pred p;
        .reg .u32 tid;
        mov.u32 tid, %tid.x;
        setp.eq.u32 p, tid, 0;
        @p st.relaxed.sys.global.u64 [$1], $2;
        mov.u32 $0, 0;
    }""",
        "=r,l,l",
        [ptr, value],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _load_gpu(ptr):
    """Acquire-load a word of device memory (lane 0 of each warp, broadcast)."""
    return tl.inline_asm_elementwise(
        """{
        .reg .pred p;
        .reg .u32 lane;
        .reg .b32 lo, hi;
        mov.u32 lane, %laneid;
        setp.eq.u32 p, lane, 0;
        mov.b64 $0, 0;
        @p ld.acquire.gpu.global.u64 $0, [$1];
        mov.b64 {lo, hi}, $0;
        shfl.sync.idx.b32 lo, lo, 0, 0x1f, 0xffffffff;
        shfl.sync.idx.b32 hi, hi, 0, 0x1f, 0xffffffff;
        mov.b64 $0, {lo, hi};
    }""",
        "=l,l",
        [ptr],
        dtype=tl.int64,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _store_gpu(ptr, value):
    """Release-store a word of device memory from thread 0."""
    tl.inline_asm_elementwise(
        """{
        .reg .pred p;
        .reg .u32 tid;
        mov.u32 tid, %tid.x;
        setp.eq.u32 p, tid, 0;
        @p st.release.gpu.global.u64 [$1], $2;
        mov.u32 $0, 0;
    }""",
        "=r,l,l",
        [ptr, value],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _now_ns():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def describe(ctrl, slot, op_code, nbytes, parts):
    """Describe the step staged in `slot` (op, bytes, parts that stage it) for the proxy;
    the doorbell's release store must follow."""
    _store_sys_relaxed(ctrl + DESC + 2 * slot, op_code)
    _store_sys_relaxed(ctrl + DESC + 2 * slot + 1, nbytes)
    _store_sys_relaxed(ctrl + PARTS + slot, parts)


@triton.jit
def ring(ctrl, slot, op_code, nbytes, seq):
    """Describe a step staged by one part, then ring the doorbell with its sequence number:
    the release store puts the descriptor before the doorbell for the proxy."""
    describe(ctrl, slot, op_code, nbytes, 1)
    _store_sys(ctrl + DOORBELL, seq)


@triton.jit
def _wait_at_least(word, want, ctrl, deadline, code, peer):
    """Spin until *word >= want (host memory), another wait failed, or the deadline; True when it arrived.

    Every poll is a PCIe round trip, so the error word is read only every 32nd poll."""
    v = _load_sys(word)
    err = v * 0
    polls = v * 0
    now = _now_ns()
    while (v < want) & (err == 0) & (now < deadline):
        v = _load_sys(word)
        now = _now_ns()
        polls += 1
        if polls % 32 == 0:
            err = _load_sys(ctrl + ERROR)
    ok = v >= want
    if v < want:
        err = _load_sys(ctrl + ERROR)
        if err == 0:
            _store_sys(ctrl + ERROR_PEER, peer)
            _store_sys(ctrl + ERROR_SEQ, want)
            _store_sys(ctrl + ERROR, code)
    return ok


@triton.jit
def _gate_wait(gate, seq, deadline):
    """Programs other than 0 wait for program 0's verdict on this step in device memory
    (+seq: arrived, -seq: failed): one poller of host memory per kernel, not one per program
    (polls of one host word by many programs serialise on PCIe)."""
    g = _load_gpu(gate)
    now = _now_ns()
    while (g != seq) & (g != -seq) & (now < deadline):
        g = _load_gpu(gate)
        now = _now_ns()
    return g == seq


# Not specialised on the rank: ranks sharing a process (tests, benchmarks) must share one compiled
# kernel, since loading a second one waits for the GPU to idle while the first spins for its peer.
@triton.jit(do_not_specialize=["rank"])
def collective_kernel(
    inp,
    out,
    staging,
    sources,
    flags,
    ctrl,
    counter,
    rank,
    n_stage,
    n_part,
    slot_elems,
    nbytes,
    ndev_used,
    op_code,
    timeout_ns,
    OP: tl.constexpr,
    WORLD: tl.constexpr,
    NDEV: tl.constexpr,
    INT_ACC: tl.constexpr,
    BLOCK: tl.constexpr,  # noqa: F811 (Triton's constexpr, given abi.BLOCK)
):
    """One collective in one kernel: stage, ring, wait for the peers' flags, finish.

    The grid is persistent (at most one program per multiprocessor: gpu.py caps it) so every program is resident while program 0 spins: each program loops
    over its blocks. Staging into slot `step % 2` needs no wait for this rank's proxy:
    step - 2 sent from that slot reached every peer before they sent us step - 1,
    which this rank has already received (every op exchanges with every peer).
    A failed step fails every later one (device-side verdicts), so a broken session
    never reads a half-written inbox as data.

    The same argument keeps a slot until every peer has read it where peers read this rank's
    staging itself (the shared-memory fabric): they read step - 2 before they staged step - 1.

    OP 0 all_reduce: out[i] = sum_src part_src[i]; OP 1 all_gather: out[src*n + i] = part_src[i];
    OP 2 reduce_scatter: like 0, this rank's part is inp[rank*n:]. A peer's part of the step in
    slot s starts at address sources[s*MAX_WORLD + src], plus this rank's piece where
    sources[2*MAX_WORLD + src] is 1 (a peer's staging holds every piece; an inbox region only ours).
    The table is read at the start, off the path from the flag to the data."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    step = tl.load(counter)
    seq = step + 1
    slot = step % 2
    deadline = _now_ns() + timeout_ns
    healthy = (step == 0) | (tl.load(counter + 3) != -step)  # the previous step's verdict (-step: it failed)
    piece = rank * n_part if OP == 2 else 0  # this rank's piece of a reduce-scatter input
    ranks = tl.arange(0, _MAX_WORLD)
    where = tl.load(sources + slot * _MAX_WORLD + ranks)
    scaled = tl.load(sources + 2 * _MAX_WORLD + ranks) * piece
    offs0 = tl.arange(0, BLOCK)
    if healthy:
        for b in range(pid, tl.cdiv(n_stage, BLOCK), nprog):
            offs = b * BLOCK + offs0
            mask = offs < n_stage
            tl.store(staging + slot * slot_elems + offs, tl.load(inp + offs, mask=mask), mask=mask)
    if pid == 0:
        describe(ctrl, slot, op_code, nbytes, nprog.to(tl.int64))
    tl.debug_barrier()  # every thread's staging stores precede thread 0's release store of the bell
    if pid == 0:
        _store_sys(ctrl + DOORBELL, seq)
    else:
        _store_sys(ctrl + BELLS + pid, seq)
    if nprog > 1:  # the last program to arrive advances the step: every program has read it by then
        if tl.atomic_add(counter + 1, 1, sem="acq_rel") == nprog - 1:
            tl.store(counter + 1, 0)
            tl.store(counter, seq)
    else:
        tl.store(counter, seq)
    if pid == 0:
        ok = healthy
        for src in tl.static_range(WORLD):
            if src != rank:
                for dev in tl.static_range(NDEV):
                    if (dev < ndev_used) & ok:
                        ok = _wait_at_least(flags + (slot * WORLD + src) * NDEV + dev, seq, ctrl, deadline, ERR_PEER_TIMEOUT, src)
        _store_gpu(counter + 3, tl.where(ok, seq, -seq))
    else:
        ok = _gate_wait(counter + 3, seq, deadline)
    if ok:
        for b in range(pid, tl.cdiv(n_part, BLOCK), nprog):
            offs = b * BLOCK + offs0
            mask = offs < n_part
            if INT_ACC:
                acc = tl.zeros([BLOCK], dtype=tl.int32)
            else:
                acc = tl.zeros([BLOCK], dtype=tl.float32)
            # no branch on the rank: every source's loads are in flight at once (host reads cost a round trip)
            own = tl.load(inp + piece + offs, mask=mask)
            for src in tl.static_range(WORLD):
                start = tl.sum(tl.where(ranks == src, where, 0), axis=0)
                part = start.to(tl.pointer_type(inp.dtype.element_ty)) + tl.sum(tl.where(ranks == src, scaled, 0), axis=0)
                peer = tl.load(part + offs, mask=mask & (src != rank))
                x = tl.where(src == rank, own, peer)
                if OP == 1:
                    tl.store(out + src * n_part + offs, x, mask=mask)
                else:
                    acc += x.to(acc.dtype)
            if OP != 1:
                tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def handshake_kernel(ctrl, counter, op_code, timeout_ns):
    """Ring the doorbell for a step with no payload and wait for the proxy's answer: a step's floor."""
    step = tl.load(counter)
    seq = step + 1
    slot = step % 2
    ring(ctrl, slot, op_code, 0, seq)
    _wait_at_least(ctrl + SENT, seq, ctrl, _now_ns() + timeout_ns, ERR_PROXY_TIMEOUT, -1)
    tl.store(counter, seq)
