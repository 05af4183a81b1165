"""Chained block hashes: the keys of the prefix cache.

``key_i = H(key_{i-1} || token ids of full block i || extra keys)``, with ``key_{-1}`` a root derived
from a salt. Because each key folds in its parent, ``key_i`` names block i *and everything before
it*: two prompts share ``key_i`` only if their first ``(i + 1) * block_size`` tokens (and salt and
extra keys) are equal. Only full blocks get a key; the partial tail gets none.

Rules and where they come from:

* Chaining, full blocks only, extra keys in the hash: vLLM v1 ``hash_block_tokens`` in
  ``vllm/v1/core/kv_cache_utils.py``.
* Token ids are encoded as fixed-width unsigned 32-bit little-endian integers, so ``[1, 23]`` and
  ``[12, 3]`` never produce the same bytes (a decimal string join would). Every vocabulary in use is
  far below 2**32 ids.
* The root is ``H("kvbench/root" || salt)``. vLLM draws its root from ``os.urandom`` per process
  (``NONE_HASH``); kvbench keeps it deterministic so that the simulator, the engine and a trace file
  agree on keys across processes. The empty salt is the public namespace.
* Extra keys (adapter id, image hashes, tenant tags: anything that changes the KV) are mixed into
  *every* block's hash, length-prefixed so that no two different key lists encode alike.
* Algorithms: ``sha256`` (default, 32-byte digest, vLLM's default) and ``xxhash`` (xxh3_128, 16 bytes;
  fast, not collision-resistant against an adversary, which is why vLLM warns about it).
* ``hash_bits`` keeps only the first N bits of every key (and the truncated key is what the next
  block chains on), to demonstrate collisions on purpose.

Why full-width keys make collisions negligible (birthday bound): with ``b``-bit keys and ``n``
distinct blocks ever stored, P(any collision) <= n**2 / 2**(b+1). For SHA-256 and n = 10**12 blocks
that is ~4e-54; for 16-bit keys it passes 50% at n ~ 300 blocks, which ``kvbench break tiny-hash``
shows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NewType

import numpy as np
import xxhash

# A block key. A distinct type (after vLLM's ``BlockHash``) so that a key is never confused with the
# raw token bytes or the payload it indexes: a key is the *chained* hash, one per full block.
BlockHash = NewType("BlockHash", bytes)

TOKEN_ID_BYTES = 4  # fixed width of one token id in the hashed bytes (uint32, little-endian)
_TOKEN_DTYPE = np.dtype("<u4")
_ROOT_TAG = b"kvbench/root\x00"


class HashAlgo(str, Enum):
    """Block hash functions (vLLM's ``--prefix-caching-hash-algo`` offers the same two families)."""

    SHA256 = "sha256"
    XXHASH = "xxhash"

    @property
    def digest_bits(self) -> int:
        """Full width of this algorithm's digest in bits."""
        return 256 if self is HashAlgo.SHA256 else 128


@dataclass(frozen=True)
class HashConfig:
    """How block keys are computed.

    Attributes:
        algo: the hash function.
        hash_bits: keep only the first ``hash_bits`` bits of every key (8..digest width), or
            ``None`` for the full digest. Raises ``ValueError`` outside that range.
    """

    algo: HashAlgo = HashAlgo.SHA256
    hash_bits: int | None = None  # None = full width; small values exist to demonstrate collisions

    def __post_init__(self) -> None:
        object.__setattr__(self, "algo", HashAlgo(self.algo))
        if self.hash_bits is not None and not 8 <= self.hash_bits <= self.algo.digest_bits:
            raise ValueError(
                f"hash_bits must be between 8 and {self.algo.digest_bits} for {self.algo.value}, "
                f"got {self.hash_bits}"
            )

    @property
    def key_bits(self) -> int:
        """Width of the keys this config produces, in bits."""
        return self.hash_bits if self.hash_bits is not None else self.algo.digest_bits


def _digest_function(config: HashConfig):
    """Return ``bytes -> BlockHash`` for ``config``, truncation included."""
    if config.algo is HashAlgo.SHA256:

        def full(data: bytes) -> bytes:
            return hashlib.sha256(data).digest()
    else:
        full = xxhash.xxh3_128_digest
    if config.hash_bits is None:
        return full
    num_bytes, rest_bits = divmod(config.hash_bits, 8)
    if rest_bits == 0:
        return lambda data: full(data)[:num_bytes]
    mask = (0xFF << (8 - rest_bits)) & 0xFF  # keep the top rest_bits bits of the last byte

    def truncated(data: bytes) -> bytes:
        digest = full(data)
        return digest[:num_bytes] + bytes((digest[num_bytes] & mask,))

    return truncated


def encode_token_ids(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """Fixed-width bytes of ``token_ids``: 4 bytes per id, little-endian.

    Raises:
        ValueError: an id is negative or does not fit in 32 bits.
    """
    array = np.asarray(token_ids)
    if array.size and (array.min() < 0 or array.max() >= 2**32):
        raise ValueError("token ids must be in [0, 2**32)")
    return array.astype(_TOKEN_DTYPE, copy=False).tobytes()


def encode_extra_keys(extra_keys: Iterable[str | bytes | int]) -> bytes:
    """Unambiguous bytes for a list of extra keys: a type tag and a length prefix per key."""
    parts = []
    for key in extra_keys:
        if isinstance(key, bytes):
            tag, raw = b"b", key
        elif isinstance(key, str):
            tag, raw = b"s", key.encode()
        elif isinstance(key, int):
            tag, raw = b"i", str(key).encode()
        else:
            raise TypeError(f"extra keys must be str, bytes or int, got {type(key).__name__}")
        parts.append(tag + len(raw).to_bytes(4, "little") + raw)
    return b"".join(parts)


def root_hash(salt: str | bytes = "", config: HashConfig = HashConfig()) -> BlockHash:
    """The chain root for a salt (``key_{-1}``). The empty salt is the public namespace."""
    raw = salt.encode() if isinstance(salt, str) else salt
    return BlockHash(_digest_function(config)(_ROOT_TAG + raw))


def max_hit_blocks(num_tokens: int, block_size: int) -> int:
    """Most blocks a prompt of ``num_tokens`` may hit: ``(num_tokens - 1) // block_size``.

    The last prompt token is always recomputed because its logits produce the first output token
    (vLLM ``KVCacheManager.get_computed_blocks``: ``max_cache_hit_length = num_tokens - 1``).
    """
    return max(num_tokens - 1, 0) // block_size


@dataclass(frozen=True, eq=False)
class PromptBlocks:
    """A prompt cut into full blocks: what both caches look up and insert.

    Attributes:
        num_tokens: prompt length in tokens (the partial tail included).
        block_size: tokens per block.
        block_hashes: one chained key per full block, ``num_tokens // block_size`` of them.
        block_tokens: the fixed-width token bytes of each full block (same length), or ``None``
            when the caller did not keep them (the hash cache does not need them; the radix cache
            and the ``verify_tokens`` guard do).
        namespace: salt and extra keys as bytes; the radix cache keeps one tree per namespace.
    """

    num_tokens: int
    block_size: int
    block_hashes: tuple[BlockHash, ...]
    block_tokens: tuple[bytes, ...] | None
    namespace: bytes

    @property
    def num_full_blocks(self) -> int:
        return len(self.block_hashes)

    @property
    def max_hit_blocks(self) -> int:
        """The last-token cap for this prompt (see :func:`max_hit_blocks`)."""
        return max_hit_blocks(self.num_tokens, self.block_size)


class BlockHasher:
    """Computes chained keys for prompts under one block size, salt policy and hash config.

    Example: ``BlockHasher(16).prompt_blocks(token_ids, salt="tenant-a")``.
    """

    def __init__(self, block_size: int, config: HashConfig = HashConfig()) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.config = config
        self._digest = _digest_function(config)
        self._roots: dict[bytes, BlockHash] = {}

    def root(self, salt: str | bytes = "") -> BlockHash:
        """The chain root for ``salt`` (memoized)."""
        raw = salt.encode() if isinstance(salt, str) else salt
        root = self._roots.get(raw)
        if root is None:
            root = self._roots[raw] = root_hash(raw, self.config)
        return root

    def hash_token_bytes(
        self, token_bytes: bytes, salt: str | bytes = "", extra: bytes = b"", parent: BlockHash | None = None
    ) -> list[BlockHash]:
        """Keys for pre-encoded token bytes (see :func:`encode_token_ids`); full blocks only. With
        ``parent`` (the key of the block right before ``token_bytes``) the chain goes on from it
        instead of the salt's root."""
        step = self.block_size * TOKEN_ID_BYTES
        parent = self.root(salt) if parent is None else parent
        keys = []
        if self.config.algo is HashAlgo.SHA256 and self.config.hash_bits is None:
            sha256 = hashlib.sha256  # the hot path of every sweep: no wrapper call per block
            for start in range(0, len(token_bytes) - step + 1, step):
                parent = sha256(parent + token_bytes[start : start + step] + extra).digest()
                keys.append(parent)
            return keys
        digest = self._digest
        for start in range(0, len(token_bytes) - step + 1, step):
            parent = digest(parent + token_bytes[start : start + step] + extra)
            keys.append(parent)
        return keys

    def block_hashes(
        self,
        token_ids: Sequence[int] | np.ndarray,
        salt: str | bytes = "",
        extra_keys: Sequence[str | bytes | int] = (),
    ) -> list[BlockHash]:
        """One key per full block of ``token_ids``; ``len(token_ids) // block_size`` keys."""
        return self.hash_token_bytes(encode_token_ids(token_ids), salt, encode_extra_keys(extra_keys))

    def prompt_blocks(
        self,
        token_ids: Sequence[int] | np.ndarray,
        salt: str | bytes = "",
        extra_keys: Sequence[str | bytes | int] = (),
        keep_tokens: bool = True,
        known_keys: Sequence[BlockHash] = (),
        token_bytes: bytes | None = None,
    ) -> PromptBlocks:
        """Cut ``token_ids`` into full blocks with keys (and, if ``keep_tokens``, their bytes).

        ``known_keys``: the keys of the leading blocks when the caller already has them (a prefix
        shared with an earlier prompt of the same salt and extra keys); only the rest is hashed.
        ``token_bytes``: ``encode_token_ids(token_ids)`` when the caller already encoded them.
        """
        token_bytes = encode_token_ids(token_ids) if token_bytes is None else token_bytes
        extra = encode_extra_keys(extra_keys)
        step = self.block_size * TOKEN_ID_BYTES
        keys = [
            *known_keys,
            *self.hash_token_bytes(
                token_bytes[len(known_keys) * step :], salt, extra, known_keys[-1] if known_keys else None
            ),
        ]
        block_tokens = None
        if keep_tokens:
            block_tokens = tuple(token_bytes[i * step : (i + 1) * step] for i in range(len(keys)))
        raw_salt = salt.encode() if isinstance(salt, str) else salt
        namespace = len(raw_salt).to_bytes(4, "little") + raw_salt + extra
        return PromptBlocks(
            num_tokens=len(token_bytes) // TOKEN_ID_BYTES,
            block_size=self.block_size,
            block_hashes=tuple(keys),
            block_tokens=block_tokens,
            namespace=namespace,
        )
