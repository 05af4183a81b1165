"""The Anthropic Messages backend: ``kvbench run --backend anthropic`` through the official
``anthropic`` SDK (async, streamed, ``max_retries=0`` so a retry never double-counts a prompt).

* Chat traces only (the Messages API takes messages, not token ids): a leading ``system`` message
  becomes ``system``; ``user`` and ``assistant`` messages go as they are (``developer`` is sent as
  ``system`` text, ``tool`` observations as ``user``, as the trace's generators already do).
* ``cache_control: {"type": "ephemeral"}`` breakpoints (2 of the 4 allowed): after the system prompt,
  and after the last stable turn (the message before the final one), so turn k+1 reads what turn k
  wrote.
* Sampling: ``temperature`` (or ``top_p`` when set), sent in the body (SDK 2.x's ``stream()`` has no
  keyword for them).
* TTFT: from the start of the call to the first ``text_delta``; ITL: the gaps between text deltas.
* Usage (from the final message, which merges ``message_delta``'s cumulative usage): prompt tokens
  = ``input_tokens + cache_creation_input_tokens + cache_read_input_tokens``; ``cached_prompt_tokens``
  = ``cache_read_input_tokens``; ``cache_creation_input_tokens`` is its own column; output tokens =
  ``output_tokens``.
* The API key comes from ``ANTHROPIC_API_KEY`` (or ``--api-key-env``); it is never stored, printed
  or left in an error text. Failures never raise: each becomes an error row (``http_status``, one line).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import anthropic

from kvbench.backends.base import SdkClientBackend
from kvbench.backends.openai.admin import redact
from kvbench.request import Request, RequestRecord, Status

MAX_ERROR_CHARS = 300
EPHEMERAL = {"type": "ephemeral"}
ROLES = {"user": "user", "assistant": "assistant", "tool": "user"}  # system / developer go to `system`


@dataclass(frozen=True)
class AnthropicConfig:
    """Where and how to send. ``base_url`` is the API root without ``/v1`` (the SDK adds
    ``/v1/messages``); ``api_key`` is hidden from ``repr``. Raises ``ValueError`` for a bad field."""

    base_url: str
    model: str
    api_key: str = field(default="EMPTY", repr=False)
    timeout_s: float = 300.0
    temperature: float = 0.0
    top_p: float | None = None  # Anthropic advises temperature or top_p, not both
    block_size: int = 16

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base URL must start with http:// or https://, got {self.base_url!r}")
        if not self.model:
            raise ValueError("--model: the Anthropic backend needs a model name")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout must be positive, got {self.timeout_s}")


def _block(text: str, cached: bool) -> dict[str, Any]:
    return {"type": "text", "text": text, **({"cache_control": EPHEMERAL} if cached else {})}


def message_arguments(request: Request) -> dict[str, Any]:
    """``system`` and ``messages`` of one request, with the two breakpoints. Raises ``ValueError``
    for a request without messages."""
    if request.messages is None:
        raise ValueError(
            "the Anthropic backend sends chat messages; this request has none (a token-id trace)"
        )
    system = [m.content for m in request.messages if m.role in ("system", "developer")]
    turns = [m for m in request.messages if m.role not in ("system", "developer")]
    stable = len(turns) - 2  # the last stable turn: the message before the final one
    messages = [
        {"role": ROLES[m.role], "content": [_block(m.content, i == stable)]} for i, m in enumerate(turns)
    ]
    arguments: dict[str, Any] = {"messages": messages}
    if system:
        arguments["system"] = [_block("\n".join(system), True)]
    return arguments


@dataclass
class _Reading:
    start_s: float
    text_s: list[float] = field(default_factory=list)
    usage: Any = None
    http_status: int | None = None

    def served(self, request: Request, error: str | None = None) -> RequestRecord:
        times_ms = [(t - self.start_s) * 1e3 for t in self.text_s]
        usage = self.usage
        read = getattr(usage, "cache_read_input_tokens", None) if usage is not None else None
        created = getattr(usage, "cache_creation_input_tokens", None) if usage is not None else None
        prompt = (
            (usage.input_tokens + (read or 0) + (created or 0))
            if usage is not None
            else request.prompt_tokens
        )
        output = int(usage.output_tokens) if usage is not None else len(times_ms)
        ttft, e2e = (times_ms[0], times_ms[-1]) if times_ms else (None, None)
        return RequestRecord(
            status=Status.OK if error is None else Status.ERROR,
            prompt_tokens=int(prompt),
            cached_prompt_tokens=None if read is None else int(read),
            output_tokens=output,
            output_tokens_source="usage" if usage is not None else "tokenizer",
            ttft_ms=ttft,
            e2e_ms=e2e,
            itl_ms=tuple(b - a for a, b in zip(times_ms, times_ms[1:])),
            cache_creation_input_tokens=None if created is None else int(created),
            error=error,
            http_status=self.http_status,
        )


class AnthropicBackend(SdkClientBackend):
    """Serves run requests on an Anthropic Messages endpoint; use as ``async with``."""

    name = "anthropic"
    client_class = anthropic.AsyncAnthropic

    def __init__(self, config: AnthropicConfig) -> None:
        self.config = config
        self._client: anthropic.AsyncAnthropic | None = None

    async def serve(self, request: Request) -> RequestRecord:
        """Send one request and read its stream; every failure becomes an error row."""
        if self._client is None:
            raise RuntimeError("AnthropicBackend.serve outside `async with`")
        reading = _Reading(time.perf_counter())
        try:
            async with asyncio.timeout(self.config.timeout_s):
                await self._stream(request, reading)
            return reading.served(request)
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, the run goes on
            status, message = _failure(exc, self.config.timeout_s)
            reading.http_status = status if status is not None else reading.http_status
            text = redact(message, self.config.api_key).replace("\n", " ")
            return reading.served(request, error=text[:MAX_ERROR_CHARS])

    async def _stream(self, request: Request, reading: _Reading) -> None:
        config = self.config
        sampling = {"temperature": config.temperature} if config.top_p is None else {"top_p": config.top_p}
        async with self._client.messages.stream(
            model=config.model,
            max_tokens=request.max_tokens,
            extra_body=sampling,
            **message_arguments(request),
        ) as stream:
            reading.http_status = stream.response.status_code
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    reading.text_s.append(time.perf_counter())
            reading.usage = (await stream.get_final_message()).usage


def _failure(exc: Exception, timeout_s: float) -> tuple[int | None, str]:
    """``(http_status or None, one line)`` of a failed request."""
    if isinstance(exc, anthropic.APIStatusError):
        return exc.status_code, exc.message
    if isinstance(exc, (anthropic.APITimeoutError, TimeoutError)):
        return None, f"timeout: no complete response within {timeout_s:g} s"
    if isinstance(exc, anthropic.APIConnectionError):
        return None, f"connection error: {exc.__cause__ or exc.__context__ or exc}"
    return None, f"{type(exc).__name__}: {exc}"
