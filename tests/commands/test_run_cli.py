"""``kvbench run`` on the real default model: hit rates, identical outputs, Parquet, interruption."""

import signal

import pyarrow.parquet as pq
import pytest
from cli_and_rows import file_fixture, one_error_line
from readiness import interrupted_kvbench
from tiny_scenarios import LONG_SHARED_PREFIX, PROMPT_TOKENS, SHARED_BLOCK_TOKENS
from tiny_scenarios import SHARED_PREFIX as SCENARIO

from kvbench.results.parquet import read_metadata
from kvbench.results.schema import RUN_COLUMNS

scenario = file_fixture(SCENARIO, "tiny.toml")


def read_rows(path):
    return pq.read_table(path).to_pylist()


def test_cache_on_hits_the_block_floored_shared_prefix(kvbench, scenario, tmp_path):
    out = tmp_path / "on.parquet"
    code, stdout, stderr = kvbench("run", scenario, "--verify", "--out", out)
    assert code == 0, stderr
    rows = read_rows(out)
    assert list(pq.read_schema(out).names) == list(RUN_COLUMNS)
    assert [r["prompt_tokens"] for r in rows] == [PROMPT_TOKENS] * 4
    assert [r["cached_prompt_tokens"] for r in rows] == [0] + [SHARED_BLOCK_TOKENS] * 3
    assert [r["expected_cached_tokens"] for r in rows] == [0] + [SHARED_BLOCK_TOKENS] * 3
    assert all(r["output_matches_reference"] is True for r in rows)
    assert all(r["output_tokens"] == 3 and len(r["itl_ms"]) == 2 for r in rows)
    assert all(0 < r["ttft_ms"] <= r["e2e_ms"] for r in rows)
    # concurrency 1: each request is sent once the previous one has finished
    assert rows[0]["sent_ms"] >= 0 and all(
        b["sent_ms"] >= a["sent_ms"] + a["e2e_ms"] for a, b in zip(rows, rows[1:])
    )
    assert all(r["lookup_ms"] > 0 and r["kv_load_ms"] >= 0 and r["insert_ms"] >= 0 for r in rows)
    assert {r["cache_enabled"] for r in rows} == {True} and {r["block_size"] for r in rows} == {16}
    metadata = read_metadata(out)
    assert metadata["complete"] is True and metadata["run"]["cache"]["capacity_blocks"] == 64
    assert metadata["summary"]["token_hit_rate"] == pytest.approx(3 * 64 / (4 * 93))
    assert metadata["run"]["trace"]["content_hash"].startswith("sha256:")
    assert "token hit rate" in stdout


def test_cache_off_caches_nothing(kvbench_rows, scenario, tmp_path):
    out = tmp_path / "off.parquet"
    rows = kvbench_rows("run", scenario, "--cache", "off", out=out)
    assert [r["cached_prompt_tokens"] for r in rows] == [0] * 4
    assert {r["cache_enabled"] for r in rows} == {False}


def test_interrupted_run_keeps_every_finished_row(kvbench, scenario, tmp_path, monkeypatch):
    from kvbench.backends import inprocess

    real_serve = inprocess.InProcessBackend.serve
    calls = []

    async def serve_then_interrupt(self, request):
        calls.append(request.index)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return await real_serve(self, request)

    monkeypatch.setattr(inprocess.InProcessBackend, "serve", serve_then_interrupt)
    out = tmp_path / "cut.parquet"
    code, _, stderr = kvbench("run", scenario, "--out", out)
    assert code == 130 and "interrupted after 2 of 4" in stderr
    assert len(read_rows(out)) == 2
    assert read_metadata(out)["complete"] is False


def test_warmup_rows_are_kept_and_marked(kvbench_rows, scenario, tmp_path):
    out = tmp_path / "warm.parquet"
    rows = kvbench_rows("run", scenario, "--warmup", "1", out=out)
    assert [r["phase"] for r in rows] == ["warmup", "measure", "measure", "measure"]
    assert read_metadata(out)["summary"]["num_requests"] == 3


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--cache-size", "0"], "--cache-size 0"),
        (["--cache", "maybe"], "cache must be 'on' or 'off'"),
        (["--requests", "0"], "--requests: 0"),
        (["--model", "/nonexistent/checkpoint"], "/nonexistent/checkpoint"),
        (["--device", "tpu"], "device"),
        (["--warmup", "4"], "--warmup 4 leaves none of the 4 requests to measure"),
        (
            ["--backend", "openai", "--base-url", "http://127.0.0.1:9/v1"],
            "cannot reach the server at http://127.0.0.1:9/v1",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(kvbench, scenario, tmp_path, args, needle):
    code, _, stderr = kvbench("run", scenario, *args, "--out", tmp_path / "x.parquet")
    assert needle in one_error_line(code, stderr)


def test_the_scenarios_verify_tokens_reaches_the_engines_cache(kvbench, tmp_path):
    path = tmp_path / "guarded.toml"
    path.write_text(SCENARIO.replace("block_size = 16", "block_size = 16\nverify_tokens = true"))
    out = tmp_path / "guarded.parquet"
    code, _, stderr = kvbench("run", path, "--requests", "2", "--out", out)
    assert code == 0, stderr
    assert read_metadata(out)["run"]["cache"]["verify_tokens"] is True
    assert [r["cached_prompt_tokens"] for r in read_rows(out)] == [0, SHARED_BLOCK_TOKENS]


def test_sigterm_writes_what_was_measured_and_exits_130(tmp_path):
    scenario, out = tmp_path / "long.toml", tmp_path / "term.parquet"
    scenario.write_text(LONG_SHARED_PREFIX)
    code, stdout, stderr = interrupted_kvbench(["run", scenario, "--out", out], out, signal.SIGTERM)
    assert code == 143, stderr  # 128 + SIGTERM, the shell's convention
    rows = read_rows(out)
    assert 0 < len(rows) < 400 and read_metadata(out)["complete"] is False
    assert f"interrupted after {len(rows)} of 400 requests" in stderr
    assert "kvbench run: long" in stdout and f"{len(rows)} / 0 / 0" in stdout  # the summary of what was kept


def test_threads_and_the_machines_load_are_recorded(kvbench, scenario, tmp_path):
    out = tmp_path / "threads.parquet"
    code, _, stderr = kvbench("run", scenario, "--threads", "1", "--out", out)
    assert code == 0, stderr
    load = read_metadata(out)["machine_load"]
    assert set(load) == {"start", "end"}
    for sample in load.values():
        assert sample["torch_threads"] == 1 and sample["usable_cpus"] >= 1 and sample["cpu_count"] >= 1
        assert sample["load_1m"] is None or sample["load_1m"] >= 0
    assert isinstance(read_metadata(out)["warnings"], list)
    threads = read_metadata(out)["run"]["threads"]  # the choice and why
    assert (threads["num_threads"], threads["reason"], threads["requested"]) == (1, "--threads 1", 1)
    assert threads["usable_cores"] >= 1 and set(threads["wait_policy"]) == {
        "OMP_WAIT_POLICY",
        "KMP_BLOCKTIME",
        "set_by",
    }
    assert "threads: 1 (--threads 1; OMP_WAIT_POLICY=" in stderr
    code, _, stderr = kvbench("run", scenario, "--threads", "0", "--out", tmp_path / "zero.parquet")
    assert (
        code == 2
        and "--threads: 0 is not a positive number of threads" in stderr
        and "Traceback" not in stderr
    )
