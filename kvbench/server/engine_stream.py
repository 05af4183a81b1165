"""Per-token delivery from the in-process engine, for SSE streaming.

:class:`StreamingEngine` reports each output token as soon as the engine has sampled it, through
:meth:`HFEngine.generate`'s ``on_token`` callback. ``tests/server/test_engine_stream.py`` fails if
the callback stops firing, rather than letting streaming quietly degrade to one burst at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kvbench.engine.engine import HFEngine, SamplingParams
from kvbench.request import RequestRecord

OnToken = Callable[[int], None]  # called in the engine's thread with each output token id


class StreamCancelled(Exception):
    """Raised by an ``on_token`` callback to stop a request early (its client went away).

    The engine releases every pinned block on the way out; nothing of the request is cached.
    """


class StreamingEngine(HFEngine):
    """An :class:`HFEngine` whose :meth:`generate_streaming` reports tokens as they exist.

    Not thread-safe, like the engine: one request at a time (the server holds a lock around it).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.config.verify:  # the cache-off reference run would report every token twice
            raise ValueError("StreamingEngine needs EngineConfig(verify=False)")

    def generate_streaming(self, token_ids: Sequence[int] | np.ndarray, sampling: SamplingParams,
                           salt: str | None, request_id: str | None, on_token: OnToken) -> RequestRecord:
        """:meth:`HFEngine.generate`, calling ``on_token(token_id)`` for every output token, in order,
        as soon as it is sampled. Exceptions from ``on_token`` propagate.

        Raises:
            StreamCancelled: when ``on_token`` raised it.
        """
        return self.generate(token_ids, sampling, salt=salt, on_token=on_token)
