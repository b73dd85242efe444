"""The comparison's numbers: per-arm statistics from the engines' timestamps, and e2e.json written and read back checked."""

from __future__ import annotations

import json
import platform
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from arxtune.harness.e2e.config import BASELINE_ARM, E2E_VERSION, KIND, READABLE_E2E_VERSIONS, Arm, E2EConfig, batch_settings
from arxtune.harness.stats import summarize
from arxtune.runtime import schema
from arxtune.runtime.errors import ArxtuneError, FormatError
from arxtune.runtime.fileio import Staged, read_text, write_text_atomic


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


def divergence(rounds: list[list[list[int]]], reference: list[list[int]]) -> list[dict]:
    """Per prompt, over every round given: the first token position that differs from the reference (None: none
    does) and the share of positions whose token is the reference's."""
    found = []
    for prompt, want in enumerate(reference):
        firsts, shares = [], []
        for tokens in (r[prompt] for r in rounds):
            same = [a == b for a, b in zip(tokens, want)] + [False] * abs(len(tokens) - len(want))
            firsts.append(same.index(False) if False in same else None)
            shares.append(sum(same) / max(len(same), 1))
        differing = [f for f in firsts if f is not None]
        found.append(
            {"prompt": prompt, "first_difference": min(differing) if differing else None, "identical_share": sum(shares) / len(shares)}
        )
    return found


def summarize_arms(arms: list[str], engines: list[dict], loose: dict[str, list[str]] | None = None) -> dict:
    """Per arm: decode and prefill summaries, summed call counts per TP worker, tokens vs the reference, and
    whether they had to be identical (`loose`: per arm, the ranges it routes to backends not known to give the
    baseline's bits; none, and any difference is a failure) or how far they diverged."""
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
        identical = reference is not None and all(t == reference for t in tokens)
        summary[arm] = {
            "engines": len(mine),
            "decode_us_per_token": decode,
            "prefill_us": prefill,
            "decode": asdict(summarize(decode)),
            "prefill": asdict(summarize(prefill)),
            "calls": {str(rank): dict(sorted(c.items())) for rank, c in sorted(workers.items())},
            "plugin": any(w["calls"] is not None for e in mine for w in e["workers"]),
            "tokens_identical": identical,
            "loose_ranges": list((loose or {}).get(arm, [])),
            "divergence": [] if identical or reference is None else divergence(tokens, reference),
        }
    return summary


def failures(result: dict) -> list[str]:
    """The arms whose tokens had to equal vLLM's own and did not: every range they route away from vLLM's path
    gives the baseline's bits, so a difference is a backend changing results."""
    return [
        f"arm {arm}'s tokens differ from vLLM's own though every range it routes away from vLLM's path gives the "
        f"baseline's bits (first at token {min((d['first_difference'] for d in s['divergence'] if d['first_difference'] is not None), default=0)})"
        for arm, s in result["summary"].items()
        if arm != BASELINE_ARM and not s["tokens_identical"] and not s.get("loose_ranges") and s.get("divergence")
    ]


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

    return {
        "host": platform.node(),
        "python": sys.executable,
        "arxtune": __version__,
        **versions,
        "command": " ".join(["arxtune", *sys.argv[1:]]),
    }


def write_result(
    run_dir: Path, cfg: E2EConfig, arms: list[Arm], engines: list[dict], started: str, finished: str | None, into: Staged | None = None
) -> dict:
    """e2e.json as it stands (after each engine, and once finished); `into`: staged with the command's other outputs."""
    summary = summarize_arms([a.name for a in arms], engines, {a.name: list(a.loose) for a in arms})
    ratios = {arm: ratio(s, summary[BASELINE_ARM]) for arm, s in summary.items() if arm != BASELINE_ARM and BASELINE_ARM in summary}
    result = {
        "kind": KIND,
        "version": E2E_VERSION,
        "config": asdict(cfg),
        "batch": batch_settings(cfg),
        "provenance": _provenance(),
        "started": started,
        "finished": finished,
        "arms": [asdict(a) for a in arms],
        "order": [e["arm"] for e in engines],
        "summary": summary,
        "ratio_vs_vllm": ratios,
        "engines": [{"arm": e["arm"], "startup_s": e["startup_s"], "workers": e["workers"]} for e in engines],
    }
    (into.write_text if into is not None else write_text_atomic)(run_dir / "e2e.json", json.dumps(result, indent=2) + "\n", "e2e result")
    return result


