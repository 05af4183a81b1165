"""The engine table of ``kvbench peer vllm``: its arithmetic from the records (medians,
ratios, tok/s over the send loop's window), the same requests to every server in interleaved rounds
(fake servers behind the one backend contract), and vLLM's thread count read from its log."""

import pytest
from fake_peer import FakeServer

from kvbench.peer.driver import warm_up_request
from kvbench.peer.engines import (
    CHAT_CONCURRENCY,
    ENGINE_MAX_TOKENS,
    EngineServer,
    engine_markdown,
    engine_rows,
    engine_summary,
    engine_table,
    engine_workload,
    iter_rounds,
    round_measures,
)
from kvbench.peer.kvbench_server import KvbenchServer, KvbenchServerConfig
from kvbench.peer.report import ROW_SCHEMA, table_rows
from kvbench.peer.server import vllm_omp_threads
from kvbench.request import RequestRecord, Status


def record(ttft_ms, tpot_ms=10.0, output_tokens=32, cached=0, sent_s=0.0, ended_s=1.0, ok=True):
    return RequestRecord(
        Status.OK if ok else Status.ERROR,
        100,
        cached_prompt_tokens=cached,
        output_tokens=output_tokens,
        ttft_ms=ttft_ms,
        e2e_ms=ttft_ms + tpot_ms * (output_tokens - 1),
        sent_s=sent_s,
        ended_s=ended_s,
    )


def test_a_rounds_values_come_from_its_records():
    shared = [
        record(900.0, tpot_ms=20.0),
        record(70.0, 16.0, cached=1984),
        record(80.0, 17.0, cached=1984),
        record(75.0, 18.0, cached=1984, ok=False),
    ]
    chat = [
        record(50.0, output_tokens=32, sent_s=1.0, ended_s=2.0, cached=300),
        record(60.0, output_tokens=32, sent_s=1.5, ended_s=5.0),
        record(60.0, output_tokens=16, sent_s=2.0, ended_s=4.0, ok=False),
    ]
    measures = round_measures(shared, chat)
    assert measures["cold_ttft_ms"] == 900.0
    assert measures["warm_ttft_p50_ms"] == 75.0  # the failed warm request is left out: median(70, 80)
    assert measures["tpot_p50_ms"] == 17.0  # median(20, 16, 17) over the ok requests
    assert measures["output_tokens_per_s"] == pytest.approx(64 / 4.0)  # ok tokens / (5.0 - 1.0 s)
    assert measures["shared_cached_tokens"] == 3 * 1984 and measures["chat_cached_tokens"] == 300
    assert measures["num_failed"] == 2
    failed_cold = round_measures([record(900.0, ok=False), record(70.0)], [])
    assert failed_cold["cold_ttft_ms"] is None and failed_cold["output_tokens_per_s"] is None
    assert failed_cold["chat_cached_tokens"] is None


def servers():
    return [
        EngineServer("vllm", 1, "vLLM log: core ids", "float32", 120.0),
        EngineServer("kvbench-paged", 1, "as vLLM", "float32", 30.0),
    ]


def two_rounds(name, cold_ms, warm_ms, chat_end_s):
    return [
        (
            name,
            round_index,
            [record(cold_ms[round_index]), record(warm_ms[round_index])],
            [record(50.0, sent_s=0.0, ended_s=chat_end_s[round_index])],
        )
        for round_index in range(2)
    ]


def test_the_table_takes_medians_over_rounds_and_divides_by_vllm():
    from kvbench.peer.engines import RoundRecords

    rounds = [
        RoundRecords(name, index, tuple(shared), tuple(chat))
        for name, index, shared, chat in two_rounds("vllm", (900.0, 1100.0), (70.0, 80.0), (0.2, 0.3))
        + two_rounds("kvbench-paged", (2000.0, 2400.0), (150.0, 130.0), (1.0, 0.6))
    ]
    rows = {row.key: row for row in engine_table(servers(), rounds)}
    cold = rows["cold_ttft_ms"]
    assert cold.values == {"vllm": (900.0, 1100.0), "kvbench-paged": (2000.0, 2400.0)}
    assert cold.median("vllm") == 1000.0 and cold.ratio("kvbench-paged") == pytest.approx(2.2)
    assert rows["warm_ttft_p50_ms"].ratio("kvbench-paged") == pytest.approx(140.0 / 75.0)
    tok_s = rows["output_tokens_per_s"]  # 32 tokens per chat round: 160 and 106.7 vs 32 and 53.3 tok/s
    assert tok_s.values["vllm"] == pytest.approx((160.0, 320 / 3)) and tok_s.better == "higher"
    assert tok_s.ratio("kvbench-paged") == pytest.approx((32 + 160 / 3) / 2 / ((160 + 320 / 3) / 2))
    assert rows["startup_s"].values == {"vllm": (120.0,), "kvbench-paged": (30.0,)}
    assert rows["startup_s"].ratio("kvbench-paged") == 0.25
    assert rows["shared_cached_tokens"].ratio("kvbench-paged") is None  # 0 cached on vLLM: no ratio
    lines = engine_markdown(servers(), list(rows.values()), 2)
    assert "| kvbench-paged | 1 (as vLLM) | float32 | 30 s |" in lines
    assert (
        "| shared_2k: cold TTFT (ms) | 1,000 (900 / 1,100) | 2,200 (2,000 / 2,400) | 2.20x | lower |" in lines
    )
    summary = engine_summary(list(rows.values()))
    assert summary.startswith(
        "kvbench-paged / vllm: cold TTFT 2.20x, warm TTFT 1.87x, TPOT 1.00x, chat tok/s 0.32x"
    )
    assert rows["cold_ttft_ms"].as_dict()["kvbench_over_vllm"] == {"kvbench-paged": pytest.approx(2.2)}


