"""Synthetic runs written through the real RunWriter, for tests of calibration, plots and the CLI."""

from __future__ import annotations

import numpy as np

from arxtune.harness.results import PointRecord, RunMeta, RunWriter, load_run


def synthetic_samples(median_us: float, spread: float = 0.02, n: int = 200, seed: int = 0) -> tuple[float, ...]:
    rng = np.random.default_rng(seed)
    values = median_us * (1 + spread * rng.standard_normal(n))
    return tuple(float(v) for v in np.maximum(values, 0.01 * median_us))  # times are positive, however wide the spread


def make_run(
    tmp_path,
    latency,
    sizes,
    backends=("gloo", "fast"),
    ops=("all_reduce",),
    dtypes=("float32",),
    world=2,
    statuses=None,
    spread=0.02,
    run_id="fixture",
    n=200,
    rounds=5,
    finished=True,
    graph_latency=None,
    views=("eager",),
    status_extra=None,
    device_names=None,
    hostnames=None,
    bitwise=None,
):
    """A run whose medians follow latency(backend, nbytes) (or latency(backend, nbytes, view, op) when views are given);
    statuses maps (backend, nbytes) -> status; status_extra adds to a backend's status in meta (options, capacity).

    Each point's n samples are stored as `rounds` equal rounds (the remainder in the last).
    graph_latency, when given, adds the same points in the graph view with those medians.
    bitwise(backend, nbytes), when given, is each passing point's bitwise check (else: not checked).
    """
    meta = RunMeta(
        run_id=run_id,
        world_size=world,
        device_type="cpu",
        config={"step_factor": 2.0},
        baseline="gloo",
        started="2026-01-01T00:00:00+00:00",
        hostnames=hostnames or ["a", "b", "c", "d"][:world],
        device_names=device_names or ["cpu"] * world,
        backends={b: {"available": True, "reason": "", **(status_extra or {}).get(b, {})} for b in backends},
    )
    writer = RunWriter.create(tmp_path, meta)
    seed = 0

    def median(backend, size, view, op):
        if view == "graph" and graph_latency:
            return graph_latency(backend, size)
        return latency(backend, size) if views == ("eager",) else latency(backend, size, view, op)

    for view in views + (("graph",) if graph_latency and "graph" not in views else ()):
        for backend in backends:
            for op in ops:
                for dtype in dtypes:
                    for size in sizes:
                        status = (statuses or {}).get((backend, size), "ok")
                        seed += 1
                        samples = synthetic_samples(median(backend, size, view, op), spread, n=n, seed=seed) if status == "ok" else ()
                        round_iters = (n // rounds,) * (rounds - 1) + (n - n // rounds * (rounds - 1),) if samples else ()
                        writer.append(
                            PointRecord(
                                backend,
                                op,
                                dtype,
                                view,
                                size,
                                size,
                                world,
                                status,
                                samples,
                                "" if status == "ok" else "injected",
                                round_iters,
                                bitwise(backend, size) if bitwise and status == "ok" else None,
                            )
                        )
    writer.meta.finished = "2026-01-01T00:01:00+00:00" if finished else None
    writer.write_meta()
    writer.close()
    return load_run(writer.path)
