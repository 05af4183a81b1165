"""One request stepped through a prefix cache: look up, store, release (the step every replay shares).

What an engine does around one request's forward pass, without the model, as every cache-only
replay does it (the simulator, ``kvbench bill``'s OpenAI cache, ``kvbench route``'s replicas, the
live-turns predictor, ``kvbench play``, the tiny-hash tracker):

1. ``lookup`` with the last-token cap ``(num_tokens - 1) // block_size``
   (:attr:`~kvbench.cache.block_hash.PromptBlocks.max_hit_blocks`; vLLM, SGLang): the last prompt
   token is always recomputed, its logits give the first output token;
2. ``insert`` every full block after the hit (the engine computed them): the prompt's, or the blocks
   of prompt + output - 1 tokens (:func:`kvbench.sim.outputs.stored_blocks_of`) when given;
3. ``release`` what the lookup and the insert pinned, in one call, hit first then stored, so the
   cache's release order (tail first: :class:`~kvbench.cache.base.ReleaseOrder`) sees the chain in
   order; a step told to ``hold`` returns the handles instead, and :func:`release_step` releases
   them when the request ends.

The cache's clock is the caller's: a replay sets it to the request's time before the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvbench.cache.base import InsertResult, MatchResult, PrefixCache
from kvbench.cache.block_hash import PromptBlocks

PayloadsFor = Callable[[MatchResult], Sequence[Any]]  # the hit -> one payload per block stored after it


class StepResult:
    """What one request did to a cache: its lookup and its insert, as the cache returned them.

    Attributes:
        match: the hit, in blocks from block 0 (``match.num_expired_blocks``: dropped by the TTL
            sweep before it). Its blocks are released unless the step held them; read
            ``match.payloads`` only before the release.
        new: what was stored after the hit (``num_inserted_blocks``, ``num_existing_blocks``,
            ``num_refused_blocks``, ``num_evicted_blocks``); empty when the step stored nothing.
        block_size: tokens per block of the cache.
        handles: what a held step still pins (hit first, then stored), for :func:`release_step`;
            ``None`` once released.
    """

    __slots__ = ("match", "new", "block_size", "handles")

    def __init__(
        self, match: MatchResult, new: InsertResult, block_size: int, handles: list[Any] | None
    ) -> None:
        self.match = match
        self.new = new
        self.block_size = block_size
        self.handles = handles

    @property
    def num_hit_blocks(self) -> int:
        return self.match.num_hit_blocks

    @property
    def num_hit_tokens(self) -> int:
        """Cached prompt tokens: hit blocks x block size (a multiple of it, under the last-token cap)."""
        return self.match.num_hit_blocks * self.block_size

    @property
    def num_inserted_blocks(self) -> int:
        return self.new.num_inserted_blocks

    @property
    def num_evicted_blocks(self) -> int:
        """Unpinned blocks the insert dropped to make room (LRU, a chain's tail first)."""
        return self.new.num_evicted_blocks

    @property
    def num_expired_blocks(self) -> int:
        """Unpinned blocks the lookup's TTL sweep dropped."""
        return self.match.num_expired_blocks


def step(
    cache: PrefixCache,
    prompt: PromptBlocks,
    stored: PromptBlocks | None = None,
    *,
    store: bool = True,
    payloads_for: PayloadsFor | None = None,
    hold: bool = False,
) -> StepResult:
    """Step one request through ``cache`` (module docstring): look ``prompt`` up under its last-token
    cap, store the blocks after the hit, release both.

    Args:
        stored: the blocks the request stores (their first keys are the prompt's: prompt + output
            - 1 tokens); ``None``: the prompt's own.
        store: ``False`` stores nothing (a request that failed computed no blocks worth keeping).
        payloads_for: called with the hit before the insert, returns one payload per block stored
            after it (what the cache keeps for each block: the engine's K/V, a tracker's truth).
        hold: keep every block pinned (the request is still running) and return the handles in
            :attr:`StepResult.handles`; :func:`release_step` releases them.

    Raises:
        ValueError: from the cache's insert (``payloads_for`` gave the wrong number of payloads).
        Whatever ``payloads_for`` raises, after the hit is released.
    """
    match = cache.lookup(prompt, prompt.max_hit_blocks)
    num_hit_blocks = match.num_hit_blocks
    if not store:
        new = InsertResult(0, 0, 0, [])
    elif payloads_for is None:
        new = cache.insert(prompt if stored is None else stored, num_hit_blocks)
    else:
        try:
            payloads = payloads_for(match)
        except BaseException:
            cache.release(match.handles)
            raise
        new = cache.insert(prompt if stored is None else stored, num_hit_blocks, payloads)
    handles = match.handles + new.handles
    if hold:
        return StepResult(match, new, cache.config.block_size, handles)
    cache.release(handles)
    return StepResult(match, new, cache.config.block_size, None)


def release_step(cache: PrefixCache, held: StepResult) -> None:
    """Release what a step with ``hold`` pinned (its request finished), in the step's own order.

    Raises:
        ValueError: ``held`` was already released (or never held).
    """
    if held.handles is None:
        raise ValueError("this step holds nothing: it was released already, or never held")
    handles, held.handles = held.handles, None
    cache.release(handles)
