"""PNG plots for ``kvbench memory``: memory over time for both allocators, blocks per sharing step.

matplotlib is imported inside the functions (Agg backend, no display needed) so that commands
which draw nothing start fast.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from kvbench.memory.sharing import SharingResult
from kvbench.memory.waste import WasteResult, WasteStats

_NUM_SAMPLES = 2000  # points per curve; the table has the exact peaks
_TITLE_CHARS = 70  # a longer title is wrapped onto more lines rather than cut at the figure's edge


def wrapped_title(title: str) -> str:
    """``title`` broken into lines of at most :data:`_TITLE_CHARS` characters (at commas or spaces)."""
    return "\n".join(textwrap.wrap(title, _TITLE_CHARS)) or title


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _unit(num_bytes: float) -> tuple[str, float]:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return unit, float(scale)
    return "B", 1.0


def _waste_curves(stats: WasteStats, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    first = stats.timeline.steps[0]
    held, reserved = stats.timeline.sample(np.maximum(steps, first))
    return held, reserved


def plot_waste(result: WasteResult, path: Path, title: str) -> Path:
    """Memory over time: KV held and memory reserved, one panel per allocator; writes ``path``."""
    plt = _pyplot()
    config = result.config
    unit, scale = _unit(config.pool_bytes)
    first = min(result.contiguous.timeline.steps[0], result.paged.timeline.steps[0])
    last = max(result.contiguous.timeline.steps[-1], result.paged.timeline.steps[-1])
    steps = np.linspace(first, max(last, first + 1), _NUM_SAMPLES).round().astype(np.int64)
    seconds = (steps - first) * config.step_ms / 1000.0
    figure, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, sharey=True)
    for axis, stats, label in (
        (axes[0], result.contiguous, "contiguous (reserve per request)"),
        (axes[1], result.paged, "paged (blocks on demand)"),
    ):
        held, reserved = _waste_curves(stats, steps)
        held_scaled = held * config.bytes_per_token / scale
        reserved_scaled = reserved * config.bytes_per_token / scale
        axis.plot(seconds, reserved_scaled, color="tab:orange", lw=1.0, label="reserved / allocated")
        axis.plot(seconds, held_scaled, color="tab:blue", lw=1.0, label="holding KV")
        axis.fill_between(
            seconds,
            held_scaled,
            reserved_scaled,
            color="tab:orange",
            alpha=0.25,
            label="reserved, no KV (internal fragmentation)",
        )
        axis.axhline(config.pool_bytes / scale, color="black", ls="--", lw=0.8, label="pool")
        axis.set_title(label, fontsize=10)
        axis.set_ylabel(f"KV memory ({unit})")
    axes[1].set_xlabel("time since first arrival (s)")
    figure.suptitle(wrapped_title(title))
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.05, 1, 1))  # room for the legend under the panels
    return _save(figure, plt, path)


def plot_sharing(result: SharingResult, path: Path, title: str, bytes_per_block: int) -> Path:
    """Blocks in use per decode step with and without sharing; writes ``path``."""
    plt = _pyplot()
    steps = np.arange(len(result.used_blocks_per_step))
    unit, scale = _unit(result.peak_unshared_blocks * bytes_per_block)
    figure, axis = plt.subplots(figsize=(9, 4.5))
    axis.plot(
        steps,
        np.array(result.unshared_blocks_per_step) * bytes_per_block / scale,
        color="tab:red",
        drawstyle="steps-post",
        label="private copy per sequence",
    )
    axis.plot(
        steps,
        np.array(result.used_blocks_per_step) * bytes_per_block / scale,
        color="tab:green",
        drawstyle="steps-post",
        label="shared blocks + copy-on-write",
    )
    axis.set_xlabel("decode step (tokens generated per sequence)")
    axis.set_ylabel(f"KV memory in use ({unit})")
    axis.set_ylim(bottom=0)
    axis.set_title(wrapped_title(title))
    # under the axes: off the lines
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    figure.tight_layout()
    return _save(figure, plt, path)


def _save(figure, plt, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")  # nothing drawn outside the saved image
    plt.close(figure)
    return path
