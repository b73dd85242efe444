"""Where could arxtune's NCCL timing part from nccl-tests'? Three suspects, side by side, on one GPU.

    PYTHONPATH=$PWD python3 benchmarks/nccl_launch_views.py

World size 1, bf16 all_reduce through arxtune's `nccl` backend, 40 samples
each, medians in us per op, at 8 KiB, 128 KiB, 1 MiB and 64 MiB:
- eager (20 calls a sample from the backend's C loop) on the legacy default
  stream (where the sweep launches) against a non-blocking stream (where
  nccl-tests launches), each timed between two events the loop records
  (arxtune), between two events recorded from Python around the loop, and by
  the host clock up to a stream synchronisation (nccl-tests);
- graph (200 calls per graph, rotating through as many buffer pairs as fit in
  64 MiB) over separately allocated tensors (arxtune) against slices of one
  contiguous pool (nccl-tests shifts inside one buffer), each timed as one replay
  between events (arxtune) and as 10 replays back to back by the host clock
  (nccl-tests' -G).
"""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from arx_graph import time_eager  # noqa: E402

from arxtune.runtime.timing import CudaBackToBackTimer  # noqa: E402

SIZES = (8 << 10, 128 << 10, 1 << 20, 64 << 20)
SPAN = 64 << 20  # bytes the rotating buffers may span, as a sweep up to 64 MiB
SAMPLES, WARMUP = 40, 5
EAGER_CALLS, GRAPH_CALLS, GRAPH_REPLAYS, HOST_REPLAYS = 20, 200, 20, 10


def events_per_op(rot, calls: int) -> float:
    """arxtune's eager view: `calls` launches from the C loop between two events it records itself."""
    timer = CudaBackToBackTimer(ops_per_sample=calls)
    return statistics.median([timer.time_once(rot) for _ in range(WARMUP + SAMPLES)][WARMUP:])


def python_events_per_op(rot, calls: int) -> float:
    """The same launches between two events recorded from Python around the call into the C loop."""
    return statistics.median(time_eager(lambda: rot.repeat(calls), WARMUP, SAMPLES)) / calls


def host_per_op(rot, calls: int, stream: torch.cuda.Stream) -> float:
    """nccl-tests' eager view: the host clock from the first launch to the stream's synchronisation."""
    out = []
    for i in range(WARMUP + SAMPLES):
        stream.synchronize()
        t = time.perf_counter()
        rot.repeat(calls)
        stream.synchronize()
        if i >= WARMUP:
            out.append((time.perf_counter() - t) * 1e6 / calls)
    return statistics.median(out)


def capture_all_reduces(backend, ins, outs, calls: int = GRAPH_CALLS) -> torch.cuda.CUDAGraph:
    """A graph of `calls` all_reduces rotating through the buffer pairs, captured on a side stream."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        rot = backend.bind_rotation("all_reduce", ins, outs)
        rot()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            for _ in range(calls):
                rot()
    torch.cuda.synchronize()
    return g


def graph_per_op(backend, ins, outs) -> tuple[float, float]:
    """(one replay between events, 10 replays back to back by the host clock), per op."""
    g = capture_all_reduces(backend, ins, outs)
    one = statistics.median(time_eager(g.replay, WARMUP, GRAPH_REPLAYS)) / GRAPH_CALLS
    t = time.perf_counter()
    for _ in range(HOST_REPLAYS):
        g.replay()
    torch.cuda.synchronize()
    return one, (time.perf_counter() - t) * 1e6 / (HOST_REPLAYS * GRAPH_CALLS)


def one_gpu_nccl(port: int):
    """(arxtune's `nccl` backend at world size 1 on GPU 0, the device): what these benchmarks call."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from arxtune.runtime.group import GroupContext
    from arxtune.runtime.backends.nccl import NcclBackend

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    return NcclBackend(GroupContext(0, 1, 0, dev, dist.group.WORLD)), dev


def main() -> int:
    if not torch.cuda.is_available():
        print("nccl_launch_views: needs a CUDA GPU", file=sys.stderr)
        return 2
    backend, dev = one_gpu_nccl(29611)
    for nbytes in SIZES:
        n = nbytes // 2
        pairs = max(1, min(EAGER_CALLS, SPAN // nbytes))
        ins = [torch.ones(n, dtype=torch.bfloat16, device=dev) for _ in range(pairs)]
        outs = [torch.empty_like(x) for x in ins]
        row = [f"{nbytes:>9}"]
        for name, stream in (("default", torch.cuda.current_stream()), ("nonblk", torch.cuda.Stream())):
            with torch.cuda.stream(stream):
                rot = backend.bind_rotation("all_reduce", ins, outs)
                rot.repeat(EAGER_CALLS)
                torch.cuda.synchronize()
                row.append(
                    f"{name} ev {events_per_op(rot, EAGER_CALLS):6.2f} py-ev {python_events_per_op(rot, EAGER_CALLS):6.2f} "
                    f"host {host_per_op(rot, EAGER_CALLS, stream):6.2f}"
                )
        count = max(1, min(GRAPH_CALLS, SPAN // nbytes))
        tensors = [torch.ones(n, dtype=torch.bfloat16, device=dev) for _ in range(count)]
        one, host10 = graph_per_op(backend, tensors, [torch.empty_like(x) for x in tensors])
        row.append(f"graph tensors ev {one:6.3f} host10 {host10:6.3f}")
        del tensors
        pool_in = torch.ones(n * count, dtype=torch.bfloat16, device=dev)
        one, host10 = graph_per_op(backend, list(pool_in.split(n)), list(torch.empty_like(pool_in).split(n)))
        row.append(f"graph pool ev {one:6.3f} host10 {host10:6.3f}")
        print(" | ".join(row), flush=True)
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
