"""The paged engine (``--engine paged``): one preallocated KV pool, block tables, continuous batching.

The copy engine (:mod:`kvbench.engine.engine`) stores every cached block as its own tensor and
concatenates a hit into a fresh contiguous cache. This engine does what vLLM does, in small:

* :mod:`.kv_pool`: one K and one V tensor per layer, preallocated, ``(kv_heads, num_blocks + 1,
  block_size, head_dim)``; block 0 is the null block (never allocated; pads block tables).
* :mod:`.scheduler`: the block tables, the prefix cache (a :class:`~kvbench.cache.block_pool.BlockPool`
  whose keys are block hashes or radix-tree nodes, :mod:`kvbench.cache.block_index`: a running
  sequence's blocks *are* the cache's blocks, pinned) and
  the continuous-batching scheduler (FCFS, preemption by recompute, tail-first release), forks for
  parallel sampling with copy-on-write. Pure Python.
* :mod:`.attention`: an attention function registered with transformers' ``AttentionInterface``
  that writes the new tokens' K/V into the pool and reads each sequence's K/V by its block table.
* :mod:`.sequence`: one request's sequence (tokens, block table, counts) and one step's work.
* :mod:`.engine`: :class:`~kvbench.engine.paged.engine.PagedEngine`, the step loop and records, on
  a worker thread (:mod:`kvbench.engine.worker`) for concurrent callers.
* :mod:`.calls`: the engine's calls from other threads (the :class:`kvbench.engine.protocol.Engine`
  interface): submit, ``submit_samples`` for ``n`` parallel samples, abort, reset, describe, memory.
* :mod:`.config`: :class:`~kvbench.engine.paged.config.PagedConfig` and vLLM's default step limits.
* :mod:`.jobs`: one request as its caller sees it (sequence, sampling, future) and its record.
* :mod:`.held`: the bytes the pool holds for running and cached blocks, peaks per step.
"""
