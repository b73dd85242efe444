"""The bundled communicator: loads a thresholds file once, picks a backend per call.

Usable from plain torch.distributed code:

    dist.init_process_group(...)
    comm = Communicator.from_env()          # ARXTUNE_THRESHOLDS or a path
    y = comm.all_reduce(x)

Loading the file, agreeing on it across ranks, routing and the flat call are
arxtune.runtime.dispatch's, shared with the vLLM plugin. Outside every range, or when the file does not fit the group
(other world size, unknown version, a backend that cannot start), calls go
to the baseline with one warning at start-up, never an exception. The
runtime imports no harness code (sweep, timing, results, pandas).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from arxtune.runtime.backends.base import Backend, GroupContext
from arxtune.runtime.backends.startup import default_baseline
from arxtune.runtime import ladder
from arxtune.runtime.dispatch import Dispatch, load_for_group
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.thresholds import Thresholds

log = logging.getLogger("arxtune")


def context_from_torch(device: torch.device | None = None, group=None, options: dict | None = None) -> GroupContext:
    """A GroupContext for an initialised torch.distributed job (gloo group made if the default is not gloo)."""
    if not dist.is_initialized():
        raise ArxtuneError("torch.distributed is not initialised; call init_process_group first")
    group = group or dist.group.WORLD
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    cpu_group = group if dist.get_backend(group) == "gloo" else dist.new_group(dist.get_process_group_ranks(group), backend="gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", device.index or 0))
    return GroupContext(dist.get_rank(group), dist.get_world_size(group), local_rank, device, cpu_group,
                        None if device.type == "cpu" else group, options or {})


class Communicator:
    """Calls go to the backend arxtune.runtime.router picks; the baseline serves the rest (and is counted as such)."""

    def __init__(self, ctx: GroupContext, thresholds: str | Path | Thresholds | None = None, baseline: str | None = None,
                 capturing: Callable[[], bool] | None = None):
        self.ctx = ctx
        loaded = load_for_group(ctx, thresholds)
        self.thresholds = loaded.usable
        # The file's baseline where it can run here, else this device's torch.distributed backend.
        fallback = default_baseline(ctx.device)
        preferred = baseline or (loaded.file.baseline if loaded.file else fallback)
        also = tuple(dict.fromkeys((preferred, fallback)))
        self.dispatch = Dispatch(ctx, loaded, preferred, lambda name: name == preferred, also, capturing,
                                 ladder.candidates(ctx.device))
        backends = self.dispatch.backends
        self.baseline_name = preferred if preferred in backends else fallback
        if self.baseline_name not in backends:
            self.dispatch.close()
            raise ArxtuneError(f"baseline backend {self.baseline_name} cannot run here; pass baseline= a backend that can")
        self.baseline: Backend = backends[self.baseline_name]
        self.router = self.dispatch.router
        self.router.fallback = self.baseline_name
        self.thresholds = self.dispatch.thresholds
        if loaded.why and self.thresholds is not None:
            log.info("arxtune: %s; the start-up ladder's tables serve instead", loaded.why)
        elif loaded.why:
            log.warning("arxtune: using %s for every call: %s", self.baseline_name, loaded.why)
        for problem in self.dispatch.opened.problems:
            log.warning("arxtune: %s; those calls use %s", problem, self.baseline_name)
        if ctx.rank == 0:
            log.info("%s", self.summary())

    @classmethod
    def from_env(cls, thresholds: str | Path | Thresholds | None = None, device: torch.device | None = None, group=None,
                 capturing: Callable[[], bool] | None = None) -> "Communicator":
        return cls(context_from_torch(device, group), thresholds, capturing=capturing)

    @property
    def calls(self):
        """Calls so far by (op, backend name), the baseline's under its own name."""
        return self.router.calls

    def summary(self) -> str:
        """The start-up line: world, mode tables, capacity, fingerprint, overrides, and the ranges taken."""
        return f"arxtune: world {self.ctx.world_size}, {self.dispatch.opened.line}"

    def choose(self, op: str, dtype: torch.dtype, nbytes: int) -> Backend:
        """The backend for one call; the baseline when nothing else applies."""
        return self.router.pick(op, dtype, nbytes) or self.baseline

    def route(self, op: str, tensor: torch.Tensor) -> Backend | None:
        """The non-baseline backend that should take this call, or None (the caller uses its own path)."""
        return self.dispatch.pick(op, tensor)

    def _run(self, op: str, tensor: torch.Tensor) -> torch.Tensor:
        return self.dispatch.run(self.route(op, tensor) or self.baseline, op, tensor)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, out of place, same shape."""
        return self._run("all_reduce", tensor)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenation of every rank's tensor along dim 0."""
        return self._run("all_gather", tensor)

    def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's dim-0 slice of the sum over ranks."""
        if tensor.shape[0] % self.ctx.world_size:
            raise ValueError(f"reduce_scatter needs dim 0 ({tensor.shape[0]}) divisible by the world size {self.ctx.world_size}")
        return self._run("reduce_scatter", tensor)

    def close(self) -> None:
        self.dispatch.close()
