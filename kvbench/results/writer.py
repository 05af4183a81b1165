"""What ``kvbench run`` writes: the Parquet file, kept up to date while it runs; and the counts over its
rows that its tables show (failed requests by kind, responses with several tokens in a chunk)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbench.request import Request, RequestRecord
from kvbench.results.checkpoint import Checkpointer
from kvbench.results.machine_load import load_sample, load_warnings, spread_warning
from kvbench.results.out_lock import OutLock
from kvbench.results.parquet import write_table
from kvbench.results.rows import ResultRow
from kvbench.results.schema import RUN_SCHEMA
from kvbench.results.summary import SummaryOptions, summarize

CHECKPOINT_EVERY_S = 10.0  # rewrite the Parquet file this often while running (a timer thread)


class RunWriter:
    """Turns each finished ``(request, record)`` into a row and keeps ``path`` up to date: rewritten
    every ``CHECKPOINT_EVERY_S`` seconds by a timer thread while running (``complete: false``;
    :mod:`kvbench.results.checkpoint`: each row converted once, never on the event loop), and once
    more at the end (:meth:`close`, also after an error or Ctrl-C), so a crash loses at most the
    last seconds of requests. From construction to :meth:`close` it holds ``path``'s lock
    (:mod:`kvbench.results.out_lock`): a second live run on the same file is refused.

    ``columns``: the backend's fixed result columns (``Backend.describe()``); ``summary_options``: the
    percentiles and goodput SLOs of the footer's summary (default: vLLM's defaults, no goodput)."""

    def __init__(
        self,
        path: Path,
        metadata: dict[str, Any],
        run_id: str,
        columns: dict[str, Any],
        summary_options: SummaryOptions | None = None,
    ) -> None:
        self.path = Path(path)
        self.summary_options = summary_options or SummaryOptions()
        self.metadata = metadata
        self.run_id = run_id
        self.columns = columns
        self.rows: list[ResultRow] = []
        self.lock = OutLock(self.path)  # one live run per file; InputError when held
        self.lock.acquire()
        self.metadata["machine_load"] = {"start": load_sample()}
        self.checkpoints = Checkpointer(self.path, RUN_SCHEMA, self.rows, CHECKPOINT_EVERY_S, metadata)

    def add(self, request: Request, record: RequestRecord) -> None:
        self.rows.append(ResultRow.of(self.run_id, self.columns, request, record))
        self.checkpoints.start()

    def close(self, complete: bool) -> None:
        """Write the final file (nothing when no request finished), with the machine's load at the start
        and end and the :mod:`~kvbench.results.machine_load` warnings in the metadata."""
        try:
            table = self.checkpoints.close()
            self.metadata["machine_load"]["end"] = load_sample()
            spread = spread_warning(self.rows)
            self.metadata["warnings"] = load_warnings(self.metadata["machine_load"]) + (
                [spread] if spread else []
            )
            if self.rows:
                summary = summarize(self.rows, self.summary_options).as_dict()
                write_table(self.path, table, {**self.metadata, "summary": summary, "complete": complete})
        finally:
            self.lock.release()


def error_kinds(rows: list[ResultRow]) -> str:
    """Failed requests by kind, most frequent first: ``HTTP 500 x3, connection error x1``."""
    counts: dict[str, int] = {}
    for row in rows:
        if row.status == "ok":
            continue
        error = row.error or "error"
        kind = (
            f"HTTP {row.http_status}" if row.http_status and row.http_status >= 400 else error.split(":")[0]
        )
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{kind} x{count}" for kind, count in sorted(counts.items(), key=lambda item: -item[1]))


def num_multi_token_chunks(rows: list[ResultRow]) -> int:
    """Successful responses whose stream put several tokens in one chunk (fewer ITL gaps than tokens - 1)."""
    return sum(
        1
        for row in rows
        if row.status == "ok"
        and row.ttft_ms is not None
        and len(row.itl_ms or ()) < (row.output_tokens or 0) - 1
    )
