"""The README's usage of the communicator, as a user writes it (started 30 times by tests/multiproc/test_exit.py).

    usage_worker.py [close]

With `close`, the process closes the communicator (twice: close is idempotent) and destroys the
process group; without, it just ends, as a script that never calls close() does. Either way it must
leave with exit code 0 and no abort, and no thread of arxtune's gloo group may be left when the
interpreter finalizes (a hook run after arxtune's own exits with 3 otherwise): such a thread letting go
of a collective's tensors then needs the GIL, and aborts the process.
"""

import atexit
import os
import sys

import torch
import torch.distributed as dist

threads = lambda: len(os.listdir("/proc/self/task"))  # noqa: E731


@atexit.register  # before arxtune's own hook, so it runs after it (last in, first out)
def no_thread_of_arxtune_left() -> None:
    """By the time the interpreter finalizes, arxtune's gloo group and its threads are gone."""
    if threads() > before:
        print(
            f"{threads()} threads at exit, {before} before the communicator: a gloo group of arxtune's lives on",
            file=sys.stderr,
            flush=True,
        )
        os._exit(3)


from arxtune.runtime.communicator import Communicator  # noqa: E402
from arxtune.runtime.errors import ArxtuneError  # noqa: E402

dist.init_process_group("gloo")
before = threads()
comm = Communicator.from_env()  # ARXTUNE_THRESHOLDS: a file whose boundary the start-up ladder times
assert comm.ctx.cpu_group is not dist.group.WORLD, "arxtune's collectives share the caller's group, which outlives them"
for n in (256, 8192, 65536):
    y = comm.all_reduce(torch.ones(n))
    assert torch.equal(y, torch.full((n,), float(dist.get_world_size()))), n
if sys.argv[1:] == ["close"]:
    comm.close()
    comm.close()
    assert threads() == before, f"{threads()} threads after close, {before} before: a gloo group of arxtune's lives on"
    try:
        comm.all_reduce(torch.ones(4))
        raise AssertionError("a closed communicator served a call")
    except ArxtuneError:
        pass
    dist.destroy_process_group()
print(f"usage ok {dist.get_rank() if dist.is_initialized() else ''}".strip(), flush=True)
