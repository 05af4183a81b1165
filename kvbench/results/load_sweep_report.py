"""A load sweep (``load_sweep.parquet``) as report material: its points table and its PNGs.

``kvbench sweep --backend openai`` prints this table (also on Ctrl-C, over the finished runs) and
``kvbench report load_sweep.parquet`` puts the same table and the same two PNGs
(:func:`kvbench.results.load_sweep.plot_load_sweep`) on its page: one table builder, one plotter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvbench.results.load_sweep import LoadPoint
from kvbench.results.report import Figure, TableData

COLUMNS = (  # (header, key, format); None: the SLO-met column, two keys in one cell
    ("req/s", "request_throughput", ".3f"),
    ("output tok/s", "output_throughput", ",.1f"),
    ("TTFT median (ms)", "median_ttft_ms", ",.0f"),
    ("TTFT p99 (ms)", "p99_ttft_ms", ",.0f"),
    ("TPOT median (ms)", "median_tpot_ms", ",.1f"),
    ("hit rate (reported)", "reported_hit_rate", ".3f"),
    ("goodput (req/s)", "request_goodput", ".3f"),
    ("SLO met: hits | misses", None, ""),
    ("failed", "failed", ".0f"),
)
CAPTION = "mean over runs [bootstrap 95% CI over runs]; goodput and SLO columns need --goodput"
FIGURE_CAPTIONS = {
    "throughput_vs_ttft": "Median TTFT against output throughput, one marker per load point (mean over its "
    "runs).",
    "goodput": "Goodput per load point: requests/s meeting every --goodput SLO.",
}


def read_points(metadata: Mapping[str, Any]) -> list[LoadPoint]:
    """The points stored in ``load_sweep.parquet``'s metadata (JSON lists back to interval tuples)."""
    return [
        LoadPoint(
            point["value"],
            point["num_runs"],
            dict(point["mean"]),
            {key: None if ci is None else (ci[0], ci[1]) for key, ci in point["ci"].items()},
        )
        for point in metadata.get("points") or []
    ]


def _cell(point: LoadPoint, key: str, spec: str) -> str:
    value = point.mean.get(key)
    if value is None:
        return "-"
    interval = point.ci.get(key)
    text = format(value, spec)
    return text if interval is None else f"{text} [{format(interval[0], spec)}, {format(interval[1], spec)}]"


def load_sweep_table(name: str, axis: str, points: Sequence[LoadPoint], complete: bool = True) -> TableData:
    """One row per load point: mean [bootstrap 95% CI] of each headline key (``-``: not measured).

    ``axis``: ``"concurrency"`` (rows labelled in clients) or ``"request_rate"`` (req/s sent)."""
    label = "clients" if axis == "concurrency" else "req/s sent"
    rows = []
    for point in points:
        slo = " | ".join(
            "-" if point.mean.get(k) is None else f"{point.mean[k]:.2f}"
            for k in ("slo_attainment_cache_hit", "slo_attainment_cache_miss")
        )
        cells = [slo if key is None else _cell(point, key, spec) for _, key, spec in COLUMNS]
        rows.append((f"{point.value:g}", str(point.num_runs), *cells))
    title = f"kvbench sweep: {name} ({axis})" + ("" if complete else ", interrupted: finished runs only")
    return TableData(title, (label, "runs", *(header for header, _, _ in COLUMNS)), tuple(rows), CAPTION)


def load_sweep_figures(
    points: Sequence[LoadPoint], axis: str, out_dir: Path, prefix: str = ""
) -> list[Figure]:
    """The sweep's PNGs in ``out_dir`` (names start with ``prefix``), with their captions. Needs
    matplotlib."""
    from kvbench.results.load_sweep import plot_load_sweep

    paths = plot_load_sweep(points, axis, out_dir)
    figures = []
    for path in paths:
        target = path.with_name(prefix + path.name) if prefix else path
        if target != path:
            path.replace(target)
        figures.append(Figure(target, FIGURE_CAPTIONS.get(path.stem, "")))
    return figures
