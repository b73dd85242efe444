"""Launching a helper worker (tests/helpers/*_worker.py) under `torchrun --standalone`, its output captured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HELPERS = Path(__file__).parent


def torchrun(worker: str, world: int, *args: object, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`worker` (a file in tests/helpers) on `world` local ranks with `args`; the caller asserts on the result."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
    return subprocess.run([*command, str(HELPERS / worker), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)
