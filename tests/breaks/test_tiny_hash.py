"""``kvbench break tiny-hash``: few key bits give false hits and wrong outputs; SHA-256 gives none."""

import itertools

import pytest

from kvbench.breaks.tiny_hash import FalseHitTracker, TinyHashConfig, run_tiny_hash, tiny_hash_table
from kvbench.cache.base import CacheConfig
from kvbench.cache.block_hash import BlockHasher, HashConfig
from kvbench.commands.break_tables import verdict_table


def colliding_prompts(hasher):
    """Two different one-block prompts whose keys are equal."""
    seen = {}
    for token in itertools.count():
        key = hasher.block_hashes([token] * 4)[0]
        if key in seen:
            return [seen[key]] * 4 + [7], [token] * 4 + [7]
        seen[key] = token


def test_tracker_finds_a_collision_after_the_fact():
    config = CacheConfig(capacity_blocks=10, block_size=4, hash=HashConfig(hash_bits=8))
    first, second = colliding_prompts(BlockHasher(4, config.hash))
    tracker = FalseHitTracker(config)
    assert tracker.observe(first, "", 0).num_false_hit_blocks == 0
    seen = tracker.observe(second, "", 1)  # the cache under test hit 1 block: another prompt's
    assert seen.num_false_hit_blocks == 1 and seen.first_false_block == 0
    assert tracker.observe(first, "", 1).num_false_hit_blocks == 0  # the owner's own hit is true
    with pytest.raises(RuntimeError, match="lockstep|replica"):
        tracker.observe(first, "", 0)


def test_few_bits_give_false_hits_and_wrong_outputs_sha256_none(small_model, tokenizer):
    config = TinyHashConfig(
        hash_bits=8, num_requests=40, num_prefixes=4, prefix_tokens=32, unique_tokens=16, max_tokens=2
    )
    result = run_tiny_hash(small_model, config, tokenizer)
    broken, correct = result.counts(result.broken), result.counts(result.correct)
    assert broken["false_hit_requests"] >= 1 and broken["mismatched_outputs"] >= 1
    assert correct["false_hit_requests"] == 0 and correct["mismatched_outputs"] == 0
    assert result.example() is not None
    caption = str(verdict_table(tiny_hash_table(result)).caption)
    assert "verdict" in caption and "example" in caption
    rows = result.parquet_tables()[0].rows
    assert {row["variant"] for row in rows} == {"cache-off", "8-bit", "sha256"}


def test_config_is_validated():
    with pytest.raises(ValueError, match="hash_bits"):
        TinyHashConfig(hash_bits=4)
