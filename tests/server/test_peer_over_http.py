"""The peer harness's HTTP path (the OpenAI backend with vLLM's extra fields, the one send loop at
concurrency 1, the admin calls and the /metrics parser) against a live ``kvbench serve``."""

import pytest
from tiny_workloads import prepared_chat, prepared_shared

from kvbench.backends.openai.admin import fetch_metrics, list_models, reset_prefix_cache
from kvbench.backends.openai.metrics import parse_prefix_cache_counters
from kvbench.peer.comparisons import agreement_rows, predict
from kvbench.peer.driver import drive, vllm_backend, warm_up_request
from kvbench.workloads.tokenizer import load_tokenizer

MODEL = "tiny"
BLOCK = 16  # the live server's cache block size
NUM_GPU_BLOCKS = 4096  # the pool the prediction assumes: large enough that nothing is evicted
RUN_COLUMNS = {"run_id": "t", "block_size": BLOCK, "num_gpu_blocks": NUM_GPU_BLOCKS}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture
def backend(live, tokenizer):
    """The peer's vLLM client pointed at the live ``kvbench serve``."""
    return vllm_backend(live.url, MODEL, tokenizer, BLOCK)


def test_a_comparison_driven_over_http_agrees_with_the_prediction(live, tokenizer, backend):
    prepared = prepared_shared(
        tokenizer, "shared_http", "peer-over-http", 3, 80, seed=2, question_tokens=20, max_tokens=3
    )
    assert list_models(live.url, "EMPTY") == ([MODEL], None)
    [warm] = drive([warm_up_request(tokenizer)], backend)
    assert warm.ok and warm.output_tokens == 2
    assert reset_prefix_cache(live.url, "EMPTY")[0] == "/reset_prefix_cache"
    before = parse_prefix_cache_counters(fetch_metrics(live.url, "EMPTY"))
    seen = []
    records = drive(prepared.requests, backend, lambda request, record: seen.append(request.index))
    after = parse_prefix_cache_counters(fetch_metrics(live.url, "EMPTY"))
    assert seen == [0, 1, 2] and all(r.ok and r.output_tokens == 3 and r.http_status == 200 for r in records)
    assert all(r.prompt_token_ids is None for r in records)  # kvbench serve ignores return_token_ids
    rows = agreement_rows(prepared, records, predict(prepared, NUM_GPU_BLOCKS, BLOCK), RUN_COLUMNS)
    assert [r["cached_tokens_reported"] for r in rows] == [r["cached_tokens_predicted"] for r in rows]
    assert rows[0]["cached_tokens_reported"] == 0 and rows[1]["cached_tokens_reported"] >= 80 // BLOCK * BLOCK
    assert all(r["agrees"] and r["prompt_tokens_reported"] == r["prompt_tokens"] for r in rows)
    delta = after.since(before)
    assert delta.queries_tokens == sum(r["prompt_tokens"] for r in rows)
    assert delta.hits_tokens == sum(r["cached_tokens_reported"] for r in rows)


def test_the_peer_compare_step_runs_end_to_end_on_kvbench_serve(tokenizer, backend):
    from kvbench.peer.vllm_peer import VllmPoolShape, _compare

    prepared = prepared_shared(tokenizer, "shared_step", "peer-step", seed=3)
    lines = []
    rows, summary = _compare(
        backend, prepared, VllmPoolShape(NUM_GPU_BLOCKS, BLOCK), RUN_COLUMNS, lines.append
    )
    assert summary.num_requests == 3 and summary.num_exact == 3 and summary.disagreements == ()
    assert summary.metrics.queries_tokens == summary.prompt_tokens == summary.reported_prompt_tokens
    assert summary.metrics.hits_tokens == summary.reported_hits_tokens == summary.predicted_hits_tokens > 0
    assert "cache reset" in lines[0] and len(lines) == 4 and len(rows) == 3


def test_engine_rounds_over_http_start_cold_each_round_and_count_what_the_server_reported(tokenizer, backend):
    from kvbench.peer.engines import EngineServer, engine_table, engine_workload, iter_rounds

    shared = prepared_shared(tokenizer, "shared_2k", "peer-rounds", seed=4)
    workload = engine_workload(shared, prepared_chat(tokenizer, "chat", "peer-rounds-chat", 3))
    rounds = list(iter_rounds({"kvbench-copy": backend}, workload, 2, warm_up_request(tokenizer)))
    assert [r.round_index for r in rounds] == [0, 1]
    for result in rounds:  # a fresh namespace per round: the first request is a miss in both rounds
        assert all(r.ok and r.output_tokens == 32 for r in result.shared + result.chat)
        assert result.shared[0].cached_prompt_tokens == 0
        assert all(r.cached_prompt_tokens >= 64 // BLOCK * BLOCK for r in result.shared[1:])
        assert len(result.chat) == 6 and all(r.sent_s is not None for r in result.chat)
    [cached_row] = [
        row
        for row in engine_table([EngineServer("kvbench-copy", None, "default", "float32", None)], rounds)
        if row.key == "shared_cached_tokens"
    ]
    assert cached_row.values["kvbench-copy"] == tuple(
        float(sum(r.cached_prompt_tokens for r in result.shared)) for result in rounds
    )
