"""Backends for tests, registered through ARXTUNE_EXTRA_BACKENDS: real gloo traffic with a twist."""

from __future__ import annotations

import os

from arxtune.runtime.backends.torch_dist import GlooBackend


class CountingGloo(GlooBackend):
    """gloo that counts its calls, so a test can see which backend a communicator picked."""

    name = "counting"
    calls: dict[str, int] = {}  # every class below keeps its own

    def _count(self, op):
        type(self).calls[op] = type(self).calls.get(op, 0) + 1

    def all_reduce(self, inp, out):
        self._count("all_reduce")
        super().all_reduce(inp, out)

    def all_gather(self, inp, out):
        self._count("all_gather")
        super().all_gather(inp, out)

    def reduce_scatter(self, inp, out):
        self._count("reduce_scatter")
        super().reduce_scatter(inp, out)


class CapturableCounting(CountingGloo):
    """Says it can be captured in a CUDA graph: what the router may use while (a stand-in for) capture runs."""

    name = "capcounting"
    capturable = True
    calls: dict[str, int] = {}


class LimitedCounting(CountingGloo):
    """Takes all_reduce / reduce_scatter inputs up to its `max_bytes` option (default 1 KiB), like arx's buffers."""

    name = "limited"
    calls: dict[str, int] = {}

    def __init__(self, ctx):
        super().__init__(ctx)
        self.max_bytes = int(ctx.options_for(self.name).get("max_bytes", 1024))

    def supports(self, op, dtype, nbytes):
        return op == "all_gather" or nbytes <= self.max_bytes

    def capacity(self):
        return {"all_reduce": self.max_bytes, "reduce_scatter": self.max_bytes}

    def effective_options(self):
        return {"max_bytes": self.max_bytes}


class OffByOne(GlooBackend):
    """Fast to call and wrong on rank 1: the harness must record 'wrong', never a win."""

    name = "offbyone"

    def all_reduce(self, inp, out):
        super().all_reduce(inp, out)
        if self.rank == 1:
            out[0] += 1

    def __init__(self, ctx):
        super().__init__(ctx)
        self.rank = ctx.rank


class DiesAtSize(GlooBackend):
    """Rank 1 exits hard at sizes >= ARXTUNE_TEST_DIE_AT bytes: a rank that dies mid-sweep."""

    name = "dies"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.rank = ctx.rank
        self.limit = int(os.environ.get("ARXTUNE_TEST_DIE_AT", "8192"))

    def all_reduce(self, inp, out):
        if self.rank == 1 and inp.numel() * inp.element_size() >= self.limit:
            os._exit(3)
        super().all_reduce(inp, out)


class WrongAfterCheck(GlooBackend):
    """Right on the first call (the harness's check) and wrong on rank 1 afterwards, as a backend whose
    repeated or replayed calls go bad: only the check after timing can catch it."""

    name = "laterwrong"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.rank = ctx.rank
        self.calls: dict[tuple, int] = {}  # per point: (elements, dtype) -> calls so far

    def all_reduce(self, inp, out):
        super().all_reduce(inp, out)
        point = (inp.numel(), inp.dtype)
        self.calls[point] = self.calls.get(point, 0) + 1
        if self.rank == 1 and self.calls[point] > 1:
            out[-1] += 1


class SmallOnly(CountingGloo):
    """Counts its calls and supports only up to 1 KiB: the communicator must fall back to its baseline above that."""

    name = "smallonly"

    def supports(self, op, dtype, nbytes):
        return nbytes <= 1024


class _Tag:
    def __init__(self, tag: str):
        self.tag = tag

    def settings(self) -> dict[str, str]:
        return {"tag": self.tag}


class TaggedGloo(GlooBackend):
    """gloo with variants (`tagged[tag=x]`): the registry's variant plumbing on CPU, as nccl[proto=LL] uses it on GPUs."""

    name = "tagged"

    @staticmethod
    def parse_variant(settings: dict[str, str]) -> _Tag:
        if set(settings) != {"tag"} or not settings["tag"].isalnum():
            raise ValueError("tagged variants set tag=WORD")
        return _Tag(settings["tag"])

    def __init__(self, ctx, variant: _Tag | None = None):
        super().__init__(ctx)
        self.variant = variant

    def effective_options(self):
        return {"variant": self.variant.settings()} if self.variant else {}


class SlowAbove(GlooBackend):
    """gloo that sleeps 20 ms per call at inputs of ARXTUNE_TEST_SLOW_ABOVE bytes or more (default 8 KiB):
    a backend a file claims fast where it is not; sleep-based, so a loaded box cannot blur it."""

    name = "slowabove"
    delay_s = 0.02

    def __init__(self, ctx):
        super().__init__(ctx)
        self.limit = int(os.environ.get("ARXTUNE_TEST_SLOW_ABOVE", "8192"))

    def _wait(self, inp):
        if inp.numel() * inp.element_size() >= self.limit:
            import time

            time.sleep(self.delay_s)

    def all_reduce(self, inp, out):
        self._wait(inp)
        super().all_reduce(inp, out)

    def all_gather(self, inp, out):
        self._wait(inp)
        super().all_gather(inp, out)

    def reduce_scatter(self, inp, out):
        self._wait(inp)
        super().reduce_scatter(inp, out)


class Hangs(GlooBackend):
    """Every call waits ARXTUNE_TEST_HANG_S seconds (default 3) and then gives up with TimeoutError on every
    rank, as a backend whose own wait is bounded: the ladder must count it a loss and still start in time."""

    name = "hangs"

    def all_reduce(self, inp, out):
        import time

        wait = float(os.environ.get("ARXTUNE_TEST_HANG_S", "3"))
        time.sleep(wait)
        raise TimeoutError(f"gave up after {wait:g} s")


class GoesWrong(CountingGloo):
    """Right for its first ARXTUNE_TEST_WRONG_AFTER calls (default 3), then wrong on rank 1: a backend that
    passes start-up and goes bad while serving, which only ARXTUNE_VERIFY can catch."""

    name = "goeswrong"
    calls: dict[str, int] = {}

    def __init__(self, ctx):
        super().__init__(ctx)
        self.rank = ctx.rank
        self.after = int(os.environ.get("ARXTUNE_TEST_WRONG_AFTER", "3"))
        self.made = 0

    def all_reduce(self, inp, out):
        super().all_reduce(inp, out)
        self.made += 1
        if self.rank == 1 and self.made > self.after:
            out[-1] += 1


class CapturableWrong(OffByOne):
    """OffByOne that says it can be captured: the graph table may give it ranges, which a wrong answer in
    the eager ladder must take from it too."""

    name = "capwrong"
    capturable = True


class ReversedSum(GlooBackend):
    """Sums like a backend whose ranks add in reverse order: gather every rank's input over gloo, then add rank
    w-1, w-2, ..., 0 in the tensor's own dtype. Exact on integers; from three ranks on, other bits than gloo's on
    data that rounds (with two, a + b and b + a are the same bits)."""

    name = "reversed"

    def _reversed_sum(self, inp):
        import torch

        world = self.group.size()
        parts = torch.empty((world, inp.numel()), dtype=inp.dtype)
        super().all_gather(inp.reshape(-1), parts.view(-1))
        total = parts[world - 1].clone()
        for rank in range(world - 2, -1, -1):
            total += parts[rank]
        return total

    def all_reduce(self, inp, out):
        out.copy_(self._reversed_sum(inp).view_as(out))

    def reduce_scatter(self, inp, out):
        chunks = self._reversed_sum(inp).chunk(self.group.size())
        out.copy_(chunks[self.group.rank()].view_as(out))
