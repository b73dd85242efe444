"""How one collective call is timed; the harness picks a timer per device and mode.

Each timer runs `op` once per sample and returns microseconds per op. The CPU
timer waits for the device itself; the CUDA timers use events (eager) or
graph replays divided by the ops captured per graph (graph mode).
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

import torch

Op = Callable[[], None]


class Timer(Protocol):
    mode: str

    def prepare(self, op: Op) -> None:
        """One-time work before timing (graph capture)."""
        ...

    def time_once(self, op: Op) -> float:
        """Microseconds per op for one sample."""
        ...


class WallTimer:
    """perf_counter around one call; for CPU tensors, where the call is synchronous."""

    mode = "eager"

    def prepare(self, op: Op) -> None:
        pass

    def time_once(self, op: Op) -> float:
        start = time.perf_counter_ns()
        op()
        return (time.perf_counter_ns() - start) / 1e3


class CudaEventTimer:
    """CUDA events around one call on the current stream: device time, launch included."""

    mode = "eager"

    def __init__(self) -> None:
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def prepare(self, op: Op) -> None:
        pass

    def time_once(self, op: Op) -> float:
        self.start.record()
        op()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) * 1e3


class CudaGraphTimer:
    """Capture `ops_per_graph` calls in one CUDA graph; a sample is one replay divided by that count."""

    mode = "graph"

    def __init__(self, ops_per_graph: int = 10) -> None:
        self.ops_per_graph = ops_per_graph
        self.graph: torch.cuda.CUDAGraph | None = None
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def prepare(self, op: Op) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            op()  # warm up on a side stream, as capture requires
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for _ in range(self.ops_per_graph):
                op()
        torch.cuda.synchronize()

    def time_once(self, op: Op) -> float:
        assert self.graph is not None, "prepare() captures the graph first"
        self.start.record()
        self.graph.replay()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) * 1e3 / self.ops_per_graph


#: (device type, mode) -> timer; graph mode exists only for CUDA tensors.
TIMERS: dict[tuple[str, str], type] = {
    ("cpu", "eager"): WallTimer,
    ("cuda", "eager"): CudaEventTimer,
    ("cuda", "graph"): CudaGraphTimer,
}


def make_timer(device: torch.device, mode: str) -> Timer:
    try:
        return TIMERS[(device.type, mode)]()
    except KeyError:
        raise ValueError(f"no {mode!r} timer for {device.type} tensors; known: {sorted(TIMERS)}") from None
