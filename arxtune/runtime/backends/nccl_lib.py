"""NCCL's C library through ctypes: the entry points, structures and constants the nccl backend calls.

Kept apart from the backend (nccl.py) as vLLM keeps pynccl_wrapper apart from
pynccl: which libnccl is loaded, with which signatures, and how its variables
are set around one communicator's creation.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os

import torch

from arxtune.runtime import env
from arxtune.runtime.backends.base import BackendUnavailable

ENV_LIBRARY = env.NCCL_LIBRARY.name
#: ncclDataType_t and ncclRedOp_t values from nccl.h (stable since NCCL 2.10).
DTYPES = {
    torch.int8: 0,
    torch.uint8: 1,
    torch.int32: 2,
    torch.int64: 4,
    torch.float16: 6,
    torch.float32: 7,
    torch.float64: 8,
    torch.bfloat16: 9,
}
SUM = 0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


#: NCCL_CONFIG_UNDEF_INT: a field of ncclConfig_t that NCCL fills with its default.
CONFIG_UNDEF = -(2**31)


class CommConfig(ctypes.Structure):
    """The leading fields of ncclConfig_t (nccl.h, NCCL 2.17 on). NCCL copies `size` bytes of it over
    its defaults, so fields after these keep NCCL's defaults; `version` 2.17.0 says these are set."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("blocking", ctypes.c_int),
        ("cgaClusterSize", ctypes.c_int),
        ("minCTAs", ctypes.c_int),
        ("maxCTAs", ctypes.c_int),
        ("netName", ctypes.c_char_p),
    ]

    @classmethod
    def with_channels(cls, channels: int) -> "CommConfig":
        """NCCL's defaults but exactly `channels` channels (CTAs)."""
        return cls(ctypes.sizeof(cls), 0xCAFEBEEF, 21700, CONFIG_UNDEF, CONFIG_UNDEF, channels, channels, None)


@contextlib.contextmanager
def nccl_environment(values: dict[str, str]):
    """Set NCCL variables only around the creation of one communicator, then put back what was there.

    NCCL reads NCCL_PROTO and NCCL_ALGO with getenv, uncached, each time it
    creates a communicator of two ranks or more (ncclTopoTuneModel, on the
    calling thread of a blocking ncclCommInitRank; NCCL 2.21 to 2.29) and never
    again for that communicator, so a variant's settings hold for its
    communicator alone and other backends of the process keep theirs. A
    one-rank communicator never reads them (its collectives are copies).
    Channel counts do not go this way: NCCL reads NCCL_MIN/MAX_NCHANNELS once
    per process, so they go through ncclConfig_t (CommConfig). Variables the
    user set are restored.
    """
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _candidates() -> list[str]:
    """The library torch loaded (found by soname once it is in the process), then the pip wheel's copy."""
    found = [env.NCCL_LIBRARY.get()] if env.NCCL_LIBRARY.is_set() else []
    found.append("libnccl.so.2")
    site = os.path.dirname(os.path.dirname(torch.__file__))
    return found + sorted(glob.glob(os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so*")))


class NcclLibrary:
    """The few NCCL entry points a backend needs, with their C signatures."""

    def __init__(self) -> None:
        errors = []
        for path in _candidates():
            try:
                self.lib = ctypes.CDLL(path)
                break
            except OSError as exc:
                errors.append(f"{path}: {exc}")
        else:
            raise BackendUnavailable(f"cannot load libnccl ({'; '.join(errors)}); set {ENV_LIBRARY}=/path/to/libnccl.so.2")
        vp, sz, i, comm = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
        self._sig("ncclGetVersion", [ctypes.POINTER(ctypes.c_int)])
        self._sig("ncclGetUniqueId", [ctypes.POINTER(UniqueId)])
        self._sig("ncclCommInitRank", [ctypes.POINTER(comm), i, UniqueId, i])
        self.has_config = hasattr(self.lib, "ncclCommInitRankConfig")  # NCCL 2.14 on
        if self.has_config:
            self._sig("ncclCommInitRankConfig", [ctypes.POINTER(comm), i, UniqueId, i, ctypes.POINTER(CommConfig)])
        self._sig("ncclCommDestroy", [comm])
        self._sig("ncclAllReduce", [vp, vp, sz, i, i, comm, vp])
        self._sig("ncclAllGather", [vp, vp, sz, i, comm, vp])
        self._sig("ncclReduceScatter", [vp, vp, sz, i, i, comm, vp])
        self.lib.ncclGetErrorString.restype = ctypes.c_char_p
        self.lib.ncclGetErrorString.argtypes = [i]

    def version(self) -> int:
        """NCCL's version code (2.28.9 -> 22809)."""
        code = ctypes.c_int()
        self.check(self.lib.ncclGetVersion(ctypes.byref(code)), "ncclGetVersion")
        return code.value

    def path(self) -> str | None:
        """The file the library was loaded from, as the process maps it (Linux), else None."""
        try:
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "libnccl" in line and "/" in line}
        except OSError:
            return None
        return paths.pop() if len(paths) == 1 else None

    def _sig(self, name: str, argtypes: list) -> None:
        fn = getattr(self.lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, argtypes

    def check(self, rc: int, what: str) -> None:
        if rc:
            raise RuntimeError(f"{what} failed: NCCL error {rc} ({self.lib.ncclGetErrorString(rc).decode()})")
