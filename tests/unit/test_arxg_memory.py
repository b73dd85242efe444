"""arxg's memory mode from what the device says (memory.choose), as doctor reports it: only the attribute
reader is replaced, by the attributes public reports give for each machine."""

from __future__ import annotations

import pytest

import torch

from arxtune.harness import doctor
from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.graph.memory import ATTRIBUTES, DeviceMemory, MemoryChoice, choose, memory_line

#: GB10: integrated, coherent NVLink-C2C, reads through the host's page tables; cudaHostRegister unsupported
GB10 = DeviceMemory(
    integrated=1,
    can_map_host_memory=1,
    pageable_memory_access=1,
    host_pointer_for_registered=1,
    host_register_supported=0,
    host_page_tables=1,
)
#: a PCIe H100 on an x86 host without HMM
H100 = DeviceMemory(can_map_host_memory=1, host_pointer_for_registered=1, host_register_supported=1)
#: the same with an HMM-capable driver: pageable access by page faults, not host page tables
H100_HMM = DeviceMemory(can_map_host_memory=1, pageable_memory_access=1, host_pointer_for_registered=1, host_register_supported=1)
#: Grace Hopper: discrete but coherent, both ways work
GH200 = DeviceMemory(
    can_map_host_memory=1, pageable_memory_access=1, host_pointer_for_registered=1, host_register_supported=1, host_page_tables=1
)
NOTHING = DeviceMemory()


@pytest.mark.parametrize(
    "attrs,mode,reason",
    [
        (GB10, "direct", "pageable memory access with host page tables"),
        (GH200, "direct", "pageable memory access with host page tables"),
        (H100, "registered", "cudaHostRegister: the device maps pinned host memory at the host's addresses"),
        (H100_HMM, "registered", "cudaHostRegister: the device maps pinned host memory at the host's addresses"),
        (
            DeviceMemory(pageable_memory_access=1),
            "direct",
            "pageable memory access through HMM, without the host's page tables; the device does not support cudaHostRegister",
        ),
    ],
)
def test_auto_picks_the_mode_the_device_supports_and_says_why(attrs, mode, reason):
    assert choose(attrs) == MemoryChoice(mode, reason)
    assert str(choose(attrs)) == f"{mode} ({reason})"


def test_a_forced_mode_runs_where_the_device_allows_it():
    assert choose(H100_HMM, "direct") == MemoryChoice(
        "direct", "pageable memory access through HMM, without the host's page tables, forced"
    )
    assert choose(GH200, "registered") == MemoryChoice("registered", "cudaHostRegister, forced")
    assert choose(GB10, "direct").mode == "direct"


@pytest.mark.parametrize(
    "attrs,wanted,why",
    [
        (GB10, "registered", "memory = 'registered' cannot work: the device does not support cudaHostRegister (an integrated GPU)"),
        (H100, "direct", "memory = 'direct' cannot work: the device has no pageable memory access"),
        (
            DeviceMemory(host_register_supported=1, can_map_host_memory=1),
            "registered",
            "the device cannot use the host's address for registered memory",
        ),
        (DeviceMemory(host_register_supported=1, host_pointer_for_registered=1), "registered", "cannot map host memory"),
        (
            NOTHING,
            "auto",
            "the GPU cannot reach host memory here: the device does not support cudaHostRegister, "
            "and the device has no pageable memory access",
        ),
        (GB10, "pinned", "unknown memory mode 'pinned'; use one of auto, registered, direct"),
    ],
)
def test_no_workable_mode_is_one_line_saying_why(attrs, wanted, why):
    with pytest.raises(RdmaUnavailable, match="^arxg: ") as info:
        choose(attrs, wanted)
    assert why in str(info.value) and "\n" not in str(info.value)


def test_attribute_numbers_are_cudas():
    """CUdevice_attribute values from cuda.h (checked against the header Triton bundles, where present)."""
    assert ATTRIBUTES == {
        "integrated": 18,
        "can_map_host_memory": 19,
        "pageable_memory_access": 88,
        "host_pointer_for_registered": 91,
        "host_register_supported": 99,
        "host_page_tables": 100,
    }
    header = None
    try:
        import triton
        from pathlib import Path

        header = Path(triton.__file__).parent / "backends" / "nvidia" / "include" / "cuda.h"
    except ImportError:
        pass
    if header is None or not header.exists():
        pytest.skip("no cuda.h here to compare with")
    text = header.read_text(errors="replace")
    names = {
        "integrated": "INTEGRATED",
        "can_map_host_memory": "CAN_MAP_HOST_MEMORY",
        "pageable_memory_access": "PAGEABLE_MEMORY_ACCESS",
        "host_pointer_for_registered": "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM",
        "host_register_supported": "HOST_REGISTER_SUPPORTED",
        "host_page_tables": "PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES",
    }
    for key, name in names.items():
        assert f"CU_DEVICE_ATTRIBUTE_{name} = {ATTRIBUTES[key]}," in text, name


def test_doctor_names_the_mode_on_a_gpu_and_says_not_applicable_without_one(monkeypatch, tmp_path):
    from arxtune.runtime.rdma.graph.abi import KernelImage

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert doctor.arxg_rows() == [("arxg memory", "not applicable: no CUDA GPU (arxg runs CUDA tensors)")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (12, 1))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ARXTUNE_ARXG_KERNELS", raising=False)

    def build(variant, capability, source):
        return KernelImage("handshake_kernel", variant.name, "sm_121a", source, "3.9.0", 1, 0, (("ctrl", "*i64"),), (8,))

    rows = dict(doctor.arxg_rows(reader=lambda i: GB10, build=build))
    assert rows["arxg memory"] == "direct (pageable memory access with host page tables)"
    assert rows["arxg kernels"] == "sm_121a: built here by Triton 3.9.0"
    rows = dict(doctor.arxg_rows(reader=lambda i: GB10, build=build))  # the second time, from the cache
    assert rows["arxg kernels"] == f"sm_121a: the build in {tmp_path / 'arxtune' / 'arxg-kernels'}, made by Triton 3.9.0"
    assert memory_line(0, reader=lambda i: NOTHING).startswith("unavailable: arxg: the GPU cannot reach host memory")
