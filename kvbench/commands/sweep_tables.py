"""The tables ``kvbench sweep`` prints: one row per cache size (engine sweep), or one row per load point
(``--backend openai``), mean [95% CI] per number.

The load table itself is :func:`kvbench.results.load_sweep_report.load_sweep_table` (``kvbench report``
shows the same one from ``load_sweep.parquet``); this renders it for the console.
"""

from __future__ import annotations

from rich.table import Table

from kvbench.commands.report import rich_table
from kvbench.results.load_sweep_report import load_sweep_table


def load_points_table(outcome, complete: bool = True) -> Table:
    """Mean over each point's runs, with the bootstrap 95% interval in brackets when it has >= 2."""
    return rich_table(load_sweep_table(outcome.name, outcome.axis, outcome.points, complete))


def points_table(name: str, points) -> Table:
    """One row per cache size (:class:`kvbench.results.sweep.SweepPoint`); with ``--repeats`` R > 1 the
    TTFT p50 is the median of the R runs and the next column their min .. max."""
    repeated = any(point.num_repeats > 1 for point in points)
    table = Table(title=f"kvbench sweep: {name}")
    columns = ["capacity (blocks)", "token hit rate", "TTFT p50 (ms)"]
    columns += [f"min .. max of {max(p.num_repeats for p in points)}"] if repeated else []
    for column in (*columns, "TTFT p90 (ms)", "requests", "errors"):
        table.add_column(column, justify="right")
    for point in points:
        cells = [
            f"{point.capacity_blocks:,}",
            _number(point.token_hit_rate, "{:.4f}"),
            _number(point.p50_ttft_ms),
        ]
        if repeated:
            spread = point.min_p50_ttft_ms is not None and point.max_p50_ttft_ms is not None
            cells.append(f"{point.min_p50_ttft_ms:,.1f} .. {point.max_p50_ttft_ms:,.1f}" if spread else "-")
        cells += [_number(point.p90_ttft_ms), str(point.num_requests), str(point.num_errors)]
        table.add_row(*cells)
    return table


def _number(value: float | None, form: str = "{:,.1f}") -> str:
    return "-" if value is None else form.format(value)
