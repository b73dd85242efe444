"""The bitwise check, in one process (a world of one gloo rank): its data, its comparison, and what it records."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from arxtune.harness.bitwise import random_input, same_bits
from arxtune.harness.config import SweepConfig
from arxtune.harness.sweep import PointGroup, PointRunner
from arxtune.runtime.backends import GroupContext


class Copy:
    """A world-of-one all_reduce (a copy); subclasses change what it writes on data that is not whole numbers."""

    capturable = False
    ops = ("all_reduce",)

    def supports(self, op, dtype, nbytes):
        return True

    def all_reduce(self, inp, out):
        out.copy_(inp)
        if not torch.equal(inp, inp.round()):
            self.rounds(out)

    def rounds(self, out):
        pass

    def close(self):
        pass


class OtherBits(Copy):
    """Exact on the integer check, one ulp off on data that rounds: another summation order, as far as bits go."""

    def rounds(self, out):
        out[0] = torch.nextafter(out[0], torch.tensor(float("inf"), dtype=out.dtype))


class FailsOnRandomData(Copy):
    def rounds(self, out):
        raise RuntimeError("no such data here")


@pytest.fixture
def solo_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield GroupContext(0, 1, 0, torch.device("cpu"), dist.group.WORLD)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32])
def test_random_data_is_fixed_per_rank_and_differs_between_ranks(dtype):
    first = random_input("all_reduce", 1000, 0, 3, dtype, torch.device("cpu"))
    assert same_bits(first, random_input("all_reduce", 1000, 0, 3, dtype, torch.device("cpu")))
    assert not same_bits(first, random_input("all_reduce", 1000, 1, 3, dtype, torch.device("cpu")))
    assert first.dtype == dtype and first.numel() == 1000
    if dtype.is_floating_point:
        assert not torch.equal(first, first.round()), "data that rounds when added"
    assert random_input("reduce_scatter", 10, 2, 3, dtype, torch.device("cpu")).numel() == 30


def test_same_bits_is_bits_not_values():
    assert not same_bits(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert same_bits(torch.tensor([float("nan")]), torch.tensor([float("nan")]))
    assert not same_bits(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))


def test_each_passing_backend_is_recorded_with_whether_it_gives_the_baselines_bits(solo_group):
    config = SweepConfig(backends=("x",), baseline="x", warmup_iters=1, min_iters=3, max_iters=3, rounds=1, point_budget_s=1e-6)
    ready = {"x": Copy(), "same": Copy(), "other": OtherBits(), "fails": FailsOnRandomData()}
    for dtype in ("float32", "bfloat16"):
        group = PointGroup("all_reduce", dtype, "eager", 4096, tuple(ready))
        records = {r.backend: r for r in PointRunner(config, solo_group).measure_group(group, ready)}  # type: ignore[arg-type]
        assert {n: r.bitwise for n, r in records.items()} == {"x": True, "same": True, "other": False, "fails": None}
        assert records["other"].status == "ok" and records["other"].samples_us, "other bits are recorded, not a failure"
        assert records["fails"].status == "error" and not records["fails"].samples_us
        assert records["fails"].error == "bitwise check: rank 0: RuntimeError: no such data here"


def test_nothing_is_recorded_without_the_baselines_result(solo_group):
    config = SweepConfig(backends=("gloo",), baseline="gloo", warmup_iters=1, min_iters=3, max_iters=3, rounds=1, point_budget_s=1e-6)
    ready = {"same": Copy(), "other": OtherBits()}
    records = PointRunner(config, solo_group).measure_group(PointGroup("all_reduce", "float32", "eager", 4096, tuple(ready)), ready)  # type: ignore[arg-type]
    assert [r.bitwise for r in records] == [None, None]
