"""Does a CUDA graph's per-call time depend on how many graphs the process made before it?

    PYTHONPATH=$PWD python3 benchmarks/graph_order.py [--graphs 8]

In a fresh process, world size 1, captures graph after graph of 200 NCCL bf16
all_reduce calls (a device copy each) over 200 buffer pairs, alternating 8 KiB
and 16 KiB, and prints each graph's ordinal in the process with its per-call
time (median of 20 replays between events). On an H100 the first two to four
graphs ran about 15% faster than every later one (the count varied between
processes), which is why arxtune's graph timer makes its process's first
graphs (timing.SETTLE_GRAPHS) before it times one.
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from arx_graph import time_eager  # noqa: E402
from nccl_launch_views import capture_all_reduces, one_gpu_nccl  # noqa: E402

CALLS, REPLAYS, WARMUP = 200, 20, 3


def per_call_us(backend, nbytes: int, dev: torch.device) -> float:
    """One new graph over fresh buffers: median per-call time of its replays."""
    ins = [torch.ones(nbytes // 2, dtype=torch.bfloat16, device=dev) for _ in range(CALLS)]
    outs = [torch.empty_like(x) for x in ins]
    graph = capture_all_reduces(backend, ins, outs, CALLS)
    return statistics.median(time_eager(graph.replay, WARMUP, REPLAYS)) / CALLS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("graph_order: needs a CUDA GPU", file=sys.stderr)
        return 2
    backend, dev = one_gpu_nccl(29617)
    print("graph  bytes  us per call")
    for ordinal in range(1, args.graphs + 1):
        nbytes = 8 << 10 if ordinal % 2 else 16 << 10
        print(f"{ordinal:>5} {nbytes:>6} {per_call_us(backend, nbytes, dev):>12.3f}", flush=True)
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
