"""Launching a Triton kernel without Triton's per-call Python path.

`kernel[grid](...)` binds every argument, computes a specialisation key, looks
the compiled kernel up and, for each pointer argument, asks the driver what the
pointer is (cuPointerGetAttribute): tens of microseconds a call before the
launch itself. A `Launch` compiles once (JITFunction.warmup, which launches
nothing) and keeps the argument tuple with every pointer already an integer, so
a call fills in the two tensors' addresses and goes straight to the compiled
kernel's launcher. Integers also skip the pointer query, which pageable host
memory (the direct memory mode) would fail: the driver knows nothing of it.

The caller keys its Launches by whatever decides Triton's specialisation (sizes,
dtypes, pointer alignment), so a cached launch always runs the kernel Triton
would have picked.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch


def _stream_getter() -> Callable[[int], int]:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton itself uses under torch
    return raw if raw is not None else (lambda index: torch.cuda.current_stream(index).cuda_stream)


current_stream = _stream_getter()


def address(value) -> object:
    """A pointer argument as the launcher's integer; anything else unchanged."""
    return value.data_ptr() if hasattr(value, "data_ptr") else value


def is_aligned(t: torch.Tensor) -> bool:
    """Triton specialises pointers on 16-byte alignment: part of a launch's key."""
    return t.data_ptr() % 16 == 0


class Launch:
    """One kernel, one grid, one set of arguments but the per-call ones (`varying`: their positions).

    `runner(*args, stream=...)` launches (a compiled kernel's `[grid]`); `stream()` gives the current stream."""

    def __init__(self, runner, args: Sequence, varying: Sequence[int], stream: Callable[[], int]):
        self._runner, self._stream = runner, stream
        self._args = [address(a) for a in args]
        self._varying = tuple(varying)

    @classmethod
    def compile(cls, kernel, grid: tuple[int, ...], args: Sequence, varying: Sequence[int], device: torch.device,
                **options) -> "Launch":
        """Compile `kernel` for these arguments (JITFunction.warmup: nothing runs) and load it on `device`."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        with torch.cuda.device(index):
            compiled = kernel.warmup(*args, grid=grid, **options)
            if compiled is None:  # a jit_cache_hook took the compile over: nothing to launch directly
                raise RuntimeError(f"arxg: Triton returned no compiled kernel for {getattr(kernel, '__name__', 'kernel')}; "
                                   "use launch = 'triton'")
            runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]  # loads the module now, not on a call
        return cls(runner, args, varying, lambda: current_stream(index))

    def __call__(self, *tensors) -> None:
        """Launch on the current stream with `tensors` at the varying positions."""
        args = self._args
        for i, t in zip(self._varying, tensors):
            args[i] = t.data_ptr()
        self._runner(*args, stream=self._stream())


def names_in_order(kernel, named: dict) -> list:
    """The kernel's arguments in its signature's order (constexprs included, as Triton's launcher takes them)."""
    missing = [n for n in kernel.arg_names if n not in named]
    if missing:
        raise TypeError(f"{getattr(kernel, '__name__', 'kernel')}: missing arguments {missing}")
    return [named[n] for n in kernel.arg_names]
