"""How many calls a sample needs: per-op time against calls per sample, on one GPU.

Graph view: per-op time of a replayed graph of k calls, for several k; when
k = 100 is within 5% of the largest k, the replay's own launch costs under 5%
of the op. Eager view: back-to-back calls between two events for several k,
and the same for the all_reduce alone (no copy), which shows how much of an
eager call is the host's cost of torch.distributed. NCCL all_reduce as
arxtune's `torch_nccl` backend calls it (copy, then all_reduce in place), world size 1.

  python benchmarks/timing_views.py
"""

from __future__ import annotations

import os
import statistics

import torch
import torch.distributed as dist

from arxtune.runtime.timing import CudaBackToBackTimer, CudaGraphTimer

SIZES = (8 << 10, 1 << 20, 64 << 20)
SAMPLES = 30


def median_us(timer, op) -> float:
    timer.prepare(op)
    for _ in range(3):
        timer.time_once(op)
    return statistics.median(timer.time_once(op) for _ in range(SAMPLES))


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    print(
        f"{torch.cuda.get_device_name()}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, bf16 all_reduce, median of {SAMPLES} samples, us per op"
    )
    for nbytes in SIZES:
        inp = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        out = torch.empty_like(inp)

        def backend_call():
            out.copy_(inp)
            dist.all_reduce(out)

        def reduce_only():
            dist.all_reduce(out)

        graph = {k: median_us(CudaGraphTimer(k), backend_call) for k in (10, 100, 400)}
        eager = {k: median_us(CudaBackToBackTimer(k), backend_call) for k in (1, 20, 100)}
        bare = median_us(CudaBackToBackTimer(20), reduce_only)
        print(
            f"{nbytes:>9} B  graph k=10/100/400: {graph[10]:.3f} {graph[100]:.3f} {graph[400]:.3f} (k=100 over k=400: {graph[100] / graph[400]:.3f})  "
            f"eager k=1/20/100: {eager[1]:.2f} {eager[20]:.2f} {eager[100]:.2f}  all_reduce alone, eager k=20: {bare:.2f}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
