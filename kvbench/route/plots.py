"""PNGs of ``kvbench route``: hit rate and imbalance per policy; load per replica over time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvbench.route.result import PolicyResult

_DPI = 110


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure, plt, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=_DPI, bbox_inches="tight")
    plt.close(figure)
    return path


def plot_policies(results: Sequence[PolicyResult], path: Path, title: str) -> Path:
    """Left: token hit rate per policy (bars, 0..1). Right: load imbalance per policy, max / mean of
    requests and of busy (prefill) time across replicas (1 = even)."""
    plt = _pyplot()
    figure, (hits, imbalance) = plt.subplots(1, 2, figsize=(11.0, 4.4))
    names = [r.policy for r in results]
    rows = [r.as_row() for r in results]
    x = np.arange(len(names))
    hits.bar(x, [row["token_hit_rate"] for row in rows], color="tab:blue")
    hits.set_ylim(0, 1.02)
    hits.set_ylabel("token hit rate (cached / prompt tokens)")
    imbalance.bar(x - 0.2, [row["requests_max_over_mean"] for row in rows], 0.4, label="requests")
    imbalance.bar(x + 0.2, [row["busy_max_over_mean"] for row in rows], 0.4, label="busy time")
    imbalance.axhline(1.0, color="grey", lw=0.8, ls="--")
    imbalance.set_ylabel("busiest replica / mean")
    imbalance.legend(fontsize=8)
    for axis in (hits, imbalance):
        axis.set_xticks(x, names, rotation=30, ha="right")
        axis.grid(alpha=0.3, axis="y")
    figure.suptitle(title)
    return _save(figure, plt, path)


def plot_load_over_time(results: Sequence[PolicyResult], path: Path, title: str) -> Path:
    """One panel per policy: each replica's load (requests in flight, y) at every arrival (x, s)."""
    plt = _pyplot()
    columns = min(3, len(results))
    rows = -(-len(results) // columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 3.0 * rows), squeeze=False, sharey=True
    )
    for axis, result in zip(axes.flat, results):
        run = result.run
        for replica in range(run.config.num_replicas):
            axis.plot(run.trace.arrivals_s, run.loads[:, replica], lw=0.7, drawstyle="steps-post")
        axis.set_title(result.policy, fontsize=9)
        axis.set_xlabel("trace time (s)")
        axis.grid(alpha=0.3)
    for axis in axes[:, 0]:
        axis.set_ylabel("requests in flight")
    for axis in list(axes.flat)[len(results) :]:
        axis.set_visible(False)
    figure.suptitle(title)
    return _save(figure, plt, path)
