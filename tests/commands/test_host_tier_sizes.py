"""``--host-tier`` sizes are checked against the flag and this machine's memory before anything is
allocated, and those the model is not needed for before it loads: one line naming the flag, exit 2.
(``1e30`` and ``1TiB`` reached the allocator after the model loaded; ``50000000`` blocks reached
3.7 GB RSS; ``²`` was a raw ``ValueError``; ``0`` and ``100KiB``, no whole block, ran without a tier.)"""

import pytest

from kvbench.errors import InputError
from kvbench.run.checks import check_host_tier_text, host_tier_blocks, memory_bytes

BLOCK_BYTES = 131_072  # the default model's 16-token block


@pytest.mark.parametrize("text", ["1e30", "²", "1TiB", "abc", "-1", "0", "1e400"])
def test_a_size_the_model_is_not_needed_for_is_refused_before_it_loads(text):
    with pytest.raises(InputError, match="^--host-tier"):
        check_host_tier_text(text)


@pytest.mark.parametrize("text", ["100KiB", "50000000", "99999999999999999999999"])
def test_no_whole_block_or_more_than_memory_is_refused_before_allocating(text):
    with pytest.raises(InputError, match="^--host-tier"):
        host_tier_blocks(text, BLOCK_BYTES)


def test_sizes_that_fit_become_blocks():
    assert host_tier_blocks("64", BLOCK_BYTES) == 64 and host_tier_blocks("4_096", BLOCK_BYTES) == 4096
    assert host_tier_blocks("1MiB", BLOCK_BYTES) == 8 and host_tier_blocks(None, BLOCK_BYTES) == 0
    assert memory_bytes() is None or memory_bytes() > 2**20


@pytest.mark.parametrize("text", ["1e30", "²", "1TiB", "abc", "-1", "0"])
def test_serve_refuses_before_loading_the_model(kvbench, text):
    code, _, stderr = kvbench("serve", "--port", "0", "--engine", "paged", f"--host-tier={text}")
    assert code == 2 and stderr.startswith("error: --host-tier"), stderr
    assert "loading the model" not in stderr and len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.parametrize("text", ["100KiB", "50000000"])
def test_serve_refuses_a_tier_of_no_block_or_beyond_memory_before_allocating(kvbench, text):
    code, _, stderr = kvbench("serve", "--port", "0", "--engine", "paged", f"--host-tier={text}")
    assert code == 2 and "error: --host-tier" in stderr, stderr
