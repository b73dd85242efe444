"""The sweep's process group: joining the torchrun job, picking this rank's device, leaving together.

The agreements the sweep reaches over that group are the runtime's own (arxtune.runtime.group).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from arxtune.runtime import env
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.fingerprint import host_facts
from arxtune.runtime.group import GroupContext, all_max, all_true, gather_objects, max_per_iteration

__all__ = [
    "TORCHRUN_VARS",
    "all_max",
    "all_true",
    "describe_host",
    "gather_objects",
    "init",
    "max_per_iteration",
    "pick_device",
    "shutdown",
    "under_torchrun",
]

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    return all(v in os.environ for v in TORCHRUN_VARS)


def pick_device(local_rank: int) -> torch.device:
    """One GPU per rank where GPUs exist (ARXTUNE_DEVICE=cpu forces CPU tensors)."""
    if env.DEVICE.get().lower() != "cpu" and torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise ArxtuneError(f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible); lower --nproc-per-node")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init(timeout_s: float, options: dict | None = None) -> GroupContext:
    """Join the torchrun job: a gloo group always (set-up, barriers, samples), NCCL for CUDA tensors."""
    if not under_torchrun():
        raise ArxtuneError("not under torchrun; run `arxtune sweep` (it launches torchrun itself) or use torchrun -m arxtune sweep")
    rank, world, local_rank = (int(os.environ[v]) for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    device = pick_device(local_rank)
    timeout = timedelta(seconds=timeout_s)
    if device.type == "cuda":
        dist.init_process_group("cpu:gloo,cuda:nccl", timeout=timeout, device_id=device)
        cpu_group = dist.new_group(backend="gloo", timeout=timeout)
        device_group = dist.group.WORLD
    else:
        dist.init_process_group("gloo", timeout=timeout)
        cpu_group, device_group = dist.group.WORLD, None
    return GroupContext(rank, world, local_rank, device, cpu_group, device_group, options or {})


def describe_host(ctx: GroupContext) -> dict:
    """Host name, device name, NVIDIA driver and RDMA devices (what thresholds fingerprints compare)."""
    return host_facts(ctx.device)


def shutdown(together: bool = True) -> None:
    """Leave together: a rank tearing gloo down while a peer still talks to it can abort the peer.

    After an interrupt the ranks stop wherever the signal found them, so a barrier there would
    meet a different collective on a peer and wait out the whole timeout; they just leave.
    """
    if dist.is_initialized():
        try:
            if together:
                dist.barrier()
        finally:
            dist.destroy_process_group()
