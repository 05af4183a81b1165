"""The table ``kvbench sweep --backend openai`` prints: one row per load point, mean [95% CI] per number."""

from __future__ import annotations

from rich.table import Table

COLUMNS = (  # (header, key, format)
    ("req/s", "request_throughput", ".3f"), ("output tok/s", "output_throughput", ",.1f"),
    ("TTFT median (ms)", "median_ttft_ms", ",.0f"), ("TTFT p99 (ms)", "p99_ttft_ms", ",.0f"),
    ("TPOT median (ms)", "median_tpot_ms", ",.1f"), ("hit rate (reported)", "reported_hit_rate", ".3f"),
    ("goodput (req/s)", "request_goodput", ".3f"), ("SLO met: hits | misses", None, ""), ("failed", "failed", ".0f"),
)


def _cell(point, key: str, spec: str) -> str:
    value = point.mean.get(key)
    if value is None:
        return "-"
    interval = point.ci.get(key)
    text = format(value, spec)
    return text if interval is None else f"{text} [{format(interval[0], spec)}, {format(interval[1], spec)}]"


def load_points_table(outcome) -> Table:
    """Mean over each point's runs, with the bootstrap 95% interval in brackets when it has >= 2."""
    axis = "clients" if outcome.axis == "concurrency" else "req/s sent"
    table = Table(title=f"kvbench sweep: {outcome.name} ({outcome.axis})",
                  caption="mean over runs \\[bootstrap 95% CI over runs]; goodput and SLO columns need --goodput")
    table.add_column(axis, justify="right")
    table.add_column("runs", justify="right")
    for header, _, _ in COLUMNS:
        table.add_column(header, justify="right")
    for point in outcome.points:
        slo = " | ".join("-" if point.mean[k] is None else f"{point.mean[k]:.2f}"
                         for k in ("slo_attainment_cache_hit", "slo_attainment_cache_miss"))
        cells = [slo if key is None else _cell(point, key, spec) for _, key, spec in COLUMNS]
        table.add_row(f"{point.value:g}", str(point.num_runs), *cells)
    return table
