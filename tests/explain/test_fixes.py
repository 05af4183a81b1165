"""``kvbench explain``'s fix list: every fix kind on a small trace built for it, each gain measured by
replaying the change, and applying a change by hand gives the gain it promised (kvbench/explain/)."""

import json

import numpy as np
import pytest
from explain_traces import STABLE
from tiny_workloads import AGENT_WITH_HEADER

from kvbench.bill.rules import cache_rules
from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.explain.api import explain_requests, replay_requests, unbounded_config
from kvbench.explain.capacity import capacity_targets, kv_bytes
from kvbench.explain.fix_kinds import fix_list
from kvbench.explain.fixes import Fix, FixOptions, rank
from kvbench.memory.presets import PRESETS
from kvbench.request import Request
from kvbench.results.sweep import Fit
from kvbench.sim.replay import simulate

B = 16


def fixes_of(requests, tokenizer, capacity=None, minimum=None, options=FixOptions(), **fields):
    config = CacheConfig(capacity_blocks=capacity or 1, block_size=B, **fields)
    config = config if capacity else unbounded_config(requests, config)
    explanation = explain_requests(requests, config, tokenizer, min_cacheable_tokens=minimum)
    return explanation, fix_list(explanation, requests, tokenizer, minimum, options)


def of_kind(fixes, kind):
    return next(fix for fix in fixes if fix.kind == kind)


def round_robin(chat, num_prompts=8):
    prompts = [
        chat(i, [("system", f"Tenant {chr(65 + i)}. " + STABLE), ("user", "Hello?")])
        for i in range(num_prompts)
    ]
    return prompts + [
        Request(
            num_prompts + i,
            f"r{num_prompts + i}",
            f"t{i}",
            0,
            p.token_ids,
            arrival_s=1.0 + i,
            max_tokens=4,
            messages=p.messages,
        )
        for i, p in enumerate(prompts)
    ]


def test_the_capacity_fix_is_the_smallest_cache_the_replay_confirms(chat, tokenizer):
    requests = round_robin(chat)
    explanation, fixes = fixes_of(
        requests,
        tokenizer,
        capacity=40,
        options=FixOptions((PRESETS["kvbench-default"], PRESETS["llama-3.1-8b"])),
    )
    fix = fixes[0]
    assert fix.kind == "capacity" and fix.hit_rate_before == 0.0
    size = fix.setting["cache_size"]
    assert fix.change.startswith(f"raise the cache to >= {size:,} blocks (")
    assert "for kvbench-default" in fix.change and "for llama-3.1-8b" in fix.change
    rerun = explain_requests(requests, CacheConfig(size, B), tokenizer).waterfall
    assert abs(rerun.share("hit") - fix.hit_rate_after) < 1e-12  # the promise, kept
    assert fix.gain_points == pytest.approx(100 * explanation.waterfall.share("capacity"))  # all of the bar
    smaller = explain_requests(requests, CacheConfig(size - 1, B), tokenizer).waterfall.tokens["hit"]
    assert smaller < rerun.tokens["hit"] and rerun.tokens["capacity"] == 0  # one block less misses some
    sizes = {s["share_of_ideal"]: s for s in fix.setting["sizes"]}
    assert (
        sizes[1.0]["capacity_blocks"] == size
        and sizes[0.5]["capacity_blocks"] <= sizes[0.9]["capacity_blocks"]
    )
    assert sizes[1.0]["llama-3.1-8b_bytes"] == size * B * 131_072  # 128 KiB per token (DESIGN.md)
    assert (
        sizes[1.0]["kvbench-default_bytes"]
        == kv_bytes(size, B, PRESETS["kvbench-default"])
        == size * B * 8192
    )
    assert fix.num_saved_tokens == rerun.tokens["hit"] - explanation.waterfall.tokens["hit"]


