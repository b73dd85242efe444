"""Start torchrun for the user, so `arxtune sweep` alone does the right thing.

Without torchrun in the environment, `arxtune sweep` re-runs itself under
`python -m torch.distributed.run` with one rank per GPU (2 ranks on CPU),
forwarding its own arguments, and afterwards calibrates and plots the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import torch

from .errors import ArxtuneError

#: NVLink multicast stays off wherever arxtune launches ranks: it can take shared GPUs out of service.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class LaunchPlan:
    """How many processes where: one node by default, or a multi-node rendezvous."""

    nproc_per_node: int | None = None
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str = "arxtune"

    def resolved_nproc(self) -> int:
        if self.nproc_per_node:
            return self.nproc_per_node
        if os.environ.get("ARXTUNE_DEVICE", "").lower() != "cpu" and torch.cuda.is_available():
            return max(1, torch.cuda.device_count())
        return 2

    def torchrun_args(self) -> list[str]:
        args = ["--nproc-per-node", str(self.resolved_nproc())]
        if self.nnodes == 1 and not self.rdzv_endpoint:
            return ["--standalone", *args]
        if not self.rdzv_endpoint:
            raise ArxtuneError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        args += ["--nnodes", str(self.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", self.rdzv_endpoint, "--rdzv-id", self.rdzv_id]
        if self.node_rank is not None:
            args += ["--node-rank", str(self.node_rank)]
        return args


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    for key, value in SAFE_ENV.items():
        env.setdefault(key, value)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_under_torchrun(plan: LaunchPlan, arxtune_args: list[str]) -> int:
    """Run `python -m arxtune ARGS` on every rank; returns torchrun's exit code."""
    command = [sys.executable, "-m", "torch.distributed.run", *plan.torchrun_args(), "-m", "arxtune", *arxtune_args]
    try:
        return subprocess.call(command, env=child_env())
    except KeyboardInterrupt:
        return 130
