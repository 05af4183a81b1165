"""``kvbench report --format csv|json``: run files as vLLM-style summary records, for spreadsheets and CI.

One record per run file: ``path`` then the keys of :func:`kvbench.results.result_json.result_dict`
(vLLM's ``duration``, ``completed``, ..., ``p99_e2el_ms``, and kvbench's beside them), computed from
the file's rows with the chosen percentiles and SLOs. JSON keeps the nested run config, versions and
machine; CSV keeps the scalar keys only (one column each, in the order of the first run, later runs'
extra keys appended). Sim and sweep files have no per-request rows and are not exported.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from enum import Enum
from typing import Any

from kvbench.results.files import ResultFile
from kvbench.results.result_json import json_ready, result_dict
from kvbench.results.summary import SummaryOptions, summarize


class ReportFormat(str, Enum):
    HTML = "html"  # tables, PNG plots and report.html (the default)
    CSV = "csv"
    JSON = "json"


def run_records(results: Sequence[ResultFile], options: SummaryOptions | None = None) -> list[dict[str, Any]]:
    """One summary record per run file of ``results`` (sim and sweep files are skipped)."""
    records = []
    for result in results:
        if result.kind != "run":
            continue
        rows = list(result.rows)
        records.append(
            {"path": str(result.path), **result_dict(summarize(rows, options), result.metadata, rows)}
        )
    return records


def to_json(records: Sequence[dict[str, Any]]) -> str:
    """The records as a JSON array (NaN and infinity as ``null``)."""
    return json.dumps(json_ready(list(records)), indent=2, default=str, allow_nan=False) + "\n"


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # OWASP "CSV Injection": what a spreadsheet evaluates


def spreadsheet_safe(value: Any) -> Any:
    """``value`` as a CSV cell a spreadsheet shows rather than evaluates: a string that begins with
    ``=``, ``+``, ``-``, ``@``, tab or carriage return gets a leading ``'`` (OWASP's CSV-injection
    rule; a trace named ``=cmd|' -C calc'!A0`` or a server's model id ``=HYPERLINK(...)``). Numbers,
    booleans and ``None`` pass unchanged: ``-1.5`` in a numeric column is a number."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def to_csv(records: Sequence[dict[str, Any]]) -> str:
    """The records' scalar keys as CSV (RFC 4180: CRLF line ends), a header line first; an empty cell
    is a value not measured. Every cell goes through :func:`spreadsheet_safe`."""
    columns: dict[str, None] = {}
    for record in records:
        columns.update((key, None) for key, value in record.items() if not isinstance(value, (dict, list)))
    buffer = io.StringIO()
    # RFC 4180; with "\n" a cell holding "\r" went unquoted
    writer = csv.DictWriter(
        buffer,
        fieldnames=[spreadsheet_safe(c) for c in columns],
        extrasaction="ignore",
        lineterminator="\r\n",
    )
    writer.writeheader()
    writer.writerows(
        {spreadsheet_safe(k): spreadsheet_safe(v) for k, v in record.items()} for record in records
    )
    return buffer.getvalue()
