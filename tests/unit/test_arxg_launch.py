"""arxg's cached launcher without a GPU: what reaches Triton's launcher on each call (a recording runner
stands in for the compiled kernel's; the GPU tier runs the real one)."""

from __future__ import annotations

import pytest
import torch

from arxtune.runtime.rdma.graph.gpu import HostPtr
from arxtune.runtime.rdma.graph.launch import Launch, address, is_aligned, names_in_order


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
    launch(a, b)
    launch(c, d)
    assert runner.calls == [((a.data_ptr(), b.data_ptr(), 0x7F0000001000, 7, 2.5, True), 11),
                            ((c.data_ptr(), d.data_ptr(), 0x7F0000001000, 7, 2.5, True), 12)]
    assert all(type(x) is not torch.Tensor for args, _ in runner.calls for x in args)  # no pointer query per call


def test_arguments_follow_the_kernels_signature_and_a_missing_one_is_named():
    class Kernel:
        arg_names = ["inp", "out", "n", "BLOCK"]

    assert names_in_order(Kernel, {"BLOCK": 1024, "n": 3, "out": "o", "inp": "i"}) == ["i", "o", 3, 1024]
    with pytest.raises(TypeError, match=r"Kernel: missing arguments \['out', 'n', 'BLOCK'\]"):
        names_in_order(Kernel, {"inp": 1})


def test_alignment_and_addresses():
    x = torch.zeros(64, dtype=torch.bfloat16)
    assert address(x) == x.data_ptr() and address(5) == 5
    assert is_aligned(x) and not is_aligned(x[1:])
