"""Per-op facts, not per backend: sizes, bandwidth factors, verifiable data.

Byte convention (as vLLM and nccl-tests compare): all_reduce is sized by one
rank's input; all_gather and reduce_scatter by the total gathered bytes, which
is reduce_scatter's input. Range boundaries: lower bound inclusive, upper
bound exclusive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
}

#: Largest integer each dtype holds exactly: sums stay below it, so any
#: summation order gives the exact answer and checks can demand 0 ulp.
_EXACT_LIMIT = {
    torch.float32: 2**24,
    torch.bfloat16: 2**8,
    torch.float16: 2**11,
    torch.int32: 2**31 - 1,
}


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise KeyError(f"unsupported dtype {dtype}")


@dataclass(frozen=True)
class OpSpec:
    """Everything that makes an op an op; adding one means adding an OpSpec and the backends that run it."""

    name: str
    #: (elements per rank, world) -> (input elements, output elements)
    shapes: Callable[[int, int], tuple[int, int]]
    #: bytes by the convention above, from elements per rank
    nbytes: Callable[[int, int, int], int]
    #: nccl-tests bus-bandwidth factor for `world` ranks
    bus_factor: Callable[[int], float]
    #: (every rank's input, rank, world) -> this rank's exact output
    reference: Callable[[list[torch.Tensor], int, int], torch.Tensor]
    #: (one rank's input bytes, world) -> bytes by the convention above: what thresholds are keyed by
    tensor_nbytes: Callable[[int, int], int]
    #: (input elements, world) -> output elements of a flat call
    out_numel: Callable[[int, int], int]


OP_SPECS: dict[str, OpSpec] = {
    "all_reduce": OpSpec(
        "all_reduce",
        shapes=lambda n, w: (n, n),
        nbytes=lambda n, w, item: n * item,
        bus_factor=lambda w: 2 * (w - 1) / w,
        reference=lambda inputs, rank, w: sum(inputs),  # type: ignore[arg-type, return-value]
        tensor_nbytes=lambda nbytes, w: nbytes,
        out_numel=lambda numel, w: numel,
    ),
    "all_gather": OpSpec(
        "all_gather",
        shapes=lambda n, w: (n, n * w),
        nbytes=lambda n, w, item: n * w * item,
        bus_factor=lambda w: (w - 1) / w,
        reference=lambda inputs, rank, w: torch.cat(inputs),
        tensor_nbytes=lambda nbytes, w: nbytes * w,
        out_numel=lambda numel, w: numel * w,
    ),
    "reduce_scatter": OpSpec(
        "reduce_scatter",
        shapes=lambda n, w: (n * w, n),
        nbytes=lambda n, w, item: n * w * item,
        bus_factor=lambda w: (w - 1) / w,
        reference=lambda inputs, rank, w: sum(inputs).chunk(w)[rank],  # type: ignore[union-attr]
        tensor_nbytes=lambda nbytes, w: nbytes,
        out_numel=lambda numel, w: numel // w,
    ),
}
OPS: tuple[str, ...] = tuple(OP_SPECS)


def elements_per_rank(op: str, nbytes: int, world: int, itemsize: int) -> int:
    """Elements per rank for a requested size, rounded down so the op is well formed (at least 1)."""
    return max(1, nbytes // OP_SPECS[op].nbytes(1, world, itemsize))


def size_grid(min_bytes: int, max_bytes: int, step_factor: float) -> list[int]:
    """Geometric grid of byte sizes from min to max inclusive."""
    if min_bytes <= 0 or max_bytes < min_bytes or step_factor <= 1:
        raise ValueError("need 0 < min_bytes <= max_bytes and step_factor > 1")
    sizes, size = [], float(min_bytes)
    while size <= max_bytes * (1 + 1e-9):
        sizes.append(int(round(size)))
        size *= step_factor
    return sorted(set(sizes))


def _pattern(count: int, rank: int, world: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    """Small signed integers, different per rank and position, whose sum over ranks is exact."""
    span = max(2, _EXACT_LIMIT[dtype] // (2 * world))  # |sum| <= world * span / 2 < limit
    span = min(span, 1 << 12)
    idx = torch.arange(count, dtype=torch.int64)
    values = (idx * 7 + rank * 131 + salt * 17) % span - span // 2
    return values.to(dtype)


def make_input(op: str, n: int, rank: int, world: int, dtype: torch.dtype, device: torch.device, salt: int = 0) -> torch.Tensor:
    """This rank's input for `op` with `n` elements per rank."""
    in_elems, _ = OP_SPECS[op].shapes(n, world)
    return _pattern(in_elems, rank, world, dtype, salt).to(device)


def expected_output(op: str, n: int, rank: int, world: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Exact reference for this rank's output, computed in int64 from every rank's input."""
    in_elems, _ = OP_SPECS[op].shapes(n, world)
    inputs = [_pattern(in_elems, r, world, dtype, salt).to(torch.int64) for r in range(world)]
    return OP_SPECS[op].reference(inputs, rank, world).to(dtype)


def mismatch(out: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None when `out` equals the reference bit for bit, else a short description."""
    got = out.detach().to("cpu")
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)} != expected {tuple(expected.shape)}"
    bad = (got != expected).nonzero()
    if bad.numel() == 0:
        return None
    first = int(bad[0, 0]) if bad.dim() > 1 else int(bad[0])
    return f"{bad.shape[0]} of {got.numel()} elements wrong; first at {first}: got {got[first].item()} expected {expected[first].item()}"


def differs(got: torch.Tensor, want: torch.Tensor, op: str, world: int) -> str | None:
    """None when `got` agrees with another backend's `want` for the same call, else a short description.

    Bit for bit where no arithmetic happens (all_gather) or none rounds (integers); for floating-point sums,
    within what `world` additions in another order can move a result: world x eps x the largest magnitude.
    """
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    if op == "all_gather" or not got.is_floating_point():
        return mismatch(got, want)
    g, w = got.detach().double(), want.detach().double()
    largest = float(torch.nan_to_num(w.abs(), posinf=0.0, neginf=0.0).amax()) if w.numel() else 0.0
    tol = world * torch.finfo(got.dtype).eps * largest
    bad = ~torch.isclose(g, w, rtol=0.0, atol=tol, equal_nan=True)
    if not bool(bad.any()):
        return None
    flat = bad.reshape(-1).nonzero()
    first = int(flat[0, 0])
    return (
        f"{flat.shape[0]} of {got.numel()} elements differ by more than {tol:.3g}; first at {first}: "
        f"got {got.reshape(-1)[first].item()} expected {want.reshape(-1)[first].item()}"
    )