@pytest.mark.parametrize("kind", [CacheKind.HASH, CacheKind.RADIX])
def test_capacity_targets_match_the_replay_with_generated_blocks_stored(kind, tokenizer):
    rng = np.random.default_rng(3)
    prefixes = [rng.integers(0, 50_000, 64 + 16 * i) for i in range(5)]
    requests = [
        Request(
            i,
            f"r{i}",
            f"s{i}",
            0,
            np.concatenate([prefixes[int(rng.integers(5))], rng.integers(0, 50_000, 20)]).astype(np.uint32),
            arrival_s=float(i),
            max_tokens=int(rng.integers(2, 40)),
        )
        for i in range(60)
    ]
    config = CacheConfig(1, B, kind=kind)
    base = replay_requests(requests, config)
    assert base.trace.stored is not None  # outputs are stored: the curve reads the stored blocks
    for target in capacity_targets(base.trace, config, (0.5, 0.9, 0.99, 1.0)):
        at = simulate(base.trace, CacheConfig(target.capacity_blocks, B, kind=kind)).num_cached_tokens
        below = simulate(
            base.trace, CacheConfig(max(target.capacity_blocks - 1, 1), B, kind=kind)
        ).num_cached_tokens
        ideal = simulate(base.trace, CacheConfig(10_000, B, kind=kind)).num_cached_tokens
        assert at == target.hit_tokens and at >= target.share * ideal - 1e-9
        assert target.capacity_blocks == 1 or below < target.share * ideal


def agent_with_timestamp(tokenizer, placement="start"):
    from kvbench.workloads.conversations import AgentConfig, generate_agent
    from kvbench.workloads.formats.kvbench_trace_reader import trace_requests

    config = AgentConfig(
        num_agents=3,
        steps="uniform:3,4",
        system_tokens=400,
        task_tokens=60,
        observation_tokens="uniform:40,80",
        final_tokens=16,
        volatile_header=placement,
    )
    return trace_requests(generate_agent(config, tokenizer), tokenizer)


def moved_by_hand(requests, tokenizer):
    """The header line cut from the system prompt and put at the end of the last message."""
    from dataclasses import replace

    from kvbench.request import Message

    moved = []
    for request in requests:
        system, *rest = request.messages
        header, body = system.content.split("\n", 1)
        last = rest[-1]
        messages = (Message("system", body), *rest[:-1], Message(last.role, f"{last.content}\n{header}"))
        moved.append(replace(request, messages=messages, token_ids=tokenizer.render_messages(messages)))
    return moved


def test_moving_the_timestamp_is_the_first_fix_and_moving_it_by_hand_gives_its_gain(tokenizer):
    requests = agent_with_timestamp(tokenizer)
    explanation, fixes = fixes_of(requests, tokenizer)
    fix = fixes[0]
    assert fix.kind == "volatile value" and fix.change.startswith(
        "move the timestamp (it differs from token "
    )
    assert fix.gain_points > 50 and fix.hit_rate_before < 0.05
    by_hand = explain_requests(moved_by_hand(requests, tokenizer), explanation.config, tokenizer).waterfall
    assert abs(by_hand.share("hit") - fix.hit_rate_after) < 0.01
    assert fix.setting["hit_rate_if_removed"] >= fix.hit_rate_after


