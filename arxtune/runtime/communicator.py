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

`from_env` gives arxtune a gloo group of its own, which `close()` ends (and an
exit hook, for a communicator never closed): none of arxtune's gloo threads
is left when the interpreter finalizes.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import weakref
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from arxtune.runtime.backends.base import Backend
from arxtune.runtime.dispatch import Caller, Dispatch, load_for_group
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.group import GroupContext
from arxtune.runtime.router import Router
from arxtune.runtime.thresholds import Thresholds

log = logging.getLogger("arxtune")


#: The gloo groups context_from_torch made: a Communicator closing over one of them ends it.
_OWN_GROUPS: "weakref.WeakSet" = weakref.WeakSet()
#: Every Communicator not yet closed: closed at interpreter exit, before the interpreter is torn down.
_OPEN: "weakref.WeakSet[Communicator]" = weakref.WeakSet()


def context_from_torch(device: torch.device | None = None, group=None, options: dict | None = None) -> GroupContext:
    """A GroupContext for an initialised torch.distributed job, with a gloo group of arxtune's own.

    Every collective arxtune makes (start-up agreement, the ladder, calls its gloo baseline serves) goes over
    that group, never over the caller's; the Communicator built on it ends it when it closes, and with it the
    gloo threads that carried arxtune's traffic. A collective of the default group: every rank calls it.
    """
    if not dist.is_initialized():
        raise ArxtuneError("torch.distributed is not initialised; call init_process_group first")
    group = group or dist.group.WORLD
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    cpu_group = dist.new_group(dist.get_process_group_ranks(group), backend="gloo")
    _OWN_GROUPS.add(cpu_group)
    local_rank = int(os.environ.get("LOCAL_RANK", device.index or 0))
    return GroupContext(
        dist.get_rank(group),
        dist.get_world_size(group),
        local_rank,
        device,
        cpu_group,
        None if device.type == "cpu" else group,
        options or {},
    )


def _end_group(group) -> None:
    """Destroy a group context_from_torch made (its C++ side, and its threads, go with the last reference)."""
    from torch.distributed import distributed_c10d

    if group in _OWN_GROUPS:
        _OWN_GROUPS.discard(group)
        if group in distributed_c10d._world.pg_map:  # the caller's destroy_process_group() may have ended it already
            dist.destroy_process_group(group)


class _Closed:
    """What serves every call of a closed Communicator: one clear error."""

    name = "closed"

    def _refuse(self, *_):
        raise ArxtuneError("this Communicator is closed; make a new one")

    all_reduce = all_gather = reduce_scatter = _refuse

    def close(self) -> None:
        pass


class Communicator:
    """Calls go to the backend arxtune.runtime.router picks; the baseline serves the rest (and is counted as such)."""

    def __init__(
        self,
        ctx: GroupContext,
        thresholds: str | Path | Thresholds | None = None,
        baseline: str | None = None,
        capturing: Callable[[], bool] | None = None,
    ):
        self.ctx = ctx
        loaded = load_for_group(ctx, thresholds)
        # The baseline asked for, else the file's where it can run here, else this device's torch.distributed backend.
        self.dispatch = Dispatch(ctx, loaded, Caller(baseline=baseline, candidates=True, capturing=capturing))
        self.baseline: Backend = self.dispatch.backends[self.baseline_name]
        if ctx.rank == 0:  # the ranks agree on all of it: the group's rank 0 says it once
            if loaded.why and self.thresholds is not None:
                log.info("arxtune: %s; the start-up ladder's tables serve instead", loaded.why)
            elif loaded.why:
                log.warning("arxtune: using %s for every call: %s", self.baseline_name, loaded.why)
            for problem in self.dispatch.started.problems:
                log.warning("arxtune: %s; those calls use %s", problem, self.baseline_name)
            log.info("%s", self.summary())
        _OPEN.add(self)

    @property
    def thresholds(self) -> Thresholds | None:
        """The thresholds in force: the file, the start-up ladder's, or None (no usable file, a strict fingerprint)."""
        return self.dispatch.started.thresholds

    @property
    def baseline_name(self) -> str:
        return self.dispatch.started.baseline

    @property
    def router(self) -> Router:
        return self.dispatch.started.router

    @classmethod
    def from_env(
        cls,
        thresholds: str | Path | Thresholds | None = None,
        device: torch.device | None = None,
        group=None,
        capturing: Callable[[], bool] | None = None,
    ) -> "Communicator":
        ctx = context_from_torch(device, group)
        try:
            return cls(ctx, thresholds, capturing=capturing)
        except BaseException:
            _end_group(ctx.cpu_group)
            raise

    @property
    def calls(self):
        """Calls so far by (op, backend name), the baseline's under its own name."""
        return self.router.calls

    def summary(self) -> str:
        """The start-up line: world, mode tables, capacity, fingerprint, overrides, and the ranges taken."""
        return f"arxtune: world {self.ctx.world_size}, {self.dispatch.started.line}"

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
        """Close the backends and let go of every process group (ending the gloo group context_from_torch made);
        later calls raise, a second close does nothing. Run at interpreter exit for a Communicator never closed."""
        if isinstance(self.baseline, _Closed):
            return
        _OPEN.discard(self)
        self.dispatch.close()
        self.baseline = _Closed()  # type: ignore[assignment]
        group = self.ctx.cpu_group
        self.ctx = self.dispatch.ctx = dataclasses.replace(self.ctx, cpu_group=None, device_group=None)
        _end_group(group)


@atexit.register
def _close_all() -> None:
    """At exit, before the interpreter is torn down: close what is open, so no gloo thread of arxtune's is left
    holding a collective's tensors (their release takes the GIL, and a thread that needs it while the
    interpreter finalizes ends the process with SIGABRT: "terminate called without an active exception")."""
    for comm in list(_OPEN):
        try:
            comm.close()
        except Exception as exc:  # leaving must not fail
            log.warning("arxtune: closing a communicator at exit failed (%s: %s)", type(exc).__name__, exc)
