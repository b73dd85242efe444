"""The decode view without a GPU: its arithmetic on a fake GPU clock, the two ways a sample is launched
(a backend's own `decode` from C, or the timer's loop), and its configuration."""

from __future__ import annotations

import pytest
import torch

from arxtune.harness.config import SweepConfig, from_mapping
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.timing import CudaDecodeTimer, decode_share_us, has_timer, make_timer


class Gpu:
    """One stream's clock: each launch queues behind the previous one; an event reads the time it is reached."""

    def __init__(self):
        self.now_us = 0.0
        self.launches: list[str] = []

    def run(self, what: str, us: float) -> None:
        self.launches.append(what)
        self.now_us += us


class Event:
    def __init__(self, gpu: Gpu):
        self.gpu, self.at = gpu, None

    def record(self) -> None:
        self.at = self.gpu.now_us  # type: ignore[assignment]

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "Event") -> float:  # milliseconds, as torch's
        return (end.at - self.at) / 1e3  # type: ignore[operator]


class Busy:
    def __init__(self, gpu: Gpu, us: float):
        self.gpu, self.us = gpu, us

    def __call__(self) -> None:
        self.gpu.run("busy", self.us)

    def repeat(self, calls: int, start: Event, end: Event) -> None:
        start.record()
        for _ in range(calls):
            self()
        end.record()


def test_a_sample_is_the_pairs_less_the_busy_kernels_alone_per_call():
    gpu = Gpu()
    timer = CudaDecodeTimer(busy_us=50.0, ops_per_sample=4, busy=Busy(gpu, 50.0), event=lambda: Event(gpu))
    # each call costs 9 us behind a busy kernel (its launch hidden, the proxy's answer not)
    per_call = timer.time_once(lambda: gpu.run("op", 9.0))
    assert per_call == pytest.approx(9.0)
    # busy alone first, then an untimed lead-in pair, then the timed pairs, in one sample
    assert gpu.launches == ["busy"] * 4 + ["busy", "op"] + ["busy", "op"] * 4
    assert decode_share_us(236.0, 200.0, 4) == 9.0


def test_a_call_cheaper_than_the_busy_kernels_jitter_reads_the_floor_not_zero_or_less():
    from arxtune.runtime.timing import DECODE_FLOOR_US

    assert decode_share_us(199.0, 200.0, 4) == DECODE_FLOOR_US == decode_share_us(200.0, 200.0, 4)
    gpu = Gpu()
    timer = CudaDecodeTimer(busy_us=50.0, ops_per_sample=4, busy=Busy(gpu, 50.0), event=lambda: Event(gpu))
    assert timer.time_once(lambda: gpu.run("op", 0.0)) == DECODE_FLOOR_US


def test_a_backend_that_launches_its_own_pairs_gets_the_busy_kernel_and_the_events():
    gpu = Gpu()
    busy = Busy(gpu, 200.0)
    seen = []

    class Rotation:
        def __call__(self):
            raise AssertionError("the timer's own loop must not run")

        def decode(self, calls, got_busy, start=None, end=None):
            seen.append((calls, got_busy, start is not None))
            if start is not None:
                start.record()
            for _ in range(calls):
                got_busy()
                gpu.run("op", 11.0)
            if end is not None:
                end.record()

    timer = CudaDecodeTimer(busy_us=200.0, ops_per_sample=3, busy=busy, event=lambda: Event(gpu))
    assert timer.time_once(Rotation()) == pytest.approx(11.0)
    assert seen == [(1, busy, False), (3, busy, True)]  # the untimed lead-in, then the timed pairs


def test_the_decode_view_needs_cuda_and_takes_the_configs_busy_kernel(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", lambda **kw: object())  # events are made, not used, here
    assert has_timer(torch.device("cuda"), "decode") and not has_timer(torch.device("cpu"), "decode")
    with pytest.raises(ValueError, match="no 'decode' timer for cpu tensors"):
        make_timer(torch.device("cpu"), "decode", 1024)
    from arxtune.runtime import timing

    timer = timing.TIMERS[("cuda", "decode")](1024, 200.0)
    assert (timer.view, timer.busy_us, timer.ops_per_sample) == ("decode", 200.0, timing.EAGER_OPS_PER_SAMPLE)  # type: ignore[attr-defined]


def test_config_takes_the_decode_view_and_its_busy_kernel_and_refuses_bad_values():
    cfg = from_mapping({"views": ["decode", "graph"], "decode_busy_us": 200})
    assert cfg.views == ("decode", "graph") and cfg.decode_busy_us == 200
    assert SweepConfig().decode_busy_us == 50.0
    for bad in (0, -5, float("nan"), 1e9):
        with pytest.raises(ArxtuneError, match="decode_busy_us must be a number of microseconds"):
            from_mapping({"decode_busy_us": bad})
    with pytest.raises(ArxtuneError, match="decode_busy_us must be a number"):
        from_mapping({"decode_busy_us": "50us"})


def test_the_gb10_config_sweeps_the_decode_view_with_its_own_busy_kernel():
    from pathlib import Path

    from arxtune.harness.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "sweep" / "gb10-2node.toml")
    assert "decode" in cfg.views and cfg.decode_busy_us == 200 and "arxg" in cfg.backends
