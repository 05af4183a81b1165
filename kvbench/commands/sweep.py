"""``kvbench sweep``: one engine run per cache size on the same trace, and the TTFT-vs-hit-rate fit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvbench.commands import options as opt
from kvbench.commands.common import build, make_console, run_with_progress
from kvbench.results.sweep import SweepPoint
from kvbench.run.config import ModelFlags, RunFlags, SweepConfig
from kvbench.run.scenario import parse_int_list


def _points_table(name: str, points: list[SweepPoint]) -> Table:
    table = Table(title=f"kvbench sweep: {name}")
    for column in ("capacity (blocks)", "token hit rate", "TTFT p50 (ms)", "TTFT p90 (ms)", "requests", "errors"):
        table.add_column(column, justify="right")
    for point in points:
        hit = "-" if point.token_hit_rate is None else f"{point.token_hit_rate:.4f}"
        p50 = "-" if point.p50_ttft_ms is None else f"{point.p50_ttft_ms:,.1f}"
        p90 = "-" if point.p90_ttft_ms is None else f"{point.p90_ttft_ms:,.1f}"
        table.add_row(f"{point.capacity_blocks:,}", hit, p50, p90, str(point.num_requests), str(point.num_errors))
    return table


def sweep(
    source: Annotated[Path, typer.Argument(help="Scenario (.toml) or trace (.jsonl).")],
    cache_sizes: Annotated[str, typer.Option(help="Cache capacities in blocks, e.g. 64,128,256,512,1024.")],
    requests: Annotated[int | None, typer.Option(help="Run only the first N requests of the trace.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Output tokens per request.")] = None,
    block_size: opt.BlockSize = None,
    model: Annotated[Path | None, typer.Option(help="Local Hugging Face checkpoint.")] = None,
    device: opt.Device = "cpu",
    dtype: opt.DTypeName = "float32",
    out: Annotated[Path | None, typer.Option(help="Folder for the per-size files and sweep.parquet.")] = None,
    threads: opt.Threads = None,
) -> None:
    """Run the scenario once per cache size (fresh cache each time) and fit TTFT p50 = a + b x (1 - hit rate)."""
    from kvbench.run.api import sweep as sweep_source

    sizes = tuple(parse_int_list(cache_sizes, "--cache-sizes"))
    config = build(lambda: SweepConfig(source, sizes, ModelFlags(str(model) if model else None, device, dtype),
                                       block_size, RunFlags(num_requests=requests, max_tokens=max_tokens), out))
    console, err = make_console(), make_console(stderr=True)
    outcome = run_with_progress(
        lambda on_progress: sweep_source(config, on_progress, lambda size: err.print(f"cache size {size:,} blocks ...")),
        on_interrupt=lambda interrupted: _print(console, interrupted.sweep), threads=threads)
    _print(console, outcome)


def _print(console, outcome) -> None:
    if outcome is None or not outcome.points:
        return
    console.print(_points_table(outcome.name, outcome.points))
    fit = outcome.summary.fit
    console.print(fit.describe() if fit else "fit: needs two sizes with different hit rates")
    console.print(f"wrote {len(outcome.points)} run files and {outcome.path}")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
