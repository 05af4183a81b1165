"""What ``kvbench run`` shows and writes: live progress, the summary table, the Parquet file."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvbench.results.parquet import write_rows
from kvbench.results.schema import RUN_SCHEMA
from kvbench.results.summary import RunSummary, percentile, summarize

CHECKPOINT_EVERY_S = 10.0  # rewrite the Parquet file at most this often while running


class RunWriter:
    """Collects result rows and keeps ``path`` up to date: rewritten every ``CHECKPOINT_EVERY_S``
    seconds while running (``complete: false``), and once more at the end, so a crash, an error or
    Ctrl-C loses at most the request in flight."""

    def __init__(self, path: Path, metadata: dict[str, Any]) -> None:
        self.path = path
        self.metadata = metadata
        self.rows: list[dict[str, Any]] = []
        self._written_s = time.monotonic()

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if time.monotonic() - self._written_s > CHECKPOINT_EVERY_S:
            self._write(complete=False)

    def close(self, complete: bool) -> None:
        """Write the final file (nothing when no request finished)."""
        if self.rows:
            self._write(complete)

    def _write(self, complete: bool) -> None:
        summary = summarize(self.rows).as_dict()
        write_rows(self.path, self.rows, {**self.metadata, "summary": summary, "complete": complete}, RUN_SCHEMA)
        self._written_s = time.monotonic()


@contextlib.contextmanager
def progress_line(console: Console, total: int) -> Iterator[Callable[[list[dict[str, Any]]], None]]:
    """A live bar: requests done, hit rate so far, TTFT p50 so far. Yields ``update(rows)``."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.fields[stats]}"), console=console, transient=True)
    task = progress.add_task("requests", total=total, stats="")

    def update(rows: list[dict[str, Any]]) -> None:
        ok = [r for r in rows if r["status"] == "ok"]
        prompt = sum(r["prompt_tokens"] for r in ok)
        hit = sum(r["cached_prompt_tokens"] or 0 for r in ok) / prompt if prompt else 0.0
        ttft = percentile((r["ttft_ms"] for r in ok), 50)
        stats = f"hit rate {hit:.3f}  TTFT p50 {ttft:,.0f} ms" if ttft is not None else ""
        progress.update(task, completed=len(rows), stats=stats)

    with progress:
        yield update


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def summary_table(name: str, run: dict[str, Any], summary: RunSummary) -> Table:
    """The run's summary as a two-column table (metric, value)."""
    cache = run["cache"]
    cache_text = (f"on ({cache['kind']}, {cache['block_size']}-token blocks, {cache['capacity_blocks']:,} blocks)"
                  if cache["enabled"] else "off")
    table = Table(title=f"kvbench run: {name} ({run['backend']}, {run['model']}, cache {cache_text})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    hit = "-" if summary.token_hit_rate is None else f"{summary.token_hit_rate:.4f}"
    expected = "-" if summary.expected_hit_rate is None else f"{summary.expected_hit_rate:.4f}"
    rows = [
        ("requests (measured / warm-up / errors)", f"{summary.num_requests} / {summary.num_warmup} / {summary.num_errors}"),
        ("prompt tokens / cached", f"{summary.prompt_tokens:,} / {summary.cached_prompt_tokens:,}"),
        ("token hit rate (expected by the simulator)", f"{hit} ({expected})"),
        ("TTFT cold first request (ms)", _ms(summary.cold_ttft_ms)),
        ("TTFT p50 / p90 / p99 (ms)", f"{_ms(summary.p50_ttft_ms)} / {_ms(summary.p90_ttft_ms)} / {_ms(summary.p99_ttft_ms)}"),
        ("TPOT p50 (ms)", _ms(summary.p50_tpot_ms)),
        ("ITL p50 (ms)", _ms(summary.p50_itl_ms)),
        ("decode (tok/s)", "-" if summary.decode_tok_s is None else f"{summary.decode_tok_s:,.1f}"),
        ("E2E p50 / p99 (ms)", f"{_ms(summary.p50_e2e_ms)} / {_ms(summary.p99_e2e_ms)}"),
        ("queue p50 (ms)", _ms(summary.p50_queue_ms)),
    ]
    if run.get("verify"):
        rows.append(("outputs differing from cache-off", str(summary.num_mismatched_outputs)))
    for metric, value in rows:
        table.add_row(metric, value)
    table.caption = "TTFT percentiles exclude the cold first request; token hit rate = cached / prompt tokens"
    return table
