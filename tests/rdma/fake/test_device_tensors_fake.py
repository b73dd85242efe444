"""Inputs and outputs on the run's device (CUDA where there is one, else CPU) over the
fake fabric: staging copies in, results land in the caller's tensor on that device,
and chunked gathers copy out asynchronously without a slot being reused too early."""

from __future__ import annotations

import pytest
import torch

from test_algorithms_fake import exact_input, run_ranks

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("slots", [2, 3])
def test_all_ops_deliver_into_device_tensors(slots):
    world, calls = 3, 60
    sizes = (5, 300, 2000)

    def body(coll, rank):
        bad = []
        for i in range(calls):
            n, dt = sizes[i % 3], (torch.float32, torch.bfloat16)[i % 2]
            x = exact_input(rank, n, dt, i).to(DEVICE)
            ref_sum = sum(exact_input(r, n, dt, i).double() for r in range(world)).to(dt)
            kind = i % 4
            if kind in (0, 1):
                out = torch.full((n,), float("nan"), dtype=dt, device=DEVICE)
                (coll.all_reduce_one_shot if kind == 0 else coll.all_reduce_two_shot)(x, out)
                ref = ref_sum
            elif kind == 2:
                out = torch.full((world * n,), float("nan"), dtype=dt, device=DEVICE)
                coll.all_gather(x, out)
                ref = torch.cat([exact_input(r, n, dt, i) for r in range(world)])
            else:
                m = n // world
                out = torch.full((m,), float("nan"), dtype=dt, device=DEVICE)
                coll.reduce_scatter(exact_input(rank, world * m, dt, i).to(DEVICE), out)
                full = sum(exact_input(r, world * m, dt, i).double() for r in range(world)).to(dt)
                ref = full[rank * m : (rank + 1) * m]
            if out.device.type != DEVICE.type or not torch.equal(out.cpu(), ref):
                bad.append((i, kind))
        return bad

    results = run_ranks(world, body, slot_bytes=16384, chunk_bytes=512, max_delay_s=0.0005, slots=slots)
    assert results == [[]] * world
