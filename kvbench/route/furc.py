"""vllm-router's ring hash (``src/policies/consistent_hash.rs``): MurmurHash64A and mcrouter's
``furc_hash`` (Facebook's ``mcrouter/lib/fbi/hash.c``), combined as ``fbi_hash``.

``fbi_hash(key) = murmur64a(le32(furc_hash(key, 2^23 - 1)), seed)``: a 64-bit ring point. Written here
from the algorithms' definitions; the unit tests pin known values.
"""

from __future__ import annotations

from functools import lru_cache

MASK = (1 << 64) - 1
M = 0xC6A4A7935BD1E995
R = 47
SEED = 4193360111
FURC_SHIFT = 23
FURC_TRIES = 32
FURC_MODULUS = (1 << 23) - 1


def murmur64a(data: bytes, seed: int = SEED) -> int:
    """MurmurHash64A of ``data`` (little-endian 8-byte words), 64-bit result."""
    h = (seed ^ (len(data) * M)) & MASK
    whole = len(data) - len(data) % 8
    for start in range(0, whole, 8):
        k = (int.from_bytes(data[start : start + 8], "little") * M) & MASK
        k ^= k >> R
        k = (k * M) & MASK
        h = ((h ^ k) * M) & MASK
    tail = data[whole:]
    if tail:
        h = ((h ^ int.from_bytes(tail, "little")) * M) & MASK
    h ^= h >> R
    h = (h * M) & MASK
    return h ^ (h >> R)


def _rehash(k: int) -> int:
    """MurmurHash64A of one 64-bit word with the fixed seed (hash.c's rehash step)."""
    return murmur64a(k.to_bytes(8, "little"))


class _Bits:
    """The key's bit stream: word 0 is murmur64a(key), word n is the rehash of word n - 1."""

    def __init__(self, key: bytes) -> None:
        self.words = [murmur64a(key)]

    def __call__(self, index: int) -> int:
        word = index >> 6
        while len(self.words) <= word:
            self.words.append(_rehash(self.words[-1]))
        return (self.words[word] >> (index & 63)) & 1


def furc_hash(key: bytes, m: int) -> int:
    """mcrouter's consistent hash of ``key`` onto ``[0, m)``."""
    if m <= 1:
        return 0
    bits, d = _Bits(key), (m - 1).bit_length()
    a = d
    for _ in range(FURC_TRIES):
        while not bits(a):
            if d == 0:
                return 0
            d -= 1
            a = d
        a += FURC_SHIFT
        num = 1
        for _ in range(max(d - 1, 0)):
            num = (num << 1) | bits(a)
            a += FURC_SHIFT
        if num < m:
            return num
    return 0


@lru_cache(maxsize=65536)
def fbi_hash(key: str) -> int:
    """vllm-router's 64-bit ring point of ``key`` (UTF-8)."""
    return murmur64a(furc_hash(key.encode(), FURC_MODULUS).to_bytes(4, "little"))
