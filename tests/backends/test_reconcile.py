"""Reconciliation: expectations, the order-free bound, flags, and the /metrics delta."""

import numpy as np
import pytest

from kvbench.backends.openai.metrics import parse_prefix_cache_counters
from kvbench.backends.openai.reconcile import expect, reconcile
from kvbench.request import Request, RequestRecord, Status
from kvbench.results.rows import ResultRow
from kvbench.server.metrics import ServerCounters, render_metrics
from kvbench.sim.bounds import possible_cached_tokens

SHARED = np.arange(1, 49, dtype=np.uint32)  # 48 tokens = 3 blocks of 16


def request(index, tail, salt=None):
    ids = np.concatenate([SHARED, np.asarray(tail, dtype=np.uint32)])
    return Request(index, f"r{index}", f"s{index}", 0, ids, max_tokens=4, salt=salt)


def sent(start_s, end_s):
    return RequestRecord(Status.OK, 0, sent_s=start_s, ended_s=end_s)


def test_expectations_follow_trace_order_block_floor_and_salt():
    requests = [request(0, [100]), request(1, [200]), request(2, [300], salt="other"), request(3, [])]
    expectations = expect(requests, 16)
    assert expectations.expected_cached_tokens == [0, 48, 0, 32]  # 48 tokens exactly: the last is recomputed
    assert expect(requests, 16, capacity_blocks=1).expected_cached_tokens[1] < 48


def test_possible_counts_only_requests_sent_before_this_one_ended():
    requests = [request(0, [100]), request(1, [200])]
    prompts = expect(requests, 16).prompts
    overlapping = [(0.0, 2.0), (1.0, 3.0)]
    assert possible_cached_tokens(prompts, overlapping) == [48, 48]  # either could have been served first
    apart = [(0.0, 1.0), (2.0, 3.0)]
    assert possible_cached_tokens(prompts, apart) == [0, 48]
    assert possible_cached_tokens(prompts, [(0.0, 1.0), None]) == [0, None]


def row(index, cached, prompt_tokens=49, status="ok"):
    return ResultRow(
        request_index=index,
        request_id=f"r{index}",
        status=status,
        prompt_tokens=prompt_tokens,
        cached_prompt_tokens=cached,
    )


def test_reconcile_flags_impossible_and_far_too_low_reports():
    requests = [request(0, [100]), request(1, [200]), request(2, [300]), request(3, [400])]
    expectations = expect(requests, 16)
    windows = [sent(float(i), i + 0.5) for i in range(4)]
    rows = [row(0, 16), row(1, 48), row(2, 16), row(3, None), row(4, 0)]
    result = reconcile(rows, requests, expectations, windows)
    assert [f.request_id for f in result.over_possible] == ["r0"]  # nothing was cached before r0
    assert [f.request_id for f in result.below_expected] == ["r2"]  # 32 tokens short: two blocks
    assert result.num_compared == 3 and result.num_unreported == 1
    assert result.reported_hit_rate == pytest.approx(80 / 147)
    assert result.expected_hit_rate == pytest.approx(96 / 147)


def test_overlapping_requests_served_out_of_order_are_counted_not_flagged():
    requests = [request(0, [100]), request(1, [200])]
    windows = [sent(0.0, 2.0), sent(0.1, 1.0)]
    result = reconcile([row(0, 48), row(1, 0)], requests, expect(requests, 16), windows)
    assert result.over_possible == () and result.num_above_expected == 1 and len(result.below_expected) == 1


def test_kvbench_serve_metrics_round_trip_and_give_the_delta():
    counters = ServerCounters()
    counters.record_success(prompt_tokens=93, cached_tokens=0, output_tokens=3)
    before = parse_prefix_cache_counters(render_metrics(counters, 'my "model"'))
    counters.record_success(prompt_tokens=93, cached_tokens=64, output_tokens=3)
    after = parse_prefix_cache_counters(render_metrics(counters, 'my "model"'))
    assert after.family == "kvbench:prefix_cache_queries_total"
    assert (after.queries_tokens, after.hits_tokens) == (186, 64)
    requests = [request(0, [1])]
    result = reconcile([], requests, expect(requests, 16), {}, before, after)
    assert result.metrics_hit_rate == pytest.approx(64 / 93) and result.metrics_queries_tokens == 93
