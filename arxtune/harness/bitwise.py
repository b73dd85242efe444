"""Whether a backend gives the baseline's bits on data that rounds.

The sweep's correctness check uses small integers, which any summation order
adds exactly, so it cannot tell two correct backends that add the ranks'
values in different orders apart. Here every backend that passed runs once
more on random non-integer data and its output is compared bit for bit with
the baseline's output on the same data (computed once per point). Rank r's
data comes from the fixed seed SEED + r: different on every rank, the same in
every run, whatever the backend. With two ranks every order gives the same
bits (each element is one rounded a + b); from three ranks on, the order
shows in bfloat16, float16 and float32 sums.
"""

from __future__ import annotations

from typing import Callable

import torch

from arxtune.runtime.group import GroupContext, gather_objects
from arxtune.runtime.ops import DTYPES, OP_SPECS, elements_per_rank

SEED = 35
#: Integer data stays well inside int32, so any order of adding `world` of them is exact.
INT_SPAN = 1 << 20
#: Same-size integer types to compare floating-point bits with (NaN payloads and -0.0 included).
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: (backend name, input, output) -> '' once the call is done on this rank, else what went wrong here (no collective
#: of its own: check agrees on every backend's outcome and bits in one).
Call = Callable[[str, torch.Tensor, torch.Tensor], str]


def random_input(op: str, n: int, rank: int, world: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """This rank's random input for `op` with `n` elements per rank: normal values (integers for int32)."""
    in_elems, _ = OP_SPECS[op].shapes(n, world)
    generator = torch.Generator().manual_seed(SEED + rank)
    if dtype.is_floating_point:
        values = torch.randn(in_elems, generator=generator, dtype=torch.float32)
    else:
        values = torch.randint(-INT_SPAN, INT_SPAN, (in_elems,), generator=generator)
    return values.to(dtype).to(device)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (shape and dtype too)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = _BITS[a.element_size()]
    return torch.equal(a.detach().contiguous().view(bits), b.detach().contiguous().view(bits))


def _agree(error: str, same: bool, cpu_group) -> bool | str:
    """Every rank's outcome of one call in one collective: True or False (the baseline's bits on every rank),
    or the failures as 'rank r: ...'."""
    answers = gather_objects((error, same), cpu_group)
    failed = "; ".join(f"rank {rank}: {e}" for rank, (e, _) in enumerate(answers) if e)
    return failed or all(s for _, s in answers)


def check(op: str, dtype_name: str, size: int, ctx: GroupContext, baseline: str, names: list[str], call: Call) -> dict[str, bool | str]:
    """Per backend in `names` (those whose point passed): whether its output had the baseline's bits on every
    rank, or its failure ('rank r: ...'). Empty when the baseline is not among them (nothing to compare with)."""
    if baseline not in names:
        return {}
    dtype = DTYPES[dtype_name]
    n = elements_per_rank(op, size, ctx.world_size, dtype.itemsize)
    inp = random_input(op, n, ctx.rank, ctx.world_size, dtype, ctx.device)
    out_elems = OP_SPECS[op].shapes(n, ctx.world_size)[1]
    reference = torch.zeros(out_elems, dtype=dtype, device=ctx.device)
    found = _agree(call(baseline, inp.clone(), reference), True, ctx.cpu_group)
    if found is not True:
        return {baseline: found}
    results: dict[str, bool | str] = {baseline: True}
    for name in names:
        if name != baseline:
            out = torch.zeros(out_elems, dtype=dtype, device=ctx.device)
            error = call(name, inp.clone(), out)  # a fresh copy: a backend may write into its input
            results[name] = _agree(error, not error and same_bits(out, reference), ctx.cpu_group)
    return results
