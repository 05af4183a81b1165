"""Reading result files (``kvbench run``, ``sim`` and ``sweep`` Parquet) for reports, comparisons
and the scoreboard.

A file's kind comes from its metadata ``command``. Run files of the same trace (same content hash
from the trace header) are grouped, so cache-off and cache-on runs land on the same TTFT CDF.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvbench.errors import InputError
from kvbench.results.parquet import read_metadata
from kvbench.results.rows import ResultRow, rows_from_dicts
from kvbench.results.summary import RunSummary, summarize
from kvbench.results.sweep import SweepSummary, read_sweep_summary
from kvbench.results.what_ran import WhatRan, what_ran

RESULT_KINDS = ("run", "sim", "sweep", "load-sweep")  # load-sweep: load_sweep.parquet (results/load_sweep.py)
_NEEDED_COLUMNS = {
    "run": ("request_index", "phase", "status", "turn", "prompt_tokens", "cached_prompt_tokens", "ttft_ms"),
    "sim": ("capacity_blocks", "token_hit_rate"),
    "sweep": ("capacity_blocks", "token_hit_rate", "p50_ttft_ms"),
    "load-sweep": ("axis", "value", "repeat", "results_path"),
}


@dataclass(frozen=True)
class ResultFile:
    """One result file read back: its kind (``run``, ``sim``, ``sweep`` or ``load-sweep``), metadata
    and rows: a run file's as typed rows (``rows``), the other kinds' as mappings of their own
    columns (``table_rows``).

    ``summary`` is set for run files (:func:`summarize` over the rows: the numbers ``kvbench run``
    printed), ``sweep`` for sweep summary files.
    """

    path: Path
    kind: str
    metadata: Mapping[str, Any]
    rows: tuple[ResultRow, ...] = field(repr=False)
    table_rows: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)
    summary: RunSummary | None = None
    sweep: SweepSummary | None = None

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def run(self) -> Mapping[str, Any]:
        """The run config (``run`` metadata), empty for sim and sweep files."""
        return self.metadata.get("run") or {}

    @property
    def cache(self) -> Mapping[str, Any]:
        return self.run.get("cache") or {}

    @property
    def cache_enabled(self) -> bool | None:
        """On or off for the in-process engine; ``None`` for a server's cache (an HTTP run cannot know)."""
        if "enabled" in self.cache:
            return None if self.cache["enabled"] is None else bool(self.cache["enabled"])
        return bool(self.rows and self.rows[0].cache_enabled)

    @property
    def scenario(self) -> str | None:
        """The scenario name (run, sweep) or scenario/trace file stem (sim), if known."""
        if self.kind == "sweep":
            return (self.metadata.get("sweep") or {}).get("scenario")
        if self.kind == "load-sweep":
            source = (self.metadata.get("sweep") or {}).get("source")
            return Path(source).stem if source else None
        if self.kind == "sim":
            source = self.metadata.get("source") or {}
            where = source.get("scenario") or source.get("trace")
            return Path(where).stem if where else None
        return self.run.get("scenario")

    @property
    def content_hash(self) -> str | None:
        """The trace's ``sha256:<hex>`` content hash from its header, if the run recorded one."""
        context = (self.metadata.get("sweep") or {}) if self.kind == "sweep" else self.run
        return (context.get("trace") or {}).get("content_hash")

    @property
    def requests_hash(self) -> str | None:
        """``sha256:<hex>`` over the requests actually run (token ids, budgets), if the run recorded one."""
        return (self.run.get("trace") or {}).get("requests_hash")

    @property
    def trace_key(self) -> str:
        """What identifies the replayed trace: its content hash, else the requests' hash, else its path,
        else this file."""
        trace_path = (self.run.get("trace") or {}).get("path")
        return (
            self.content_hash
            or self.requests_hash
            or (f"path:{trace_path}" if trace_path else f"file:{self.path}")
        )

    @property
    def what_ran(self) -> WhatRan:
        """A run file's engine and cache (:func:`kvbench.results.what_ran.what_ran`)."""
        return what_ran(self.metadata)

    @property
    def label(self) -> str:
        """Legend label: the file name, and for a run file what it measured, e.g. ``on (copy engine: hash
        cache of 64 blocks of 16)``."""
        return f"{self.name} ({self.what_ran.describe()})" if self.kind == "run" else self.name


