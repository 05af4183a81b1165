"""Reading result files (``kvbench run``, ``sim`` and ``sweep`` Parquet) and building a report from them:
summary tables, PNG plots and one self-contained HTML page that embeds the plots.

A file's kind comes from its metadata ``command``. Run files of the same trace (same content hash
from the trace header) are grouped, so cache-off and cache-on runs land on the same TTFT CDF.
"""

from __future__ import annotations

import base64
import html
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvbench.errors import InputError
from kvbench.results import plots
from kvbench.results.parquet import read_metadata
from kvbench.results.summary import RunSummary, summarize
from kvbench.results.sweep import SweepSummary, fit_ttft_vs_miss_rate, read_sweep_summary

RESULT_KINDS = ("run", "sim", "sweep")
_NEEDED_COLUMNS = {
    "run": ("request_index", "phase", "status", "turn", "prompt_tokens", "cached_prompt_tokens", "ttft_ms"),
    "sim": ("capacity_blocks", "token_hit_rate"),
    "sweep": ("capacity_blocks", "token_hit_rate", "p50_ttft_ms"),
}


@dataclass(frozen=True)
class ResultFile:
    """One result file read back: its kind (``run``, ``sim`` or ``sweep``), metadata and rows.

    ``summary`` is set for run files (:func:`summarize` over the rows: the numbers ``kvbench run``
    printed), ``sweep`` for sweep summary files.
    """

    path: Path
    kind: str
    metadata: Mapping[str, Any]
    rows: tuple[Mapping[str, Any], ...] = field(repr=False)
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
    def cache_enabled(self) -> bool:
        if "enabled" in self.cache:
            return bool(self.cache["enabled"])
        return bool(self.rows and self.rows[0].get("cache_enabled"))

    @property
    def scenario(self) -> str | None:
        """The scenario name (run, sweep) or scenario/trace file stem (sim), if known."""
        if self.kind == "sweep":
            return (self.metadata.get("sweep") or {}).get("scenario")
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
        return (self.content_hash or self.requests_hash
                or (f"path:{trace_path}" if trace_path else f"file:{self.path}"))

    @property
    def label(self) -> str:
        """Short legend label: file name and cache on/off (run files)."""
        if self.kind != "run":
            return self.name
        return f"{self.name} (cache {'on' if self.cache_enabled else 'off'})"


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
        raise InputError(f"{path}: a Parquet file without kvbench metadata "
                         "(expected the results of kvbench run, sim or sweep)")
    kind = metadata.get("command")
    if kind not in RESULT_KINDS:
        raise InputError(f"{path}: results of {kind!r}; expected the results of kvbench run, sim or sweep")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"{path}: unreadable Parquet data ({exc})") from None
    missing = [name for name in _NEEDED_COLUMNS[kind] if name not in table.column_names]
    if missing:
        raise InputError(f"{path}: {kind} results without the column(s) {', '.join(missing)}")
    rows = tuple(table.to_pylist())
    return ResultFile(path=path, kind=kind, metadata=metadata, rows=rows,
                      summary=summarize(rows) if kind == "run" else None,
                      sweep=read_sweep_summary(path) if kind == "sweep" else None)


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

    warm_ms: tuple[float, ...]                        # successful measured requests, cold one excluded
    warm_index: tuple[int, ...]                       # their request_index
    cold: tuple[int, float] | None                    # (request_index, ttft_ms) of the cold first request
    warmup: tuple[tuple[int, float], ...]             # (request_index, ttft_ms) of warm-up requests


