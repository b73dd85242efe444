"""One vLLM engine of an `arxtune e2e` comparison (a child process: vLLM spawns workers).

    python -m arxtune.harness.e2e.child SPEC.json OUT.json

SPEC (written by arxtune.harness.e2e.engine) names the model, the engine arguments, the
prompts as token ids and how many rounds to generate. The arm (vLLM as it is,
the thresholds, one backend forced) is chosen by the environment the parent
gives this process (ARXTUNE_VLLM_DISABLE / ARXTUNE_THRESHOLDS), so every arm
runs the same code. OUT gets, per timed round, each request's generated token
ids and vLLM's own request timestamps, and each TP worker's call counts.

With node_rank > 0 (multi-node) this process only hosts that node's workers,
as `vllm serve --headless` does, until the head node's engine shuts down.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


class CallCounts:
    """Mixed into vLLM's worker class (worker_extension_cls): lets the engine ask every TP worker for its counts."""

    def arxtune_call_counts(self) -> dict:
        import socket

        from vllm.distributed import get_tp_group

        group = get_tp_group()
        calls = getattr(group.device_communicator, "arxtune_calls", None)
        return {
            "tp_rank": group.rank_in_group,
            "host": socket.gethostname(),
            "communicator": type(group.device_communicator).__name__,
            "calls": None if calls is None else {f"{op}:{backend}": n for (op, backend), n in sorted(calls.items())},
        }


EXTENSION = f"{__name__}.{CallCounts.__qualname__}"


def cpu_defaults(tp_per_node: int) -> None:
    """vLLM's CPU build needs its OpenMP threads bound per rank and a KV-cache size; set them unless given."""
    import torch

    if torch.cuda.is_available():
        return
    cores = sorted(os.sched_getaffinity(0))
    per_rank = max(1, len(cores) // tp_per_node)
    groups = [cores[i * per_rank : (i + 1) * per_rank] or cores[-1:] for i in range(tp_per_node)]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(",".join(map(str, g)) for g in groups))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def shutdown_defaults(spec: dict) -> None:
    """The engine's executor waits this long for its workers to leave before it signals them (vLLM's default: 5 s)."""
    os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", str(int(spec.get("shutdown_timeout_s", 5))))


def engine_args(spec: dict) -> dict:
    args = dict(
        model=spec["model"],
        tensor_parallel_size=spec["tensor_parallel_size"],
        dtype=spec["dtype"],
        max_model_len=spec["max_model_len"],
        enforce_eager=True,
        skip_tokenizer_init=True,
        seed=0,
        disable_log_stats=False,
        worker_extension_cls=EXTENSION,
    )
    batch = spec.get("batch")
    if batch:  # every arm batches alike (config.batch_settings)
        args.update(max_num_seqs=batch["max_num_seqs"], max_num_batched_tokens=batch["max_num_batched_tokens"])
    if spec.get("load_format"):
        args["load_format"] = spec["load_format"]
    if spec["nnodes"] > 1:
        args.update(
            nnodes=spec["nnodes"],
            node_rank=spec["node_rank"],
            master_addr=spec["master_addr"],
            master_port=spec["master_port"],
            distributed_executor_backend="mp",
        )
    return args


def head_is_up(addr: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((addr, port), timeout=5):
            return True
    except OSError:
        return False


def serve_headless(spec: dict, poll_s: float = 2.0) -> dict:
    """This node's share of the workers (as vLLM's `serve --headless`) until the head's engine is gone.

    vLLM's headless workers never learn that the head finished; the head's
    rank 0 worker holds torch's store on master_port while its engine lives,
    so three refused connections in a row end this arm on this node.
    """
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    config = EngineArgs(**engine_args(spec)).create_engine_config(headless=True)
    executor = MultiprocExecutor(config, monitor_workers=False)  # returns once the workers joined the head
    refused = 0
    while refused < 3:
        time.sleep(poll_s)
        refused = 0 if head_is_up(spec["master_addr"], spec["master_port"]) else refused + 1
    executor.shutdown()
    return {"headless": True}


def generate(spec: dict) -> dict:
    if spec.get("batch", {}).get("engine_core") == "in-process":
        # generate() adds every prompt, then steps: the first step schedules them all. A core in its own process
        # starts stepping as the first requests arrive, so the batches would depend on timing.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams  # type: ignore[attr-defined]

    started = time.monotonic()
    llm = LLM(**engine_args(spec))
    startup_s = time.monotonic() - started
    params = SamplingParams(max_tokens=spec["decode_tokens"], temperature=0.0, ignore_eos=True)
    prompts = [{"prompt_token_ids": ids} for ids in spec["prompts"]]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up: first-call costs stay out of the samples
    rounds = []
    for _ in range(spec["rounds"]):
        outputs = llm.generate(prompts, params, use_tqdm=False)
        rounds.append(
            [
                {
                    "token_ids": list(o.outputs[0].token_ids),
                    "scheduled_ts": o.metrics.scheduled_ts,
                    "first_token_ts": o.metrics.first_token_ts,
                    "last_token_ts": o.metrics.last_token_ts,
                    "generated": o.metrics.num_generation_tokens,
                }
                for o in outputs
            ]
        )
    workers = llm.collective_rpc("arxtune_call_counts", timeout=spec["rpc_timeout_s"])
    # Shut down now, giving the workers time to end on their own (60 s): vLLM's default (5 s, then SIGKILL)
    # cuts a worker short on a loaded machine, and a worker killed never shows whether it would have exited cleanly.
    started = time.monotonic()
    llm.llm_engine.engine_core.shutdown(timeout=spec["shutdown_timeout_s"])
    return {"startup_s": startup_s, "rounds": rounds, "workers": workers, "shutdown_s": time.monotonic() - started}


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(open(spec_path).read())
    cpu_defaults(spec["tensor_parallel_size"] // spec["nnodes"])
    shutdown_defaults(spec)
    try:
        result = serve_headless(spec) if spec["node_rank"] > 0 else generate(spec)
        result["error"] = ""
    except BaseException:  # the parent reports it; the traceback is the useful part
        result = {"error": traceback.format_exc()}
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, out_path)
    return 1 if result["error"] else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
