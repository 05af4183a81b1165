"""Single-turn text generators: determinism, exact token counts, volatile headers, mixing, tenants."""

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from chatml_text import chatml_text

from kvbench.run.scenario import load_scenario
from kvbench.sim.replay import ideal_hit_rate, prepare_prompts
from kvbench.workloads.conversations import AgentConfig, ChatConfig
from kvbench.workloads.formats.kvbench_trace import write_trace
from kvbench.workloads.formats.kvbench_trace_reader import trace_requests
from kvbench.workloads.generators import (
    ONE_OFF_MAX_TOKENS,
    MultiPrefixTextConfig,
    OneOffConfig,
    SharedPrefixConfig,
    volatile_header_line,
)
from kvbench.workloads.kinds import generate_trace

REPO = Path(__file__).resolve().parents[2]

SMALL = {
    "shared-prefix": SharedPrefixConfig(num_requests=20, system_tokens=300, question_tokens=40),
    "multi-prefix-text": MultiPrefixTextConfig(
        num_prefixes=3, prefix_tokens=200, unique_tokens=30, num_requests=30
    ),
    "one-off": OneOffConfig(num_requests=10, prompt_tokens="uniform:20,200"),
    "chat": ChatConfig(num_conversations=5, turns="uniform:2,5", system_tokens=100),
    "agent": AgentConfig(
        num_agents=3, steps="uniform:2,5", system_tokens=400, observation_tokens="lognormal:80,0.5"
    ),
}


