"""vLLM's CPU communicator as an arxtune backend, so sweeps can time vLLM's own path.

It builds vLLM's CpuCommunicator on the run's gloo group, named like a
tensor-parallel group ("tp:..."), which is what vLLM serves TP calls with on
CPU: its shared-memory kernels where the vLLM build has them for this CPU
(vLLM's CPU build ships them in its AVX-512 kernels only; on an AVX2 machine
vLLM itself serves TP through torch.distributed), else torch.distributed on the
gloo group. As a vLLM CPU worker does, it loads the platform's kernels first
and gives every rank one VLLM_DIST_IDENT (rank 0's, unless the user set one),
or vLLM silently takes the gloo path. `path` says which one it got, and
`shm_kernels` whether this CPU's kernels had the shared-memory ops; the run's
backend status records both.

Calls mirror what vLLM's GroupCoordinator does for a dim-0 op, made out of
place as the Backend protocol asks: all_reduce copies the input into `out`
and reduces `out` in place (vLLM reduces its input in place); all_gather
gathers straight into `out`; reduce_scatter calls vLLM's reduce_scatter and
copies its result into `out`.
"""

from __future__ import annotations

import os
import time
from typing import ClassVar

import torch
import torch.distributed as dist

from arxtune.runtime.group import gather_objects
from arxtune.runtime.backends.base import OPS, BackendUnavailable, no_vllm
from arxtune.runtime.group import GroupContext


class VllmCpuBackend:
    name: ClassVar[str] = "vllm_cpu"
    capturable: ClassVar[bool] = False
    ops: ClassVar[tuple[str, ...]] = OPS
    framework: ClassVar[str] = "vllm"
    start_up_candidate: ClassVar[tuple[str, ...]] = ("cpu",)

    @classmethod
    def why_not_here(cls) -> str | None:
        return no_vllm()

    def __init__(self, ctx: GroupContext):
        if ctx.device.type != "cpu":
            raise BackendUnavailable(f"vllm_cpu runs on CPU tensors; this run uses {ctx.device.type}")
        if not dist.is_initialized():
            raise BackendUnavailable("torch.distributed is not initialised")
        try:
            from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
        except ImportError as exc:
            reason = "vllm is not installed" if getattr(exc, "name", "") == "vllm" else f"cannot import vLLM's CpuCommunicator: {exc}"
            raise BackendUnavailable(f"{reason} (pip install 'arxtune[vllm]', or run from .venv-vllm)") from None
        from vllm.platforms import current_platform

        current_platform.import_kernels()
        self.shm_kernels = hasattr(torch.ops._C, "init_shm_manager")
        own = os.environ.get("VLLM_DIST_IDENT") or f"arxtune-{os.getpid()}-{time.time_ns()}"
        os.environ["VLLM_DIST_IDENT"] = gather_objects(own, ctx.cpu_group)[0]
        try:
            self.comm = CpuCommunicator(
                cpu_group=ctx.cpu_group, device=torch.device("cpu"), device_group=ctx.cpu_group, unique_name="tp:arxtune-vllm_cpu"
            )
        except Exception as exc:  # vLLM's constructor has many ways to fail; the reason goes into the results
            raise BackendUnavailable(f"vLLM's CpuCommunicator did not start: {type(exc).__name__}: {exc}") from None
        self.path = "torch.distributed" if self.comm.dist_module is dist else "shm"

    def effective_options(self) -> dict:
        return {"path": self.path, "shm_kernels": self.shm_kernels}

    def supports(self, op: str, dtype: torch.dtype, nbytes: int) -> bool:
        return True

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(inp)
        self.comm.all_reduce(out)

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.comm.dist_module.all_gather_into_tensor(out, inp, group=self.comm.device_group)

    def reduce_scatter(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(self.comm.reduce_scatter(inp, 0))

    def close(self) -> None:
        comm, self.comm = getattr(self, "comm", None), None
        if comm is not None:
            comm.destroy()
