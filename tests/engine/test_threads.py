"""``--threads``: torch's intra-op thread count for a block, restored afterwards."""

import pytest
import torch

from kvbench.engine.threads import torch_threads
from kvbench.errors import InputError


def test_threads_are_set_for_the_block_and_restored():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


@pytest.mark.parametrize("bad", [0, -2])
def test_a_non_positive_thread_count_is_one_clear_error(bad):
    with pytest.raises(InputError, match=f"--threads: {bad} is not a positive number of threads"):
        with torch_threads(bad):
            pass


@pytest.mark.parametrize(
    "command", [["serve"], ["sweep", "scenarios/multi_prefix_zipf.toml", "--cache-sizes", "64"]]
)
def test_serve_and_sweep_refuse_zero_threads_before_any_work(kvbench, command):
    code, _, stderr = kvbench(*command, "--threads", "0")
    assert code == 2 and "Traceback" not in stderr
    assert "--threads: 0 is not a positive number of threads" in stderr
