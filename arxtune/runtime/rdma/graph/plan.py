"""What a rank's proxy writes for one step: a pure function of (op, bytes, rank, world).

Every write goes from this rank's staging slot to the same place at each peer:
the peer's inbox region for this rank (Layout.inbox(step, rank)). Sizes follow
arxtune's convention: `nbytes` is one rank's input (all_reduce, all_gather) or the
whole reduce-scatter input, of which peer p gets piece p.
"""

from __future__ import annotations

from typing import NamedTuple

from arxtune.runtime.rdma.graph.segment import OP_CODES


class Write(NamedTuple):
    peer: int
    src_offset: int  # in this rank's staging slot
    nbytes: int


def plan(op: str, nbytes: int, rank: int, world: int) -> list[Write]:
    """The writes of one step, peers staggered (rank+1 first) so no rank is everyone's first."""
    peers = [(rank + i) % world for i in range(1, world)]
    if op in ("all_reduce", "all_gather"):
        return [Write(p, 0, nbytes) for p in peers]
    if op == "reduce_scatter":
        if nbytes % world:
            raise ValueError(f"reduce_scatter input of {nbytes} bytes does not split into {world} pieces")
        piece = nbytes // world
        return [Write(p, p * piece, piece) for p in peers]
    if op == "handshake":
        return []
    raise ValueError(f"unknown op {op!r}; known: {', '.join(OP_CODES)}")


def inbox_bytes(op: str, nbytes: int, world: int) -> int:
    """Bytes each peer's payload occupies in a receiver's inbox region."""
    return nbytes // world if op == "reduce_scatter" else nbytes
