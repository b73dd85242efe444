"""vLLM's own CUDA communicators as backends, so a sweep puts them beside arx and NCCL.

- vllm_pynccl:    PyNcclCommunicator (vLLM's ctypes NCCL), all three ops.
- vllm_custom_ar: CustomAllreduce (vLLM's IPC all-reduce; its kernel picks the
                  1-stage or 2-stage algorithm by size and world size itself).
- vllm_symm_mem:  SymmMemCommunicator, with multicast forced off.

Each is built on the run's gloo group and CUDA device, as vLLM builds them for
a tensor-parallel group. Where vLLM declines (no P2P, unsupported world size),
the communicator comes back disabled and the backend is recorded unavailable
with that reason.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from arxtune.runtime.backends.base import OPS, BackendUnavailable, no_cuda, no_vllm
from arxtune.runtime.group import GroupContext

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class _VllmCuda:
    name: ClassVar[str]
    capturable: ClassVar[bool] = True
    ops: ClassVar[tuple[str, ...]] = ("all_reduce",)
    vllm_class: ClassVar[str]
    framework: ClassVar[str] = "vllm"

    @classmethod
    def why_not_here(cls) -> str | None:
        return no_vllm() or no_cuda()

    def __init__(self, ctx: GroupContext):
        if ctx.device.type != "cuda":
            raise BackendUnavailable(f"{self.name} needs CUDA tensors; this run uses {ctx.device.type}")
        try:
            self.comm = self._make(ctx)
        except ImportError as exc:
            raise BackendUnavailable(f"vllm is not installed ({exc}); pip install 'arxtune[vllm]'") from None
        except Exception as exc:  # vLLM's own start-up failing is a reason, not a crash
            raise BackendUnavailable(f"vLLM's {self.vllm_class} failed to start: {type(exc).__name__}: {exc}") from None
        if getattr(self.comm, "disabled", True):
            raise BackendUnavailable(f"vLLM's {self.vllm_class} disabled itself on this machine (vLLM's log says why)")

    def _make(self, ctx: GroupContext):
        raise NotImplementedError

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        raise NotImplementedError(f"{self.name} only all-reduces")

    reduce_scatter = all_gather

    def close(self) -> None:
        self.comm = None


class VllmPyNccl(_VllmCuda):
    name = "vllm_pynccl"
    ops = OPS
    vllm_class = "PyNcclCommunicator"

    def _make(self, ctx: GroupContext):
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

        return PyNcclCommunicator(group=ctx.cpu_group, device=ctx.device)

    def supports(self, op: str, dtype: torch.dtype, nbytes: int) -> bool:
        return True

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.comm.all_reduce(inp, out_tensor=out)

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.comm.all_gather(out, inp)

    def reduce_scatter(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.comm.reduce_scatter(out, inp)


class VllmCustomAllreduce(_VllmCuda):
    name = "vllm_custom_ar"
    start_up_candidate = ("cuda",)
    # Inside graphs vLLM registers the graph's buffers through its own capture() context,
    # which a generic harness cannot enter: timed eagerly only.
    capturable = False
    vllm_class = "CustomAllreduce"

    def _make(self, ctx: GroupContext):
        from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce

        return CustomAllreduce(group=ctx.cpu_group, device=ctx.device)

    def supports(self, op: str, dtype: torch.dtype, nbytes: int) -> bool:
        return op == "all_reduce" and self.comm.should_custom_ar(torch.empty(nbytes // dtype.itemsize, dtype=dtype, device="meta"))

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.comm.all_reduce(inp, out=out)


class VllmSymmMem(_VllmCuda):
    name = "vllm_symm_mem"
    vllm_class = "SymmMemCommunicator"

    def _make(self, ctx: GroupContext):
        from vllm.distributed.device_communicators.symm_mem import SymmMemCommunicator

        return SymmMemCommunicator(group=ctx.cpu_group, device=ctx.device, force_multimem=False)

    def supports(self, op: str, dtype: torch.dtype, nbytes: int) -> bool:
        return op == "all_reduce" and self.comm.should_use_symm_mem(torch.empty(nbytes // dtype.itemsize, dtype=dtype, device="meta"))

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.comm.all_reduce(inp, out=out)
