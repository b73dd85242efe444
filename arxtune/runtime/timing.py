"""How collective calls are timed; the harness picks a timer per device and view, the start-up ladder too.

Each timer runs `op` one or more times per sample and returns microseconds
per op. Three views of the same call:
- `eager`: back-to-back calls between two events, divided by their count
  (nccl-tests' definition: what a stream of launches sustains). On CPU tensors
  the events are clock reads around as many synchronous calls.
- `isolated`: one call between two events, synchronised before and after:
  host launch and framework overhead included. On CPU tensors, one call right
  after the harness's barrier: it also pays for the ranks leaving the barrier
  at different moments, which on a busy host can outweigh the call itself.
- `graph`: replays of a CUDA graph holding many calls, divided by their count;
  enough calls per graph that the replay's own launch stays small.
- `decode`: as eager decode runs them, each call behind a GPU kernel of a
  layer's length with no host sync between (the host runs ahead): a sample is
  K x (busy kernel, call) launched back to back, less K busy kernels timed
  alone in the same sample, divided by K. What a call costs between two
  kernels: neither the launch (hidden behind the GPU's work) nor a sync. One
  untimed (busy kernel, call) pair leads the timed ones, so the first timed
  call, like the others, follows one busy kernel's gap since the last call
  (and not the busy kernels timed alone).
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

import torch

Op = Callable[[], None]

#: Calls per eager sample, as nccl-tests' default `-n 20`.
EAGER_OPS_PER_SAMPLE = 20
#: On CPU tensors an eager sample holds calls up to this many bytes (at least one):
#: small calls need company to outweigh the ranks' skew leaving the barrier, while
#: twenty multi-megabyte gloo calls per sample would make a sweep crawl.
CPU_EAGER_SAMPLE_BYTES = 1 << 20
#: Calls per captured graph. A replay's own launch measured about 6 us on an H200
#: (benchmarks/timing_views.py), so 200 calls keep it near 3% of a 1 us op.
GRAPH_OPS_PER_SAMPLE = 200
#: The decode view's busy kernel by default, in microseconds: about the compute between two all-reduces
#: (half a layer) of a batch-1 decode step of an 8B bf16 model at tensor parallelism 2 on an H100, which reads
#: 8 GB of weights per rank and token at ~3 TB/s over 64 all-reduces (~40 us, plus launch gaps). Configs set
#: their own (`decode_busy_us`): a GB10 reads weights at ~0.27 TB/s.
DECODE_BUSY_US = 50.0
#: Graphs a process captures and replays before the first one it times. On an H100
#: (driver 580) the first two to four graphs of a process ran small device copies about
#: 15% faster per call than every later graph (benchmarks/graph_order.py); a serving process
#: captures dozens, so the later state is the one to measure.
SETTLE_GRAPHS = 4
_graphs_made = 0


class Timer(Protocol):
    view: str
    #: Calls per sample; the harness budgets samples with it.
    ops_per_sample: int

    def prepare(self, op: Op) -> None:
        """One-time work before timing (graph capture)."""
        ...

    def time_once(self, op: Op) -> float:
        """Microseconds per op for one sample."""
        ...


class WallTimer:
    """The clock around `ops_per_sample` calls, per call; for CPU tensors, where a call is synchronous."""

    def __init__(self, view: str, ops_per_sample: int) -> None:
        self.view = view
        self.ops_per_sample = ops_per_sample

    def prepare(self, op: Op) -> None:
        pass

    def time_once(self, op: Op) -> float:
        start = time.perf_counter_ns()
        for _ in range(self.ops_per_sample):
            op()
        return (time.perf_counter_ns() - start) / 1e3 / self.ops_per_sample


class _CudaEvents:
    def __init__(self, event=None) -> None:
        event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.start, self.end = event(), event()

    def prepare(self, op: Op) -> None:
        pass

    def _elapsed_us(self) -> float:
        self.end.synchronize()
        return self.start.elapsed_time(self.end) * 1e3


class CudaBackToBackTimer(_CudaEvents):
    """Events around `ops_per_sample` calls launched back to back: per-op time of a stream of calls."""

    view = "eager"

    def __init__(self, ops_per_sample: int = EAGER_OPS_PER_SAMPLE) -> None:
        super().__init__()
        self.ops_per_sample = ops_per_sample

    def time_once(self, op: Op) -> float:
        repeat = getattr(op, "repeat", None)  # the backend launches the run and records the events (nccl: from C)
        if repeat is not None:
            repeat(self.ops_per_sample, self.start, self.end)
        else:
            self.start.record()
            for _ in range(self.ops_per_sample):
                op()
            self.end.record()
        return self._elapsed_us() / self.ops_per_sample


class CudaIsolatedTimer(_CudaEvents):
    """Events around one call on an idle stream: host launch and framework overhead included."""

    view = "isolated"
    ops_per_sample = 1

    def time_once(self, op: Op) -> float:
        torch.cuda.current_stream().synchronize()
        self.start.record()
        op()
        self.end.record()
        return self._elapsed_us()


class CudaGraphTimer(_CudaEvents):
    """Capture `ops_per_sample` calls in one CUDA graph; a sample is one replay divided by that count."""

    view = "graph"

    def __init__(self, ops_per_sample: int = GRAPH_OPS_PER_SAMPLE) -> None:
        super().__init__()
        self.ops_per_sample = ops_per_sample
        self.graph: torch.cuda.CUDAGraph | None = None

    def prepare(self, op: Op) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            op()  # warm up on a side stream, as capture requires
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        while _graphs_made < SETTLE_GRAPHS:  # past the process's first graphs (SETTLE_GRAPHS)
            self._capture(op).replay()
            torch.cuda.synchronize()
        self.graph = self._capture(op)

    def _capture(self, op: Op) -> torch.cuda.CUDAGraph:
        global _graphs_made
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(self.ops_per_sample):
                op()
        torch.cuda.synchronize()
        _graphs_made += 1
        return graph

    def time_once(self, op: Op) -> float:
        assert self.graph is not None, "prepare() captures the graph first"
        self.start.record()
        self.graph.replay()
        self.end.record()
        return self._elapsed_us() / self.ops_per_sample


#: The least a decode sample says, in microseconds: a difference of two spans, it comes out at or below zero
#: where a call costs less than the busy kernels' own jitter (a one-rank NCCL call), and a run holds positive
#: times only.
DECODE_FLOOR_US = 0.01


def decode_share_us(pairs_us: float, busy_alone_us: float, calls: int) -> float:
    """The decode view's figure: what `calls` (busy kernel, call) pairs took beyond the busy kernels alone, per
    call, at least DECODE_FLOOR_US."""
    return max(DECODE_FLOOR_US, (pairs_us - busy_alone_us) / calls)


class CudaDecodeTimer(_CudaEvents):
    """Per call, `ops_per_sample` x (busy kernel of `busy_us`, call) launched back to back, less as many busy
    kernels alone timed in the same sample (the decode view).

    The busy kernel (cudadrv.BusyKernel) is made in prepare(); tests pass `busy` and `event` fakes. A backend
    whose op has `decode(n, busy, start, end)` launches the pairs itself (from C), as `repeat` does for eager."""

    view = "decode"

    def __init__(self, busy_us: float = DECODE_BUSY_US, ops_per_sample: int = EAGER_OPS_PER_SAMPLE, busy=None, event=None) -> None:
        super().__init__(event)
        self.busy_us, self.ops_per_sample, self.busy = busy_us, ops_per_sample, busy
        event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.alone_start, self.alone_end = event(), event()

    def prepare(self, op: Op) -> None:
        if self.busy is None:
            from arxtune.runtime.cudadrv import BusyKernel

            self.busy = BusyKernel(self.busy_us, torch.cuda.current_device())

    def time_once(self, op: Op) -> float:
        busy, calls = self.busy, self.ops_per_sample
        busy.repeat(calls, self.alone_start, self.alone_end)
        decode = getattr(op, "decode", None)
        if decode is not None:
            decode(1, busy)  # the lead-in pair, untimed
            decode(calls, busy, self.start, self.end)
        else:
            busy()
            op()
            self.start.record()
            for _ in range(calls):
                busy()
                op()
            self.end.record()
        self.end.synchronize()
        return decode_share_us(self.start.elapsed_time(self.end) * 1e3, self.alone_start.elapsed_time(self.alone_end) * 1e3, calls)


#: (device type, view) -> timer factory, given the call's size and the decode view's busy kernel (us).
#: A view with no timer for the device is not planned (graphs and the decode view need CUDA).
#: (device type, view) -> (call bytes, busy kernel us, calls per sample or None for the view's own) -> timer.
#: The sweep leaves the calls to the view; the start-up ladder sizes them by the checked call's time.
TIMERS: dict[tuple[str, str], Callable[..., Timer]] = {
    ("cpu", "eager"): lambda nbytes, busy_us, calls=None: WallTimer(
        "eager", calls or max(1, min(EAGER_OPS_PER_SAMPLE, CPU_EAGER_SAMPLE_BYTES // max(nbytes, 1)))
    ),
    ("cpu", "isolated"): lambda nbytes, busy_us, calls=None: WallTimer("isolated", 1),
    ("cuda", "eager"): lambda nbytes, busy_us, calls=None: CudaBackToBackTimer(calls or EAGER_OPS_PER_SAMPLE),
    ("cuda", "isolated"): lambda nbytes, busy_us, calls=None: CudaIsolatedTimer(),
    ("cuda", "graph"): lambda nbytes, busy_us, calls=None: CudaGraphTimer(calls or GRAPH_OPS_PER_SAMPLE),
    ("cuda", "decode"): lambda nbytes, busy_us, calls=None: CudaDecodeTimer(busy_us, calls or EAGER_OPS_PER_SAMPLE),
}


def has_timer(device: torch.device, view: str) -> bool:
    return (device.type, view) in TIMERS


def make_timer(device: torch.device, view: str, nbytes: int, busy_us: float = DECODE_BUSY_US, calls: int | None = None) -> Timer:
    """The timer for one point: `nbytes` is the call's size, which some views size their samples by;
    `busy_us` the decode view's busy kernel; `calls` per sample where the caller sizes them (not the isolated view)."""
    try:
        return TIMERS[(device.type, view)](nbytes, busy_us, calls)
    except KeyError:
        raise ValueError(f"no {view!r} timer for {device.type} tensors; known: {sorted(TIMERS)}") from None
