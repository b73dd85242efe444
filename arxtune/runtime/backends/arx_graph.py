"""arxg: arx inside CUDA graphs (one-shot all-reduce, all-gather, reduce-scatter of CUDA tensors).

The GPU side is one kernel per call (Triton code, built ahead or at first use
and launched through the CUDA driver, rdma/graph/images.py) and the host side a
proxy process per rank (arxtune.runtime.rdma.graph), so calls record into a CUDA
graph and replay with new data; eager calls launch the same kernels. All-reduce is one-shot only: at
two ranks one-shot is never slower than two-shot (one latency, the same bytes),
and the two-box GB10 pair is the target.

Options: ``[backends.arx]`` applies, ``[backends.arxg]`` overrides it (same keys,
plus ``transport``: "auto", "shm" or "verbs"; auto = shared memory when every
rank is on one host, else RDMA; ``memory``: "auto", "registered" or "direct",
how the GPU reaches the shared segments (rdma/graph/memory.py; auto asks the
device); ``launch``: "native" or "triton", how calls launch). The memory
mode chosen and its reason, and where the kernel builds came from, are in
``effective_options()`` (``memory_mode``, ``memory_reason``, ``kernels``), so runs
and thresholds files record them. Inputs up to ``max_bytes`` (all-gather: per rank).
A wait that times out inside a kernel is raised by the next eager call, or by
``check()`` after a graph replay has been synchronised.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.distributed as dist

from arxtune.runtime import env
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.rdma import RdmaConfig, RdmaUnavailable, gloo_exchange
from arxtune.runtime.backends.base import OPS, BackendUnavailable
from arxtune.runtime.group import GroupContext


#: options that record what a run chose (effective_options), ignored when a file's options are read back
RECORDS = ("memory_mode", "memory_reason", "kernels")


class ArxGraph:
    name: ClassVar[str] = "arxg"
    capturable: ClassVar[bool] = True
    ops: ClassVar[tuple[str, ...]] = OPS

    @staticmethod
    def check_options(options: dict) -> None:
        from arxtune.runtime.backends.arx import rdma_options

        rdma_options(options)

    @classmethod
    def why_not_here(cls) -> str | None:
        import importlib.util

        if not torch.cuda.is_available():
            return "needs CUDA tensors; no CUDA GPU"
        if importlib.util.find_spec("triton") or env.ARXG_KERNELS.is_set():
            return None
        return "needs Triton to build its kernels, or a build made elsewhere (ARXTUNE_ARXG_KERNELS)"

    def __init__(self, ctx: GroupContext):
        if ctx.device.type != "cuda":
            raise BackendUnavailable("arxg runs CUDA tensors (its GPU side is CUDA kernels); arx serves CPU tensors")
        if not dist.is_initialized():
            raise BackendUnavailable("torch.distributed is not initialised (run under torchrun)")
        from arxtune.runtime.rdma.graph.gpu import GpuRank
        from arxtune.runtime.rdma.graph.session import open_session

        given = ctx.options_for(self.name)
        options = {**ctx.options_for("arx"), **given}
        transport = options.pop("transport", "auto")
        memory, launch = str(options.pop("memory", "auto")), str(options.pop("launch", "native"))
        for record in RECORDS:  # what a run chose, read back from its file: not settings
            options.pop(record, None)
        self._given = {k: v for k, v in given.items() if k not in RECORDS}
        self._asked = memory
        exchange = gloo_exchange(ctx.cpu_group, ctx.world_size)
        self.gpu, error = None, None
        try:
            self.cfg = RdmaConfig.resolve(options)
            session = open_session(self.cfg, ctx.rank, ctx.world_size, exchange, transport)
        except (RdmaUnavailable, ArxtuneError) as exc:
            raise BackendUnavailable(str(exc)) from exc
        try:
            self.gpu = GpuRank(session, ctx.device, memory=memory, launch=launch)
        except (RdmaUnavailable, RuntimeError, OSError) as exc:
            session.close()
            error = str(exc)
        bad = [f"rank {r}: {e}" for r, e in enumerate(exchange(error)) if e]  # every rank ready, or none
        if bad:
            self.close()
            raise BackendUnavailable("; ".join(bad))

    def effective_options(self) -> dict:
        """The options as given (`memory` as asked, so a file calibrated with "auto" chooses again where it is
        used), with the mode chosen and why (recorded with the run and the thresholds)."""
        return {
            **self._given,
            "memory": self._asked,
            "memory_mode": self.gpu.memory.mode,
            "memory_reason": self.gpu.memory.reason,
            "kernels": self.kernels_note(),
        }

    def kernels_note(self) -> str:
        """Which builds run (arch and the Triton that built them: the same wherever the file came from), or how
        the kernels launch."""
        if self.gpu.launch != "native":
            return f"launch {self.gpu.launch}"
        return "; ".join(sorted({f"{image.arch}, built by Triton {image.triton}" for _, image in self.gpu._functions.values()}))

    def startup_note(self) -> str:
        """What the start-up line says about this backend: its memory mode and where its kernel builds came from."""
        return f"arxg memory: {self.gpu.memory}; kernels: {'; '.join(sorted(set(self.gpu.builds.values()))) or self.gpu.launch}"

    def supports(self, op: str, dtype: torch.dtype, nbytes: int) -> bool:
        from arxtune.runtime.rdma.graph.gpu import DTYPES

        per_slot = nbytes // self.gpu.s.world if op == "all_gather" else nbytes
        return op in OPS and dtype in DTYPES and per_slot <= self.cfg.max_bytes

    def bind_rotation(self, op: str, ins: list[torch.Tensor], outs: list[torch.Tensor]):
        """Calls of `op` rotating through these buffer pairs, each packed once, with `repeat` and `decode` for
        samples launched back to back from C (rdma/graph/gpu.Rotation)."""
        return self.gpu.rotation(op, ins, outs)

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.gpu.all_reduce(inp, out)

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.gpu.all_gather(inp, out)

    def reduce_scatter(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.gpu.reduce_scatter(inp, out)

    def check(self) -> None:
        """Raise a failure recorded by the kernels or the proxy (call after synchronising)."""
        self.gpu.check()

    def close(self) -> None:
        gpu, self.gpu = self.gpu, None
        if gpu is not None:
            gpu.close()
