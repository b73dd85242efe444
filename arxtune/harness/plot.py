"""Latency and bus bandwidth against size, one line per backend, chosen ranges as bands."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from arxtune.runtime.units import format_bytes  # noqa: E402
from arxtune.runtime.errors import ArxtuneError  # noqa: E402
from arxtune.runtime.fileio import Staged, check_output, write_bytes_atomic  # noqa: E402
from arxtune.harness.config import VIEWS  # noqa: E402
from arxtune.harness.results import Run  # noqa: E402
from arxtune.runtime.thresholds import Thresholds  # noqa: E402

FORMATS = {".png", ".svg", ".pdf"}
#: One line style per timing view, so eager, isolated and graph curves of a backend tell apart.
LINE_STYLES = {"eager": "-", "isolated": ":", "graph": "--"}


def _colors(names: list[str]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {name: cycle[i % len(cycle)] for i, name in enumerate(names)}


def _bands(ax, thresholds: Thresholds | None, op: str, dtype: str, world: int, colors: dict, xmin: float, xmax: float) -> None:
    table = thresholds.table(op, dtype, world, "eager") if thresholds else None
    if table is None:
        return
    for r in table.ranges:
        lo, hi = max(r.lo, xmin), min(r.hi if r.hi is not None else xmax, xmax)
        if lo < hi:
            ax.axvspan(lo, hi, color=colors.get(r.backend, "grey"), alpha=0.10, lw=0)
            ax.text(
                (lo * hi) ** 0.5,
                0.98,
                r.backend,
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="top",
                fontsize=7,
                color=colors.get(r.backend, "grey"),
            )


#: How each image format a plot may replace starts.
_SIGNATURES = (b"\x89PNG", b"<?xml", b"<svg", b"%PDF")


def is_image(path: Path) -> bool:
    """Whether an existing file may be replaced by a plot: an image of a format plot writes, or empty."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError:
        return False
    return not head or head.lstrip().startswith(_SIGNATURES)


def plot_run(
    run: Run,
    thresholds: Thresholds | None = None,
    out: str | Path | None = None,
    view: str | None = None,
    inputs: tuple[Path, ...] = (),
    into: Staged | None = None,
) -> Path:
    """Draw every (op, dtype) of a run in one figure; returns the file written. `inputs`: the command's other input
    files; `into`: the command's staged outputs, published with the others (else the image is written at once)."""
    out = Path(out) if out is not None else run.path / "plot.png"
    if out.suffix.lower() not in FORMATS:
        raise ArxtuneError(f"cannot write {out.suffix or 'no extension'}; use one of {', '.join(sorted(FORMATS))}")
    if view is not None and view not in VIEWS:
        raise ArxtuneError(f"unknown view {view!r}; known: {', '.join(VIEWS)}")
    check_output(out, "plot", (run.path, *inputs), is_image)
    frame = run.frame()
    ok = frame[frame.status == "ok"]
    if view:
        if not (ok["view"] == view).any():
            raise ArxtuneError(
                f"run {run.meta.run_id} has no correct points in the {view} view (it has: {', '.join(sorted(set(ok['view']))) or 'none'})"
            )
        ok = ok[ok["view"] == view]
    if ok.empty:
        raise ArxtuneError(f"run {run.meta.run_id} has no correct points to plot; check `arxtune show {run.path}`")
    panels = list(ok.groupby(["op", "dtype"], sort=False).groups)
    names = list(dict.fromkeys(frame.backend))
    colors = _colors(names)
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 3.4 * len(panels)), squeeze=False)
    xmin, xmax = ok.nbytes.min() / 1.5, ok.nbytes.max() * 1.5
    fmt = FuncFormatter(lambda v, _: format_bytes(v))
    floor = run.meta.fabric_floor_us
    # One rank moves nothing over a bus (busbw factor 0): show algorithm bandwidth instead.
    bw_column, bw_name = ("busbw_gbps", "bus bandwidth") if run.meta.world_size > 1 else ("algbw_gbps", "algorithm bandwidth")
    for row, (op, dtype) in enumerate(panels):
        lat, bw = axes[row]
        data = ok[(ok.op == op) & (ok.dtype == dtype)]
        for (backend, point_view), series in data.groupby(["backend", "view"], sort=False):
            series = series.sort_values("nbytes")
            label = backend if point_view == "eager" else f"{backend} ({point_view})"
            style = LINE_STYLES.get(point_view, "--")
            lat.plot(series.nbytes, series.median_us, style, marker="o", ms=3, color=colors[backend], label=label)
            lat.fill_between(series.nbytes, series.p10_us, series.p90_us, color=colors[backend], alpha=0.2, lw=0)
            unstable = series[series.unstable.astype(bool)]
            lat.scatter(unstable.nbytes, unstable.median_us, marker="x", color="black", s=14, zorder=3)
            bw.plot(series.nbytes, series[bw_column], style, marker="o", ms=3, color=colors[backend], label=label)
        if floor:
            lat.axhline(floor, color="black", ls=":", lw=1, label=f"ib_write_lat 2B ({floor:.1f} us)")
        for ax in (lat, bw):
            _bands(ax, thresholds, op, dtype, run.meta.world_size, colors, xmin, xmax)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(fmt)
            ax.set_xlim(xmin, xmax)
            ax.grid(True, which="major", alpha=0.3)
            ax.set_xlabel("size (bytes)")
        lat.set_yscale("log")
        lat.set_ylabel("latency, median (us)")
        bw.set_ylabel(f"{bw_name} (GB/s)")
        lat.set_title(f"{op} {dtype}: latency (p10-p90 shaded, x = unstable)", fontsize=9)
        bw.set_title(f"{op} {dtype}: {bw_name}", fontsize=9)
        lat.legend(fontsize=7, loc="upper left")
    hosts = ", ".join(sorted(set(run.meta.hostnames)))
    fig.suptitle(
        f"arxtune run {run.meta.run_id} | world {run.meta.world_size} | {hosts} | {run.meta.device_names[0] if run.meta.device_names else ''}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    image = io.BytesIO()
    fig.savefig(image, dpi=110, format=out.suffix.lower()[1:])
    plt.close(fig)
    return (into.write_bytes if into is not None else write_bytes_atomic)(out, image.getvalue(), "plot")
