"""What arxg's proxy wait policy costs: the CPU a proxy takes while idle, and, on a GPU, the call it serves
after GPU work of various lengths or after an idle gap, per policy.

    python benchmarks/arxg_proxy_wait.py                # CPU use of an idle proxy, per policy (no GPU needed)
    python benchmarks/arxg_proxy_wait.py --gpu          # also two GPU ranks: decode views and isolated after idle

Policies (ARXTUNE_ARXG_SPIN_US / ARXTUNE_ARXG_NAP_US, read when a proxy starts):
- default: poll for 5000 us after the last step, then block, looking every 100 us;
- poll: poll for an hour (the proxy never blocks; as before the policy existed,
  when it polled and yielded the CPU without end);
- block: no window (block right after each step), looking every 100 us.

CPU: one proxy (world 1, shared-memory fabric, the C loop) serves one step from
a CPU stand-in rank, then idles; its utime + stime over `--idle-s` seconds,
over those seconds. A polling proxy takes a core for as long as it polls.

GPU: for each policy, fresh ranks (benchmarks/arx_graph.py's views): the decode
view with busy kernels of `--busy-us` (a call found by a proxy that blocked for
part of the gap pays up to a nap), and isolated calls `--idle-ms` after the last
(an eager call wakes a blocked proxy when it launches). bf16 all-reduce, 16 KiB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import torch  # noqa: E402

from arxtune.runtime.rdma.config import RdmaConfig  # noqa: E402

POLICIES = {"default": None, "poll": ("3600000000", "100"), "block": ("0", "100")}


def set_policy(name: str) -> None:
    for var in ("ARXTUNE_ARXG_SPIN_US", "ARXTUNE_ARXG_NAP_US"):
        os.environ.pop(var, None)
    if POLICIES[name]:
        os.environ["ARXTUNE_ARXG_SPIN_US"], os.environ["ARXTUNE_ARXG_NAP_US"] = POLICIES[name]


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(name: str, idle_s: float) -> float:
    """The share of a CPU an idle proxy takes under policy `name`, from 0.1 s after its last step on."""
    from arxtune.runtime.rdma.graph.session import open_local
    from helpers.arxg_cpu_rank import CpuRank

    set_policy(name)
    (session,) = open_local(RdmaConfig(max_bytes=4096, timeout_s=10.0), 1)
    try:
        x = torch.ones(16)
        CpuRank(session).all_reduce(x, torch.empty_like(x))
        time.sleep(0.1)
        pid = session.proxy.proc.pid
        before, t = cpu_seconds(pid), time.monotonic()
        time.sleep(idle_s)
        return (cpu_seconds(pid) - before) / (time.monotonic() - t)
    finally:
        session.close()


def gpu_rows(name: str, a) -> dict[str, float]:
    import arx_graph

    from arxtune.runtime.cudadrv import BusyKernel
    from arxtune.runtime.ops import expected_output, make_input, mismatch
    from helpers.arxg_cpu_rank import RanksOnOneGpu

    set_policy(name)
    pair = RanksOnOneGpu(2, RdmaConfig(max_bytes=1 << 20, timeout_s=20.0))
    dev = torch.device("cuda", 0)
    try:
        n = 8192  # 16 KiB of bf16
        ins = [make_input("all_reduce", n, r, 2, torch.bfloat16, dev) for r in range(2)]
        outs = [torch.zeros_like(i) for i in ins]
        opts = argparse.Namespace(eager_calls=20, warmup=10, samples=a.samples, idle_ms=a.idle_ms)
        found, _ = arx_graph.measure_pair_views(pair, {"graph", "decode"}, ins, outs, opts, [BusyKernel(us, 0) for us in a.busy_us])
        torch.cuda.synchronize()
        pair.check()
        ref = expected_output("all_reduce", n, 0, 2, torch.bfloat16)
        assert all(mismatch(o, ref) is None for o in outs), "wrong result"
        return {view: statistics.median(xs) for view, xs in found.items()}
    finally:
        pair.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle-s", type=float, default=2.0)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--busy-us", type=float, nargs="+", default=[50.0, 200.0, 2000.0, 10000.0])
    ap.add_argument("--idle-ms", type=float, default=20.0)
    ap.add_argument("--samples", type=int, default=100)
    a = ap.parse_args()
    print(f"idle proxy, share of one CPU ({os.cpu_count()} CPUs, {a.idle_s:g} s each):")
    for name in POLICIES:
        print(f"  {name:<8} {idle_cpu(name, a.idle_s):6.1%}", flush=True)
    if a.gpu:
        table = {name: gpu_rows(name, a) for name in POLICIES}
        views = list(next(iter(table.values())))
        print(f"two ranks on {torch.cuda.get_device_name(0)}, bf16 all_reduce 16 KiB, median us per call:")
        print(f"  {'view':<24}" + "".join(f"{name:>10}" for name in table))
        for view in views:
            print(f"  {view:<24}" + "".join(f"{table[name][view]:>10.2f}" for name in table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
