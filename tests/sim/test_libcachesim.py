"""Cross-check with libCacheSim (an independent cache simulator, ``pip install libcachesim``;
skipped where it is not installed): its LRU and kvbench's one-pass stack distances give the same hit
count at every size on the same block-access sequence."""

import numpy as np
import pytest
from big_traces import BigTraceConfig, generate

from kvbench.sim.compact_distances import compact_distances
from kvbench.sim.stack_distance import distances_of

libcachesim = pytest.importorskip("libcachesim")


def block_accesses(num_requests: int) -> np.ndarray:
    """A big_trace.py trace's block ids in the order kvbench's cache touches them (each prompt's
    blocks tail first, as its release puts them on the LRU queue)."""
    trace = generate(BigTraceConfig(num_requests=num_requests, seed=5))
    return np.concatenate([trace.hash_ids[a:b][::-1] for a, b in zip(trace.offsets[:-1], trace.offsets[1:])])


def libcachesim_lru_hits(accesses: np.ndarray, capacity: int) -> int:
    cache = libcachesim.LRU(cache_size=capacity)
    return sum(cache.get(libcachesim.Request(obj_size=1, obj_id=int(key))) for key in accesses.tolist())


def test_the_same_hits_as_libcachesims_lru():
    """2,000 requests (~50,000 accesses), each access its own one-block request, so that kvbench's
    distance is the plain LRU stack distance: hits at C = accesses with distance <= C, for the
    vectorized pass and the per-key pass alike, equal to libCacheSim's LRU of C objects."""
    accesses = block_accesses(2_000)
    offsets = np.arange(accesses.size + 1, dtype=np.int64)
    vectorized, _ = compact_distances(accesses.astype(np.int32), offsets)
    per_key, _, _ = distances_of([(int(key).to_bytes(8, "big"),) for key in accesses.tolist()])
    assert np.array_equal(vectorized, per_key)
    for capacity in (16, 256, 4_096, 32_768):
        expected = libcachesim_lru_hits(accesses, capacity)
        assert int(np.count_nonzero(vectorized <= capacity)) == expected
        assert 0 < expected < accesses.size
