"""Transport settings: defaults, then the config file's options, then the environment.

Precedence (later wins): the defaults below < the per-backend options from the
sweep or communicator config (``[backends.arx]`` -> ``ctx.options_for("arx")``)
< environment variables. The environment wins so that one deployment can be
re-pointed (another NIC, another GID) without editing a shared config file:

- ``ARXTUNE_RDMA_DEVICES``: comma-separated RDMA device names, e.g. ``rocep1s0f1,roceP2p1s0f1``
- ``ARXTUNE_RDMA_PORT``: port number (1-based)
- ``ARXTUNE_RDMA_GID_INDEX``: GID table index; unset = the RoCE v2 GID carrying an IPv4 address
- ``ARXTUNE_RDMA_MAX_BYTES``: largest message; sizes buffers (accepts ``4MiB``, ``512k``...)
- ``ARXTUNE_RDMA_TIMEOUT_S``: seconds before a silent peer becomes an error
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.units import parse_bytes
from arxtune.runtime import env as variables

ENV = {
    "devices": variables.RDMA_DEVICES,
    "port": variables.RDMA_PORT,
    "gid_index": variables.RDMA_GID_INDEX,
    "max_bytes": variables.RDMA_MAX_BYTES,
    "timeout_s": variables.RDMA_TIMEOUT_S,
}


@dataclass(frozen=True)
class RdmaConfig:
    """How the arx transport finds its NICs and sizes its buffers."""

    #: RDMA device names; None = every device with an active port and a RoCE v2 IPv4 GID.
    #: Several devices stripe large messages across them (the GB10 "twins").
    devices: tuple[str, ...] | None = None
    #: Port number on each device (1-based, as in ibv_query_port).
    port: int = 1
    #: GID table index; None = the RoCE v2 GID that carries the netdev's IPv4 address.
    gid_index: int | None = None
    #: Largest all-reduce input / reduce-scatter input in bytes; buffers are registered
    #: once at this size (slots x ranks x max_bytes of pinned memory), never on the hot path.
    max_bytes: int = 4 << 20
    #: Seconds a call may wait for a peer before it raises instead of hanging.
    timeout_s: float = 30.0
    #: Receive slots used round-robin by consecutive steps (>= 2). Two suffice for the
    #: barrier-free flag protocol; a third lets a CUDA gather copy chunk i out while
    #: chunk i+1 is on the wire.
    slots: int = 2
    #: Per-rank bytes per all-gather pipeline step; None = max_bytes.
    chunk_bytes: int | None = None
    #: Messages below this go over the first device only: striping a small write
    #: costs a second work request for no bandwidth.
    stripe_min_bytes: int = 256 << 10

    def __post_init__(self):
        if self.devices is not None and not all(self.devices):
            raise ArxtuneError(f"arx: empty RDMA device name in {list(self.devices)}")
        if self.port < 1:
            raise ArxtuneError(f"arx: port must be >= 1, got {self.port}")
        if self.gid_index is not None and self.gid_index < 0:
            raise ArxtuneError(f"arx: gid_index must be >= 0, got {self.gid_index}")
        if self.max_bytes < 64 or self.max_bytes % 64:
            raise ArxtuneError(f"arx: max_bytes must be a positive multiple of 64, got {self.max_bytes}")
        if self.timeout_s <= 0:
            raise ArxtuneError(f"arx: timeout_s must be > 0, got {self.timeout_s}")
        if self.slots < 2:
            raise ArxtuneError(f"arx: slots must be >= 2 (the flag protocol alternates), got {self.slots}")
        if self.chunk_bytes is not None and not (64 <= self.chunk_bytes <= self.max_bytes and self.chunk_bytes % 64 == 0):
            raise ArxtuneError(f"arx: chunk_bytes must be a multiple of 64 in [64, max_bytes], got {self.chunk_bytes}")

    @property
    def gather_chunk_bytes(self) -> int:
        return self.chunk_bytes or self.max_bytes

    @classmethod
    def resolve(cls, options: Mapping | None = None, env: Mapping[str, str] | None = None) -> RdmaConfig:
        """Defaults < ``options`` (config file) < ``env`` (os.environ when None)."""
        known = {f.name for f in fields(cls)}
        raw: dict = {}
        for key, value in (options or {}).items():
            if key not in known:
                raise ArxtuneError(f"arx: unknown option {key!r}; known: {', '.join(sorted(known))}")
            raw[key] = value
        for key, variable in ENV.items():
            if variable.is_set(env):
                raw[key] = variable.get(env)
        try:
            return replace(cls(), **{k: _convert(k, v) for k, v in raw.items()})
        except (TypeError, ValueError) as exc:
            raise ArxtuneError(f"arx: bad RDMA setting: {exc}") from None


def _convert(key: str, value):
    if value is None:
        return None
    if key == "devices":
        names = value.split(",") if isinstance(value, str) else list(value)
        return tuple(n.strip() for n in names)
    if key in ("max_bytes", "chunk_bytes", "stripe_min_bytes"):
        try:
            return parse_bytes(value)
        except ArxtuneError:
            raise ValueError(f"not a byte size: {value!r} (use e.g. 4096, 64KiB, 4MiB)") from None
    if key in ("port", "gid_index", "slots"):
        return int(value)
    if key == "timeout_s":
        return float(value)
    return value
