"""Per-call cost of the communicator's backend choice, in nanoseconds (target: under 1 us).

Measures Router.pick (mode, dict get, bisect, supports(), counter) and Communicator.choose /
route (the same through the communicator) on a thresholds table shaped like a real one:
3 ops x 3 dtypes, 8 ranges each. Runs a one-rank gloo group; no devices needed.

    python benchmarks/dispatch_overhead.py
"""

from __future__ import annotations

import os
import statistics
import timeit

import torch
import torch.distributed as dist

from arxtune.runtime.backends import register
from arxtune.runtime.communicator import Communicator
from arxtune.runtime.thresholds import Range, Table, Thresholds

CALLS = 200_000
REPEATS = 7


def realistic_thresholds(world: int) -> Thresholds:
    edges = [0] + [1 << k for k in range(12, 26, 2)]
    names = ["gloo", "counting"] * 4
    tables = []
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for dtype in ("float32", "bfloat16", "float16"):
            ranges = [Range(lo, hi, names[i]) for i, (lo, hi) in enumerate(zip(edges, edges[1:] + [None]))]
            tables.append(Table(op, dtype, world, tuple(ranges)))
    return Thresholds("gloo", 0.05, {"run_id": "benchmark"}, tuple(tables))


def ns_per_call(fn) -> tuple[float, float]:
    runs = [t / CALLS * 1e9 for t in timeit.repeat(fn, number=CALLS, repeat=REPEATS)]
    return statistics.median(runs), min(runs)


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    register("counting", "arxtune.runtime.backends.torch_dist:GlooBackend")  # a second real backend to route to
    dist.init_process_group("gloo", rank=0, world_size=1)
    thresholds = realistic_thresholds(1)
    comm = Communicator.from_env(thresholds)
    tensor = torch.empty(3000, dtype=torch.bfloat16)
    dtype = torch.bfloat16
    print(f"{'path':<38}{'median ns/call':>16}{'best ns/call':>14}")
    for label, fn in [
        ("Router.pick (dict + bisect + supports)", lambda: comm.router.pick("all_reduce", dtype, 6000)),
        ("Communicator.choose (+ supports)", lambda: comm.choose("all_reduce", dtype, 6000)),
        ("Communicator.route (+ byte count)", lambda: comm.route("all_reduce", tensor)),
    ]:
        median, best = ns_per_call(fn)
        print(f"{label:<38}{median:>16.0f}{best:>14.0f}")
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
