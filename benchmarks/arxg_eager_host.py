"""The host's share of an arxg eager call, without a GPU: launching and checking, old path against new.

    python benchmarks/arxg_eager_host.py

- launch: the real collective kernel (compiled by the installed Triton for
  sm_90a) launched through Triton's `kernel[grid](...)` (argument binding,
  specialisation key, cache lookup) against the cached Launch, both handing
  their arguments to a launcher that drops them. So the figures leave out the
  launcher's C part: cuLaunchKernel in both, plus one cuPointerGetAttribute per
  pointer argument on Triton's path (7 here), which the cached path skips
  because its pointers are integers.
- check: what an eager call checks first, Session.check() (error word, message,
  a waitpid of the proxy) against Session.quick_check() (error word and the
  proxy's heartbeat), with a live proxy serving one rank over shared memory.

With `--gpu` (a CUDA GPU present) it times the host's share on the real
launcher instead: one arxg rank at world 1 (its proxy serving it), calls
launched back to back and timed on the host clock: the cached Launch alone,
GpuRank.run (check, key, Launch), and Triton's own path (launch = "triton").
The GPU runs the calls meanwhile; a figure below the kernel's own time would
mean the host waits on a full launch queue, so rounds are kept short.

Prints the median over rounds of the mean cost per call, in microseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402

from arxtune.runtime.rdma.config import RdmaConfig  # noqa: E402


def per_call_us(fn, calls: int, rounds: int) -> float:
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(out)


def launch_figures(calls: int, rounds: int) -> dict[str, float]:
    from arxtune.runtime.rdma.graph import kernels
    from arxtune.runtime.rdma.graph.gpu import HostPtr
    from arxtune.runtime.rdma.graph.launch import Launch, names_in_order
    from helpers.fake_triton import fake_triton_driver

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    kernel, n = kernels.collective_kernel, 8192  # 16 KiB of bf16
    inp, out = torch.zeros(n, dtype=torch.bfloat16), torch.zeros(n, dtype=torch.bfloat16)
    named = dict(inp=inp, out=out, staging=HostPtr(0x7F0000002000, torch.bfloat16), sources=torch.zeros(48, dtype=torch.int64),
                 flags=HostPtr(0x7F0000100000, torch.int64), ctrl=HostPtr(0x7F0000001000, torch.int64),
                 counter=torch.zeros(4, dtype=torch.int64), rank=0, n_stage=n, n_part=n, slot_elems=1 << 19,
                 nbytes=2 * n, ndev_used=1, op_code=0, timeout_ns=20_000_000_000, OP=0, WORLD=2, NDEV=1, INT_ACC=False,
                 BLOCK=kernels.BLOCK)
    args, grid = names_in_order(kernel, named), (8,)

    def measure() -> dict[str, float]:
        kernel[grid](*args, num_warps=kernels.NUM_WARPS)  # compiles
        cached = Launch.compile(kernel, grid, args, (0, 1), torch.device("cuda", 0), num_warps=kernels.NUM_WARPS)
        return {
            "launch, kernel[grid](...) (Triton's path)": per_call_us(
                lambda: kernel[grid](*args, num_warps=kernels.NUM_WARPS), calls, rounds),
            "launch, cached Launch": per_call_us(lambda: cached(inp.data_ptr(), out.data_ptr()), calls, rounds),
        }

    with tempfile.TemporaryDirectory() as cache, fake_triton_driver(kernel, record=False):
        os.environ["TRITON_CACHE_DIR"] = cache
        return measure()


def check_figures(calls: int, rounds: int) -> dict[str, float]:
    from arxtune.runtime.rdma.graph.session import open_local

    (session,) = open_local(RdmaConfig(max_bytes=4096, timeout_s=10.0), 1)
    try:
        time.sleep(0.2)  # the proxy is serving and beating
        return {"check, Session.check()": per_call_us(session.check, calls, rounds),
                "check, Session.quick_check()": per_call_us(session.quick_check, calls, rounds)}
    finally:
        session.close()


def gpu_figures(calls: int, rounds: int) -> dict[str, float]:
    from helpers.arxg_cpu_rank import RanksOnOneGpu

    figures = {}
    for launch in ("cached", "triton"):
        ranks = RanksOnOneGpu(1, RdmaConfig(max_bytes=1 << 16, timeout_s=10.0), launch=launch)
        try:
            rank = ranks.ranks[0]
            inp = torch.ones(8192, dtype=torch.bfloat16, device="cuda")  # 16 KiB
            out = torch.empty_like(inp)
            rank.all_reduce(inp, out)  # compiles
            torch.cuda.synchronize()

            def timed(fn) -> float:
                samples = []
                for _ in range(rounds):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    samples.append((time.perf_counter() - t) / calls * 1e6)
                torch.cuda.synchronize()
                return statistics.median(samples)

            if launch == "cached":
                key = next(k for k in rank._launches if k != "handshake")
                src, dst = inp.data_ptr(), out.data_ptr()
                figures["gpu: cached Launch alone"] = timed(lambda: rank._launches[key](src, dst))
                figures["gpu: GpuRank.run, cached launch"] = timed(lambda: rank.all_reduce(inp, out))
            else:
                figures["gpu: GpuRank.run, Triton's own path"] = timed(lambda: rank.all_reduce(inp, out))
            rank.check()
        finally:
            ranks.close()
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gpu", action="store_true", help="time the real launcher on a CUDA GPU (short rounds)")
    a = ap.parse_args()
    import triton

    if a.gpu:
        a.calls, a.rounds = min(a.calls, 200), max(a.rounds, 50)
        figures = gpu_figures(a.calls, a.rounds)
    else:
        figures = {**launch_figures(a.calls, a.rounds), **check_figures(a.calls, a.rounds)}
    print(f"arxg eager call, host side only (Triton {triton.__version__}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, median of {a.rounds} rounds of {a.calls} calls)")
    for name, us in figures.items():
        print(f"{name:<45} {us:8.2f} us/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
