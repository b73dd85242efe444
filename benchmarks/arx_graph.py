"""Graph-mode arx (arxg) on one GPU: two ranks over the shared-memory fabric, in every memory mode the
device allows, with the handshake floor.

    python benchmarks/arx_graph.py --out results/RUN/arx_graph.csv --plot results/RUN/arx_graph.png

Two GPU ranks live in this process on one GPU, each with its own segment,
proxy process and CUDA stream. Three views of a bf16 all-reduce per size:

- graph: a CUDA graph holds a chain of 10 all-reduces per rank, the two chains
  concurrent and meeting only through the protocol; a sample is one replay / 10.
- eager: `--eager-calls` calls of rank 0 launched back to back, no sync
  between; a sample is the span / calls (the sweep's eager view). The other
  ranks' calls are launched before the span starts and wait in the protocol,
  so the span holds rank 0's launches only, as a rank in its own process
  launches only its own calls.
- isolated: one call per rank, synchronised before and after.

The floor is a one-rank handshake (ring the doorbell, wait for the proxy) in
the same three views. Each memory mode (`--memory`: all, auto, registered,
direct; all = each one the device allows, registered first) gets fresh ranks;
the CSV (op, mode, memory, bytes, median_us, p10_us, p90_us) and the plot are
rewritten after each, so a mode that fails keeps the ones before it. Every
size's outputs are checked bit for bit after timing.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from arxtune.runtime.ops import elements_per_rank, expected_output, make_input, mismatch  # noqa: E402
from arxtune.runtime.rdma.config import RdmaConfig  # noqa: E402
from arxtune.runtime.rdma.errors import RdmaUnavailable  # noqa: E402
from arxtune.runtime.rdma.graph.memory import choose, read_attributes  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.arxg_cpu_rank import RanksOnOneGpu  # noqa: E402

OPS_PER_GRAPH = 10
VIEWS = ("graph", "eager", "isolated")
FIELDS = ["op", "mode", "memory", "bytes", "median_us", "p10_us", "p90_us"]


def capture(fn) -> torch.cuda.CUDAGraph:
    """A graph of fn(OPS_PER_GRAPH), after one fn(1) outside the capture (it compiles the kernels)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(1)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(OPS_PER_GRAPH)
    torch.cuda.synchronize()
    return g


