"""arxg without a GPU: segment layout, plans, proxies over the shared-memory fabric
with CPU stand-in ranks, and failures (a dead peer, a dead proxy, a dead parent)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from arxtune.runtime.ops import OP_SPECS, expected_output, make_input, mismatch
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.errors import RdmaError, RdmaTimeout
from arxtune.runtime.rdma.graph import native
from arxtune.runtime.rdma.graph import segment as seg_mod
from arxtune.runtime.rdma.graph.plan import Write, plan
from arxtune.runtime.rdma.graph.segment import Segment
from arxtune.runtime.rdma.graph.session import open_local
from helpers.arxg_cpu_rank import CpuRank
from arxtune.runtime.rdma.protocol import Layout

pytestmark = pytest.mark.timeout(180)


def test_control_words_sit_on_separate_cache_lines_and_before_the_buffer():
    groups = [seg_mod.DOORBELL, seg_mod.DESC, seg_mod.SENT, seg_mod.ERROR, seg_mod.READY, seg_mod.HEARTBEAT]
    lines = [g * 8 // 64 for g in groups]
    assert len(set(lines)) == len(lines)
    assert seg_mod.DESC + 2 * 2 <= seg_mod.SENT  # two slots' descriptors fit before SENT
    assert seg_mod.MESSAGE + seg_mod.MESSAGE_BYTES <= seg_mod.CONTROL_BYTES
    assert (max(seg_mod.READY, seg_mod.HEARTBEAT) + 1) * 8 <= seg_mod.MESSAGE
    assert seg_mod.DESC * 8 // 64 == (seg_mod.PARTS + 1) * 8 // 64  # the parts count shares the descriptor's line
    assert seg_mod.MESSAGE + seg_mod.MESSAGE_BYTES <= seg_mod.BELLS * 8
    assert (seg_mod.BELLS + seg_mod.MAX_PARTS) * 8 <= seg_mod.CONTROL_BYTES


def test_segment_maps_the_same_memory_and_refuses_a_different_layout(tmp_path):
    L = Layout(world=2, slots=2, slot_bytes=128)
    path = str(tmp_path / "seg")
    own = Segment(path, L, create=True)
    peer = Segment(path, L)
    peer.flags[L.flag_index(1, 1, 0)] = 7
    assert own.flags[L.flag_index(1, 1, 0)] == 7
    own.set_error(seg_mod.ERR_PROXY_FAILED, 1, 5, "bad completion")
    own.set_error(seg_mod.ERR_PEER_TIMEOUT, 0, 9, "a consequence")  # only the first failure is kept
    assert peer.error() == (seg_mod.ERR_PROXY_FAILED, 1, 5, "bad completion")
    with pytest.raises(ValueError, match="ranks disagree"):
        Segment(path, Layout(world=3, slots=2, slot_bytes=128))
    peer.close()
    own.close()
    assert not os.path.exists(path)


def test_plan_sends_whole_inputs_or_each_peer_its_piece():
    assert plan("all_reduce", 256, 1, 3) == [Write(2, 0, 256), Write(0, 0, 256)]
    assert plan("all_gather", 64, 0, 2) == [Write(1, 0, 64)]
    assert plan("reduce_scatter", 300, 2, 3) == [Write(0, 0, 100), Write(1, 100, 100)]
    assert plan("handshake", 0, 0, 2) == []
    with pytest.raises(ValueError):
        plan("reduce_scatter", 301, 0, 3)
    with pytest.raises(ValueError):
        plan("broadcast", 8, 0, 2)


def _run_all(ranks, fn):
    with ThreadPoolExecutor(len(ranks)) as pool:
        return [f.result(timeout=120) for f in [pool.submit(fn, r, rank) for r, rank in enumerate(ranks)]]


@pytest.fixture(params=["c", "python"])
def proxy_loop(request, monkeypatch):
    """Every shm test runs under both proxy loops: the compiled one and the Python one."""
    monkeypatch.setenv(native.ENV_SWITCH, "1" if request.param == "c" else "0")
    if request.param == "c" and native.load() is None:
        pytest.skip("no working C compiler here: the proxies would run their Python loop")
    return request.param


@pytest.fixture
def standins(request, proxy_loop):
    world = request.param
    sessions = open_local(RdmaConfig(max_bytes=64 << 10, timeout_s=20), world)
    ranks = [CpuRank(s) for s in sessions]
    yield ranks
    for s in sessions:
        s.close()


@pytest.mark.parametrize("standins", [2, 3], indirect=True)
def test_standin_ranks_over_the_shm_fabric_are_exact_for_every_op(standins):
    world = len(standins)
    cases = [(op, dtype, n) for op in OP_SPECS for dtype in (torch.bfloat16, torch.int32) for n in (1, 1000)]

    def work(r, rank):
        results = []
        for salt in range(3):  # consecutive calls reuse both slots
            for op, dtype, n in cases:
                inp = make_input(op, n, r, world, dtype, torch.device("cpu"), salt)
                out = torch.empty(OP_SPECS[op].shapes(n, world)[1], dtype=dtype)
                getattr(rank, op)(inp, out)
                results.append((op, dtype, n, salt, out))
        return results

    per_rank = _run_all(standins, work)
    for r, results in enumerate(per_rank):
        for op, dtype, n, salt, out in results:
            assert mismatch(out, expected_output(op, n, r, world, dtype, salt)) is None, (r, op, dtype, n, salt)


def test_a_dead_peer_becomes_an_error_naming_it_within_the_timeout(proxy_loop):
    sessions = open_local(RdmaConfig(max_bytes=4096, timeout_s=1.0), 2)
    try:
        ranks = [CpuRank(s) for s in sessions]
        x = torch.ones(16)
        _run_all(ranks, lambda r, rank: rank.all_reduce(x, torch.empty_like(x)))
        sessions[1].proxy.proc.send_signal(signal.SIGKILL)  # rank 1 stops sending
        start = time.monotonic()
        with pytest.raises(RdmaTimeout, match="rank 1 sent nothing") as info:
            ranks[0].all_reduce(x, torch.empty_like(x))
        assert time.monotonic() - start < 10
        assert info.value.peer == 1 and info.value.op == "all_reduce"
        with pytest.raises(RdmaError, match="proxy exited"):  # rank 1 learns that its own proxy died
            sessions[1].check()
    finally:
        for s in sessions:
            s.close()


def test_an_eager_calls_check_reads_the_proxys_heartbeat_not_the_process(proxy_loop, monkeypatch):
    """quick_check (every eager GPU call) asks the kernel about the proxy process only when its heartbeat
    is stale; a killed proxy's heartbeat goes stale and the full check names it; an error word is raised."""
    from arxtune.runtime.rdma.graph import session as session_mod

    sessions = open_local(RdmaConfig(max_bytes=4096, timeout_s=5.0), 2)
    try:
        s, ctrl = sessions[0], sessions[0].segment.control
        first = int(ctrl[seg_mod.HEARTBEAT])
        time.sleep(0.05)
        assert first > 0 and int(ctrl[seg_mod.HEARTBEAT]) > first  # the idle proxy keeps beating
        assert abs(time.monotonic_ns() - int(ctrl[seg_mod.HEARTBEAT])) < session_mod.HEARTBEAT_STALE_NS
        polls, real_poll = [], s.proxy.proc.poll
        monkeypatch.setattr(s.proxy.proc, "poll", lambda: polls.append(1) or real_poll())  # type: ignore[func-returns-value]
        calls = 200
        for _ in range(calls):
            s.quick_check()
            time.sleep(0.001)
        assert len(polls) <= calls // 4  # a loaded machine may stall the proxy past the limit now and then, not always
        os.kill(s.proxy.proc.pid, signal.SIGKILL)
        s.proxy.proc.wait(timeout=10)
        time.sleep(session_mod.HEARTBEAT_STALE_NS / 1e9 + 0.05)
        with pytest.raises(RdmaError, match="proxy exited"):
            s.quick_check()
        other = sessions[1]
        other.quick_check()
        other.segment.set_error(seg_mod.ERR_PEER_TIMEOUT, 0, 3)
        with pytest.raises(RdmaTimeout, match="rank 0 sent nothing for step 2"):
            other.quick_check()
    finally:
        for s in sessions:
            s.close()


