"""One rank of the two-process vLLM run (started by test_plugin_tp.py, not collected by pytest).

    python tests/vllm/tp_worker.py RANK WORLD PORT SPEC.json OUT.json

Goes through vLLM's own start-up on CPU (VLLM_TARGET_DEVICE=cpu): plugins
loaded by vLLM's loader, init_distributed_environment, initialize_model_parallel,
then calls tensor_model_parallel_all_reduce / all_gather / reduce_scatter and
the sequence-parallel hooks. Every input holds small integers, so results are
checked exactly. For each call it records which backend the communicator's
counters say took it. SPEC may list extra communicators to build on the same
TP group with other thresholds files (the fallback cases).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback

import torch

# name -> (api, dtype, shape, dim)
CASES = {
    "ar_256B": ("all_reduce", torch.float32, (64,), None),
    "ar_1KiB_lower_bound": ("all_reduce", torch.float32, (256,), None),
    "ar_2KiB": ("all_reduce", torch.float32, (16, 32), None),
    "ar_16KiB_upper_bound": ("all_reduce", torch.float32, (4096,), None),
    "ar_32KiB": ("all_reduce", torch.float32, (64, 128), None),
    "ar_bf16_128B": ("all_reduce", torch.bfloat16, (8, 8), None),
    "ar_int32_no_table": ("all_reduce", torch.int32, (16, 32), None),
    "ag_dim0_256B": ("all_gather", torch.float32, (4, 8), 0),
    "ag_dim0_8KiB": ("all_gather", torch.float32, (16, 64), 0),
    "ag_dim1_8KiB": ("all_gather", torch.float32, (16, 64), 1),
    "ag_dim-1_3d_8KiB": ("all_gather", torch.float32, (4, 8, 32), -1),
    "ag_dim1_3d_8KiB": ("all_gather", torch.float32, (4, 8, 32), 1),
    "rs_dim0_512B": ("reduce_scatter", torch.float32, (8, 16), 0),
    "rs_dim1_512B": ("reduce_scatter", torch.float32, (8, 16), 1),
    "rs_dim0_16KiB": ("reduce_scatter", torch.float32, (64, 64), 0),
    "sp_ag_8KiB": ("custom_all_gather", torch.float32, (16, 64), 0),
    "sp_ag_256B": ("custom_all_gather", torch.float32, (4, 8), 0),
    "sp_rs_512B": ("custom_reduce_scatter", torch.float32, (8, 16), 0),
}


def rank_input(shape, dtype, rank: int) -> torch.Tensor:
    """Small integers (exact in every dtype and after summing two ranks)."""
    n = 1
    for s in shape:
        n *= s
    return ((torch.arange(n) * 7 + 3 * rank) % 13 + rank).to(dtype).reshape(shape)


def expected(api: str, shape, dtype, dim, rank: int, world: int) -> torch.Tensor:
    inputs = [rank_input(shape, dtype, r) for r in range(world)]
    if api == "all_reduce":
        return sum(inputs[1:], inputs[0].clone())
    if api in ("all_gather", "custom_all_gather"):
        return torch.cat(inputs, dim=dim)
    total = sum(inputs[1:], inputs[0].clone())
    return total.chunk(world, dim=dim)[rank]


def went(before, after) -> str:
    delta = after - before
    return ",".join(sorted(f"{op}:{name}" for (op, name), n in delta.items() if n)) or "nothing"


def run_case(comm, api: str, dtype, shape, dim, rank: int, world: int) -> dict:
    from vllm.distributed import tensor_model_parallel_all_gather, tensor_model_parallel_all_reduce, tensor_model_parallel_reduce_scatter

    x = rank_input(shape, dtype, rank)
    want = expected(api, shape, dtype, dim, rank, world)
    before = comm.arxtune_calls.copy()
    if api == "all_reduce":
        got = tensor_model_parallel_all_reduce(x)
    elif api == "all_gather":
        got = tensor_model_parallel_all_gather(x, dim)
    elif api == "reduce_scatter":
        got = tensor_model_parallel_reduce_scatter(x, dim)
    else:
        got = getattr(comm, api)(x)
    record = {"went": went(before, comm.arxtune_calls)}
    if got is None:
        record.update(ok=True, result="None (handed back to vLLM's caller)")  # type: ignore[call-overload]
    else:
        ok = got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)
        record.update(ok=bool(ok), result=f"{tuple(got.shape)} {got.dtype}" + ("" if ok else f" != {tuple(want.shape)}"))  # type: ignore[call-overload]
    return record


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record):
        self.lines.append((record.levelname, record.getMessage()))


def main() -> int:
    rank, world, port = (int(a) for a in sys.argv[1:4])
    spec = json.loads(open(sys.argv[4]).read())
    out_path = sys.argv[5]
    collect = Collect()
    result: dict = {"rank": rank, "seconds": {}}
    start = time.monotonic()

    def stage(name: str) -> None:
        result["seconds"][name] = round(time.monotonic() - start, 2)

    try:
        from vllm.config.logging import LoggingConfig
        from vllm.logger import configure_logging
        from vllm.plugins import load_general_plugins

        configure_logging(LoggingConfig())  # as `vllm serve` and its workers do: vLLM's handler, INFO
        logging.getLogger("vllm.arxtune").addHandler(collect)
        stage("import")
        load_general_plugins()
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.distributed import get_tp_group, init_distributed_environment, initialize_model_parallel
        from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

        # A default config, as vLLM's own tests of these paths use (no model: nothing to download).
        with set_current_vllm_config(VllmConfig()):
            init_distributed_environment(
                world_size=world, rank=rank, local_rank=rank, backend="gloo", distributed_init_method=f"tcp://127.0.0.1:{port}"
            )
            initialize_model_parallel(tensor_model_parallel_size=world)
        stage("init")
        tp = get_tp_group()
        comm = tp.device_communicator
        result["communicator"] = type(comm).__name__
        result["is_cpu_communicator"] = isinstance(comm, CpuCommunicator)
        result["startup_log"] = list(collect.lines)
        result["cases"] = {
            name: run_case(comm, *case, rank=rank, world=world) for name, case in CASES.items() if name in spec.get("cases", CASES)
        }
        stage("cases")
        result["fallbacks"] = {}
        for label, paths in spec.get("fallbacks", {}).items():
            collect.lines.clear()
            entry = paths if isinstance(paths, dict) else {"path": paths}  # {"path": ..., "env": {...}}: with those set
            path = entry["path"][rank] if isinstance(entry["path"], list) else entry["path"]
            if path is None:
                os.environ.pop("ARXTUNE_THRESHOLDS", None)
            else:
                os.environ["ARXTUNE_THRESHOLDS"] = path
            saved = {key: os.environ.get(key) for key in entry.get("env", {})}
            os.environ.update(entry.get("env", {}))
            try:
                other = type(comm)(cpu_group=tp.cpu_group, device=tp.device, device_group=tp.device_group, unique_name=f"tp:{label}")
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
            x = rank_input((16, 32), torch.float32, rank)
            before = other.arxtune_calls.copy()
            got = other.all_reduce(x.clone())
            ok = torch.equal(got, expected("all_reduce", (16, 32), torch.float32, None, rank, world))
            result["fallbacks"][label] = {
                "went": went(before, other.arxtune_calls),
                "ok": bool(ok),
                "routes": other.arxtune_routes is not None,
                "log": list(collect.lines),
            }
            other.destroy()
        stage("fallbacks")
        from vllm.distributed import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
        result["error"] = ""
    except Exception:
        result["error"] = traceback.format_exc()
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)
    return 0 if not result["error"] else 1


if __name__ == "__main__":
    sys.exit(main())
