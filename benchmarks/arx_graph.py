"""Graph-mode arx (arxg) on one GPU: two ranks over the shared-memory fabric, in every memory mode the
device allows, in every timing view, with the handshake floor.

    python benchmarks/arx_graph.py --out results/RUN/arx_graph.csv --plot results/RUN/arx_graph.png

Two GPU ranks live in this process on one GPU, each with its own segment,
proxy process and CUDA stream. Where ranks in their own processes launch at the
same time, this process gives each rank a thread of its own, started together
by a barrier ("in phase"); a C burst (the rank's `rotation`, where this arxtune
has it) releases the interpreter's lock, so the two launch truly at once, while
calls from Python take turns at it. Views of a bf16 all-reduce per size:

- graph: a CUDA graph holds a chain of 10 all-reduces per rank, the two chains
  concurrent and meeting only through the protocol; a sample is one replay / 10.
- eager: in phase, each rank launches `--eager-calls` calls back to back (from
  C where the rank offers it); a sample is the slower rank's span / calls.
- eager-py: the same with every call from Python (GpuRank.run).
- eager-ahead: the other ranks' calls launched first, then rank 0's from
  Python, timed on rank 0 (how this benchmark measured eager before): the ranks
  run out of phase, each step waiting for a proxy hop each way in turn.
- isolated: the other ranks' calls launched first, then rank 0's one call from
  Python between events on its stream, synchronised before and after: a rank's
  own call with its peer already there (as a rank in its own process sees it
  when its peer arrives first: host launch, the GPU's start, the proxies).
- isolated-one-thread: one thread launches both ranks' calls with the stream
  hops between them, synchronised (how this benchmark measured isolated
  before); `isolated-one-thread-host` is the host time of that launch alone.
- isolated-after-Nms (`--idle-ms N`): isolated, each sample N ms after the
  last (host, GPU and proxy idle meanwhile; a proxy blocks past its window).
- decode-D (`--busy-us D ...`): in phase, each rank launches `--eager-calls` x
  (busy kernel of D us, call) with no sync (from C where offered), less the
  busy kernels alone, per call: the slower rank's figure (timing.CudaDecodeTimer).

The floor is a one-rank handshake (ring the doorbell, wait for the proxy) in
the graph, eager and isolated views, and isolated after the idle gap; beside it,
a plain kernel (one element incremented, no proxy) isolated and after the gap:
what idleness costs with no proxy at all. Each memory mode (`--memory`: all, auto,
registered, direct; all = each one the device allows, registered first) gets
fresh ranks; the CSV (op, mode, memory, bytes, median_us, p10_us, p90_us, launch)
and the plot are rewritten after each, so a mode that fails keeps the ones before
it. Every size's outputs are checked bit for bit after timing.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
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
FIELDS = ["op", "mode", "memory", "bytes", "median_us", "p10_us", "p90_us", "launch"]
DEFAULT_VIEWS = "graph,eager,eager-py,eager-ahead,isolated,isolated-one-thread,decode"


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


class InPhase:
    """One thread per rank, each on its rank's stream, started together by a barrier for every sample."""

    def __init__(self, pair):
        self.pair, self.world = pair, len(pair.ranks)
        self.pool = ThreadPoolExecutor(self.world)
        self.barrier = threading.Barrier(self.world)
        self.events = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(self.world)]

    def sample(self, job) -> float:
        """job(rank index, its events) -> us on that rank; the slower rank's figure."""

        def run(r):
            torch.cuda.set_device(0)
            with torch.cuda.stream(self.pair.streams[r]):
                torch.cuda.current_stream().synchronize()
                self.barrier.wait()
                return job(r, self.events[r])

        return max(f.result(timeout=60) for f in [self.pool.submit(run, r) for r in range(self.world)])

    def close(self) -> None:
        self.pool.shutdown()


def ms(start, end) -> float:
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def rotations(pair, ins, outs):
    """Each rank's C-launchable rotation over its one buffer pair, or None where this arxtune has none."""
    if not all(hasattr(r, "rotation") for r in pair.ranks):
        return None
    found = [r.rotation("all_reduce", [i], [o]) for r, i, o in zip(pair.ranks, ins, outs)]
    return found if all(getattr(x, "repeat", None) for x in found) else None


