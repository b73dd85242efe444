"""A Triton driver for a GPU that is not there: kernels really compile (for sm_90a, ptxas included), loading is
faked and launches are recorded (or dropped). Lets the cached launch be compared with Triton's own path, and
timed on the host, without a GPU."""

from __future__ import annotations

import contextlib
import gc


class FakeDriver:
    """An H100 that is not there; its launcher keeps every launch's arguments in `Launcher.calls`."""

    class Launcher:
        calls: list = []

        def __init__(self, src, metadata):
            pass

        def __call__(self, *args):
            type(self).calls.append(args)

    class Utils:
        @staticmethod
        def load_binary(name, kernel, shared, device):
            return 1, 2, 32, 0, 1024  # module, function, registers, spills, max threads

        @staticmethod
        def get_device_properties(device):
            return {"max_shared_mem": 228 << 10, "multiprocessor_count": 132}

        @staticmethod
        def unload_module(module):
            pass

    def __init__(self):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32)
        self.launcher_cls, self.utils = self.Launcher, self.Utils()

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 4242

    def get_current_target(self):
        return self.target


@contextlib.contextmanager
def fake_triton_driver(*kernels, record: bool = True):
    """Make FakeDriver Triton's active driver (and launch.py's device/stream lookups harmless) inside the block;
    `record=False` drops the launches (for timing). On the way out, `kernels` forget what they compiled here, and
    whatever the caller still holds of it must be gone too: a kernel "loaded" on the fake device must unload
    from it, not from the real driver."""
    from triton.runtime.driver import driver

    from arxtune.runtime.rdma.graph import launch as launch_mod

    fake = FakeDriver()
    fake.Launcher.calls = [] if record else _Discard()
    saved = (driver._active, launch_mod.torch.cuda.device, launch_mod.current_stream)
    driver._active = fake
    launch_mod.torch.cuda.device = lambda index: contextlib.nullcontext()
    launch_mod.current_stream = lambda index: 4242
    try:
        yield fake
    finally:
        for kernel in kernels:
            kernel.device_caches.clear()
        gc.collect()
        driver._active, launch_mod.torch.cuda.device, launch_mod.current_stream = saved


class _Discard(list):
    def append(self, item) -> None:
        pass
