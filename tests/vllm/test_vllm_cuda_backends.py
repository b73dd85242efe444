"""vLLM's CUDA communicators as backends: what can be checked without a GPU.

The classes they adapt must exist in the pinned vLLM with the arguments the
adapters pass, and on CPU tensors each is recorded unavailable with a reason.
Their GPU path needs vLLM on a CUDA machine (not available to this tier).
"""

import importlib
import inspect

import pytest
import torch

from arxtune.runtime.backends import BackendUnavailable, GroupContext, backend_class

ADAPTERS = {
    "vllm_pynccl": ("vllm.distributed.device_communicators.pynccl", "PyNcclCommunicator", {"group", "device"}),
    "vllm_custom_ar": ("vllm.distributed.device_communicators.custom_all_reduce", "CustomAllreduce", {"group", "device"}),
    "vllm_symm_mem": ("vllm.distributed.device_communicators.symm_mem", "SymmMemCommunicator", {"group", "device", "force_multimem"}),
}


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_adapted_vllm_class_takes_the_arguments_passed(name):
    module, cls, params = ADAPTERS[name]
    target = getattr(importlib.import_module(module), cls)
    assert params <= set(inspect.signature(target.__init__).parameters)
    assert backend_class(name).vllm_class == cls  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_cpu_tensors_are_refused_with_a_reason(name):
    ctx = GroupContext(0, 2, 0, torch.device("cpu"), cpu_group=None)
    with pytest.raises(BackendUnavailable, match="needs CUDA tensors"):
        backend_class(name)(ctx)
