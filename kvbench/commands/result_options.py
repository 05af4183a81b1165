"""The result and gate flags of ``kvbench run`` (vLLM's reporting flags, ``--save-result``, ``--assert``)
and what happens after a run: the JSON, the pass/fail table, the exit code (0, 1 or 3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kvbench.commands.common import build, make_console
from kvbench.errors import InputError
from kvbench.results.gate import EXIT_ASSERTION_FAILED, Check, GateConfig
from kvbench.results.goodput import parse_goodput
from kvbench.results.result_json import check_result_path, result_dict, result_path, write_result
from kvbench.results.rows import ResultRow
from kvbench.results.summary import SummaryOptions, parse_metric_percentiles, parse_percentile_metrics

MetricPercentiles = Annotated[str, typer.Option(help="X of every p{X}_{metric}_ms key (vLLM's flag).")]
PercentileMetrics = Annotated[
    str, typer.Option(help="Metrics with mean/median/std/pX: ttft, tpot, itl, e2el.")
]
Goodput = Annotated[
    list[str] | None,
    typer.Option(
        help="SLOs METRIC:MS (ttft, tpot, e2el), e.g. 'ttft:200 tpot:50': goodput overall and for cache "
        "hits / misses."
    ),
]
SaveResult = Annotated[
    Path | None, typer.Option(help="Write the summary JSON (vLLM's keys + kvbench's) to PATH.")
]
ResultDir = Annotated[
    Path | None, typer.Option(help="vLLM's: folder for the summary JSON (turns saving on).")
]
ResultFilename = Annotated[
    str | None, typer.Option(help="vLLM's: file name of the summary JSON (turns saving on).")
]
SaveDetailed = Annotated[
    bool, typer.Option("--save-detailed", help="Add vLLM's per-request arrays to the JSON.")
]
Asserts = Annotated[
    list[str] | None,
    typer.Option(
        "--assert",
        help="Gate: KEY OP NUMBER on any summary key, e.g. 'median_ttft_ms<=250'; a failure exits 3.",
    ),
]
MaxErrorRate = Annotated[
    float | None,
    typer.Option(
        min=0.0, max=1.0, help="Exit 1 only when more than this share of requests failed (default: any)."
    ),
]


@dataclass(frozen=True)
class ResultFlags:
    """What a run reports and how it is judged: summary options, the JSON's place, the gate."""

    summary: SummaryOptions
    gate: GateConfig
    save_result: Path | None = None
    result_dir: Path | None = None
    result_filename: str | None = None
    detailed: bool = False


def summary_options(
    metric_percentiles: str, percentile_metrics: str, goodput: list[str] | None
) -> SummaryOptions:
    """The summary options from their flags. Raises ``ValueError`` naming the flag."""
    return SummaryOptions(
        parse_metric_percentiles(metric_percentiles),
        parse_percentile_metrics(percentile_metrics),
        parse_goodput(goodput or ()),
    )


def result_flags(
    metric_percentiles: str,
    percentile_metrics: str,
    goodput: list[str] | None,
    save_result: Path | None,
    result_dir: Path | None,
    result_filename: str | None,
    save_detailed: bool,
    asserts: list[str] | None,
    max_error_rate: float | None,
) -> ResultFlags:
    """The flags checked before the run (bad values and unwritable paths exit 2 here)."""

    def make() -> ResultFlags:
        options = summary_options(metric_percentiles, percentile_metrics, goodput)
        return ResultFlags(
            options,
            GateConfig.from_flags(asserts, max_error_rate, options),
            save_result,
            result_dir,
            result_filename,
            save_detailed,
        )

    flags = build(make)
    planned = result_path(save_result, result_dir, result_filename)
    if save_detailed and planned is None:
        raise InputError("--save-detailed needs --save-result, --result-dir or --result-filename")
    check_result_path(planned)
    return flags


def finish_run(outcome: Any, flags: ResultFlags) -> None:
    """After ``kvbench run``: write the JSON, print the gate's table, exit 3 when an assertion
    failed, else exit 1 when requests failed beyond ``--max-error-rate``."""
    console = make_console()
    result = result_dict(outcome.summary, outcome.metadata, outcome.rows, flags.detailed)
    path = result_path(flags.save_result, flags.result_dir, flags.result_filename, Path(outcome.path))
    if path is not None:
        console.print(f"wrote the summary JSON to {write_result(path, result)}")
    checks = flags.gate.check(result)
    if checks:
        console.print(gate_table(checks))
    failed = outcome.failed_rows
    errors_fail = flags.gate.errors_fail(len(failed), len(outcome.rows))
    if failed:
        _report_failures(failed, len(outcome.rows), flags.gate.max_error_rate, errors_fail)
    if any(not check.passed for check in checks):
        make_console(stderr=True).print(
            f"[red]{sum(not c.passed for c in checks)} of {len(checks)} assertion(s) failed[/red]"
        )
        raise typer.Exit(EXIT_ASSERTION_FAILED)
    if errors_fail:
        raise typer.Exit(1)


def gate_table(checks: Sequence[Check]) -> Table:
    """The pass/fail table ``kvbench run --assert`` prints."""
    table = Table(title="assertions")
    for column, justify in (("assertion", "left"), ("value", "right"), ("result", "left")):
        table.add_column(column, justify=justify)
    for check in checks:
        value = "not measured" if check.value is None else f"{check.value:,.6g}"
        table.add_row(
            check.assertion.text, value, "[green]pass[/green]" if check.passed else "[red]FAIL[/red]"
        )
    return table


def _report_failures(
    failed: list[ResultRow], num_rows: int, max_error_rate: float | None, fails: bool
) -> None:
    """One line on failed requests (and a hint when a server refused cache_salt)."""
    err = make_console(stderr=True)
    color = "red" if fails else "yellow"
    allowed = (
        ""
        if max_error_rate is None
        else (f" (error rate {len(failed) / num_rows:.4f}, --max-error-rate {max_error_rate:g})")
    )
    err.print(
        f"[{color}]{len(failed)} request(s) failed[/{color}]{allowed}; first: {failed[0].error}",
        soft_wrap=True,
    )
    if any("cache_salt" in (row.error or "") for row in failed):
        err.print("the server may not accept cache_salt: try --hygiene nonce")
