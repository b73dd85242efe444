"""arxg's proxy wait policy: poll for a window after the last step, then block (arxg_wait.h; the Python
loop's twin in proxy._Idle). The policy on a fake clock; the real proxies on the CPU: steps served while
it blocks, an eager call's wake, and the CPU a blocked proxy takes."""

from __future__ import annotations

import ctypes
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from arxtune.runtime import cudadrv
from arxtune.runtime.ops import expected_output, make_input, mismatch
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.graph import native
from arxtune.runtime.rdma.graph.proxy import _Idle, nap_ns
from arxtune.runtime.rdma.graph.segment import ASLEEP, WAKE
from arxtune.runtime.rdma.graph.session import open_local
from helpers.arxg_cpu_rank import CpuRank
from helpers.fake_cuda import FakeDriver

pytestmark = pytest.mark.timeout(180)
US = 1000


class Clock:
    def __init__(self):
        self.ns = 10**12

    def __call__(self) -> int:
        return self.ns


def test_the_python_loop_polls_through_the_window_then_naps_and_a_step_restarts_the_window():
    clock, naps, parent = Clock(), [], [100]
    beat = ctypes.c_int64(0)
    idle = _Idle(100, beat, 500 * US, 50 * US, clock=clock, sleep=naps.append, parent_pid=lambda: parent[0])

    def polls(n: int) -> list:
        for _ in range(n):
            assert idle() is False
        return naps

    assert polls(1024) == [] and beat.value == clock.ns  # inside the window: no nap, the heartbeat kept
    clock.ns += 499 * US
    assert polls(256) == []
    clock.ns += 2 * US
    assert polls(256) == [50e-6]  # past the window: a nap at the next clock reading (every 256th poll) ...
    assert polls(1) == [50e-6, 50e-6]  # ... and after each nap the very next poll reads the clock again
    idle.reset()  # a step was sent
    naps.clear()
    assert polls(2048) == []
    clock.ns += 600_000 * US
    parent[0] = 1  # re-parented: the rank is gone
    assert True in [idle() for _ in range(256)]  # said at the next clock reading


@pytest.mark.parametrize("idle, spin, nap", [(0, 0, 5), (10, 0, 5), (99, 100, 7), (100, 100, 7), (10**15, 10**12, 1)])
def test_the_c_loops_and_the_python_loop_decide_alike(idle, spin, nap):
    lib = native.open_loop(native.SOURCE, "the proxy's C loop")
    if lib is None:
        pytest.skip("no working C compiler here")
    lib.arxg_wait_nap.restype = ctypes.c_int64
    lib.arxg_wait_nap.argtypes = [ctypes.c_int64] * 3
    assert lib.arxg_wait_nap(idle, spin, nap) == nap_ns(idle, spin, nap)


def test_a_bad_policy_setting_is_refused_when_the_session_opens(monkeypatch):
    monkeypatch.setenv("ARXTUNE_ARXG_NAP_US", "0")
    with pytest.raises(RdmaUnavailable, match="ARXTUNE_ARXG_NAP_US from 1 to 1000000"):
        open_local(RdmaConfig(max_bytes=4096, timeout_s=5), 1)
    monkeypatch.setenv("ARXTUNE_ARXG_NAP_US", "soon")
    with pytest.raises(RdmaUnavailable, match="must be numbers of microseconds"):
        open_local(RdmaConfig(max_bytes=4096, timeout_s=5), 1)


@pytest.fixture(params=["c", "python"])
def blocking(request, monkeypatch):
    """Proxies that block right after each step (no window), napping 2 ms."""
    monkeypatch.setenv(native.ENV_SWITCH, "1" if request.param == "c" else "0")
    if request.param == "c" and native.load() is None:
        pytest.skip("no working C compiler here")
    monkeypatch.setenv("ARXTUNE_ARXG_SPIN_US", "0")
    monkeypatch.setenv("ARXTUNE_ARXG_NAP_US", "2000")
    sessions = open_local(RdmaConfig(max_bytes=64 << 10, timeout_s=20), 2)
    yield sessions
    for s in sessions:
        s.close()


def test_proxies_that_block_between_steps_still_serve_every_step_exactly(blocking):
    ranks = [CpuRank(s) for s in blocking]

    def work(r):
        outs = []
        for salt in range(20):
            inp = make_input("all_reduce", 1000, r, 2, torch.bfloat16, torch.device("cpu"), salt)
            out = torch.empty_like(inp)
            ranks[r].all_reduce(inp, out)
            outs.append(out)
            time.sleep(0.003 if salt % 2 else 0)  # some steps find the proxy blocked
        return outs

    with ThreadPoolExecutor(2) as pool:
        per_rank = [f.result(timeout=120) for f in [pool.submit(work, r) for r in range(2)]]
    for r, outs in enumerate(per_rank):
        for salt, out in enumerate(outs):
            assert mismatch(out, expected_output("all_reduce", 1000, r, 2, torch.bfloat16, salt)) is None


def _wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)
    return False


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.parametrize("blocking", ["c"], indirect=True)  # the Python loop sleeps its naps alike
def test_a_blocked_proxy_takes_little_cpu(blocking):
    seg = blocking[0].segment
    assert _wait_for(lambda: seg.control[ASLEEP] == 1, 5)
    pid = blocking[0].proxy.proc.pid
    before, t = _cpu_seconds(pid), time.monotonic()
    time.sleep(1.0)
    used = (_cpu_seconds(pid) - before) / (time.monotonic() - t)
    assert used < 0.3, f"a blocked proxy took {used:.0%} of a CPU"  # a polling one takes all it can get


def test_an_eager_calls_launch_wakes_a_blocked_c_proxy_which_then_polls_through_its_window(monkeypatch):
    monkeypatch.setenv(native.ENV_SWITCH, "1")
    if native.load() is None:
        pytest.skip("no working C compiler here")
    monkeypatch.setenv("ARXTUNE_ARXG_SPIN_US", "300000")  # 0.3 s window: asleep after that, polling once woken
    monkeypatch.setenv("ARXTUNE_ARXG_NAP_US", "1000000")
    (session,) = open_local(RdmaConfig(max_bytes=4096, timeout_s=20), 1)
    try:
        ctrl = session.segment.control
        assert _wait_for(lambda: ctrl[ASLEEP] == 1, 5), "the proxy never blocked after its window"
        woke = int(ctrl[WAKE])
        driver = FakeDriver([])
        address = session.segment.address
        launch = cudadrv.Launch(0xF, (1,), (32,), 0, [8], [0], wake=(address + 8 * ASLEEP, address + 8 * WAKE), entries=driver.entries)
        launch.launch(0x55)
        assert int(ctrl[WAKE]) == woke + 1 and driver.seen  # bumped, then launched
        time.sleep(0.05)  # a nap of up to 1 s, ended by the wake: the proxy polls again, its window restarted
        assert ctrl[ASLEEP] == 0
        assert _wait_for(lambda: ctrl[ASLEEP] == 1, 5)  # and blocks again once the window has passed
    finally:
        session.close()
