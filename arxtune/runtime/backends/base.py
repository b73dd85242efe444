"""The one protocol every collective backend implements.

The harness owns timing, synchronisation and checking; a backend only moves
bytes. Every op is out-of-place into a caller-allocated output, so the same
call can be timed eagerly or captured in a CUDA graph without allocation.

Shapes (one flat, contiguous tensor per argument, n = elements per rank):
- all_reduce(inp[n], out[n]): out = sum of inp over ranks.
- all_gather(inp[n], out[world*n]): out[r*n:(r+1)*n] = inp of rank r.
- reduce_scatter(inp[world*n], out[n]): out = sum over ranks of inp[rank*n:(rank+1)*n].

A backend may also define bind(op, inp, out) -> a zero-argument call of that
op on those buffers: the harness times that call, so per-call work the backend
can do once (pointers, counts) is not timed. It may instead define
bind_rotation(op, ins, outs) -> a zero-argument call that runs on the next
buffer pair each time; where that call has a `repeat(n, start, end)`, eager
samples use it to launch n calls back to back in the backend's own loop (nccl:
a C loop), recording the CUDA events `start` before them and `end` after.

A backend that writes over RDMA devices may define fabric_devices() -> the device
names it uses (empty: all): the sweep then measures the fabric's ib_write_lat floor.

A capturable backend whose failures happen inside a graph replay (a kernel
that gave up waiting) may also define check(): the harness calls it after
synchronising and records what it raises as the point's error.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import torch

from arxtune.runtime.ops import OPS  # noqa: F401  (re-exported: the ops are defined once, in arxtune.runtime.ops)


class BackendUnavailable(Exception):
    """Raised by a backend's constructor when it cannot run here; the reason is stored in results."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Backend(Protocol):
    name: ClassVar[str]
    #: Whether ops can be recorded into a CUDA graph and replayed.
    capturable: ClassVar[bool]
    #: The collectives it implements (optional; all of OPS when absent). Others are not planned.
    ops: ClassVar[tuple[str, ...]]

    def supports(self, op: str, dtype: torch.dtype, nbytes: int) -> bool:
        """Whether this backend can run `op` at this size (bytes as in arxtune.runtime.ops)."""
        ...

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor) -> None: ...

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor) -> None: ...

    def reduce_scatter(self, inp: torch.Tensor, out: torch.Tensor) -> None: ...

    def close(self) -> None: ...

