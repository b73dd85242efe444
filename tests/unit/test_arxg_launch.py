"""arxg's cached launcher without a GPU: what reaches Triton's launcher on each call (a recording runner
stands in for the compiled kernel's; the GPU tier runs the real one)."""

from __future__ import annotations

import pytest
import torch

from arxtune.runtime.rdma.graph.gpu import HostPtr
from arxtune.runtime.rdma.graph.launch import Launch, address, names_in_order


class Recording:
    def __init__(self):
        self.calls = []

    def __call__(self, *args, stream=None):
        self.calls.append((args, stream))


def test_each_call_passes_the_built_arguments_with_only_the_tensors_replaced_by_their_addresses():
    a, b, c, d = (torch.zeros(8) for _ in range(4))
    host = HostPtr(0x7F0000001000, torch.int64)
    runner, streams = Recording(), iter([11, 12])
    launch = Launch(runner, [a, b, host, 7, 2.5, True], (0, 1), lambda: next(streams))
    launch(a.data_ptr(), b.data_ptr())
    launch(c.data_ptr(), d.data_ptr())
    assert runner.calls == [((a.data_ptr(), b.data_ptr(), 0x7F0000001000, 7, 2.5, True), 11),
                            ((c.data_ptr(), d.data_ptr(), 0x7F0000001000, 7, 2.5, True), 12)]
    assert all(type(x) is not torch.Tensor for args, _ in runner.calls for x in args)  # no pointer query per call


def test_arguments_follow_the_kernels_signature_and_a_missing_one_is_named():
    class Kernel:
        arg_names = ["inp", "out", "n", "BLOCK"]

    assert names_in_order(Kernel, {"BLOCK": 1024, "n": 3, "out": "o", "inp": "i"}) == ["i", "o", 3, 1024]
    with pytest.raises(TypeError, match=r"Kernel: missing arguments \['out', 'n', 'BLOCK'\]"):
        names_in_order(Kernel, {"inp": 1})


def test_addresses():
    x = torch.zeros(64, dtype=torch.bfloat16)
    assert address(x) == x.data_ptr() and address(5) == 5


def _compiled_pair(kernel, tmp_path, monkeypatch):
    """The real collective kernel's arguments, and two fresh tensors for a second call."""
    from arxtune.runtime.rdma.graph import kernels

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # today's default, said out loud (Triton 3.9 warns otherwise)
    n, world = 8192, 2
    inp, out, inp2, out2 = (torch.zeros(n, dtype=torch.bfloat16) for _ in range(4))
    named = dict(inp=inp, out=out, staging=HostPtr(0x7F0000002000, torch.bfloat16), sources=torch.zeros(48, dtype=torch.int64),
                 flags=HostPtr(0x7F0000100000, torch.int64), ctrl=HostPtr(0x7F0000001000, torch.int64),
                 counter=torch.zeros(4, dtype=torch.int64), rank=1, n_stage=n, n_part=n, slot_elems=1 << 19,
                 nbytes=2 * n, ndev_used=1, op_code=0, timeout_ns=20_000_000_000, OP=0, WORLD=world, NDEV=1,
                 INT_ACC=False, BLOCK=kernels.BLOCK)
    return names_in_order(kernel, named), inp2, out2


#: the launcher's leading fields: grid x3, stream, function, packed metadata, launch metadata, enter and exit hooks
LEAD, META, ENTER, EXIT = 9, 6, 7, 8


def test_the_cached_launch_passes_what_tritons_own_path_passes_without_the_hooks_nobody_attached(monkeypatch, tmp_path):
    """The real collective kernel, compiled by this Triton: one call through `kernel[grid](...)` and one through
    Launch reach the launcher with the same grid, stream, function and arguments (pointers as addresses); with no
    launch hook attached the cached call hands the launcher no launch metadata and no hooks to call."""
    from arxtune.runtime.rdma.graph import kernels
    from helpers.fake_triton import fake_triton_driver

    kernel = kernels.collective_kernel
    with fake_triton_driver(kernel) as fake:
        args, inp2, out2 = _compiled_pair(kernel, tmp_path, monkeypatch)
        grid = (8,)
        kernel[grid](*args, num_warps=kernels.NUM_WARPS)
        cached = Launch.compile(kernel, grid, args, (kernel.arg_names.index("inp"), kernel.arg_names.index("out")),
                                torch.device("cuda", 0), num_warps=kernels.NUM_WARPS)
        cached(inp2.data_ptr(), out2.data_ptr())
        triton_call, cached_call = fake.Launcher.calls
        assert len(triton_call) == len(cached_call)
        expected = [address(a) for a in triton_call]
        expected[LEAD + kernel.arg_names.index("inp")] = inp2.data_ptr()
        expected[LEAD + kernel.arg_names.index("out")] = out2.data_ptr()
        assert list(cached_call[:5]) == [8, 1, 1, 4242, 2]
        assert cached_call[META] is None and cached_call[ENTER] is None and cached_call[EXIT] is None
        skip = (META, ENTER, EXIT)
        assert [a for i, a in enumerate(cached_call) if i not in skip] == [a for i, a in enumerate(expected) if i not in skip]
        del cached  # its compiled kernel unloads from the fake device, inside the block


def test_a_launch_hook_attached_after_compiling_sees_every_cached_launch(monkeypatch, tmp_path):
    """A profiler may attach Triton's launch hook at any time: from then on the cached launch takes the compiled
    kernel's own runner, which builds the launch metadata and hands the hooks over."""
    from triton import knobs

    from arxtune.runtime.rdma.graph import kernels
    from helpers.fake_triton import fake_triton_driver

    kernel = kernels.collective_kernel
    hooks = knobs.runtime
    if not hasattr(hooks.launch_enter_hook, "add"):
        pytest.skip(f"this Triton's launch hooks are plain attributes, not chains: {type(hooks.launch_enter_hook)}")
    seen = []
    with fake_triton_driver(kernel) as fake:
        args, inp2, out2 = _compiled_pair(kernel, tmp_path, monkeypatch)
        cached = Launch.compile(kernel, (8,), args, (0, 1), torch.device("cuda", 0), num_warps=kernels.NUM_WARPS)
        hooks.launch_enter_hook.add(seen.append)
        try:
            cached(inp2.data_ptr(), out2.data_ptr())
        finally:
            hooks.launch_enter_hook.remove(seen.append)
        cached(inp2.data_ptr(), out2.data_ptr())
        hooked, plain = fake.Launcher.calls
        assert hooked[META] is not None and hooked[ENTER] is hooks.launch_enter_hook
        assert plain[META] is None and plain[ENTER] is None
        assert hooked[LEAD:] == plain[LEAD:]
        del cached