def test_history_fixes_resend_json_reasoning_templates_and_ids(chat, tokenizer):
    call = {"name": "search_manual", "arguments": {"query": "snapshot retention", "limit": 5}}
    reordered = json.dumps(
        {"arguments": {"limit": 5, "query": "snapshot retention"}, "name": "search_manual"}
    )
    history = [("system", STABLE), ("user", "How long are snapshots kept?")]
    keys = [
        chat(0, history + [("assistant", json.dumps(call)), ("user", "And replicas?")]),
        chat(1, history + [("assistant", reordered), ("user", "And replicas?")], arrival_s=1.0),
    ]
    reply = "The logo is blue, as the brand guide says."
    thought = [
        chat(
            0,
            history
            + [
                ("assistant", "<think>The guide lists blue and white.</think>" + reply),
                ("user", "Thanks. And the font?"),
            ],
        ),
        chat(1, history + [("assistant", reply), ("user", "Thanks. And the font?")], arrival_s=1.0),
    ]
    pairs = [("system", STABLE), ("user", "Where is the billing portal?")]
    other = list(tokenizer.render_messages(chat(0, pairs[:1]).messages)[:-3]) + tokenizer.encode(
        "### User:\nWhere is the billing portal?\n### Assistant:\n"
    )
    templates = [chat(0, pairs), chat(1, pairs, token_ids=other, arrival_s=1.0)]
    sorted_first = chat(
        0, history + [("assistant", json.dumps(call, sort_keys=True)), ("user", "And replicas?")]
    )
    for kind, trace, first in (
        ("JSON key order", keys, sorted_first),
        ("reasoning stripped", thought, thought[0]),
        ("text re-rendered", templates, templates[0]),
    ):
        _, fixes = fixes_of(trace, tokenizer)
        fix = of_kind(fixes, kind)
        n = first.num_tokens  # fixed, the second request resends the first one whole: it hits all it can
        assert fix.hit_rate_after == pytest.approx((n - 1) // B * B / (2 * n)), kind
        assert fix.gain_points > 0 and fix.num_saved_tokens > 0, kind


def test_a_re_tokenized_reply_is_resent_as_its_ids(tokenizer):
    reply = "Blue is the colour of the logo"
    generated = tokenizer.encode(STABLE) + [t for ch in reply for t in tokenizer.encode(ch)]
    resent = tokenizer.encode(STABLE) + tokenizer.encode(reply + "\nAnd the font?")
    requests = [
        Request(i, f"r{i}", "s", i, np.asarray(ids, dtype=np.uint32), arrival_s=float(i), max_tokens=2)
        for i, ids in enumerate((generated, resent))
    ]
    _, fixes = fixes_of(requests, tokenizer)
    fix = of_kind(fixes, "re-tokenized")
    # r1: r0's ids, then its new text
    resent_as_ids = len(generated) + len(tokenizer.encode("\nAnd the font?"))
    assert fix.hit_rate_after == pytest.approx(len(generated) // B * B / (len(generated) + resent_as_ids))
    assert fix.gain_points > 0


def test_salt_block_size_ttl_minimum_and_last_token_fixes(chat, tokenizer):
    pairs = [("system", STABLE), ("user", "Hello?")]
    salted = [chat(0, pairs, salt="a"), chat(1, pairs, salt="b", arrival_s=1.0)]
    salt = of_kind(fixes_of(salted, tokenizer)[1], "salt")
    assert salt.hit_rate_before == 0 and salt.hit_rate_after > 0.4 and "2 salts" in salt.change
    ttl = of_kind(
        fixes_of([chat(0, pairs), chat(1, pairs, arrival_s=100.0)], tokenizer, capacity=200, ttl_s=30.0)[1],
        "ttl",
    )
    assert ttl.hit_rate_before == 0 and ttl.hit_rate_after > 0.4 and "TTL of 30 s" in ttl.change
    ids = np.asarray(tokenizer.encode(STABLE * 12), dtype=np.uint32)
    short = [Request(i, f"r{i}", f"s{i}", 0, ids[:1000], arrival_s=float(i), max_tokens=2) for i in range(2)]
    minimum = of_kind(fixes_of(short, tokenizer, minimum=1024)[1], "provider minimum")
    assert minimum.hit_rate_after == pytest.approx(999 // B * B / 2000) and "24 padding" not in minimum.cost
    assert minimum.setting["padding_tokens"] == 2 * 24
    floor = [
        Request(i, f"r{i}", f"s{i}", 0, ids[: 40 + i * 8], arrival_s=float(i), max_tokens=1) for i in range(2)
    ]
    block = of_kind(fixes_of(floor, tokenizer)[1], "block size")  # 40 shared = 2 blocks + 8 tokens
    assert block.setting["block_size"] == 4 and block.hit_rate_after > block.hit_rate_before
    capped = [Request(i, f"r{i}", f"s{i}", 0, ids[:48], arrival_s=float(i), max_tokens=1) for i in range(2)]
    last = of_kind(fixes_of(capped, tokenizer)[1], "last token")
    assert last.gain_points == 0 and last.change.startswith("none:")


def test_the_routing_fix_names_the_policy_that_hits_most_with_its_imbalance(chat, tokenizer):
    requests = round_robin(chat) + [
        Request(16 + i, f"r{16 + i}", f"u{i}", 0, p.token_ids, arrival_s=20.0 + i, max_tokens=4)
        for i, p in enumerate(round_robin(chat)[:8])
    ]
    _, fixes = fixes_of(requests, tokenizer, options=FixOptions(num_replicas=3))
    fix = of_kind(fixes, "routing")
    rates = {key: value for key, value in fix.setting.items() if key.endswith("_token_hit_rate")}
    assert (
        fix.hit_rate_after == max(rates.values()) > fix.hit_rate_before == rates["round-robin_token_hit_rate"]
    )
    assert fix.setting["policy"] in fix.change and fix.setting["requests_max_over_mean"] >= 1.0


def test_ttft_is_the_fits_estimate_and_the_bill_falls_with_the_hits(chat, tokenizer):
    fit = Fit(a_ms=100.0, b_ms=1200.0, r_squared=0.99, num_points=5)
    rules = cache_rules("openai", "gpt-5")
    _, fixes = fixes_of(round_robin(chat), tokenizer, capacity=40, options=FixOptions(fit=fit, rules=rules))
    fix = fixes[0]
    assert fix.ttft_p50_change_ms == pytest.approx(-1200.0 * (fix.hit_rate_after - fix.hit_rate_before))
    assert fix.bill_after_usd < fix.bill_before_usd
    assert "TTFT p50 ~-" in fix.line(1) and "(estimate)" in fix.line(1) and fix.line(1).startswith("1. raise")


@pytest.mark.slow
def test_on_multi_prefix_rr_the_first_fix_is_the_cache_size_and_rerunning_with_it_keeps_the_promise(kvbench):
    args = ("explain", "scenarios/multi_prefix_rr.toml", "--requests", "400", "--format", "json")
    code, out, err = kvbench(*args, "--cache-size", "512")
    assert code == 0, err
    first = json.loads(out)["fixes"][0]
    assert first["kind"] == "capacity" and first["change"].startswith(
        f"raise the cache to >= {first['setting']['cache_size']:,} blocks"
    )
    assert first["gain_points"] > 90
    code, out, err = kvbench(*args, "--cache-size", str(first["setting"]["cache_size"]))
    rerun = {row["step"]: row for row in json.loads(out)["waterfall"]}
    assert code == 0 and abs(rerun["hit"]["share"] - first["hit_rate_after"]) < 0.01
    assert json.loads(out)["fixes"] == [] or json.loads(out)["fixes"][0]["kind"] != "capacity"


def test_on_an_agent_trace_stamped_at_the_top_the_first_fix_moves_the_timestamp(kvbench, tmp_path):
    trace = tmp_path / "agent.jsonl"
    code, _, err = kvbench(*AGENT_WITH_HEADER, "-o", trace)
    assert code == 0, err
    code, out, err = kvbench("explain", trace, "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    first = document["fixes"][0]
    assert first["kind"] == "volatile value" and first["change"].startswith("move the timestamp")
    assert (
        first["gain_points"] > 50
        and first["hit_rate_before"] < 0.05
        and first["bill_after_usd"] < first["bill_before_usd"]
    )
    code, out, _ = kvbench("explain", trace)
    assert code == 0 and "\n  1. move the timestamp (it differs from token" in out


def test_the_list_drops_changes_that_gain_nothing_or_lose_but_keeps_the_unrecoverable_loss():
    def fix(kind, after):
        return Fix(kind, kind, "", 0.25, after, 0)

    ranked = rank(
        [
            fix("block size", 0.249),
            fix("salt", 0.5),
            fix("last token", 0.25),
            fix("ttl", 0.25),
            fix("capacity", 0.9),
        ]
    )
    assert [f.kind for f in ranked] == ["capacity", "salt", "last token"]


def test_a_host_tier_of_the_capacity_fix_size_recovers_the_capacity_loss_from_host_memory(chat, tokenizer):
    from kvbench.sim.tier_replay import replay_tiers
    from kvbench.sim.tiers import Tier, TierPolicy

    requests = round_robin(chat)
    explanation, fixes = fixes_of(
        requests, tokenizer, capacity=40, options=FixOptions((PRESETS["llama-3.1-8b"],))
    )
    capacity, host = of_kind(fixes, "capacity"), of_kind(fixes, "host tier")
    size = host.setting["host_tier_blocks"]
    assert size == capacity.setting["cache_size"] and host.setting["recovered_share_of_capacity_loss"] == 1.0
    assert host.change.startswith(f"keep the cache and add a host KV tier of >= {size:,} blocks (")
    assert "recovers 100% of the capacity loss" in host.change
    assert host.hit_rate_after == pytest.approx(capacity.hit_rate_after)
    # the explicit two-level replay of what each request stores, its prompt's cap: the same hits
    from dataclasses import replace

    from kvbench.sim.outputs import output_length
    from kvbench.sim.replay import prepare_prompts

    ordered = sorted(requests, key=lambda r: r.arrival_s)
    trace = prepare_prompts(ordered, B, outputs=[list(range(output_length(r))) for r in ordered])
    lookups = [replace(s, num_tokens=p.num_tokens) for p, s in zip(trace.prompts, trace.stored)]
    replayed = replay_tiers(lookups, 40, (Tier("host", size, 25e9),), TierPolicy.INCLUSIVE, B)
    assert int(replayed.hit_tokens.sum()) == host.num_saved_tokens + explanation.waterfall.tokens["hit"]
