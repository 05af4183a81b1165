"""Routing policies: which of N replicas serves a request.

A policy sees the request (:class:`RequestView`) and the load of every replica (requests assigned and
not finished: queued plus in service) and returns a replica index; it keeps whatever state it needs.
The same objects route the simulated replicas of ``kvbench route`` and real endpoints on the client
side. Every policy is deterministic given its seed.

* ``round-robin``: replica ``i mod N`` for the i-th request.
* ``random``: uniform, seeded.
* ``least-loaded``: the shortest queue (lowest index on ties).
* ``session``: consistent hashing of the session id on a ring (no load bound): a conversation's
  turns stay on one replica.
* ``prefix-hash``: consistent hashing of the key naming the first ``prefix_blocks`` blocks, with
  bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018):
  a replica accepts a request only while its load is below ``ceil((1 + epsilon) x (total load + 1) / N)``;
  a key whose replica is full walks the ring to the next one with room.
* ``cache-aware``: SGLang's router over block keys (:mod:`kvbench.route.cache_aware`).
* ``sglang_cache_aware`` / ``vllm_cache_aware``: the real routers' trees over request characters /
  token ids (:mod:`kvbench.route.real_routers`).
* ``consistent_hash``: vllm-router 0.1.17's (``src/policies/consistent_hash.rs``): a ring of 160 points
  per worker at ``fbi_hash("{worker url}:{i}")`` (:mod:`kvbench.route.furc`); the key is
  ``header:x-session-id:{session}`` (the header ``kvbench run`` sends; the router reads it first, then
  other session headers, then the body's ``user``), owned by the first point at or after its hash.
* ``power_of_two``: sglang-router 0.3.2's (``sgl-router/src/policies/power_of_two.rs``): two distinct
  workers drawn at random, the less loaded one (the first drawn on a tie); seeded here.
* ``kv_aware``: vllm-router 0.1.17's, reading what each replica's cache holds through its block
  events (:mod:`kvbench.route.kv_aware`).
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import numpy as np

from kvbench.cache.block_hash import PromptBlocks
from kvbench.route.furc import fbi_hash

VIRTUAL_NODES = 160  # ring points per replica (as in ketama / libketama's 160 points per server)


@dataclass(frozen=True)
class RequestView:
    """What a router may look at: the session, the prompt's blocks and keys, the arrival time (s);
    ``text``: what a text router keys on (:func:`kvbench.route.real_routers.routing_text`);
    ``token_ids``: the prompt's ids, shape (num_tokens,), or ``None``."""

    session_id: str
    prompt: PromptBlocks
    arrival_s: float
    text: str = ""
    token_ids: np.ndarray | None = None


class Router(Protocol):
    """``choose`` returns the replica index in ``[0, len(loads))`` and records the decision."""

    def choose(self, request: RequestView, loads: Sequence[int]) -> int: ...


class PolicyName(str, Enum):
    ROUND_ROBIN = "round-robin"
    RANDOM = "random"
    LEAST_LOADED = "least-loaded"
    SESSION = "session"
    PREFIX_HASH = "prefix-hash"
    CACHE_AWARE = "cache-aware"
    SGLANG_CACHE_AWARE = "sglang_cache_aware"
    VLLM_CACHE_AWARE = "vllm_cache_aware"
    CONSISTENT_HASH = "consistent_hash"
    POWER_OF_TWO = "power_of_two"
    KV_AWARE = "kv_aware"


def least_loaded(loads: Sequence[int]) -> int:
    """The index of the smallest load (lowest index on ties)."""
    return min(range(len(loads)), key=loads.__getitem__)


class RoundRobin:
    def __init__(self, num_replicas: int) -> None:
        self.num_replicas, self.next = num_replicas, 0

    def choose(self, request: RequestView, loads: Sequence[int]) -> int:
        replica, self.next = self.next, (self.next + 1) % self.num_replicas
        return replica


class RandomChoice:
    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        self.num_replicas, self.rng = num_replicas, random.Random(seed)

    def choose(self, request: RequestView, loads: Sequence[int]) -> int:
        return self.rng.randrange(self.num_replicas)


class LeastLoaded:
    def choose(self, request: RequestView, loads: Sequence[int]) -> int:
        return least_loaded(loads)


