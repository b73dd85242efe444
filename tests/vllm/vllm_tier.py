"""Helpers for the vLLM tier: child environments and the two-rank launcher."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: The arxtune backend the routing test sends its ranges to (arx in the soft-RoCE guest).
TEST_BACKEND = os.environ.get("ARXTUNE_VLLM_TEST_BACKEND", "gloo")
#: Seconds the two-rank run may take; the soft-RoCE guest (software CPU) needs far longer.
RUN_TIMEOUT_S = float(os.environ.get("ARXTUNE_VLLM_TEST_TIMEOUT", "240"))


def vllm_env(**extra: str | None) -> dict[str, str]:
    """A child environment for vLLM on CPU; None removes a variable."""
    env = dict(os.environ)
    for key in ("ARXTUNE_THRESHOLDS", "ARXTUNE_VLLM_DISABLE", "ARXTUNE_VLLM_LOG", "VLLM_PLUGINS"):
        env.pop(key, None)
    env.update(VLLM_TARGET_DEVICE="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_tp(tmp_path: Path, spec: dict, env: dict[str, str], world: int = 2, timeout: float = RUN_TIMEOUT_S) -> list[dict]:
    """Start `world` tp_worker.py ranks, wait, return each rank's result (stderr kept in tmp_path)."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    port = free_port()
    procs = []
    for rank in range(world):
        log = open(tmp_path / f"rank{rank}.log", "w")
        procs.append(
            (
                subprocess.Popen(
                    [
                        sys.executable,
                        str(HERE / "tp_worker.py"),
                        str(rank),
                        str(world),
                        str(port),
                        str(spec_path),
                        str(tmp_path / f"rank{rank}.json"),
                    ],
                    env=env,
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
    deadline = time.monotonic() + timeout
    try:
        for proc, _ in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    results = []
    for rank in range(world):
        out = tmp_path / f"rank{rank}.json"
        text = (tmp_path / f"rank{rank}.log").read_text()
        assert out.is_file(), f"rank {rank} wrote no result; its output:\n{text[-4000:]}"
        result = json.loads(out.read_text())
        assert not result["error"], f"rank {rank} failed:\n{result['error']}\n{text[-4000:]}"
        result["output"] = text
        result["returncode"] = procs[rank][0].returncode
        results.append(result)
    return results


def run_python(code: str, env: dict[str, str]) -> subprocess.Popen:
    """Start `python -c code` (output on a pipe); the caller waits."""
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
