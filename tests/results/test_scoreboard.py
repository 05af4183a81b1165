"""``kvbench scoreboard export``: one single-line row per run, appended without touching earlier rows."""

import pyarrow.parquet as pq
import pytest
from cli_and_rows import measured_row

from kvbench.errors import InputError
from kvbench.results.files import load_result, load_results
from kvbench.results.parquet import machine as this_machine
from kvbench.results.parquet import read_metadata, write_rows
from kvbench.results.schema import RUN_SCHEMA
from kvbench.results.scoreboard import (
    COLUMNS,
    HEADER,
    append_rows,
    escape_cell,
    machine_cell,
    notes_cell,
    scoreboard_rows,
)

SHARED_HASH = "sha256:" + "5a" * 32
MACHINE = {"cpu": "Test CPU 9000", "cores": 8, "os": "Linux", "gpu": "NVIDIA Test GPU"}


def write_run(path, *, enabled, ttft_ms, scenario="shared_2k", content_hash=SHARED_HASH, model="tiny"):
    rows = []
    for index in range(9):
        row = measured_row(
            index,
            f"q{index}",
            turn=0,
            prompt_tokens=2063,
            cached_prompt_tokens=2000 if enabled and index else 0,
            output_tokens=11,
            ttft_ms=ttft_ms if index else 1300.0,
            e2e_ms=(ttft_ms if index else 1300.0) + 500.0,
        )
        rows.append(row)
    run = {
        "run_id": path.stem,
        "backend": "inprocess",
        "model": model,
        "scenario": scenario,
        "trace": {
            "path": f"{scenario}.jsonl",
            "content_hash": content_hash,
            "generator": "shared-prefix",
            "params": {"system_tokens": 2000, "question_tokens": 50},
        },
        "cache": {
            "enabled": enabled,
            "kind": "hash",
            "block_size": 16,
            "capacity_blocks": 1024,
            "ttl_s": 300.0,
            "release_order": "tail-first",
            "hash_algo": "sha256",
            "hash_bits": None,
        },
        "max_tokens": 11,
        "concurrency": 1,
        "seed": 0,
    }
    return write_rows(
        path,
        rows,
        {"command": "run", "run": run, "machine": MACHINE, "started_at": "2025-01-02T03:04:05"},
        schema=RUN_SCHEMA,
    )


def write_zipf_sim(path):
    rows = [
        {"capacity_blocks": c, "release_order": order, "block_size": 16, "token_hit_rate": h}
        for c, h in ((512, 0.61), (1024, 0.909), (2048, 0.95))
        for order in ("tail-first", "head-first")
    ]
    rows = [
        dict(r, token_hit_rate=r["token_hit_rate"] - (0.1 if r["release_order"] == "head-first" else 0))
        for r in rows
    ]
    source = {
        "scenario": "scenarios/multi_prefix_zipf.toml",
        "workload": {"num_prefixes": "8", "popularity": "zipf"},
    }
    return write_rows(path, rows, {"command": "sim", "source": source, "ideal_token_hit_rate": 0.95})


@pytest.fixture
def results(tmp_path):
    return load_results(
        [
            write_run(tmp_path / "off.parquet", enabled=False, ttft_ms=1310.0),
            write_run(tmp_path / "on.parquet", enabled=True, ttft_ms=95.0),
            write_zipf_sim(tmp_path / "sim.parquet"),
        ]
    )


def no_gpu_lookup():
    raise AssertionError("the GPU was recorded; nothing should be detected")


def test_rows_carry_config_numbers_and_the_shared_prompt_notes(results):
    off, on = scoreboard_rows(results, gpu=no_gpu_lookup)
    assert (off.date, off.machine) == ("2025-01-02", "Test CPU 9000, 8 cores, NVIDIA Test GPU")
    assert off.cache == "copy engine: prefix caching off"
    assert on.cache == "copy engine: hash cache of 1,024 blocks of 16, TTL 300 s"
    assert on.ttft_p50 == "95.0 @ 2,063 tok" and on.token_hit == f"{16000 / 18567:.3f}"
    assert on.notes == (
        "shared 2k sys prompt TTFT p50: 1,310 ms off -> 95 ms on; "
        "Zipf-8 hit rate 0.909 at 1,024 blocks (16,384 tokens, sim)"
    )
    line = on.as_markdown()
    assert "\n" not in line and line.count(" | ") == len(COLUMNS) - 1


def test_notes_say_what_is_available_without_a_pair(tmp_path):
    only = load_result(write_run(tmp_path / "on.parquet", enabled=True, ttft_ms=95.0, scenario="chat"))
    assert notes_cell([only], only) == "chat: token hit 0.862, cold first request TTFT 1,300 ms"