def _point(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


class HashRing:
    """A consistent-hash ring of ``num_replicas`` x ``virtual_nodes`` points. By default SHA-256 (64
    bits) of ``replica-{r}-{v}``; ``point`` and ``label`` give another ring (vllm-router's: ``fbi_hash``
    of ``{worker url}:{v}``). A key belongs to the first point at or after its own, wrapping."""

    def __init__(
        self,
        num_replicas: int,
        virtual_nodes: int = VIRTUAL_NODES,
        point: Callable[[bytes], int] | None = None,
        label: Callable[[int, int], bytes] | None = None,
    ) -> None:
        self.point = point or _point
        label = label or (lambda r, v: f"replica-{r}-{v}".encode())
        points = dict(
            (self.point(label(r, v)), r) for r in range(num_replicas) for v in range(virtual_nodes)
        )  # a later replica's equal point wins, as in a map insert
        self.positions = sorted(points)
        self.replicas = [points[p] for p in self.positions]
        self.num_replicas = num_replicas

    def walk(self, key: bytes):
        """Distinct replicas clockwise from ``key``'s point: the owner first, then the fallbacks."""
        start, seen = bisect.bisect_left(self.positions, self.point(key)), set()
        for step in range(len(self.positions)):
            replica = self.replicas[(start + step) % len(self.positions)]
            if replica not in seen:
                seen.add(replica)
                yield replica
                if len(seen) == self.num_replicas:
                    return


class SessionHash:
    def __init__(self, num_replicas: int) -> None:
        self.ring = HashRing(num_replicas)

    def choose(self, request: RequestView, loads: Sequence[int]) -> int:
        return next(self.ring.walk(request.session_id.encode()))


def load_bound(loads: Sequence[int], epsilon: float) -> int:
    """Mirrokni et al.'s capacity for the next request: ``ceil((1 + epsilon) x (sum(loads) + 1) / N)``."""
    return math.ceil((1.0 + epsilon) * (sum(loads) + 1) / len(loads))


def prefix_key(prompt: PromptBlocks, prefix_blocks: int) -> bytes:
    """The chained key of block ``min(prefix_blocks, full blocks) - 1`` (it names every block before
    it too); the namespace for a prompt shorter than one block."""
    count = min(prefix_blocks, prompt.num_full_blocks)
    return bytes(prompt.block_hashes[count - 1]) if count else b"short:" + prompt.namespace


class PrefixHashBounded:
    """``prefix-hash``: see the module docstring. ``epsilon`` 0.25 is HAProxy's ``hash-balance-factor
    125`` example (each server takes at most 125% of the average load)."""

    def __init__(self, num_replicas: int, prefix_blocks: int, epsilon: float = 0.25) -> None:
        if prefix_blocks <= 0:
            raise ValueError(f"prefix_blocks must be positive, got {prefix_blocks}")
        if not epsilon > 0:
            raise ValueError(f"epsilon must be positive, got {epsilon}")
        self.ring, self.prefix_blocks, self.epsilon = HashRing(num_replicas), prefix_blocks, epsilon

    def choose(self, request: RequestView, loads: Sequence[int]) -> int:
        bound = load_bound(loads, self.epsilon)
        for replica in self.ring.walk(prefix_key(request.prompt, self.prefix_blocks)):
            if loads[replica] + 1 <= bound:
                return replica
        raise AssertionError("unreachable: the bound leaves room on some replica")  # sum(loads) < N x bound


class ConsistentHash:
    """``consistent_hash``: see the module docstring. ``worker_urls`` name the ring's points (the
    router's own worker URLs, e.g. ``http://127.0.0.1:8001``, give its exact ring)."""

    def __init__(self, worker_urls: Sequence[str]) -> None:
        urls = list(worker_urls)
        self.ring = HashRing(
            len(urls),
            VIRTUAL_NODES,
            point=lambda key: fbi_hash(key.decode()),
            label=lambda r, v: f"{urls[r]}:{v}".encode(),
        )

    def choose(self, request: RequestView, loads: Sequence[int]) -> int:
        return next(self.ring.walk(f"header:x-session-id:{request.session_id}".encode()))


class PowerOfTwo:
    """``power_of_two``: see the module docstring (one replica: that one)."""

    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        self.num_replicas, self.rng = num_replicas, random.Random(seed)

    def choose(self, request: RequestView, loads: Sequence[int]) -> int:
        if self.num_replicas == 1:
            return 0
        first, second = self.rng.sample(range(self.num_replicas), 2)
        return second if loads[second] < loads[first] else first