def test_every_server_gets_the_same_requests_in_interleaved_rounds(shared, chat, tokenizer):
    workload = engine_workload(shared, chat)
    vllm, kvbench = FakeServer(0.001), FakeServer(0.002)
    order = []
    rounds = list(
        iter_rounds(
            {"vllm": vllm, "kvbench-copy": kvbench}, workload, 2, warm_up_request(tokenizer), order.append
        )
    )
    assert [(r.server, r.round_index) for r in rounds] == [
        ("vllm", 0),
        ("kvbench-copy", 0),
        ("vllm", 1),
        ("kvbench-copy", 1),
    ]
    assert len(order) == 4 and order[0].startswith("round 1/2 vllm: cold_ttft_ms 1, warm_ttft_p50_ms 1")

    def sent(server):
        return [(r.request_id, r.salt, r.max_tokens, r.token_ids.tolist()) for r in server.seen]

    assert sent(vllm) == sent(kvbench) and len(vllm.seen) == 1 + 2 * (4 + 4)  # a warm-up, then 2 rounds
    salts = {r.salt for r in vllm.seen[1:]}
    # each round in a namespace of its own: its cold request is cold
    assert salts == {
        "peer-test-shared-round-0",
        "peer-test-chat-round-0",
        "peer-test-shared-round-1",
        "peer-test-chat-round-1",
    }
    assert all(r.ok for result in rounds for r in result.shared + result.chat)  # salts vLLM accepts (no "/")
    assert all(r.max_tokens == ENGINE_MAX_TOKENS for r in vllm.seen[1:])
    assert 1 < vllm.most_in_flight <= CHAT_CONCURRENCY  # the chat runs concurrently, shared_2k one at a time
    rows = engine_rows(rounds, workload, {"run_id": "t", "block_size": 16})
    assert len(rows) == 2 * 2 * 8 and {r["backend"] for r in rows} == {"vllm", "kvbench-copy"}
    assert {r["concurrency"] for r in rows if r["comparison"] == "chat"} == {CHAT_CONCURRENCY}
    assert all(r["sent_s"] is not None and r["ended_s"] >= r["sent_s"] for r in rows)
    assert set(table_rows(rows)[0]) == set(ROW_SCHEMA.names)


def test_vllms_thread_count_comes_from_its_log_then_its_environment():
    log = (
        "INFO OpenMP thread binding info: \n\tVLLM_CPU_OMP_THREADS_BIND='auto', auto_setup=True, "
        "skip_setup=False\n\tlocal_world_size=1, reserve_cpu_num=1\n\tlocal_rank=0, core ids=[0]\n"
    )
    assert vllm_omp_threads(log) == (1, "vLLM log: core ids")
    assert vllm_omp_threads(log.replace("core ids=[0]", "core ids=[0, 1, 3]")) == (3, "vLLM log: core ids")
    assert vllm_omp_threads("no such line", "0-1,4|5-7") == (3, "VLLM_CPU_OMP_THREADS_BIND")
    assert vllm_omp_threads("no such line") == (None, "unknown")


def test_kvbench_serve_is_started_on_the_same_checkpoint_blocks_threads_and_dtype(tmp_path):
    server = KvbenchServer(
        KvbenchServerConfig(
            tmp_path / "model", tmp_path / "copy.log", "paged", 32, 1, "bfloat16", "kvbench-default"
        )
    )
    command = server.command()
    assert command[1:5] == ["-m", "kvbench.cli", "serve", "--port"] and command[5] == "0"
    flags = dict(zip(command[6::2], command[7::2]))
    assert flags == {
        "--model": str(tmp_path / "model"),
        "--served-model-name": "kvbench-default",
        "--engine": "paged",
        "--block-size": "32",
        "--dtype": "bfloat16",
        "--threads": "1",
    }
    with pytest.raises(ValueError, match="engine must be 'copy' or 'paged'"):
        KvbenchServerConfig(tmp_path, tmp_path / "x.log", "fast")


def test_a_dtype_both_sides_cannot_run_is_one_error_line_and_exit_2(kvbench, tmp_path):
    code, out, err = kvbench("peer", "vllm", "--dtype", "fp8", "--out", tmp_path / "peer")
    assert code == 2 and "--dtype must be one of float32, bfloat16, got 'fp8'" in err
    assert "Traceback" not in err + out and not (tmp_path / "peer").exists()  # nothing started
