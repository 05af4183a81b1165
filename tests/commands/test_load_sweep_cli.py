"""``kvbench sweep --backend openai --request-rate`` against a real ``kvbench serve``: one point per rate."""

import json

import pyarrow.parquet as pq
import pytest
from cli_and_rows import openai_args, small_chat

from kvbench.results.parquet import read_metadata


def test_two_rates_give_two_points_each_on_a_fresh_cache(kvbench, server, tmp_path):
    out = tmp_path / "sweep"
    code, stdout, stderr = kvbench(
        *small_chat("sweep", server.url), "--request-rate", "4,8", "--goodput", "ttft:60000", "--out", out
    )
    assert code == 0, stderr
    assert "request_rate" in stdout and "wrote 2 run files" in stdout
    summary = pq.read_table(out / "load_sweep.parquet").to_pylist()
    assert [(row["value"], row["repeat"]) for row in summary] == [(4.0, 0), (8.0, 0)]
    assert read_metadata(out / "load_sweep.parquet")["command"] == "load-sweep"
    for rate in (4, 8):
        path = out / f"run-r{rate}-1.parquet"
        assert read_metadata(path)["run"]["load"]["request_rate_per_s"] == rate
        rows = pq.read_table(path).to_pylist()
        assert len(rows) == 4 and rows[0]["cached_prompt_tokens"] == 0  # a new cache_salt: nothing cached yet
    assert all(row["request_goodput"] == pytest.approx(row["request_throughput"]) for row in summary)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--concurrency", "1,2", "--request-rate", "1"], "give one of --concurrency"),
        (["--backend", "inprocess", "--concurrency", "1,2"], "need --backend openai"),
        (["--backend", "openai", "--concurrency", "1,zero"], "--concurrency 1,zero"),
        (["--backend", "openai", "--request-rate", "0,2"], "must all be positive"),
        ([], "--cache-sizes"),
        (
            ["--backend", "openai", "--cache-sizes", "64", "--concurrency", "1"],
            "--cache-sizes sweeps the in-process",
        ),
    ],
)
def test_bad_sweep_flags_exit_2(kvbench, tmp_path, flags, message):
    code, _, stderr = kvbench("sweep", "chat", "--out", tmp_path / "s", *flags)
    assert code == 2 and message in stderr


def test_vllm_spellings_of_run_flags(kvbench, server, tmp_path):
    saved = tmp_path / "r.json"
    code, _, stderr = kvbench(
        *openai_args("run", "chat", server.url),
        "--num-prompts",
        "3",
        "--max-concurrency",
        "2",
        "--num-warmups",
        "1",
        "--max-tokens",
        "2",
        "--out",
        tmp_path / "r.parquet",
        "--save-result",
        saved,
    )
    assert code == 0, stderr
    result = json.loads(saved.read_text())
    assert (result["num_prompts"], result["num_warmup"], result["max_concurrency"]) == (2, 1, 2)


def test_ctrl_c_prints_the_finished_points_and_report_reads_the_sweep(kvbench, server, tmp_path, monkeypatch):
    from kvbench.run import api
    from kvbench.run.execute import RunInterrupted

    real, finished = api.run_planned, []

    def second_run_interrupted(config, on_progress=None):
        if finished:  # Ctrl-C during the second point: it has written nothing
            raise RunInterrupted(finished[0])
        finished.append(real(config, on_progress))
        return finished[0]

    monkeypatch.setattr(api, "run_planned", second_run_interrupted)
    out = tmp_path / "sweep"
    code, stdout, stderr = kvbench(*small_chat("sweep", server.url, 3), "--concurrency", "1,2", "--out", out)
    assert code == 130, stderr
    assert "interrupted: finished runs only" in stdout and "wrote 1 run files" in stdout
    assert read_metadata(out / "load_sweep.parquet")["complete"] is False
    assert [row["value"] for row in pq.read_table(out / "load_sweep.parquet").to_pylist()] == [1.0]
    monkeypatch.setenv("COLUMNS", "200")
    code, stdout, stderr = kvbench("report", out / "load_sweep.parquet", "--out", tmp_path / "report")
    assert code == 0, stderr
    assert "kvbench sweep: chat (concurrency)" in stdout and "throughput_vs_ttft.png" in stdout
    assert (tmp_path / "report" / "throughput_vs_ttft.png").stat().st_size > 1000
