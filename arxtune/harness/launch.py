"""Start torchrun for the user, so `arxtune sweep` alone does the right thing.

Without torchrun in the environment, `arxtune sweep` re-runs itself under
`python -m torch.distributed.run` with one rank per GPU (2 ranks on CPU),
forwarding its own arguments, and afterwards calibrates and plots the run.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime import env

#: Most ranks on one node and most nodes: far above any machine, low enough that a typo is refused.
MAX_RANKS_PER_NODE = 1024
MAX_NODES = 4096
#: NVLink multicast stays off wherever arxtune launches ranks: it can take shared GPUs out of service.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def local_device_type() -> str:
    """The tensors this node's ranks will use: cuda where a GPU is visible (and ARXTUNE_DEVICE is not cpu), else cpu."""
    return "cuda" if env.DEVICE.get().lower() != "cpu" and torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class LaunchPlan:
    """How many processes where: one node by default, or a multi-node rendezvous."""

    nproc_per_node: int | None = None
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str = "arxtune"
    timeout_s: float = 120.0  # the sweep's timeout_s: bounds the rendezvous too

    def check(self) -> None:
        """Refuse a plan torchrun would misread (0 ranks, a node rank out of range, an endpoint without a port)."""
        if self.nproc_per_node is not None and not 1 <= self.nproc_per_node <= MAX_RANKS_PER_NODE:
            raise ArxtuneError(f"--nproc-per-node {self.nproc_per_node} must be between 1 and {MAX_RANKS_PER_NODE}")
        if not 1 <= self.nnodes <= MAX_NODES:
            raise ArxtuneError(f"--nnodes {self.nnodes} must be between 1 and {MAX_NODES}")
        if self.node_rank is not None and not 0 <= self.node_rank < self.nnodes:
            raise ArxtuneError(f"--node-rank {self.node_rank} must be between 0 and --nnodes - 1 ({self.nnodes - 1})")
        if self.rdzv_endpoint is not None:
            host, colon, port = self.rdzv_endpoint.rpartition(":")
            if not (colon and host and port.isdigit() and 1 <= int(port) <= 65535) or any(c.isspace() or c == "," for c in host):
                raise ArxtuneError(f"--rdzv-endpoint {self.rdzv_endpoint!r} must be HOST:PORT (a port from 1 to 65535)")

    def resolved_nproc(self) -> int:
        self.check()
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        if local_device_type() == "cuda":
            return max(1, torch.cuda.device_count())
        return 2

    def torchrun_args(self) -> list[str]:
        args = ["--nproc-per-node", str(self.resolved_nproc())]
        timeout = str(max(1, math.ceil(self.timeout_s)))
        if self.nnodes == 1 and not self.rdzv_endpoint:
            return ["--standalone", *args]
        if not self.rdzv_endpoint:
            raise ArxtuneError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        args += [
            "--nnodes",
            str(self.nnodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            self.rdzv_endpoint,
            "--rdzv-id",
            self.rdzv_id,
            # The rendezvous waits for nodes, and for the store on HOST:PORT, only as long as any other wait.
            "--rdzv-conf",
            f"join_timeout={timeout},read_timeout={timeout}",
        ]
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


def tell_launcher(line: str) -> None:
    """One line of a rank's stderr for the launcher to read, in one write. The ranks share one pipe,
    unbuffered (PYTHONUNBUFFERED above), where print() writes a text and its newline apart: two ranks'
    lines could come out as one ("arxtune: joinedarxtune: joined") and go unrecognised."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


#: Rank lines the user sees as they come; errors are held back and said once at the end.
ERROR_PREFIX = "arxtune: error: "
RUN_PREFIX = "arxtune: run directory "
#: The last line of a Python traceback: what actually went wrong in a rank (torchrun may prefix "[rank0]: ").
_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt|Exit)\b.*")
_RANK_PREFIX = re.compile(r"^\[(default)?\d+\]:\s*|^\[rank\d+\]:\s*")
#: How long torchrun gets to stop its ranks after an interrupt before it is killed.
STOP_TIMEOUT_S = 30
#: Each rank says this (and the launcher keeps it to itself) once its process group is up.
JOINED_LINE = "arxtune: joined"
#: How long torchrun gets to end the job once a rank failed, before the launcher ends it: a rank frozen
#: (SIGSTOP) ignores torchrun's SIGTERM, which then waits 30 s before its SIGKILL.
FAILED_GRACE_S = 5
#: Beyond the rendezvous timeout, what process start-up and imports may take before the first rank joins.
START_MARGIN_S = 60


@dataclass
class LaunchResult:
    """What the ranks said, boiled down to what the parent reports."""

    code: int
    interrupted: bool = False
    run_path: str = ""
    errors: list[str] = field(default_factory=list)  # distinct "arxtune: error:" lines, in order
    last_exception: str = ""  # the last traceback's final line, when no rank said an arxtune error
    log_path: str = ""
    joined: threading.Event = field(default_factory=threading.Event)  # a rank of this node joined the group
    failed: threading.Event = field(default_factory=threading.Event)  # a rank said its error line: it is on its way out
    read_all: threading.Event = field(default_factory=threading.Event)  # the ranks' stderr reached its end


def _read_ranks_stderr(stream, log, result: LaunchResult) -> None:
    """Keep torchrun's and the ranks' stderr in the log; pass on arxtune's own lines, each once."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # so they wake the main thread's wait
    shown = set()
    try:
        for line in stream:
            log.write(line)
            log.flush()
            text = line.rstrip("\n")
            if text == JOINED_LINE:
                result.joined.set()
            elif text.startswith(ERROR_PREFIX):
                result.failed.set()
                if text[len(ERROR_PREFIX) :] not in result.errors:
                    result.errors.append(text[len(ERROR_PREFIX) :])
            elif text.startswith("arxtune: "):
                if text.startswith(RUN_PREFIX):
                    result.run_path = text[len(RUN_PREFIX) :]
                if text not in shown:
                    shown.add(text)
                    print(text, file=sys.stderr, flush=True)
            elif _EXCEPTION_LINE.match(_RANK_PREFIX.sub("", text.strip())):
                result.last_exception = _RANK_PREFIX.sub("", text.strip())
    finally:
        result.read_all.set()


def _descendants(pid: int) -> list[int]:
    """Every process below pid, found through /proc (torchrun starts each rank in a session of its own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended while we looked
            continue
        parent = int(text[text.rfind(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _kill_tree(pid: int) -> None:
    """SIGKILL pid and everything below it, so no rank outlives the launcher holding its pipes."""
    for victim in [pid, *_descendants(pid)]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _supervise(proc: subprocess.Popen, plan: LaunchPlan, result: LaunchResult) -> int:
    """torchrun's exit code, with two bounds of our own: the group must form within the rendezvous timeout
    (plus start-up), and once a rank failed the job ends within FAILED_GRACE_S."""
    limit = plan.timeout_s + START_MARGIN_S
    deadline = time.monotonic() + limit
    while not result.joined.is_set() and proc.poll() is None and time.monotonic() < deadline:
        result.joined.wait(0.2)
    if not result.joined.is_set():
        if proc.poll() is None:
            _kill_tree(proc.pid)
        code = proc.wait(timeout=STOP_TIMEOUT_S)
        result.read_all.wait(STOP_TIMEOUT_S)  # a job that ends fast may leave its "joined" line still unread
        if code == 0 or result.joined.is_set():
            return code
        if plan.nnodes > 1:
            result.errors.insert(
                0,
                f"the rendezvous at {plan.rdzv_endpoint} did not complete within timeout_s ({plan.timeout_s:g} s): not all "
                f"{plan.nnodes} nodes came (--nnodes); nothing was measured",
            )
        elif not result.errors:
            result.errors.insert(0, f"the ranks of this node did not form a group within {limit:.0f} s; nothing was measured")
        return code or 2
    while True:
        try:
            return proc.wait(timeout=1 if not result.failed.is_set() else FAILED_GRACE_S)
        except subprocess.TimeoutExpired:
            if result.failed.is_set():
                _kill_tree(proc.pid)  # a rank that cannot be stopped politely (frozen) must not hold the job
                return proc.wait(timeout=STOP_TIMEOUT_S) or 1


def torchrun_command(plan: LaunchPlan, arxtune_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *plan.torchrun_args(), "-m", "arxtune", *arxtune_args]


def run_under_torchrun(plan: LaunchPlan, arxtune_args: list[str]) -> LaunchResult:
    """Run `python -m arxtune ARGS` on every rank; stderr goes to a log, arxtune's own lines to the user.

    torchrun gets its own process group, so Ctrl-C reaches only this process, which forwards it
    once and waits (bounded) for torchrun to stop its ranks.
    """
    command = torchrun_command(plan, arxtune_args)
    log = tempfile.NamedTemporaryFile("w", prefix="arxtune-sweep-", suffix=".log", delete=False)
    result = LaunchResult(code=0, log_path=log.name)
    proc = subprocess.Popen(command, env=child_env(), stderr=subprocess.PIPE, text=True, errors="replace", process_group=0)
    reader = threading.Thread(target=_read_ranks_stderr, args=(proc.stderr, log, result), daemon=True)
    reader.start()
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result.code = _supervise(proc, plan, result)
    except KeyboardInterrupt:
        result.interrupted = True
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            proc.wait(timeout=STOP_TIMEOUT_S)
        result.code = 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    reader.join(timeout=STOP_TIMEOUT_S)
    log.close()
    if result.code == 0 and not result.interrupted:
        os.unlink(log.name)
        result.log_path = ""
    return result
