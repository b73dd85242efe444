"""Synthetic runs written through the real RunWriter, for tests of calibration, plots and the CLI."""

from __future__ import annotations

import numpy as np

from arxtune.results import PointRecord, RunMeta, RunWriter, load_run


def synthetic_samples(median_us: float, spread: float = 0.02, n: int = 200, seed: int = 0) -> tuple[float, ...]:
    rng = np.random.default_rng(seed)
    return tuple(float(v) for v in median_us * (1 + spread * rng.standard_normal(n)))


def make_run(tmp_path, latency, sizes, backends=("gloo", "fast"), ops=("all_reduce",), dtypes=("float32",),
             world=2, statuses=None, spread=0.02, run_id="fixture", n=200, modes=("eager",), status_extra=None,
             device_names=None, hostnames=None):
    """A run whose medians follow latency(backend, nbytes) (or latency(backend, nbytes, mode, op) when modes are given);
    statuses maps (backend, nbytes) -> status; status_extra adds to a backend's status in meta (options, capacity)."""
    meta = RunMeta(run_id=run_id, world_size=world, device_type="cpu", config={"step_factor": 2.0}, baseline="gloo",
                   started="2026-01-01T00:00:00+00:00", hostnames=hostnames or ["a", "b", "c", "d"][:world],
                   device_names=device_names or ["cpu"] * world,
                   backends={b: {"available": True, "reason": "", **(status_extra or {}).get(b, {})} for b in backends})
    writer = RunWriter.create(tmp_path, meta)
    seed = 0
    for backend in backends:
        for op in ops:
            for dtype in dtypes:
                for mode in modes:
                    for size in sizes:
                        status = (statuses or {}).get((backend, size), "ok")
                        seed += 1
                        median = latency(backend, size) if modes == ("eager",) else latency(backend, size, mode, op)
                        samples = synthetic_samples(median, spread, n=n, seed=seed) if status == "ok" else ()
                        writer.append(PointRecord(backend, op, dtype, mode, size, size, world, status, samples,
                                                  "" if status == "ok" else "injected"))
    writer.meta.finished = "2026-01-01T00:01:00+00:00"
    writer.write_meta()
    writer.close()
    return load_run(writer.path)
