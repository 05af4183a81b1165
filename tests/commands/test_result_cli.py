"""``kvbench run`` on the real default model: vLLM's keys in the JSON, the --assert gate's exit codes."""

import json

import pyarrow.parquet as pq
import pytest
from cli_and_rows import file_fixture
from tiny_scenarios import PROMPT_TOKENS, SHARED_BLOCK_TOKENS
from tiny_scenarios import SHARED_PREFIX as SCENARIO

scenario = file_fixture(SCENARIO, "tiny.toml")


def test_json_gate_pass_and_fail(kvbench, scenario, tmp_path):
    out, saved = tmp_path / "run.parquet", tmp_path / "json"
    code, stdout, stderr = kvbench(
        "run",
        scenario,
        "--out",
        out,
        "--result-dir",
        saved,
        "--save-detailed",
        "--goodput",
        "ttft:60000",
        "--metric-percentiles",
        "50,99.9",
        "--assert",
        "hit_rate>=0.5",
        "--assert",
        "failed==0",
        "--assert",
        "completed==4",
    )
    assert code == 0, stderr
    assert "p99.9" in stdout and "pass" in stdout and "FAIL" not in stdout
    result = json.loads((saved / "run.json").read_text())  # --result-dir: the Parquet file's name
    rows = pq.read_table(out).to_pylist()
    assert (result["completed"], result["failed"], result["total_input_tokens"]) == (4, 0, 4 * PROMPT_TOKENS)
    assert result["token_hit_rate"] == pytest.approx(3 * SHARED_BLOCK_TOKENS / (4 * PROMPT_TOKENS))
    duration_s = (max(r["end_ms"] for r in rows) - min(r["sent_ms"] for r in rows)) / 1e3
    assert result["duration"] == pytest.approx(duration_s)
    assert result["request_throughput"] == pytest.approx(4 / duration_s)
    assert result["output_throughput"] == pytest.approx(12 / duration_s)
    # cold one apart
    assert result["median_ttft_ms"] == pytest.approx(sorted(r["ttft_ms"] for r in rows[1:])[1])
    assert "p99.9_e2el_ms" in result and "p90_e2el_ms" not in result
    # a minute of TTFT: every request is good
    assert result["request_goodput"] == pytest.approx(4 / duration_s)
    assert result["cached_tokens"] == [0] + [SHARED_BLOCK_TOKENS] * 3 and len(result["itls"][0]) == 2

    code, stdout, stderr = kvbench("run", scenario, "--out", out, "--assert", "hit_rate>=0.9")
    assert code == 3 and "1 of 1 assertion(s) failed" in stderr and "FAIL" in stdout


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--assert", "median_ttf_ms<=1"], "did you mean median_ttft_ms"),
        (["--percentile-metrics", "ttft,lat"], "--percentile-metrics"),
        (["--goodput", "ttft=5"], "--goodput"),
        (["--save-detailed"], "--save-detailed needs"),
    ],
)
def test_bad_result_flags_exit_2_before_any_model_loads(kvbench, scenario, tmp_path, flags, message):
    code, stdout, stderr = kvbench("run", scenario, "--out", tmp_path / "x.parquet", *flags)
    assert code == 2 and message in stderr and stdout == ""
    assert not (tmp_path / "x.parquet").exists()
