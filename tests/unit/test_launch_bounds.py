"""The launcher's own bounds: a job that never forms, a failed job with a rank that cannot be stopped, and ranks' lines whole on a shared pipe."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from arxtune.harness import launch

#: Stands in for torchrun: says the group formed, starts a "rank" that freezes itself, reports a rank's
#: error and then, like torchrun stopping a frozen rank, waits 30 s on a SIGTERM that never lands.
FROZEN_JOB = r"""
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"])
print(rank.pid, flush=True)
print("arxtune: joined", file=sys.stderr, flush=True)
print("arxtune: error: rank 1 did not answer within 3 s", file=sys.stderr, flush=True)
time.sleep(60)
"""

NEVER_FORMS = r"""
import time
time.sleep(60)
"""


def _plan(timeout_s: float) -> launch.LaunchPlan:
    return launch.LaunchPlan(nproc_per_node=1, timeout_s=timeout_s)


@pytest.mark.timeout(60)
def test_a_failed_job_with_a_frozen_rank_ends_within_the_grace(monkeypatch, capfd):
    monkeypatch.setattr(launch, "torchrun_command", lambda plan, args: [sys.executable, "-c", FROZEN_JOB])
    started = time.monotonic()
    result = launch.run_under_torchrun(_plan(120.0), [])
    took = time.monotonic() - started
    assert took < launch.FAILED_GRACE_S + 10, took  # not torchrun's 30 s
    assert result.code != 0 and result.errors == ["rank 1 did not answer within 3 s"]
    frozen = int(capfd.readouterr().out.split()[0])
    time.sleep(0.5)
    assert _state(frozen) in ("gone", "Z")  # the frozen rank went with the job (a zombie until its new parent reaps it)


def _state(pid: int) -> str:
    try:
        text = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return "gone"
    return text[text.rfind(")") + 2]


@pytest.mark.timeout(60)
def test_a_job_that_never_forms_ends_at_the_timeout_naming_what_never_came(monkeypatch):
    monkeypatch.setattr(launch, "START_MARGIN_S", 0)
    monkeypatch.setattr(launch, "torchrun_command", lambda plan, args: [sys.executable, "-c", NEVER_FORMS])
    plan = launch.LaunchPlan(nproc_per_node=1, nnodes=2, rdzv_endpoint="node0:29500", timeout_s=2.0)
    started = time.monotonic()
    result = launch.run_under_torchrun(plan, [])
    assert time.monotonic() - started < 10
    assert result.code != 0
    assert result.errors == [
        "the rendezvous at node0:29500 did not complete within timeout_s (2 s): not all 2 nodes came (--nnodes); nothing was measured"
    ]


def test_the_rendezvous_is_bounded_by_the_sweeps_timeout():
    args = launch.LaunchPlan(nproc_per_node=1, nnodes=2, rdzv_endpoint="h:29500", timeout_s=7.5).torchrun_args()
    assert args[args.index("--rdzv-conf") + 1] == "join_timeout=8,read_timeout=8"


@pytest.mark.parametrize(
    "plan, needle",
    [
        (launch.LaunchPlan(nproc_per_node=0), "--nproc-per-node 0"),
        (launch.LaunchPlan(nnodes=0), "--nnodes 0"),
        (launch.LaunchPlan(nnodes=2, node_rank=-1, rdzv_endpoint="h:1"), "--node-rank -1"),
        (launch.LaunchPlan(nnodes=2, rdzv_endpoint="h:0"), "HOST:PORT"),
        (launch.LaunchPlan(nnodes=2, rdzv_endpoint=":80"), "HOST:PORT"),
    ],
)
def test_plans_torchrun_would_misread_are_refused(plan, needle):
    with pytest.raises(launch.ArxtuneError, match=needle):
        plan.torchrun_args()


#: A job that joins and fails at once: torchrun has exited before the parent has read the "joined" line.
FAILS_FAST = r"""
import sys
print("arxtune: joined", file=sys.stderr, flush=True)
sys.exit(1)
"""


@pytest.mark.timeout(60)
def test_a_job_that_ends_before_its_joined_line_is_read_is_a_failed_rank_not_a_group_that_never_formed(monkeypatch):
    slow_reader = launch._read_ranks_stderr

    def late(stream, log, result):
        time.sleep(1.0)  # a loaded machine: the reader thread runs after torchrun has gone
        slow_reader(stream, log, result)

    monkeypatch.setattr(launch, "_read_ranks_stderr", late)
    monkeypatch.setattr(launch, "torchrun_command", lambda plan, args: [sys.executable, "-c", FAILS_FAST])
    result = launch.run_under_torchrun(_plan(120.0), [])
    assert result.code == 1 and result.joined.is_set()
    assert not any("did not form a group" in e for e in result.errors), result.errors


#: A rank saying its joined line as the sweep does, many times; argv: when to start (time.time()), how many.
SAYS_JOINED = r"""
import sys, time
from arxtune.harness.launch import JOINED_LINE, tell_launcher
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))
for _ in range(int(sys.argv[2])):
    tell_launcher(JOINED_LINE)
"""


def test_ranks_sharing_the_launchers_pipe_say_whole_lines():
    """Three ranks at once on one unbuffered pipe, as torchrun's ranks share the launcher's (print() broke
    about half such lines on the 2-core machine)."""
    read, write = os.pipe()
    start = str(time.time() + 3)  # all at once, after their imports
    procs = [subprocess.Popen([sys.executable, "-c", SAYS_JOINED, start, "20000"], stderr=write, env=launch.child_env()) for _ in range(3)]
    os.close(write)
    with os.fdopen(read) as stream:
        got = stream.read().splitlines()
    assert [proc.wait(timeout=60) for proc in procs] == [0, 0, 0]
    assert len(got) == 3 * 20000 and set(got) == {launch.JOINED_LINE}, [line for line in got if line != launch.JOINED_LINE][:3]
