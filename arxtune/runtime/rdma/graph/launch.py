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


def _hooked(hook) -> bool:
    """Whether a launch hook would run: None, or a chain with nothing in it (Triton >= 3.5), is no hook."""
    return hook is not None and bool(getattr(hook, "calls", True))


def direct_runner(compiled, grid: tuple[int, ...]) -> Callable:
    """`compiled[grid]`, minus the launch metadata and hooks while no hook is attached (read at every call)."""
    runner = compiled[grid]  # loads the module now, not on a call
    try:
        from triton import knobs

        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        hooks = knobs.runtime
    except (ImportError, AttributeError):  # a Triton laid out otherwise: its own runner serves
        return runner
    if not all(hasattr(hooks, name) for name in ("launch_enter_hook", "launch_exit_hook")):
        return runner
    x, y, z = grid

    def launch(*args, stream):
        if _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
            runner(*args, stream=stream)
        else:
            run(x, y, z, stream, function, packed, None, None, None, *args)

    return launch


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
            runner = direct_runner(compiled, tuple(grid) + (1,) * (3 - len(grid)))
        return cls(runner, args, varying, lambda: current_stream(index))

    def __call__(self, *addresses: int) -> None:
        """Launch on the current stream with `addresses` (integers: data_ptr() of the tensors) at the varying positions."""
        args = self._args
        for i, a in zip(self._varying, addresses):
            args[i] = a
        self._runner(*args, stream=self._stream())


def names_in_order(kernel, named: dict) -> list:
    """The kernel's arguments in its signature's order (constexprs included, as Triton's launcher takes them)."""
    missing = [n for n in kernel.arg_names if n not in named]
    if missing:
        raise TypeError(f"{getattr(kernel, '__name__', 'kernel')}: missing arguments {missing}")
    return [named[n] for n in kernel.arg_names]
