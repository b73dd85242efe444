"""Pure tests: settings, buffer layout, plans (no device)."""

from __future__ import annotations

import itertools
import re

import pytest

from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.units import parse_bytes
from arxtune.runtime.rdma.protocol import ALIGN, Layout, chunks, seq_of, split_even, stripes


def test_config_precedence_defaults_then_options_then_env():
    assert RdmaConfig.resolve({}, env={}) == RdmaConfig()
    cfg = RdmaConfig.resolve({"devices": ["a", "b"], "max_bytes": "1MiB", "timeout_s": 5}, env={})
    assert cfg.devices == ("a", "b") and cfg.max_bytes == 1 << 20 and cfg.timeout_s == 5.0
    env = {
        "ARXTUNE_RDMA_DEVICES": "rxe1, rxe0",
        "ARXTUNE_RDMA_GID_INDEX": "3",
        "ARXTUNE_RDMA_PORT": "2",
        "ARXTUNE_RDMA_MAX_BYTES": "64k",
        "ARXTUNE_RDMA_TIMEOUT_S": "0.5",
    }
    cfg = RdmaConfig.resolve({"devices": ["a"], "max_bytes": 1 << 20}, env=env)
    assert cfg == RdmaConfig(devices=("rxe1", "rxe0"), gid_index=3, port=2, max_bytes=65536, timeout_s=0.5)
    assert RdmaConfig.resolve({"gid_index": 1}, env={"ARXTUNE_RDMA_GID_INDEX": " "}).gid_index == 1


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"max_byte": 1}, "unknown option 'max_byte'"),
        ({"max_bytes": 100}, "max_bytes must be a positive multiple of 64, got 100"),
        ({"slots": 1}, "slots must be >= 2"),
        ({"timeout_s": 0}, "timeout_s must be > 0"),
        ({"max_bytes": "lots"}, "bad RDMA setting: not a byte size: 'lots'"),
        ({"devices": "a,,b"}, "empty RDMA device name"),
        ({"chunk_bytes": 1 << 30}, "chunk_bytes must be a multiple of 64 in"),
    ],
)
def test_config_rejects_bad_settings_with_a_clear_error(options, needle):
    """Each bad setting gets the message that names it, not just any 'arx:' error."""
    with pytest.raises(ArxtuneError, match=re.escape(needle)):
        RdmaConfig.resolve(options, env={})


def test_parse_bytes():
    assert [parse_bytes(v) for v in (4096, "4096", "4k", "4KiB", "2MiB", "1g")] == [4096, 4096, 4096, 4096, 2 << 20, 1 << 30]


@pytest.mark.parametrize("world,slots,ndev", [(2, 2, 1), (3, 2, 2), (4, 3, 1)])
def test_layout_regions_are_disjoint_aligned_and_inside_the_buffer(world, slots, ndev):
    L = Layout(world=world, slots=slots, slot_bytes=4096, ndev=ndev)
    regions = [(L.staging(s), L.slot_bytes) for s in range(slots)]
    regions += [(L.flag_source(s), 8) for s in range(slots)]
    regions += [(L.inbox(s, r), L.slot_bytes) for s in range(slots) for r in range(world)]
    regions += [(L.flag(s, r, d), 8) for s in range(slots) for r in range(world) for d in range(ndev)]
    regions.sort()
    for (a, na), (b, _) in itertools.pairwise(regions):
        assert a + na <= b
    assert regions[-1][0] + regions[-1][1] <= L.total_bytes
    assert all(L.inbox(s, r) % ALIGN == 0 for s in range(slots) for r in range(world))
    assert sorted(L.flag_index(s, r, d) for s in range(slots) for r in range(world) for d in range(ndev)) == list(range(L.num_flags))


def test_consecutive_steps_alternate_slots_and_sequence_numbers_never_repeat():
    L = Layout(world=2, slots=2, slot_bytes=64)
    assert [L.slot(k) for k in range(5)] == [0, 1, 0, 1, 0]
    assert L.inbox(0, 1) == L.inbox(2, 1) != L.inbox(1, 1)
    assert [seq_of(k) for k in range(3)] == [1, 2, 3]  # 0 is fresh memory, never a valid flag


@pytest.mark.parametrize("n,parts", [(0, 2), (1, 3), (10, 3), (12, 3), (7, 2)])
def test_split_even_covers_everything_in_order(n, parts):
    pieces = split_even(n, parts)
    assert len(pieces) == parts and sum(ln for _, ln in pieces) == n
    assert all(o2 == o1 + l1 for (o1, l1), (o2, _) in itertools.pairwise(pieces))
    assert max(ln for _, ln in pieces) - min(ln for _, ln in pieces) <= 1


def test_stripes_use_one_device_for_small_writes_and_all_for_large():
    assert stripes(4096, 2, min_bytes=65536) == [(0, 0, 4096)]
    assert stripes(1 << 20, 1, min_bytes=65536) == [(0, 0, 1 << 20)]
    big = stripes((1 << 20) + 2, 2, min_bytes=65536)
    assert [d for d, _, _ in big] == [0, 1]
    assert big[0][1] == 0 and big[0][1] + big[0][2] == big[1][1] and big[1][1] + big[1][2] == (1 << 20) + 2
    assert big[1][1] % ALIGN == 0
    assert stripes(0, 2, 0) == [(0, 0, 0)]  # flag only


def test_chunks():
    assert chunks(0, 64) == [(0, 0)]
    assert chunks(64, 64) == [(0, 64)]
    assert chunks(150, 64) == [(0, 64), (64, 64), (128, 22)]
