"""Start-up time the ladder adds to vLLM's engine: engines started in turn, vLLM alone and the plugin per ARXTUNE_BOOT policy.

Each repeat starts one engine per arm (tiny Llama, TP=2, dummy weights, as
`arxtune e2e` does), in a rotated order so drift falls on every arm alike:

- `vllm`: the plugin off (ARXTUNE_VLLM_DISABLE=1), vLLM's own start-up;
- `off`, `check`, `adjust`: the plugin with the thresholds file `arxtune e2e`'s
  tests route with (decode-sized all-reduces and the logits all-gather to
  gloo, the rest to vLLM), under that ARXTUNE_BOOT policy.

An engine's start-up is `arxtune e2e`'s `startup_s` (the LLM's construction,
in the engine's process); on a small machine it varies by a second or more
from engine to engine, more than the ladder takes. So the plugin's own
set-up time (from its start-up line: loading and agreeing on the file,
opening backends, the ladder) is read too, which the rest of vLLM's start-up
does not blur. Printed per arm: the engine's start-up, median and range, and
the median of each repeat's difference against `off`; the plugin's set-up,
median, and its difference against `off` (what the ladder adds), also as a
share of the `vllm` arm's start-up; the ladder's own time. Engines' logs and
results go to --out.

    PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/engine_boot_ladder.py --out DIR [--repeats 5]

Only relative figures mean something on a loaded machine; say what else ran.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
from pathlib import Path

from arxtune.harness.e2e import E2EConfig, engine_spec, run_engine, thresholds_for

KiB = 1024
ARMS = ("vllm", "off", "check", "adjust")
#: From the plugin's start-up line: the ladder's time ("... in 0.86 s of 1") and the plugin's ("; set up in 0.95 s").
LADDER_TIME = re.compile(r"\] arxtune: .*ladder \w+: .* in ([0-9.]+) s of")
SETUP_TIME = re.compile(r"\] arxtune: tp:0 .*; set up in ([0-9.]+) s$")


def said(pattern: re.Pattern, log: str) -> list[float]:
    return [float(m.group(1)) for m in map(pattern.search, log.splitlines()) if m][:1]


def arm_env(arm: str, thresholds: Path, boot_out: Path) -> dict[str, str]:
    base = {"VLLM_TARGET_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if arm == "vllm":
        return {**base, "ARXTUNE_VLLM_DISABLE": "1"}
    return {**base, "ARXTUNE_THRESHOLDS": str(thresholds), "ARXTUNE_BOOT": arm, "ARXTUNE_BOOT_OUT": str(boot_out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--repeats", type=int, default=5, help="Engines per arm.")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"Comma-separated, of {', '.join(ARMS)}; 'off' is the reference.")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="Per engine.")
    args = parser.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    if "off" not in arms or set(arms) - set(ARMS):
        parser.error(f"--arms takes {', '.join(ARMS)} and must include off")
    args.out.mkdir(parents=True, exist_ok=True)
    for key in [k for k in os.environ if k.startswith("ARXTUNE_")]:
        del os.environ[key]  # only what an arm sets
    routed = thresholds_for(
        2,
        "bfloat16",
        {"all_reduce": [(0, "gloo"), (4 * KiB, "vllm_cpu")], "all_gather": [(0, "vllm_cpu"), (8 * KiB, "gloo")]},
        run_id="engine-boot-ladder",
    )
    path = routed.save(args.out / "routed.json")
    spec = engine_spec(E2EConfig(prompts=1, prompt_tokens=8, decode_tokens=2, rounds=1))
    startup: dict[str, list[float]] = {arm: [] for arm in arms}
    ladder_s: dict[str, list[float]] = {arm: [] for arm in arms}
    setup_s: dict[str, list[float]] = {arm: [] for arm in arms}
    engine = 0
    for repeat in range(args.repeats):
        order = arms[repeat % len(arms) :] + arms[: repeat % len(arms)]
        for arm in order:
            out = args.out / f"engine-{engine:02d}-{arm}"
            engine += 1
            result = run_engine(spec, arm_env(arm, path, args.out / "boot"), out, args.timeout_s)
            startup[arm].append(result["startup_s"])
            log = out.with_suffix(".log").read_text()
            ladder_s[arm] += said(LADDER_TIME, log)
            setup_s[arm] += said(SETUP_TIME, log)
            print(
                f"repeat {repeat + 1}/{args.repeats} {arm:7s} start-up {result['startup_s']:6.2f} s"
                + (f", plugin set-up {setup_s[arm][-1]:.2f} s" if arm != "vllm" else "")
                + (f" (ladder {ladder_s[arm][-1]:.2f} s)" if arm not in ("vllm", "off") else ""),
                flush=True,
            )
    (args.out / "startup.json").write_text(json.dumps({"startup_s": startup, "setup_s": setup_s, "ladder_s": ladder_s}, indent=1))
    own = statistics.median(startup["vllm"]) if "vllm" in startup else None
    median = statistics.median
    print(f"\nTiny Llama TP=2 on CPU, {args.repeats} engines per arm in rotated order (s):")
    for arm in arms:
        t = startup[arm]
        line = (
            f"  {arm:7s} engine start-up {median(t):6.2f} (range {min(t):.2f}-{max(t):.2f}, "
            f"against off per repeat {median(a - b for a, b in zip(t, startup['off'])):+.2f})"
        )
        if setup_s[arm]:
            added = median(setup_s[arm]) - median(setup_s["off"])
            share = f" = {100 * added / own:.1f}% of vLLM's {own:.2f} s" if own and arm != "off" else ""
            line += f"; plugin set-up {median(setup_s[arm]):.2f} (against off {added:+.2f}{share})"
        if ladder_s[arm]:
            line += f"; ladder {median(ladder_s[arm]):.2f}"
        print(line)


if __name__ == "__main__":
    main()
