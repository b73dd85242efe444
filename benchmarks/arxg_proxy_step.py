"""What one step costs arxg's proxy: its Python loop against its C loop, over one transport.

Two ranks open sessions in this process (their proxies are separate processes,
as always); this process plays rank 0's GPU side: it writes a step's descriptor,
rings the doorbell and spins until the proxy's SENT word says the step's writes
completed, one step at a time (with --pin, rank 0's proxy gets a CPU of its own, as on a
serving host; on a shared machine pinning only adds waits). A step's time is that round trip: the proxy's
poll, its posts and completion reaping (verbs) or its flag stores (shm), plus
the fabric. `handshake` steps post nothing (the loop's own floor); `all_reduce`
steps post one payload + flag write to the peer. The same steps run under both
loops (ARXTUNE_ARXG_NATIVE=0/1 when the proxies start), and the ratio is
python / native of the medians.

    python benchmarks/arxg_proxy_step.py --transport shm          # the host
    python benchmarks/arxg_proxy_step.py --transport verbs        # inside the soft-RoCE guest

Under QEMU's software CPU (the lab guest) the times are emulated: compare the
ratio, not the microseconds.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from arxtune.runtime import env
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.graph import session as session_mod
from arxtune.runtime.rdma.graph.segment import DESC, DOORBELL, OP_CODES, PARTS, SENT

LOOPS = ("python", "native")
_SPINS = 2000  # polls of SENT before each further poll yields


def pin(sessions) -> None:
    """Rank 0's proxy alone on the last CPU; this process and the idle peer's proxy on the others. Without it, on a
    2-CPU machine three busy processes take turns by time slice, and a step's time is the scheduler's, not the loop's."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return
    os.sched_setaffinity(sessions[0].proxy.proc.pid, {cpus[-1]})
    for pid in (0, sessions[1].proxy.proc.pid):
        os.sched_setaffinity(pid, set(cpus[:-1]))


def measure(transport: str, loop: str, ops: list[tuple[str, int]], steps: int, warmup: int, pinned: bool) -> list[dict]:
    os.environ[env.ARXG_NATIVE.name] = "1" if loop == "native" else "0"
    session_mod.SETUP_TIMEOUT_S = 900.0  # proxies import torch: minutes under emulation
    cfg = RdmaConfig.resolve({"max_bytes": max(n for _, n in ops) or 4096, "timeout_s": 60})
    sessions = session_mod.open_local(cfg, 2, transport)
    try:
        got = [s.proxy.loop for s in sessions]
        if got != [loop, loop]:
            raise SystemExit(f"arxg_proxy_step: asked for the {loop} loop, the proxies run {got}")
        if pinned:
            pin(sessions)
        seg = sessions[0].segment
        ctrl, seq, rows = seg.control, int(seg.control[SENT]), []
        for op, nbytes in ops:
            code, times = OP_CODES[op], []
            for i in range(warmup + steps):
                slot = seq % 2  # step seq (0-based) uses slot seq % slots; the next sequence number is seq + 1
                ctrl[DESC + 2 * slot], ctrl[DESC + 2 * slot + 1], ctrl[PARTS + slot] = code, nbytes, 1
                seq += 1
                deadline = time.monotonic() + 60
                t0 = time.perf_counter_ns()
                ctrl[DOORBELL] = seq
                spins = 0
                while ctrl[SENT] < seq:
                    spins += 1
                    if spins < _SPINS:
                        continue
                    os.sched_yield()  # after a while, leave the CPU to the proxies (and a software NIC)
                    if time.monotonic() > deadline:
                        sessions[0].check()
                        raise SystemExit(f"arxg_proxy_step: step {seq - 1} not sent within 60 s")
                t1 = time.perf_counter_ns()
                if i >= warmup:
                    times.append((t1 - t0) / 1e3)
            sessions[0].check()
            q = statistics.quantiles(times, n=10)
            rows.append(
                {
                    "transport": transport,
                    "loop": loop,
                    "op": op,
                    "bytes": nbytes,
                    "steps": steps,
                    "median_us": statistics.median(times),
                    "p10_us": q[0],
                    "p90_us": q[-1],
                }
            )
        return rows
    finally:
        for s in sessions:
            s.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", choices=("shm", "verbs"), required=True)
    ap.add_argument("--steps", type=int, default=2000, help="timed steps per (loop, op)")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--bytes", type=int, default=16 << 10, help="all_reduce payload")
    ap.add_argument("--pin", action="store_true", help="pin rank 0's proxy to a CPU of its own (a machine nobody else uses)")
    ap.add_argument("--out", type=Path, help="write <transport>.csv here as well")
    args = ap.parse_args()
    ops = [("handshake", 0), ("all_reduce", args.bytes)]
    rows = []
    for loop in LOOPS:
        rows += measure(args.transport, loop, ops, args.steps, args.warmup, args.pin)
    guest = os.environ.get("ARXTUNE_LAB_GUEST") == "1"
    print(
        f"# arxg proxy step, {args.transport}, {platform.machine()}, {os.cpu_count()} CPUs"
        + (" (soft-RoCE guest under QEMU TCG: emulated times, read the ratio only)" if guest else "")
    )
    print(f"{'op':<11} {'bytes':>6} {'loop':<7} {'median_us':>10} {'p10_us':>8} {'p90_us':>8}")
    for r in rows:
        print(f"{r['op']:<11} {r['bytes']:>6} {r['loop']:<7} {r['median_us']:>10.2f} {r['p10_us']:>8.2f} {r['p90_us']:>8.2f}")
    for op, nbytes in ops:
        med = {r["loop"]: r["median_us"] for r in rows if r["op"] == op}
        print(f"ratio {op} {nbytes} B: python / native = {med['python'] / med['native']:.2f}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / f"{args.transport}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
