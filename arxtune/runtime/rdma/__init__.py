"""RDMA (RoCE v2, pyverbs) transport and collectives, usable without the benchmark.

    from arxtune.runtime.rdma import RdmaConfig, connect
    coll = connect(RdmaConfig.resolve(), rank, world, gloo_exchange(group, world))
    coll.all_reduce_one_shot(inp, out)

Modules: config (settings and their precedence), device (sysfs discovery, GID
choice, IPv4 addresses), reach (which device reaches which peer, the links),
protocol (buffer layout, slots, sequence numbers, plans), connection (QPs,
memory registration, exchange, post/poll), algorithms (the collectives),
floor (ib_write_lat as the fabric's latency floor), errors.
"""

from __future__ import annotations

from arxtune.runtime.rdma.algorithms import Collectives
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.connection import Exchange, Transport, gloo_exchange, open_transport
from arxtune.runtime.rdma.errors import RdmaError, RdmaTimeout, RdmaUnavailable


def connect(cfg: RdmaConfig, rank: int, world: int, exchange: Exchange) -> Collectives:
    """Open and connect the transport on every rank (collective call) and wrap it in Collectives."""
    return Collectives(open_transport(cfg, rank, world, exchange), cfg.gather_chunk_bytes)


__all__ = [
    "Collectives",
    "RdmaConfig",
    "RdmaError",
    "RdmaTimeout",
    "RdmaUnavailable",
    "Transport",
    "connect",
    "gloo_exchange",
    "open_transport",
]
