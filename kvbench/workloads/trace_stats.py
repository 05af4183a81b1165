"""What a trace offers a prefix cache: sizes, and where the reusable tokens are lost.

For request i (in arrival order, per salt), ``lcp_i`` is the longest common token prefix with any
earlier request: what an unbounded cache with token granularity and no rules could reuse. Real
caches lose some of it (``len_i`` = prompt tokens, ``B`` = block size)::

    reusable (token level)           sum lcp_i
    full blocks, no last-token cap   sum floor(lcp_i / B) * B                 (partial blocks lost)
    full blocks, last-token cap      sum floor(min(lcp_i, len_i - 1) / B) * B (= the simulator's
                                                                               unbounded-cache ideal)

The cap is vLLM's and SGLang's rule that the last prompt token is always recomputed (its logits
give the first output token; see ``kvbench.cache.block_hash.max_hit_blocks``); with blocks it
costs a whole block when the entire prompt, block-aligned, was seen before. The third line equals
``kvbench.sim.replay.ideal_hit_rate`` because a chained block key hits exactly when an earlier request had
the same full blocks up to it; tests check the equality.

``lcp_i`` comes from a radix tree over token ids (edges are token runs, as in SGLang's radix
cache), so the cost is proportional to the distinct tokens, not to a token-by-token trie.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.request import Request
from kvbench.workloads.formats.kvbench_trace import Trace


@dataclass(frozen=True)
class Distribution:
    """Mean and percentiles of a quantity (numpy's linear-interpolation percentiles)."""

    mean: float
    p50: float
    p99: float
    total: int

    @classmethod
    def of(cls, values: Sequence[int] | np.ndarray) -> "Distribution":
        array = np.asarray(values, dtype=np.float64)
        if array.size == 0:
            return cls(0.0, 0.0, 0.0, 0)
        return cls(float(array.mean()), float(np.percentile(array, 50)), float(np.percentile(array, 99)),
                   int(array.sum()))


@dataclass(frozen=True)
class TraceSummary:
    """Counts of a trace. ``num_sessions`` is ``None`` for sources without session ids."""

    num_requests: int
    num_sessions: int | None
    prompt_tokens: Distribution
    output_budget_tokens: Distribution  # max_tokens (kvbench traces) or output_tokens (others)


def summarize(requests: Sequence[Request], trace: Trace | None = None) -> TraceSummary:
    """Summary of token-id requests (and, when given, the text trace they came from, whose
    ``max_tokens`` is the output budget)."""
    if trace is not None:
        budgets = [r.max_tokens for r in trace.requests]
    else:
        budgets = [r.output_tokens for r in requests if r.output_tokens is not None]
    return TraceSummary(len(requests), trace.num_sessions if trace is not None else None,
                        Distribution.of([r.num_tokens for r in requests]), Distribution.of(budgets))


class _Node:
    __slots__ = ("edge", "children")

    def __init__(self, edge: np.ndarray) -> None:
        self.edge = edge  # token ids on the edge into this node, shape (n,)
        self.children: dict[int, _Node] = {}


def _match_and_insert(root: _Node, tokens: np.ndarray) -> int:
    """Longest prefix of ``tokens`` already in the tree, then insert ``tokens``; returns the length."""
    node, position, length = root, 0, tokens.shape[0]
    while position < length:
        child = node.children.get(int(tokens[position]))
        if child is None:
            node.children[int(tokens[position])] = _Node(tokens[position:].copy())
            return position
        span = min(child.edge.shape[0], length - position)
        differ = np.flatnonzero(child.edge[:span] != tokens[position:position + span])
        matched = int(differ[0]) if differ.size else span
        if matched == child.edge.shape[0]:
            node, position = child, position + matched
            continue
        if position + matched == length:  # the prompt ends inside this edge: already present
            return length
        middle = _Node(child.edge[:matched])  # split the edge where the prompt leaves it
        child.edge = child.edge[matched:]
        middle.children[int(child.edge[0])] = child
        node.children[int(tokens[position])] = middle
        middle.children[int(tokens[position + matched])] = _Node(tokens[position + matched:].copy())
        return position + matched
    return length


def longest_cached_prefixes(requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray]:
    """``(lcp, lengths)`` per request in arrival order (stable), int64, shape (num_requests,).

    ``lcp[i]`` is the longest token prefix request i shares with an earlier request of its salt.
    """
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    roots: dict[str, _Node] = {}
    lcp = np.zeros(len(requests), dtype=np.int64)
    lengths = np.zeros(len(requests), dtype=np.int64)
    for slot, index in enumerate(order):
        request = requests[index]
        root = roots.setdefault(request.salt or "", _Node(np.zeros(0, dtype=np.uint32)))  # None: public
        lcp[slot] = _match_and_insert(root, np.asarray(request.token_ids, dtype=np.uint32))
        lengths[slot] = request.num_tokens
    return lcp, lengths


@dataclass(frozen=True)
class ReuseBreakdown:
    """Reusable prompt tokens at one block size (module docstring); all counts in tokens."""

    block_size: int
    num_prompt_tokens: int
    num_reusable_tokens: int
    num_block_tokens_uncapped: int
    num_block_tokens_capped: int

    def _rate(self, tokens: int) -> float:
        return tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    @property
    def reusable_rate(self) -> float:
        """Token-level upper bound: reusable tokens / prompt tokens."""
        return self._rate(self.num_reusable_tokens)

    @property
    def ideal_hit_rate(self) -> float:
        """Unbounded block cache with the last-token cap (the simulator's ideal)."""
        return self._rate(self.num_block_tokens_capped)

    @property
    def lost_to_last_token_rule(self) -> float:
        """Hit rate the last-token cap costs a block cache."""
        return self._rate(self.num_block_tokens_uncapped - self.num_block_tokens_capped)

    @property
    def lost_to_partial_blocks(self) -> float:
        """Hit rate lost because only full blocks are cached."""
        return self._rate(self.num_reusable_tokens - self.num_block_tokens_uncapped)


def reuse_breakdown(lcp: np.ndarray, lengths: np.ndarray, block_size: int) -> ReuseBreakdown:
    """The breakdown at ``block_size`` from :func:`longest_cached_prefixes`' output."""
    capped = np.minimum(lcp, np.maximum(lengths - 1, 0))
    return ReuseBreakdown(block_size, int(lengths.sum()), int(lcp.sum()),
                          int((lcp // block_size * block_size).sum()),
                          int((capped // block_size * block_size).sum()))
