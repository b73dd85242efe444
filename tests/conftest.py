"""Shared fixtures: synthetic runs built through the real writer, so tests exercise the real format."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from helpers.runs import make_run

TESTS = Path(__file__).parent
_started = time.monotonic()
# Communicators the tests start run the start-up ladder (ARXTUNE_BOOT=check by default): its runs go
# to a scratch directory, not the user's ~/.cache/arxtune/boot/ (subprocesses inherit it).
os.environ.setdefault("ARXTUNE_BOOT_OUT", tempfile.mkdtemp(prefix="arxtune-boot-"))


def pytest_terminal_summary(terminalreporter):
    """The tier (tests/ directory) this run covered and its wall time, for the README's tier table."""
    paths = {Path(str(getattr(r, "fspath", "") or r.nodeid.split("::")[0])) for rs in terminalreporter.stats.values()
             for r in rs if hasattr(r, "nodeid")}
    tiers = sorted({p.resolve().relative_to(TESTS).parts[0] for p in paths
                    if p.suffix == ".py" and p.resolve().is_relative_to(TESTS) and len(p.resolve().relative_to(TESTS).parts) > 1})
    terminalreporter.write_line(f"arxtune tier {'+'.join(tiers) or 'none'}: {time.monotonic() - _started:.1f} s wall")


@pytest.fixture
def crossover_run(tmp_path):
    """'fast' has lower latency but less bandwidth than gloo: it wins small sizes only."""
    def latency(backend, nbytes):
        return 5 + nbytes / 1000 if backend == "fast" else 50 + nbytes / 4000

    sizes = [1 << k for k in range(10, 21)]
    return make_run(tmp_path, latency, sizes)
