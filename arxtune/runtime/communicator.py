"""The bundled communicator: loads a thresholds file once, picks a backend per call.

Usable from plain torch.distributed code:

    dist.init_process_group(...)
    comm = Communicator.from_env()          # ARXTUNE_THRESHOLDS or a path
    y = comm.all_reduce(x)

Routing is arxtune.runtime.router's (mode tables, overrides, capacity, capture,
counters). Outside every range, or when the file does not fit the group
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

from arxtune.runtime.backends import Backend, GroupContext
from arxtune.runtime.backends.startup import default_baseline
from arxtune.runtime.ops import OP_SPECS
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.router import open_router
from arxtune.runtime.thresholds import Thresholds, load
from arxtune.runtime import env

log = logging.getLogger("arxtune")
ENV_THRESHOLDS = env.THRESHOLDS.name


def default_thresholds_path() -> Path:
    """Where deployments look when no path is given: $ARXTUNE_THRESHOLDS, else ~/.config/arxtune/thresholds.json."""
    return Path(env.THRESHOLDS.get() or Path.home() / ".config" / "arxtune" / "thresholds.json")


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


def read_thresholds(world_size: int, source: str | Path | Thresholds | None = None) -> tuple[Thresholds | None, Path | None, str]:
    """(thresholds, path, why not) for a group of `world_size`, without raising.

    A missing, malformed or unknown-version file, or one with no table for
    this world size, is a reason (the caller warns once and uses its baseline).
    `source` defaults to default_thresholds_path().
    """
    if isinstance(source, Thresholds):
        thresholds, path, where = source, None, "the Thresholds given"
    else:
        path = Path(source) if source else default_thresholds_path()
        if not source and not path.is_file():
            return None, path, (f"no thresholds file at {path} (set {ENV_THRESHOLDS}, or write one with "
                                "`arxtune calibrate RUN --install`)")
        try:
            thresholds = load(path)
        except ArxtuneError as exc:
            return None, path, str(exc)
        where = str(path)
    if world_size not in thresholds.world_sizes:
        return thresholds, path, f"{where} holds tables for world sizes {sorted(thresholds.world_sizes)}, not {world_size}"
    return thresholds, path, ""


def _capture_check(device: torch.device) -> Callable[[], bool] | None:
    """How to tell a call made during CUDA-graph capture; CPU tensors are never captured."""
    return torch.cuda.is_current_stream_capturing if device.type == "cuda" else None


class Communicator:
    """Calls go to the backend arxtune.runtime.router picks; the baseline serves the rest (and is counted as such)."""

    def __init__(self, ctx: GroupContext, thresholds: str | Path | Thresholds | None = None, baseline: str | None = None,
                 capturing: Callable[[], bool] | None = None):
        self.ctx = ctx
        loaded, _, why = read_thresholds(ctx.world_size, thresholds)
        self.thresholds = None if why else loaded
        # The file's baseline where it can run here, else this device's torch.distributed backend.
        fallback = default_baseline(ctx.device)
        preferred = baseline or (loaded.baseline if loaded else fallback)
        also = tuple(dict.fromkeys((preferred, fallback)))
        self._opened = open_router(self.thresholds, ctx, preferred, lambda name: name == preferred,
                                   capturing or _capture_check(ctx.device), also)
        backends = self._opened.backends
        self.baseline_name = preferred if preferred in backends else fallback
        if self.baseline_name not in backends:
            self._opened.close()
            raise ArxtuneError(f"baseline backend {self.baseline_name} cannot run here; pass baseline= a backend that can")
        self.baseline: Backend = backends[self.baseline_name]
        self.router = self._opened.router
        self.router.fallback = self.baseline_name
        if why:
            log.warning("arxtune: using %s for every call: %s", self.baseline_name, why)
        for problem in self._opened.problems:
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
        return f"arxtune: world {self.ctx.world_size}, {self._opened.line}"

    def choose(self, op: str, dtype: torch.dtype, nbytes: int) -> Backend:
        """The backend for one call; the baseline when nothing else applies."""
        return self.router.pick(op, dtype, nbytes) or self.baseline

    def route(self, op: str, tensor: torch.Tensor) -> Backend | None:
        """The non-baseline backend that should take this call, or None (the caller uses its own path)."""
        return self.router.pick(op, tensor.dtype, OP_SPECS[op].tensor_nbytes(tensor.nbytes, self.ctx.world_size))

    def _run(self, op: str, tensor: torch.Tensor) -> torch.Tensor:
        spec = OP_SPECS[op]
        flat = tensor.contiguous().view(-1)
        out = torch.empty(spec.out_numel(flat.numel(), self.ctx.world_size), dtype=tensor.dtype, device=tensor.device)
        getattr(self.choose(op, tensor.dtype, spec.tensor_nbytes(flat.nbytes, self.ctx.world_size)), op)(flat, out)
        return out

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, out of place, same shape."""
        return self._run("all_reduce", tensor).view(tensor.shape)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenation of every rank's tensor along dim 0."""
        return self._run("all_gather", tensor).view(tensor.shape[0] * self.ctx.world_size, *tensor.shape[1:])

    def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's dim-0 slice of the sum over ranks."""
        if tensor.shape[0] % self.ctx.world_size:
            raise ValueError(f"reduce_scatter needs dim 0 ({tensor.shape[0]}) divisible by the world size {self.ctx.world_size}")
        return self._run("reduce_scatter", tensor).view(tensor.shape[0] // self.ctx.world_size, *tensor.shape[1:])

    def close(self) -> None:
        self._opened.close()
