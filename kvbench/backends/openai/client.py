"""The HTTP backend: any OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp, a hosted API, ``kvbench
serve``).

Each request is one streamed call through the official ``openai`` client (async, ``max_retries=0``:
a retry would hide a failure and double-count the prompt in the server's cache; kvbench retries
once itself, only a request that received no response byte, and counts it in ``num_retries``):

* chat traces (``messages``) go to ``/v1/chat/completions``; plain prompts to ``/v1/completions``;
  token-id workloads (no text) to ``/v1/completions`` with the ids as the prompt (vLLM accepts them).
* ``stream_options={"include_usage": True}``; the usage chunk gives prompt, output and cached tokens.
* The stream's body is read by the lean path by default (raw server-sent events, ``json.loads`` of the
  fields below only: :mod:`kvbench.backends.openai.sse`), or by the SDK's pydantic chunks with
  ``client=ClientKind.SDK`` (``--client sdk``); one :class:`~kvbench.backends.openai.reading.StreamReading`
  makes the record for both, so the tokens, counts and error lines are the same.
* TTFT: from the start of the call to the first chunk that carries content (a role-only first chunk
  does not count). ITL: the gaps between content chunks. A server may put several tokens in one
  chunk; then ``len(itl_ms) < output_tokens - 1`` in the row, which the summary counts.
* Output tokens: ``usage.completion_tokens`` when the server sent usage (``output_tokens_source``
  "usage"), else the local tokenizer's count of the streamed text ("tokenizer").
* ``cached_prompt_tokens``: ``usage.prompt_tokens_details.cached_tokens``; null when the server does
  not report it (vLLM only with ``--enable-prompt-tokens-details``; SGLang with ``--enable-cache-report``).
* Failures never raise: a timeout, a refused connection, a 4xx/5xx, an error event or a stream that
  ends before its ``finish_reason`` become a row with ``status`` "error", ``http_status`` (null when
  no response came) and one line of ``error``. The API key is scrubbed from every error text.

Extra body fields: ``cache_salt`` (vLLM's per-tenant cache namespace) when the run has one, and
``ignore_eos`` (vLLM/SGLang) when the run decodes exactly ``max_tokens``; a strict server (the hosted
OpenAI API) rejects both, so use ``--hygiene nonce --stop-at-eos`` there. ``OpenAIConfig.extra_body``
adds more (the peer harness sends vLLM's ``return_token_ids``).

Token ids: when a server sends them (vLLM with ``return_token_ids``: ``token_ids`` on each choice,
``prompt_token_ids`` on the first chunk, on the chunk (chat) or its choice (completions)), the record
carries ``output_token_ids`` and ``prompt_token_ids``, and a chunk with ids but no text counts as
content for TTFT and ITL. Otherwise both are ``None``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import openai

from kvbench.backends.base import SdkClientBackend
from kvbench.backends.openai.admin import redact
from kvbench.backends.openai.client_kind import ClientKind
from kvbench.backends.openai.reading import ChunkError, StreamReading
from kvbench.backends.openai.sse import HTTP_LIBRARY as httpx
from kvbench.backends.openai.sse import stream_chunks
from kvbench.constants import REPLICA_HEADER
from kvbench.request import CONNECTION_ERROR, NOTHING_SENT, Request, RequestRecord
from kvbench.workloads.tokenizer import Tokenizer

MAX_ERROR_CHARS = 300  # one readable line per failed request
SESSION_HEADER = "X-Session-ID"  # the session header routers hash on (vllm-router's consistent_hash)
MAX_ATTEMPTS = 2  # one retry, and only of a request that received nothing (see OpenAIBackend.serve)


@dataclass(frozen=True)
class OpenAIConfig:
    """Where and how the HTTP backend sends requests.

    Attributes:
        base_url: the API root including ``/v1`` (``http://127.0.0.1:8000/v1``).
        model: the model name sent in every request.
        api_key: sent as a bearer token; never printed, stored or put into an error (``repr`` hides it).
        timeout_s: deadline for one whole request, connection to last chunk.
        temperature / top_p / seed: sampling, sent as given (``seed`` None: not sent).
        ignore_eos: send vLLM's ``ignore_eos`` so that every response has ``max_tokens`` tokens.
        block_size: the server's cache block size as assumed for expectations (result column only).
        extra_body: more fields for every request body (e.g. ``{"return_token_ids": True}``); they
            win over the ones this client sets.
        client: how stream bodies are read (:class:`ClientKind`; the records are the same).
        headers: more HTTP headers on every request (``--header K:V``).
        session_header: the header that carries the request's session id (``X-Session-ID``, which
            vllm-router's ``consistent_hash`` reads), ``None`` for none (``--session-header none``).
        session_user: send the session id as OpenAI's ``user`` field too (vllm-router also hashes
            it); ``extra_body`` wins over it.
    """

    base_url: str
    model: str
    api_key: str = field(default="EMPTY", repr=False)
    timeout_s: float = 300.0
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = True
    block_size: int = 16  # vLLM's default
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    client: ClientKind = ClientKind.LEAN
    headers: Mapping[str, str] = field(default_factory=dict)
    session_header: str | None = SESSION_HEADER
    session_user: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "client", ClientKind(self.client))
        check_base_url(self.base_url)
        if not self.model:
            raise ValueError("model name must not be empty")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout must be positive, got {self.timeout_s}")
        if not isinstance(self.block_size, int) or self.block_size <= 0:
            raise ValueError(f"server block size must be a positive integer, got {self.block_size!r}")


def check_base_url(url: str) -> None:
    """Raise ``ValueError`` (naming ``--base-url``) unless ``url`` is an http(s) URL with a host."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"--base-url {url!r}: not an http:// or https:// URL with a host (e.g. http://127.0.0.1:8000/v1)"
        )


