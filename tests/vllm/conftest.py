"""The vLLM tier: run by `make test-vllm` (scripts/test-vllm.sh) in .venv-vllm.

Without vLLM these tests skip, except where the tier was asked for: under
scripts/test-vllm.sh (ARXTUNE_REQUIRE_VLLM=1), or under CI=true when pytest
was pointed at tests/vllm only. There a missing vLLM is a failure.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# find_spec, not import: importing vLLM takes seconds, and the tests import it in child processes.
# A spec without an origin is this directory seen as a namespace package, not vLLM.
_spec = importlib.util.find_spec("vllm")
VLLM_MISSING = not (_spec and _spec.origin)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _tier_required(config) -> bool:
    if _truthy(os.environ.get("ARXTUNE_REQUIRE_VLLM")):
        return True
    if not _truthy(os.environ.get("CI")):
        return False
    args = [Path(str(a).split("::")[0]).resolve() for a in config.args] or [Path.cwd()]
    return all(a == HERE or HERE in a.parents for a in args)


@pytest.fixture(scope="session", autouse=True)
def _needs_vllm(request):  # session scope: decided before the module fixtures that start vLLM processes
    if VLLM_MISSING:
        if _tier_required(request.config):
            pytest.fail("vLLM is not installed; this tier needs it: run `make test-vllm` (it builds .venv-vllm)")
        pytest.skip("vLLM is not installed; `make test-vllm` runs this tier in .venv-vllm")
