"""The two types that cross module boundaries: :class:`Request` (what is sent) and
:class:`RequestRecord` (what came back).

A request has one shape from its source (a scenario's generator, a kvbench trace line, a Mooncake
line) through the simulator, the send loop and every backend; a backend answers with one record; the
results writer alone turns ``(run, request, record)`` into a Parquet row
(:mod:`kvbench.results.rows`). Nothing copies fields from one request type into another.

Units: times in a record are milliseconds (``_ms``) from the start of service; ``arrival_s``,
``sent_s`` and ``ended_s`` are seconds (from the start of the trace / of the run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class Message:
    """One chat message (OpenAI format). ``role`` is one of :data:`MESSAGE_ROLES`.

    Raises:
        ValueError: unknown role, or content that is not a string.
    """

    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in MESSAGE_ROLES:
            raise ValueError(f"role must be one of {', '.join(MESSAGE_ROLES)}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise ValueError(f"content must be a string, got {type(self.content).__name__}")

    def as_dict(self) -> dict[str, str]:
        """``{"role": ..., "content": ...}``, what OpenAI-style APIs and chat templates take."""
        return {"role": self.role, "content": self.content}


class Phase(str, Enum):
    """Which part of a run a request belongs to. Warm-up rows are kept but never summarized."""

    WARMUP = "warmup"
    MEASURE = "measure"


class Status(str, Enum):
    """``error``: the request did not complete; :attr:`RequestRecord.error` says why in one line."""

    OK = "ok"
    ERROR = "error"


@dataclass(frozen=True, eq=False)
class Request:
    """One request, from source to backend.

    Attributes:
        index: position in the trace (0-based); the send loop keeps trace order.
        request_id: unique within the trace; session_id: the conversation / agent / request it
            belongs to; turn: 0-based position in its session (turn k+1's prompt extends turn k's).
        token_ids: the rendered prompt, shape (num_tokens,), uint32.
        arrival_s: earliest send time, seconds from the start of the trace.
        max_tokens: the output budget, positive.
        salt: tenant salt (a cache namespace, never part of the text); ``None`` = the run's.
        output_tokens: the real output length when the source knows it (1..max_tokens), else ``None``.
        messages / prompt: the text form for backends that send text (chat messages, or a plain
            prompt); both ``None`` for token-id sources (sent as token ids).
        expected_cached_tokens: what the simulator predicts for this request (``kvbench.sim.predict``),
            filled in before sending; ``None`` when unknown.
    """

    index: int
    request_id: str
    session_id: str
    turn: int
    token_ids: np.ndarray = field(repr=False)
    arrival_s: float = 0.0
    max_tokens: int = 64
    salt: str | None = None
    output_tokens: int | None = None
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    expected_cached_tokens: int | None = None

    @property
    def num_tokens(self) -> int:
        """Prompt length in tokens."""
        return int(self.token_ids.shape[0])

    prompt_tokens = num_tokens

    @property
    def arrival_ms(self) -> float:
        return self.arrival_s * 1e3

    @property
    def has_text(self) -> bool:
        """Whether the request can be sent as text (chat messages or a prompt)."""
        return self.messages is not None or self.prompt is not None

    @property
    def openai_messages(self) -> list[dict[str, str]] | None:
        """The ``messages`` list for ``/v1/chat/completions``, or ``None``."""
        return None if self.messages is None else [m.as_dict() for m in self.messages]


CONNECTION_ERROR = "connection error"  # how a backend's error text starts when no connection was made
NOT_SENT = "not sent"  # how the send loop's error text starts for requests it gave up on
NOTHING_SENT = f"{CONNECTION_ERROR}: nothing sent"  # no connection was made: safe to send elsewhere


@dataclass(frozen=True)
class RequestRecord:
    """What a backend reports for one request; the send loop adds when and in which phase it ran.

    Attributes:
        status / error: ``error`` carries one line when the request did not complete.
        prompt_tokens: the prompt length (the server's count where it reports one).
        cached_prompt_tokens: the part served from the prefix cache (``cached_tokens``);
            ``None`` where the server did not say.
        output_tokens: tokens generated; ``output_tokens_source`` says who counted them:
            ``engine``, ``usage`` (the server's usage) or ``tokenizer`` (counted here from text).
        output_token_ids: the generated ids, EOS included when it ended the response; ``None``
            where the backend sees only text.
        prompt_token_ids: the ids the server says it prefilled (vLLM ``return_token_ids``), else ``None``.
        output_text: the reply's text as streamed (HTTP backends; ``kvbench run --turns live`` feeds
            it into the session's next turn), else ``None``.
        ttft_ms: start of service to the first output token; itl_ms: gaps between output tokens;
            e2e_ms: start of service to the last token (TPOT is the property :attr:`tpot_ms`).
        prefill_ms / lookup_ms / kv_load_ms / insert_ms: engine timings, ``None`` where unknown:
            the forward over the uncached tail; hashing + cache lookup; gathering hit blocks into
            the KV; copying and inserting new blocks after the last token (not in ``e2e_ms``).
        num_inserted_blocks: blocks the request newly stored (engine only).
        host_cached_tokens: of ``cached_prompt_tokens``, those loaded from the paged engine's host KV
            tier (``--host-tier``); ``None`` without one.
        cache_creation_input_tokens: prompt tokens the server says it wrote to its cache (Anthropic's
            usage field; ``None`` where the server does not report it).
        replica: which of several ``--base-url`` endpoints served it (0-based), ``None`` with one.
        replica_id: the name the answering server gave itself in its ``X-Kvbench-Replica`` response
            header (``kvbench serve --replica-id``; behind a router, the replica the router chose);
            ``None`` when the response carried none.
        num_retries: attempts beyond the first (HTTP backends): a failure before any response byte
            was retried, on the same endpoint or, routed, on another one.
        http_status: the HTTP status of an HTTP backend's response.
        output_matches_reference: with verification: output equal to a cache-off run's?
        phase / queue_ms / sent_s / ended_s: set by the send loop: the phase, the wait from the
            request being due (or taken by a client) to its service starting, and the service window
            in seconds from the run's start.
        due_s: set by the send loop: when the request was due (open loop, trace replay) or taken by a
            client (closed loop), seconds from the run's start; ``sent_s - due_s`` is the replay lag.
    """

    status: Status
    prompt_tokens: int
    cached_prompt_tokens: int | None = None
    output_tokens: int = 0
    output_tokens_source: str = "engine"
    output_token_ids: tuple[int, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    output_text: str | None = None
    ttft_ms: float | None = None
    itl_ms: tuple[float, ...] = ()
    e2e_ms: float | None = None
    prefill_ms: float | None = None
    lookup_ms: float | None = None
    kv_load_ms: float | None = None
    insert_ms: float | None = None
    num_inserted_blocks: int = 0
    cache_creation_input_tokens: int | None = None
    host_cached_tokens: int | None = None
    replica: int | None = None
    replica_id: str | None = None
    num_retries: int = 0
    error: str | None = None
    http_status: int | None = None
    output_matches_reference: bool | None = None
    phase: Phase = Phase.MEASURE
    queue_ms: float = 0.0
    sent_s: float | None = None
    ended_s: float | None = None
    due_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first: ``(e2e_ms - ttft_ms) / (output_tokens - 1)``, vLLM's
        definition (``vllm bench serve``); ``None`` with fewer than 2 output tokens or no token times."""
        if self.ttft_ms is None or self.e2e_ms is None or self.output_tokens < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)

    @property
    def is_connection_failure(self) -> bool:
        """No HTTP response came because the connection failed (refused, reset, unknown host): the
        error text starts with :data:`CONNECTION_ERROR`, as backends write it."""
        return (
            self.status is Status.ERROR
            and self.http_status is None
            and (self.error or "").startswith(CONNECTION_ERROR)
        )

    @property
    def nothing_sent(self) -> bool:
        """A connection failure before any byte of the request went out (refused, unknown host): the
        error text starts with :data:`NOTHING_SENT`. Sending it elsewhere cannot count it twice."""
        return self.is_connection_failure and (self.error or "").startswith(NOTHING_SENT)

    @classmethod
    def failed(cls, prompt_tokens: int, error: str, http_status: int | None = None) -> RequestRecord:
        """A record for a request that did not complete."""
        return cls(Status.ERROR, prompt_tokens, error=error, http_status=http_status)
