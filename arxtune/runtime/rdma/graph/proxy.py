"""The proxy process of one rank: answers the doorbell in its segment by posting writes.

Why a process: a proxy thread inside the inference process shares its GIL, and
a handshake then costs ~1 ms; a separate process answers in microseconds. It is
started with a fresh interpreter (no CUDA state inherited), dies with its parent
(it checks the parent pid while idle; PR_SET_PDEATHSIG would fire when the
*thread* that started it exits, which kills proxies started from a worker
thread), and reports a
failure in the segment's error word, where the GPU kernels and the rank see it.

Set-up talks to the parent over stdin/stdout, one pickled message a line: the
transport's set-up exchanges go to the parent, which relays them over its gloo
group (`ProxyHandle.start`), so the proxy needs no rendezvous of its own.
"""

from __future__ import annotations

import base64
import ctypes
import os
import pickle
import select
import subprocess
import sys
import time
from dataclasses import dataclass

from arxtune.runtime.rdma.errors import RdmaError, RdmaTimeout, RdmaUnavailable
from arxtune.runtime.rdma.protocol import Layout
from arxtune.runtime.rdma.graph import native, native_verbs
from arxtune.runtime.rdma.graph.plan import plan
from arxtune.runtime.rdma.graph.segment import (
    BELLS,
    DESC,
    DOORBELL,
    ERR_PROXY_FAILED,
    HEARTBEAT,
    MAX_PARTS,
    OP_NAMES,
    PARTS,
    READY,
    SENT,
    Segment,
)

_PARENT_CHECK_NS = 500_000_000


@dataclass(frozen=True)
class ProxyArgs:
    """Everything the proxy needs, sent as its first line."""

    segment: str
    layout: tuple[int, int, int, int]  # Layout(world, slots, slot_bytes, ndev)
    rank: int
    world: int
    transport: str  # "shm" or "verbs"
    rdma_config: object = None  # RdmaConfig for "verbs"


def _send(stream, obj) -> None:
    stream.write(base64.b64encode(pickle.dumps(obj)) + b"\n")
    stream.flush()


def _recv(stream):
    line = stream.readline()
    if not line:
        raise EOFError("the other side closed the pipe")
    return pickle.loads(base64.b64decode(line))


# ---- the proxy process ------------------------------------------------------------
def _open_transport(args: ProxyArgs, seg: Segment, exchange):
    if args.transport == "shm":
        from arxtune.runtime.rdma.graph.fabric import open_fabric

        return open_fabric(seg, args.rank, args.world, exchange)
    if args.transport == "verbs":
        from arxtune.runtime.rdma.connection import open_transport

        # every peer striped over exactly the layout's ndev links: the kernels wait for that many flags from each
        return open_transport(args.rdma_config, args.rank, args.world, exchange, buf=seg.data_tensor(), width=args.layout[3])  # type: ignore[arg-type]
    raise RdmaUnavailable(f"arxg: unknown transport {args.transport!r}; use 'shm' or 'verbs'")


def serve(seg: Segment, transport, rank: int, world: int, parent: int) -> None:
    """Answer doorbells until the parent dies. Every staged step is sent, in order, once all its parts have rung.

    The hot path is a few dict lookups and the transport's puts: each (op, bytes, slot)
    is planned once, with the offsets of that slot already added."""
    ctrl, L = seg.control, seg.layout
    doorbell, sent = _word(seg, DOORBELL), _word(seg, SENT)
    bells = [_word(seg, BELLS + p) for p in range(MAX_PARTS)]
    steps: dict[tuple[int, int, int], tuple] = {}  # (op code, bytes, slot) -> (op name, puts)
    beat = _word(seg, HEARTBEAT)
    idle = _Idle(parent, beat, *native.policy_ns())
    done = sent.value
    while True:
        rung = doorbell.value
        if rung == done:
            if idle():
                return
            continue
        idle.reset()
        for seq in range(done + 1, rung + 1):
            step = seq - 1
            slot = L.slot(step)
            for bell in bells[1 : min(int(ctrl[PARTS + slot]), MAX_PARTS)]:
                while bell.value < seq:
                    if idle():
                        return
                idle.reset()
            key = (int(ctrl[DESC + 2 * slot]), int(ctrl[DESC + 2 * slot + 1]), slot)
            entry = steps.get(key)
            if entry is None:
                entry = steps[key] = _plan_step(key, L, rank, world)
            op, puts = entry
            transport.begin(step, op)
            for peer, src, dst, nbytes in puts:
                transport.put(step, peer, src, dst, nbytes, op)
            transport.wait_sends(step, op)
            sent.value = seq
        beat.value = time.monotonic_ns()
        done = rung


def nap_ns(idle: int, spin_ns: int, nap: int) -> int:
    """The wait policy (arxg_wait_nap in arxg_wait.h): how long to sleep after a poll that found nothing, `idle`
    ns after the last step; 0 = poll again."""
    return 0 if idle < spin_ns else nap


