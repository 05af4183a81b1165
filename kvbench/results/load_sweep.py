"""Load sweeps: one HTTP run per concurrency or request rate (K runs each), the points, the curve.

Each point aggregates its K runs: the mean of every headline number (:data:`HEADLINE`, vLLM's
keys) and, with K >= 2, a percentile-bootstrap confidence interval of that mean (Efron and
Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13): resample the K per-run values with
replacement, take each resample's mean, and keep the central ``confidence`` share. With few runs
(K = 3..5) the interval is rough and tends to be too narrow; it says how much runs disagree, not
more.

The summary file (``load_sweep.parquet``, one row per run, :data:`LOAD_SWEEP_SCHEMA`) carries
``"command": "load-sweep"``, the points and what the sweep ran in its metadata; each run's own
Parquet file beside it is an ordinary ``kvbench run`` file (``kvbench report`` reads those).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kvbench.results.parquet import write_rows

HEADLINE = (
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "median_e2el_ms",
    "token_hit_rate",
    "reported_hit_rate",
    "request_goodput",
    "slo_attainment_cache_hit",
    "slo_attainment_cache_miss",
    "failed",
)
NUM_RESAMPLES = 2000
LOAD_SWEEP_SCHEMA = pa.schema(
    [
        pa.field("axis", pa.string()),  # "concurrency" or "request_rate"
        pa.field("value", pa.float64()),  # clients, or requests/s
        pa.field("repeat", pa.int64()),  # 0..K-1
        *(pa.field(key, pa.float64()) for key in HEADLINE),
        pa.field("results_path", pa.string()),
    ]
)


@dataclass(frozen=True)
class LoadRun:
    """One run of a load sweep: the axis value, which repeat, its summary keys, its Parquet file."""

    value: float
    repeat: int
    summary: Mapping[str, Any]
    results_path: str


def bootstrap_ci(
    values: Sequence[float], confidence: float = 0.95, num_resamples: int = NUM_RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of the mean of ``values``; ``None`` for fewer than 2 values.

    Raises:
        ValueError: ``confidence`` outside (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    array = np.asarray(values, dtype=np.float64)
    if array.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = rng.choice(array, size=(num_resamples, array.size), replace=True).mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class LoadPoint:
    """One axis value: how many runs, the mean of each headline key (``None`` if never measured),
    and its bootstrap interval (``None`` with one run)."""

    value: float
    num_runs: int
    mean: dict[str, float | None]
    ci: dict[str, tuple[float, float] | None]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_points(runs: Sequence[LoadRun], confidence: float = 0.95) -> list[LoadPoint]:
    """The runs grouped by axis value (in the order first seen), each key averaged over its runs."""
    points = []
    for value in dict.fromkeys(run.value for run in runs):
        group = [run for run in runs if run.value == value]
        mean: dict[str, float | None] = {}
        ci: dict[str, tuple[float, float] | None] = {}
        for key in HEADLINE:
            values = [float(run.summary[key]) for run in group if run.summary.get(key) is not None]
            mean[key] = float(np.mean(values)) if values else None
            ci[key] = bootstrap_ci(values, confidence) if len(values) == len(group) else None
        points.append(LoadPoint(value, len(group), mean, ci))
    return points


def write_load_sweep(
    path: Path,
    axis: str,
    runs: Sequence[LoadRun],
    points: Sequence[LoadPoint],
    context: Mapping[str, Any],
    complete: bool,
) -> Path:
    """``load_sweep.parquet``: one row per run; the points and ``context`` in the metadata."""
    rows = [
        {
            "axis": axis,
            "value": run.value,
            "repeat": run.repeat,
            "results_path": run.results_path,
            **{key: run.summary.get(key) for key in HEADLINE},
        }
        for run in runs
    ]
    metadata = {
        "command": "load-sweep",
        "sweep": {**context, "axis": axis},
        "points": [point.as_dict() for point in points],
        "complete": complete,
    }
    return write_rows(path, rows, metadata, LOAD_SWEEP_SCHEMA)


def plot_load_sweep(points: Sequence[LoadPoint], axis: str, folder: Path) -> list[Path]:
    """Two PNGs in ``folder``: median TTFT against output throughput (the throughput-latency curve,
    one marker per point, labelled with its axis value) and goodput per point. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = "clients" if axis == "concurrency" else "req/s"
    measured = [
        p for p in points if p.mean["output_throughput"] is not None and p.mean["median_ttft_ms"] is not None
    ]
    figure, ax = plt.subplots(figsize=(6, 4))
    ax.plot(
        [p.mean["output_throughput"] for p in measured], [p.mean["median_ttft_ms"] for p in measured], "o-"
    )
    for point in measured:
        ax.annotate(
            f"{point.value:g} {label}",
            (point.mean["output_throughput"], point.mean["median_ttft_ms"]),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    ax.set_xlabel("output throughput (tokens/s)")
    ax.set_ylabel("median TTFT (ms)")
    ax.set_title(f"throughput vs latency, by {axis}")
    ax.grid(True, alpha=0.3)
    curve = folder / "throughput_vs_ttft.png"
    figure.tight_layout()
    figure.savefig(curve, dpi=120)
    plt.close(figure)
    paths = [curve]
    if any(p.mean["request_goodput"] is not None for p in points):
        figure, ax = plt.subplots(figsize=(6, 4))
        ax.bar([f"{p.value:g}" for p in points], [p.mean["request_goodput"] or 0.0 for p in points])
        ax.set_xlabel(f"{axis} ({label})")
        ax.set_ylabel("goodput (requests/s meeting every SLO)")
        ax.set_title("goodput per point")
        paths.append(folder / "goodput.png")
        figure.tight_layout()
        figure.savefig(paths[-1], dpi=120)
        plt.close(figure)
    return paths
