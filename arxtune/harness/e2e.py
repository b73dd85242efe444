"""`arxtune e2e`: does a thresholds file make vLLM's decode faster, with the same tokens?

Collectives that win in isolation can leave serving at parity, so this runs
vLLM's real engine with tensor parallelism in arms: vLLM as it is (the plugin
disabled), with the thresholds, and optionally each backend forced alone.
Every arm is a fresh engine process (arxtune.harness.e2e_engine) started with the
arm's environment; arms alternate A B A B ... so drift hits them alike.

Per arm it reports decode time per token (from vLLM's own request timestamps:
last token minus first token over the tokens after the first), prefill time
(first token minus scheduling), each TP worker's call counts by backend, and
whether the greedy token ids match the first vLLM-default engine's.

Result format history:
- version 1: e2e.json as written by `_write` (config, provenance, per-arm summaries, ratios, engines).
"""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from arxtune.runtime import schema
from arxtune.runtime.errors import ArxtuneError, FormatError
from arxtune.runtime.fileio import check_name, check_run_folder, read_text, write_text_atomic
from arxtune.runtime.schema import MAX_COUNT
from arxtune.harness.stats import summarize
from arxtune.runtime.thresholds import Range, Table, Thresholds
from arxtune.runtime import env

E2E_VERSION = 1
KIND = "arxtune-e2e"
TINY_MODEL = Path(__file__).resolve().parent / "models" / "tiny-llama"  # package data: installed with arxtune
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
            raise ArxtuneError(f"prompt plus decode tokens ({self.prompt_tokens + self.decode_tokens}) exceed --max-model-len {self.max_model_len}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ArxtuneError(f"--node-rank {self.node_rank} must be between 0 and --nnodes - 1 ({self.nnodes - 1})")
        if self.tensor_parallel_size % self.nnodes:
            raise ArxtuneError(f"--nnodes {self.nnodes} must divide --tp {self.tensor_parallel_size}")


@dataclass(frozen=True)
class Arm:
    name: str
    env: dict = field(default_factory=dict)  # what this arm's engine process gets on top of the caller's environment


def thresholds_for(world: int, dtype: str, ranges: dict[str, list[tuple[int, str]]], baseline: str = VLLM_BASELINE,
                   run_id: str = "e2e") -> Thresholds:
    """A thresholds file from {op: [(lower bound in bytes, backend), ...]} (each range ends where the next starts)."""
    tables = []
    for op, starts in ranges.items():
        bounds = [lo for lo, _ in starts[1:]] + [None]
        tables.append(Table(op, dtype, world, tuple(Range(lo, hi, backend) for (lo, backend), hi in zip(starts, bounds))))
    return Thresholds(baseline=baseline, margin=0.0, provenance={"run_id": run_id}, tables=tuple(tables))


def forced_thresholds(backend: str, world: int, dtype: str) -> Thresholds:
    """Every size of every op to `backend`."""
    return thresholds_for(world, dtype, {op: [(0, backend)] for op in ("all_reduce", "all_gather", "reduce_scatter")},
                          run_id=f"e2e-forced-{backend}")


def make_arms(cfg: E2EConfig, run_dir: Path) -> list[Arm]:
    arms = [Arm(BASELINE_ARM, {env.VLLM_DISABLE.name: "1"})]
    if cfg.thresholds:
        arms.append(Arm(THRESHOLDS_ARM, {env.THRESHOLDS.name: str(Path(cfg.thresholds).resolve())}))
    for backend in cfg.force:
        path = forced_thresholds(backend, cfg.tensor_parallel_size, cfg.dtype).save(run_dir / f"forced-{backend}.json")
        arms.append(Arm(f"force:{backend}", {env.THRESHOLDS.name: str(path.resolve())}))
    return arms


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
    return {"model": str(model_dir.resolve()) if model_dir.is_dir() else cfg.model, "load_format": load_format,
            "tensor_parallel_size": cfg.tensor_parallel_size, "dtype": cfg.dtype, "max_model_len": cfg.max_model_len,
            "nnodes": cfg.nnodes, "node_rank": cfg.node_rank, "master_addr": cfg.master_addr,
            "master_port": cfg.master_port, "decode_tokens": cfg.decode_tokens, "rounds": cfg.rounds,
            "rpc_timeout_s": 600, "prompts": prompt_token_ids(cfg, _vocab_size(cfg.model))}


def run_engine(spec: dict, env: dict, out: Path, timeout_s: float) -> dict:
    """Run one engine process (arxtune.harness.e2e_engine) to completion; its output goes to out.log."""
    spec_path, result_path, log_path = out.with_suffix(".spec.json"), out.with_suffix(".json"), out.with_suffix(".log")
    spec_path.write_text(json.dumps(spec))
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "arxtune.harness.e2e_engine", str(spec_path), str(result_path)],
                                env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the engine and the workers it spawned
            proc.wait()
            raise ArxtuneError(f"engine {out.name} did not finish within {timeout_s:.0f} s (raise --timeout-s); its output: {log_path}") from None
    if not result_path.is_file():
        raise ArxtuneError(f"engine {out.name} exited with code {proc.returncode} without a result; its output: {log_path}")
    result = json.loads(result_path.read_text())
    if result["error"]:
        last = result["error"].strip().splitlines()[-1]
        raise ArxtuneError(f"engine {out.name} failed: {last}; its output: {log_path}")
    return result


