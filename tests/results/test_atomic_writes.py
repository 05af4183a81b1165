"""A write killed midway leaves nothing a user trips over, and the next write cleans up."""

import os
import signal
import subprocess
import sys

import pyarrow.parquet as pq
from readiness import process_ended, wait_until

from kvbench.results.parquet import write_rows


def test_a_stale_partial_from_a_killed_write_is_removed_by_the_next_write(tmp_path):
    out = tmp_path / "run.parquet"
    (tmp_path / "run.parquet.partial").write_bytes(b"PAR1 half a file")  # what older versions left
    (tmp_path / ".run.parquet.partial").write_bytes(b"PAR1 half a file")
    write_rows(out, [{"x": 1}], {"run": {"id": "a"}})
    assert pq.read_table(out).to_pylist() == [{"x": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.parquet"]


def test_sigkill_during_a_write_leaves_only_a_hidden_partial(tmp_path):
    out = tmp_path / "big.parquet"
    code = (
        "import sys; from kvbench.results.parquet import write_rows; "
        f"[write_rows({str(out)!r}, [{{'x': i, 'text': 'y' * 200}} for i in range(300_000)], {{}}) "
        "for _ in range(50)]"
    )
    process = subprocess.Popen([sys.executable, "-c", code], env={**os.environ})
    wait_until(
        (tmp_path / ".big.parquet.partial").exists,
        "a partial file",
        ended=process_ended(process),
        poll_s=0.005,
    )
    process.send_signal(signal.SIGKILL)
    process.wait()
    visible = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert visible in ([], ["big.parquet"])  # never a visible big.parquet.partial
    if visible:
        pq.read_table(out)  # and a visible file is always whole
