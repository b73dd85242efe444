"""One rank of the communicator test: routing, results, and every fallback, checked on real gloo traffic."""

import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from arxtune.runtime.ops import expected_output, make_input, mismatch
from arxtune.runtime.communicator import Communicator
from arxtune.runtime.thresholds import Range, Table, Thresholds
from helpers.backends import CountingGloo

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
tmp = Path(sys.argv[1])


def table(op, world_size, ranges):
    return Table(op, "float32", world_size, tuple(ranges))


routing = Thresholds(
    "gloo",
    0.05,
    {"run_id": "test"},
    (
        table("all_reduce", world, [Range(0, 4096, "counting"), Range(4096, 1 << 20, "gloo"), Range(1 << 20, None, "arx")]),
        table("all_gather", world, [Range(0, None, "counting")]),
        table("reduce_scatter", world, [Range(0, 2048, "gloo"), Range(2048, None, "counting")]),
    ),
)
comm = Communicator.from_env(routing)
cases = [
    ("all_reduce", 256, 1),
    ("all_reduce", 4096, 0),
    ("all_reduce", 1 << 20, 0),  # (op, elements/rank, counted calls)
    ("all_gather", 100, 1),
    ("reduce_scatter", 100, 0),
    ("reduce_scatter", 1024, 1),
]
for op, n, counted in cases:
    before = sum(CountingGloo.calls.values())
    x = make_input(op, n, rank, world, torch.float32, torch.device("cpu"))
    y = getattr(comm, op)(x.view(-1, 1) if op != "all_reduce" else x)
    bad = mismatch(y.view(-1), expected_output(op, n, rank, world, torch.float32))
    assert bad is None, (op, n, bad)
    assert sum(CountingGloo.calls.values()) - before == counted, (op, n, CountingGloo.calls)
print(comm.summary(), file=sys.stderr)

# A chosen backend that does not support the call's size hands it to the baseline.
limited = Communicator.from_env(Thresholds("gloo", 0.05, {}, (table("all_reduce", world, [Range(0, None, "smallonly")]),)))
for n, counted in ((256, 1), (1024, 0)):  # 1 KiB is supported, 4 KiB is not
    before = sum(CountingGloo.calls.values())
    out = limited.all_reduce(torch.ones(n))
    assert torch.equal(out, torch.full((n,), float(world))), n
    assert sum(CountingGloo.calls.values()) - before == counted, (n, CountingGloo.calls)

# Wrong world size, a missing file, a GPU-calibrated file on CPU tensors: one warning each, then gloo for every call.
other = Thresholds("gloo", 0.05, {}, (table("all_reduce", 7, [Range(0, None, "counting")]),))
from_gpu = Thresholds("nccl", 0.05, {}, (table("all_reduce", world, [Range(0, 4096, "nccl"), Range(4096, None, "arx")]),))
for fallback in (Communicator.from_env(other), Communicator.from_env(tmp / "missing.json"), Communicator.from_env(from_gpu)):
    assert fallback.baseline_name == "gloo"
    before = sum(CountingGloo.calls.values())
    out = fallback.all_reduce(torch.ones(16))
    assert torch.equal(out, torch.full((16,), float(world))) and sum(CountingGloo.calls.values()) == before
dist.destroy_process_group()
print("communicator ok")
