"""Several real endpoints behind one client-side router: ``kvbench run --base-url A --base-url B
--route P``.

Every request is routed by one of :mod:`kvbench.route.policies` (the same objects ``kvbench route``
simulates with), seeing the request's session, its prompt's chained block keys (computed here from
the locally rendered token ids, ``block_size`` tokens per block) and each endpoint's load: the
requests this client has in flight there. The record says which endpoint served it
(``replica``, the index into the ``--base-url`` list, a Parquet column).
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


class RoutedBackend:
    """``backends[i]`` is endpoint i; use as ``async with`` (enters every backend that is a context)."""

    def __init__(self, backends: Sequence[Backend], policy: PolicyName | str, block_size: int = 16,
                 options: RouterOptions = RouterOptions()) -> None:
        if len(backends) < 2:
            raise ValueError("routing needs at least two endpoints")
        self.backends = list(backends)
        self.router = make_router(policy, len(backends), block_size, options)
        self.policy = PolicyName(policy).value
        self.hasher = BlockHasher(block_size)
        self.loads = [0] * len(backends)
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
        return self.router.choose(RequestView(request.session_id, prompt, request.arrival_s), list(self.loads))

    async def serve(self, request: Request) -> RequestRecord:
        replica = self.choose(request)
        self.loads[replica] += 1
        try:
            record = await self.backends[replica].serve(request)
        finally:
            self.loads[replica] -= 1
        return replace(record, replica=replica)
