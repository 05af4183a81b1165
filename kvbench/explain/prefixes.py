"""The longest prefix each prompt shares with anything sent before it: where it diverges, and from whom.

Each request's stored sequence (its prompt, or prompt + output - 1 tokens when generated blocks are
cached) is indexed under its chained block keys (:mod:`kvbench.cache.block_hash`), so a lookup walks
the prompt's keys to the first one never stored (exact, in blocks, like a cache that never evicts),
then compares tokens inside the next block with the last few sequences that stored the last
matching block, which gives the token offset of the divergence. One index per namespace rule: keys
rooted in the request's salt (what a cache can hit) or all in the public namespace (what it could
hit without salts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.cache.block_hash import BlockHasher, HashConfig

CANDIDATES_PER_KEY = 16  # the sequences kept per block key for the token-level comparison


@dataclass(frozen=True)
class SharedPrefix:
    """``tokens``: length of the longest shared prefix; ``earlier``: the position of the request whose
    stored sequence shares it (the most recent on a tie), ``None`` when nothing shares a token."""

    tokens: int
    earlier: int | None


def common_prefix_tokens(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two id arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    different = np.flatnonzero(a[:n] != b[:n])
    return int(different[0]) if different.size else n


class PrefixIndex:
    """Stored sequences by block key, per namespace (``namespace=None`` for every request: one
    public namespace). Positions are the requests' places in replay order."""

    def __init__(self, block_size: int, hash_config: HashConfig = HashConfig()) -> None:
        self.block_size = block_size
        self._hasher = BlockHasher(block_size, hash_config)
        self._by_key: dict[bytes, list[int]] = {}
        self._by_first: dict[tuple[str, int], list[int]] = {}
        self._sequences: dict[int, np.ndarray] = {}

    def sequence(self, position: int) -> np.ndarray:
        """The stored sequence of the request at ``position``."""
        return self._sequences[position]

    def longest(self, prompt: np.ndarray, namespace: str) -> SharedPrefix:
        """The longest prefix of ``prompt`` shared with a sequence stored in ``namespace``."""
        if len(prompt) == 0:
            return SharedPrefix(0, None)
        keys = self._hasher.block_hashes(prompt, salt=namespace)
        num_blocks = 0
        while num_blocks < len(keys) and keys[num_blocks] in self._by_key:
            num_blocks += 1
        if num_blocks:
            candidates = self._by_key[keys[num_blocks - 1]]
        else:
            candidates = self._by_first.get((namespace, int(prompt[0])), [])
        start = num_blocks * self.block_size
        best = SharedPrefix(start, candidates[-1] if candidates else None)
        for position in reversed(candidates):
            stored = self._sequences[position]
            tokens = start + common_prefix_tokens(
                prompt[start : start + self.block_size], stored[start : start + self.block_size]
            )
            if tokens > best.tokens:
                best = SharedPrefix(tokens, position)
        return best

    def add(self, position: int, sequence: np.ndarray, namespace: str) -> None:
        """Index the sequence the request at ``position`` stored."""
        self._sequences[position] = sequence
        if len(sequence):
            _remember(self._by_first.setdefault((namespace, int(sequence[0])), []), position)
        for key in self._hasher.block_hashes(sequence, salt=namespace):
            _remember(self._by_key.setdefault(key, []), position)


def _remember(positions: list[int], position: int) -> None:
    if not positions or positions[-1] != position:
        positions.append(position)
        if len(positions) > CANDIDATES_PER_KEY:
            del positions[0]


def stored_sequences(prompts: Sequence[np.ndarray], outputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Per request, prompt + output - 1 tokens (the prompt where the output is ``None``)."""
    sequences = []
    for prompt, output in zip(prompts, outputs):
        ids = np.asarray(prompt, dtype=np.int64)
        if output is not None and len(output) > 1:
            ids = np.concatenate([ids, np.asarray(output, dtype=np.int64)[:-1]])
        sequences.append(ids)
    return sequences
