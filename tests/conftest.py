"""Shared fixtures: synthetic runs built through the real writer, so tests exercise the real format."""

from __future__ import annotations

import pytest

from helpers.runs import make_run


@pytest.fixture
def crossover_run(tmp_path):
    """'fast' has lower latency but less bandwidth than gloo: it wins small sizes only."""
    def latency(backend, nbytes):
        return 5 + nbytes / 1000 if backend == "fast" else 50 + nbytes / 4000

    sizes = [1 << k for k in range(10, 21)]
    return make_run(tmp_path, latency, sizes)
