"""A one-rank CUDA group whose communicator runs the start-up ladder in eager and graph (tests/gpu/test_ladder_gpu.py).

    torchrun --nproc-per-node 1 ladder_gpu_worker.py

The file hands bfloat16 all_reduce from torch_nccl to nccl at 256 KiB in both
modes (both capturable); rank 0 prints one `RESULT {json}` per policy.
"""

import json
import logging
import os
import sys

import torch

from arxtune.runtime.communicator import Communicator
from arxtune.harness.distributed import init, shutdown
from arxtune.runtime.thresholds import Range, Table, Thresholds

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
ctx = init(120.0)
KiB = 1024
ranges = (Range(0, 256 * KiB, "torch_nccl"), Range(256 * KiB, None, "nccl"))
file = Thresholds("nccl", 0.05, {}, tuple(Table("all_reduce", "bfloat16", 1, ranges, mode, "gpu", mode) for mode in ("eager", "graph")))
for policy in ("check", "adjust"):
    os.environ["ARXTUNE_BOOT"] = policy
    comm = Communicator(ctx, file)
    x = torch.ones(4096, dtype=torch.bfloat16, device=ctx.device)
    assert torch.equal(comm.all_reduce(x), x)
    print("RESULT " + json.dumps({"policy": policy, "line": comm.summary()}), flush=True)
    comm.close()
shutdown()
sys.stdout.flush()
os._exit(0)
