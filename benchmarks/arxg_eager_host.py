"""The host's share of an arxg eager call: checking and launching, path by path.

    python benchmarks/arxg_eager_host.py          # the check, no GPU needed
    python benchmarks/arxg_eager_host.py --gpu    # the launch paths on a CUDA GPU

- check: what an eager call checks first, Session.check() (error word, message,
  a waitpid of the proxy) against Session.quick_check() (error word and the
  proxy's heartbeat), with a live proxy serving one rank over shared memory.
- With `--gpu`: one arxg rank at world 1 (its proxy serving it), 16 KiB bf16
  all-reduces launched back to back and timed on the host clock: the packed
  launch alone (one ctypes call into cuda_launch.c: cuLaunchKernel),
  GpuRank.run (check, cache lookup, launch), a burst from C per call (what the
  sweep's eager samples launch), and Triton's own `kernel[grid](...)` path
  (launch = "triton"). The GPU runs the calls meanwhile; rounds are kept short
  so that the host does not wait on a full launch queue.

Prints the median over rounds of the mean cost per call, in microseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402

from arxtune.runtime.rdma.config import RdmaConfig  # noqa: E402


def per_call_us(fn, calls: int, rounds: int, sync=None) -> float:
    out = []
    for _ in range(rounds):
        if sync:
            sync()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e6)
    if sync:
        sync()
    return statistics.median(out)


def check_figures(calls: int, rounds: int) -> dict[str, float]:
    from arxtune.runtime.rdma.graph.session import open_local

    (session,) = open_local(RdmaConfig(max_bytes=4096, timeout_s=10.0), 1)
    try:
        time.sleep(0.2)  # the proxy is serving and beating
        return {
            "check, Session.check()": per_call_us(session.check, calls, rounds),
            "check, Session.quick_check()": per_call_us(session.quick_check, calls, rounds),
        }
    finally:
        session.close()


def gpu_figures(calls: int, rounds: int) -> dict[str, float]:
    from arxtune.runtime import cudadrv
    from helpers.arxg_cpu_rank import RanksOnOneGpu

    figures = {}
    for launch in ("native", "triton"):
        ranks = RanksOnOneGpu(1, RdmaConfig(max_bytes=1 << 16, timeout_s=10.0), launch=launch)
        try:
            rank = ranks.ranks[0]
            inp = torch.ones(8192, dtype=torch.bfloat16, device="cuda")  # 16 KiB
            out = torch.empty_like(inp)
            rank.all_reduce(inp, out)  # builds or loads the kernel
            sync = torch.cuda.synchronize
            if launch == "native":
                packed = rank.prepare("all_reduce", inp, out)
                figures["gpu: packed launch alone (C, cuLaunchKernel)"] = per_call_us(
                    lambda: packed.launch(cudadrv.current_stream(0)), calls, rounds, sync
                )
                figures["gpu: GpuRank.run, native launch"] = per_call_us(lambda: rank.all_reduce(inp, out), calls, rounds, sync)
                rotation = rank.rotation("all_reduce", [inp], [out])
                figures["gpu: a burst from C, per call"] = per_call_us(lambda: rotation.repeat(calls), 1, rounds, sync) / calls
            else:
                figures["gpu: GpuRank.run, Triton's own path"] = per_call_us(lambda: rank.all_reduce(inp, out), calls, rounds, sync)
            rank.check()
        finally:
            ranks.close()
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gpu", action="store_true", help="time the launch paths on a CUDA GPU (short rounds)")
    a = ap.parse_args()
    if a.gpu:
        a.calls, a.rounds = min(a.calls, 200), max(a.rounds, 50)
        figures = gpu_figures(a.calls, a.rounds)
    else:
        figures = check_figures(a.calls, a.rounds)
    print(
        f"arxg eager call, host side only (torch {torch.__version__}, {os.cpu_count()} CPUs, median of {a.rounds} "
        f"rounds of {a.calls} calls)"
    )
    for name, us in figures.items():
        print(f"{name:<50} {us:8.2f} us/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