def split_ttft(rows: Sequence[Mapping[str, Any]]) -> RequestTtft:
    """Split a run's rows into warm measured, cold first, and warm-up TTFTs (rows in serve order).

    A row without ``request_index`` is placed by its position in ``rows``.
    """
    indexed = [(i if r.get("request_index") is None else r["request_index"], r) for i, r in enumerate(rows)]
    measured = [(i, r) for i, r in indexed if r.get("phase", "measure") == "measure"]
    warmup = [(i, r) for i, r in indexed if r.get("phase", "measure") != "measure"]
    ok = [(i, r) for i, r in measured if r.get("status") == "ok"]
    cold_row = ok[0][1] if ok and not warmup and ok[0][1] is measured[0][1] else None
    warm = sorted((i, r["ttft_ms"]) for i, r in ok if r is not cold_row and r.get("ttft_ms") is not None)
    return RequestTtft(
        warm_ms=tuple(t for _, t in warm), warm_index=tuple(i for i, _ in warm),
        cold=(ok[0][0], cold_row["ttft_ms"]) if cold_row and cold_row.get("ttft_ms") is not None else None,
        warmup=tuple(sorted((i, r["ttft_ms"]) for i, r in warmup
                            if r.get("status") == "ok" and r.get("ttft_ms") is not None)))


@dataclass(frozen=True)
class Figure:
    """One written PNG and the sentence under it."""

    path: Path
    caption: str


