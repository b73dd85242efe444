"""Where arxg's handshake floor goes, on one GPU: launch, doorbell, wait, warps.

    python benchmarks/arx_handshake.py

One GPU rank with its proxy (shared-memory fabric). Each case is a CUDA graph of
10 kernels, timed as in arx_graph.py (median of 200 replays, per kernel):
an empty kernel (a kernel node's own cost in a graph), a kernel that only rings
the doorbell, and the handshake kernel (ring, then poll the proxy's answer in
host memory) launched with 4 warps (Triton's default, what the collective
kernel uses) and with 1. Every lane 0 polls, so 4 warps poll 4 times a round.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

try:
    import triton
    import triton.language as tl
except ImportError:
    print("arx_handshake: needs a CUDA GPU with Triton (it ships with CUDA builds of torch)", file=sys.stderr)
    sys.exit(2)
from arx_graph import capture, time_graph  # noqa: E402

from arxtune.runtime.rdma.config import RdmaConfig  # noqa: E402
from arxtune.runtime.rdma.graph import segment as seg  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.arxg_cpu_rank import RanksOnOneGpu  # noqa: E402
from arxtune.runtime.rdma.graph.kernels import handshake_kernel, ring  # noqa: E402

HANDSHAKE = seg.OP_CODES["handshake"]


@triton.jit
def empty_kernel(counter):
    x = tl.load(counter + 2)  # the counter's unused word
    tl.store(counter + 2, x)


@triton.jit
def ring_only_kernel(ctrl, counter, op_code):
    """The handshake's first half: descriptor and doorbell, no wait (the proxy still answers)."""
    step = tl.load(counter)
    seq = step + 1
    ring(ctrl, step % 2, op_code, 0, seq)
    tl.store(counter, seq)


def main() -> int:
    if not torch.cuda.is_available():
        print("arx_handshake: needs a CUDA GPU", file=sys.stderr)
        return 2
    floor = RanksOnOneGpu(1, RdmaConfig(max_bytes=4096, timeout_s=20.0))
    r = floor.ranks[0]
    cases = [
        ("empty kernel", lambda: empty_kernel[(1,)](r.counter)),
        ("ring only, no wait", lambda: ring_only_kernel[(1,)](r.ctrl, r.counter, HANDSHAKE)),
        ("handshake, 4 warps", lambda: handshake_kernel[(1,)](r.ctrl, r.counter, HANDSHAKE, r.timeout_ns, num_warps=4)),
        ("handshake, 1 warp", lambda: handshake_kernel[(1,)](r.ctrl, r.counter, HANDSHAKE, r.timeout_ns, num_warps=1)),
    ]
    print(f"arxg handshake on {torch.cuda.get_device_name(0)}; median us per kernel, graphs of 10")
    for name, fn in cases:
        g = capture(lambda repeat, fn=fn: [fn() for _ in range(repeat)])
        print(f"{name:<24} {statistics.median(time_graph(g, 20, 200)):7.2f}", flush=True)
        del g
    torch.cuda.synchronize()
    floor.check()
    floor.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.exit(main())
