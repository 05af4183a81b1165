"""Nonsense settings are refused up front (one line naming the flag), or said."""

import pyarrow.parquet as pq
import pytest
from cli_and_rows import file_fixture
from tiny_scenarios import SHARED_PREFIX

scenario = file_fixture(SHARED_PREFIX, "tiny.toml")


def no_model(config):
    raise AssertionError("the model was loaded before a cheap flag was checked")


def test_a_bad_cache_size_is_refused_before_the_model_loads(kvbench, scenario, monkeypatch):
    monkeypatch.setattr("kvbench.engine.model.load_model", no_model)
    code, _, err = kvbench("run", scenario, "--cache-size", "abc")
    assert code == 2 and "--cache-size" in err and "'abc' is not a byte size" in err


@pytest.mark.parametrize(
    "flags,needle",
    [
        (("--max-tokens", 100_000), "100,000 exceed the model's context of 8,192 tokens"),
        (("--block-size", 100_000), "--block-size 100000: longer than the model's context"),
    ],
)
def test_settings_no_request_can_meet_are_refused_up_front(
    kvbench, scenario, monkeypatch, tiny_loaded, tmp_path, flags, needle
):
    """Was: --max-tokens 100000 failed every request; --block-size 100000 ran with "1 blocks"."""
    monkeypatch.setattr("kvbench.engine.model.load_model", lambda config: tiny_loaded)
    out = tmp_path / "never.parquet"
    code, _, err = kvbench("run", scenario, *flags, "--out", out)
    # a check on the model's context comes after the threads and loading status lines: one error line, last
    errors = [
        line
        for line in err.strip().splitlines()
        if not line.startswith(("threads: ", "loading the model", "kvbench's CPU kernels are off"))
    ]
    assert code == 2 and len(errors) == 1 and needle in errors[0] and not out.exists()


def test_more_requests_than_the_source_and_a_replaced_out_are_said(
    kvbench, scenario, monkeypatch, tiny_loaded, tmp_path
):
    monkeypatch.setattr("kvbench.engine.model.load_model", lambda config: tiny_loaded)
    out = tmp_path / "run.parquet"
    out.write_bytes(b"an older run")
    code, _, err = kvbench("run", scenario, "--requests", 99_999_999, "--out", out)
    assert code == 0 and "--requests 99,999,999: the source has only 4 requests" in err
    assert f"--out {out}: replaced" in err.replace("\n", "") and pq.read_table(out).num_rows == 4


def test_compare_refuses_a_file_compared_with_itself(kvbench, tmp_path):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"x")
    code, _, err = kvbench("compare", path, path)
    assert code == 2 and "same file" in err
