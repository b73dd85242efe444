"""One rank of a group whose communicator runs the start-up ladder (started by tests/multiproc/test_ladder.py).

    ladder_worker.py OUT_DIR

Runs, one after another on the same gloo group: `off`, `check` and `adjust`
on a file that gives 'slowabove' (20 ms a call from 8 KiB) everything below
64 KiB; `check` and `adjust` on a file that gives 'capwrong' (wrong on rank 1,
capturable) all_reduce and all_gather below 64 KiB in both modes; `adjust`
with no file and 'slowabove' as the baseline; `check` on a file that gives a
backend that hangs 3 s and then times out everything below 64 KiB. Rank 0 prints one `RESULT {json}` line per scenario; every rank
checks its own routes and that the ranks ended with identical tables.
"""

import json
import logging
import os
import sys
import time

import torch
import torch.distributed as dist

from arxtune.runtime.backends import REGISTRY, register
from arxtune.runtime.communicator import Communicator, context_from_torch
from arxtune.runtime.group import gather_objects
from arxtune.runtime.ops import expected_output, make_input, mismatch
from arxtune.runtime.thresholds import Range, Table, Thresholds

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = sys.argv[1]
KiB, f32 = 1024, torch.float32


def file_giving(backend: str) -> Thresholds:
    ranges = (Range(0, 64 * KiB, backend), Range(64 * KiB, None, "gloo"))
    return Thresholds("gloo", 0.05, {}, (Table("all_reduce", "float32", world, ranges, "eager", "test", "eager"),))


def start(policy: str, thresholds, **kwargs):
    os.environ["ARXTUNE_BOOT"] = policy
    ctx = context_from_torch()
    dist.barrier()
    began = time.monotonic()
    comm = Communicator(ctx, thresholds, **kwargs)
    took = time.monotonic() - began
    tables = repr(comm.thresholds.tables if comm.thresholds else None)
    same = len(set(gather_objects(tables, ctx.cpu_group))) == 1
    return comm, took, same


def picks(comm, sizes):
    return {str(s): comm.choose("all_reduce", f32, s).name for s in sizes}


def works(comm, nbytes):
    n = nbytes // 4
    y = comm.all_reduce(make_input("all_reduce", n, rank, world, f32, torch.device("cpu")))
    assert mismatch(y, expected_output("all_reduce", n, rank, world, f32)) is None


def report(name, comm, took, same, **extra):
    if rank == 0:
        print(
            "RESULT "
            + json.dumps(
                {
                    "scenario": name,
                    "line": comm.summary(),
                    "took_s": took,
                    "same_tables": same,
                    "picks": picks(comm, [2 * KiB, 48 * KiB, 1024 * KiB]),
                    **extra,
                }
            ),
            flush=True,
        )
    comm.close()


for policy in ("off", "check", "adjust"):
    comm, took, same = start(policy, file_giving("slowabove"))
    works(comm, 256 * KiB)
    report(policy, comm, took, same)

# A backend caught wrong is out of that (op, dtype) in every mode, under check and adjust alike; its correct
# all_gather keeps the ranges the file gives it.
graph = [False]
wrong_ranges = (Range(0, 64 * KiB, "capwrong"), Range(64 * KiB, None, "gloo"))
wrong_file = Thresholds(
    "gloo",
    0.05,
    {},
    tuple(
        Table(op, "float32", world, wrong_ranges, mode, "test", mode) for op in ("all_reduce", "all_gather") for mode in ("eager", "graph")
    ),
)
for policy in ("check", "adjust"):
    comm, took, same = start(policy, wrong_file, capturing=lambda: graph[0])
    works(comm, 2 * KiB)
    graph[0] = True
    in_graph = {op: comm.choose(op, f32, 2 * KiB).name for op in ("all_reduce", "all_gather")}
    graph[0] = False
    report(f"wrong-{policy}", comm, took, same, in_graph=in_graph, all_gather=comm.choose("all_gather", f32, 2 * KiB).name)

hangs = REGISTRY.pop("hangs")  # not candidates of the file-less ladder
REGISTRY.pop("capwrong")
os.environ["ARXTUNE_THRESHOLDS"] = os.path.join(out, "none.json")
os.environ["ARXTUNE_BOOT_BUDGET_S"] = "2"
comm, took, same = start("adjust", None, baseline="slowabove")
works(comm, 1024 * KiB)
report("nofile-adjust", comm, took, same)
comm, took, same = start("check", None, baseline="slowabove")
report("nofile-check", comm, took, same)

register("hangs", hangs)
os.environ["ARXTUNE_BOOT_BUDGET_S"] = "1"
comm, took, same = start("check", file_giving("hangs"))
works(comm, 256 * KiB)
report("hangs", comm, took, same)

print("ladder ok", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