def _summary_entry(value, where: str) -> dict:
    """One arm's summary, as report_lines reads it."""
    s = schema.table(value, where)
    for part, keys in (("decode", ("median_us", "ci_low_us", "ci_high_us")), ("prefill", ("median_us",))):
        stats = schema.table(s.get(part), f"{where}.{part}")
        for key in keys:
            schema.number(stats.get(key), f"{where}.{part}.{key}")
    if not isinstance(s.get("tokens_identical"), bool) or not isinstance(s.get("plugin", False), bool):
        raise FormatError(f"{where}.tokens_identical and .plugin must be true or false")
    schema.strings(s.get("loose_ranges", []), f"{where}.loose_ranges")
    for i, d in enumerate(schema.items(s.get("divergence", []), f"{where}.divergence", lambda v, w: schema.table(v, w))):
        schema.integer(d.get("prompt"), f"{where}.divergence[{i}].prompt")
        if d.get("first_difference") is not None:
            schema.integer(d["first_difference"], f"{where}.divergence[{i}].first_difference")
        schema.number(d.get("identical_share"), f"{where}.divergence[{i}].identical_share", hi=1.0)
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
        if data.get("kind") != KIND or isinstance(data.get("version"), bool) or data.get("version") not in READABLE_E2E_VERSIONS:
            raise FormatError(f"not an e2e result of version {' or '.join(map(str, READABLE_E2E_VERSIONS))}")
        for arm, entry in schema.table(data.get("summary"), "summary").items():
            _summary_entry(entry, f"summary.{arm}")
        for arm, entry in schema.table(data.get("ratio_vs_vllm"), "ratio_vs_vllm").items():
            _ratio_entry(entry, f"ratio_vs_vllm.{arm}")
    except ArxtuneError as exc:
        raise FormatError(f"{path}: {str(exc).removeprefix(str(path) + ': ')}; re-run `arxtune e2e`") from None
    return data


def _tokens_word(arm: str, s: dict) -> str:
    if arm == BASELINE_ARM:
        return "reference"
    if s["tokens_identical"]:
        return "identical"
    return "diverged" if s.get("loose_ranges") else "DIFFERENT"


def report_lines(result: dict) -> list[str]:
    """The comparison as printed: one line per arm, then the ratio to vLLM's default, then how any arm's tokens
    diverged and whether that was expected."""
    batch = result.get("batch")
    lines = [
        f"batch: {result['config'].get('prompts', '?')} prompts submitted together, engine core {batch['engine_core']}, "
        f"max_num_seqs {batch['max_num_seqs']}, max_num_batched_tokens {batch['max_num_batched_tokens']}, the same in every arm"
        if batch
        else "batch: not pinned (an e2e result of version 1)"
    ]
    lines.append(f"{'arm':<14}{'decode ms/token, median [95% CI]':<36}{'prefill ms':<12}{'tokens':<12}calls per TP worker")
    for arm, s in result["summary"].items():
        d, p = s["decode"], s["prefill"]
        tokens = _tokens_word(arm, s)
        calls = "; ".join(f"tp{rank}: " + ", ".join(f"{k} {n}" for k, n in c.items()) for rank, c in s["calls"].items() if c)
        decode = f"{d['median_us'] / 1e3:.3f} [{d['ci_low_us'] / 1e3:.3f}, {d['ci_high_us'] / 1e3:.3f}]"
        calls = calls or ("nothing routed" if s.get("plugin") else "plugin off")
        lines.append(f"{arm:<14}{decode:<36}{p['median_us'] / 1e3:<12.3f}{tokens:<12}{calls}")
    for arm, r in result["ratio_vs_vllm"].items():
        lines.append(f"{arm} vs vLLM default: decode time per token x{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}] (< 1 is faster)")
    for arm, s in result["summary"].items():
        if not s.get("divergence"):
            continue
        loose = s.get("loose_ranges", [])
        if loose:
            lines.append(
                f"{arm}: tokens diverge from vLLM's, as expected: it routes {len(loose)} range(s) to backends not known to give "
                f"the baseline's bits ({loose[0]}{', ...' if len(loose) > 1 else ''}), whose sums may round otherwise (the ranks' "
                "values added in another order); greedy decoding then turns at the first near tie. Not a failure."
            )
        else:
            lines.append(f"{arm}: FAILED: tokens differ from vLLM's own though every range it routes away gives the baseline's bits")
        for d in s["divergence"]:
            first = "identical" if d["first_difference"] is None else f"first differs at token {d['first_difference']}"
            lines.append(f"  prompt {d['prompt']}: {first}, {d['identical_share']:.0%} of tokens identical")
    return lines
