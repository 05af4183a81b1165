"""Building a report from result files (:mod:`kvbench.results.files`): summary tables, PNG plots
and one self-contained HTML page that embeds the plots. Run files of the same trace share a TTFT CDF.
"""

from __future__ import annotations

import base64
import html
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.results.engine_rows import engine_report_rows
from kvbench.results.files import ResultFile, format_value, group_by_trace, summary_cell
from kvbench.results.report_figures import Figure, draw_figures
from kvbench.words import counted


@dataclass(frozen=True)
class Report:
    """What :func:`build_report` wrote: the page, the figures, the tables and notes about the inputs."""

    html_path: Path
    figures: tuple[Figure, ...]
    tables: tuple[TableData, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class TableData:
    """A table as strings, drawn alike by the CLI (``kvbench report``) and the HTML page."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""
    text_columns: tuple[int, ...] = ()  # columns of prose, left-aligned in HTML (numbers stay right)
    folded: bool = False  # a long listing (one row per request): folded under its title in HTML, last


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
    ("decode per stream (tok/s)", "per_stream_decode_tok_s", ",.1f"),
    ("requests", "num_requests", ",d"),
    ("errors", "num_errors", ",d"),
    ("outputs differing from reference", "num_mismatched_outputs", ",d"),
)


def run_table(runs: Sequence[ResultFile]) -> TableData:
    """One column per run file, one row per number of :data:`RUN_METRICS` (as ``summarize`` gives them),
    the engine (``run.engine``) and, where a file has them, its KV memory and ``--verify`` counts
    (:func:`kvbench.results.engine_rows.engine_report_rows`)."""
    engine, *engine_facts = engine_report_rows([r.run for r in runs])  # "-" where a file lacks them
    rows = [
        ("backend", *(str(r.run.get("backend", "?")) for r in runs)),
        ("model", *(str(r.run.get("model", "?")) for r in runs)),
        ("what ran", *(r.what_ran.describe(detail=True) for r in runs)),
        engine,
        (
            "machine load start / end (usable cores)",
            *(_load_text(r.metadata.get("machine_load")) for r in runs),
        ),
    ]
    rows += [(label, *(summary_cell(r, key, spec) for r in runs)) for label, key, spec in RUN_METRICS]
    rows += engine_facts  # KV memory (run.kv_memory) and --verify's logit counts (run.verify_logits)
    names = short_names([r.name for r in runs])
    legend = _name_legend(names, [r.name for r in runs])
    return TableData(
        "Runs",
        ("", *names),
        tuple(rows),
        "token hit = cached / prompt tokens; cold TTFT = the first request of a run without warm-up, "
        "kept out of the TTFT percentiles" + legend,
    )


def short_names(names: Sequence[str], width: int = 20, fallback: str = "run") -> list[str]:
    """Column headings for result files (at most ``width`` characters, all distinct): a name that
    fits and is unique is kept; the others are cut to the last ``_``-separated part that tells them
    apart (``2026-12-01T10-11-12_chat_run_ab12`` and ``2026-12-01T10-11-13_chat_run_cd34`` ->
    ``ab12``, ``cd34``), or all their differing parts joined; else ``run 3`` (``fallback`` and the
    1-based position). A terminal cuts long timestamps to the same text, so two runs would look like one."""
    keep = [len(n) <= width and names.count(n) == 1 for n in names]
    long = [i for i, kept in enumerate(keep) if not kept]
    shorts = list(names)
    parts = [names[i].split("_") for i in long]
    choices: list[list[int]] = []
    if len(long) > 1 and len({len(p) for p in parts}) == 1:
        differing = [k for k in range(len(parts[0])) if len({p[k] for p in parts}) > 1]
        choices = [[k] for k in reversed(differing)] + [differing]
    for choice in choices:
        cut = ["_".join(p[k] for k in choice) for p in parts]
        taken = {n for n, kept in zip(names, keep) if kept}
        if (
            all(cut)
            and len(set(cut)) == len(cut)
            and not taken & set(cut)
            and all(len(c) <= width for c in cut)
        ):
            for i, text in zip(long, cut):
                shorts[i] = text
            return shorts
    for i in long:
        shorts[i] = f"{fallback} {i + 1}"
    return shorts


def _name_legend(shorts: Sequence[str], names: Sequence[str]) -> str:
    """``; ab12 = 2026-..._ab12`` for every heading that is not the file's own name."""
    return "".join(f"; {short} = {name}" for short, name in zip(shorts, names) if short != name)


def setup_table(results: Sequence[ResultFile]) -> TableData:
    """How each input was made, from its Parquet metadata: command (and command line when recorded),
    machine, library versions and the settings (one column per file; ``-`` where a file lacks it)."""

    def machine(r: ResultFile) -> str:
        m = r.metadata.get("machine") or {}
        return (
            ", ".join(
                str(v)
                for v in (m.get("cpu"), m.get("cores") and f"{m['cores']} cores", m.get("gpu"), m.get("os"))
                if v
            )
            or "-"
        )

    rows = (
        ("command", *(str(r.metadata.get("command") or r.kind) for r in results)),
        ("command line", *(" ".join(r.metadata.get("command_line") or ()) or "-" for r in results)),
        ("machine", *(machine(r) for r in results)),
        ("versions", *(_flat(r.metadata.get("versions")) for r in results)),
        ("settings", *(_flat(_settings(r)) for r in results)),
    )
    names = short_names([r.name for r in results], fallback="file")
    return TableData(
        "Setup",
        ("", *names),
        rows,
        "from each file's Parquet metadata" + _name_legend(names, [r.name for r in results]),
        text_columns=tuple(range(1, len(results) + 1)),
    )


def _settings(result: ResultFile) -> dict:
    if result.kind == "run":
        return {k: v for k, v in result.run.items() if k not in ("trace", "cache", "run_id")}
    if result.kind == "sweep":
        return dict(result.sweep.context)
    return result.metadata.get("source") or {}


def _flat(values: dict | None) -> str:
    """``key value, key value`` of the scalar items of ``values`` (nested mappings flattened with ``.``)."""
    items: list[str] = []
    for key, value in (values or {}).items():
        if isinstance(value, dict):
            items += [f"{key}.{part}" for part in _flat(value).split(", ") if part and part != "-"]
        elif value is not None and not isinstance(value, (list, tuple)):
            items.append(f"{key} {value}")
    return ", ".join(items) or "-"


def _load_text(load: dict | None) -> str:
    """``5.7 / 4.1 (2 cores)`` from a run's ``machine_load`` metadata (``-`` for files without it)."""
    if not load or "start" not in load:
        return "-"
    end = load.get("end") or {}
    return (
        f"{format_value(load['start'].get('load_1m'), '.1f')} / {format_value(end.get('load_1m'), '.1f')} "
        f"({load['start'].get('usable_cpus', '?')} cores)"
    )


def sim_table(result: ResultFile) -> TableData:
    """One row per (capacity, release order) of a sim file."""
    rows = tuple(
        (
            f"{point['capacity_blocks']:,}",
            format_value(point.get("block_size"), ",d"),
            format_value(
                point["capacity_blocks"] * point["block_size"] if point.get("block_size") else None, ",d"
            ),
            str(point.get("release_order") or "-"),
            format_value(point["token_hit_rate"], ".4f"),
            format_value(point.get("block_hit_rate"), ".4f"),
            format_value(point.get("evictions"), ",d"),
        )
        for point in result.table_rows
    )
    ideal = result.metadata.get("ideal_token_hit_rate")
    return TableData(
        f"Sim: {result.scenario or result.name}",
        ("blocks", "block size (tokens)", "tokens", "release", "token hit", "block hit", "evicted"),
        rows,
        f"no model; unbounded cache token hit {format_value(ideal, '.4f')}",
    )


def sweep_table(result: ResultFile) -> TableData:
    """One row per cache size of a sweep summary, the fit in the caption."""
    sweep = result.sweep
    rows = tuple(
        (
            f"{p.capacity_blocks:,}",
            format_value(p.token_hit_rate, ".3f"),
            format_value(p.p50_ttft_ms),
            format_value(p.p90_ttft_ms),
            f"{p.num_requests:,}",
            f"{p.num_errors:,}",
            Path(p.results_path).name,
        )
        for p in sweep.points
    )
    return TableData(
        f"Engine sweep: {sweep.name}",
        ("blocks", "token hit", "TTFT p50", "TTFT p90", "requests", "errors", "results"),
        rows,
        sweep.fit.describe() if sweep.fit else "no fit: fewer than 2 distinct hit rates",
    )


def summary_tables(results: Sequence[ResultFile]) -> list[TableData]:
    """The report's tables: one for all run files, one per sim file, one per sweep file."""
    from kvbench.results.load_sweep_report import load_sweep_table, read_points  # it imports this module

    runs = [r for r in results if r.kind == "run"]
    tables = [run_table(runs)] if runs else []
    tables += [
        sim_table(r)
        if r.kind == "sim"
        else load_sweep_table(
            r.scenario or r.name,
            r.metadata["sweep"]["axis"],
            read_points(r.metadata),
            r.metadata.get("complete", True),
        )
        if r.kind == "load-sweep"
        else sweep_table(r)
        for r in results
        if r.kind != "run"
    ]
    return tables


def input_notes(results: Sequence[ResultFile]) -> list[str]:
    """Warnings about the inputs: interrupted runs, failed requests, outputs that differ from the
    reference, runs of one trace that ran under different load (one line per trace,
    :func:`kvbench.results.what_ran.load_warning`)."""
    from kvbench.results.what_ran import load_warning

    notes = []
    for group in group_by_trace(results):
        warning = load_warning([(r.name, r.metadata, r.summary.num_requests) for r in group])
        notes += [f"runs of {group[0].scenario or 'one trace'}: {warning}"] if warning else []
    for result in results:
        if result.metadata.get("complete") is False:
            notes.append(f"{result.path}: interrupted, partial results")
        if result.summary and result.summary.num_errors:
            notes.append(
                f"{result.path}: {result.summary.num_errors} of "
                f"{counted(result.summary.num_requests, 'request')} failed"
            )
        notes += [f"{result.path}: {warning}" for warning in result.metadata.get("warnings") or []]
        if result.summary and result.summary.num_mismatched_outputs:
            notes.append(
                f"{result.path}: {result.summary.num_mismatched_outputs} outputs differ from the "
                "reference (a cache bug if the decoding was greedy)"
            )
        if mismatches := (result.run.get("verify_logits") or {}).get("num_mismatches"):
            notes.append(
                f"{result.path}: --verify: {mismatches} output positions differ from the cache-off "
                "engine's argmax by more than the tie tolerance"
            )
    return notes


def build_report(
    results: Sequence[ResultFile],
    out_dir: str | Path,
    title: str = "kvbench report",
    extra: Sequence[tuple[Sequence[TableData], Sequence[Figure]]] = (),
) -> Report:
    """Write the PNG plots and ``report.html`` (plots embedded as base64 data URIs) into ``out_dir``.

    Plots drawn when the inputs allow: hit rate vs cache size (sim, sweep), TTFT p50 vs hit rate with
    the fit (sweep; or 2+ runs of one trace), throughput vs TTFT and goodput per point (a load sweep's
    ``load_sweep.parquet``), and per trace group of run files: TTFT CDF (cache off vs
    on), TTFT per request, cached tokens per turn (multi-turn traces). ``extra``: more (tables,
    figures) sections after them (``kvbench report --explain``: :mod:`kvbench.explain.html`). The page
    reads in that order (:func:`render_html`); the setup table of every input comes last.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = draw_figures(results, out_dir)
    tables, notes = summary_tables(results), input_notes(results)
    sections = [(tables, figures), *extra]
    page = render_html(
        title, [str(r.path) for r in results], sections, notes, setup_table(results) if results else None
    )
    tables = [table for section_tables, _ in sections for table in section_tables]
    figures = [figure for _, section_figures in sections for figure in section_figures]
    html_path = out_dir / "report.html"
    html_path.write_text(page, encoding="utf-8")
    return Report(html_path, tuple(figures), tuple(tables), tuple(notes))


def _html_table(table: TableData) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td style='text-align:left'>{html.escape(cell)}</td>"
            if i in table.text_columns
            else f"<td>{html.escape(cell)}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in table.rows
    )
    caption = f"<p class='caption'>{html.escape(table.caption)}</p>" if table.caption else ""
    title, content = html.escape(table.title), f"<table><tr>{head}</tr>{body}</table>{caption}"
    if table.folded:
        return f"<details><summary><h2>{title}</h2></summary>{content}</details>"
    return f"<h2>{title}</h2>{content}"


def _html_figure(figure: Figure) -> str:
    data = base64.b64encode(figure.path.read_bytes()).decode("ascii")
    return (
        f"<figure><img alt='{html.escape(figure.path.stem)}' src='data:image/png;base64,{data}'>"
        f"<figcaption>{html.escape(figure.caption)}</figcaption></figure>"
    )


def render_html(
    title: str,
    inputs: Sequence[str],
    sections: Sequence[tuple[Sequence[TableData], Sequence[Figure]]],
    notes: Sequence[str] = (),
    setup: TableData | None = None,
) -> str:
    """One self-contained HTML page, in the order people read it: the inputs and notes, then each
    section (the summary and its plots first, then ``kvbench report --explain``'s per run): its tables,
    its PNGs as data URIs with their captions, then its folded tables (:attr:`TableData.folded`, per
    request listings, closed ``<details>``); ``setup`` (how each input was made) last."""
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Generated {html.escape(time.strftime('%Y-%m-%d %H:%M:%S'))} from:</p><ul>"
        + "".join(f"<li><code>{html.escape(p)}</code></li>" for p in inputs)
        + "</ul>",
    ]
    if notes:
        parts.append("<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    for tables, figures in sections:
        parts += [_html_table(table) for table in tables if not table.folded]
        parts += [_html_figure(figure) for figure in figures]
        parts += [_html_table(table) for table in tables if table.folded]
    parts += [_html_table(setup)] if setup is not None else []
    style = (
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;font-size:0.85em}td,th{border:1px solid #ccc;padding:3px 6px;"
        "text-align:right}td:first-child{text-align:left}th{background:#f3f3f3}.caption,figcaption{color:#555;font-size:0.85em}"
        ".notes{color:#a40}img{max-width:100%}summary{cursor:pointer}summary h2{display:inline}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n"
    )
