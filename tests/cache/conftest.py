import pytest

from kvbench.cache.base import CacheConfig, make_cache
from kvbench.cache.block_hash import BlockHasher
from kvbench.cache.pool_cache import PoolPrefixCache


class FakeClock:
    """A settable clock (seconds) for TTL tests."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture(params=["hash", "radix", "pool", "pool-radix"])
def cache_kind(request):
    return request.param


@pytest.fixture
def build(cache_kind):
    """build(capacity_blocks, block_size=4, **config) -> (cache, hasher, clock). ``pool`` is the paged
    engine's cache: :class:`PoolPrefixCache` over one block pool, hash keys (``pool``) or radix keys
    (``pool-radix``: parent block + token bytes)."""

    def make(capacity_blocks, block_size=4, **config):
        clock = FakeClock()
        pool = cache_kind.startswith("pool")
        kind = {"pool": "hash", "pool-radix": "radix"}.get(cache_kind, cache_kind)
        config = CacheConfig(capacity_blocks=capacity_blocks, block_size=block_size, kind=kind, **config)
        cache = PoolPrefixCache(config, clock=clock) if pool else make_cache(config, clock=clock)
        return cache, BlockHasher(block_size), clock

    return make
