"""The one backend contract: ``async serve(request) -> RequestRecord``.

Every backend (the in-process engine, an OpenAI-compatible server over HTTP) implements it; the send
loop (:mod:`kvbench.run.loop`), ``kvbench serve`` and the peer harness all call it. ``serve`` never
raises for a failed request: the failure is a record with status ``error`` and one line of text. It
may raise for a broken backend (a bug, a lost model), which stops the run after the rows so far.
"""

from __future__ import annotations

from typing import Any, Protocol, Self

from kvbench.request import Request, RequestRecord


class Backend(Protocol):
    """Serves requests; ``describe()`` gives the result columns the backend fixes for every row
    (``backend``, ``model``, ``cache_enabled``, ``cache_kind``, ``block_size``, ``capacity_blocks``)."""

    async def serve(self, request: Request) -> RequestRecord: ...

    def describe(self) -> dict[str, Any]: ...


class SdkClientBackend:
    """The ``async with`` lifecycle of a backend over a provider SDK's async client (openai,
    anthropic): the client is made on entry by :meth:`new_client` (no retries: a failed request is a
    measured failure) and closed on exit."""

    name: str  # the ``backend`` that :meth:`describe` reports
    client_class: Any  # the SDK's async client (``openai.AsyncOpenAI``, ``anthropic.AsyncAnthropic``)
    config: Any  # base_url, api_key, timeout_s, model, block_size
    _client: Any = None

    def new_client(self) -> Any:
        return self.client_class(
            base_url=self.config.base_url,
            api_key=self.config.api_key,
            max_retries=0,
            timeout=self.config.timeout_s,
        )

    def describe(self) -> dict[str, Any]:
        """The run's backend metadata: an endpoint's cache is not known from here (``None``)."""
        return {
            "backend": self.name,
            "model": self.config.model,
            "cache_enabled": None,
            "cache_kind": None,
            "block_size": self.config.block_size,
            "capacity_blocks": None,
        }

    async def __aenter__(self) -> Self:
        self._client = self.new_client()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
