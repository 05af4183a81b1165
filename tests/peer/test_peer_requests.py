"""The peer's requests and its agreement rows: trace order, salts, what vLLM reported."""

from kvbench.peer.comparisons import agreement_rows, predict, reported_cached_tokens
from kvbench.request import RequestRecord, Status

BLOCK = 16


def test_requests_carry_the_servers_salt_and_the_rendered_ids(chat, tokenizer):
    requests = chat.requests
    assert [r.index for r in requests] == list(range(len(chat.trace.requests))) and len(requests) == 4
    assert all(r.salt == "peer-test-chat" for r in requests)  # the trace has no salts of its own
    for request, line in zip(requests, chat.trace.requests, strict=True):
        assert request.token_ids.tolist() == tokenizer.render(line).tolist()
        assert request.messages == line.messages and request.max_tokens == line.max_tokens


def usage_record(cached, ok=True, prompt_ids=None):
    return RequestRecord(
        Status.OK if ok else Status.ERROR,
        125,
        cached_prompt_tokens=cached,
        output_tokens=3,
        output_tokens_source="usage",
        prompt_token_ids=prompt_ids,
        ttft_ms=5.0,
        e2e_ms=9.0,
        error=None if ok else "boom",
    )


def test_agreement_rows_read_records(shared):
    requests = shared.requests
    predicted = predict(shared, num_gpu_blocks=1024, block_size=BLOCK)
    records = [
        usage_record(None, prompt_ids=tuple(int(t) for t in requests[0].token_ids)),
        usage_record(int(predicted[1])),
        usage_record(int(predicted[2]) - BLOCK, prompt_ids=(1, 2)),
        usage_record(int(predicted[3]), ok=False),
    ]
    rows = agreement_rows(
        shared, records, predicted, {"run_id": "t", "block_size": BLOCK, "num_gpu_blocks": 1024}
    )
    # omitted details = 0 cached; an error never agrees
    assert [r["agrees"] for r in rows] == [
        True,
        True,
        False,
        False,
    ]
    assert [r["prompt_ids_match"] for r in rows] == [True, None, False, None]
    assert (
        rows[0]["cached_tokens_reported"] == 0 and rows[3]["status"] == "error" and rows[3]["error"] == "boom"
    )
    assert rows[1]["output_tokens_reported"] == 3 and rows[1]["prompt_tokens_reported"] == 125
    no_usage = RequestRecord(Status.OK, 10, output_tokens=2, output_tokens_source="tokenizer")
    assert reported_cached_tokens(no_usage) is None


def test_a_disagreement_reads_how_much_an_earlier_prompt_shares(shared):
    # 133-token prompts whose first 108 tokens (system message + the user header) are common:
    # 6 full blocks of 16 = 96 tokens an earlier prompt can give; the last-token cap is 8 blocks.
    from kvbench.peer.comparisons import explain_disagreement

    first_id, second_id = (request.id for request in shared.trace.requests[:2])
    assert (
        explain_disagreement(shared, 0, 16, 16)
        == f"{first_id}: reported 16, at most 0 tokens shared with earlier prompts (cap 128)"
    )
    assert (
        explain_disagreement(shared, 1, 0, 16)
        == f"{second_id}: reported 0, at most 96 tokens shared with earlier prompts (cap 128)"
    )
