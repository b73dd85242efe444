"""torch symmetric memory all-reduce (one-shot and two-shot) on CUDA tensors.

The input is staged into one symmetric buffer registered once at start-up;
the kernels read peers' buffers over NVLink. Multicast (NVLS) stays off:
arxtune's launcher sets TORCH_SYMM_MEM_DISABLE_MULTICAST=1.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from arxtune.runtime.units import parse_bytes
from arxtune.runtime.backends.base import BackendUnavailable, max_bytes_only, no_cuda
from arxtune.runtime.group import GroupContext

DEFAULT_MAX_BYTES = 64 << 20
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class _SymmMemAllReduce:
    name: ClassVar[str]
    capturable = True
    ops = ("all_reduce",)
    kernel: ClassVar[str]
    min_world: ClassVar[int] = 1
    check_options = staticmethod(max_bytes_only)

    @classmethod
    def why_not_here(cls) -> str | None:
        return no_cuda()

    def __init__(self, ctx: GroupContext):
        if ctx.device.type != "cuda":
            raise BackendUnavailable(f"{self.name} needs CUDA tensors; this run uses {ctx.device.type}")
        if ctx.world_size < self.min_world:
            raise BackendUnavailable(f"torch's {self.kernel} is not implemented for world size {ctx.world_size}")
        try:
            import torch.distributed._symmetric_memory as symm_mem

            self.op = getattr(torch.ops.symm_mem, self.kernel)
        except (ImportError, AttributeError) as exc:
            raise BackendUnavailable(f"this torch has no symmetric-memory {self.kernel}: {exc}") from None
        self.max_bytes = parse_bytes(ctx.options_for(self.name).get("max_bytes", DEFAULT_MAX_BYTES))
        self.group_name = ctx.device_group.group_name
        try:
            self.buffer = symm_mem.empty(self.max_bytes, dtype=torch.uint8, device=ctx.device)
            symm_mem.rendezvous(self.buffer, self.group_name)
        except Exception as exc:  # no P2P, no NVSHMEM/CUDA driver support: a reason, not a crash
            raise BackendUnavailable(f"symmetric memory rendezvous failed: {type(exc).__name__}: {exc}") from None

    def supports(self, op: str, dtype: torch.dtype, nbytes: int) -> bool:
        return op == "all_reduce" and dtype in DTYPES and nbytes <= self.max_bytes

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        staged = self.buffer[: inp.nbytes].view(inp.dtype)
        staged.copy_(inp)
        self.op(staged, "sum", self.group_name, out)

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        raise NotImplementedError(f"{self.name} only all-reduces")

    reduce_scatter = all_gather

    def close(self) -> None:
        self.buffer = None


class SymmMemOneShot(_SymmMemAllReduce):
    name = "symm_mem"
    kernel = "one_shot_all_reduce_out"
    start_up_candidate = ("cuda",)


class SymmMemTwoShot(_SymmMemAllReduce):
    name = "symm_mem2"
    kernel = "two_shot_all_reduce_out"
    min_world = 2