def _round_samples(rounds: list[list[dict]]) -> tuple[list[float], list[float]]:
    """(decode us per token, prefill us) per round: the median request's, the batch's."""
    decode, prefill = [], []
    for requests in rounds:
        per_token = sorted((r["last_token_ts"] - r["first_token_ts"]) / (r["generated"] - 1) for r in requests)
        decode.append(per_token[len(per_token) // 2] * 1e6)
        prefill.append((max(r["first_token_ts"] for r in requests) - min(r["scheduled_ts"] for r in requests)) * 1e6)
    return decode, prefill


def _tokens(engine: dict) -> list[list[list[int]]]:
    return [[r["token_ids"] for r in requests] for requests in engine["rounds"]]


def summarize_arms(arms: list[str], engines: list[dict]) -> dict:
    """Per arm: decode and prefill summaries, summed call counts per TP worker, tokens vs the reference."""
    reference = next((_tokens(e)[0] for e in engines if e["arm"] == BASELINE_ARM), None)
    summary = {}
    for arm in arms:
        mine = [e for e in engines if e["arm"] == arm]
        if not mine:
            continue
        decode, prefill = [], []
        workers: dict[int, Counter] = {}
        for engine in mine:
            d, p = _round_samples(engine["rounds"])
            decode += d
            prefill += p
            for w in engine["workers"]:
                workers.setdefault(w["tp_rank"], Counter()).update(w["calls"] or {})
        tokens = [rounds for e in mine for rounds in _tokens(e)]
        summary[arm] = {
            "engines": len(mine), "decode_us_per_token": decode, "prefill_us": prefill,
            "decode": asdict(summarize(decode)), "prefill": asdict(summarize(prefill)),
            "calls": {str(rank): dict(sorted(c.items())) for rank, c in sorted(workers.items())},
            "plugin": any(w["calls"] is not None for e in mine for w in e["workers"]),
            "tokens_identical": reference is not None and all(t == reference for t in tokens),
        }
    return summary


def ratio(arm: dict, base: dict) -> dict:
    """Median decode time per token of `arm` over `base`, with a conservative interval from both medians' intervals."""
    a, b = arm["decode"], base["decode"]
    return {"median": a["median_us"] / b["median_us"], "low": a["ci_low_us"] / b["ci_high_us"], "high": a["ci_high_us"] / b["ci_low_us"]}


def _provenance() -> dict:
    versions = {}
    for module in ("torch", "vllm"):
        try:
            versions[module] = __import__(module).__version__
        except Exception as exc:  # recorded, not fatal: the engines report their own failure
            versions[module] = f"unavailable ({type(exc).__name__})"
    from arxtune import __version__

    return {"host": platform.node(), "python": sys.executable, "arxtune": __version__, **versions,
            "command": " ".join(["arxtune", *sys.argv[1:]])}


def _write(run_dir: Path, cfg: E2EConfig, arms: list[Arm], engines: list[dict], started: str, finished: str | None) -> dict:
    summary = summarize_arms([a.name for a in arms], engines)
    ratios = {arm: ratio(s, summary[BASELINE_ARM]) for arm, s in summary.items() if arm != BASELINE_ARM and BASELINE_ARM in summary}
    result = {"kind": KIND, "version": E2E_VERSION, "config": asdict(cfg), "provenance": _provenance(),
              "started": started, "finished": finished, "arms": [asdict(a) for a in arms],
              "order": [e["arm"] for e in engines], "summary": summary, "ratio_vs_vllm": ratios,
              "engines": [{"arm": e["arm"], "startup_s": e["startup_s"], "workers": e["workers"]} for e in engines]}
    write_text_atomic(run_dir / "e2e.json", json.dumps(result, indent=2) + "\n", "e2e result")
    return result


def run_e2e(cfg: E2EConfig, run_id: str | None = None, say=print) -> Path:
    """Run every arm `repeats` times, alternating; write e2e.json (after each engine) and e2e.png; return the run dir."""
    spec = engine_spec(cfg)
    if cfg.thresholds:
        from arxtune.runtime.thresholds import load

        load(cfg.thresholds)  # a bad file is the user's error here, before any engine starts
    started = time.strftime("%Y%m%d-%H%M%S")
    out = check_run_folder(cfg.out, "--out directory")
    run_dir = out / check_name(run_id or f"e2e-{started}-{platform.node()}-tp{cfg.tensor_parallel_size}", "--run-id")
    if cfg.node_rank > 0:
        run_dir = run_dir.with_name(run_dir.name + f"-node{cfg.node_rank}")
    try:
        run_dir.mkdir()
    except FileExistsError:
        raise ArxtuneError(f"{run_dir} exists; results are never overwritten: pass another --run-id") from None
    except OSError as exc:
        raise ArxtuneError(f"cannot create {run_dir} ({exc.strerror}); choose another --out") from None
    arms = make_arms(cfg, run_dir)
    engines: list[dict] = []
    for repeat in range(cfg.repeats):
        for arm in arms:
            label = f"engine-{len(engines):02d}-{arm.name.replace(':', '-')}"
            say(f"e2e: {label} (repeat {repeat + 1}/{cfg.repeats})")
            result = run_engine(spec, arm.env, run_dir / label, cfg.timeout_s)
            if cfg.node_rank == 0:
                engines.append({"arm": arm.name, **result})
                _write(run_dir, cfg, arms, engines, started, None)
            else:
                engines.append({"arm": arm.name})
    if cfg.node_rank == 0:
        result = _write(run_dir, cfg, arms, engines, started, time.strftime("%Y%m%d-%H%M%S"))
        plot_e2e(result, run_dir / "e2e.png")
    return run_dir


def _summary_entry(value, where: str) -> dict:
    """One arm's summary, as report_lines reads it."""
    s = schema.table(value, where)
    for part, keys in (("decode", ("median_us", "ci_low_us", "ci_high_us")), ("prefill", ("median_us",))):
        stats = schema.table(s.get(part), f"{where}.{part}")
        for key in keys:
            schema.number(stats.get(key), f"{where}.{part}.{key}")
    if not isinstance(s.get("tokens_identical"), bool) or not isinstance(s.get("plugin", False), bool):
        raise FormatError(f"{where}.tokens_identical and .plugin must be true or false")
    for rank, calls in schema.table(s.get("calls"), f"{where}.calls").items():
        for backend, count in schema.table(calls, f"{where}.calls.{rank}").items():
            schema.integer(count, f"{where}.calls.{rank}.{backend}")
    return s


def _ratio_entry(value, where: str) -> dict:
    r = schema.table(value, where)
    for key in ("median", "low", "high"):
        schema.number(r.get(key), f"{where}.{key}")
    return r


def load_result(path: str | Path) -> dict:
    """e2e.json (or a directory holding it), checked field by field: what report_lines reads is there and well typed."""
    path = Path(path)
    path = path / "e2e.json" if path.is_dir() else path
    try:
        data = schema.table(schema.parse_json(read_text(path, "e2e result"), str(path)), "the file")
        if data.get("kind") != KIND or isinstance(data.get("version"), bool) or data.get("version") != E2E_VERSION:
            raise FormatError(f"not an e2e result of version {E2E_VERSION}")
        for arm, entry in schema.table(data.get("summary"), "summary").items():
            _summary_entry(entry, f"summary.{arm}")
        for arm, entry in schema.table(data.get("ratio_vs_vllm"), "ratio_vs_vllm").items():
            _ratio_entry(entry, f"ratio_vs_vllm.{arm}")
    except ArxtuneError as exc:
        raise FormatError(f"{path}: {str(exc).removeprefix(str(path) + ': ')}; re-run `arxtune e2e`") from None
    return data


def report_lines(result: dict) -> list[str]:
    """The comparison as printed: one line per arm, then the ratio to vLLM's default."""
    lines = [f"{'arm':<14}{'decode ms/token, median [95% CI]':<36}{'prefill ms':<12}{'tokens':<12}calls per TP worker"]
    for arm, s in result["summary"].items():
        d, p = s["decode"], s["prefill"]
        tokens = "reference" if arm == BASELINE_ARM else ("identical" if s["tokens_identical"] else "DIFFERENT")
        calls = "; ".join(f"tp{rank}: " + ", ".join(f"{k} {n}" for k, n in c.items()) for rank, c in s["calls"].items() if c)
        decode = f"{d['median_us'] / 1e3:.3f} [{d['ci_low_us'] / 1e3:.3f}, {d['ci_high_us'] / 1e3:.3f}]"
        calls = calls or ("nothing routed" if s.get("plugin") else "plugin off")
        lines.append(f"{arm:<14}{decode:<36}{p['median_us'] / 1e3:<12.3f}{tokens:<12}{calls}")
    for arm, r in result["ratio_vs_vllm"].items():
        lines.append(f"{arm} vs vLLM default: decode time per token x{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}] (< 1 is faster)")
    return lines


def plot_e2e(result: dict, out: Path) -> Path:
    """Decode time per token and prefill time per arm: every sample, the median and its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(result["summary"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, summary_key, title in ((axes[0], "decode_us_per_token", "decode", "decode time per token"),
                                        (axes[1], "prefill_us", "prefill", "prefill time (batch)")):
        for i, arm in enumerate(arms):
            s = result["summary"][arm]
            samples = [v / 1e3 for v in s[key]]
            ax.scatter([i] * len(samples), samples, s=10, alpha=0.4)
            m = s[summary_key]
            ax.errorbar([i + 0.15], [m["median_us"] / 1e3], yerr=[[(m["median_us"] - m["ci_low_us"]) / 1e3], [(m["ci_high_us"] - m["median_us"]) / 1e3]],
                        fmt="o", color="black", capsize=4)
        ax.set_xticks(range(len(arms)), arms)
        ax.set_yscale("log")  # a loaded machine's outliers would flatten everything else
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    cfg = result["config"]
    fig.suptitle(f"vLLM TP={cfg['tensor_parallel_size']} {Path(cfg['model']).name} {cfg['dtype']}: "
                 f"{cfg['prompts']} prompts x {cfg['decode_tokens']} tokens, {result['provenance']['host']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
