"""``kvbench break``: the list, one small experiment end to end, bad input."""

import pyarrow.parquet as pq
import pytest
from tiny_workloads import tiny_timestamp

from kvbench.results.parquet import read_metadata
from kvbench.results.schema import RUN_COLUMNS


def test_list_describes_every_experiment(kvbench):
    code, out, _ = kvbench("break", "--list")
    assert code == 0
    for name in ("timestamp", "head-first", "views", "tiny-hash", "shared-salt"):
        assert name in out


def test_shared_salt_writes_parquet_like_a_run(kvbench, tmp_path, monkeypatch, small_model):
    monkeypatch.setattr("kvbench.engine.model.load_model", lambda config: small_model)  # fast, same path
    out = tmp_path / "salt.parquet"
    code, stdout, err = kvbench(
        "break", "shared-salt", "--trials", 2, "--prompt-tokens", 16, "--threads", 1, "--out", out
    )
    assert code == 0, err
    assert "verdict" in stdout and f"to {out}" in stdout.replace("\n", "")
    table = pq.read_table(out)
    assert set(RUN_COLUMNS) | {"experiment", "variant", "tenant", "probe"} <= set(table.column_names)
    assert table.num_rows == 2 * 2 * 3
    metadata = read_metadata(out)
    assert metadata["command"] == "break" and metadata["experiment"] == "shared-salt"
    # --threads 1 is recorded with its reason
    assert metadata["threads"]["num_threads"] == 1 and metadata["threads"]["reason"] == "--threads 1"
    assert "threads: 1 (--threads 1;" in err and "loading the model" in err


def test_shared_salt_with_three_trials_is_inconclusive_not_cannot_tell(
    kvbench, tmp_path, monkeypatch, small_model
):
    """3 trials cannot reach p < 0.01 whatever the TTFTs (smallest one-sided Mann-Whitney U p: 0.040)."""
    monkeypatch.setattr("kvbench.engine.model.load_model", lambda config: small_model)
    out = tmp_path / "salt.parquet"
    code, stdout, err = kvbench("break", "shared-salt", "--trials", 3, "--prompt-tokens", 16, "--out", out)
    assert code == 0, err
    flat = " ".join(stdout.split())
    assert (
        "cannot tell" not in flat
        and "but inconclusive: 3 trials cannot reach p < 0.01 whatever the TTFTs" in flat
    )
    assert "--trials 5 or more can" in flat and "the smallest p 3 trials can give is 0.04" in flat
    tests = read_metadata(out)["tests"]
    assert (
        tests["unsalted"]["smallest_p_value"]
        == tests["salted"]["smallest_p_value"]
        == pytest.approx(0.0404, abs=1e-4)
    )
    assert tests["unsalted"]["p_value"] >= tests["unsalted"]["smallest_p_value"]


def test_bad_input_is_one_line_and_exit_2(kvbench):
    code, _, err = kvbench("break", "tiny-hash", "--bits", 4)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--bits: must be between 8 and 256" in err and "got 4" in err  # the flag, not the field hash_bits


def test_an_interrupt_keeps_every_finished_variant(kvbench, tmp_path, monkeypatch, small_model):
    """Ctrl-C once printed one blank line and wrote no Parquet. Here the second of the
    timestamp experiment's variants is interrupted; the first one's rows are written, marked incomplete."""
    from kvbench.breaks import common

    monkeypatch.setattr("kvbench.engine.model.load_model", lambda config: small_model)
    calls = []

    def interrupted_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    real = common.run_requests
    monkeypatch.setattr(common, "run_requests", interrupted_second)
    out = tmp_path / "ts.parquet"
    code, _, err = kvbench(*tiny_timestamp(), "--out", out)
    assert code == 130 and "kept 1 finished variant(s), 3 rows" in err and str(out) in err.replace("\n", "")
    table = pq.read_table(out)
    assert table.num_rows == 3 and set(RUN_COLUMNS) <= set(table.column_names)
    metadata = read_metadata(out)
    assert metadata["complete"] is False and len(metadata["variants_finished"]) == 1


def test_an_unwritable_out_is_refused_before_the_experiment_runs(kvbench, tmp_path, monkeypatch):
    """The raw OSError once came only after the whole experiment had run."""
    monkeypatch.setattr(
        "kvbench.engine.model.load_model", lambda config: (_ for _ in ()).throw(AssertionError)
    )
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = kvbench("break", "timestamp", "--out", blocker / "ts.parquet")
    assert code == 2 and "--out" in err and "is a file" in err and len(err.strip().splitlines()) == 1


def test_bare_break_is_a_usage_error_like_bare_kvbench(kvbench):
    code, out, _ = kvbench("break")
    assert code == 2 and "timestamp" in out