def _caused_by(exc: BaseException | None, kinds: tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc`` or an exception in its cause chain is one of ``kinds``."""
    for _ in range(8):
        if exc is None:
            return False
        if isinstance(exc, kinds):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def nothing_received(exc: BaseException, reading: StreamReading) -> bool:
    """The request failed on an open connection before any response byte: it closed or broke before
    a status line (``RemoteProtocolError`` "Server disconnected without sending a response",
    ``ReadError('')``, ``WriteError``), as when a server closes an idle keep-alive connection the
    client just reused (uvicorn does after 5 s). Sent again on a fresh connection. (A refused
    connection is not retried here: the same endpoint refuses again; a router sends it elsewhere.)"""
    if reading.http_status is not None or reading.content_s or not isinstance(exc, openai.APIConnectionError):
        return False
    if isinstance(exc, openai.APITimeoutError):
        return False
    return _caused_by(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError))


class _BrokenStream(Exception):
    """The stream ended without a chunk carrying ``finish_reason``, or was not a stream."""


def _check_streams(response: Any, reading: StreamReading) -> None:
    """Record the HTTP status; raise ``_BrokenStream`` when a 2xx answer is one JSON body, not an SSE
    stream (a server that does not stream this endpoint)."""
    reading.http_status = response.status_code
    reading.replica_id = response.headers.get(REPLICA_HEADER)
    content_type = response.headers.get("content-type", "")
    if content_type.startswith("application/json"):
        raise _BrokenStream(
            "the server answered the stream request with one JSON body (Content-Type "
            f"{content_type}), not an SSE stream: it does not stream this endpoint"
        )


def _cause_text(exc: BaseException) -> str:
    """The innermost non-empty description of a connection failure (httpx errors often have an empty
    message: then the exception's type names what happened, e.g. ``RemoteProtocolError``)."""
    texts = []
    while exc is not None and len(texts) < 8:
        texts.append(str(exc).strip() or type(exc).__name__)
        exc = exc.__cause__ or exc.__context__
    meaningful = [t for t in texts if t not in ("Connection error.", "APIConnectionError")]
    return (meaningful or texts)[-1] if meaningful else "the connection failed with no reason given"


class OpenAIBackend(SdkClientBackend):
    """Serves run requests on an OpenAI-compatible endpoint. Use as ``async with``: the client
    lives on the event loop that runs the requests.

    Args:
        config: endpoint, model, key, timeout, sampling.
        tokenizer: counts output tokens when the server sends no usage.
        run_salt: the run's ``cache_salt`` (cache hygiene), or ``None`` to send only the trace's.
    """

    name = "openai"
    client_class = openai.AsyncOpenAI

    def __init__(self, config: OpenAIConfig, tokenizer: Tokenizer, run_salt: str | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.run_salt = run_salt
        self._client: openai.AsyncOpenAI | None = None

    def cache_salt(self, request: Request) -> str | None:
        """The ``cache_salt`` sent: the run's and the trace's tenant salt joined by ``-`` (either alone
        if only one exists), so tenants stay apart within the run and the run apart from everything
        else. Not ``/``: vLLM 0.32 answers 400 to a salt holding ``/``, ``@``, ``\\`` or NUL."""
        parts = [part for part in (self.run_salt, request.salt) if part]
        return "-".join(parts) or None

    def request_arguments(self, request: Request) -> tuple[bool, dict[str, Any]]:
        """``(is_chat, keyword arguments for create())`` of one request."""
        config = self.config
        extra: dict[str, Any] = {}
        if (salt := self.cache_salt(request)) is not None:
            extra["cache_salt"] = salt
        if config.ignore_eos:
            extra["ignore_eos"] = True
        if config.session_user and request.session_id:
            extra["user"] = str(request.session_id)
        extra.update(config.extra_body)
        prompt = None
        if request.messages is None:
            # Python ints
            prompt = request.prompt if request.prompt is not None else request.token_ids.tolist()
            if isinstance(prompt, list):  # token ids go in extra_body, which the SDK sends as is: its
                extra.setdefault("prompt", prompt)  # argument transform walks every id (~0.2-0.4 s for
                prompt = ""  # 2k ids on a loaded 2-core machine, counted in TTFT)
        arguments: dict[str, Any] = {
            "model": config.model,
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": config.temperature,
            "top_p": config.top_p,
        }
        if config.seed is not None:
            arguments["seed"] = config.seed
        if extra:
            arguments["extra_body"] = extra
        if headers := self.headers(request):
            arguments["extra_headers"] = headers
        if request.messages is not None:
            return True, {**arguments, "messages": request.openai_messages}
        return False, {**arguments, "prompt": prompt}

    def headers(self, request: Request) -> dict[str, str]:
        """The request's extra HTTP headers: ``--header`` ones, then its session under ``session_header``."""
        headers = dict(self.config.headers)
        if self.config.session_header and request.session_id:
            headers[self.config.session_header] = str(request.session_id)
        return headers

    async def serve(self, request: Request) -> RequestRecord:
        """Send one request and read its stream; every failure becomes an error row (never raises,
        except for cancellation). A failure before any response byte (a keep-alive connection the
        server closed while idle, a refused connection) is retried once on a fresh connection, as
        httpx users expect; the record counts it (``num_retries``)."""
        if self._client is None:
            raise RuntimeError("OpenAIBackend.serve outside `async with`")
        for attempt in range(MAX_ATTEMPTS):
            reading = StreamReading(time.perf_counter())
            try:
                async with asyncio.timeout(self.config.timeout_s):
                    await self._stream(request, reading)
                return replace(reading.served(request, self.tokenizer), num_retries=attempt)
            except Exception as exc:  # noqa: BLE001 - every failure is recorded, the run goes on
                if attempt + 1 < MAX_ATTEMPTS and nothing_received(exc, reading):
                    continue
                if isinstance(exc, openai.APIStatusError):  # a refusal names its replica too
                    reading.replica_id = exc.response.headers.get(REPLICA_HEADER)
                status, message = self._describe_failure(exc)
                if status is not None:
                    reading.http_status = status
                text = redact(message, self.config.api_key).replace("\n", " ")
                return replace(
                    reading.served(request, self.tokenizer, error=text[:MAX_ERROR_CHARS]), num_retries=attempt
                )
        raise AssertionError("unreachable")  # the last attempt always returns

    async def _stream(self, request: Request, reading: StreamReading) -> None:
        chat, arguments = self.request_arguments(request)
        endpoint = self._client.chat.completions if chat else self._client.completions
        if self.config.client is ClientKind.LEAN:
            async with endpoint.with_streaming_response.create(**arguments) as response:
                _check_streams(response.http_response, reading)
                async for chunk, received_s in stream_chunks(response):
                    reading.add_data(chunk, chat, received_s)
        else:
            async with await endpoint.create(**arguments) as stream:  # closes the response on any exit
                _check_streams(stream.response, reading)
                async for chunk in stream:
                    reading.add(chunk, chat, time.perf_counter())
        if reading.finish_reason is None:
            raise _BrokenStream("the stream ended before its final chunk (no finish_reason)")

    def _describe_failure(self, exc: Exception) -> tuple[int | None, str]:
        """``(http_status or None, one-line description)`` of a failed request."""
        if isinstance(exc, openai.APIStatusError):
            return exc.status_code, exc.message  # "Error code: 500 - {body}"
        if isinstance(exc, (openai.APITimeoutError, TimeoutError)):
            return None, f"timeout: no complete response within {self.config.timeout_s:g} s"
        if isinstance(exc, openai.APIConnectionError):
            connected = not _caused_by(exc, (httpx.ConnectError,))
            return None, f"{CONNECTION_ERROR if connected else NOTHING_SENT}: {_cause_text(exc)}"
        if isinstance(exc, openai.APIError):
            return None, f"error event in the stream: {exc.message}"
        if isinstance(exc, (_BrokenStream, ChunkError)):
            return None, str(exc)
        return None, f"{type(exc).__name__}: {exc}"
