"""Chained block keys: full blocks only, chaining, salts, extra keys, widths, fixed-width ids."""

import hashlib

import pytest

from kvbench.cache.block_hash import (
    BlockHasher,
    HashAlgo,
    HashConfig,
    encode_extra_keys,
    encode_token_ids,
    max_hit_blocks,
    root_hash,
)


def test_only_full_blocks_get_keys_and_keys_chain():
    hasher = BlockHasher(4)
    first = hasher.block_hashes(list(range(1, 10)))  # [1..9]: two full blocks, tail [9] has no key
    second = hasher.block_hashes([1, 2, 3, 4, 5, 6, 7, 0])
    assert len(first) == 2 and len(second) == 2
    assert first[0] == second[0]
    assert first[1] != second[1]


def test_same_block_tokens_with_a_different_past_get_a_different_key():
    hasher = BlockHasher(4)
    plain = hasher.block_hashes([1, 2, 3, 4, 5, 6, 7, 8])
    other_past = hasher.block_hashes([9, 9, 9, 9, 5, 6, 7, 8])
    assert plain[1] != other_past[1]


def test_key_is_sha256_of_parent_tokens_and_extra_keys():
    hasher = BlockHasher(2)
    keys = hasher.block_hashes([5, 6, 7, 8], extra_keys=["lora-a"])
    extra = encode_extra_keys(["lora-a"])
    expected0 = hashlib.sha256(root_hash("") + encode_token_ids([5, 6]) + extra).digest()
    expected1 = hashlib.sha256(expected0 + encode_token_ids([7, 8]) + extra).digest()
    assert keys == [expected0, expected1]


def test_token_ids_are_fixed_width_so_digit_splits_differ():
    assert encode_token_ids([1, 23]) != encode_token_ids([12, 3])
    assert len(encode_token_ids([1, 23])) == 8
    hasher = BlockHasher(2)
    assert hasher.block_hashes([1, 23]) != hasher.block_hashes([12, 3])


def test_token_ids_out_of_range_are_refused():
    with pytest.raises(ValueError):
        encode_token_ids([-1])
    with pytest.raises(ValueError):
        encode_token_ids([2**32])


def test_salts_and_extra_keys_separate_namespaces():
    hasher = BlockHasher(4)
    tokens = list(range(8))
    public = hasher.block_hashes(tokens)
    assert hasher.block_hashes(tokens, salt="tenant-a") != public
    assert hasher.block_hashes(tokens, salt="tenant-a") == hasher.block_hashes(tokens, salt="tenant-a")
    assert hasher.block_hashes(tokens, salt="tenant-a") != hasher.block_hashes(tokens, salt="tenant-b")
    with_lora = hasher.block_hashes(tokens, extra_keys=["lora-1"])
    assert with_lora[0] != public[0] and with_lora[1] != public[1]
    assert hasher.block_hashes(tokens, extra_keys=["lora-1"]) == with_lora
    # Length prefixes: ["ab", "c"] and ["a", "bc"] must not encode alike.
    assert encode_extra_keys(["ab", "c"]) != encode_extra_keys(["a", "bc"])
    assert encode_extra_keys([1]) != encode_extra_keys(["1"])


@pytest.mark.parametrize("algo,width", [(HashAlgo.SHA256, 32), (HashAlgo.XXHASH, 16)])
def test_digest_widths(algo, width):
    keys = BlockHasher(4, HashConfig(algo)).block_hashes(range(8))
    assert [len(k) for k in keys] == [width, width]


@pytest.mark.parametrize("bits,num_bytes", [(8, 1), (12, 2), (16, 2), (64, 8), (256, 32)])
def test_hash_bits_truncates_every_key(bits, num_bytes):
    keys = BlockHasher(4, HashConfig(hash_bits=bits)).block_hashes(range(40))
    assert all(len(k) == num_bytes for k in keys)
    if bits % 8:
        assert all(k[-1] & (0xFF >> (bits % 8)) == 0 for k in keys)  # low bits of the last byte cleared


def test_hash_bits_out_of_range_are_refused():
    with pytest.raises(ValueError):
        HashConfig(hash_bits=7)
    with pytest.raises(ValueError):
        HashConfig(HashAlgo.XXHASH, hash_bits=129)


def test_tiny_keys_collide_on_purpose():
    """With 8-bit keys, 300 distinct one-block prompts must share keys (pigeonhole)."""
    hasher = BlockHasher(1, HashConfig(hash_bits=8))
    keys = {hasher.block_hashes([token])[0] for token in range(300)}
    assert len(keys) <= 256


def test_max_hit_blocks_keeps_the_last_token():
    assert max_hit_blocks(48, 16) == 2  # an exact multiple still recomputes the last block
    assert max_hit_blocks(49, 16) == 3
    assert max_hit_blocks(1, 16) == 0
    assert max_hit_blocks(0, 16) == 0


def test_prompt_blocks_carries_token_bytes_and_namespace():
    prompt = BlockHasher(4).prompt_blocks(list(range(10)), salt="s")
    assert prompt.num_tokens == 10 and prompt.num_full_blocks == 2 and prompt.max_hit_blocks == 2
    assert prompt.block_tokens == (encode_token_ids([0, 1, 2, 3]), encode_token_ids([4, 5, 6, 7]))
    assert prompt.namespace != BlockHasher(4).prompt_blocks(list(range(10))).namespace
