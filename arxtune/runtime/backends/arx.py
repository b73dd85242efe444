"""arx backends: RDMA (RoCE v2) collectives from arxtune.runtime.rdma.

`arx` all-reduces one-shot (one step: everyone writes its whole input to every
peer); `arx2` two-shot (reduce-scatter, then all-gather: half the bytes per
rank at p > 2, one more latency). All-gather and reduce-scatter are the same
direct algorithms in both.

Options: ``[backends.arx]`` in the config applies to both, ``[backends.arx2]``
overrides it for arx2; the ARXTUNE_RDMA_* environment variables override both
(see arxtune.runtime.rdma.config for the keys and the precedence).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.distributed as dist

from arxtune.runtime.rdma import Collectives, RdmaConfig, RdmaUnavailable, connect, gloo_exchange
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.backends.base import BackendUnavailable
from arxtune.runtime.group import GroupContext

#: dtypes whose sum torch computes the same way on every rank (no bool / complex)
DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.int64})


#: RdmaConfig fields that change what a measurement means (not timeouts, ports or GID indices).
SHAPING_OPTIONS = ("devices", "max_bytes", "chunk_bytes", "slots", "stripe_min_bytes")


def resolve_config(ctx: GroupContext, name: str) -> RdmaConfig:
    return RdmaConfig.resolve({**ctx.options_for("arx"), **ctx.options_for(name)})


def rdma_options(options: dict) -> None:
    """RDMA settings as arx reads them (arxg's `transport` is its own)."""
    RdmaConfig.resolve({k: v for k, v in options.items() if k != "transport"}, env={})


def rdma_missing() -> str | None:
    """Why arx cannot run here, or None: its settings, pyverbs, the RDMA devices and the memory it may lock (no group needed)."""
    from arxtune.runtime.rdma.connection import PYVERBS_IMPORT_ERROR
    from arxtune.runtime.rdma.device import check_memlock, read_devices, select_endpoints
    from arxtune.runtime.rdma.protocol import Layout

    try:
        cfg = RdmaConfig.resolve()
        if PYVERBS_IMPORT_ERROR is not None:
            return f"pyverbs not importable ({PYVERBS_IMPORT_ERROR}); install it: `arxtune pyverbs install` (the rdma extra)"
        eps = select_endpoints(cfg, read_devices())
        check_memlock(Layout(2, cfg.slots, cfg.max_bytes, len(eps)).total_bytes)
    except Exception as exc:
        return str(exc)
    return None


class _Arx:
    name: ClassVar[str]
    capturable: ClassVar[bool] = False
    check_options = staticmethod(rdma_options)

    @classmethod
    def why_not_here(cls) -> str | None:
        return rdma_missing()

    def __init__(self, ctx: GroupContext):
        if not dist.is_initialized():
            raise BackendUnavailable("torch.distributed is not initialised (run under torchrun)")
        if ctx.device.type not in ("cpu", "cuda"):
            raise BackendUnavailable(f"arx copies through pinned host memory from cpu or cuda tensors, not {ctx.device.type}")
        try:
            self.cfg = resolve_config(ctx, self.name)
            self.coll: Collectives = connect(self.cfg, ctx.rank, ctx.world_size, gloo_exchange(ctx.cpu_group, ctx.world_size))
        except (RdmaUnavailable, ArxtuneError) as exc:
            raise BackendUnavailable(str(exc)) from exc

    def supports(self, op: str, dtype: torch.dtype, nbytes: int) -> bool:
        """all_reduce and reduce_scatter inputs must fit the registered buffer (max_bytes);
        all_gather of any size is chunked through it."""
        if dtype not in DTYPES:
            return False
        if op == "all_gather":
            return True
        return op in ("all_reduce", "reduce_scatter") and nbytes <= self.cfg.max_bytes

    def capacity(self) -> dict[str, int]:
        """all_reduce and reduce_scatter inputs up to max_bytes (the registered buffers); all_gather has no limit."""
        return {"all_reduce": self.cfg.max_bytes, "reduce_scatter": self.cfg.max_bytes}

    def fabric_devices(self) -> tuple[str, ...]:
        """The RDMA devices it writes through (empty: every active one), where the sweep measures the fabric's floor."""
        return tuple(self.cfg.devices or ())

    def effective_options(self) -> dict:
        """The settings that shape what it measures, to be stored with a run and used again at runtime."""
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key in SHAPING_OPTIONS
            if (value := getattr(self.cfg, key)) is not None
        }

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.coll.all_gather(inp, out)

    def reduce_scatter(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.coll.reduce_scatter(inp, out)

    def close(self) -> None:
        coll, self.coll = getattr(self, "coll", None), None
        if coll is not None:
            coll.close()


class ArxOneShot(_Arx):
    name = "arx"

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.coll.all_reduce_one_shot(inp, out)


class ArxTwoShot(_Arx):
    name = "arx2"

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.coll.all_reduce_two_shot(inp, out)
