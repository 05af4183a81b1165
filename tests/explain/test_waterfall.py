"""The waterfall against the one replay and the predictor, on shipped scenarios; lint; bars."""

import pytest
from explain_traces import STABLE, first_difference

from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.explain.api import explain_requests, unbounded_config
from kvbench.explain.lint import lint
from kvbench.explain.waterfall import BAR_KEYS, Breakdown, breakdown
from kvbench.run.source import load_source
from kvbench.sim.outputs import trace_outputs
from kvbench.sim.predict import Unbounded, expected_cached_tokens


@pytest.mark.parametrize(
    "name, capacity, kind", [("multi_prefix_zipf", 512, CacheKind.HASH), ("chat", 256, CacheKind.RADIX)]
)
def test_hits_are_the_replays_and_the_ideal_is_the_unbounded_cache(name, capacity, kind, tokenizer):
    requests = load_source(name, tokenizer).requests[:150]
    config = CacheConfig(capacity_blocks=capacity, block_size=16, kind=kind)
    explained = explain_requests(requests, config, tokenizer)
    outputs = trace_outputs(requests)
    assert [e.hit_tokens for e in explained.requests] == expected_cached_tokens(requests, config, outputs)
    # with room for everything the hit is the never-evicting cache's, and what the bounded one lost
    # is exactly the capacity bar
    roomy = explain_requests(requests, unbounded_config(requests, config), tokenizer)
    assert [e.hit_tokens for e in roomy.requests] == expected_cached_tokens(
        requests, Unbounded(16, kind=kind), outputs
    )
    assert [e.hit_tokens for e in roomy.requests] == [
        e.hit_tokens + e.bars.tokens["capacity"] for e in explained.requests
    ]
    assert sum(e.bars.tokens["capacity"] for e in explained.requests) > 0
    waterfall = explained.waterfall
    assert sum(waterfall.tokens.values()) == waterfall.total_tokens == sum(r.num_tokens for r in requests)
    assert waterfall.rows()[-1][1] == sum(e.hit_tokens for e in explained.requests)
    assert waterfall.rows()[1][1] - sum(row[1] for row in waterfall.rows()[2:-1]) == waterfall.tokens["hit"]


def test_breakdown_refuses_bars_that_do_not_sum_and_a_server_can_report_more():
    with pytest.raises(ValueError, match="sum"):
        Breakdown(len(BAR_KEYS) + 1, dict.fromkeys(BAR_KEYS, 1))
    bars = breakdown(100, 16, shared_any=90, shared_same=90, replay_hit=64, reported=80)
    assert bars.tokens["server"] == -16 and bars.tokens["hit"] == 80 and sum(bars.tokens.values()) == 100


def test_a_routed_run_splits_routing_from_the_server_and_only_its_waterfall_shows_routing(tokenizer):
    # 64 tokens the replay allows: the router's replica held 32 of them, the server reported 16
    bars = breakdown(100, 16, shared_any=90, shared_same=90, replay_hit=64, reported=16, routed=32)
    assert (bars.tokens["routing"], bars.tokens["server"], bars.tokens["hit"]) == (32, 16, 16)
    # more replicas, more room: the routed hit may exceed one cache's (a negative routing bar)
    assert breakdown(100, 16, 90, 90, 48, reported=64, routed=64).tokens["routing"] == -16
    requests = load_source("chat", tokenizer).requests[:30]
    config = CacheConfig(capacity_blocks=4096, block_size=16)
    one = explain_requests(requests, config, tokenizer)
    half = [e.hit_tokens // 32 * 16 for e in one.requests]  # the router's replica held half, in blocks
    routed = explain_requests(requests, config, tokenizer, reported=half, routed=half)
    assert routed.waterfall.tokens["routing"] == one.waterfall.tokens["hit"] - sum(half) > 0
    assert routed.waterfall.tokens["server"] == 0 and routed.waterfall.tokens["hit"] == sum(half)
    labels = [row[0] for row in routed.waterfall.rows()]
    assert "lost to routing (the prefix was on another replica)" in labels
    assert "lost to routing (the prefix was on another replica)" not in [
        row[0] for row in one.waterfall.rows()
    ]
    kinds = {cause.kind for e in routed.requests for cause in e.causes}
    assert "routed away" in kinds and "server reported less" not in kinds


def test_lint_finds_the_volatile_header_and_a_rewritten_turn(chat, tokenizer):
    top = [
        chat(i, [("system", f"Current time: 2025-01-01 10:00:{i:02d}\n" + STABLE), ("user", "Hi?")])
        for i in range(2)
    ]
    report = lint(top, tokenizer)
    finding = report.findings[0]
    assert finding.rule == "stable first" and finding.offset_tokens == 7 and "date" in finding.detail
    assert "Current time: ‖2025-01-01" in finding.excerpt  # 3 ChatML tokens + "Current time:" before it
    assert report.share_after_volatile > 0.9
    end = lint(
        [chat(0, [("system", STABLE + "Current time: 2025-01-01 10:00:00\n"), ("user", "Hi?")])], tokenizer
    )
    assert end.findings[0].offset_tokens == 96 and end.share_after_volatile < 0.25
    turns = [
        chat(0, [("system", STABLE), ("user", "Hi?")], session="c"),
        chat(
            1,
            [("system", STABLE), ("user", "Hi?"), ("assistant", "Hello."), ("user", "Bye?")],
            session="c",
            turn=1,
        ),
        chat(
            2,
            [("system", STABLE), ("user", "Hi there?"), ("assistant", "Hello."), ("user", "Bye?")],
            session="c",
            turn=2,
        ),
    ]
    report = lint(turns, tokenizer)
    assert report.num_turns_checked == 2 and report.num_turns_append_only == 1
    rewritten = [f for f in report.findings if f.rule == "append-only"]
    assert len(rewritten) == 1 and rewritten[0].request_id == "r2"
    assert rewritten[0].offset_tokens == first_difference(turns[1].token_ids, turns[2].token_ids)
