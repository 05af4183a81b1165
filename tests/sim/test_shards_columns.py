"""The sampled curve's column path (keys mixed and sampled in numpy) against the line reader (per key
in Python): the same sampling hashes and the same curve, at block sizes equal to, a multiple of and a
divisor of the trace's 512-token blocks; and a file out of arrival order still names its line."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from mixed_trace import write_shape  # noqa: E402

from kvbench.errors import InputError  # noqa: E402
from kvbench.sim.hash_id_trace import _line_sampled_curve, hash_id_sampled_curve  # noqa: E402
from kvbench.sim.shards import ShardsPass, key_hash  # noqa: E402
from kvbench.sim.shards_columns import sampling_hashes  # noqa: E402
from kvbench.workloads.formats.hash_id_columns import hash_id_columns  # noqa: E402
from kvbench.workloads.formats.hash_id_keys import ChainKeys, keyed_lines  # noqa: E402
from kvbench.workloads.formats.hash_ids import HASH_ID_FORMATS  # noqa: E402
from kvbench.workloads.formats.jsonl import open_jsonl  # noqa: E402


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("columns") / "zipf500.jsonl"
    write_shape("zipf500", 3000, 1, path)
    return path


@pytest.mark.parametrize("block_size", [512, 256, 1024])
def test_the_same_hashes_as_the_line_reader(trace, block_size):
    time_format = HASH_ID_FORMATS["mooncake"]
    columns = hash_id_columns(trace, time_format)
    hashes, offsets = sampling_hashes(
        columns.hash_ids, columns.offsets, columns.input_lengths, block_size, time_format.block_tokens
    )
    keys = ChainKeys(block_size, time_format.block_tokens, interned=False)
    with open_jsonl(trace) as file:
        want = [
            key_hash(k) for item in keyed_lines(file, time_format, keys) for k in item.prompt.block_hashes
        ]
    assert hashes.tolist() == want and offsets[-1] == len(want)


@pytest.mark.parametrize("block_size", [512, 256, 1024])
def test_the_same_curve_as_the_line_reader(trace, block_size):
    fast = hash_id_sampled_curve(trace, "mooncake", ShardsPass(block_size, max_keys=512))
    slow = _line_sampled_curve(trace, "mooncake", ShardsPass(block_size, max_keys=512))
    assert fast.rate == slow.rate < 0.5 and fast.num_requests == slow.num_requests == 3000
    assert np.array_equal(fast.hit_blocks_at_edges, slow.hit_blocks_at_edges)
    assert np.array_equal(fast.grid_variance_blocks, slow.grid_variance_blocks)


def test_a_line_out_of_order_is_named(tmp_path):
    path = tmp_path / "late.jsonl"
    path.write_text(
        '{"timestamp": 5, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}\n'
        '{"timestamp": 3, "input_length": 1024, "output_length": 1, "hash_ids": [1, 3]}\n'
    )
    with pytest.raises(InputError, match=r"late.jsonl:2: field .timestamp.: earlier than the line before"):
        hash_id_sampled_curve(path, "mooncake", ShardsPass(512))
