"""``kvbench report``, ``kvbench compare`` and ``kvbench scoreboard export``: results people can read."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from kvbench.commands import result_options as res
from kvbench.commands.common import build, make_console
from kvbench.errors import InputError
from kvbench.extras import needs_extra
from kvbench.results.compare import Comparison, compare_runs
from kvbench.results.export import ReportFormat
from kvbench.results.files import load_result, load_results
from kvbench.results.parquet import check_output_folder
from kvbench.results.report import TableData, build_report, summary_tables
from kvbench.results.scoreboard import append_rows, scoreboard_rows

DEFAULT_SCOREBOARD = Path("results") / "SCOREBOARD.md"

scoreboard_app = typer.Typer(
    name="scoreboard",
    help="Keep one Markdown row per run, comparable across machines and changes.",
    no_args_is_help=True,
)


def rich_table(data: TableData) -> Table:
    """A report table (:class:`TableData`) as a rich table, every cell escaped."""
    table = Table(title=escape(data.title), caption=escape(data.caption) if data.caption else None)
    for index, column in enumerate(data.columns):
        table.add_column(escape(column), justify="left" if index == 0 else "right")
    for row in data.rows:
        table.add_row(*(escape(cell) for cell in row))
    return table


def report(
    results: Annotated[
        list[Path], typer.Argument(help="Result files (.parquet) of kvbench run, sim or sweep.")
    ],
    out: Annotated[
        Path | None,
        typer.Option(help="Output FOLDER for the PNGs and report.html (default results/report-TIME)."),
    ] = None,
    title: Annotated[str, typer.Option(help="Title of the HTML page.")] = "kvbench report",
    explain: Annotated[
        bool,
        typer.Option(
            "--explain", help="Add kvbench explain's waterfall and per-request causes for each run."
        ),
    ] = False,
    format: Annotated[
        ReportFormat,
        typer.Option(  # noqa: A002 - the flag's name
            help="html: tables, plots, report.html; csv / json: one summary record per run (vLLM's keys), "
            "to stdout or OUT/summary.csv|json."
        ),
    ] = ReportFormat.HTML,
    metric_percentiles: res.MetricPercentiles = "50,90,99",
    percentile_metrics: res.PercentileMetrics = "ttft,tpot,itl,e2el",
    goodput: res.Goodput = None,
) -> None:
    """Summary tables, PNG plots and one self-contained HTML page (plots embedded) from result files.

    Plots: hit rate vs cache size (sim, sweep), TTFT p50 vs hit rate with the fitted line, TTFT CDF with
    the cache off vs on (runs of the same trace), TTFT per request, cached tokens per turn (chat, agent).
    """
    if out is not None:
        check_output_folder(out)  # before reading or drawing anything
    loaded = load_results(results)
    console, err = make_console(), make_console(stderr=True)
    if format is not ReportFormat.HTML:
        options = build(lambda: res.summary_options(metric_percentiles, percentile_metrics, goodput))
        _export(loaded, format, options, out)
        return
    for table in summary_tables(loaded):
        console.print(rich_table(table))
    if not _plots_installed():  # as kvbench sim: the tables, a note, exit 0, no empty folder
        err.print(f"[yellow]note:[/yellow] {escape(NO_PLOTS_NOTE)}", soft_wrap=True)
        return
    out = out or Path("results") / f"report-{time.strftime('%Y%m%d-%H%M%S')}"
    with err.status("drawing plots"):
        written = build_report(loaded, out, title, _explain_sections(loaded, out) if explain else ())
    for note in written.notes:
        err.print(f"[yellow]note:[/yellow] {escape(note)}")
    for figure in written.figures:
        console.print(f"  {escape(str(figure.path))}")
    console.print(
        f"wrote {len(written.figures)} plots and {escape(str(written.html_path))} "
        "(self-contained: the plots are embedded)"
    )


NO_PLOTS_NOTE = f"no PNG plots or report.html: {needs_extra('plots')}"


def _plots_installed() -> bool:
    """Whether matplotlib imports (the [plots] extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _explain_sections(loaded, out: Path) -> list:
    from kvbench.bill.rules import Provider, cache_rules
    from kvbench.commands.bill import DEFAULT_MODELS
    from kvbench.explain.html import explain_section

    rules = cache_rules(Provider.OPENAI, DEFAULT_MODELS[Provider.OPENAI])
    return [explain_section(result.path, out, rules) for result in loaded if result.kind == "run"]


def _export(loaded, format: ReportFormat, options, out: Path | None) -> None:
    """Run summaries as CSV or JSON: to stdout, or to ``out/summary.csv|json``."""
    from kvbench.results.export import run_records, to_csv, to_json

    err = make_console(stderr=True)
    for result in loaded:
        if result.kind != "run":
            err.print(
                f"[yellow]note:[/yellow] {escape(str(result.path))}: a {result.kind} file; "
                f"--format {format.value} exports run files"
            )
    records = run_records(loaded, options)
    text = to_csv(records) if format is ReportFormat.CSV else to_json(records)
    if out is None:
        typer.echo(text, nl=False)
        return
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"summary.{format.value}"
    path.write_text(text)
    make_console().print(f"wrote {len(records)} run record(s) to {escape(str(path))}")


def _comparison_table(comparison: Comparison) -> Table:
    a, b = comparison.a, comparison.b
    table = Table(
        title=escape(f"kvbench compare: B / A, trace {comparison.trace}"),
        caption="ratio < 1: B is faster (times) or lower (rates)",
    )
    table.add_column("metric")
    table.add_column(escape(f"A: {a.label}"), justify="right")
    table.add_column(escape(f"B: {b.label}"), justify="right")
    table.add_column("B / A", justify="right")
    for metric in comparison.metrics:
        table.add_row(*(escape(cell) for cell in metric.cells()))
    return table


def compare(
    a: Annotated[Path, typer.Argument(help="Run results A (the baseline, e.g. cache off).")],
    b: Annotated[Path, typer.Argument(help="Run results B (e.g. cache on); ratios are B / A.")],
    force: Annotated[
        bool, typer.Option(help="Compare even when the runs replayed different traces.")
    ] = False,
) -> None:
    """TTFT/TPOT/E2E percentiles and hit rates of two runs of the same trace, side by side with ratios."""
    if a.exists() and b.exists() and a.resolve() == b.resolve():
        raise InputError(f"compare: A and B are the same file ({a}); give two runs to compare")
    comparison = compare_runs(load_result(a), load_result(b), force=force)
    console, err = make_console(), make_console(stderr=True)
    for name, result in (("A", comparison.a), ("B", comparison.b)):
        config = result.run
        console.print(
            escape(
                f"{name}: {result.path} ({config.get('backend', '?')}, {config.get('model', '?')}, "
                f"{result.what_ran.describe(detail=True)})"
            )
        )
    console.print(_comparison_table(comparison))
    for warning in comparison.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}")


@scoreboard_app.command("export")
def export(
    results: Annotated[
        list[Path], typer.Argument(help="Run results, plus sim or sweep files for the notes.")
    ],
    to: Annotated[
        Path, typer.Option(help="Scoreboard Markdown file (created with a header when missing).")
    ] = DEFAULT_SCOREBOARD,
) -> None:
    """Append one Markdown row per run to the scoreboard; earlier rows are never rewritten."""
    rows = scoreboard_rows(load_results(results))
    outcome = append_rows(to, rows)
    console, err = make_console(), make_console(stderr=True)
    for row in outcome.appended:
        console.print(escape(row.as_markdown()), soft_wrap=True)
    for run_id in outcome.skipped_run_ids:
        err.print(f"[yellow]skipped:[/yellow] run {escape(run_id)} is already on {escape(str(to))}")
    action = "created" if outcome.created else "appended to"
    console.print(f"{action} {escape(str(to))}: {len(outcome.appended)} new row(s)")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
    app.command("compare")(compare)
    app.add_typer(scoreboard_app)
