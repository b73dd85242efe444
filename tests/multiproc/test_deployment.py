"""One calibrated file, merged from a TP=2 and a TP=3 run, serves a torchrun job of each size."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from arxtune.harness.calibrate import calibrate

from helpers.workers import torchrun
from helpers.runs import make_run

TESTS = Path(__file__).parents[1]
KiB = 1024


def _latency(crossover):
    """Eager: 'counting' wins all_reduce up to `crossover`, 'limited' wins reduce_scatter; graph: 'capcounting' wins."""

    def latency(backend, nbytes, mode, op):
        if mode == "graph":
            return {"capcounting": 1.0, "gloo": 20.0}.get(backend, 40.0)
        if op == "reduce_scatter":
            return {"limited": 1.0, "gloo": 20.0}.get(backend, 40.0)
        if backend == "counting":
            return 10.0 if nbytes <= crossover else 40.0
        return {"gloo": 20.0, "capcounting": 30.0}.get(backend, 50.0)

    return latency


@pytest.mark.multiproc
def test_one_calibrated_file_serves_a_tp2_and_a_tp3_job(tmp_path):
    sizes = [1 << k for k in range(10, 19)]
    limited = {"limited": {"options": {"max_bytes": 8 * KiB}, "capacity": {"reduce_scatter": 8 * KiB, "all_reduce": 8 * KiB}}}
    runs = [
        make_run(
            tmp_path,
            _latency(crossover),
            sizes,
            backends=("gloo", "counting", "capcounting", "limited"),
            ops=("all_reduce", "reduce_scatter"),
            world=world,
            run_id=f"w{world}",
            views=("eager", "graph"),
            status_extra=limited,
            hostnames=[socket.gethostname()] * world,
        )
        for world, crossover in ((2, 8 * KiB), (3, 32 * KiB))
    ]
    path = calibrate(runs).save(tmp_path / "thresholds.json")
    extra = (
        "counting=helpers.backends:CountingGloo,capcounting=helpers.backends:CapturableCounting,limited=helpers.backends:LimitedCounting"
    )
    for world in (2, 3):
        env = {
            k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "ARXTUNE_OVERRIDES", "ARXTUNE_FINGERPRINT")
        }
        env.update(PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]), ARXTUNE_EXTRA_BACKENDS=extra, OMP_NUM_THREADS="1")
        result = torchrun("deployment_worker.py", world, path, env=env, timeout=240)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.count("deployment ok") == world, result.stdout
        line = next(x for x in result.stderr.splitlines() if x.startswith("arxtune: world"))
        assert f"world {world}, tables eager 2, graph 2" in line
        assert "capacity limited all_reduce<=8KiB, limited reduce_scatter<=8KiB" in line
        assert f"fingerprint matches run w{world}" in line
        assert "overrides all_reduce/float32@graph [0B, 2KiB) -> counting" in line
        assert "graph all_reduce/float32 [2KiB, inf) -> capcounting" in line
        assert "fingerprint differs (run w" in result.stderr and "hostnames other vs" in result.stderr