def load_result(path: str | Path) -> ResultFile:
    """Read one result file written by ``kvbench run``, ``sim`` or ``sweep``.

    Raises:
        InputError: missing file, not a Parquet file, no kvbench metadata, another command's file, or
            columns missing.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a folder; pass the result files in it, e.g. {path / '*.parquet'}")
    metadata = read_metadata(path)
    if not metadata:
        raise InputError(
            f"{path}: a Parquet file without kvbench metadata "
            "(expected the results of kvbench run, sim or sweep, or a load_sweep.parquet)"
        )
    kind = metadata.get("command")
    if kind not in RESULT_KINDS:
        raise InputError(
            f"{path}: results of {kind!r}; expected the results of kvbench run, sim or sweep, "
            "or a load_sweep.parquet"
        )
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"{path}: unreadable Parquet data ({exc})") from None
    missing = [name for name in _NEEDED_COLUMNS[kind] if name not in table.column_names]
    if missing:
        raise InputError(f"{path}: {kind} results without the column(s) {', '.join(missing)}")
    dicts = tuple(table.to_pylist())
    rows = tuple(rows_from_dicts(dicts)) if kind == "run" else ()
    return ResultFile(
        path=path,
        kind=kind,
        metadata=metadata,
        rows=rows,
        table_rows=() if kind == "run" else dicts,
        summary=summarize(rows) if kind == "run" else None,
        sweep=read_sweep_summary(path) if kind == "sweep" else None,
    )


def load_results(paths: Iterable[str | Path]) -> list[ResultFile]:
    """:func:`load_result` for every path, in order; raises on the first bad file."""
    return [load_result(path) for path in paths]


def group_by_trace(results: Iterable[ResultFile]) -> list[list[ResultFile]]:
    """Run files grouped by :attr:`ResultFile.trace_key`, groups and members in input order."""
    groups: dict[str, list[ResultFile]] = {}
    for result in results:
        if result.kind == "run":
            groups.setdefault(result.trace_key, []).append(result)
    return list(groups.values())


@dataclass(frozen=True)
class RequestTtft:
    """A run's TTFTs split the way :func:`summarize` splits them (ms)."""

    warm_ms: tuple[float, ...]  # successful measured requests, cold one excluded
    warm_index: tuple[int, ...]  # their request_index
    cold: tuple[int, float] | None  # (request_index, ttft_ms) of the cold first request
    warmup: tuple[tuple[int, float], ...]  # (request_index, ttft_ms) of warm-up requests


def split_ttft(rows: Sequence[ResultRow]) -> RequestTtft:
    """Split a run's rows into warm measured, cold first, and warm-up TTFTs (rows in serve order).

    A row without ``request_index`` is placed by its position in ``rows``.
    """
    indexed = [(i if r.request_index is None else r.request_index, r) for i, r in enumerate(rows)]
    measured = [(i, r) for i, r in indexed if r.measured]
    warmup = [(i, r) for i, r in indexed if not r.measured]
    ok = [(i, r) for i, r in measured if r.status == "ok"]
    cold_row = ok[0][1] if ok and not warmup and ok[0][1] is measured[0][1] else None
    warm = sorted((i, r.ttft_ms) for i, r in ok if r is not cold_row and r.ttft_ms is not None)
    return RequestTtft(
        warm_ms=tuple(t for _, t in warm),
        warm_index=tuple(i for i, _ in warm),
        cold=(ok[0][0], cold_row.ttft_ms) if cold_row and cold_row.ttft_ms is not None else None,
        warmup=tuple(sorted((i, r.ttft_ms) for i, r in warmup if r.status == "ok" and r.ttft_ms is not None)),
    )


NOT_VERIFIED = "not verified"  # outputs were never compared with a cache-off reference (no --verify)


def summary_cell(result: Any, key: str, spec: str) -> str:
    """One summary number of a result file as a table shows it: ``format_value``, except that the
    count of outputs differing from the reference reads "not verified" for a run without ``--verify``
    (the column is all null there; 0 would claim a check that never ran)."""
    if key == "num_mismatched_outputs" and not result.run.get("verify"):
        return NOT_VERIFIED
    return format_value(getattr(result.summary, key), spec)


def format_value(value: float | None, spec: str = ",.1f") -> str:
    """``value`` formatted with ``spec``; ``-`` when not measured."""
    return "-" if value is None else format(value, spec)


# (row label, RunSummary field, format spec): the numbers a run is judged by; times in ms
