"""Per-token delivery from the in-process engine, for SSE streaming.

:meth:`HFEngine.generate` returns a whole response at once. :class:`StreamingEngine` reports each
output token as soon as the engine has it, without copying the engine's decode loop: the engine
calls ``_decode_step(token_id, ...)`` with the newest token before computing the next one, so that
call is where a token becomes known. The last token is never passed to a decode step; the caller
takes it (and any other token not yet reported) from the returned ``RequestResult``.

Until the engine grows a public per-token callback (asked for; see the ``serve`` issue), this is
the one place that relies on an engine internal. ``tests/server/test_engine_stream.py`` fails if the
hook stops firing, rather than letting streaming quietly degrade to one burst at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kvbench.engine.hf_engine import HFEngine, RequestResult, SamplingParams

OnToken = Callable[[int], None]  # called in the engine's thread with each output token id


class StreamCancelled(Exception):
    """Raised by an ``on_token`` callback to stop a request early (its client went away).

    The engine releases every pinned block on the way out; nothing of the request is cached.
    """


class StreamingEngine(HFEngine):
    """An :class:`HFEngine` whose :meth:`generate_streaming` reports tokens as they exist.

    Not thread-safe, like the engine: one request at a time (the server holds a lock around it).
    """

    _on_token: OnToken | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.config.verify:  # the cache-off reference run would report every token twice
            raise ValueError("StreamingEngine needs EngineConfig(verify=False)")

    def generate_streaming(self, token_ids: Sequence[int] | np.ndarray, sampling: SamplingParams,
                           salt: str | None, request_id: str | None, on_token: OnToken) -> RequestResult:
        """:meth:`HFEngine.generate`, calling ``on_token(token_id)`` for every output token but the
        last (in order, as soon as it is sampled). Exceptions from ``on_token`` propagate.

        Raises:
            StreamCancelled: when ``on_token`` raised it.
        """
        self._on_token = on_token
        try:
            return self.generate(token_ids, sampling, salt=salt, request_id=request_id)
        finally:
            self._on_token = None

    def _decode_step(self, token_id: int, kv_cache):  # noqa: ANN001 - the engine's own signature
        if self._on_token is not None:
            self._on_token(token_id)
        return super()._decode_step(token_id, kv_cache)