def test_append_keeps_earlier_rows_byte_identical(results, tmp_path):
    board = tmp_path / "SCOREBOARD.md"
    first = append_rows(board, scoreboard_rows(results[:1] + results[2:], gpu=no_gpu_lookup))
    assert first.created and board.read_text().count(HEADER) == 1
    before = board.read_bytes()
    second = append_rows(board, scoreboard_rows(results, gpu=no_gpu_lookup))
    after = board.read_bytes()
    assert after.startswith(before) and not second.created
    assert second.skipped_run_ids == ("off",) and [r.run_id for r in second.appended] == ["on"]
    assert after[len(before) :].decode().count("\n") == 1


def test_append_to_a_hand_edited_board_without_final_newline(results, tmp_path):
    board = tmp_path / "SCOREBOARD.md"
    text = f"# mine\n\n{HEADER}\n|---|\n| 2024 | old row, kept as is |"
    board.write_text(text)
    append_rows(board, scoreboard_rows(results, gpu=no_gpu_lookup))
    content = board.read_text()
    assert content.startswith(text + "\n") and content.count("\n| ") == 4


def test_a_foreign_markdown_file_is_refused(results, tmp_path):
    board = tmp_path / "notes.md"
    board.write_text("# something else\n")
    with pytest.raises(InputError, match="not a kvbench scoreboard"):
        append_rows(board, scoreboard_rows(results, gpu=no_gpu_lookup))
    assert board.read_text() == "# something else\n"


def test_pipes_are_escaped_so_rows_stay_single_line(tmp_path):
    run = load_result(write_run(tmp_path / "r.parquet", enabled=True, ttft_ms=90.0, model="a|b\nc"))
    (row,) = scoreboard_rows([run], gpu=no_gpu_lookup)
    line = row.as_markdown()
    assert "a\\|b c" in line and "\n" not in line
    assert escape_cell("x | y\n z") == "x \\| y z"


def test_machine_cell_detects_the_gpu_only_for_runs_made_here():
    calls = []

    def detect():
        calls.append(1)
        return "Local GPU"

    here = {key: value for key, value in this_machine().items() if key != "gpu"}
    assert machine_cell(here, detect).endswith(", Local GPU") and calls == [1]
    assert machine_cell({"cpu": "Far CPU", "cores": 999}, detect) == "Far CPU, 999 cores, GPU not recorded"
    assert machine_cell({"cpu": "X", "cores": 1, "gpu": None}, detect) == "X, 1 core, no GPU" and calls == [1]


def test_sim_files_alone_are_refused(results):
    with pytest.raises(InputError, match="no run results"):
        scoreboard_rows(results[2:])


def test_cli_export_creates_then_appends(tmp_path, kvbench):
    off = write_run(tmp_path / "off.parquet", enabled=False, ttft_ms=1310.0)
    on = write_run(tmp_path / "on.parquet", enabled=True, ttft_ms=95.0)
    board = tmp_path / "results" / "SCOREBOARD.md"
    code, out, _ = kvbench("scoreboard", "export", off, "--to", board)
    assert code == 0 and "created" in out and board.exists()
    code, out, err = kvbench("scoreboard", "export", off, on, "--to", board)
    assert code == 0 and "1 new row" in out and "already on" in err
    assert "1,310 ms off -> 95 ms on" in board.read_text().splitlines()[-1]
    code, _, err = kvbench("scoreboard", "export", tmp_path / "missing.parquet", "--to", board)
    assert code == 2 and "no such file" in err


def test_notes_are_not_repeated_on_every_row_and_interrupted_runs_say_so(tmp_path):
    """The shared-2k/Zipf notes were once on every row (an agent run's included), and an
    interrupted run was exported as a normal row."""
    off = write_run(tmp_path / "off.parquet", enabled=False, ttft_ms=1310.0)
    on = write_run(tmp_path / "on.parquet", enabled=True, ttft_ms=95.0)
    agent = write_run(tmp_path / "agent.parquet", enabled=True, ttft_ms=80.0, scenario="agent")
    metadata = read_metadata(agent)
    rows = pq.read_table(agent).to_pylist()
    write_rows(agent, rows, {**metadata, "complete": False}, schema=RUN_SCHEMA)
    by_name = {
        row.run_id: row
        for row in scoreboard_rows(
            load_results([off, on, agent, write_zipf_sim(tmp_path / "sim.parquet")]), gpu=no_gpu_lookup
        )
    }
    assert by_name["on"].notes.startswith("shared 2k sys prompt TTFT p50") and "Zipf-8" in by_name["on"].notes
    assert "TTFT p50: 1,310 ms off" not in by_name["off"].notes and "Zipf" not in by_name["off"].notes
    assert by_name["agent"].notes.startswith("interrupted: partial results; agent: token hit")
    assert "Zipf" not in by_name["agent"].notes and "shared 2k" not in by_name["agent"].notes