def full_count(tokenizer, request):
    """Tokens of the rendered prompt, encoded in one call (no per-message cache involved)."""
    return len(tokenizer.encode(chatml_text(request)))


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_same_seed_same_bytes_other_seed_other_bytes(tokenizer, tmp_path, kind):
    config = SMALL[kind]
    first = write_trace(generate_trace(kind, config, tokenizer), tmp_path / "a.jsonl").read_bytes()
    second = write_trace(generate_trace(kind, config, tokenizer), tmp_path / "b.jsonl").read_bytes()
    other = type(config)(**{**vars(config), "seed": 1})
    third = write_trace(generate_trace(kind, other, tokenizer), tmp_path / "c.jsonl").read_bytes()
    assert first == second
    assert first != third


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_expected_prompt_tokens_equal_the_rendered_count(tokenizer, kind):
    trace = generate_trace(kind, SMALL[kind], tokenizer)
    assert trace.header.generator == kind and trace.header.tokenizer == tokenizer.name
    for request in trace.requests:
        assert request.expected_prompt_tokens == full_count(tokenizer, request)
    arrivals = [r.arrival_ms for r in trace.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert len({r.id for r in trace.requests}) == len(trace.requests)
    token_requests = trace_requests(trace, tokenizer)
    assert [t.num_tokens for t in token_requests] == [r.expected_prompt_tokens for r in trace.requests]


def test_shared_2k_scenario_has_an_exact_2000_token_system_prompt(tokenizer):
    scenario = load_scenario(REPO / "scenarios" / "shared_2k.toml")
    trace = scenario.workload_requests(tokenizer).trace
    assert len(trace.requests) == 2000
    system = trace.requests[0].messages[0].content
    assert len(tokenizer.encode(system)) == 2000
    for request in trace.requests:
        assert request.messages[0].content == system
        assert len(tokenizer.encode(request.messages[1].content)) == 50
        assert request.expected_prompt_tokens == 2063  # 3 + 2000 + 2 + 3 + 50 + 2 + 3 (ChatML)
    assert len({r.messages[1].content for r in trace.requests}) == 2000
    assert full_count(tokenizer, trace.requests[-1]) == 2063
    token_requests = trace_requests(trace, tokenizer)
    assert ideal_hit_rate(prepare_prompts(token_requests, 16)).token_hit_rate == pytest.approx(
        1999 * 2000 / (2000 * 2063)
    )


def two_shared_requests(tokenizer, placement):
    config = SharedPrefixConfig(num_requests=2, volatile_header=placement)
    token_requests = trace_requests(generate_trace("shared-prefix", config, tokenizer), tokenizer)
    return ideal_hit_rate(prepare_prompts(token_requests, 16)).token_hit_rate


def test_volatile_header_first_kills_every_hit_and_last_keeps_them(tokenizer):
    plain = two_shared_requests(tokenizer, "none")
    assert plain == pytest.approx(2000 / (2 * 2063))
    assert two_shared_requests(tokenizer, "start") == 0.0
    assert two_shared_requests(tokenizer, "end") >= 0.95 * plain


def test_volatile_header_text_is_per_request(tokenizer):
    trace = generate_trace(
        "shared-prefix", SharedPrefixConfig(num_requests=3, volatile_header="start"), tokenizer
    )
    systems = [r.messages[0].content for r in trace.requests]
    assert systems[1].startswith(volatile_header_line(trace.requests[1].arrival_ms))
    assert systems[0].startswith("Current time: 1735689600.000000\n")  # 2025-01-01T00:00:00Z
    assert len(set(systems)) == 3
    body = systems[0].split("\n", 1)[1]
    assert len(tokenizer.encode(body)) == 2000  # the header's 12 tokens come on top
    assert len(tokenizer.encode(volatile_header_line(123456.789))) == 12


def test_multi_prefix_text_round_robin_and_zipf(tokenizer):
    config = MultiPrefixTextConfig(
        num_prefixes=4, prefix_tokens=150, unique_tokens=20, num_requests=12, popularity="rr"
    )
    trace = generate_trace("multi-prefix-text", config, tokenizer)
    by_arrival = [r.messages[0].content for r in trace.requests]
    assert by_arrival[:4] == by_arrival[4:8] == by_arrival[8:] and len(set(by_arrival)) == 4
    assert all(len(tokenizer.encode(s)) == 150 for s in set(by_arrival))
    zipf = MultiPrefixTextConfig(
        num_prefixes=4, prefix_tokens=150, unique_tokens=20, num_requests=400, zipf_exponent=1.2
    )
    counts = Counter(
        r.messages[0].content for r in generate_trace("multi-prefix-text", zipf, tokenizer).requests
    )
    assert sorted(counts.values(), reverse=True)[0] > 2 * sorted(counts.values())[0]


def test_one_offs_mix_in_at_the_ratio_and_never_share_a_block(tokenizer):
    config = SharedPrefixConfig(num_requests=40, system_tokens=200, one_off_ratio=0.2, one_off_tokens=100)
    trace = generate_trace("shared-prefix", config, tokenizer)
    one_offs = [i for i, r in enumerate(trace.requests) if r.session_id.startswith("one-off")]
    assert len(trace.requests) == 50 and len(one_offs) == 10
    assert all(trace.requests[i].max_tokens == ONE_OFF_MAX_TOKENS for i in one_offs)
    cached = ideal_hit_rate(prepare_prompts(trace_requests(trace, tokenizer), 16)).cached_tokens_per_request
    assert all(cached[i] == 0 for i in one_offs)
    plain = generate_trace("shared-prefix", SharedPrefixConfig(num_requests=40, system_tokens=200), tokenizer)
    main = [r for r in trace.requests if not r.session_id.startswith("one-off")]
    assert [r.messages for r in main] == [r.messages for r in plain.requests]  # mixing leaves the rest alone


def test_one_off_trace_never_repeats(tokenizer):
    trace = generate_trace("one-off", OneOffConfig(num_requests=30, prompt_tokens=64), tokenizer)
    token_requests = trace_requests(trace, tokenizer)
    assert ideal_hit_rate(prepare_prompts(token_requests, 16)).num_cached_tokens == 0


def test_tenants_salt_sessions_round_robin(tokenizer):
    config = SharedPrefixConfig(num_requests=6, system_tokens=100, num_tenants=2)
    trace = generate_trace("shared-prefix", config, tokenizer)
    salts = {r.session_id: r.salt for r in trace.requests}
    assert salts["req-000000"] == salts["req-000002"] == "tenant-0" and salts["req-000001"] == "tenant-1"
    token_requests = trace_requests(trace, tokenizer)
    assert {t.salt for t in token_requests} == {"tenant-0", "tenant-1"}


@pytest.mark.parametrize(
    "config_class, fields, name",
    [
        (SharedPrefixConfig, {"num_requests": 0}, "num_requests"),
        (SharedPrefixConfig, {"question_tokens": 5}, "question_tokens"),
        (SharedPrefixConfig, {"one_off_ratio": 1.0}, "one_off_ratio"),
        (SharedPrefixConfig, {"volatile_header": "middle"}, "middle"),
        (MultiPrefixTextConfig, {"popularity": "random"}, "random"),
        (ChatConfig, {"turns": "uniform:3,1"}, "uniform"),
        (AgentConfig, {"step_time_s": 0}, "step_time_s"),
    ],
)
def test_bad_parameters_name_the_field(config_class, fields, name):
    with pytest.raises(ValueError, match=name):
        config_class(**fields)


def test_generation_of_2000_requests_takes_seconds(tokenizer):
    import time

    started = time.perf_counter()
    trace = generate_trace("multi-prefix-text", MultiPrefixTextConfig(), tokenizer)
    assert len(trace.requests) == 2000
    assert time.perf_counter() - started < 10
    assert np.mean([r.expected_prompt_tokens for r in trace.requests]) == 2048 + 50 + 13
