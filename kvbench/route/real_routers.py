"""The real routers' cache-aware policies, as their sources decide (``kvbench route`` policies
``sglang_cache_aware`` and ``vllm_cache_aware``).

``sglang_cache_aware``: sglang-router 0.3.2, ``sgl-router/src/policies/cache_aware.rs`` with the tree
of :mod:`kvbench.route.approx_tree` over the characters of the request text. Per request:

1. Imbalanced (``max load - min load > balance_abs_threshold`` and ``max load > min load x
   balance_rel_threshold``, loads = requests in flight): the least loaded worker (first in worker
   order on ties); the tree still records the text for it.
2. Otherwise match the text: ``rate = matched characters / text characters``. Above
   ``cache_threshold``: a tenant of the node reached. At or below: the tenant whose tree holds the
   fewest characters (not the least loaded: the source calls it the most free cache).
3. The chosen worker's tree gets the text. Every ``eviction_interval_s`` (trace seconds here, wall
   seconds in the router) each tenant is trimmed to ``max_tree_size`` characters.

The text is :func:`routing_text`: for a chat request every message's content joined by one space (an
assistant turn stripped, an empty one skipped); a completion's prompt; a token-id request's ids written
in decimal and joined by spaces (the router's ``/generate`` rule). Ties (several tenants at the node
reached, or several smallest trees, as on the first request when every tree is empty) are broken in the
router by the iteration order of a per-process seeded hash map, so no model can predict them:
:meth:`choices` returns every choice the router could make, and :meth:`choose` takes the lowest index.

What 0.3.2 was seen to do (``tests/commands/test_route_matches_real_router.py``, three replicas at
concurrency 1): every request of a chat trace went to one worker, a different one from start to start,
though most requests matched under 30% of their characters and the source would send them to an empty
tree. The router registers its ``--worker-urls`` one by one in the background and creates the policy
when the first registers; the model takes the others to be no tenants of the tree until the balance
rule sends them a request (an empty routing text would pin traffic the same way at concurrency 1; the
two differ only under load, which is not checked).

``vllm_cache_aware``: vllm-router 0.1.17 renders each request to token ids on a worker (``/render``,
else ``/tokenize``) before routing; this model runs the same decision on the tree keyed by token ids
(one tree character per token), so sizes and rates count tokens. Its source was not available here to
check the rest (session keys, thresholds): it is the SGLang algorithm over tokens, unverified against
the real vllm-router.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.request import Request
from kvbench.route.approx_tree import ApproxTree, token_string
from kvbench.route.cache_aware import CacheAwareConfig, is_imbalanced
from kvbench.route.policies import RequestView, least_loaded

BALANCE, MATCH, SMALLEST = "balance", "match", "smallest-tree"


def routing_text(request: Request) -> str:
    """The text sglang-router 0.3.2 routes ``request`` by (``extract_text_for_routing`` of its chat,
    completion and generate request types in ``sgl-router/src/protocols/spec.rs``)."""
    if request.messages is not None:
        parts = []
        for message in request.messages:
            content = message.content.strip() if message.role == "assistant" else message.content
            if message.role != "assistant" or content:
                parts.append(content)
        return " ".join(parts)
    if request.prompt is not None:
        return request.prompt
    return " ".join(str(int(t)) for t in request.token_ids)


class _TreeRouter:
    """The decision shared by both routers; subclasses say what string a request is keyed by."""

    all_tenants = True  # every worker is a tenant of the tree from the start

    def __init__(self, num_replicas: int, config: CacheAwareConfig = CacheAwareConfig()) -> None:
        self.tree, self.config = ApproxTree(num_replicas, self.all_tenants), config
        self.next_eviction_s: float | None = None
        self.decisions = {BALANCE: 0, MATCH: 0, SMALLEST: 0}
        self._pending: tuple | None = None

    def key(self, request: RequestView) -> str:
        raise NotImplementedError

    def choices(self, request: RequestView, loads: Sequence[int]) -> tuple[list[int], str]:
        """Every replica the real router could pick (ascending) and why; nothing is recorded until
        :meth:`commit`."""
        self._maybe_evict(request.arrival_s)
        text = self.key(request)
        if is_imbalanced(loads, self.config):
            self._pending = (text, None)
            return [least_loaded(loads)], BALANCE
        matched, node = self.tree.match(text)
        self._pending = (text, node)
        if text and matched / len(text) > self.config.cache_threshold:
            return sorted(node.tenants), MATCH
        return self.tree.smallest(), SMALLEST

    def commit(self, request: RequestView, replica: int, why: str) -> None:
        """Record that ``request`` went to ``replica`` (the tree learns its text)."""
        text, node = self._pending
        if node is not None and replica in node.tenants:
            self.tree.touch(node, replica, request.arrival_s)
        self.tree.insert(text, replica, request.arrival_s)
        self.decisions[why] += 1

    def choose(self, request: RequestView, loads: Sequence[int]) -> int:
        options, why = self.choices(request, loads)
        self.commit(request, options[0], why)
        return options[0]

    def _maybe_evict(self, now_s: float) -> None:
        if self.next_eviction_s is None:
            self.next_eviction_s = now_s + self.config.eviction_interval_s
        while now_s >= self.next_eviction_s:
            self.tree.evict(self.config.max_tree_size_tokens)
            self.next_eviction_s += self.config.eviction_interval_s


class SglangCacheAware(_TreeRouter):
    """``sglang_cache_aware``: see the module docstring; keyed by :attr:`RequestView.text`. As observed
    of 0.3.2 (workers given with ``--worker-urls``), only the worker sent the first request is a tenant
    until the balance rule sends another one a request."""

    all_tenants = False

    def key(self, request: RequestView) -> str:
        return request.text


class VllmCacheAware(_TreeRouter):
    """``vllm_cache_aware``: see the module docstring; keyed by the prompt's token ids."""

    def key(self, request: RequestView) -> str:
        return token_string(request.token_ids) if request.token_ids is not None else request.text
