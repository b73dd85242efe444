"""One rank of tests/multiproc/test_serving.py: what a serving process guards against after start-up.

1. ARXTUNE_VERIFY=2 with 'goeswrong' (right for 3 calls, then wrong on rank 1) given every all_reduce
   below 64 KiB: the 4th call is checked against gloo, the backend is out for good, and every result
   the caller got was right.
2. ARXTUNE_OVERRIDES set on rank 1 only: one ArxtuneError on every rank naming the variable, before any
   backend opens (never a hang or a peer's "Connection closed").

Rank 0 prints `RESULT {json}` lines; every rank prints "serving ok" at the end.
"""

import json
import os

import torch
import torch.distributed as dist

from arxtune.runtime.communicator import Communicator
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.thresholds import Range, Table, Thresholds

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
KiB = 1024
ranges = (Range(0, 64 * KiB, "goeswrong"), Range(64 * KiB, None, "gloo"))
routed = Thresholds("gloo", 0.05, {}, (Table("all_reduce", "float32", world, ranges, "eager", "test", "eager"),))

os.environ.update(ARXTUNE_BOOT="off", ARXTUNE_VERIFY="2")
comm = Communicator.from_env(routed)
right = [bool(torch.equal(comm.all_reduce(torch.ones(256)), torch.full((256,), float(world)))) for _ in range(10)]
if rank == 0:
    print(
        "RESULT "
        + json.dumps(
            {
                "scenario": "verify",
                "right": right,
                "line": comm.summary(),
                "calls": {f"{op}:{name}": n for (op, name), n in comm.calls.items()},
                "excluded": [list(k) + [v] for k, v in comm.router.excluded.items()],
            }
        ),
        flush=True,
    )
comm.close()
del os.environ["ARXTUNE_VERIFY"]

if rank == 1:
    os.environ["ARXTUNE_OVERRIDES"] = "all_reduce:0-64KiB=goeswrong"
try:
    Communicator.from_env(routed)
    said = ""
except ArxtuneError as exc:
    said = str(exc)
print("RESULT " + json.dumps({"scenario": f"overrides-rank{rank}", "said": said}), flush=True)
dist.destroy_process_group()
print("serving ok", flush=True)
