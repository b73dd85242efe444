"""The harness's rounds, in one process (a world of one gloo rank): order, counts and records."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from arxtune.runtime.backends import GroupContext
from arxtune.harness.config import SweepConfig
from arxtune.harness.sweep import PointGroup, PointRunner


class LoggingBackend:
    """A correct world-of-one all_reduce that logs which backend ran each call."""

    capturable = False
    ops = ("all_reduce",)

    def __init__(self, name: str, log: list[str]):
        self.name, self.log = name, log

    def supports(self, op, dtype, nbytes):
        return True

    def all_reduce(self, inp, out):
        self.log.append(self.name)
        out.copy_(inp)

    def close(self):
        pass


@pytest.fixture
def solo_group():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield GroupContext(0, 1, 0, torch.device("cpu"), dist.group.WORLD)
    finally:
        dist.destroy_process_group()


def _blocks(log: list[str]) -> list[str]:
    """Consecutive runs of the same name, collapsed."""
    return [name for i, name in enumerate(log) if i == 0 or log[i - 1] != name]


def test_backends_take_turns_in_alternating_order(solo_group):
    config = SweepConfig(backends=("gloo",), rounds=4, warmup_iters=1, min_iters=4, max_iters=8, point_budget_s=1e-6)
    log: list[str] = []
    ready = {"a": LoggingBackend("a", log), "b": LoggingBackend("b", log)}
    records = PointRunner(config, solo_group).measure_group(PointGroup("all_reduce", "float32", "eager", 1024, ("a", "b")), ready)  # type: ignore[arg-type]
    # Check, warm-up and estimate per backend (a, then b), then rounds a b | b a | a b | b a.
    assert _blocks(log) == ["a", "b", "a", "b", "a", "b", "a"]
    assert [r.backend for r in records] == ["a", "b"] and {r.status for r in records} == {"ok"}
    for record in records:
        assert len(record.round_iters) == 4 and sum(record.round_iters) == len(record.samples_us) >= 4 * 3


def test_a_backend_that_fails_is_recorded_and_the_others_finish(solo_group):
    class Raises(LoggingBackend):
        def all_reduce(self, inp, out):
            raise RuntimeError("link down")

    config = SweepConfig(backends=("gloo",), rounds=3, warmup_iters=1, min_iters=3, max_iters=3, point_budget_s=1e-6)
    log: list[str] = []
    ready = {"a": LoggingBackend("a", log), "bad": Raises("bad", log)}
    records = PointRunner(config, solo_group).measure_group(PointGroup("all_reduce", "float32", "eager", 1024, ("a", "bad")), ready)  # type: ignore[arg-type]
    assert records[0].status == "ok" and len(records[0].round_iters) == 3
    assert records[1].status == "error" and "link down" in records[1].error


class _Timer:
    def __init__(self, ops_per_sample):
        self.ops_per_sample = ops_per_sample


@pytest.mark.parametrize(
    "ops_per_sample,nbytes,span,want",
    [
        (20, 8192, 64 << 20, 20),  # nccl-tests' -n 20: an offset per call
        (200, 8192, 64 << 20, 200),
        (200, 8 << 20, 64 << 20, 8),  # as many as fit in the sweep's largest size
        (20, 64 << 20, 64 << 20, 1),
        (1, 8192, 64 << 20, 1),  # one call per sample (isolated): one buffer, so the check sees timed results
    ],
)
def test_buffer_count_rotates_like_nccl_tests_within_the_largest_size(ops_per_sample, nbytes, span, want):
    from arxtune.harness.sweep import buffer_count

    assert buffer_count(_Timer(ops_per_sample), nbytes, span) == want  # type: ignore[arg-type]


def test_rotating_op_uses_each_pair_in_turn_and_a_backends_bind():
    from arxtune.harness.sweep import bound_call, rotating_op

    seen = []

    class Binding:
        def bind(self, op, inp, out):
            return lambda: seen.append((op, int(inp[0]), int(out[0])))

    class Plain:
        def all_reduce(self, inp, out):
            seen.append(("plain", int(inp[0]), int(out[0])))

    ins, outs = [torch.full((1,), i) for i in range(3)], [torch.full((1,), 10 + i) for i in range(3)]
    op = rotating_op(bound_call(Binding(), "all_gather"), ins, outs)  # type: ignore[arg-type]
    for _ in range(4):
        op()
    assert seen == [("all_gather", 0, 10), ("all_gather", 1, 11), ("all_gather", 2, 12), ("all_gather", 0, 10)]
    seen.clear()
    rotating_op(bound_call(Plain(), "all_reduce"), ins[:1], outs[:1])()  # type: ignore[arg-type]
    assert seen == [("plain", 0, 10)]


def test_cpu_views_eager_times_calls_back_to_back_and_isolated_one_call():
    import time

    from arxtune.runtime.timing import EAGER_OPS_PER_SAMPLE, make_timer

    calls: list[int] = []

    def op():
        calls.append(1)
        time.sleep(0.001)

    cpu = torch.device("cpu")
    assert [make_timer(cpu, "eager", n).ops_per_sample for n in (1024, 256 << 10, 1 << 20, 16 << 20)] == [EAGER_OPS_PER_SAMPLE, 4, 1, 1]
    for view, count in (("eager", EAGER_OPS_PER_SAMPLE), ("isolated", 1)):
        timer = make_timer(cpu, view, 1024)
        calls.clear()
        per_call_us = timer.time_once(op)
        assert (timer.view, timer.ops_per_sample, len(calls)) == (view, count, count)
        assert 1000 <= per_call_us < 1000 * EAGER_OPS_PER_SAMPLE  # per call, not per sample


class SleepingBackend(LoggingBackend):
    """A correct world-of-one all_reduce that takes `seconds` a call."""

    def __init__(self, name: str, log: list[str], seconds: float):
        super().__init__(name, log)
        self.seconds = seconds

    def all_reduce(self, inp, out):
        self.log.append(self.name)
        time.sleep(self.seconds)
        out.copy_(inp)


@pytest.mark.parametrize("challenger_s,extra", [(0.00096, True), (0.0002, False)])
def test_rounds_are_added_only_where_the_baseline_and_a_challenger_are_close(solo_group, challenger_s, extra):
    config = SweepConfig(
        backends=("gloo",), baseline="x", rounds=4, max_extra_rounds=4, warmup_iters=1, min_iters=8, max_iters=8, point_budget_s=1e-6
    )
    log: list[str] = []
    ready = {"x": SleepingBackend("x", log, 0.001), "y": SleepingBackend("y", log, challenger_s)}
    records = PointRunner(config, solo_group).measure_group(PointGroup("all_reduce", "float32", "eager", 1024, ("x", "y")), ready)  # type: ignore[arg-type]
    # 4% apart, at the margin's edge: every extra round is taken; 5x apart: the four rounds settle it.
    assert [len(r.round_iters) for r in records] == ([8, 8] if extra else [4, 4])
    assert log[-2:] == ["x", "y"]  # the bitwise check: the baseline, then the challenger, once each
    assert _blocks(log[:-2])[-3:] == ["x", "y", "x"]  # the order still alternates: ... x y | y x
