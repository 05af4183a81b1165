"""The sampled (SHARDS) curve: exact at rate 1, close on a trace with many keys, and why it is not
on traces whose hits sit on a few hot keys."""

import numpy as np
import pytest

from kvbench.sim.curve import hit_curve
from kvbench.sim.replay import prepare_prompts
from kvbench.sim.shards import sampled_curve
from kvbench.workloads.token_ids import MultiPrefixConfig, multi_prefix_requests


@pytest.fixture(scope="module")
def many_prefixes():
    config = MultiPrefixConfig(num_prefixes=300, prefix_tokens=256, unique_tokens=20, num_requests=3000,
                               zipf_exponent=0.6, seed=1)
    return prepare_prompts(multi_prefix_requests(config), block_size=16)


def test_rate_one_is_the_exact_curve(many_prefixes):
    exact = hit_curve(many_prefixes)
    sizes = exact.change_points()[::37]
    estimate = sampled_curve(many_prefixes, 1.0).hit_blocks(sizes)
    assert estimate.tolist() == [r.num_hit_blocks for r in exact.results(sizes)]


def errors(trace, rate):
    exact = hit_curve(trace)
    sizes = np.unique(np.geomspace(1, 2 * exact.ideal_capacity_blocks, 120).astype(np.int64))
    return np.abs(sampled_curve(trace, rate).token_hit_rates(sizes) - np.array([r.token_hit_rate for r in exact.results(sizes)]))


def test_the_documented_error_on_a_known_trace(many_prefixes):
    """300 Zipf prefixes of 16 blocks: the hits sit on a few thousand keys, so a sample of 30% is
    within 0.03 at every size (measured 0.024) and one of 10% is not (measured 0.119): the error is
    the sampling variance of the hottest prefixes' few keys (module docstring)."""
    assert errors(many_prefixes, 0.3).max() < 0.03
    assert errors(many_prefixes, 0.1).max() > 0.05


def test_the_rate_is_checked(many_prefixes):
    with pytest.raises(ValueError, match="rate"):
        sampled_curve(many_prefixes, 0.0)
