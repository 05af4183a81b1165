"""What ``kvbench sim`` prints and writes: the table of hit rates per size, the result rows, and
beside them the exact curve and the TTL curve."""

from __future__ import annotations

import time
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from kvbench.cache.base import ReleaseOrder
from kvbench.extras import needs_extra
from kvbench.results.curve_files import write_curve, write_ttl_curve
from kvbench.results.parquet import write_rows
from kvbench.run.source import RunSource
from kvbench.sim.curve import HitCurve
from kvbench.sim.method import SimOutcome
from kvbench.sim.replay import PreparedTrace, SimResult
from kvbench.sim.ttl_curve import ttl_curve as ttl_curve_of
from kvbench.words import counted


def sim_table(source: RunSource, results: list[SimResult], ideal: SimResult, trace: PreparedTrace) -> Table:
    """One row per (cache size, release order): capacity, hit rates, evicted / expired / refused
    blocks; the caption gives the unbounded cache's (``ideal``) hit rates."""
    table = Table(
        title=f"kvbench sim: {source.name} ({counted(trace.num_requests, 'request')}, "
        f"{trace.num_prompt_tokens:,} prompt tokens, block size {trace.block_size})"
    )
    for column in ("blocks", "tokens", "release", "token hit", "block hit", "evicted", "expired", "refused"):
        table.add_column(
            column,
            justify="right",
            no_wrap=column == "release",
            min_width=len("tail-first") if column == "release" else None,
        )
    for r in results:
        table.add_row(
            f"{r.capacity_blocks:,}",
            f"{r.capacity_blocks * r.block_size:,}",
            r.release_order,
            f"{r.token_hit_rate:.4f}",
            f"{r.block_hit_rate:.4f}",
            f"{r.num_evicted_blocks:,}",
            f"{r.num_expired_blocks:,}",
            f"{r.num_refused_blocks:,}",
        )
    table.caption = (
        f"capacity in blocks and tokens; token hit = cached prompt tokens / prompt tokens; "
        f"ideal (unbounded cache): token hit {ideal.token_hit_rate:.4f}, "
        f"block hit {ideal.block_hit_rate:.4f}"
    )
    return table


def write_outputs(
    console,
    source_info: RunSource,
    trace: PreparedTrace,
    out: Path,
    results: list[SimResult],
    outcome: SimOutcome,
    interrupted: bool,
    ideal: SimResult,
    elapsed_s: float,
    ttl_curve: bool,
) -> None:
    """The result rows, then (when the run finished) the exact curve and the TTL curve beside them."""
    if results:
        metadata = {
            "command": "sim",
            "source": source_info.description,
            "ideal_token_hit_rate": ideal.token_hit_rate,
            "complete": not interrupted,
            "elapsed_s": elapsed_s,
            "methods": outcome.methods,
        }
        _write_results(console, out, [r.as_row() for r in results], metadata)
    curve = outcome.curves.get(ReleaseOrder.TAIL_FIRST.value)
    if curve is not None and not interrupted:
        _write_curve(console, source_info, curve, out, results)
    if ttl_curve and not interrupted:
        _write_ttl_curve(console, source_info, trace, out)


def default_out(out: Path | None, source: RunSource) -> Path:
    """``--out``, else ``results/sim-NAME-TIME.parquet``."""
    return out or Path("results") / f"sim-{source.name}-{time.strftime('%Y%m%d-%H%M%S')}.parquet"


def _write_results(console, out: Path, rows: list[dict], metadata: dict) -> None:
    """Write the rows; say so, and that a file was replaced when one was there (as ``run`` does)."""
    replacing = out.is_file()
    write_rows(out, rows, metadata)
    console.print(
        f"wrote {counted(len(rows), 'row')} to {escape(str(out))}"
        + (" (replaced the file that was there)" if replacing else "")
    )


def _write_curve(console, source: RunSource, curve: HitCurve, out: Path, results: list[SimResult]) -> None:
    marks = [r for r in results if r.release_order == ReleaseOrder.TAIL_FIRST.value]
    title = f"{source.name}: token hit rate at every cache size (block size {curve.trace.block_size})"
    parquet, png, num_rows = write_curve(
        curve, out, title, {"command": "sim", "source": source.description}, marks
    )
    console.print(
        f"exact curve (one pass): {counted(num_rows, 'size')} where the hit count changes, 1 .. "
        f"{curve.ideal_capacity_blocks:,} blocks: {_files(parquet, png)}"
    )


def _write_ttl_curve(console, source: RunSource, trace: PreparedTrace, out: Path) -> None:
    curve = ttl_curve_of(trace)
    title = f"{source.name}: token hit rate vs TTL, unbounded cache (block size {trace.block_size})"
    parquet, png, num_rows = write_ttl_curve(
        curve, out, title, {"command": "sim", "source": source.description}
    )
    keeps = ", ".join(f"{int(f * 100)}% {_seconds(curve.ttl_for_fraction_s(f))}" for f in (0.5, 0.9, 0.99))
    console.print(
        f"TTL keeping this share of the unbounded cache's hits: {keeps}; {counted(num_rows, 'TTL')} where "
        "the "
        f"hit count changes: {_files(parquet, png)}"
    )


def _files(parquet: Path, png: Path | None) -> str:
    return escape(f"{parquet}, {png}" if png else f"{parquet} (no PNG: {needs_extra('plots')})")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} s" if value >= 10 else f"{value:.3g} s"
