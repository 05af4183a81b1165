"""``--client lean|sdk``: how the HTTP backend reads a stream's body (its own module so that the CLI's
option and config import it without importing the openai SDK)."""

from __future__ import annotations

from enum import Enum


class ClientKind(str, Enum):
    """``lean`` (default): raw server-sent events, ``json.loads`` of each chunk, only the fields kvbench
    records read (:mod:`kvbench.backends.openai.sse`); ``sdk``: the openai SDK's stream of pydantic
    chunk objects, kept for comparison (it costs ~0.1-1.5 ms per chunk, which caps the
    client's request rate). Both send the request through the SDK and build the record with
    :class:`kvbench.backends.openai.reading.StreamReading`, so their records are the same."""

    LEAN = "lean"
    SDK = "sdk"
