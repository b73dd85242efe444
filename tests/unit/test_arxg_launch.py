"""arxg's launch without Triton at run time, without a GPU: the compiled kernel's parameter layout, the
packing of its arguments, the C launch (cuda_launch.c driven with stand-ins for cuLaunchKernel), and
where a rank's kernel build comes from (images.py)."""

from __future__ import annotations

import ctypes
import os
import shutil
from types import SimpleNamespace

import pytest
import torch

from arxtune.runtime import cudadrv
from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.graph import abi, aot, images
from arxtune.runtime.rdma.graph.abi import AbiError, KernelImage
from helpers.fake_cuda import FakeDriver

pytestmark = [pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler here"), pytest.mark.timeout(300)]

#: the handshake kernel's entry as Triton 3.9 compiled it for sm_90a (two scratch pointers appended)
HANDSHAKE_PTX = """.visible .entry handshake_kernel(
	.param .u64 .ptr .global .align 1 handshake_kernel_param_0,
	.param .u64 .ptr .global .align 1 handshake_kernel_param_1,
	.param .u32 handshake_kernel_param_2,
	.param .u64 handshake_kernel_param_3,
	.param .u64 .ptr .global .align 1 handshake_kernel_param_4,
	.param .u64 .ptr .global .align 1 handshake_kernel_param_5
)
.maxntid 32, 1, 1
{"""
HANDSHAKE_ARGS = (("ctrl", "*i64"), ("counter", "*i64"), ("op_code", "i32"), ("timeout_ns", "i64"))


def _image(params, scratch, args=HANDSHAKE_ARGS, **kw) -> KernelImage:
    return KernelImage(
        name="handshake_kernel",
        variant="handshake",
        arch="sm_90a",
        source="s",
        triton="x",
        num_warps=1,
        shared=0,
        args=args,
        params=tuple(params),
        scratch=scratch,
        **kw,
    )


def test_the_parameters_are_read_from_the_compiled_entry_point():
    assert abi.entry_params(HANDSHAKE_PTX, "handshake_kernel") == [8, 8, 4, 8, 8, 8]
    assert abi.entry_params(".entry k(.param .align 8 .b8 k_param_0[16], .param .s32 k_param_1)", "k") == [16, 4]
    assert abi.entry_params(".entry k()", "k") == []
    with pytest.raises(AbiError, match="no .entry other"):
        abi.entry_params(HANDSHAKE_PTX, "other")


# (parameters of the compiled entry, scratch sizes its metadata names, what packing gives or refuses)
LAYOUTS = [
    pytest.param([8, 8, 4, 8], {}, [0x10, 0x20, 3, 7], id="no-appended-parameter"),
    pytest.param([8, 8, 4, 8, 8], {"global_scratch_size": 0}, [0x10, 0x20, 3, 7, 0], id="one-scratch-pointer"),
    pytest.param(
        [8, 8, 4, 8, 8, 8], {"global_scratch_size": 0, "profile_scratch_size": 0}, [0x10, 0x20, 3, 7, 0, 0], id="two-scratch-pointers"
    ),
    pytest.param(
        [8, 8, 4, 8], {"global_scratch_size": 0, "profile_scratch_size": 0}, [0x10, 0x20, 3, 7], id="scratch-named-but-not-appended"
    ),
    pytest.param([8, 8, 4, 8, 8], {"global_scratch_size": 64}, "needs scratch memory", id="scratch-in-use"),
    pytest.param([8, 8, 4, 8, 8, 8], {"global_scratch_size": 0}, "2 parameters after the arguments", id="unaccounted"),
    pytest.param([8, 8, 4, 8, 4], {"global_scratch_size": 0}, "parameters after the arguments", id="appended-not-a-pointer"),
    pytest.param([8, 8, 8, 8], {}, "op_code .i32. does not fit parameter 2", id="argument-size-differs"),
    pytest.param([8, 8, 4], {}, "3 parameters for 4 arguments", id="too-few"),
]


@pytest.mark.parametrize("params, scratch, expected", LAYOUTS)
def test_packing_follows_the_compiled_layout_or_refuses_what_it_cannot_account_for(params, scratch, expected):
    image = _image(params, scratch)
    named = {"ctrl": 0x10, "counter": 0x20, "op_code": 3, "timeout_ns": 7, "extra": 99}
    if isinstance(expected, str):
        with pytest.raises(AbiError, match=expected):
            image.check()
        return
    image.check()
    assert image.values(named) == expected


def test_a_launch_this_launcher_cannot_make_is_refused_and_a_missing_argument_is_named():
    with pytest.raises(AbiError, match="needs a launch"):
        _image([8, 8, 4, 8], {}, launch={"cooperative": True}).check()
    with pytest.raises(AbiError, match=r"missing arguments \['timeout_ns'\]"):
        _image([8, 8, 4, 8], {}).values({"ctrl": 1, "counter": 2, "op_code": 3})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The real kernels of one deployment shape, built by the installed Triton for sm_90a."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    source = images.source_hash()
    return {v.name: aot.build_variant(v, 90, source) for v in (aot.Variant("handshake"), aot.Variant(), aot.Variant(aligned=False))}


def test_a_real_build_records_its_layout_and_survives_its_file(built, tmp_path):
    image = built["all_reduce-bf16-w2-d1-a16"]
    assert [a for a, _ in image.args] == [
        "inp",
        "out",
        "staging",
        "sources",
        "flags",
        "ctrl",
        "counter",
        "rank",
        "n_stage",
        "n_part",
        "slot_elems",
        "nbytes",
        "ndev_used",
        "op_code",
        "timeout_ns",
    ]
    assert image.params[:15] == (8,) * 7 + (4,) * 7 + (8,) and image.cubin[:4] == b"\x7fELF"
    image.check()
    store = images.Store(tmp_path)
    assert store.get(image.source, "sm_90a", image.variant) is None
    path = store.put(image)
    assert path == tmp_path / image.source / "sm_90a" / "all_reduce-bf16-w2-d1-a16.json"
    assert store.get(image.source, "sm_90a", image.variant) == image
    path.write_text("{}")
    with pytest.raises(AbiError, match="not an arxtune-arxg-kernel file"):
        store.get(image.source, "sm_90a", image.variant)


def test_the_c_launch_passes_the_packed_arguments_and_wakes_a_blocked_proxy_first():
    seen = []
    driver = FakeDriver(seen, sizes={0xF: [8, 4, 8]})
    words = (ctypes.c_int32 * 2)(0, 5)  # asleep, wake
    wake = (ctypes.addressof(words), ctypes.addressof(words) + 4)
    launch = cudadrv.Launch(0xF, (8,), (32,), 0, [8, 4, 8], [0xDEAD, -1, 5], ctx=0xC7, wake=wake, entries=driver.entries)
    launch.launch(0x55)
    assert seen == [("launch", 0xF, 0x55, (0xDEAD, 0xFFFFFFFF, 5))] and driver.contexts == [0xC7]
    assert driver.grids == [((8, 1, 1), (32, 1, 1), 0)] and list(words) == [0, 5]  # awake: nothing to wake
    words[0] = 1
    launch.launch(0x55)
    assert list(words) == [1, 6]  # asleep: woken (the futex word bumped) before the launch
    driver.fail_with = 700
    with pytest.raises(cudadrv.CudaError, match="cuLaunchKernel failed"):
        launch.launch(0x55)


def test_a_burst_launches_pairs_in_turn_each_after_the_busy_kernel_between_its_events(monkeypatch):
    seen = []
    driver = FakeDriver(seen)
    pairs = [cudadrv.Launch(0xA0 + k, (1,), (32,), 0, [8], [k], entries=driver.entries) for k in range(2)]
    busy = cudadrv.Launch(0xB0, (1,), (1,), 0, [8], [50_000], entries=driver.entries)
    rec = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
        lambda event, stream: seen.append(("record", event, stream)) or 0  # type: ignore[func-returns-value]
    )
    monkeypatch.setattr(cudadrv, "event_record", lambda: (ctypes.cast(rec, ctypes.c_void_p).value, "c"))
    monkeypatch.setattr(cudadrv, "event_handle", lambda event: event)
    cudadrv.burst(pairs, 3, 0x55, before=busy, start=0xE1, end=0xE2)
    assert seen == [
        ("record", 0xE1, 0x55),
        ("launch", 0xB0, 0x55, (50_000,)),
        ("launch", 0xA0, 0x55, (0,)),
        ("launch", 0xB0, 0x55, (50_000,)),
        ("launch", 0xA1, 0x55, (1,)),
        ("launch", 0xB0, 0x55, (50_000,)),
        ("launch", 0xA0, 0x55, (0,)),
        ("record", 0xE2, 0x55),
    ]
    seen.clear()
    cudadrv.burst([], 2, 0x56, before=busy)  # the busy kernel alone
    assert seen == [("launch", 0xB0, 0x56, (50_000,))] * 2