@dataclass(frozen=True)
class Report:
    """What :func:`build_report` wrote: the page, the figures, the tables and notes about the inputs."""

    html_path: Path
    figures: tuple[Figure, ...]
    tables: tuple[TableData, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class TableData:
    """A table as strings, rendered alike by the CLI (rich) and the HTML page."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""


def format_value(value: float | None, spec: str = ",.1f") -> str:
    """``value`` formatted with ``spec``; ``-`` when not measured."""
    return "-" if value is None else format(value, spec)


def describe_cache(cache: Mapping[str, Any]) -> str:
    """A run's cache config in words, e.g. ``prefix cache (hash), 16-tok blocks, 1,024 blocks, LRU, TTL 300 s``."""
    if not cache:
        return "cache unknown"
    if cache.get("enabled") is None and "enabled" in cache:  # an HTTP server: its cache is its own
        return f"server's cache ({cache.get('block_size', '?')}-tok blocks expected)"
    if not cache.get("enabled", True):
        return "cache off"
    capacity = cache.get("capacity_blocks")
    parts = [f"prefix cache ({cache.get('kind', 'hash')})", f"{cache.get('block_size', '?')}-tok blocks",
             f"{capacity:,} blocks" if capacity else "unbounded", "LRU"]
    if cache.get("release_order") == "head-first":
        parts.append("head-first release")
    if cache.get("ttl_s"):
        parts.append(f"TTL {cache['ttl_s']:g} s")
    if cache.get("hash_bits"):
        parts.append(f"{cache['hash_bits']}-bit keys")
    return ", ".join(parts)


# (row label, RunSummary field, format spec): the numbers a run is judged by; times in ms
RUN_METRICS = (
    ("token hit rate", "token_hit_rate", ".3f"),
    ("expected hit rate", "expected_hit_rate", ".3f"),
    ("cold TTFT (ms)", "cold_ttft_ms", ",.1f"),
    ("TTFT mean (ms)", "mean_ttft_ms", ",.1f"),
    ("TTFT p50 (ms)", "p50_ttft_ms", ",.1f"),
    ("TTFT p90 (ms)", "p90_ttft_ms", ",.1f"),
    ("TTFT p99 (ms)", "p99_ttft_ms", ",.1f"),
    ("TPOT p50 (ms)", "p50_tpot_ms", ",.2f"),
    ("ITL p50 (ms)", "p50_itl_ms", ",.2f"),
    ("E2E p50 (ms)", "p50_e2e_ms", ",.1f"),
    ("E2E p99 (ms)", "p99_e2e_ms", ",.1f"),
    ("queue p50 (ms)", "p50_queue_ms", ",.1f"),
    ("decode (tok/s)", "decode_tok_s", ",.1f"),
    ("requests", "num_requests", ",d"),
    ("errors", "num_errors", ",d"),
    ("outputs differing from reference", "num_mismatched_outputs", ",d"),
)


def run_table(runs: Sequence[ResultFile]) -> TableData:
    """One column per run file, one row per number of :data:`RUN_METRICS` (as ``summarize`` gives them)."""
    rows = [("backend", *(str(r.run.get("backend", "?")) for r in runs)),
            ("model", *(str(r.run.get("model", "?")) for r in runs)),
            ("cache", *(describe_cache(r.cache) for r in runs))]
    rows += [(label, *(format_value(getattr(r.summary, key), spec) for r in runs)) for label, key, spec in RUN_METRICS]
    return TableData("Runs", ("", *(r.name for r in runs)), tuple(rows),
                     "token hit = cached / prompt tokens; cold TTFT = the first request of a run without warm-up, "
                     "kept out of the TTFT percentiles")


def sim_table(result: ResultFile) -> TableData:
    """One row per (capacity, release order) of a sim file."""
    rows = tuple((f"{r['capacity_blocks']:,}",
                  format_value(r["capacity_blocks"] * r["block_size"] if r.get("block_size") else None, ",d"),
                  str(r.get("release_order") or "-"), format_value(r["token_hit_rate"], ".4f"),
                  format_value(r.get("block_hit_rate"), ".4f"), format_value(r.get("evictions"), ",d"))
                 for r in result.rows)
    ideal = result.metadata.get("ideal_token_hit_rate")
    return TableData(f"Sim: {result.scenario or result.name}",
                     ("blocks", "tokens", "release", "token hit", "block hit", "evicted"), rows,
                     f"no model; unbounded cache token hit {format_value(ideal, '.4f')}")


def sweep_table(result: ResultFile) -> TableData:
    """One row per cache size of a sweep summary, the fit in the caption."""
    sweep = result.sweep
    rows = tuple((f"{p.capacity_blocks:,}", format_value(p.token_hit_rate, ".3f"), format_value(p.p50_ttft_ms),
                  format_value(p.p90_ttft_ms), f"{p.num_requests:,}", f"{p.num_errors:,}", Path(p.results_path).name)
                 for p in sweep.points)
    return TableData(f"Engine sweep: {sweep.name}",
                     ("blocks", "token hit", "TTFT p50", "TTFT p90", "requests", "errors", "results"), rows,
                     sweep.fit.describe() if sweep.fit else "no fit: fewer than 2 distinct hit rates")


def summary_tables(results: Sequence[ResultFile]) -> list[TableData]:
    """The report's tables: one for all run files, one per sim file, one per sweep file."""
    runs = [r for r in results if r.kind == "run"]
    tables = [run_table(runs)] if runs else []
    tables += [sim_table(r) if r.kind == "sim" else sweep_table(r) for r in results if r.kind != "run"]
    return tables


def input_notes(results: Sequence[ResultFile]) -> list[str]:
    """Warnings about the inputs: interrupted runs, failed requests, outputs that differ from the reference."""
    notes = []
    for result in results:
        if result.metadata.get("complete") is False:
            notes.append(f"{result.path}: interrupted, partial results")
        if result.summary and result.summary.num_errors:
            notes.append(f"{result.path}: {result.summary.num_errors} of {result.summary.num_requests} requests failed")
        if result.summary and result.summary.num_mismatched_outputs:
            notes.append(f"{result.path}: {result.summary.num_mismatched_outputs} outputs differ from the "
                         "reference (a cache bug if the decoding was greedy)")
    return notes


def _group_title(group: Sequence[ResultFile]) -> str:
    first = group[0]
    name = first.scenario or Path((first.run.get("trace") or {}).get("path") or first.name).stem
    return f"{name} (trace {first.content_hash[:15]}...)" if first.content_hash else name


def _hit_rate_figure(results: Sequence[ResultFile], out_dir: Path) -> list[Figure]:
    curves, ideals = [], {}
    for result in results:
        if result.kind == "sim":
            orders = sorted({row.get("release_order") or "" for row in result.rows})
            for order in orders:
                rows = sorted((r for r in result.rows if (r.get("release_order") or "") == order),
                              key=lambda r: r["capacity_blocks"])
                label = f"{result.scenario or result.name} sim" + (f", {order}" if len(orders) > 1 else "")
                curves.append(plots.Curve(label, tuple(r["capacity_blocks"] for r in rows),
                                          tuple(r["token_hit_rate"] for r in rows)))
            if result.metadata.get("ideal_token_hit_rate") is not None:
                ideals[f"{result.scenario or result.name}"] = result.metadata["ideal_token_hit_rate"]
        elif result.kind == "sweep":
            points = [p for p in result.sweep.points if p.token_hit_rate is not None]
            curves.append(plots.Curve(f"{result.sweep.name} engine sweep", tuple(p.capacity_blocks for p in points),
                                      tuple(p.token_hit_rate for p in points)))
    if not curves:
        return []
    path = plots.plot_hit_rate_vs_size(curves, out_dir / "hit_rate_vs_cache_size.png",
                                       "Token hit rate vs cache size", ideals)
    return [Figure(path, "Token hit rate (cached / prompt tokens) at each cache capacity; dashed: an "
                         "unbounded cache (the trace's ideal).")]


def _fit_figures(results: Sequence[ResultFile], out_dir: Path) -> list[Figure]:
    figures = []
    for index, result in enumerate(r for r in results if r.kind == "sweep"):
        points = [p for p in result.sweep.points if p.fittable]
        if not points:
            continue
        curve = plots.Curve(f"{result.sweep.name}: one run per cache size",
                            tuple(p.token_hit_rate for p in points), tuple(p.p50_ttft_ms for p in points))
        path = plots.plot_ttft_vs_hit_rate([curve], out_dir / f"ttft_vs_hit_rate_sweep{index + 1}.png",
                                           f"TTFT p50 vs hit rate: {result.sweep.name} sweep", result.sweep.fit)
        figures.append(Figure(path, result.sweep.fit.describe() if result.sweep.fit else "too few distinct hit rates to fit"))
    for index, group in enumerate(group_by_trace(results)):
        runs = [r for r in group if r.summary.token_hit_rate is not None and r.summary.p50_ttft_ms is not None]
        if len({r.summary.token_hit_rate for r in runs}) < 2:
            continue
        fit = fit_ttft_vs_miss_rate([r.summary.token_hit_rate for r in runs], [r.summary.p50_ttft_ms for r in runs])
        curves = [plots.Curve(r.label, (r.summary.token_hit_rate,), (r.summary.p50_ttft_ms,)) for r in runs]
        path = plots.plot_ttft_vs_hit_rate(curves, out_dir / f"ttft_vs_hit_rate_runs{index + 1}.png",
                                           f"TTFT p50 vs hit rate: {_group_title(group)}", fit)
        figures.append(Figure(path, f"Runs of one trace. {fit.describe()}"))
    return figures


def _run_figures(group: Sequence[ResultFile], index: int, out_dir: Path) -> list[Figure]:
    title = _group_title(group)
    split = {r.label: split_ttft(r.rows) for r in group}
    on_off = {r.cache_enabled for r in group}
    cdf_title = f"TTFT CDF, cache {'off vs on' if on_off == {True, False} else 'on' if True in on_off else 'off'}: {title}"
    figures = [Figure(plots.plot_ttft_cdf({label: s.warm_ms for label, s in split.items()},
                                          out_dir / f"ttft_cdf_{index}.png", cdf_title),
                      "Measured requests that succeeded; the cold first request of a run without warm-up is left "
                      "out, as in the TTFT percentiles.")]
    series = [plots.RequestSeries(
        label, plots.Curve(label, s.warm_index, s.warm_ms),
        plots.Curve(label, tuple(i for i, _ in s.warmup), tuple(t for _, t in s.warmup)) if s.warmup else None,
        s.cold) for label, s in split.items()]
    figures.append(Figure(plots.plot_ttft_by_request(series, out_dir / f"ttft_by_request_{index}.png",
                                                     f"TTFT per request: {title}"),
                          "TTFT of each request in trace order; circled: the cold first request."))
    turn_figure = _turn_figure(group, title, out_dir / f"cached_tokens_per_turn_{index}.png")
    return figures + ([turn_figure] if turn_figure else [])


def _turn_figure(group: Sequence[ResultFile], title: str, path: Path) -> Figure | None:
    ok_rows = {r.label: [row for row in r.rows if row.get("status") == "ok" and row.get("turn") is not None
                         and row.get("phase", "measure") == "measure"] for r in group}
    if all(len({row["turn"] for row in rows}) < 2 for rows in ok_rows.values()):
        return None  # one-shot prompts: nothing to show per turn
    curves, prompt = [], None
    for label, rows in ok_rows.items():
        turns = sorted({row["turn"] for row in rows})
        by_turn = {t: [row for row in rows if row["turn"] == t] for t in turns}
        curves.append(plots.Curve(f"{label}: cached", tuple(turns), tuple(
            sum(row["cached_prompt_tokens"] or 0 for row in by_turn[t]) / len(by_turn[t]) for t in turns)))
        if prompt is None:
            prompt = plots.Curve("prompt tokens", tuple(turns), tuple(
                sum(row["prompt_tokens"] or 0 for row in by_turn[t]) / len(by_turn[t]) for t in turns))
    path = plots.plot_cached_per_turn(curves, path, f"Cached prompt tokens per turn: {title}", prompt)
    return Figure(path, "Mean cached prompt tokens per turn (or agent step), against the mean prompt length.")


def build_report(results: Sequence[ResultFile], out_dir: str | Path, title: str = "kvbench report") -> Report:
    """Write the PNG plots and ``report.html`` (plots embedded as base64 data URIs) into ``out_dir``.

    Plots drawn when the inputs allow: hit rate vs cache size (sim, sweep), TTFT p50 vs hit rate with
    the fit (sweep; or 2+ runs of one trace), and per trace group of run files: TTFT CDF (cache off vs
    on), TTFT per request, cached tokens per turn (multi-turn traces).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = _hit_rate_figure(results, out_dir) + _fit_figures(results, out_dir)
    for index, group in enumerate(group_by_trace(results), start=1):
        figures += _run_figures(group, index, out_dir)
    tables, notes = summary_tables(results), input_notes(results)
    page = render_html(title, [str(r.path) for r in results], tables, figures, notes)
    html_path = out_dir / "report.html"
    html_path.write_text(page, encoding="utf-8")
    return Report(html_path, tuple(figures), tuple(tables), tuple(notes))


def _html_table(table: TableData) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in table.rows)
    caption = f"<p class='caption'>{html.escape(table.caption)}</p>" if table.caption else ""
    return f"<h2>{html.escape(table.title)}</h2><table><tr>{head}</tr>{body}</table>{caption}"


def render_html(title: str, inputs: Sequence[str], tables: Sequence[TableData], figures: Sequence[Figure],
                notes: Sequence[str] = ()) -> str:
    """One self-contained HTML page: inputs, notes, tables, then each PNG as a data URI with its caption."""
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p>Generated {html.escape(time.strftime('%Y-%m-%d %H:%M:%S'))} from:</p><ul>"
             + "".join(f"<li><code>{html.escape(p)}</code></li>" for p in inputs) + "</ul>"]
    if notes:
        parts.append("<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    parts += [_html_table(table) for table in tables]
    for figure in figures:
        data = base64.b64encode(figure.path.read_bytes()).decode("ascii")
        parts.append(f"<figure><img alt='{html.escape(figure.path.stem)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{html.escape(figure.caption)}</figcaption></figure>")
    style = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:0.85em}td,th{border:1px solid #ccc;padding:3px 6px;"
             "text-align:right}td:first-child{text-align:left}th{background:#f3f3f3}.caption,figcaption{color:#555;font-size:0.85em}"
             ".notes{color:#a40}img{max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
