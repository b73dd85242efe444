"""The comparison as a picture: decode and prefill time per arm, every sample with the median and its interval."""

from __future__ import annotations

import io
from pathlib import Path

from arxtune.runtime.fileio import Staged, write_bytes_atomic


def plot_e2e(result: dict, out: Path, into: Staged | None = None) -> Path:
    """Decode time per token and prefill time per arm: every sample, the median and its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(result["summary"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, summary_key, title in (
        (axes[0], "decode_us_per_token", "decode", "decode time per token"),
        (axes[1], "prefill_us", "prefill", "prefill time (batch)"),
    ):
        for i, arm in enumerate(arms):
            s = result["summary"][arm]
            samples = [v / 1e3 for v in s[key]]
            ax.scatter([i] * len(samples), samples, s=10, alpha=0.4)
            m = s[summary_key]
            ax.errorbar(
                [i + 0.15],
                [m["median_us"] / 1e3],
                yerr=[[(m["median_us"] - m["ci_low_us"]) / 1e3], [(m["ci_high_us"] - m["median_us"]) / 1e3]],
                fmt="o",
                color="black",
                capsize=4,
            )
        ax.set_xticks(range(len(arms)), arms)
        ax.set_yscale("log")  # a loaded machine's outliers would flatten everything else
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    cfg = result["config"]
    fig.suptitle(
        f"vLLM TP={cfg['tensor_parallel_size']} {Path(cfg['model']).name} {cfg['dtype']}: "
        f"{cfg['prompts']} prompts x {cfg['decode_tokens']} tokens, {result['provenance']['host']}",
        fontsize=9,
    )
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, dpi=110, format="png")
    plt.close(fig)
    return (into.write_bytes if into is not None else write_bytes_atomic)(out, image.getvalue(), "e2e plot")
