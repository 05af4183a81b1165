"""The live progress bar of ``kvbench run`` and ``kvbench sweep``: requests done, and the hit rate and
TTFT p50 so far (:class:`~kvbench.results.live.RunningStats`)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbench.results.live import RunningStats
from kvbench.results.rows import ResultRow

STATS_EVERY_S = 0.5  # recompute the live hit rate and TTFT p50 at most this often


@contextlib.contextmanager
def progress_line(console: Console) -> Iterator[Callable[[list[ResultRow], int], None]]:
    """A live bar: requests done, hit rate so far, TTFT p50 so far. Yields ``update(rows, total)``.

    Each call reads only the rows added since the last one (:class:`RunningStats`: O(1) per row) and
    re-renders the statistics at most every ``STATS_EVERY_S`` seconds."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[stats]}"),
        console=console,
        transient=True,
    )
    task = progress.add_task("requests", total=None, stats="")
    stats = RunningStats()
    last_stats_s = [-math.inf]

    def update(rows: list[ResultRow], total: int) -> None:
        stats.extend(rows)
        now_s = time.monotonic()
        if now_s - last_stats_s[0] >= STATS_EVERY_S or len(rows) == total:
            last_stats_s[0] = now_s
            ttft = stats.ttft_p50_ms()
            text = f"hit rate {stats.token_hit_rate:.3f}  TTFT p50 {ttft:,.0f} ms" if ttft is not None else ""
            progress.update(task, stats=text)
        progress.update(task, completed=len(rows), total=total)

    # Outside a terminal, no live display: stopping one printed a blank line before an error line.
    with progress if console.is_terminal else contextlib.nullcontext():
        update.stats = stats  # type: ignore[attr-defined]  # for tests that count the work
        yield update
