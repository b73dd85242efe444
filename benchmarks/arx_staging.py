"""Where arx's time goes with CUDA tensors, apart from the wire: staging copies and the local reduction.

arx moves bytes between pinned host buffers registered with the NIC. For a
CUDA tensor an all-reduce therefore pays, besides the RDMA writes:
  d2h     the input copied into the pinned send slot (must finish before posting),
  h2d     the W-1 peers' slots copied from pinned memory to the GPU,
  reduce  the fixed-order sum of W slots on the GPU into the caller's output;
or, reducing on the CPU instead:
  cpu_reduce  the sum of W pinned slots on the CPU, then
  h2d_out     one copy of the result to the GPU.
Each step is timed alone (median of repeats, synchronised), for sizes 1 KiB..64 MiB.

    python benchmarks/arx_staging.py [--world 2] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB, every 4x
REPEATS = 25


def timed_us(fn, repeats: int = REPEATS) -> float:
    """Median wall time of fn with a device sync before and after: what the hot path waits for."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    return statistics.median(samples)


def breakdown(nbytes: int, world: int, dtype=torch.bfloat16) -> dict:
    n = nbytes // dtype.itemsize
    device = torch.device("cuda")
    inp = torch.randn(n, device=device).to(dtype)
    out = torch.empty_like(inp)
    send_slot = torch.empty(n, dtype=dtype, pin_memory=True)
    inbox = [torch.randn(n).to(dtype).pin_memory() for _ in range(world - 1)]  # what peers wrote
    scratch = torch.empty(world - 1, n, dtype=dtype, device=device)
    host_sum = torch.empty(n, dtype=dtype, pin_memory=True)

    def d2h():
        send_slot.copy_(inp, non_blocking=True)

    def h2d():
        for i, slot in enumerate(inbox):
            scratch[i].copy_(slot, non_blocking=True)

    def gpu_reduce():
        torch.add(inp, scratch[0], out=out)
        for i in range(1, world - 1):
            out.add_(scratch[i])

    def cpu_reduce():
        torch.add(send_slot, inbox[0], out=host_sum)
        for slot in inbox[1:]:
            host_sum.add_(slot)

    def h2d_out():
        out.copy_(host_sum, non_blocking=True)

    row = {"bytes": nbytes, "world": world}
    for name, fn in (("d2h", d2h), ("h2d", h2d), ("reduce", gpu_reduce), ("cpu_reduce", cpu_reduce), ("h2d_out", h2d_out)):
        row[name + "_us"] = timed_us(fn)  # type: ignore[assignment]
    row["gpu_path_us"] = row["d2h_us"] + row["h2d_us"] + row["reduce_us"]
    row["cpu_path_us"] = row["d2h_us"] + row["cpu_reduce_us"] + row["h2d_out_us"]
    row["d2h_gbps"] = nbytes / row["d2h_us"] / 1e3  # type: ignore[assignment]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--out", help="also write the table as CSV")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("arx_staging needs a CUDA GPU")
    torch.set_num_threads(1)  # as in a torchrun rank
    columns = ["bytes", "d2h_us", "h2d_us", "reduce_us", "gpu_path_us", "cpu_reduce_us", "h2d_out_us", "cpu_path_us", "d2h_gbps"]
    print(f"arx staging on {torch.cuda.get_device_name()}, world {args.world}, bfloat16, median of {REPEATS}")
    print("".join(f"{c:>14}" for c in columns))
    rows = [breakdown(size, args.world) for size in SIZES]
    for row in rows:
        print("".join(f"{row[c]:>14.1f}" if c != "bytes" else f"{row[c]:>14d}" for c in columns))
    if args.out:
        import pandas as pd

        pd.DataFrame(rows).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
