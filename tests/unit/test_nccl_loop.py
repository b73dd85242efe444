"""nccl's C launch loop, driven with C-callable stand-ins for NCCL's entry points (no GPU needed)."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from arxtune.runtime.backends import nccl

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler here")

vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
REDUCING = ctypes.CFUNCTYPE(i, vp, vp, sz, i, i, vp, vp)
PLAIN = ctypes.CFUNCTYPE(i, vp, vp, sz, i, vp, vp)
RECORD = ctypes.CFUNCTYPE(i, vp, vp)


@pytest.fixture
def loop(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(nccl.ENV_LOOP, raising=False)
    nccl.launch_loop.cache_clear()
    fn, where = nccl.launch_loop()
    assert where == "c" and fn is not None
    yield fn
    nccl.launch_loop.cache_clear()


def _pairs(n):
    return (vp * n)(*[0x1000 * (k + 1) for k in range(n)]), (vp * n)(*[0x9000 * (k + 1) for k in range(n)])


def test_the_loop_calls_a_reducing_entry_on_each_pair_in_turn_with_every_argument(loop):
    seen = []

    def entry(send, recv, count, dtype, op, comm, stream):
        seen.append((send, recv, count, dtype, op, comm, stream))
        return 0

    cb = REDUCING(entry)
    send, recv = _pairs(3)
    assert loop(ctypes.cast(cb, vp), 1, send, recv, 3, 4096, 9, 0, 0x77, 0x55, 7, None, None, None, None, None) == 0
    assert seen == [(0x1000 * (k % 3 + 1), 0x9000 * (k % 3 + 1), 4096, 9, 0, 0x77, 0x55) for k in range(7)]


def test_the_loop_calls_a_gathering_entry_without_a_reduction_and_stops_at_the_first_error(loop):
    seen = []

    def entry(send, recv, count, dtype, comm, stream):
        seen.append((send, count, dtype, comm, stream))
        return 3 if len(seen) == 2 else 0  # ncclInternalError on the second call

    cb = PLAIN(entry)
    send, recv = _pairs(2)
    assert loop(ctypes.cast(cb, vp), 0, send, recv, 2, 16, 7, 0, 0x77, 0x55, 20, None, None, None, None, None) == 3
    assert seen == [(0x1000, 16, 7, 0x77, 0x55), (0x2000, 16, 7, 0x77, 0x55)]


def test_the_loop_records_its_events_on_the_stream_right_around_its_launches(loop):
    seen = []

    def entry(send, recv, count, dtype, comm, stream):
        seen.append(("launch", send))
        return 0

    def record(event, stream):
        seen.append(("record", event, stream))  # type: ignore[arg-type]
        return 0

    cb, rec = PLAIN(entry), RECORD(record)
    send, recv = _pairs(2)
    assert loop(ctypes.cast(cb, vp), 0, send, recv, 2, 16, 7, 0, 0x77, 0x55, 3, ctypes.cast(rec, vp), 0xE1, 0xE2, None, None) == 0
    assert seen == [("record", 0xE1, 0x55), ("launch", 0x1000), ("launch", 0x2000), ("launch", 0x1000), ("record", 0xE2, 0x55)]


def test_a_failed_record_comes_back_as_minus_its_cuda_error_and_nothing_is_launched_after_it(loop):
    launches = []

    def entry(send, recv, count, dtype, comm, stream):
        launches.append(send)
        return 0

    cb, rec = PLAIN(entry), RECORD(lambda event, stream: 700 if event == 0xE1 else 0)  # cudaErrorIllegalAddress
    send, recv = _pairs(1)
    assert loop(ctypes.cast(cb, vp), 0, send, recv, 1, 16, 7, 0, 0x77, 0x55, 3, ctypes.cast(rec, vp), 0xE1, 0xE2, None, None) == -700
    assert launches == []


def test_the_decode_views_busy_kernel_is_launched_from_c_before_each_call_on_the_same_stream(loop):
    """`before` is cuda_launch.c's arxtune_launch with the busy kernel's packed launch, its cuLaunchKernel a
    stand-in: the order on the stream is busy, call, busy, call, ..."""
    from arxtune.runtime import cudadrv
    from helpers.fake_cuda import FakeDriver

    seen = []
    driver = FakeDriver(seen)

    def entry(send, recv, count, dtype, comm, stream):
        seen.append(("nccl", send, stream))
        return 0

    busy = cudadrv.Launch(0xB05, (1,), (1,), 0, [8], [50_000], entries=driver.entries)
    before = ctypes.cast(cudadrv.c_entry("arxtune_launch"), vp)
    cb = PLAIN(entry)
    send, recv = _pairs(2)
    assert loop(ctypes.cast(cb, vp), 0, send, recv, 2, 16, 7, 0, 0x77, 0x55, 3, None, None, None, before, busy.address) == 0
    assert seen == [
        ("launch", 0xB05, 0x55, (50_000,)),
        ("nccl", 0x1000, 0x55),
        ("launch", 0xB05, 0x55, (50_000,)),
        ("nccl", 0x2000, 0x55),
        ("launch", 0xB05, 0x55, (50_000,)),
        ("nccl", 0x1000, 0x55),
    ]
    driver.fail_with = 719  # CUDA_ERROR_LAUNCH_FAILED: the loop stops and says so
    assert loop(ctypes.cast(cb, vp), 0, send, recv, 2, 16, 7, 0, 0x77, 0x55, 3, None, None, None, before, busy.address) == -719


def test_asking_for_the_python_loop_or_having_no_compiler_says_so(tmp_path, monkeypatch, capsys):
    nccl.launch_loop.cache_clear()
    monkeypatch.setenv(nccl.ENV_LOOP, "python")
    assert nccl.launch_loop() == (None, f"python ({nccl.ENV_LOOP}=python)")
    nccl.launch_loop.cache_clear()
    monkeypatch.delenv(nccl.ENV_LOOP)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    fn, where = nccl.launch_loop()
    nccl.launch_loop.cache_clear()
    assert fn is None and where.startswith("python (no C loop:")
    assert "eager calls launch from Python" in capsys.readouterr().err
