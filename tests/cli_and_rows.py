"""What the command-line and result tests share: a fixture that writes a scenario file, the words of a run
against a server (``openai_args``, ``small_chat``), Parquet rows read back, the one-line error check, and a
run row to write.

Imported by its bare name (``from cli_and_rows import parquet_rows``): tests/ is on ``sys.path`` through
tests/conftest.py and is not a package."""

import pyarrow.parquet as pq
import pytest

from kvbench.results.schema import empty_row


def file_fixture(text: str, name: str):
    """A pytest fixture (assign it to the fixture's name in a module) giving ``tmp_path / name``
    holding ``text``."""

    @pytest.fixture
    def written(tmp_path):
        path = tmp_path / name
        path.write_text(text)
        return path

    return written


def openai_args(command: str, source, base_url: str) -> tuple:
    """``kvbench COMMAND SOURCE --backend openai --base-url BASE_URL``'s words; add the rest."""
    return (command, source, "--backend", "openai", "--base-url", base_url)


def small_chat(command: str, base_url: str, requests: int = 4) -> tuple:
    """``kvbench COMMAND chat`` against the server at ``base_url``: ``requests`` requests of 2 output
    tokens each; add ``--out`` and the rest."""
    return (*openai_args(command, "chat", base_url), "--requests", str(requests), "--max-tokens", "2")


def parquet_rows(path) -> list[dict]:
    """Every row of the Parquet file at ``path``, as dicts."""
    return pq.read_table(path).to_pylist()


def one_error_line(code: int, stderr: str) -> str:
    """Bad input's answer: exit 2, one non-blank line on stderr and no traceback; returns the line."""
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def measured_row(index: int, request_id: str, **columns) -> dict:
    """A run row (every column, ``empty_row``'s nulls) of a measured, successful request ``index``,
    ``columns`` on top: what the tests that write run files by hand start from."""
    row = empty_row()
    row.update(request_index=index, request_id=request_id, phase="measure", status="ok", **columns)
    return row
