"""One engine process of a comparison, started with its arm's environment and bounded by a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from arxtune.runtime.errors import ArxtuneError


def run_engine(spec: dict, env: dict, out: Path, timeout_s: float) -> dict:
    """Run one engine process (arxtune.harness.e2e.child) to completion; its output goes to out.log."""
    spec_path, result_path, log_path = out.with_suffix(".spec.json"), out.with_suffix(".json"), out.with_suffix(".log")
    spec_path.write_text(json.dumps(spec))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "arxtune.harness.e2e.child", str(spec_path), str(result_path)],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the engine and the workers it spawned
            proc.wait()
            raise ArxtuneError(
                f"engine {out.name} did not finish within {timeout_s:.0f} s (raise --timeout-s); its output: {log_path}"
            ) from None
    if not result_path.is_file():
        raise ArxtuneError(f"engine {out.name} exited with code {proc.returncode} without a result; its output: {log_path}")
    result = json.loads(result_path.read_text())
    if result["error"]:
        last = result["error"].strip().splitlines()[-1]
        raise ArxtuneError(f"engine {out.name} failed: {last}; its output: {log_path}")
    return result
