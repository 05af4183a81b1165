"""Sampled curves on traces whose distinct first blocks outnumber the key budget: the
first blocks have their own threshold and at most half the budget, so the other keys' rate does not
collapse (it fell to ~1e-10), and the printed sd covers the real error against the exact curve."""

import numpy as np
import pytest
from big_traces import big_trace_file

from kvbench.sim.curve import hit_curve
from kvbench.sim.hash_id_trace import hash_id_sampled_curve, hash_id_trace
from kvbench.sim.shards import ShardsPass


def sampled_and_exact(path, max_keys):
    shards = ShardsPass(512, max_keys=max_keys)
    curve = hash_id_sampled_curve(path, "mooncake", shards)
    exact = hit_curve(hash_id_trace(path, "mooncake", 512))
    sizes = np.unique(np.geomspace(1 / curve.rate, 2 * exact.ideal_capacity_blocks, 40).astype(np.int64))
    error = np.abs(curve.token_hit_rates(sizes) - np.array([r.token_hit_rate for r in exact.results(sizes)]))
    return shards, curve, exact, error


def test_first_blocks_beyond_the_budget_leave_the_rate_alone(tmp_path):
    """3,000 requests, ~600 distinct first blocks, 256 keys: the first blocks are cut to half the
    budget by their own threshold; the others keep the rest at a rate ~ 128 / their distinct count
    (it was 1.1e-10 with 1e-10-sized estimates), and the error stays within 2 sd of the estimate."""
    path = big_trace_file(tmp_path, 3_000, seed=0)
    shards, curve, exact, error = sampled_and_exact(path, 256)
    plain_rate, first_rate = shards.rates()
    num_distinct = exact.distances.num_distinct_blocks
    assert 0.5 * 128 / num_distinct < plain_rate < 2 * 128 / num_distinct
    assert 0.1 < first_rate < 0.5  # ~128 of the ~600 first blocks
    assert error.max() <= 2 * curve.hit_rate_sd
    num_first = sum(entry[1] for entry in shards._held.values())
    assert num_first == 128 and len(shards._held) == 256 == curve.max_keys_kept  # half for first blocks


@pytest.mark.slow
def test_the_issue_shape_within_two_sd_on_most_seeds(tmp_path):
    """The one-off-heavy trace shape at 8,000 requests (~1,100 distinct first blocks: more than the 1,024
    keys), five seeds: the largest error over the sizes >= 1 / rate is within 2 sd on at least four
    (measured at 20,000 requests and 1,024 / 4,096 keys: 16 of 16; at 4,000 requests and 1,024
    keys: 12 of 12, 11 without the variance terms of dropped keys); before, the rate fell to ~1e-10."""
    within, worst = 0, 0.0
    for seed in range(5):
        shards, curve, _, error = sampled_and_exact(big_trace_file(tmp_path, 8_000, seed=seed), 1024)
        assert shards.rates()[0] > 1e-3
        within += int(error.max() <= 2 * curve.hit_rate_sd)
        worst = max(worst, float(error.max()))
    assert within >= 4 and worst < 0.3


def test_the_command_prints_and_records_both_rates(tmp_path, kvbench):
    """``kvbench sim --sample-keys``: the caption names the first blocks' own rate, and the curve
    file records it (``first_block_sample_rate``) beside ``sample_rate``."""
    from kvbench.results.parquet import read_metadata

    path = big_trace_file(tmp_path, 3_000, seed=0)
    code, out, err = kvbench(
        "sim", path, "--sample-keys", "256", "--sizes", "1000", "--out", tmp_path / "s.parquet"
    )
    assert code == 0, err
    metadata = read_metadata(tmp_path / "s.sampled-curve.parquet")
    assert 0.1 < metadata["first_block_sample_rate"] < 0.5 and 1e-3 < metadata["sample_rate"] < 0.05
    assert f"(first blocks {metadata['first_block_sample_rate']:.4g})" in " ".join(out.split())
