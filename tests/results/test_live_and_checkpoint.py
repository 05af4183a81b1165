"""The live progress and the checkpoints do work per new row only (work is counted, not timed)."""

import numpy as np
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from kvbench.commands.live_progress import progress_line
from kvbench.request import Request, RequestRecord, Status
from kvbench.results.checkpoint import Checkpointer
from kvbench.results.live import RunningStats
from kvbench.results.parquet import read_metadata
from kvbench.results.rows import ResultRow
from kvbench.results.schema import RUN_SCHEMA
from kvbench.results.summary import percentile
from kvbench.results.writer import RunWriter


def pair(index, ttft_ms, cached=8, status=Status.OK):
    request = Request(
        index=index, request_id=f"r{index}", session_id="s", turn=0, token_ids=np.arange(32, dtype=np.uint32)
    )
    record = RequestRecord(
        status=status,
        prompt_tokens=32,
        cached_prompt_tokens=cached,
        output_tokens=4,
        ttft_ms=ttft_ms,
        itl_ms=(1.0, 1.0, 1.0),
    )
    return request, record


def rows_of(num_rows, start=0):
    rng = np.random.default_rng(start)
    return [
        ResultRow.of("run", {}, *pair(start + i, float(rng.lognormal(3, 1)), cached=int(rng.integers(0, 33))))
        for i in range(num_rows)
    ]


def test_running_stats_read_each_row_once_and_match_the_exact_numbers():
    rows, stats = [], RunningStats()
    for chunk in range(20):
        rows += rows_of(500, start=chunk * 500)
        stats.extend(rows)
        assert stats.num_rows_read == len(rows)  # the old rows were not read again
    ok = [r for r in rows if r.status == "ok"]
    assert stats.token_hit_rate == pytest.approx(
        sum(r.cached_prompt_tokens for r in ok) / sum(r.prompt_tokens for r in ok)
    )
    assert stats.ttft_p50_ms() == pytest.approx(percentile((r.ttft_ms for r in ok), 50), rel=0.011)


def test_running_stats_skip_failed_rows_and_start_empty():
    stats = RunningStats()
    assert stats.ttft_p50_ms() is None and stats.token_hit_rate == 0.0
    stats.extend([ResultRow.of("run", {}, *pair(0, None, cached=None, status=Status.ERROR))])
    assert stats.num_rows_read == 1 and stats.ttft_p50_ms() is None and stats.prompt_tokens == 0


def test_progress_line_reads_each_row_once_over_many_updates():
    rows = []
    with progress_line(Console(file=open("/dev/null", "w"))) as update:
        for i in range(3000):
            rows.append(ResultRow.of("run", {}, *pair(i, 10.0 + i % 7)))
            update(rows, 3000)
    assert update.stats.num_rows_read == 3000


def test_checkpoints_convert_each_row_once_and_leave_a_valid_incomplete_file(tmp_path):
    rows, path = [], tmp_path / "run.parquet"
    checkpoints = Checkpointer(path, RUN_SCHEMA, rows, every_s=3600, metadata={"command": "run"})
    converted = []
    for chunk in range(10):
        rows += rows_of(200, start=chunk * 200)
        converted.append(checkpoints.checkpoint())
        # what a crash right now would leave: every row so far, in a readable file marked incomplete
        assert pq.read_table(path).num_rows == len(rows) and read_metadata(path)["complete"] is False
    # per checkpoint: the new rows only
    assert converted == [200] * 10 and checkpoints.num_rows_converted == 2000
    assert checkpoints.checkpoint() == 0 and checkpoints.num_checkpoints == 10  # nothing new: nothing written
    rows += rows_of(5, start=2000)
    table = checkpoints.close()
    assert table.num_rows == 2005 and table.column("request_id").to_pylist() == [r.request_id for r in rows]


def test_the_writer_checkpoints_on_a_timer_without_a_row_finishing(tmp_path, monkeypatch):
    """The checkpoint comes from a timer, not from the next finished row."""
    import time

    import kvbench.results.writer as writer_module

    monkeypatch.setattr(writer_module, "CHECKPOINT_EVERY_S", 0.05)
    path = tmp_path / "run.parquet"
    writer = RunWriter(path, {"command": "run"}, "run", {})
    writer.add(*pair(0, 12.0))
    for _ in range(200):  # no further add: only the timer can write
        if path.exists():
            break
        time.sleep(0.02)
    assert pq.read_table(path).num_rows == 1 and read_metadata(path)["complete"] is False
    writer.add(*pair(1, 13.0))
    writer.close(complete=True)
    assert pq.read_table(path).num_rows == 2 and writer.checkpoints.num_rows_converted == 2
    metadata = read_metadata(path)
    assert metadata["complete"] is True and metadata["summary"]["num_requests"] == 2


def test_load_and_spread_warnings():
    from kvbench.results.machine_load import load_warnings, spread_warning

    busy = {"start": {"load_1m": 5.7, "usable_cpus": 2}, "end": {"load_1m": 1.0, "usable_cpus": 2}}
    (line,) = load_warnings(busy)
    assert "machine load 5.7 at the start" in line and "2 usable cores" in line
    steady = [ResultRow.of("run", {}, *pair(i, 100.0 + i)) for i in range(10)]
    assert spread_warning(steady) is None
    noisy = [
        ResultRow.of("run", {}, *pair(i, ttft))
        for i, ttft in enumerate([54, 60, 70, 80, 900, 1460, 58, 62, 1200, 65])
    ]
    assert "10 identical requests" in spread_warning(noisy) and "54 to 1,460 ms" in spread_warning(noisy)
