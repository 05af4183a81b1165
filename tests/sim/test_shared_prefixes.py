"""Keys reused from shared prefixes equal the keys hashed from scratch, prompt by prompt."""

import numpy as np
import pytest
from curve_traces import BLOCK, traces
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_workloads import numbered_requests

from kvbench.cache.block_hash import BlockHasher, HashConfig
from kvbench.request import Request
from kvbench.sim.shared_prefixes import hash_prompts, shared_full_blocks


def fields(prompts):
    """PromptBlocks compare by identity: compare what they hold."""
    return [(p.num_tokens, p.block_size, p.block_hashes, p.block_tokens, p.namespace) for p in prompts]


def from_scratch(requests, config, keep_tokens):
    hasher = BlockHasher(BLOCK, config)
    return fields(
        [hasher.prompt_blocks(r.token_ids, salt=r.salt or "", keep_tokens=keep_tokens) for r in requests]
    )


@settings(max_examples=80, deadline=None)
@given(
    traces(),
    st.booleans(),
    st.sampled_from([HashConfig(), HashConfig(algo="xxhash"), HashConfig(hash_bits=8)]),
    st.integers(1, 4),
)
def test_reused_keys_equal_keys_hashed_from_scratch(requests, keep_tokens, config, max_remembered):
    assert fields(hash_prompts(requests, BLOCK, config, keep_tokens, max_remembered)) == from_scratch(
        requests, config, keep_tokens
    )


def test_the_shared_prefix_is_not_hashed_again():
    """Two 10-block prompts sharing 7 full blocks (and 2 tokens more): the second hashes 3 blocks."""
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 1000, size=7 * BLOCK + 2)
    requests = numbered_requests(
        np.concatenate([shared, rng.integers(1000, 2000, size=3 * BLOCK - 2)]) for _ in range(2)
    )
    hashed = []

    class Counting(BlockHasher):
        def hash_token_bytes(self, token_bytes, *args, **kwargs):
            keys = super().hash_token_bytes(token_bytes, *args, **kwargs)
            hashed.append(len(keys))
            return keys

    import kvbench.sim.shared_prefixes as module

    original, module.BlockHasher = module.BlockHasher, Counting
    try:
        prompts = hash_prompts(requests, BLOCK)
    finally:
        module.BlockHasher = original
    assert hashed == [10, 3]
    assert fields(prompts) == from_scratch(requests, HashConfig(), False)


@pytest.mark.parametrize(
    "a,b,expected",
    [
        ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], 2),
        ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 9], 1),
        ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7], 1),
        ([1, 2, 3, 4], [2, 2, 3, 4], 0),
        ([1, 2, 3], [1, 2, 3], 0),
    ],
)
def test_shared_full_blocks(a, b, expected):
    assert shared_full_blocks(np.array(a, dtype=np.uint32), np.array(b, dtype=np.uint32), BLOCK) == expected


def test_batches_and_keyless_prompts_give_the_keys_of_one_prompt_at_a_time(monkeypatch):
    """Batches of a few tokens (every seam crossed) and many prompts under one block (shared objects)
    give each request the keys and bytes hashed from scratch; a bad id still raises."""
    import kvbench.sim.shared_prefixes as module

    rng = np.random.default_rng(1)
    lengths = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK, 2, 2, BLOCK - 1, 5 * BLOCK + 3]
    requests = numbered_requests(
        (rng.integers(0, 50, size=n) for n in lengths * 3), salt=lambda i: [None, "a"][i % 2]
    )
    for batch_tokens in (1, 7, module.BATCH_TOKENS):
        monkeypatch.setattr(module, "BATCH_TOKENS", batch_tokens)
        for keep_tokens in (False, True):
            prompts = hash_prompts(requests, BLOCK, HashConfig(), keep_tokens)
            assert fields(prompts) == from_scratch(requests, HashConfig(), keep_tokens)
    assert prompts[6] is prompts[26] and prompts[6] is not prompts[7]  # 2 tokens: one object per salt
    bad = [
        *requests[:3],
        Request(index=3, request_id="x", session_id="s", turn=0, token_ids=np.array([1, -1])),
    ]
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 2\*\*32\)"):
        hash_prompts(bad, BLOCK)
