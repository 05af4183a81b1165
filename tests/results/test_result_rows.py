"""The typed result row: one mapping to and from Parquet, and no dict row past it."""

import ast
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvbench.request import Phase, Request, RequestRecord, Status
from kvbench.results.rows import ResultRow, rows_from_dicts, rows_to_dicts
from kvbench.results.schema import RUN_COLUMNS, RUN_SCHEMA
from kvbench.results.summary import summarize

PACKAGE = Path(__file__).resolve().parents[2] / "kvbench"
BOUNDARY = PACKAGE / "results" / "rows.py"


def served(index: int = 3) -> tuple[Request, RequestRecord]:
    request = Request(
        index, f"r{index}", "s0", 1, np.arange(40, dtype=np.uint32), arrival_s=0.25, max_tokens=4
    )
    record = RequestRecord(
        Status.OK,
        40,
        cached_prompt_tokens=32,
        output_tokens=3,
        ttft_ms=12.5,
        itl_ms=(2.0, 3.0),
        e2e_ms=17.5,
        phase=Phase.MEASURE,
        sent_s=1.5,
        ended_s=1.5175,
        due_s=1.25,
    )
    return request, record


def test_the_row_has_every_column_of_the_schema_in_its_order():
    assert tuple(ResultRow.__dataclass_fields__) == RUN_COLUMNS


def test_a_row_is_made_from_the_request_and_its_record_once():
    request, record = served()
    row = ResultRow.of("run-1", {"backend": "inprocess", "block_size": 16, "unknown": 1}, request, record)
    assert (row.run_id, row.request_index, row.request_id, row.turn, row.phase) == (
        "run-1",
        3,
        "r3",
        1,
        "measure",
    )
    assert (row.backend, row.block_size, row.prompt_tokens, row.local_prompt_tokens) == (
        "inprocess",
        16,
        40,
        40,
    )
    assert (row.sent_ms, row.due_ms, row.end_ms, row.arrival_ms) == (1500.0, 1250.0, 1517.5, 250.0)
    assert row.tpot_ms == record.tpot_ms == 2.5 and row.itl_ms == (2.0, 3.0)
    assert row.ok and row.measured
    with pytest.raises(AttributeError):
        row.ttft_ms = 1.0  # frozen


def test_parquet_round_trip_gives_the_same_row(tmp_path):
    rows = [ResultRow.of("run-1", {"backend": "openai"}, *served(i)) for i in range(3)]
    path = tmp_path / "run.parquet"
    pq.write_table(pa.Table.from_pylist(rows_to_dicts(rows), schema=RUN_SCHEMA), path)
    assert rows_from_dicts(pq.read_table(path).to_pylist()) == rows


def test_a_file_without_a_newer_column_reads_it_as_none():
    row = ResultRow.from_dict({"request_index": 0, "status": "ok", "prompt_tokens": 10, "extra": 1})
    assert row.num_retries is None and row.replica is None and row.prompt_tokens == 10
    assert row.measured  # a file from before the phase column measured every row


def test_summaries_take_typed_rows_only():
    with pytest.raises(AttributeError):
        summarize([{"status": "ok", "phase": "measure", "prompt_tokens": 10}])


def _column_reads_on_rows(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """``row["ttft_ms"]`` or ``r.get("status")`` style reads of a run column on a variable named like a
    row (``row``, ``r``, ``*_row``, ``rows[i]``)."""

    def names_a_row(node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in ("row", "r") or node.id.endswith("_row")
        return (
            isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "rows"
        )

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        key, receiver = None, None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key, receiver = node.slice.value, node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            key, receiver = node.args[0].value, node.func.value
        if key in RUN_COLUMNS and names_a_row(receiver):
            found.append(f"{path.relative_to(root)}:{node.lineno} [{key!r}]")
    return found


def test_no_dict_row_is_read_outside_the_parquet_boundary():
    reads = [
        read
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != BOUNDARY
        for read in _column_reads_on_rows(path)
    ]
    assert reads == []


def test_the_dict_row_check_sees_subscripts_and_gets(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "a = row['ttft_ms']\nb = r.get('status')\nc = rows[0]['phase']\nd = cache['block_size']\n"
    )
    assert _column_reads_on_rows(source, tmp_path) == [
        "m.py:1 ['ttft_ms']",
        "m.py:2 ['status']",
        "m.py:3 ['phase']",
    ]
