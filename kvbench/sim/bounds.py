"""What a prefix could possibly hit, whatever the cache does: the bounds every prediction sits under.

* :func:`unbounded_capacity_blocks`: the size of a cache that never evicts for a set of prompts:
  every full block of every prompt (a lookup can only hit full blocks, and an insert stores at most
  the full blocks of its prompt), at least one block (a cache needs a positive capacity).
* :func:`possible_cached_tokens`: per request, the order-free upper bound: the longest
  block-aligned prefix (last-token cap applied) it shares with any *other* request that was sent
  before it ended. A cache that reports more served tokens the run never sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvbench.cache.block_hash import PromptBlocks

Window = tuple[float, float]  # (sent_s, ended_s): when a request was on the wire, on one clock


def unbounded_capacity_blocks(prompt_lengths: Iterable[int], block_size: int) -> int:
    """Blocks a never-evicting cache needs for prompts of these lengths (tokens):
    ``max(sum(length // block_size), 1)``. Raises ``ValueError`` for a non-positive block size."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return max(sum(int(length) // block_size for length in prompt_lengths), 1)


def possible_cached_tokens(
    prompts: Sequence[PromptBlocks], windows: Sequence[Window | None]
) -> list[int | None]:
    """The order-free upper bound per request (module docstring), in tokens; ``None`` for unsent
    requests (window ``None``). ``prompts`` and ``windows`` are in the same order; a window is
    ``(sent_s, ended_s)`` (:attr:`kvbench.request.RequestRecord.sent_s` / ``ended_s``).

    Each chained block key names its whole prefix, so a request can hit block b only if another
    request holding key b was sent before this one ended. Runs in O(total blocks).
    """
    earliest: dict[bytes, list[tuple[float, int]]] = {}  # key -> the two earliest (send time, index)
    for index, (prompt, window) in enumerate(zip(prompts, windows)):
        if window is None:
            continue
        for key in prompt.block_hashes:
            senders = earliest.setdefault(key, [])
            senders.append((window[0], index))
            senders.sort()
            del senders[2:]
    bounds: list[int | None] = []
    for index, (prompt, window) in enumerate(zip(prompts, windows)):
        if window is None:
            bounds.append(None)
            continue
        num_blocks = 0
        for key in prompt.block_hashes[: prompt.max_hit_blocks]:
            if not any(other != index and sent_s < window[1] for sent_s, other in earliest[key]):
                break
            num_blocks += 1
        bounds.append(num_blocks * prompt.block_size)
    return bounds
