"""Generated blocks in the cache-only replay and the predictor (kvbench/sim/outputs.py).

The B06 case (block size 4): round 1 sends an 8-token prompt and generates 5 tokens; round 2 resends
prompt + those 5 + 4 new. KV exists for 8 + 5 - 1 = 12 tokens (the last sampled token was never fed
forward), so 3 full blocks are cached and round 2 hits 12 tokens; prompt-only caching gives 8.
"""

import numpy as np
import pytest

from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.request import Request, RequestRecord, Status
from kvbench.sim.outputs import (
    PLACEHOLDER_BASE,
    known_outputs,
    placeholder_outputs,
    record_outputs,
    stored_blocks_of,
    trace_outputs,
)
from kvbench.sim.predict import Unbounded, expected_cached_tokens
from kvbench.sim.replay import replay
from kvbench.sim.vllm_pool import VllmPoolConfig

B = 4
PROMPT = list(range(100, 108))  # two full blocks
OUTPUT = [500, 501, 502, 503, 504]  # five generated tokens
NEW = [600, 601, 602, 603]


def b06(output_tokens=5):
    first = Request(
        0, "r0", "chat", 0, np.asarray(PROMPT, dtype=np.uint32), max_tokens=5, output_tokens=output_tokens
    )
    second = Request(
        1,
        "r1",
        "chat",
        1,
        np.asarray(PROMPT + OUTPUT + NEW, dtype=np.uint32),
        max_tokens=5,
        output_tokens=output_tokens,
    )
    return [first, second]


@pytest.mark.parametrize("kind", list(CacheKind))
def test_b06_generated_blocks_hit_12_tokens_prompt_only_8(kind):
    requests, outputs = b06(), [OUTPUT, None]
    config = CacheConfig(capacity_blocks=64, block_size=B, kind=kind)
    assert expected_cached_tokens(requests, config, outputs) == [0, 12]
    assert replay(requests, config, outputs).cached_tokens_per_request.tolist() == [0, 12]
    assert expected_cached_tokens(requests, Unbounded(B, kind=kind), outputs) == [0, 12]
    prompt_only = CacheConfig(capacity_blocks=64, block_size=B, kind=kind, prompt_only=True)
    assert expected_cached_tokens(requests, prompt_only, outputs) == [0, 8]
    assert replay(requests, prompt_only, outputs).cached_tokens_per_request.tolist() == [0, 8]
    # the vLLM-faithful pool agrees, given the same output ids (without them, output blocks never hit)
    pool = VllmPoolConfig(num_gpu_blocks=16, block_size=B)
    assert expected_cached_tokens(requests, pool, outputs) == [0, 12]
    assert expected_cached_tokens(requests, pool) == [0, 8]


def test_the_trace_reply_is_the_output_a_replay_assumes():
    requests = b06()
    derived = trace_outputs(requests)
    assert derived[0].tolist() == OUTPUT and derived[1] is None  # round 2 has no next turn
    config = CacheConfig(capacity_blocks=64, block_size=B)
    assert expected_cached_tokens(requests, config, derived) == [0, 12]
    # a next turn that does not extend the prompt gives nothing
    other = [requests[0], Request(1, "r1", "chat", 1, np.asarray([1] * 20, dtype=np.uint32))]
    assert trace_outputs(other) == [None, None]


def test_placeholders_take_room_but_never_hit():
    requests = b06()
    placeholders = placeholder_outputs(requests)
    assert [len(p) for p in placeholders] == [5, 5] and all(
        int(p.min()) >= PLACEHOLDER_BASE for p in placeholders
    )
    # a function of the prompt
    assert placeholder_outputs(requests[:1])[0].tolist() == placeholders[0].tolist()
    assert expected_cached_tokens(requests, CacheConfig(capacity_blocks=64, block_size=B)) == [0, 8]
    # they take room: two 8-token prompts of 5 outputs store 3 blocks each; in a 4-block cache the
    # second evicts the first's tail (its placeholder block, then prompt block 1), so a resend hits 4, not 8
    again = [
        b06()[0],
        Request(1, "r1", "other", 0, np.arange(300, 308, dtype=np.uint32), max_tokens=5),
        Request(2, "r2", "chat", 1, np.asarray(PROMPT + [7], dtype=np.uint32), max_tokens=5),
    ]
    assert expected_cached_tokens(again, CacheConfig(capacity_blocks=4, block_size=B)) == [0, 0, 4]
    assert expected_cached_tokens(again, CacheConfig(capacity_blocks=4, block_size=B, prompt_only=True)) == [
        0,
        0,
        8,
    ]
    stored = stored_blocks_of(requests, placeholders, B)
    assert [s.num_full_blocks for s in stored] == [3, 5]
    assert stored[0].block_hashes[:2] == stored[1].block_hashes[:2]  # the prompt's keys are a prefix


def test_known_outputs_fill_only_the_unknown_and_check_lengths():
    requests = b06()
    filled = known_outputs(requests, [OUTPUT, None])
    assert list(filled[0]) == OUTPUT and int(filled[1][0]) >= PLACEHOLDER_BASE
    with pytest.raises(ValueError, match="2 requests"):
        known_outputs(requests, [OUTPUT])
    records = [
        RequestRecord(status=Status.OK, prompt_tokens=8, output_token_ids=tuple(OUTPUT)),
        RequestRecord.failed(8, "boom"),
    ]
    assert [None if r is None else r.tolist() for r in record_outputs(records)] == [OUTPUT, None]
