"""Backends for tests, registered through ARXTUNE_EXTRA_BACKENDS: real gloo traffic with a twist."""

from __future__ import annotations

import os

from arxtune.backends.torch_dist import GlooBackend


class CountingGloo(GlooBackend):
    """gloo that counts its calls, so a test can see which backend a communicator picked."""

    name = "counting"
    calls: dict[str, int] = {}

    def all_reduce(self, inp, out):
        CountingGloo.calls["all_reduce"] = CountingGloo.calls.get("all_reduce", 0) + 1
        super().all_reduce(inp, out)

    def all_gather(self, inp, out):
        CountingGloo.calls["all_gather"] = CountingGloo.calls.get("all_gather", 0) + 1
        super().all_gather(inp, out)

    def reduce_scatter(self, inp, out):
        CountingGloo.calls["reduce_scatter"] = CountingGloo.calls.get("reduce_scatter", 0) + 1
        super().reduce_scatter(inp, out)


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