def test_the_proxy_sends_a_step_only_once_every_part_has_rung(proxy_loop):
    """A GPU rank stages a step from several programs, each ringing its own bell: rank 0 plays them here."""
    sessions = open_local(RdmaConfig(max_bytes=4096, timeout_s=5.0), 2)
    try:
        own, peer, L = sessions[0].segment, sessions[1].segment, sessions[0].layout
        payload = torch.arange(256, dtype=torch.int32)
        own.typed(L.staging(0), 256, torch.int32).copy_(payload)
        ctrl = own.control
        ctrl[seg_mod.DESC], ctrl[seg_mod.DESC + 1], ctrl[seg_mod.PARTS] = seg_mod.OP_CODES["all_gather"], 1024, 3
        flag = L.flag_index(0, 0, 0)  # step 0 from rank 0, at rank 1

        def arrived(within: float) -> bool:
            deadline = time.monotonic() + within
            while time.monotonic() < deadline:
                if peer.flags[flag] == 1:
                    return True
                time.sleep(0.001)
            return False

        ctrl[seg_mod.DOORBELL] = 1  # part 0
        assert not arrived(0.3) and ctrl[seg_mod.SENT] == 0
        ctrl[seg_mod.BELLS + 2] = 1  # part 2; part 1 still staging
        assert not arrived(0.3) and ctrl[seg_mod.SENT] == 0
        ctrl[seg_mod.BELLS + 1] = 1
        assert arrived(5.0)
        where, offset = sessions[1].source(0, 0, "all_gather", 1024)
        assert torch.equal(where.typed(offset, 256, torch.int32), payload)
        sessions[0].check()
    finally:
        for s in sessions:
            s.close()


_PARENT = """
import sys, time
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.graph.session import open_local
s = open_local(RdmaConfig(max_bytes=4096), 1)[0]
print(s.proxy.proc.pid, s.segment.path, flush=True)
time.sleep(600)
"""


def test_the_proxy_exits_when_its_parent_dies(proxy_loop):
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    )
    try:
        pid, path = parent.stdout.readline().split()
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 30  # it checks every 0.5 s while idle; slack for a loaded machine
        while _alive(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(int(pid)), "the proxy outlived its parent"
    finally:
        parent.kill()
        if "path" in locals() and os.path.exists(path):
            os.unlink(path)  # a killed parent cannot remove its segment


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_c_loop_builds_once_and_a_missing_compiler_falls_back_to_python(tmp_path, monkeypatch, capsys):
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(native.ENV_SWITCH, "1")
    built = native.build()
    assert built.parent == tmp_path / "arxtune" and native.load() is not None
    assert native.build() == built and len(list(built.parent.iterdir())) == 1  # cached, no temporary left
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert native.load() is None
    assert "using the Python loop" in capsys.readouterr().err