def time_span(fn, per_sample: int, warmup: int, samples: int, before=None) -> list[float]:
    """us per call of fn() (which makes `per_sample` calls) between two events, synchronised after each sample;
    `before()` runs ahead of each sample's first event."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for i in range(warmup + samples):
        if before is not None:
            before()
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= warmup:
            out.append(start.elapsed_time(end) * 1e3 / per_sample)
    return out


def sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def row(op: str, mode: str, memory: str, nbytes: int, xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"op": op, "mode": mode, "memory": memory, "bytes": nbytes, "median_us": statistics.median(xs),
            "p10_us": xs[len(xs) // 10], "p90_us": xs[len(xs) * 9 // 10]}


def measure(memory: str, a, dtype: torch.dtype) -> list[dict]:
    """Every view of the floor and of each size, in one memory mode; raises on a wrong result."""
    rows = []
    floor = RanksOnOneGpu(1, RdmaConfig(max_bytes=4096, timeout_s=a.timeout_s), memory=memory, launch=a.launch)
    try:
        r0 = floor.ranks[0]
        g = capture(lambda repeat: [r0.handshake() for _ in range(repeat)])
        rows.append(row("handshake", "graph", memory, 0, time_span(g.replay, OPS_PER_GRAPH, a.warmup, a.samples)))
        del g
        rows.append(row("handshake", "eager", memory, 0, time_span(
            lambda: [r0.handshake() for _ in range(a.eager_calls)], a.eager_calls, a.warmup, a.samples)))
        rows.append(row("handshake", "isolated", memory, 0, time_span(r0.handshake, 1, a.warmup, a.samples)))
        torch.cuda.synchronize()
        floor.check()
    finally:
        floor.close()

    pair = RanksOnOneGpu(a.world, RdmaConfig(max_bytes=a.max_bytes, timeout_s=a.timeout_s), memory=memory, launch=a.launch)
    dev = torch.device("cuda", 0)
    try:
        for nbytes in sizes(a.min_bytes, a.max_bytes):
            n = elements_per_rank("all_reduce", nbytes, a.world, 2)
            ins = [make_input("all_reduce", n, r, a.world, dtype, dev) for r in range(a.world)]
            outs = [torch.full_like(i, float("nan")) for i in ins]
            g = capture(lambda repeat: pair.collective("all_reduce", ins, outs, repeat))
            lead = pair.ranks[0]
            views = {
                "graph": time_span(g.replay, OPS_PER_GRAPH, a.warmup, a.samples),
                "eager": time_span(lambda: [lead.all_reduce(ins[0], outs[0]) for _ in range(a.eager_calls)], a.eager_calls,
                                   a.warmup, a.samples, before=lambda: pair.launch_peers("all_reduce", ins, outs, a.eager_calls)),
                "isolated": time_span(lambda: pair.collective("all_reduce", ins, outs), 1, a.warmup, a.samples),
            }
            del g
            torch.cuda.synchronize()
            pair.check()
            ref = expected_output("all_reduce", n, 0, a.world, dtype)
            bad = [m for m in (mismatch(o, ref) for o in outs) if m]
            if bad:
                raise AssertionError(f"WRONG result at {nbytes} B in memory mode {memory}: {bad[0]}")
            rows += [row("all_reduce", view, memory, nbytes, views[view]) for view in VIEWS]
    finally:
        pair.close()
    return rows


def plot(rows: list[dict], title: str, path: Path) -> None:
    """Median latency against size, one panel per memory mode: each view, its handshake floor dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from arxtune.runtime.units import format_bytes

    memories = list(dict.fromkeys(r["memory"] for r in rows))
    fig, axes = plt.subplots(1, len(memories), figsize=(6.5 * len(memories), 4.5), squeeze=False, sharey=True)
    for ax, memory in zip(axes[0], memories):
        for view, style in zip(VIEWS, ("o-", "s--", "^-.")):
            pts = [(r["bytes"], r["median_us"]) for r in rows
                   if r["op"] == "all_reduce" and r["mode"] == view and r["memory"] == memory]
            if not pts:
                continue
            line, = ax.plot([b for b, _ in pts], [t for _, t in pts], style, label=f"all_reduce, {view}")
            floor = next((r["median_us"] for r in rows if r["op"] == "handshake" and r["mode"] == view
                          and r["memory"] == memory), None)
            if floor is not None:
                ax.axhline(floor, color=line.get_color(), linestyle=":", label=f"handshake floor, {view} ({floor:.1f} us)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("median us per call")
        ax.set_title(f"memory {memory}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(rows: list[dict], title: str, a) -> None:
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
    if a.plot and rows:
        plot(rows, title, a.plot)


def modes_to_run(wanted: str) -> list[tuple[str, str]]:
    """(mode, what the device says) for each mode to measure; refused modes say why and are left out."""
    attrs = read_attributes(0)
    print(f"device attributes: {attrs.describe()}")
    if wanted != "all":
        return [(wanted, str(choose(attrs, wanted)))]
    found = []
    for mode in ("registered", "direct"):
        try:
            found.append((mode, str(choose(attrs, mode))))
        except RdmaUnavailable as exc:
            print(f"memory {mode}: refused here: {exc}")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="CSV to write (default: print only)")
    ap.add_argument("--plot", type=Path, help="image to draw (.png, .svg, .pdf)")
    ap.add_argument("--memory", default="all", choices=["all", "auto", "registered", "direct"])
    ap.add_argument("--launch", default="cached", choices=["cached", "triton"], help="how eager calls launch")
    ap.add_argument("--min-bytes", type=int, default=1 << 10)
    ap.add_argument("--max-bytes", type=int, default=1 << 20)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--eager-calls", type=int, default=20, help="calls per eager sample")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=20.0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("arx_graph: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype, rows, status = torch.bfloat16, [], 0
    title = (f"arxg on {torch.cuda.get_device_name(0)}, world {a.world} over the shared-memory fabric, bf16, "
             f"{a.samples} samples each, launch {a.launch}")
    try:
        modes = modes_to_run(a.memory)
    except RdmaUnavailable as exc:
        print(f"arx_graph: {exc}", file=sys.stderr)
        return 1
    for memory, said in modes:
        print(f"memory {memory}: {said}", flush=True)
        try:
            rows += measure(memory, a, dtype)
        except Exception as exc:  # a mode that fails keeps the modes measured before it
            print(f"arx_graph: memory {memory} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            status = 1
            break
        finally:
            write(rows, title, a)
    floors = {(r["memory"], r["mode"]): r["median_us"] for r in rows if r["op"] == "handshake"}
    print(title)
    print(f"{'op':<11} {'memory':<10} {'bytes':>9} {'mode':<8} {'median us':>10} {'p10':>8} {'p90':>8} {'x floor':>8}")
    for r in rows:
        print(f"{r['op']:<11} {r['memory']:<10} {r['bytes']:>9} {r['mode']:<8} {r['median_us']:>10.2f} {r['p10_us']:>8.2f} "
              f"{r['p90_us']:>8.2f} {r['median_us'] / floors[(r['memory'], r['mode'])]:>8.2f}")
    for path in (a.out, a.plot):
        if path and rows:
            print(f"wrote {path}")
    return status


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.exit(main())
