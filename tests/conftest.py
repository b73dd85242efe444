"""Shared fixtures: synthetic runs built through the real writer, so tests exercise the real format."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

try:  # the vLLM tier's venv has no hypothesis; the fuzzers, which need it, import it themselves
    from hypothesis import settings
except ImportError:
    settings = None  # type: ignore[misc]
if settings is not None:
    # The fuzzers (tests/unit/test_fuzz_*.py) bound their own example counts; CI replays the same examples every run.
    settings.register_profile("ci", derandomize=True, print_blob=True)
    settings.register_profile("dev", print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

from arxtune.runtime import backends
from helpers.runs import make_run

TESTS = Path(__file__).parent
_started = time.monotonic()
# Communicators the tests start run the start-up ladder (ARXTUNE_BOOT=check by default): its runs go
# to a scratch directory, not the user's ~/.cache/arxtune/boot/ (subprocesses inherit it).
os.environ.setdefault("ARXTUNE_BOOT_OUT", tempfile.mkdtemp(prefix="arxtune-boot-"))


def pytest_terminal_summary(terminalreporter):
    """The tier (tests/ directory) this run covered and its wall time, for the README's tier table."""
    paths = {
        Path(str(getattr(r, "fspath", "") or r.nodeid.split("::")[0]))
        for rs in terminalreporter.stats.values()
        for r in rs
        if hasattr(r, "nodeid")
    }
    tiers = sorted(
        {
            p.resolve().relative_to(TESTS).parts[0]
            for p in paths
            if p.suffix == ".py" and p.resolve().is_relative_to(TESTS) and len(p.resolve().relative_to(TESTS).parts) > 1
        }
    )
    terminalreporter.write_line(f"arxtune tier {'+'.join(tiers) or 'none'}: {time.monotonic() - _started:.1f} s wall")


#: The backends synthetic runs and hand-made files name, registered as a site would (ARXTUNE_EXTRA_BACKENDS),
#: since a thresholds file may name only backends the process knows.
TEST_BACKENDS = (
    "fast",
    "faster",
    "quick",
    "x",
    "y",
    "graphy",
    "counting",
    "capcounting",
    "limited",
    "smallonly",
    "offbyone",
    "dies",
    "laterwrong",
    "tagged",
    "slowabove",
    "hangs",
    "reversed",
)


@pytest.fixture(autouse=True, scope="session")
def _test_backends():
    added = [name for name in TEST_BACKENDS if name not in backends.REGISTRY]
    for name in added:
        backends.register(name, "helpers.backends:CountingGloo")
    yield
    for name in added:
        backends.REGISTRY.pop(name, None)


@pytest.fixture
def crossover_run(tmp_path):
    """'fast' has lower latency but less bandwidth than gloo: it wins small sizes only."""

    def latency(backend, nbytes):
        return 5 + nbytes / 1000 if backend == "fast" else 50 + nbytes / 4000

    sizes = [1 << k for k in range(10, 21)]
    return make_run(tmp_path, latency, sizes)
