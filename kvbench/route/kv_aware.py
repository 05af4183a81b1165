"""``kv_aware``: a router that reads what each replica's cache holds, as vllm-router 0.1.17's ``kv_aware``
policy does from its workers' KV cache events (``src/policies/kv_aware.rs``, ``src/kv_index/``).

The simulated replicas tell it their blocks through the one event path kvbench has: each replica's
cache gets an :class:`~kvbench.events.source.EventListener` (the listener ``kvbench serve
--kv-events`` publishes through), whose wire events feed that replica's
:class:`~kvbench.events.blockmap.ReplicaBlocks`, a block map by content key. Per request:

1. the request's full blocks become chained content keys (:func:`prompt_content_keys`, the keys the
   map gives the same blocks; the router hashes the token ids of the whole prompt the same way);
2. each replica scores the longest contiguous run of those keys, from block 0, that it holds
   (vllm-router's ``PrefixScorer``: a gap ends the run);
3. the highest score wins; among equal scores the least loaded replica, then the **first** in the
   router's worker order. With no block held anywhere (score 0 everywhere) that is the least loaded
   replica, the first of equal loads; a prompt shorter than one block goes there too.

Tie order, measured (``tests/fleet/test_kv_aware_router.py``: three ``kvbench serve`` replicas
warmed directly, then probed through vllm-router 0.1.17 at concurrency 1): every tie between replicas
holding the same prefix, and every request held nowhere, went to the replica listed first by the
router's ``GET /list_workers``, an order that changes from one router start to the next (once the
reverse of ``--worker-urls``). The router's published ``kv_aware.rs`` (``max_by_key`` over the score,
then ``min_by_key`` over the load for a score of 0) would send ties to the last worker and misses to
the first, two different replicas; 0.1.17 does not. Its tie rule between equal scores under unequal
loads is not measured here: least loaded first is this model's choice. Under load 0.1.17 also trades
cached blocks against load, which this model does not: a ``kvbench fleet`` run at concurrency 4
(docs/fleet.md) spread over three replicas (7, 8, 7) a trace whose every request began with a system
prompt held on one of them, where the score alone keeps every request there. Exact at concurrency 1,
an approximation above.

What is modelled and what is not. The events of a request's step reach the map before the next
request is routed: the router sees every block a replica stored or evicted, in order (a block past
its TTL when the replica's cache next steps, as a lazily sweeping server would publish it). A real
server publishes them during the prefill, within milliseconds, before the response that lets a
client at concurrency 1 send its next request. Between a decision and those events the published
source holds *speculative* entries (2 s) for the blocks its pick does not yet hold: the blocks a
simulated step stores at once, so a model with instant events already has them (0.1.17's binary
names no speculative entries; what it holds meanwhile is not known here). Left out: a request with
a ``cache_salt``, whose placement lookup 0.1.17 skips (``kvbench fleet`` sends none: nonce hygiene;
the model scores content, salts are no part of it); tiers other than the GPU's (every simulated
block is there); session affinity (off by default in 0.1.17). Only a cache that publishes block
events can be read: the hash cache (``--cache hash``), not the radix cache.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.errors import InputError
from kvbench.events.blockmap import ReplicaBlocks, prompt_content_keys
from kvbench.events.wire import Batch, Event
from kvbench.route.policies import RequestView, least_loaded

HELD, NO_HIT, SHORT = "held prefix", "no hit", "short prompt"  # the decisions counted


class KvAware:
    """``kv_aware``: see the module docstring. :meth:`attach` before the first :meth:`choose`;
    ``decisions`` counts the requests per rule; :meth:`scores` gives every replica's score."""

    def __init__(self, num_replicas: int, block_size: int) -> None:
        self.block_size = block_size
        self.maps = [ReplicaBlocks(f"replica-{r}") for r in range(num_replicas)]
        self._pending: list[list[Event]] = [[] for _ in range(num_replicas)]
        self._num_batches = [0] * num_replicas
        self.decisions = {HELD: 0, NO_HIT: 0, SHORT: 0}

    def attach(self, caches: Sequence[object]) -> None:
        """Listen to ``caches`` (replica ``r``'s is ``caches[r]``): each gets an
        :class:`EventListener` whose events wait for the next routing decision.

        Raises:
            InputError: a cache publishes no block events (the radix cache).
        """
        from kvbench.events.source import EventListener  # imports zmq (its publisher): only when used

        if len(caches) != len(self.maps):
            raise ValueError(f"{len(caches)} caches for {len(self.maps)} replicas")
        for cache, pending in zip(caches, self._pending):
            if not hasattr(cache, "listener"):
                raise InputError(
                    f"--policy kv_aware reads each replica's cache through its block events; the "
                    f"{type(cache).__name__} publishes none (use --cache hash)"
                )
            cache.listener = EventListener(pending.append, self.block_size)

    def _apply_pending(self, now_s: float) -> None:
        """Every replica's events since the last decision, as one batch (the router indexes a
        publisher's batches as they come)."""
        for replica, events in enumerate(self._pending):
            if events:
                batch = Batch(now_s, tuple(events))
                self.maps[replica].apply(self._num_batches[replica], batch, now_s)
                self._num_batches[replica] += 1
                events.clear()

    def scores(self, request: RequestView) -> list[int]:
        """Per replica, the leading blocks of ``request``'s prompt it holds now.

        Raises:
            ValueError: the prompt kept no token ids (a trace prepared without ``keep_tokens``).
        """
        self._apply_pending(request.arrival_s)
        keys = prompt_content_keys(self._block_tokens(request))
        return [blocks.prefix_length(keys) for blocks in self.maps]

    def _block_tokens(self, request: RequestView) -> Sequence[bytes]:
        prompt = request.prompt
        if prompt.block_tokens is None:
            raise ValueError("kv_aware needs the prompt's token ids (prepare_route_trace(keep_tokens=True))")
        return prompt.block_tokens

    def choose(self, request: RequestView, loads: Sequence[int]) -> int:
        scores = self.scores(request)
        if not request.prompt.num_full_blocks:
            self.decisions[SHORT] += 1
            return least_loaded(loads)
        self.decisions[HELD if max(scores) else NO_HIT] += 1
        return min(range(len(scores)), key=lambda r: (-scores[r], loads[r]))  # min: the first of equals
