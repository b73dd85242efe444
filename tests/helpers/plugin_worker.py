"""One rank of a four-rank job that starts the vLLM plugin's dispatch on TP groups of 2, 3 and 4 ranks
(started by tests/multiproc/test_plugin_worlds.py under torchrun; vLLM itself is not needed).

    plugin_worker.py MERGED.json TP2_ONLY.json

MERGED holds tables for worlds 2, 3 and 4, where 'counting' wins all_reduce up to CROSSOVER[world]: each
group must route by its own world's table, with exact results. TP2_ONLY, served by the four-rank group,
must leave every call to vLLM's path after one warning. Prints 'plugin ok' per rank; the plugin's log
lines go to stderr.
"""

import logging
import os
import sys

import torch
import torch.distributed as dist

from arxtune.runtime import vllm_plugin
from arxtune.runtime.ops import expected_output, make_input, mismatch

KiB = 1024
CROSSOVER = {2: 4 * KiB, 3: 16 * KiB, 4: 64 * KiB}

logging.getLogger("vllm.arxtune").addHandler(logging.StreamHandler(sys.stderr))
logging.getLogger("vllm.arxtune").setLevel(logging.INFO)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


class CpuCommunicator:
    """What the plugin reads of vLLM's communicator (the class it wraps)."""


class Comm(CpuCommunicator):
    def __init__(self, group, ranks: list[int], label: str):
        self.cpu_group, self.device_group, self.device = group, None, torch.device("cpu")
        self.world_size, self.rank_in_group, self.unique_name = len(ranks), ranks.index(rank), f"tp:{label}"


def routed(comm, dispatch, nbytes: int) -> str:
    """all_reduce of `nbytes` float32 on this group: checked exactly; the backend that took it, or 'vllm'."""
    n = nbytes // 4
    x = make_input("all_reduce", n, comm.rank_in_group, comm.world_size, torch.float32, torch.device("cpu"))
    backend = dispatch.pick("all_reduce", x)
    if backend is None:
        return "vllm"
    bad = mismatch(
        dispatch.run(backend, "all_reduce", x).view(-1),
        expected_output("all_reduce", n, comm.rank_in_group, comm.world_size, torch.float32),
    )
    assert bad is None, (comm.world_size, nbytes, bad)
    return backend.name


merged, tp2_only = sys.argv[1:3]
groups = {size: (dist.new_group(list(range(size))), list(range(size))) for size in (2, 3, 4)}  # every rank makes every group
os.environ["ARXTUNE_THRESHOLDS"] = merged
for size, (group, ranks) in groups.items():
    if rank in ranks:
        comm = Comm(group, ranks, f"merged{size}")
        dispatch = vllm_plugin.setup_dispatch(comm)
        assert dispatch is not None, f"world {size}: the merged file was not used"
        got = (routed(comm, dispatch, CROSSOVER[size] // 2), routed(comm, dispatch, CROSSOVER[size] * 4))
        assert got == ("counting", "vllm"), (size, got)
        dispatch.close()
os.environ["ARXTUNE_THRESHOLDS"] = tp2_only
assert vllm_plugin.setup_dispatch(Comm(*groups[4], "tp2only")) is None, "a file without a table for world 4 must not route"
print("plugin ok", flush=True)
dist.destroy_process_group()
