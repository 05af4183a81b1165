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
cache, held as bytes), so the cost is proportional to the distinct tokens, not to a token-by-token trie.
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
    def of(cls, values: Sequence[int] | np.ndarray) -> Distribution:
        array = np.asarray(values, dtype=np.float64)
        if array.size == 0:
            return cls(0.0, 0.0, 0.0, 0)
        return cls(
            float(array.mean()),
            float(np.percentile(array, 50)),
            float(np.percentile(array, 99)),
            int(array.sum()),
        )


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
    return TraceSummary(
        len(requests),
        trace.num_sessions if trace is not None else None,
        Distribution.of([r.num_tokens for r in requests]),
        Distribution.of(budgets),
    )


_TOKEN_BYTES = 4  # a token id as the tree holds it: uint32, so a token run is a bytes slice


class _Node:
    __slots__ = ("edge", "children")

    def __init__(self, edge: bytes) -> None:
        self.edge = edge  # the token ids on the edge into this node, 4 bytes each
        self.children: dict[bytes, _Node] = {}  # by the first token's 4 bytes


def _shared_tokens(edge: bytes, tokens: bytes, position: int, span: int) -> int:
    """The most tokens ``k <= span`` with ``edge``'s first ``k`` equal to ``tokens``' from byte
    ``position`` on (a binary search of C-level prefix tests, not a Python loop over tokens)."""
    low, high = 1, span  # the first token is equal: the child was found by it
    while low < high:
        middle = (low + high + 1) // 2
        if tokens.startswith(edge[: middle * _TOKEN_BYTES], position):
            low = middle
        else:
            high = middle - 1
    return low


def _match_and_insert(root: _Node, tokens: bytes) -> int:
    """Longest prefix of ``tokens`` (token ids as uint32 bytes) already in the tree, then insert
    ``tokens``; returns the length in tokens."""
    node, position, length = root, 0, len(tokens)
    while position < length:
        key = tokens[position : position + _TOKEN_BYTES]
        child = node.children.get(key)
        if child is None:
            node.children[key] = _Node(tokens[position:])
            return position // _TOKEN_BYTES
        edge = child.edge
        if tokens.startswith(edge, position):
            node, position = child, position + len(edge)
            continue
        span = min(len(edge), length - position) // _TOKEN_BYTES
        matched = _shared_tokens(edge, tokens, position, span) * _TOKEN_BYTES
        if position + matched == length:  # the prompt ends inside this edge: already present
            return length // _TOKEN_BYTES
        middle = _Node(edge[:matched])  # split the edge where the prompt leaves it
        child.edge = edge[matched:]
        middle.children[child.edge[:_TOKEN_BYTES]] = child
        node.children[key] = middle
        rest = position + matched
        middle.children[tokens[rest : rest + _TOKEN_BYTES]] = _Node(tokens[rest:])
        return rest // _TOKEN_BYTES
    return length // _TOKEN_BYTES


def longest_cached_prefixes(requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray]:
    """``(lcp, lengths)`` per request in arrival order (stable), int64, shape (num_requests,).

    ``lcp[i]`` is the longest token prefix request i shares with an earlier request of its salt.
    The tree's edges are bytes (4 per token), so a step costs a dict lookup and a prefix test in C,
    ~1 us for a tiny prompt where numpy on 10-token arrays cost ~10.
    """
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    roots: dict[str, _Node] = {}
    lcp = np.zeros(len(requests), dtype=np.int64)
    lengths = np.zeros(len(requests), dtype=np.int64)
    for slot, index in enumerate(order):
        request = requests[index]
        root = roots.setdefault(request.salt or "", _Node(b""))  # None: public
        lcp[slot] = _match_and_insert(root, np.asarray(request.token_ids, dtype=np.uint32).tobytes())
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
    return ReuseBreakdown(
        block_size,
        int(lengths.sum()),
        int(lcp.sum()),
        int((lcp // block_size * block_size).sum()),
        int((capped // block_size * block_size).sum()),
    )
