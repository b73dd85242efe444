"""What one e2e comparison runs: its config, its arms (the environment each engine gets), the engines' spec."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from arxtune.runtime import env, schema
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.fileio import read_text
from arxtune.runtime.schema import MAX_COUNT
from arxtune.runtime.thresholds import Range, Table, Thresholds

E2E_VERSION = 2
#: e2e.json versions load_result reads (version 1: no batch pinning, no bitwise expectation).
READABLE_E2E_VERSIONS = (1, 2)
KIND = "arxtune-e2e"
TINY_MODEL = Path(__file__).resolve().parent.parent / "models" / "tiny-llama"  # package data: installed with arxtune
BASELINE_ARM = "vllm"
THRESHOLDS_ARM = "thresholds"
#: vLLM's own path in the thresholds (what the CPU build's communicator is called in a sweep).
VLLM_BASELINE = "vllm_cpu"
#: The model dtypes vLLM's --dtype takes.
MODEL_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


@dataclass(frozen=True)
class E2EConfig:
    """One comparison; every field is also an `arxtune e2e` option."""

    thresholds: str | None = None  # thresholds file for the "thresholds" arm (None: no such arm)
    force: tuple[str, ...] = ()  # backends each forced alone for every op, one arm each
    model: str = str(TINY_MODEL)  # a model directory or name; the tiny default has only a config.json
    load_format: str = ""  # vLLM load format; "" = "dummy" for a directory without weights, else vLLM's default
    tensor_parallel_size: int = 2
    dtype: str = "bfloat16"
    max_model_len: int = 256
    prompts: int = 4  # prompts per generate() call (one batch)
    prompt_tokens: int = 16
    decode_tokens: int = 32  # tokens generated per prompt
    rounds: int = 5  # timed generate() calls per engine (after one warm-up call)
    repeats: int = 2  # engines per arm, alternating with the other arms
    out: str = "results"
    timeout_s: float = 900.0  # per engine: start-up, warm-up and every round
    nnodes: int = 1  # vLLM's multiprocessing multi-node launch: nodes, this node's rank, the head's address
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501

    def __post_init__(self) -> None:
        from arxtune.runtime.backends import names

        for name in ("tensor_parallel_size", "prompts", "prompt_tokens", "decode_tokens", "rounds", "repeats", "nnodes", "max_model_len"):
            if not 1 <= getattr(self, name) <= MAX_COUNT:
                raise ArxtuneError(f"--{name.replace('_', '-')} must be between 1 and {MAX_COUNT}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ArxtuneError("--timeout-s must be a positive number of seconds")
        if not 1 <= self.master_port <= 65535:
            raise ArxtuneError(f"--master-port {self.master_port} must be between 1 and 65535")
        if self.dtype not in MODEL_DTYPES:
            raise ArxtuneError(f"unknown --dtype {self.dtype!r}; vLLM takes {', '.join(MODEL_DTYPES)}")
        unknown = [b for b in self.force if b not in names()]
        if unknown:
            raise ArxtuneError(f"unknown --force backend(s) {', '.join(unknown)}; known: {', '.join(names())}")
        if not self.model:
            raise ArxtuneError("--model is empty; give a model directory or name")
        if not self.out:
            raise ArxtuneError("--out is empty; give a directory (default results/)")
        if self.decode_tokens < 2:
            raise ArxtuneError("--decode-tokens must be at least 2 (decode time is measured after the first token)")
        if self.prompt_tokens + self.decode_tokens > self.max_model_len:
            raise ArxtuneError(
                f"prompt plus decode tokens ({self.prompt_tokens + self.decode_tokens}) exceed --max-model-len {self.max_model_len}"
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise ArxtuneError(f"--node-rank {self.node_rank} must be between 0 and --nnodes - 1 ({self.nnodes - 1})")
        if self.tensor_parallel_size % self.nnodes:
            raise ArxtuneError(f"--nnodes {self.nnodes} must divide --tp {self.tensor_parallel_size}")


@dataclass(frozen=True)
class Arm:
    name: str
    env: dict = field(default_factory=dict)  # what this arm's engine process gets on top of the caller's environment
    #: The ranges its file sends away from vLLM's own path to a backend not known to give the baseline's bits there:
    #: none, and its tokens must equal vLLM's; some, and they may diverge (another summation order).
    loose: tuple[str, ...] = ()


def loose_ranges(thresholds: Thresholds, world: int) -> tuple[str, ...]:
    """The ranges at `world` that leave vLLM's path for a backend not known to give the baseline's bits."""
    from arxtune.runtime.vllm_plugin import serves_itself

    return tuple(thresholds.not_bitwise(world, lambda name: serves_itself(thresholds.baseline, name)))


def thresholds_for(
    world: int,
    dtype: str,
    ranges: dict[str, list[tuple[int, str]]],
    baseline: str = VLLM_BASELINE,
    run_id: str = "e2e",
    bitwise: bool | None = None,
) -> Thresholds:
    """A thresholds file from {op: [(lower bound in bytes, backend), ...]} (each range ends where the next starts);
    `bitwise`: what every range says of its backend giving the baseline's bits (None: not known)."""
    tables = []
    for op, starts in ranges.items():
        bounds = [lo for lo, _ in starts[1:]] + [None]
        tables.append(
            Table(op, dtype, world, tuple(Range(lo, hi, backend, "measured", bitwise) for (lo, backend), hi in zip(starts, bounds)))
        )
    return Thresholds(baseline=baseline, margin=0.0, provenance={"run_id": run_id}, tables=tuple(tables))


