"""Hash a trace's prompts without hashing again the prefixes they share with earlier prompts.

Prefix-cache traffic repeats long prefixes (system prompts, earlier turns), and a chained key is a
function of the token prefix alone (with the salt): two prompts with equal first ``k`` full blocks
have equal first ``k`` keys (:mod:`kvbench.cache.block_hash`). So each prompt is compared (numpy,
over its token ids) with the most recent earlier prompt that starts with the same full block under
the same salt; the keys of the blocks they share are reused and only the rest is hashed. The keys are
exactly those of :meth:`~kvbench.cache.block_hash.BlockHasher.prompt_blocks`
(``tests/sim/test_shared_prefixes.py``); on the seed's multi-prefix scenarios (128 shared blocks of
131) about 3 blocks per prompt are hashed instead of 131.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np

from kvbench.cache.block_hash import (
    TOKEN_ID_BYTES,
    BlockHash,
    BlockHasher,
    HashConfig,
    PromptBlocks,
    encode_token_ids,
)
from kvbench.request import Request

MAX_REMEMBERED_PROMPTS = (
    4096  # (salt, first block) entries kept, least recently matched dropped: bounds memory
)
BATCH_TOKENS = 1 << 20  # token ids encoded at a time: 4 MiB of bytes beside the trace's own ids


def hash_prompts(
    requests: Sequence[Request],
    block_size: int,
    hash_config: HashConfig = HashConfig(),
    keep_tokens: bool = False,
    max_remembered: int = MAX_REMEMBERED_PROMPTS,
) -> list[PromptBlocks]:
    """Every request's full blocks and keys, in request order (salt ``None`` = the public ``""``),
    reusing the keys of the prefix each shares with the latest earlier prompt of the same salt and
    first block; at most ``max_remembered`` earlier prompts are held (their ids and keys).

    Token ids are encoded (and range-checked) a batch of requests at a time (:func:`_encoded`), and
    prompts shorter than one block, which have no key, share one :class:`PromptBlocks` per length and
    salt: a million tiny prompts cost no hashing and no object each.

    Raises:
        ValueError: a block size that is not positive, or a token id outside ``[0, 2**32)``.
    """
    hasher = BlockHasher(block_size, hash_config)
    step = block_size * TOKEN_ID_BYTES
    recent: OrderedDict[tuple[str, bytes], tuple[np.ndarray, tuple[BlockHash, ...]]] = OrderedDict()
    keyless: dict[tuple[int, str], PromptBlocks] = {}  # (bytes, salt) of a prompt under one block
    prompts = []
    for batch, encoded, offsets in _encoded(requests):
        for request, start, end in zip(batch, offsets[:-1], offsets[1:]):
            salt, token_bytes = request.salt or "", encoded[start:end]
            if end - start < step:  # no full block: nothing to hash or share
                prompt = keyless.get((end - start, salt))
                if prompt is None:
                    prompt = keyless[end - start, salt] = hasher.prompt_blocks(
                        (), salt=salt, keep_tokens=keep_tokens, token_bytes=token_bytes
                    )
                prompts.append(prompt)
                continue
            ids = np.frombuffer(token_bytes, dtype="<u4")
            memo_key = (salt, token_bytes[:step])
            earlier = recent.pop(memo_key, None)
            known = () if earlier is None else earlier[1][: shared_full_blocks(ids, earlier[0], block_size)]
            prompt = hasher.prompt_blocks(
                (), salt=salt, keep_tokens=keep_tokens, known_keys=known, token_bytes=token_bytes
            )
            recent[memo_key] = (ids, prompt.block_hashes)
            if len(recent) > max_remembered:
                recent.popitem(last=False)
            prompts.append(prompt)
    return prompts


def _encoded(requests: Sequence[Request]) -> Iterator[tuple[Sequence[Request], bytes, list[int]]]:
    """``(batch, token bytes, offsets)``: consecutive requests of about :data:`BATCH_TOKENS` tokens
    in all, their ids encoded at once (:func:`encode_token_ids`, one range check), request ``r`` of
    the batch at ``bytes[offsets[r]:offsets[r + 1]]``. Memory: one batch's bytes beyond the ids."""
    start = 0
    while start < len(requests):
        end, num_tokens = start, 0
        while end < len(requests) and (num_tokens < BATCH_TOKENS or end == start):
            num_tokens += len(requests[end].token_ids)
            end += 1
        batch = requests[start:end]
        ids = [np.asarray(request.token_ids) for request in batch]
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum([array.size for array in ids], out=offsets[1:])
        yield batch, encode_token_ids(np.concatenate(ids)), (offsets * TOKEN_ID_BYTES).tolist()
        start = end


def shared_full_blocks(ids: np.ndarray, other: np.ndarray, block_size: int) -> int:
    """Full blocks both token-id arrays share from the start: ``k`` with ``ids[:k*block_size] ==
    other[:k*block_size]`` and both at least ``k*block_size`` long, the largest such ``k``."""
    length = min(ids.size, other.size) // block_size * block_size
    differs = ids[:length] != other[:length]
    first = int(differs.argmax()) if differs.any() else length
    return first // block_size
