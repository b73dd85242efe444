"""torch.distributed collectives: gloo (CPU tensors) and c10d's NCCL (CUDA tensors).

gloo is the CPU baseline every other backend has to beat. `torch_nccl` is what
code calling torch.distributed gets on CUDA, c10d's host work included; the
`nccl` backend (nccl.py) calls NCCL itself.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.distributed as dist

from arxtune.runtime.backends.base import BackendUnavailable
from arxtune.runtime.group import GroupContext

# Newer torch renamed the tensor-in/tensor-out collectives; older ones (the GPU images) lack the new names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def nccl_missing() -> str | None:
    """Why NCCL cannot run here (torch's build, or no GPU), or None."""
    if not (dist.is_available() and dist.is_nccl_available()):
        return "this torch build has no NCCL"
    return None if torch.cuda.is_available() else "no CUDA GPU"


class _TorchDistBackend:
    name: ClassVar[str]
    capturable: ClassVar[bool]
    device_type: ClassVar[str]

    def __init__(self, ctx: GroupContext):
        if not dist.is_initialized():
            raise BackendUnavailable("torch.distributed is not initialised")
        if ctx.device.type != self.device_type:
            raise BackendUnavailable(f"{self.name} runs on {self.device_type} tensors; this run uses {ctx.device.type}")
        self.group = self._make_group(ctx)

    def _make_group(self, ctx: GroupContext):
        raise NotImplementedError

    @classmethod
    def why_not_here(cls) -> str | None:
        raise NotImplementedError

    def supports(self, op: str, dtype: torch.dtype, nbytes: int) -> bool:
        return True

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(inp)
        dist.all_reduce(out, group=self.group)

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        _all_gather(out, inp, group=self.group)

    def reduce_scatter(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        _reduce_scatter(out, inp, group=self.group)

    def close(self) -> None:
        pass


class GlooBackend(_TorchDistBackend):
    name = "gloo"
    capturable = False
    device_type = "cpu"

    @classmethod
    def why_not_here(cls) -> str | None:
        return None if dist.is_available() and dist.is_gloo_available() else "this torch build has no gloo"

    def _make_group(self, ctx: GroupContext):
        return ctx.cpu_group


class TorchNcclBackend(_TorchDistBackend):
    name = "torch_nccl"
    capturable = True

    @classmethod
    def why_not_here(cls) -> str | None:
        return nccl_missing()

    device_type = "cuda"

    def _make_group(self, ctx: GroupContext):
        if not dist.is_nccl_available():
            raise BackendUnavailable("this torch build has no NCCL")
        if ctx.device_group is None:
            raise BackendUnavailable("no NCCL process group was created for this run")
        return ctx.device_group
