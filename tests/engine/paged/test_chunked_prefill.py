"""Chunked prefill on the real paged engine: a prompt longer than ``max_num_batched_tokens`` is
computed over several steps and gives the copy engine's greedy output.

Before the fix a step in which no sequence finished its prefill passed an empty float
``logits_to_keep`` to transformers and failed with ``IndexError: tensors used as indices must be
long``: every prompt longer than the budget failed (found by a newcomer's trial of ``kvbench run
--max-num-batched-tokens 64``).
"""

import numpy as np
import pytest
from readiness import LIMIT_S

from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import CopyConfig, HFEngine
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.engine.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=5, ignore_eos=True)


def prompt(seed, n):
    return np.random.default_rng(seed).integers(3, 1000, n).tolist()


@pytest.mark.parametrize("budget", [16, 37])
def test_a_prompt_longer_than_the_token_budget_is_prefilled_in_chunks(loaded, budget):
    prompts = [prompt(1, 150), prompt(2, 90)]
    reference = HFEngine(loaded, CopyConfig(cache=None))
    expected = [reference.generate(p, GREEDY).output_token_ids for p in prompts]
    engine = PagedEngine(
        loaded, PagedConfig(CacheConfig(capacity_blocks=64, block_size=16), max_num_batched_tokens=budget)
    )
    futures = [engine.submit(p, GREEDY) for p in prompts]  # both at once: chunks of two sequences share steps
    records = [future.result(timeout=LIMIT_S) for future in futures]
    assert [r.output_token_ids for r in records] == expected
    assert [r.prompt_tokens for r in records] == [150, 90]
    engine.wait_idle()
    engine.check_invariants()