def _cpu_rank(image_for, driver, world=2, rank=1):
    """A GpuRank's packing half on CPU tensors: its session, device and loader replaced by stand-ins."""
    from arxtune.runtime.rdma.graph.gpu import GpuRank, HostPtr
    from arxtune.runtime.rdma.protocol import Layout

    layout = Layout(world=world, slots=2, slot_bytes=1 << 20, ndev=1)
    r = GpuRank.__new__(GpuRank)
    r.s = SimpleNamespace(
        layout=layout,
        world=world,
        rank=rank,
        flag_devices=lambda op, nbytes: 1,  # type: ignore[assignment]
        quick_check=lambda: None,
    )
    r.launch, r.index, r.capability, r.ctx, r.max_programs = "native", 0, 90, 0, 132
    r.data, r.timeout_ns, r._wake = 0x7F0000001000, 20_000_000_000, None
    r.ctrl, r.flags = HostPtr(0x7F0000000000, torch.int64), HostPtr(0x7F0000001000 + layout.flags_base, torch.int64)
    r.sources, r.counter = torch.zeros(48, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
    r._ptrs, r._functions, r.builds, r._packed, r._entries = {}, {}, {}, {}, driver.entries
    r._obtain = lambda variant, capability: (image_for(variant), "from a test")
    r._launch_c = cudadrv.c_entry("arxtune_launch")
    r._load = lambda image: 0xF00 + len(image.name)  # type: ignore[method-assign]
    return r


def test_a_ranks_call_reaches_the_built_kernel_with_every_parameter_in_its_place(built, monkeypatch):
    monkeypatch.setattr(cudadrv, "current_stream", lambda index: 0x55)
    asked = []
    seen = []
    driver = FakeDriver(seen, sizes={0xF00 + len("collective_kernel"): list(built["all_reduce-bf16-w2-d1-a16"].params)})
    rank = _cpu_rank(lambda v: asked.append(v.name) or built[v.name], driver)  # type: ignore[func-returns-value]
    n = 8192  # 16 KiB of bf16
    inp, out = torch.zeros(n, dtype=torch.bfloat16), torch.zeros(n, dtype=torch.bfloat16)
    rank.all_reduce(inp, out)
    rank.all_reduce(inp, out)
    staging = rank.data + rank.s.layout.staging(0)
    expected = (
        inp.data_ptr(),
        out.data_ptr(),
        staging,
        rank.sources.data_ptr(),
        rank.flags.address,
        rank.ctrl.address,
        rank.counter.data_ptr(),
        1,
        n,
        n,
        (1 << 20) // 2,
        2 * n,
        1,
        0,
        20_000_000_000,
        0,
        0,
    )
    assert seen == [("launch", 0xF00 + len("collective_kernel"), 0x55, expected)] * 2
    assert driver.grids[0] == ((8, 1, 1), (32, 1, 1), 0)  # 8192 elements, 1024 per program, one warp each
    assert asked == ["all_reduce-bf16-w2-d1-a16"] and len(rank._packed) == 1  # loaded and packed once
    odd = torch.zeros(n + 1, dtype=torch.bfloat16)[1:]  # 2 bytes past a 16-byte boundary
    rank.all_reduce(odd, out)
    assert asked[-1] == "all_reduce-bf16-w2-d1-any" and seen[-1][3][0] == odd.data_ptr() and len(rank._packed) == 2


def test_a_rotation_packs_each_pair_once_and_launches_its_samples_from_c(built, monkeypatch):
    monkeypatch.setattr(cudadrv, "current_stream", lambda index: 0x55)
    seen = []
    driver = FakeDriver(seen, sizes={0xF00 + len("collective_kernel"): [8, 8]})
    rank = _cpu_rank(lambda v: built[v.name], driver)
    ins = [torch.zeros(1024, dtype=torch.bfloat16) for _ in range(2)]
    outs = [torch.zeros(1024, dtype=torch.bfloat16) for _ in range(2)]
    rotation = rank.rotation("all_reduce", ins, outs)
    busy = cudadrv.Launch(0xB0, (1,), (1,), 0, [8], [7], entries=driver.entries)
    rotation.decode(3, SimpleNamespace(launch=busy))
    pairs = [(i.data_ptr(), o.data_ptr()) for i, o in zip(ins, outs)]
    assert [s[3] for s in seen] == [(7,), pairs[0], (7,), pairs[1], (7,), pairs[0]]
    seen.clear()
    rotation.repeat(2)
    rotation()
    assert [s[3] for s in seen] == [pairs[0], pairs[1], pairs[0]] and len(rank._packed) == 2


def _fail_build(variant, capability, source):
    raise AssertionError("no build expected")


def test_a_build_on_disk_is_loaded_without_building_and_says_where_it_came_from(built, tmp_path):
    found = images.Store(tmp_path / "bundle")
    found.put(built["handshake"])
    image, how = images.obtain(aot.Variant("handshake"), 90, build=_fail_build, searched=[found, images.Store(tmp_path / "cache")])
    assert image == built["handshake"] and how == f"the build in {tmp_path / 'bundle'}, made by Triton {image.triton}"


def test_a_missing_build_is_built_here_and_cached_where_triton_can(built, tmp_path):
    cache, builds = images.Store(tmp_path / "cache"), []

    def build(variant, capability, source):
        builds.append((variant.name, capability, source))
        return built["handshake"]

    image, how = images.obtain(
        aot.Variant("handshake"), 90, build=build, searched=[images.Store(tmp_path / "none"), cache], why_no_build=lambda cap: None
    )
    assert how == f"built here by Triton {image.triton}" and builds == [("handshake", 90, images.source_hash())]
    assert images.obtain(aot.Variant("handshake"), 90, build=_fail_build, searched=[cache])[1].startswith(f"the build in {cache.root}")


def test_without_triton_or_a_build_the_reason_names_how_to_make_one_elsewhere(built, tmp_path):
    with pytest.raises(RdmaUnavailable) as info:
        images.obtain(
            aot.Variant(world=3, ndev=2),
            121,
            build=_fail_build,
            searched=[images.Store(tmp_path)],
            why_no_build=lambda cap: "Triton is not installed here",
        )
    text = str(info.value)
    assert "no build of all_reduce-bf16-w3-d2-a16 for sm_121a" in text and "Triton is not installed here" in text
    assert "python -m arxtune.runtime.rdma.graph.aot --arch sm_121a --world 3 --ndev 2 --out DIR" in text
    assert "ARXTUNE_ARXG_KERNELS=DIR" in text


def test_a_build_for_another_source_or_arch_is_never_loaded(built, tmp_path):
    store = images.Store(tmp_path)
    other = KernelImage(**{**built["handshake"].__dict__, "source": "0000000000000000"})
    store.put(other)
    store.put(KernelImage(**{**built["handshake"].__dict__, "arch": "sm_100a"}))
    with pytest.raises(RdmaUnavailable, match="the local build failed: ptxas too old"):
        images.obtain(
            aot.Variant("handshake"),
            90,
            searched=[store],
            why_no_build=lambda cap: None,
            build=lambda v, c, s: (_ for _ in ()).throw(RuntimeError("ptxas too old")),
        )


def test_the_local_triton_too_old_for_its_compile_api_is_a_reason():
    assert aot.triton_too_old("3.2.0") and not aot.triton_too_old("3.6.0") and not aot.triton_too_old("3.10.1")


def test_a_bundle_for_another_machine_is_written_by_the_build_command(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    monkeypatch.setattr(aot, "bundle_variants", lambda worlds, ndevs: [aot.Variant("handshake")])
    assert aot.main(["--arch", "sm_121a", "--out", str(tmp_path)]) == 0
    image = images.Store(tmp_path).get(images.source_hash(), "sm_121a", "handshake")
    assert image is not None and image.arch == "sm_121a" and "sm_121" in image.cubin.decode("latin-1")
    assert aot.main(["--arch", "sm_90a", "--world", "17", "--out", str(tmp_path)]) == 2
