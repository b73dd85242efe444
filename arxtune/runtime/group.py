"""Who the ranks of a group are, and the small agreements they reach over its gloo group.

The ground floor of the runtime's collectives: backends, the router, the start-up
ladder and the sweep all agree through these, and this module imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class GroupContext:
    """What a backend gets to set itself up: who we are and how to talk to peers."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    cpu_group: Any  # a gloo ProcessGroup: always there, for set-up exchanges
    device_group: Any = None  # the torch.distributed group for the device (NCCL on CUDA)
    options: dict = field(default_factory=dict)  # per-backend options from the config, by backend name

    def options_for(self, backend: str) -> dict:
        return dict(self.options.get(backend, {}))


def all_true(flag: bool, group) -> bool:
    """True only if every rank says True."""
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)
    return bool(value.item())


def all_max(value: float, group) -> float:
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return float(tensor.item())


def gather_objects(obj, group) -> list:
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def max_per_iteration(samples: list[float], group) -> list[float]:
    """Every rank's per-iteration times, reduced to the slowest rank per iteration."""
    tensor = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return tensor.tolist()


def agreed_reason(reasons: list[str]) -> str:
    """One reason for all ranks: said once when every rank gives the same, else per rank."""
    failed = [(rank, why) for rank, why in enumerate(reasons) if why]
    if not failed:
        return ""
    if len(failed) == len(reasons) and len({why for _, why in failed}) == 1:
        return failed[0][1]
    return "; ".join(f"rank {rank}: {why}" for rank, why in failed)
