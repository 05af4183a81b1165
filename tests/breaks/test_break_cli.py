"""``kvbench break``: the list, one small experiment end to end, bad input."""

import pyarrow.parquet as pq

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
    code, stdout, err = kvbench("break", "shared-salt", "--trials", 2, "--prompt-tokens", 16, "--out", out)
    assert code == 0, err
    assert "verdict" in stdout and f"to {out}" in stdout.replace("\n", "")
    table = pq.read_table(out)
    assert set(RUN_COLUMNS) | {"experiment", "variant", "tenant", "probe"} <= set(table.column_names)
    assert table.num_rows == 2 * 2 * 3
    metadata = read_metadata(out)
    assert metadata["command"] == "break" and metadata["experiment"] == "shared-salt"


def test_bad_input_is_one_line_and_exit_2(kvbench):
    code, _, err = kvbench("break", "tiny-hash", "--bits", 4)
    assert code == 2 and "hash_bits" in err and len(err.strip().splitlines()) == 1
