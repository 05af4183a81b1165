"""The table ``kvbench sweep --backend openai`` prints: one row per load point, mean [95% CI] per number.

The table itself is :func:`kvbench.results.load_sweep_report.load_sweep_table` (``kvbench report``
shows the same one from ``load_sweep.parquet``); this renders it for the console.
"""

from __future__ import annotations

from rich.table import Table

from kvbench.commands.report import rich_table
from kvbench.results.load_sweep_report import load_sweep_table


def load_points_table(outcome, complete: bool = True) -> Table:
    """Mean over each point's runs, with the bootstrap 95% interval in brackets when it has >= 2."""
    return rich_table(load_sweep_table(outcome.name, outcome.axis, outcome.points, complete))
