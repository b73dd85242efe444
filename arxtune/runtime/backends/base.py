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

What only the backend knows, asked of its class without a group (doctor, config
checks, the start-up ladder and the vLLM plugin ask; each is optional):
- why_not_here() -> str | None (classmethod): why it cannot run on this box
  (None: it may; absent: not known without a group);
- check_options(options) (classmethod): raise on options it does not take, so a
  bad option is refused before launching, even where it cannot run;
- start_up_candidate: the device types ("cpu", "cuda") on which the start-up
  ladder may time it for a group without a thresholds file;
- framework: the framework whose own communicator it is ("vllm"), which opening
  it imports and whose ranges that framework's plugin serves itself.

A capturable backend whose failures happen inside a graph replay (a kernel
that gave up waiting) may also define check(): the harness calls it after
synchronising and records what it raises as the point's error.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import torch

from arxtune.runtime.ops import OPS  # noqa: F401  (re-exported: the ops are defined once, in arxtune.runtime.ops)


def no_cuda() -> str | None:
    """Why a backend of CUDA tensors cannot run here, or None."""
    return None if torch.cuda.is_available() else "needs CUDA tensors; no CUDA GPU"


def no_vllm() -> str | None:
    """Why a backend of vLLM's cannot run here, or None (found, not imported: importing vLLM takes seconds)."""
    import importlib.util

    return None if importlib.util.find_spec("vllm") else "vllm is not installed (pip install 'arxtune[vllm]')"


def max_bytes_only(options: dict) -> None:
    """The options of a backend whose only one is its buffer's size."""
    from arxtune.runtime.errors import ArxtuneError
    from arxtune.runtime.units import parse_bytes

    unknown = sorted(set(options) - {"max_bytes"})
    if unknown:
        raise ArxtuneError(f"unknown option {unknown[0]!r}; known: max_bytes")
    if "max_bytes" in options:
        parse_bytes(options["max_bytes"])


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
