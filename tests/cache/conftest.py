import pytest

from kvbench.cache.block_hash import BlockHasher
from kvbench.cache.base import CacheConfig, make_cache


class FakeClock:
    """A settable clock (seconds) for TTL tests."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture(params=["hash", "radix"])
def cache_kind(request):
    return request.param


@pytest.fixture
def build(cache_kind):
    """build(capacity_blocks, block_size=4, **config) -> (cache, hasher, clock)."""

    def make(capacity_blocks, block_size=4, **config):
        clock = FakeClock()
        cache = make_cache(CacheConfig(capacity_blocks=capacity_blocks, block_size=block_size,
                                       kind=cache_kind, **config), clock=clock)
        return cache, BlockHasher(block_size), clock

    return make