class _Idle:
    """Called on every idle poll of the Python loop: the C loops' wait policy without their futex (polls for
    the spin window after the last step, yielding the CPU now and then, then sleeps a nap between polls).
    Every 256th poll reads the clock into the heartbeat; says True once the parent has died."""

    def __init__(
        self, parent: int, beat: ctypes.c_int64, spin_ns: int, nap: int, clock=time.monotonic_ns, sleep=time.sleep, parent_pid=os.getppid
    ):
        self.parent, self.beat, self.spin_ns, self.nap = parent, beat, spin_ns, nap
        self.clock, self.sleep, self.parent_pid = clock, sleep, parent_pid
        self.polls, self.active = 0, clock()
        self.last_check = self.active

    def reset(self) -> None:
        """A step was sent: the window starts again."""
        self.active = self.clock()

    def __call__(self) -> bool:
        self.polls += 1
        if self.polls & 255:
            return False
        now = self.clock()
        self.beat.value = now
        nap = nap_ns(now - self.active, self.spin_ns, self.nap)
        if nap:
            self.sleep(nap / 1e9)
            self.polls |= 255  # the next idle poll reads the clock again
        elif not self.polls & 8191:
            os.sched_yield()
        if now - self.last_check > _PARENT_CHECK_NS:
            self.last_check = now
            return self.parent_pid() != self.parent
        return False


def _word(seg: Segment, index: int) -> ctypes.c_int64:
    """A control word as a ctypes view: reading .value costs less than indexing a numpy array."""
    return ctypes.c_int64.from_address(seg.address + 8 * index)


def _plan_step(key: tuple[int, int, int], L: Layout, rank: int, world: int) -> tuple[str, list[tuple[int, int, int, int]]]:
    code, nbytes, slot = key
    op = OP_NAMES.get(code, "unknown")
    staging, inbox = L.staging(slot), L.inbox(slot, rank)
    return op, [(w.peer, staging + w.src_offset, inbox, w.nbytes) for w in plan(op, nbytes, rank, world)]


def _choose_loop(args: ProxyArgs, seg: Segment, transport, parent: int):
    """(serve, "native" or "python"): the compiled loop of the transport where it builds and binds, else Python's."""
    plan_step = lambda key: _plan_step(key, seg.layout, args.rank, args.world)  # noqa: E731
    if args.transport == "shm":
        fn = native.load()
        if fn is not None:
            return (lambda: native.serve(fn, seg, transport, plan_step, parent)), "native"
    elif args.transport == "verbs":
        lib = native_verbs.load()
        if lib is not None:
            try:
                wiring = native_verbs.wiring_of(transport, lib)
            except native_verbs.Unavailable as exc:
                print(f"arxg: the verbs proxy's C loop cannot bind pyverbs's handles ({exc}); using the Python loop", file=sys.stderr)
            else:
                fast = native_verbs.NativeLoop(lib, seg, wiring, plan_step, timeout_s=transport.timeout_s)
                return (lambda: fast.run(lambda: os.getppid() == parent)), "native"
    return (lambda: serve(seg, transport, args.rank, args.world, parent)), "python"


def main() -> int:
    parent = os.getppid()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the message pipe
    args: ProxyArgs = _recv(stdin)
    seg = Segment(args.segment, Layout(*args.layout))

    def exchange(obj):
        _send(stdout, ("exchange", obj))
        return _recv(stdin)

    try:
        transport = _open_transport(args, seg, exchange)
    except (RdmaUnavailable, RdmaError, ValueError, OSError) as exc:
        _send(stdout, ("error", str(exc)))
        return 1
    loop, name = _choose_loop(args, seg, transport, parent)  # built before "ready": set-up's timeout covers it
    seg.control[HEARTBEAT] = time.monotonic_ns()
    seg.control[READY] = os.getpid()
    _send(stdout, ("ready", name))
    try:
        loop()
    except Exception as exc:  # any failure must reach the rank through the segment, not vanish
        peer = getattr(exc, "peer", None)
        seg.set_error(ERR_PROXY_FAILED, -1 if peer is None else peer, int(seg.control[SENT]) + 1, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        transport.close()
    return 0


# ---- the parent's side ----------------------------------------------------------
class ProxyHandle:
    """The running proxy of this rank, seen from the rank."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.loop = ""  # the proxy's step loop once it serves: "native" (C) or "python"

    @classmethod
    def start(cls, args: ProxyArgs, exchange, timeout_s: float) -> ProxyHandle:
        """Start the proxy, relay its set-up exchanges through `exchange`, return once it serves.

        Raises RdmaUnavailable with the proxy's reason, or RdmaTimeout if it stays silent."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "arxtune.runtime.rdma.graph.proxy"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        handle = cls(proc)
        try:
            _send(proc.stdin, args)
            while True:
                ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
                if not ready:
                    raise RdmaTimeout(f"arxg: the proxy said nothing for {timeout_s:g} s during set-up", op="connect")
                try:
                    kind, payload = _recv(proc.stdout)
                except EOFError:
                    raise RdmaUnavailable(
                        f"arxg: the proxy exited during set-up (code {proc.wait()}); its error is on stderr above"
                    ) from None
                if kind == "ready":
                    handle.loop = payload or ""
                    return handle
                if kind == "error":
                    raise RdmaUnavailable(payload)
                _send(proc.stdin, exchange(payload))
        except BaseException:
            handle.close()
            raise

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
