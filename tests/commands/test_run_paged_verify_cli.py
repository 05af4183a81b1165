"""``kvbench run --engine paged --verify`` under concurrency: the flips / mismatches row of the run table
and ``run.verify_logits`` in the Parquet metadata (real default model, file read back)."""

import pytest
from cli_and_rows import file_fixture, parquet_rows
from tiny_scenarios import PAGED_AT_4
from tiny_scenarios import SHARED_PREFIX as SCENARIO

from kvbench.results.parquet import read_metadata

scenario = file_fixture(SCENARIO, "tiny.toml")


@pytest.mark.parametrize("mode", [[], ["--batch-invariant"]])
def test_batched_verify_reports_flips_and_mismatches(kvbench, scenario, tmp_path, mode):
    out = tmp_path / "verify.parquet"
    code, stdout, stderr = kvbench(
        "run", scenario, *PAGED_AT_4, "--verify", "--ignore-eos", *mode, "--out", out
    )
    assert code == 0, stderr
    rows = parquet_rows(out)
    logits = read_metadata(out)["run"]["verify_logits"]
    assert logits["num_requests"] == len(rows) == 4
    assert logits["num_compared_tokens"] == sum(r["output_tokens"] for r in rows)
    assert logits["tie_tolerance_nats"] == 1e-3 and logits["max_abs_logprob_diff"] < 1e-3
    # fp32; batch-invariant: by construction
    assert logits["num_flips_near_ties"] == logits["num_mismatches"] == 0
    assert all(r["output_matches_reference"] is True for r in rows)
    assert "argmax flips near ties / mismatches" in stdout and "0 / 0" in stdout


def test_copy_engine_verify_has_no_logit_report(kvbench, tmp_path):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "copy.parquet"
    code, stdout, stderr = kvbench("run", scenario, "--verify", "--out", out)
    assert code == 0, stderr
    assert "verify_logits" not in read_metadata(out)["run"] and "argmax flips" not in stdout


def test_sampled_only_verify_says_nothing_was_compared(kvbench, tmp_path):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "sampled.parquet"
    code, stdout, stderr = kvbench(
        "run", scenario, "--engine", "paged", "--verify", "--temperature", "0.8", "--out", out
    )
    assert code == 0, stderr
    logits = read_metadata(out)["run"]["verify_logits"]
    assert logits["num_compared_tokens"] == 0 and logits["num_requests"] == 0  # metadata kept as it was
    lines = [line for line in stdout.splitlines() if "argmax flips" in line or "max |logprob diff|" in line]
    assert len(lines) == 2 and all("n/a (no greedy requests)" in line for line in lines), stdout
    assert not any("0 / 0" in line or "0.00e+00" in line for line in lines)