def measure_pair_views(pair, views, ins, outs, a, busies) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Samples of every asked view at one size, and how each launched ("c" or "python")."""
    k, lead = a.eager_calls, pair.ranks[0]
    rot = rotations(pair, ins, outs)
    phase = InPhase(pair)
    found, launch = {}, {}

    def repeat(times, fn):
        return [fn() for _ in range(times)][a.warmup :]

    try:
        if "graph" in views:
            g = capture(lambda repeat_: pair.collective("all_reduce", ins, outs, repeat_))
            found["graph"] = time_span(g.replay, OPS_PER_GRAPH, a.warmup, a.samples)
            launch["graph"] = "graph"
            del g

        def eager_job(from_c: bool):
            def job(r, ev):
                if from_c:
                    rot[r].repeat(k, ev[0], ev[1])
                else:
                    ev[0].record()
                    for _ in range(k):
                        pair.ranks[r].all_reduce(ins[r], outs[r])
                    ev[1].record()
                return ms(ev[0], ev[1]) / k

            return job

        if "eager" in views:
            found["eager"] = repeat(a.warmup + a.samples, lambda: phase.sample(eager_job(rot is not None)))
            launch["eager"] = "c" if rot is not None else "python"
        if "eager-py" in views:
            found["eager-py"] = repeat(a.warmup + a.samples, lambda: phase.sample(eager_job(False)))
            launch["eager-py"] = "python"
        if "eager-ahead" in views:
            found["eager-ahead"] = time_span(
                lambda: [lead.all_reduce(ins[0], outs[0]) for _ in range(k)],
                k,
                a.warmup,
                a.samples,
                before=lambda: pair.launch_peers("all_reduce", ins, outs, k),
            )
            launch["eager-ahead"] = "python"

        def isolated(idle_s: float = 0.0) -> list[float]:
            def before():
                torch.cuda.synchronize()
                time.sleep(idle_s)
                pair.launch_peers("all_reduce", ins, outs, 1)

            return time_span(lambda: lead.all_reduce(ins[0], outs[0]), 1, a.warmup, a.samples, before=before)

        if "isolated" in views:
            found["isolated"] = isolated()
            launch["isolated"] = "python"
        if a.idle_ms:
            view = f"isolated-after-{a.idle_ms:g}ms"
            found[view] = isolated(a.idle_ms / 1e3)
            launch[view] = "python"
        if "isolated-one-thread" in views:
            host = []

            def one_thread():
                t = time.perf_counter()
                pair.collective("all_reduce", ins, outs)
                host.append((time.perf_counter() - t) * 1e6)

            found["isolated-one-thread"] = time_span(one_thread, 1, a.warmup, a.samples)
            found["isolated-one-thread-host"] = host[a.warmup :]
            launch["isolated-one-thread"] = launch["isolated-one-thread-host"] = "python"
        if "decode" in views:
            for busy in busies:

                def decode_job(r, ev, busy=busy):
                    busy.repeat(k, ev[2], ev[3])
                    if rot is not None:
                        rot[r].decode(1, busy)  # an untimed lead-in pair, as timing.CudaDecodeTimer
                        rot[r].decode(k, busy, ev[0], ev[1])
                    else:
                        busy()
                        pair.ranks[r].all_reduce(ins[r], outs[r])
                        ev[0].record()
                        for _ in range(k):
                            busy()
                            pair.ranks[r].all_reduce(ins[r], outs[r])
                        ev[1].record()
                    return (ms(ev[0], ev[1]) - ms(ev[2], ev[3])) / k

                view = f"decode-{busy.us:g}"
                samples = max(20, min(a.samples, int(2.0 / (2 * k * busy.us * 1e-6))))  # about 2 s a view
                found[view] = repeat(a.warmup + samples, lambda: phase.sample(decode_job))
                launch[view] = "c" if rot is not None else "python"
    finally:
        phase.close()
    return found, launch


def sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def row(op: str, mode: str, memory: str, nbytes: int, xs: list[float], launch: str = "") -> dict:
    xs = sorted(xs)
    return {
        "op": op,
        "mode": mode,
        "memory": memory,
        "bytes": nbytes,
        "median_us": statistics.median(xs),
        "p10_us": xs[len(xs) // 10],
        "p90_us": xs[len(xs) * 9 // 10],
        "launch": launch,
    }


def measure(memory: str, a, dtype: torch.dtype) -> list[dict]:
    """Every view of the floor and of each size, in one memory mode; raises on a wrong result."""
    from arxtune.runtime.cudadrv import BusyKernel

    views = set(a.views.split(","))
    rows = []
    floor = RanksOnOneGpu(1, RdmaConfig(max_bytes=4096, timeout_s=a.timeout_s), memory=memory)
    try:
        r0 = floor.ranks[0]
        g = capture(lambda repeat: [r0.handshake() for _ in range(repeat)])  # type: ignore[func-returns-value]
        rows.append(row("handshake", "graph", memory, 0, time_span(g.replay, OPS_PER_GRAPH, a.warmup, a.samples), "graph"))
        del g
        rows.append(
            row(
                "handshake",
                "eager",
                memory,
                0,
                time_span(lambda: [r0.handshake() for _ in range(a.eager_calls)], a.eager_calls, a.warmup, a.samples),  # type: ignore[func-returns-value]
                "python",
            )
        )
        rows.append(row("handshake", "isolated", memory, 0, time_span(r0.handshake, 1, a.warmup, a.samples), "python"))
        x = torch.zeros(1, device="cuda")
        rows.append(row("plain kernel", "isolated", memory, 0, time_span(lambda: x.add_(1), 1, a.warmup, a.samples), "python"))
        if a.idle_ms:

            def idle():
                torch.cuda.synchronize()
                time.sleep(a.idle_ms / 1e3)

            view = f"isolated-after-{a.idle_ms:g}ms"
            rows.append(row("handshake", view, memory, 0, time_span(r0.handshake, 1, a.warmup, a.samples, idle), "python"))
            rows.append(row("plain kernel", view, memory, 0, time_span(lambda: x.add_(1), 1, a.warmup, a.samples, idle), "python"))
        torch.cuda.synchronize()
        floor.check()
    finally:
        floor.close()

    busies = [BusyKernel(us, 0) for us in a.busy_us] if "decode" in views else []
    largest = max([int(x) for x in a.sizes.split(",")] if a.sizes else [a.max_bytes])
    pair = RanksOnOneGpu(a.world, RdmaConfig(max_bytes=largest, timeout_s=a.timeout_s), memory=memory)
    dev = torch.device("cuda", 0)
    try:
        for nbytes in [int(x) for x in a.sizes.split(",")] if a.sizes else sizes(a.min_bytes, a.max_bytes):
            n = elements_per_rank("all_reduce", nbytes, a.world, 2)
            ins = [make_input("all_reduce", n, r, a.world, dtype, dev) for r in range(a.world)]
            outs = [torch.full_like(i, float("nan")) for i in ins]
            found, launch = measure_pair_views(pair, views, ins, outs, a, busies)
            torch.cuda.synchronize()
            pair.check()
            ref = expected_output("all_reduce", n, 0, a.world, dtype)
            bad = [m for m in (mismatch(o, ref) for o in outs) if m]
            if bad:
                raise AssertionError(f"WRONG result at {nbytes} B in memory mode {memory}: {bad[0]}")
            rows += [row("all_reduce", view, memory, nbytes, xs, launch[view]) for view, xs in found.items()]
            print(f"{nbytes} B: " + ", ".join(f"{v} {statistics.median(x):.2f}" for v, x in found.items()), flush=True)
    finally:
        pair.close()
    return rows


def plot(rows: list[dict], title: str, path: Path) -> None:
    """Median latency against size, one panel per memory mode: each view, the handshake floor dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from arxtune.runtime.units import format_bytes

    memories = list(dict.fromkeys(r["memory"] for r in rows))
    views = list(dict.fromkeys(r["mode"] for r in rows if r["op"] == "all_reduce" and not r["mode"].endswith("-host")))
    fig, axes = plt.subplots(1, len(memories), figsize=(6.5 * len(memories), 4.5), squeeze=False, sharey=True)
    for ax, memory in zip(axes[0], memories):
        for view in views:
            pts = [(r["bytes"], r["median_us"]) for r in rows if r["op"] == "all_reduce" and r["mode"] == view and r["memory"] == memory]
            if pts:
                ax.plot([b for b, _ in pts], [t for _, t in pts], "o-", label=f"all_reduce, {view}", markersize=3)
        floor = next((r["median_us"] for r in rows if r["op"] == "handshake" and r["mode"] == "graph" and r["memory"] == memory), None)
        if floor is not None:
            ax.axhline(floor, color="grey", linestyle=":", label=f"handshake floor, graph ({floor:.1f} us)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("median us per call")
        ax.set_title(f"memory {memory}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
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
    ap.add_argument("--views", default=DEFAULT_VIEWS, help=f"comma list (default {DEFAULT_VIEWS})")
    ap.add_argument("--busy-us", type=float, nargs="+", default=[50.0, 200.0], help="the decode views' busy kernels")
    ap.add_argument("--idle-ms", type=float, default=0.0, help="also time isolated calls this long after the last")
    ap.add_argument("--min-bytes", type=int, default=1 << 10)
    ap.add_argument("--max-bytes", type=int, default=1 << 20)
    ap.add_argument("--sizes", help="bytes per rank, comma-separated (instead of --min-bytes..--max-bytes by 2x)")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--eager-calls", type=int, default=20, help="calls per eager and decode sample")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=20.0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("arx_graph: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype, rows, status = torch.bfloat16, [], 0
    title = f"arxg on {torch.cuda.get_device_name(0)}, world {a.world} over the shared-memory fabric, bf16, {a.samples} samples each"
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
    graph_floor = {m: floors.get((m, "graph")) for m, _ in modes}
    print(title)
    print(
        f"{'op':<13} {'memory':<10} {'bytes':>9} {'view':<26} {'launch':<7} {'median us':>10} {'p10':>8} {'p90':>8} {'x graph floor':>13}"
    )
    for r in rows:
        floor = graph_floor.get(r["memory"])
        ratio = f"{r['median_us'] / floor:13.2f}" if floor else f"{'':>13}"
        print(
            f"{r['op']:<13} {r['memory']:<10} {r['bytes']:>9} {r['mode']:<26} {r['launch']:<7} {r['median_us']:>10.2f} "
            f"{r['p10_us']:>8.2f} {r['p90_us']:>8.2f} {ratio}"
        )
    for path in (a.out, a.plot):
        if path and rows:
            print(f"wrote {path}")
    return status


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.exit(main())