def forced_thresholds(backend: str, world: int, dtype: str) -> Thresholds:
    """Every size of every op to `backend`."""
    return thresholds_for(
        world, dtype, {op: [(0, backend)] for op in ("all_reduce", "all_gather", "reduce_scatter")}, run_id=f"e2e-forced-{backend}"
    )


def make_arms(cfg: E2EConfig, run_dir: Path) -> list[Arm]:
    from arxtune.runtime.thresholds import load

    world = cfg.tensor_parallel_size
    arms = [Arm(BASELINE_ARM, {env.VLLM_DISABLE.name: "1"})]
    if cfg.thresholds:
        arms.append(
            Arm(THRESHOLDS_ARM, {env.THRESHOLDS.name: str(Path(cfg.thresholds).resolve())}, loose_ranges(load(cfg.thresholds), world))
        )
    for backend in cfg.force:
        forced = forced_thresholds(backend, world, cfg.dtype)
        path = forced.save(run_dir / f"forced-{backend}.json")
        arms.append(Arm(f"force:{backend}", {env.THRESHOLDS.name: str(path.resolve())}, loose_ranges(forced, world)))
    return arms


def batch_settings(cfg: E2EConfig) -> dict:
    """How every arm's engine batches, the same in each: all prompts added before the first step (the engine core
    in the generating process, so it cannot start on some before the rest arrive), and a batch that holds them all."""
    return {
        "engine_core": "in-process",
        "max_num_seqs": cfg.prompts,
        "max_num_batched_tokens": max(cfg.prompts * cfg.prompt_tokens, cfg.max_model_len),
    }


def prompt_token_ids(cfg: E2EConfig, vocab_size: int) -> list[list[int]]:
    """Fixed prompts (token ids away from the special ids at the bottom of the vocabulary)."""
    span = max(vocab_size - 3, 1)
    return [[3 + (97 * p + 31 * t + t * t) % span for t in range(cfg.prompt_tokens)] for p in range(cfg.prompts)]


def _vocab_size(model: str) -> int:
    config = Path(model) / "config.json"
    if not config.is_file():
        return 1024
    try:
        data = schema.table(schema.parse_json(read_text(config, "model config"), str(config)), "the model config")
        return schema.integer(data.get("vocab_size", 1024), "vocab_size", 1, 1 << 24)
    except ArxtuneError as exc:
        raise ArxtuneError(f"{config} is not a readable model config ({' '.join(str(exc).split())})") from None


def engine_spec(cfg: E2EConfig) -> dict:
    model_dir = Path(cfg.model)
    if model_dir.is_dir() and not (model_dir / "config.json").is_file():
        raise ArxtuneError(f"{model_dir} has no config.json; pass a model directory or name with --model")
    has_weights = model_dir.is_dir() and any(p.suffix in (".safetensors", ".bin", ".pt") for p in model_dir.iterdir())
    load_format = cfg.load_format or ("dummy" if model_dir.is_dir() and not has_weights else "")
    return {
        "model": str(model_dir.resolve()) if model_dir.is_dir() else cfg.model,
        "load_format": load_format,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "dtype": cfg.dtype,
        "max_model_len": cfg.max_model_len,
        "nnodes": cfg.nnodes,
        "node_rank": cfg.node_rank,
        "master_addr": cfg.master_addr,
        "master_port": cfg.master_port,
        "decode_tokens": cfg.decode_tokens,
        "rounds": cfg.rounds,
        "rpc_timeout_s": 600,
        "shutdown_timeout_s": 60,
        "prompts": prompt_token_ids(cfg, _vocab_size(cfg.model)),
        "batch": batch_settings(cfg),
    }
