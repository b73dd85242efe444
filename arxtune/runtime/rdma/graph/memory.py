"""How the GPU reaches the shared segments, chosen from what the device says.

- ``registered``: cudaHostRegister maps the segment for the device at the host's
  addresses (discrete GPUs on PCIe: pinned, the device reads over the bus).
- ``direct``: nothing is registered; the kernels use the host addresses and the
  device reads pageable memory itself. With host page tables (GB10's and
  Grace's coherent NVLink-C2C) that is the native path; GB10 refuses
  cudaHostRegister outright. Through HMM (x86 hosts with an HMM-capable driver)
  the driver serves the device's accesses by faulting pages: it works, it is not
  chosen by default.

No third mode: pinned allocations (cudaHostAlloc), which GB10 also serves, cannot
be the segments, which are files in /dev/shm that the proxy process and the
peers map too.

`read_attributes` is the only part that talks to CUDA (the driver API, through
ctypes); `choose` is a pure function of its result, so tests replace the reader.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

from arxtune.runtime.rdma.errors import RdmaUnavailable

MODES = ("auto", "registered", "direct")

#: CUdevice_attribute numbers (cuda.h; the runtime's cudaDevAttr* have the same values)
ATTRIBUTES = {
    "integrated": 18,  # CU_DEVICE_ATTRIBUTE_INTEGRATED
    "can_map_host_memory": 19,  # CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
    "pageable_memory_access": 88,  # CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS
    "host_pointer_for_registered": 91,  # CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
    "host_register_supported": 99,  # CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED
    "host_page_tables": 100,  # CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES
}


@dataclass(frozen=True)
class DeviceMemory:
    """What the device says about reaching host memory (each attribute 0 or 1)."""

    integrated: int = 0
    can_map_host_memory: int = 0
    pageable_memory_access: int = 0
    host_pointer_for_registered: int = 0
    host_register_supported: int = 0
    host_page_tables: int = 0

    def describe(self) -> str:
        return ", ".join(f"{name} {getattr(self, name)}" for name in ATTRIBUTES)


@dataclass(frozen=True)
class MemoryChoice:
    mode: str  # "registered" or "direct"
    reason: str

    def __str__(self) -> str:
        return f"{self.mode} ({self.reason})"


def _registered(a: DeviceMemory) -> str | None:
    """Why registration cannot serve the kernels here, or None."""
    if not a.host_register_supported:
        return "the device does not support cudaHostRegister"
    if not a.can_map_host_memory:
        return "the device cannot map host memory"
    if not a.host_pointer_for_registered:
        return "the device cannot use the host's address for registered memory"
    return None


def _direct(a: DeviceMemory) -> str | None:
    """Why the device cannot read the segments as they are, or None."""
    return None if a.pageable_memory_access else "the device has no pageable memory access"


def _direct_reason(a: DeviceMemory) -> str:
    if a.host_page_tables:
        return "pageable memory access with host page tables"
    return "pageable memory access through HMM, without the host's page tables"


def choose(attrs: DeviceMemory, wanted: str = "auto") -> MemoryChoice:
    """The mode for `wanted` ("auto", "registered", "direct"); RdmaUnavailable names why none works.

    auto: direct where the device reads through the host's page tables (coherent
    memory: nothing to register), else registered, else direct through HMM."""
    if wanted not in MODES:
        raise RdmaUnavailable(f"arxg: unknown memory mode {wanted!r}; use one of {', '.join(MODES)}")
    no_register, no_direct = _registered(attrs), _direct(attrs)
    integrated = " (an integrated GPU)" if attrs.integrated else ""
    if wanted == "registered":
        if no_register:
            raise RdmaUnavailable(f"arxg: memory = 'registered' cannot work: {no_register}{integrated}")
        return MemoryChoice("registered", "cudaHostRegister, forced")
    if wanted == "direct":
        if no_direct:
            raise RdmaUnavailable(f"arxg: memory = 'direct' cannot work: {no_direct}")
        return MemoryChoice("direct", f"{_direct_reason(attrs)}, forced")
    if not no_direct and attrs.host_page_tables:
        return MemoryChoice("direct", _direct_reason(attrs))
    if not no_register:
        return MemoryChoice("registered", "cudaHostRegister: the device maps pinned host memory at the host's addresses")
    if not no_direct:
        return MemoryChoice("direct", f"{_direct_reason(attrs)}; {no_register}")
    raise RdmaUnavailable(f"arxg: the GPU cannot reach host memory here: {no_register}{integrated}, and {no_direct}")


def _libcuda():
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        return ctypes.CDLL(name)
    except OSError:
        return ctypes.CDLL("libcuda.so.1")


def read_attributes(ordinal: int) -> DeviceMemory:
    """The device's attributes through the driver API (cuDeviceGetAttribute). RdmaUnavailable if it cannot say."""
    try:
        cuda = _libcuda()
    except OSError as exc:
        raise RdmaUnavailable(f"arxg: cannot load the CUDA driver library to read device attributes ({exc})") from None
    dev, value = ctypes.c_int(), ctypes.c_int()
    for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), ordinal))):
        rc = getattr(cuda, call)(*args)
        if rc:
            raise RdmaUnavailable(f"arxg: {call} failed (CUresult {rc}) reading device {ordinal}'s attributes")
    found = {}
    for name, number in ATTRIBUTES.items():
        rc = cuda.cuDeviceGetAttribute(ctypes.byref(value), number, dev)
        found[name] = int(value.value) if rc == 0 else 0  # an attribute this driver does not know: the device lacks it
    return DeviceMemory(**found)


def memory_line(ordinal: int, wanted: str = "auto", reader=read_attributes) -> str:
    """What doctor says: "direct (pageable memory access with host page tables)", or why nothing works."""
    try:
        return str(choose(reader(ordinal), wanted))
    except RdmaUnavailable as exc:
        return f"unavailable: {exc}"
