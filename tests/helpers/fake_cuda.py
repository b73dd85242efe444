"""C-callable stand-ins for the CUDA driver's cuLaunchKernel and cuCtxSetCurrent, for driving
runtime/cuda_launch.c without a GPU: each launch is recorded as ("launch", function, stream, argument values)."""

from __future__ import annotations

import ctypes

vp, u = ctypes.c_void_p, ctypes.c_uint
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, vp, u, u, u, u, u, u, u, vp, ctypes.POINTER(vp), vp)
SET_CTX = ctypes.CFUNCTYPE(ctypes.c_int, vp)


class FakeDriver:
    """`sizes[function]` gives the bytes of each parameter to read back (default one of 8 bytes);
    `fail_with` makes every launch return that error; `grids` keeps (grid, block, shared) per launch."""

    def __init__(self, seen: list, sizes: dict[int, list[int]] | None = None):
        self.seen, self.sizes, self.fail_with, self.contexts, self.grids = seen, sizes or {}, 0, [], []

        def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            values = []
            for i, size in enumerate(self.sizes.get(f, [8])):
                raw = ctypes.c_uint64.from_address(params[i]).value
                values.append(raw & ((1 << (8 * size)) - 1))
            self.seen.append(("launch", f, stream, tuple(values)))
            self.grids.append(((gx, gy, gz), (bx, by, bz), shared))
            return self.fail_with

        def set_ctx(ctx):
            self.contexts.append(ctx)
            return 0

        self._launch, self._set_ctx = LAUNCH(launch), SET_CTX(set_ctx)  # kept alive with the driver
        self.entries = (ctypes.cast(self._launch, vp).value, ctypes.cast(self._set_ctx, vp).value)
