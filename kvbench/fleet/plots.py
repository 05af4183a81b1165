"""The PNG of ``kvbench fleet``: per policy, each replica's hit rate and the fleet's, measured against
``kvbench route``'s expectation."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvbench.fleet.experiment import FleetOutcome
from kvbench.fleet.table import policy_rows
from kvbench.route.plots import _pyplot, _save


def plot_fleet(outcome: FleetOutcome, path: Path) -> Path:
    """Grouped bars, one group per policy: each replica's token hit rate (its own /metrics), then the
    fleet's (the client's usage), with the expected fleet hit rate as a black tick. Raises
    ``ImportError`` without matplotlib."""
    plt = _pyplot()
    tables = [policy_rows(run.policy, run.outcome) for run in outcome.runs]
    width = 0.8 / max(len(table) for table in tables)
    figure, axis = plt.subplots(figsize=(max(6.0, 2.2 * len(tables)), 4.4))
    for group, table in enumerate(tables):
        for offset, line in enumerate(table):
            x = group - 0.4 + width * (offset + 0.5)
            color = "tab:blue" if line.is_fleet else "tab:gray"
            axis.bar(x, line.hit_rate or 0.0, width * 0.9, color=color)
            if line.is_fleet and line.expected_hit_rate is not None:
                axis.plot([x - width / 2, x + width / 2], [line.expected_hit_rate] * 2, color="black", lw=2)
    axis.set_xticks(np.arange(len(tables)), [run.policy for run in outcome.runs])
    axis.set_ylim(0, 1.02)
    axis.set_ylabel("token hit rate (cached / prompt tokens)")
    axis.grid(alpha=0.3, axis="y")
    axis.set_title(
        f"{outcome.config.router.value} router, {len(outcome.worker_urls)} replicas: grey = each replica, "
        "blue = fleet, black = expected"
    )
    return _save(figure, plt, path)
