"""How the blocks of one :class:`~kvbench.cache.block_pool.BlockPool` are keyed: by chained block hash
(vLLM) or as the nodes of a radix tree over token ids (SGLang). The paged engine's scheduler and
the pool simulator both go through :class:`PoolIndex`, so there is one scheduler and one pool for
both kinds; only the key of a block and what happens to a duplicate differ.

* **hash** (vLLM v1, ``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens``): block ``i``'s key is
  its chained hash ``H(key_{i-1}, tokens_i, extra)``, computed from the tokens alone. A block computed
  twice (two running sequences with one prefix) is keyed twice: duplicates coexist
  (``BlockHashToBlockMap``), the lookup takes the first.
* **radix** (SGLang ``python/sglang/srt/mem_cache/radix_cache.py``, page size = block size): block
  ``i``'s key is ``(its parent, token bytes of block i)``, the parent being the *pool block id* holding
  block ``i - 1`` (one root ``("root", namespace)`` per salt namespace for block 0). The pool's key map
  is then the tree's child map: a lookup walks down from the root comparing token bytes (no hash, no
  collision), and a child is keyed only under a keyed parent. A duplicate is **deduplicated** when it
  is keyed, as ``RadixCache.cache_unfinished_req`` does: the block table switches to the tree's block
  and the duplicate is freed, so no child ever hangs under a block that may be evicted and reused.

Eviction is the pool's (lazy, front of the free queue; :mod:`kvbench.cache.block_pool`). For radix
that is exactly SGLang's rule, as :mod:`kvbench.cache.radix_cache` states it (LRU unpinned **leaf**,
trimmed from its tail one block at a time), because two facts hold and
:meth:`PoolIndex.check_invariants` checks both: a pinned block's parent is pinned (a block table or a
handle always holds a whole path from block 0), and a free block's free parent sits *behind* it in the
LRU (a parent's last release is never earlier than its children's, and a path is released tail first:
head-first release is refused for radix). So the free queue's cached front is always an unpinned leaf,
the least recently released one, and the TTL sweep (:class:`kvbench.cache.pool_cache.IdleTimer`, front
first) expires leaves before their parents, as the radix cache's sweep does.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from kvbench.cache.base import CacheKind
from kvbench.cache.block_hash import TOKEN_ID_BYTES, BlockHasher, encode_token_ids
from kvbench.cache.block_pool import BlockPool
from kvbench.cache.events import MEDIUM_GPU, BlockListener


class PoolIndex:
    """The keys of ``pool``'s blocks for one cache kind (module docstring).

    ``keys`` below are what :meth:`block_keys` returns for one sequence: one entry per full block
    (chained hashes for hash, token bytes for radix); ``namespace`` is the sequence's salt (radix
    roots one tree per namespace; hash already chains the salt into its keys and ignores it).
    Block tables hold pool block ids, logical block 0 first.

    Attributes:
        num_deduplicated_blocks: radix only: duplicates freed at keying (their tables now point at
            the tree's block).
    """

    def __init__(self, pool: BlockPool, hasher: BlockHasher, kind: CacheKind = CacheKind.HASH) -> None:
        self.pool = pool
        self.hasher = hasher
        self.kind = CacheKind(kind)
        self.num_deduplicated_blocks = 0
        radix = self.kind is CacheKind.RADIX
        self.block_keys = self._token_runs if radix else self._chained_hashes
        # (parent block id | None, keys, index, namespace) -> pool key
        self.key = _tree_key if radix else _chained_key
        self._deduplicate = radix
        self._listener: BlockListener | None = None

    @property
    def listener(self) -> BlockListener | None:
        """Told every block keyed here and every key the pool drops (:mod:`kvbench.cache.events`)."""
        return self._listener

    @listener.setter
    def listener(self, listener: BlockListener | None) -> None:
        self._listener = self.pool.listener = listener

    # -- keys --------------------------------------------------------------------------------------

    def _chained_hashes(self, token_ids: Sequence[int], namespace: Hashable) -> list[Hashable]:
        return self.hasher.block_hashes(token_ids, salt=namespace)

    def _token_runs(self, token_ids: Sequence[int], namespace: Hashable) -> list[Hashable]:
        step = self.hasher.block_size * TOKEN_ID_BYTES
        data = encode_token_ids(token_ids)
        return [data[start : start + step] for start in range(0, len(data) - step + 1, step)]

    def same_prefix(self, keys: Sequence[Hashable], other_keys: Sequence[Hashable], index: int) -> bool:
        """Whether two sequences of one namespace agree on blocks ``0 .. index`` (hash: the chained
        key of block ``index`` says so alone; radix: compare the token runs)."""
        if self._deduplicate:
            return keys[: index + 1] == other_keys[: index + 1]
        return keys[index] == other_keys[index]

    # -- the pool ----------------------------------------------------------------------------------

    def cached_prefix(self, keys: Sequence[Hashable], namespace: Hashable) -> list[int]:
        """Block ids of the longest leading run of ``keys`` the pool holds (stops at the first miss);
        not pinned (``BlockPool.touch`` them)."""
        hit: list[int] = []
        parent = None
        for index in range(len(keys)):
            block_id = self.pool.cached_block(self.key(parent, keys, index, namespace))
            if block_id is None:
                break
            hit.append(block_id)
            parent = block_id
        return hit

    def key_block(
        self,
        block_table: list[int],
        index: int,
        keys: Sequence[Hashable],
        namespace: Hashable,
        token_ids: Sequence[int] = (),
    ) -> bool:
        """Give full, computed block ``block_table[index]`` its key (blocks before it keyed already);
        ``True`` if it is newly keyed. Radix: if the tree already holds that block, the table switches
        to the tree's block (pinned) and the duplicate is freed (``False``). ``token_ids``: the
        sequence's tokens (at least through this block), only read for the listener."""
        pool, block_id = self.pool, block_table[index]
        if pool.block_key(block_id) is not None:
            return False  # keyed already (a forked sample's shared prompt block)
        parent = block_table[index - 1] if index else None
        key = self.key(parent, keys, index, namespace)
        existing = pool.cached_block(key) if self._deduplicate else None
        if existing is None:
            pool.cache(block_id, key)
            if self._listener is not None:
                size = self.hasher.block_size
                parent_key = pool.block_key(parent) if index else None
                block_tokens = token_ids[index * size : (index + 1) * size]
                self._listener.stored(key, parent_key, block_tokens, MEDIUM_GPU)
            return True
        pool.touch([existing])
        pool.free([block_id])  # uncached: straight to the front of the free queue
        block_table[index] = existing
        self.num_deduplicated_blocks += 1
        return False

    # -- checking ----------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """The pool's invariants; for radix also (module docstring): every key names a keyed parent
        (or a root), once; a pinned block's parent is pinned; a free block's free parent is behind it
        in the LRU. Raises ``AssertionError``."""
        pool = self.pool
        pool.check_invariants()
        if not self._deduplicate:
            return
        lru_position = {block_id: i for i, block_id in enumerate(pool.evictable_block_ids())}
        keyed = [b for b in pool.used_block_ids() if pool.block_key(b) is not None] + list(lru_position)
        if len({pool.block_key(b) for b in keyed}) != len(keyed):
            raise AssertionError("two blocks hold one radix key (a duplicate was not deduplicated)")
        for block_id in keyed:
            parent = pool.block_key(block_id)[0]
            if isinstance(parent, tuple):
                continue  # a root
            if pool.block_key(parent) is None:
                raise AssertionError(f"block {block_id} is keyed under block {parent}, which holds no key")
            if block_id in lru_position:
                if parent in lru_position and lru_position[parent] < lru_position[block_id]:
                    raise AssertionError(f"free block {block_id}'s parent {parent} would be evicted first")
            elif not pool.ref_count(parent):
                raise AssertionError(f"pinned block {block_id}'s parent {parent} is not pinned")


def _chained_key(parent: int | None, keys: Sequence[Hashable], index: int, namespace: Hashable) -> Hashable:
    return keys[index]


def _tree_key(parent: int | None, keys: Sequence[Hashable], index: int, namespace: Hashable) -> Hashable:
    return (("root", namespace) if parent is None else parent, keys[index])
