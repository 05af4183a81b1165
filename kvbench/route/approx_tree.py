"""The approximate radix tree the real cache-aware routers keep, one tree for all workers (tenants).

Learned from sglang-router's ``sgl-router/src/policies/tree.rs`` (the Rust router shipped as PyPI
``sglang-router`` 0.3.2) and vllm-router's copy of it (``src/tree.rs``). The router never asks a worker
what it caches: it records what it *sent* each worker. Keys are strings; the router stores request text
characters, and :func:`token_string` turns token ids into a string of the same length so the same tree
holds tokens.

* ``insert(text, tenant)``: walk from the root, splitting an edge where the text leaves it; every node
  on the path gets ``tenant`` with the access time; a tenant's size grows by the characters of each
  node it newly holds (the root holds every tenant from the start, with size 0).
* ``match(text)``: the walk stops at the first character without a child or inside an edge (a partial
  edge still counts its shared characters); the match is the characters walked, and the candidates are
  the tenants of the node reached (a tenant on a node holds every node above it).
* ``evict(max_size)``: per tenant over ``max_size`` characters, drop its least recently used leaves
  (a node it holds with no child it holds), repeatedly, until it fits; a node no tenant holds and with
  no child is removed.

Which of several candidates the real router picks is the first key of a hash map seeded per process
(Rust's ``RandomState``), so the tree returns every candidate and the caller breaks the tie.
"""

from __future__ import annotations

import heapq

import numpy as np


def shared_prefix(a: str, b: str) -> int:
    """Length of the common prefix of ``a`` and ``b`` (characters), by halving with C comparisons."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def token_string(token_ids: np.ndarray) -> str:
    """Token ids as a string of one character per token (code point = id), so a character tree keys
    tokens. Raises ``ValueError`` for an id above U+10FFFF (no such vocabulary exists here)."""
    ids = np.asarray(token_ids, dtype=np.uint32)
    if ids.size and int(ids.max()) > 0x10FFFF:
        raise ValueError(f"token id {int(ids.max())} does not fit one character")
    return ids.astype("<u4").tobytes().decode("utf-32-le", errors="surrogatepass")


class _Node:
    __slots__ = ("text", "children", "tenants", "parent")

    def __init__(self, text: str, parent: _Node | None, tenants: dict[int, float]) -> None:
        self.text, self.parent, self.tenants = text, parent, tenants
        self.children: dict[str, _Node] = {}


class ApproxTree:
    """The tree over ``num_tenants`` tenants (replica indexes); ``sizes[t]`` = characters ``t`` holds.
    ``all_tenants=False`` starts with no tenant: a replica becomes one when it is first sent a request,
    and until then the smallest-tree rule does not see it."""

    def __init__(self, num_tenants: int, all_tenants: bool = True) -> None:
        known = range(num_tenants) if all_tenants else ()
        self.root = _Node("", None, {t: 0.0 for t in known})
        self.sizes = [0] * num_tenants

    def _hold(self, node: _Node, tenant: int, now: float) -> None:
        if tenant not in node.tenants:
            self.sizes[tenant] += len(node.text)
        node.tenants[tenant] = now

    def insert(self, text: str, tenant: int, now: float) -> None:
        node, i = self.root, 0
        node.tenants[tenant] = now
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                leaf = _Node(text[i:], node, {})
                node.children[text[i]] = leaf
                self._hold(leaf, tenant, now)
                return
            shared = shared_prefix(child.text, text[i:])
            if shared < len(child.text):  # split: node -> head (shared part) -> child (the rest)
                head = _Node(child.text[:shared], node, dict(child.tenants))
                child.text, child.parent = child.text[shared:], head
                head.children[child.text[0]] = child
                node.children[text[i]] = head
                child = head
            self._hold(child, tenant, now)
            node, i = child, i + shared

    def match(self, text: str) -> tuple[int, _Node]:
        """``(matched characters, node reached)``; the node's ``tenants`` are the candidates."""
        node, i = self.root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            shared = shared_prefix(child.text, text[i:])
            node, i = child, i + shared
            if shared < len(child.text):
                break
        return i, node

    def touch(self, node: _Node, tenant: int, now: float) -> None:
        """Refresh ``tenant``'s access time from ``node`` up to the root (what a match does)."""
        while node is not None:
            node.tenants[tenant] = now
            node = node.parent

    def smallest(self) -> list[int]:
        """Every tenant with the fewest characters (the router picks one of them by hash-map order);
        every replica while there is no tenant yet."""
        tenants = sorted(self.root.tenants) or range(len(self.sizes))
        low = min(self.sizes[t] for t in tenants)
        return [t for t in tenants if self.sizes[t] == low]

    @staticmethod
    def _leaf_tenants(node: _Node) -> set[int]:
        below = set()
        for child in node.children.values():
            below.update(child.tenants)
        return set(node.tenants) - below

    def evict(self, max_size: int) -> None:
        """Trim every tenant to ``max_size`` characters, least recently used leaves first."""
        heap: list[tuple[float, int, int, _Node]] = []
        stack, order = [self.root], 0
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant in self._leaf_tenants(node):
                heap.append((node.tenants[tenant], order, tenant, node))
                order += 1
        heapq.heapify(heap)
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if self.sizes[tenant] <= max_size or tenant not in node.tenants or node is self.root:
                continue
            self.sizes[tenant] -= len(node.text)
            del node.tenants[tenant]
            parent = node.parent
            if not node.children and not node.tenants:
                del parent.children[node.text[0]]
            if tenant in self._leaf_tenants(parent) and parent is not self.root:
                heapq.heappush(heap, (parent.tenants[tenant], order, tenant, parent))
                order += 1
