"""The sampled curve against the exact one on three trace shapes of ``benchmarks/mixed_trace.py``
(Zipf conversations, many one-offs, long chats), six seeds each, small enough to run in seconds: the
mean signed error over the seeds stays under half the printed sd (no bias the sd hides). The 10-seed
study at scale is ``benchmarks/shards_calibration.py`` (docs/measured-results.md)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from mixed_trace import write_shape  # noqa: E402

from kvbench.sim.hash_id_trace import hash_id_sampled_curve  # noqa: E402
from kvbench.sim.shards import ShardsPass  # noqa: E402
from kvbench.sim.streamed_curve import streamed_hit_curve  # noqa: E402


def signed_error(path, max_keys):
    """Mean signed error over 20 log-spaced sizes from 1 / R to the ideal, and the printed sd."""
    exact = streamed_hit_curve(path, "mooncake", 512)
    sampled = hash_id_sampled_curve(path, "mooncake", ShardsPass(512, max_keys=max_keys))
    sizes = np.unique(
        np.geomspace(max(1 / sampled.rate, 1), exact.ideal_capacity_blocks, 20).astype(np.int64)
    )
    truth = exact.totals(sizes)["num_hit_blocks"] * 512 / exact.num_prompt_tokens
    return float(np.mean(sampled.token_hit_rates(sizes) - truth)), sampled.hit_rate_sd


@pytest.mark.parametrize("shape", ["zipf500", "one_offs", "long_chats"])
def test_no_bias_beyond_half_the_printed_sd(tmp_path, shape):
    errors, sds = [], []
    for seed in range(6):
        path = tmp_path / f"{shape}-{seed}.jsonl"
        write_shape(shape, 3_000, seed, path)
        error, sd = signed_error(path, 256)
        errors.append(error)
        sds.append(sd)
    assert abs(np.mean(errors)) < 0.5 * np.mean(sds)
    assert max(abs(e) for e in errors) < 3 * np.mean(sds)  # no seed far outside
