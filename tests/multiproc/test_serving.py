"""After start-up: ARXTUNE_VERIFY catches a backend that goes wrong while serving, and ranks whose
ARXTUNE_OVERRIDES differ are one clear error (tests/helpers/serving_worker.py runs both)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.workers import torchrun

TESTS = Path(__file__).parents[1]


@pytest.mark.multiproc
def test_verify_and_the_agreed_variables(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARXTUNE_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        ARXTUNE_EXTRA_BACKENDS="goeswrong=helpers.backends:GoesWrong",
        ARXTUNE_BOOT_OUT=str(tmp_path / "boot"),
    )
    result = torchrun("serving_worker.py", 2, env=env, timeout=240)
    assert result.returncode == 0 and result.stdout.count("serving ok") == 2, result.stdout + result.stderr
    got = {
        r["scenario"]: r
        for r in (json.JSONDecoder().raw_decode(x[len("RESULT ") :])[0] for x in result.stdout.splitlines() if x.startswith("RESULT "))
    }

    verify = got["verify"]
    assert verify["right"] == [True] * 10  # the wrong call was answered by the baseline's result
    assert "verify 1 call in 2 against gloo" in verify["line"]
    assert verify["calls"] == {"all_reduce:goeswrong": 4, "all_reduce:gloo": 6}, verify["calls"]
    [[name, op, dtype, why]] = verify["excluded"]
    assert (name, op, dtype) == ("goeswrong", "all_reduce", "float32")
    assert why.startswith("ARXTUNE_VERIFY, call 4 at 1KiB: rank 1: 1 of 256 elements differ by more than "), why
    warning = [line for line in result.stderr.splitlines() if "goeswrong gave a wrong all_reduce/float32 result" in line]
    assert (
        len(warning) == 1
        and "first at 255: got 3.0 expected 2.0" in warning[0]
        and warning[0].endswith("it serves no all_reduce/float32 call for the rest of this process (they go to gloo)")
    ), warning

    for rank in (0, 1):
        assert got[f"overrides-rank{rank}"]["said"] == (
            "ARXTUNE_OVERRIDES differs between ranks (rank 0: '', rank 1: 'all_reduce:0-64KiB=goeswrong'); set the same value on every rank"
        )
