"""One rank of a deployment using one merged thresholds file (started by test_router.py under torchrun).

    deployment_worker.py THRESHOLDS.json

Checks on real gloo traffic, at this world size: the per-world crossover,
the graph table while a stand-in for CUDA-graph capture is on (and that a
non-capturable backend is never used then), the backend options the file
recorded (limited's max_bytes), a capacity fallback under an override, a
strict fingerprint mismatch, and that no harness module got imported.
"""

import dataclasses
import logging
import os
import sys

import torch
import torch.distributed as dist

from arxtune.runtime.ops import OP_SPECS, expected_output, make_input, mismatch
from arxtune.runtime.communicator import Communicator
from arxtune.runtime.thresholds import load
from helpers.backends import CapturableCounting, CountingGloo, LimitedCounting

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
path = sys.argv[1]
KiB = 1024
#: the size up to which 'counting' wins eagerly, per world size (as the test's runs were made)
CROSSOVER = {2: 8 * KiB, 3: 32 * KiB}[world]
CLASSES = {"counting": CountingGloo, "capcounting": CapturableCounting, "limited": LimitedCounting}
capturing = [False]


def went(comm, op, dtype, nbytes):
    """Run op at `nbytes` (by the byte convention), check the result exactly, return who did the work."""
    itemsize = dtype.itemsize
    n = nbytes // OP_SPECS[op].nbytes(1, world, itemsize)
    before = {name: dict(cls.calls) for name, cls in CLASSES.items()}
    x = make_input(op, n, rank, world, dtype, torch.device("cpu"))
    y = getattr(comm, op)(x)
    bad = mismatch(y.view(-1), expected_output(op, n, rank, world, dtype))
    assert bad is None, (op, nbytes, bad)
    moved = [name for name, cls in CLASSES.items() if cls.calls.get(op, 0) != before[name].get(op, 0)]
    return moved[0] if moved else "gloo"


def check(comm, cases):
    for op, dtype, nbytes, in_capture, want in cases:
        capturing[0] = in_capture
        got = went(comm, op, dtype, nbytes)
        assert got == want, (world, op, dtype, nbytes, "graph" if in_capture else "eager", got, want)
    capturing[0] = False


f32 = torch.float32
os.environ["ARXTUNE_OVERRIDES"] = "all_reduce/float32@graph:0-2KiB=counting"
comm = Communicator.from_env(path, capturing=lambda: capturing[0])
if rank == 0:
    print(comm.summary(), file=sys.stderr)
check(
    comm,
    [
        ("all_reduce", f32, CROSSOVER // 4, False, "counting"),
        ("all_reduce", f32, CROSSOVER, False, "counting"),
        ("all_reduce", f32, CROSSOVER * 2, False, "gloo"),
        ("all_reduce", f32, CROSSOVER * 4, False, "gloo"),
        ("all_reduce", f32, CROSSOVER * 4, True, "capcounting"),  # the graph table while capturing
        ("all_reduce", f32, 1 * KiB, True, "gloo"),  # overridden to counting, which cannot be captured
        ("all_reduce", f32, 1 * KiB, False, "counting"),
        ("reduce_scatter", f32, 8 * KiB, False, "limited"),  # up to the max_bytes the file recorded
        ("reduce_scatter", f32, 16 * KiB, False, "gloo"),  # beyond it the table gives the baseline
    ],
)
assert comm.calls[("all_reduce", "gloo")] >= 3 and comm.calls[("all_reduce", "capcounting")] == 1, comm.calls
comm.close()

# An override beyond the backend's capacity: the router asks supports() and falls back.
os.environ["ARXTUNE_OVERRIDES"] = "reduce_scatter:0-=limited"
comm = Communicator.from_env(path)
if rank == 0:
    print(comm.summary(), file=sys.stderr)
check(comm, [("reduce_scatter", f32, 4 * KiB, False, "limited"), ("reduce_scatter", f32, 64 * KiB, False, "gloo")])
comm.close()
del os.environ["ARXTUNE_OVERRIDES"]

# Measured somewhere else, and told to be strict: every call goes to the baseline.
elsewhere = load(path)
elsewhere = dataclasses.replace(
    elsewhere,
    runs=tuple(
        dataclasses.replace(r, fingerprint=dataclasses.replace(r.fingerprint, hostnames=("other",) * world)) for r in elsewhere.runs
    ),
)
os.environ["ARXTUNE_FINGERPRINT"] = "strict"
comm = Communicator.from_env(elsewhere)
check(comm, [("all_reduce", f32, 1 * KiB, False, "gloo")])
assert comm.thresholds is None and comm.dispatch.started.fingerprint.refused  # what is in force, as the router routes
comm.close()

harness = [
    m
    for m in (
        "arxtune.harness.sweep",
        "arxtune.harness.results",
        "arxtune.harness.stats",
        "arxtune.harness.calibrate",
        "pandas",
        "matplotlib",
    )
    if m in sys.modules
]
assert not harness, harness
print("deployment ok", flush=True)
dist.barrier()  # leave together: a rank tearing gloo down while a peer still talks to it can abort the peer
dist.destroy_process_group()
# Leave without interpreter teardown, as `arxtune sweep` does: destructors of torch's
# communication threads have been seen to abort a rank whose work was complete.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
