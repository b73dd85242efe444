"""The shared-memory proxy's hot loop, compiled from serve_shm.c on first use, and the wait policy both C
loops share (arxg_wait.h).

A Python loop costs the proxy microseconds a step (bytecode, ctypes, dict
lookups) where its work, a flag store per peer, takes nanoseconds; the C loop
polls and stores without the interpreter. It is built by arxtune/runtime/native.py. Where no compiler
works, the proxy keeps its Python loop and says why once. `ARXTUNE_ARXG_NATIVE=0` keeps the Python loop.

The wait policy: poll for ARXTUNE_ARXG_SPIN_US after the last step (a CPU core
while it polls), then block for at most ARXTUNE_ARXG_NAP_US between polls; an
eager call wakes a blocked proxy before its kernel is launched.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

from arxtune.runtime import native as _native
from arxtune.runtime.rdma.protocol import Layout
from arxtune.runtime.rdma.graph.segment import ASLEEP, BELLS, DESC, DOORBELL, HEARTBEAT, PARTS, SENT, WAKE, Segment
from arxtune.runtime import env

ENV_SWITCH = env.ARXG_NATIVE.name
SOURCE = Path(__file__).with_name("serve_shm.c")
MAX_FLAGS = 16  # ARXG_MAX_FLAGS in serve_shm.c: peers a step can reach
IDLE, MISS = 0, 1
TABLE_SIZE = 256  # planned (op, bytes, slot) keys kept at once; a full table starts over
PARENT_CHECK_NS = 500_000_000


class Wait(ctypes.Structure):
    """arxg_wait in arxg_wait.h: the policy, the segment's words it uses, and what the loop did."""

    _fields_ = [
        ("spin_ns", ctypes.c_int64),
        ("nap_ns", ctypes.c_int64),
        ("asleep", ctypes.c_void_p),
        ("wake", ctypes.c_void_p),
        ("beat", ctypes.c_void_p),
        ("active", ctypes.c_int64),
        ("naps", ctypes.c_int64),
        ("wakes", ctypes.c_int64),
    ]


def policy_ns(environ=None) -> tuple[int, int]:
    """(spin window, nap) in nanoseconds from ARXTUNE_ARXG_SPIN_US and ARXTUNE_ARXG_NAP_US."""
    try:
        spin, nap = float(env.ARXG_SPIN_US.get(environ)), float(env.ARXG_NAP_US.get(environ))
    except ValueError as exc:
        raise ValueError(f"{env.ARXG_SPIN_US.name} and {env.ARXG_NAP_US.name} must be numbers of microseconds ({exc})") from None
    if not (0 <= spin <= 3.6e9 and 1 <= nap <= 1e6):
        raise ValueError(f"{env.ARXG_SPIN_US.name} must be 0 or more and {env.ARXG_NAP_US.name} from 1 to 1000000 microseconds")
    return int(spin * 1000), int(nap * 1000)


def wait_policy(seg: Segment, environ=None) -> Wait:
    """The wait policy of a proxy serving `seg`, its window starting now."""
    import time

    spin, nap = policy_ns(environ)
    return Wait(spin, nap, seg.address + 8 * ASLEEP, seg.address + 8 * WAKE, seg.address + 8 * HEARTBEAT, time.monotonic_ns(), 0, 0)


class Step(ctypes.Structure):
    _fields_ = [
        ("op", ctypes.c_int64),
        ("nbytes", ctypes.c_int64),
        ("slot", ctypes.c_int64),
        ("nflags", ctypes.c_int64),
        ("flags", ctypes.c_int64 * MAX_FLAGS),
    ]


def build() -> Path:
    """The compiled loop's path, compiling it if this source has not been built here. Raises OSError."""
    return _native.build(SOURCE)


def open_loop(source: Path, what: str):
    """A proxy loop's compiled library, or None where ARXTUNE_ARXG_NATIVE=0 or it cannot be built (`what` says
    which loop and what it needs, once, on stderr: the proxy then keeps its Python loop)."""
    if env.ARXG_NATIVE.get() == "0":
        return None
    try:
        return ctypes.CDLL(str(_native.build(source)))
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"arxg: {what} is unavailable ({exc}); using the Python loop", file=sys.stderr)
        return None


def load():
    """The loop's entry point, or None (with the reason on stderr) where it cannot be built."""
    lib = open_loop(SOURCE, "the proxy's C loop")
    if lib is None:
        return None
    fn = lib.arxg_serve_shm
    i64 = ctypes.c_int64
    fn.restype = i64
    fn.argtypes = [ctypes.c_void_p, i64, i64, i64, i64, i64, i64, ctypes.POINTER(Step), i64, ctypes.POINTER(Wait), i64, ctypes.POINTER(i64)]
    return fn


def serve(fn, seg: Segment, fabric, plan_step, parent: int) -> None:
    """Run the C loop until the parent dies; plan each new (op, bytes, slot) in Python as it first appears.

    `plan_step(key)` gives (op name, [(peer, src offset, dst offset, bytes)]); each write
    becomes the address of its peer's flag word, once."""
    L: Layout = seg.layout
    table, used = (Step * TABLE_SIZE)(), 0
    miss = (ctypes.c_int64 * 3)()
    wait = wait_policy(seg)
    while True:
        rc = fn(seg.address, DOORBELL, DESC, PARTS, BELLS, SENT, L.slots, table, used, ctypes.byref(wait), PARENT_CHECK_NS, miss)
        if rc == IDLE:
            if os.getppid() != parent:
                return
            continue
        key = (int(miss[0]), int(miss[1]), int(miss[2]))
        _, writes = plan_step(key)
        if len(writes) > MAX_FLAGS:
            raise ValueError(f"arxg: a step of {len(writes)} writes exceeds the C loop's {MAX_FLAGS}")
        if used == TABLE_SIZE:
            used = 0
        entry = table[used]
        entry.op, entry.nbytes, entry.slot, entry.nflags = key[0], key[1], key[2], len(writes)
        for i, (peer, *_) in enumerate(writes):
            entry.flags[i] = fabric.flag_address(peer, key[2])
        used += 1
