"""Chat and agent traces: replay histories, and the token-level prefix property after rendering."""

from collections import defaultdict

import pytest

from kvbench.sim.replay import ideal_hit_rate, prepare_prompts
from kvbench.workloads.conversations import AgentConfig, ChatConfig
from kvbench.workloads.formats.kvbench_trace_reader import trace_requests
from kvbench.workloads.kinds import generate_trace
from kvbench.workloads.tokenizer import render

CHAT = ChatConfig(num_conversations=6, turns="uniform:2,6", system_tokens=120, conversation_rate_per_s=2.0)
AGENT = AgentConfig(
    num_agents=4,
    steps="uniform:3,6",
    system_tokens=600,
    num_system_prompts=2,
    task_tokens=60,
    observation_tokens="lognormal:120,0.5",
    agent_rate_per_s=1.0,
)


def sessions(trace):
    by_session = defaultdict(list)
    for index, request in enumerate(trace.requests):
        by_session[request.session_id].append(index)
    return by_session


@pytest.mark.parametrize("kind, config", [("chat", CHAT), ("agent", AGENT)])
def test_each_turn_starts_with_every_token_of_the_previous_turn(tokenizer, kind, config):
    trace = generate_trace(kind, config, tokenizer)
    token_ids = [render(tokenizer, r) for r in trace.requests]
    for indices in sessions(trace).values():
        assert [trace.requests[i].turn for i in indices] == list(range(len(indices)))
        for earlier, later in zip(indices, indices[1:]):
            previous = token_ids[earlier]
            assert token_ids[later].shape[0] > previous.shape[0]
            assert token_ids[later][: previous.shape[0]].tolist() == previous.tolist()


@pytest.mark.parametrize("kind, config", [("chat", CHAT), ("agent", AGENT)])
@pytest.mark.parametrize("block_size", [16, 64])
def test_an_unbounded_cache_hits_all_full_blocks_of_the_previous_turn(tokenizer, kind, config, block_size):
    trace = generate_trace(kind, config, tokenizer)
    cached = ideal_hit_rate(
        prepare_prompts(trace_requests(trace, tokenizer), block_size)
    ).cached_tokens_per_request
    for indices in sessions(trace).values():
        for earlier, later in zip(indices, indices[1:]):
            length = trace.requests[earlier].expected_prompt_tokens
            assert cached[later] >= length // block_size * block_size


def test_chat_replays_its_own_replies_and_budgets_them(tokenizer):
    trace = generate_trace("chat", CHAT, tokenizer)
    for indices in sessions(trace).values():
        for earlier, later in zip(indices, indices[1:]):
            before, after = trace.requests[earlier], trace.requests[later]
            reply = after.messages[len(before.messages)]
            assert reply.role == "assistant"
            assert len(tokenizer.encode(reply.content)) == before.max_tokens
            assert after.messages[: len(before.messages)] == before.messages
    system = {r.messages[0] for r in trace.requests}
    assert len(system) == 1 and len(tokenizer.encode(next(iter(system)).content)) == 120
    roles = [m.role for m in trace.requests[-1].messages]
    assert roles[0] == "system" and roles[-1] == "user"
    assert all(a != b for a, b in zip(roles[1:], roles[2:]))  # user and assistant alternate


def test_chat_conversations_interleave_in_arrival_order(tokenizer):
    trace = generate_trace("chat", CHAT, tokenizer)
    order = [r.session_id for r in trace.requests]
    switches = sum(a != b for a, b in zip(order, order[1:]))
    assert switches > len(sessions(trace))  # not one conversation after the other


def test_agent_steps_carry_calls_and_observations(tokenizer):
    trace = generate_trace("agent", AGENT, tokenizer)
    for indices in sessions(trace).values():
        steps = [trace.requests[i] for i in indices]
        assert all(len(s.messages) == 2 + 2 * s.turn for s in steps)
        assert len(tokenizer.encode(steps[0].messages[0].content)) == 600
        assert len(tokenizer.encode(steps[0].messages[1].content)) == 60
        for step, following in zip(steps, steps[1:]):
            call, observation = following.messages[-2:]
            assert call.role == "assistant" and call.content.startswith('{"tool": ')
            assert len(tokenizer.encode(call.content)) == step.max_tokens
            assert observation.role == "user" and observation.content.startswith(
                f"Observation {step.turn + 1} from "
            )
        assert steps[-1].max_tokens == AGENT.final_tokens
    systems = {r.messages[0].content for r in trace.requests}
    assert len(systems) == 2  # num_system_prompts


def test_a_volatile_header_breaks_the_agent_prefix(tokenizer):
    config = AgentConfig(**{**vars(AGENT), "volatile_header": "start"})
    trace = generate_trace("agent", config, tokenizer)
    rate = ideal_hit_rate(prepare_prompts(trace_requests(trace, tokenizer), 16)).token_hit_rate
    assert rate == 0.0
