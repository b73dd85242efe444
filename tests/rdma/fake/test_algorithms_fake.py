"""The collectives over a fake in-process fabric (threads, late in-order delivery).

Checks results against exact references, bit-identity across ranks, slot reuse
across many mixed consecutive calls, and chunked all-gathers — all without a device.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from arxtune.runtime.rdma.algorithms import Collectives
from fakes import FakeFabric

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def run_ranks(world, fn, slot_bytes=4096, chunk_bytes=None, max_delay_s=0.0005, slots=2):
    fabric = FakeFabric(world, slot_bytes, slots=slots, max_delay_s=max_delay_s)
    colls = [Collectives(t, chunk_bytes) for t in fabric.transports(timeout_s=20)]
    try:
        with ThreadPoolExecutor(world) as pool:
            return [f.result() for f in [pool.submit(fn, c, c.rank) for c in colls]]
    finally:
        fabric.stop()


def exact_input(rank, n, dtype, salt=0):
    """Small integers: sums are exact in every dtype tested, so references are exact."""
    g = torch.Generator().manual_seed(1000 * rank + salt)
    return torch.randint(-8, 9, (n,), generator=g).to(dtype)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("algo", ["all_reduce_one_shot", "all_reduce_two_shot"])
def test_all_reduce_exact_for_sizes_and_dtypes(world, algo):
    cases = [(n, dt) for dt in DTYPES for n in (1, 2, 5, 63, 300, 1024)]

    def body(coll, rank):
        outs = []
        for i, (n, dt) in enumerate(cases):
            out = torch.full((n,), float("nan"), dtype=dt)
            getattr(coll, algo)(exact_input(rank, n, dt, i), out)
            outs.append(out)
        return outs

    results = run_ranks(world, body)
    for i, (n, dt) in enumerate(cases):
        ref = sum(exact_input(r, n, dt, i).double() for r in range(world)).to(dt)
        for rank in range(world):
            assert torch.equal(results[rank][i], ref), (rank, n, dt)


@pytest.mark.parametrize("algo", ["all_reduce_one_shot", "all_reduce_two_shot"])
def test_all_reduce_is_bit_identical_on_every_rank_and_sums_in_rank_order(algo):
    n, world = 777, 3
    inputs = [torch.randn(n, generator=torch.Generator().manual_seed(r)).to(torch.bfloat16) * 10**r for r in range(world)]

    def body(coll, rank):
        out = torch.empty(n, dtype=torch.bfloat16)
        getattr(coll, algo)(inputs[rank], out)
        return out

    outs = run_ranks(world, body)
    ref = inputs[0] + inputs[1] + inputs[2]  # left to right, rounding to bf16 at each add
    for out in outs:
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16))


@pytest.mark.parametrize("world", [2, 3])
def test_all_gather_chunked_and_reduce_scatter_exact(world):
    # per-rank bytes up to 5x the chunk, chunks of 256 B: many pipeline steps per call
    cases = [(n, dt) for dt in DTYPES for n in (1, 3, 128, 640)]

    def body(coll, rank):
        res = []
        for i, (n, dt) in enumerate(cases):
            ag = torch.empty(world * n, dtype=dt)
            coll.all_gather(exact_input(rank, n, dt, i), ag)
            m = max(1, n // 2)
            rs = torch.empty(m, dtype=dt)
            if m * world * rs.element_size() <= coll.L.slot_bytes:
                coll.reduce_scatter(exact_input(rank, world * m, dt, i + 99), rs)
            res.append((ag, rs, m))
        return res

    results = run_ranks(world, body, slot_bytes=4096, chunk_bytes=256)
    for i, (n, dt) in enumerate(cases):
        ag_ref = torch.cat([exact_input(r, n, dt, i) for r in range(world)])
        for rank in range(world):
            ag, rs, m = results[rank][i]
            assert torch.equal(ag, ag_ref), ("all_gather", rank, n, dt)
            if m * world * rs.element_size() <= 4096:
                full = sum(exact_input(r, world * m, dt, i + 99).double() for r in range(world)).to(dt)
                assert torch.equal(rs, full[rank * m : (rank + 1) * m]), ("reduce_scatter", rank, n, dt)


@pytest.mark.parametrize("slots", [2, 3])
def test_slot_reuse_over_many_mixed_calls_without_barriers(slots):
    """Consecutive calls of every kind and size back to back, each one's inputs
    distinct: a slot reused too early would show up as a wrong sum."""
    world, calls = 3, 120

    def body(coll, rank):
        bad = []
        for i in range(calls):
            n = (1, 17, 256, 1000)[i % 4]
            x = exact_input(rank, n, torch.float32, i)
            kind = i % 3
            if kind == 0:
                out = torch.empty(n)
                coll.all_reduce_one_shot(x, out)
                ref = sum(exact_input(r, n, torch.float32, i) for r in range(world))
            elif kind == 1:
                out = torch.empty(n)
                coll.all_reduce_two_shot(x, out)
                ref = sum(exact_input(r, n, torch.float32, i) for r in range(world))
            else:
                out = torch.empty(world * n)
                coll.all_gather(x, out)
                ref = torch.cat([exact_input(r, n, torch.float32, i) for r in range(world)])
            if not torch.equal(out, ref):
                bad.append(i)
        return bad, coll.step

    results = run_ranks(world, body, slot_bytes=4096, chunk_bytes=1024, max_delay_s=0.001, slots=slots)
    assert all(bad == [] for bad, _ in results), results
    assert len({step for _, step in results}) == 1  # every rank took the same steps


def test_zero_sized_calls_take_no_step():
    def body(coll, rank):
        coll.all_reduce_one_shot(torch.empty(0), torch.empty(0))
        coll.all_gather(torch.empty(0), torch.empty(0))
        return coll.step

    assert run_ranks(2, body) == [0, 0]
