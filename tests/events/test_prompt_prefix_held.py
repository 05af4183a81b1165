"""A client's view of a block map: the content keys of a prompt (from its token ids) match the keys a
replica's events give the same blocks, so ``prefix_length`` is the prefix that replica holds, whatever
hashes the server used and however it split the stores into events."""

from kvbench.cache.block_hash import encode_token_ids
from kvbench.events.blockmap import FleetBlocks, prompt_content_keys
from kvbench.events.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored

BLOCK = 4
TOKENS = list(range(100, 118))  # 4 full blocks and 2 tokens


def keys_of(tokens):
    full = len(tokens) // BLOCK * BLOCK
    return prompt_content_keys([encode_token_ids(tokens[i : i + BLOCK]) for i in range(0, full, BLOCK)])


def stored(hashes, parent, first_block, count):
    tokens = tuple(TOKENS[first_block * BLOCK : (first_block + count) * BLOCK])
    return BlockStored(tuple(hashes), parent, tokens, BLOCK, "GPU")


def test_a_prompts_keys_match_the_blocks_two_servers_stored_under_their_own_hashes():
    keys = keys_of(TOKENS)
    assert len(keys) == 4 and len(set(keys)) == 4
    fleet = FleetBlocks()
    # replica a stores the first 3 blocks in two events (hashes 1, 2 then 3 chained to 2)
    fleet.apply("a", 0, Batch(0.0, (stored([1, 2], None, 0, 2), stored([3], 2, 2, 1))), 0.0)
    # replica b stores the first 2 blocks under other hashes
    fleet.apply("b", 0, Batch(0.0, (stored([77, 78], None, 0, 2),)), 0.0)
    assert fleet.replica("a").prefix_length(keys) == 3
    assert fleet.replica("b").prefix_length(keys) == 2
    assert fleet.summary(0.0).num_duplicated_blocks == 2  # blocks 0 and 1, by content
    # a different prompt sharing only the first block
    other = keys_of(TOKENS[:4] + [9] * 8)
    assert fleet.replica("a").prefix_length(other) == 1


def test_the_prefix_held_stops_at_an_evicted_block_and_a_clear_empties_it():
    keys = keys_of(TOKENS)
    fleet = FleetBlocks()
    fleet.apply("a", 0, Batch(0.0, (stored([1, 2, 3, 4], None, 0, 4),)), 0.0)
    assert fleet.replica("a").prefix_length(keys) == 4
    fleet.apply("a", 1, Batch(0.0, (BlockRemoved((2,), "GPU"),)), 0.0)
    assert fleet.replica("a").prefix_length(keys) == 1  # block 1 gone: blocks 2 and 3 no longer reachable
    assert fleet.replica("a").content_keys() == {keys[0], keys[2], keys[3]}
    fleet.apply("a", 2, Batch(0.0, (AllBlocksCleared(),)), 0.0)
    assert fleet.replica("a").prefix_length(keys) == 0 and not fleet.replica("a").content_keys()
