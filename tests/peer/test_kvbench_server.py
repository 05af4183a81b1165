"""``kvbench serve`` as the peer's second kind of server process, end to end: the engine
comparison of ``kvbench peer vllm`` starts a copy and a paged ``kvbench serve`` (``--port 0``, the
port read from its log) on an exported checkpoint beside a (fake) vLLM, runs a round over all three
with the same client, stops both process groups, and writes the table and the rows, read back here."""

import pyarrow.parquet as pq
from fake_peer import FakeServer
from tiny_workloads import prepared_chat, prepared_shared

from kvbench.backends.openai.admin import call
from kvbench.workloads.tokenizer import TiktokenTokenizer


class FakeVllm:
    """What the engine comparison reads of the running vLLM: its threads, start-up and model name."""

    startup_s = 100.0

    class config:
        served_model_name = "kvbench-default"

    def num_threads(self):
        return 1, "vLLM log: core ids"


def test_the_engine_comparison_runs_kvbench_serve_beside_vllm_and_writes_the_table(tiny_loaded, tmp_path):
    from kvbench.engine.export import export_model
    from kvbench.peer.vllm_peer import Measured, PeerConfig, _engine_comparison, _write

    tokenizer = TiktokenTokenizer()
    export_model(tmp_path / "model", tiny_loaded, overwrite=True, reference=tokenizer)
    prepared = prepared_comparisons(tokenizer)
    config = PeerConfig(out_dir=tmp_path, venv=tmp_path / "no-venv", rounds=1, startup_timeout_s=600.0)
    measured, lines, vllm = Measured(), [], FakeServer(0.001)
    _engine_comparison(
        config,
        tmp_path / "model",
        tokenizer,
        FakeVllm(),
        vllm,
        list(prepared.values()),
        measured,
        lines.append,
    )
    check_engines_and_rounds(measured, vllm)
    check_servers_stopped(tmp_path)
    check_report(_write(config, measured, prepared, "tiny", True, lambda line: None))


def prepared_comparisons(tokenizer):
    """A small shared_2k (3 requests) and chat (2 conversations of 2 turns), as the peer prepares them."""
    return {
        "shared_2k": prepared_shared(tokenizer, "shared_2k", "peer-e2e", seed=5),
        "chat": prepared_chat(tokenizer, "chat", "peer-e2e-chat"),
    }


def check_engines_and_rounds(measured, vllm):
    """Three servers with vLLM's thread count, one round each; the real ones served every request."""
    assert [(e.name, e.num_threads, e.threads_source) for e in measured.engines] == [
        ("vllm", 1, "vLLM log: core ids"),
        ("kvbench-copy", 1, "as vLLM"),
        ("kvbench-paged", 1, "as vLLM"),
    ]
    assert all(e.startup_s > 0 for e in measured.engines)
    assert [(r.server, r.round_index) for r in measured.rounds] == [
        ("vllm", 0),
        ("kvbench-copy", 0),
        ("kvbench-paged", 0),
    ]
    for result in measured.rounds[1:]:  # the real servers: ok, a cold first request, then hits
        assert all(r.ok and r.output_tokens == 32 for r in result.shared + result.chat)
        assert result.shared[0].cached_prompt_tokens == 0 and result.shared[1].cached_prompt_tokens >= 32
    assert len(vllm.seen) == 1 + 3 + 4  # the warm-up, shared_2k, chat


def check_servers_stopped(tmp_path):
    """Each ``kvbench serve`` ran with its engine and vLLM's threads, and no longer answers."""
    for engine in ("copy", "paged"):
        log = (tmp_path / f"kvbench-{engine}.log").read_text()
        assert f"--engine {engine}" in log.splitlines()[0] and "--threads 1" in log.splitlines()[0]
        port = int(log.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
        # stopped after the comparison
        assert call(f"http://127.0.0.1:{port}/health", "", timeout_s=2)[0] != 200


def check_report(report):
    """The Parquet rows of all three servers and the engine table in the Markdown."""
    table = pq.read_table(report.parquet_path)
    assert table.num_rows == 3 * (3 + 4) and set(table.column("backend").to_pylist()) == {
        "vllm",
        "kvbench-copy",
        "kvbench-paged",
    }
    assert sorted(set(table.column("concurrency").to_pylist())) == [1, 8]
    assert "## The engines side by side (1 round," in report.markdown
    assert "| kvbench-paged | 1 (as vLLM) | float32 |" in report.markdown
    keys = [row.key for row in report.engine_rows]
    assert keys[:4] == ["cold_ttft_ms", "warm_ttft_p50_ms", "tpot_p50_ms", "output_tokens_per_s"]
