"""Several real endpoints behind one client-side router: ``kvbench run --base-url A --base-url B
--route P``.

Every request is routed by one of :mod:`kvbench.route.policies` (the same objects ``kvbench route``
simulates with), seeing the request's session, its prompt's chained block keys (computed here from
the locally rendered token ids, ``block_size`` tokens per block) and each endpoint's load: the
requests this client has in flight there. The record says which endpoint served it
(``replica``, the index into the ``--base-url`` list, a Parquet column).

A dead endpoint (with one of two replicas killed, 48 of 120 requests once failed, every one sent
to it) is ejected after ``EJECT_AFTER_FAILURES`` consecutive connection failures: it gets no more
traffic, and ``events`` says so. A request whose connection failed before any byte went out
(:attr:`RequestRecord.nothing_sent`) is sent to the next endpoint not yet tried and not ejected,
counted in the record's ``num_retries``. The last endpoint standing is never ejected: when it
fails too, the send loop's own limit stops the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

from kvbench.backends.base import Backend
from kvbench.cache.block_hash import BlockHasher
from kvbench.request import Request, RequestRecord
from kvbench.route.api import RouterOptions, make_router
from kvbench.route.policies import PolicyName, RequestView
from kvbench.route.real_routers import routing_text

EJECT_AFTER_FAILURES = 3  # consecutive connection failures of one endpoint; then it gets no traffic


class RoutedBackend:
    """``backends[i]`` is endpoint i; use as ``async with`` (enters every backend that is a context)."""

    def __init__(
        self,
        backends: Sequence[Backend],
        policy: PolicyName | str,
        block_size: int = 16,
        options: RouterOptions = RouterOptions(),
    ) -> None:
        if len(backends) < 2:
            raise ValueError("routing needs at least two endpoints")
        self.backends = list(backends)
        self.router = make_router(policy, len(backends), block_size, options)
        self.policy = PolicyName(policy).value
        self.hasher = BlockHasher(block_size)
        self.loads = [0] * len(backends)
        self.num_failures = [0] * len(backends)  # consecutive connection failures per endpoint
        self.ejected: set[int] = set()
        self.events: list[str] = []  # one line per ejection, for the run's notes and metadata
        self._stack: AsyncExitStack | None = None

    async def __aenter__(self) -> RoutedBackend:
        self._stack = AsyncExitStack()
        for backend in self.backends:
            if hasattr(backend, "__aenter__"):
                await self._stack.enter_async_context(backend)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None

    def describe(self) -> dict[str, Any]:
        return self.backends[0].describe()

    def choose(self, request: Request) -> int:
        """The endpoint for ``request`` under the current loads (the router records the decision)."""
        prompt = self.hasher.prompt_blocks(request.token_ids, salt=request.salt or "")
        return self.router.choose(
            RequestView(
                request.session_id, prompt, request.arrival_s, routing_text(request), request.token_ids
            ),
            list(self.loads),
        )

    def _next_live(self, replica: int, tried: set[int]) -> int | None:
        """The first endpoint from ``replica`` on (cyclically) neither ejected nor in ``tried``."""
        for step in range(len(self.backends)):
            candidate = (replica + step) % len(self.backends)
            if candidate not in self.ejected and candidate not in tried:
                return candidate
        return None

    def _count(self, replica: int, record: RequestRecord) -> None:
        """Count ``replica``'s consecutive connection failures; eject it at the limit (never the last)."""
        self.num_failures[replica] = self.num_failures[replica] + 1 if record.is_connection_failure else 0
        live = len(self.backends) - len(self.ejected)
        if self.num_failures[replica] >= EJECT_AFTER_FAILURES and replica not in self.ejected and live > 1:
            self.ejected.add(replica)
            self.events.append(
                f"replica {replica} ejected after {EJECT_AFTER_FAILURES} consecutive connection "
                f"failures (last: {record.error}); its traffic goes to the others"
            )

    async def serve(self, request: Request) -> RequestRecord:
        chosen = self.choose(request)  # once: the router records its decision
        live = self._next_live(chosen, set())  # the chosen one, or the next not ejected
        replica = chosen if live is None else live
        tried: set[int] = set()
        num_retries = 0
        while True:
            tried.add(replica)
            self.loads[replica] += 1
            try:
                record = await self.backends[replica].serve(request)
            finally:
                self.loads[replica] -= 1
            self._count(replica, record)
            num_retries += record.num_retries
            elsewhere = self._next_live(replica, tried) if record.nothing_sent else None
            if elsewhere is None:
                return replace(record, replica=replica, num_retries=num_retries + len(tried) - 1)
            replica = elsewhere
