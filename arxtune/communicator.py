"""The bundled communicator: loads a thresholds file once, picks a backend per call.

Usable from plain torch.distributed code:

    dist.init_process_group(...)
    comm = Communicator.from_env()          # ARXTUNE_THRESHOLDS or a path
    y = comm.all_reduce(x)

Outside every range, or when the file does not fit the group (other world
size, unknown version, a backend that cannot start), calls go to the
baseline with one warning at start-up, never an exception.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

from .backends import Backend, GroupContext
from .collectives import OP_SPECS
from .errors import ArxtuneError
from .thresholds import Lookup, Thresholds, load

log = logging.getLogger("arxtune")
ENV_THRESHOLDS = "ARXTUNE_THRESHOLDS"


def default_thresholds_path() -> Path:
    """Where deployments look when no path is given: $ARXTUNE_THRESHOLDS, else ~/.config/arxtune/thresholds.json."""
    return Path(os.environ.get(ENV_THRESHOLDS) or Path.home() / ".config" / "arxtune" / "thresholds.json")


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


class Communicator:
    def __init__(self, ctx: GroupContext, thresholds: str | Path | Thresholds | None = None, baseline: str | None = None):
        from .sweep import default_baseline, open_backends

        self.ctx = ctx
        loaded, _, why = read_thresholds(ctx.world_size, thresholds)
        self.thresholds = loaded
        # The file's baseline where it can run here, else this device's torch.distributed backend.
        fallback = default_baseline(ctx.device)
        preferred = baseline or (loaded.baseline if loaded else fallback)
        wanted = sorted((loaded.backends if not why else set()) | {preferred, fallback})
        opened, status = open_backends(wanted, ctx)
        self.baseline_name = preferred if preferred in opened else fallback
        if self.baseline_name not in opened:
            raise ArxtuneError(f"baseline backend {self.baseline_name} cannot run: {status[self.baseline_name]['reason']}")
        self.baseline: Backend = opened[self.baseline_name]
        self._backends = opened
        missing = {n: s["reason"] for n, s in status.items() if not s["available"]}
        if why:
            log.warning("arxtune: using %s for every call: %s", self.baseline_name, why)
        elif missing:
            log.warning("arxtune: %s cannot start (%s); their ranges use %s", ", ".join(missing),
                        "; ".join(f"{n}: {r}" for n, r in missing.items()), self.baseline_name)
        self._lookup = None if why else Lookup(loaded, ctx.world_size, resolve=lambda name: opened.get(name, self.baseline))

    @classmethod
    def from_env(cls, thresholds: str | Path | Thresholds | None = None, device: torch.device | None = None, group=None) -> "Communicator":
        return cls(context_from_torch(device, group), thresholds)

    def summary(self) -> str:
        """One line on which ranges this communicator takes from the baseline."""
        if self._lookup is None or self.thresholds is None:
            return f"arxtune: every call uses {self.baseline_name}"
        taken = []
        for t in self.thresholds.tables:
            if t.world_size == self.ctx.world_size:
                taken += [f"{t.op}/{t.dtype} [{r.lo},{'inf' if r.hi is None else r.hi})->{r.backend}"
                          for r in t.ranges if r.backend != self.baseline_name and r.backend in self._backends]
        return "arxtune: " + (", ".join(taken) if taken else f"every call uses {self.baseline_name}")

    def choose(self, op: str, dtype: torch.dtype, nbytes: int) -> Backend:
        """The backend for one call; the baseline when nothing else applies."""
        backend = self._lookup.choose(op, dtype, nbytes) if self._lookup is not None else None
        if backend is None or (backend is not self.baseline and not backend.supports(op, dtype, nbytes)):
            return self.baseline
        return backend

    def _nbytes(self, op: str, tensor: torch.Tensor) -> int:
        return tensor.nbytes * self.ctx.world_size if op == "all_gather" else tensor.nbytes

    def route(self, op: str, tensor: torch.Tensor) -> Backend | None:
        """The non-baseline backend that should take this call, or None (the caller uses its own path)."""
        backend = self.choose(op, tensor.dtype, self._nbytes(op, tensor))
        return None if backend is self.baseline else backend

    def _run(self, op: str, tensor: torch.Tensor) -> torch.Tensor:
        flat = tensor.contiguous().view(-1)
        world = self.ctx.world_size
        per_rank = flat.numel() // world if op == "reduce_scatter" else flat.numel()
        out = torch.empty(OP_SPECS[op].shapes(per_rank, world)[1], dtype=tensor.dtype, device=tensor.device)
        getattr(self.choose(op, tensor.dtype, self._nbytes(op, flat)), op)(flat, out)
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
        for backend in self._backends.values():
            backend.close()
