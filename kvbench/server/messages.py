"""``POST /v1/messages`` of ``kvbench serve``: the Anthropic Messages shape over the same engine.

Request: ``model``, ``max_tokens`` (required), ``system`` (a string or text blocks), ``messages``
(``user``/``assistant``, string or text-block content), ``stream``, ``temperature``, ``top_p``,
``cache_control`` (automatic caching), ``metadata`` (ignored); validated as the OpenAI routes are
(:mod:`kvbench.server.messages_schema`). A text block may carry ``cache_control: {"type":
"ephemeral", "ttl": "5m" | "1h"}``; its breakpoint is the end of the message holding it (messages are
rendered one ChatML segment each).

Usage follows Anthropic's caching rules (:mod:`kvbench.server.breakpoint_cache`): reads and writes
only at breakpoints, never a read past the last one, nothing below the minimum cacheable length
(``min_cache_tokens``, 1,024 by default as for Claude Sonnet), ``cache_creation_input_tokens`` from
the read to the last breakpoint, ``input_tokens`` the rest. The engine's own hit (its block cache
caches every full block as always) is the ``x-kvbench-cached-tokens`` header of a whole response
and ``kvbench:prefix_cache_hits_total`` at /metrics.

Streaming sends Anthropic's events: ``message_start`` (usage with the three input counts, known
before generation, and ``output_tokens`` 0),
``content_block_start``, one ``content_block_delta`` (``text_delta``) per output token,
``content_block_stop``, ``message_delta`` (stop reason and the final usage, which the SDK merges) and
``message_stop``. Errors use Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``
(:mod:`kvbench.server.error_shapes`), whatever refuses the request (a guard, validation, the model, a
failure or a stop: a 500 ``api_error``, or after the stream started an ``error`` event of that body).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvbench.engine.engine import SamplingParams
from kvbench.request import Message, RequestRecord
from kvbench.server.body import read_body
from kvbench.server.breakpoint_cache import LOOKBACK_BLOCKS, Breakpoint, BreakpointCache, CacheUsage
from kvbench.server.error_shapes import ANTHROPIC_ROUTE, error_body
from kvbench.server.messages_schema import MessagesRequest, rendered_messages
from kvbench.server.outcome import CLIENT_CLOSED_REQUEST, outcomes_unless_gone
from kvbench.server.schemas import ApiError
from kvbench.server.service import EngineService, Generation

MIN_CACHE_TOKENS = 1024  # Claude Sonnet 4.x's minimum cacheable prompt (../shared/REFERENCES.md section 6)
ENGINE_CACHED_HEADER = "x-kvbench-cached-tokens"  # the engine's real prefix-cache hit, in tokens


def _render(
    service: EngineService, messages: list[Message], marked: list[tuple[int, float]]
) -> tuple[np.ndarray, list[Breakpoint], list[int]]:
    """The prompt's ids, its breakpoints in tokens, and the message ends a read may stop at (those up
    to :data:`LOOKBACK_BLOCKS` before a breakpoint)."""
    token_ids = service.render_chat([(message.role, message.content) for message in messages])
    tokenizer = service.tokenizer
    num_generation = len(tokenizer.render_messages([]))
    ends: dict[int, int] = {}
    for index, _ in marked:
        for before in range(max(index - LOOKBACK_BLOCKS, 0), index + 1):
            if before not in ends:
                ends[before] = len(tokenizer.render_messages(messages[: before + 1])) - num_generation
    return token_ids, [Breakpoint(ends[index], ttl_s) for index, ttl_s in marked], sorted(ends.values())


def _event(kind: str, body: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **body}, ensure_ascii=False)}\n\n"


class _Exchange:
    """One request's ids, Anthropic usage, engine generation and response header (:meth:`start`)."""

    def __init__(
        self, service: EngineService, body: MessagesRequest, token_ids: np.ndarray, cache_usage: CacheUsage
    ) -> None:
        """``token_ids`` checked (:meth:`EngineService.check`); submits the request."""
        sampling = SamplingParams(
            max_tokens=body.max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
        )
        self.request = service.request(token_ids, sampling.max_tokens, None, f"msg_{uuid.uuid4().hex}")
        self.service, self.cache_usage = service, cache_usage
        self.generation: Generation = service.submit(self.request, sampling)

    @classmethod
    async def start(cls, service: EngineService, body: MessagesRequest, cache: BreakpointCache) -> _Exchange:
        """Check, render (off the event loop, as the OpenAI routes do), account in ``cache`` and
        submit ``body``. Raises ``ApiError`` (404 for another model, 400 for the rest)."""
        if body.model != service.model_name:
            raise ApiError(
                404,
                f"model: {body.model} (this server serves {service.model_name})",
                "model",
                "model_not_found",
            )
        messages, marked = rendered_messages(body)
        token_ids, breakpoints, boundaries = await asyncio.to_thread(_render, service, messages, marked)
        # refused before it counts as a write
        service.check(token_ids, body.max_tokens, prompt_param="messages")
        return cls(service, body, token_ids, cache.account(token_ids, breakpoints, boundaries))

    def usage(self, output_tokens: int) -> dict[str, int]:
        return {**asdict(self.cache_usage), "output_tokens": output_tokens}

    def message(self, content: list[dict[str, Any]], stop_reason: str | None, usage: dict[str, int]) -> dict:
        return {
            "id": self.request.request_id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self.service.model_name,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }

    def stop_reason(self, record: RequestRecord) -> str:
        ids, eos = record.output_token_ids, self.service.engine.loaded.eos_token_ids
        return (
            "end_turn" if ids and not self.generation.sampling.ignore_eos and ids[-1] in eos else "max_tokens"
        )


async def _stream(exchange: _Exchange) -> AsyncIterator[str]:
    try:
        yield _event("message_start", {"message": exchange.message([], None, exchange.usage(0))})
        yield _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        while True:
            kind, value = await exchange.generation.events.get()
            if kind == "token":
                # UTF-8 whole
                yield _event(
                    "content_block_delta",
                    {
                        "index": 0,
                        "delta": {"type": "text_delta", "text": exchange.generation.pieces.popleft()},
                    },
                )
                continue
            if kind != "done":
                yield _event("error", error_body(ANTHROPIC_ROUTE, 500, str(value or "cancelled")))
                return
            rest = exchange.generation.text.finish()
            if rest:
                yield _event(
                    "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": rest}}
                )
            yield _event("content_block_stop", {"index": 0})
            yield _event(
                "message_delta",
                {
                    "delta": {"stop_reason": exchange.stop_reason(value), "stop_sequence": None},
                    "usage": exchange.usage(value.output_tokens),
                },
            )
            yield _event("message_stop", {})
            return
    finally:
        exchange.generation.cancel()


def add_messages_route(app: FastAPI, service: EngineService, cache: BreakpointCache) -> None:
    """Register ``POST /v1/messages`` on ``app``, its usage accounted in ``cache``."""

    @app.post("/v1/messages")
    async def messages(http: Request):
        body = await read_body(http, MessagesRequest, service.max_body_objects)
        exchange = await _Exchange.start(service, body, cache)
        if body.stream:
            return StreamingResponse(_stream(exchange), media_type="text/event-stream")
        records = await outcomes_unless_gone(http, [exchange.generation])  # the OpenAI routes' wait
        if records is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        record = records[0]
        exchange.generation.text.finish()
        content = [{"type": "text", "text": exchange.generation.text.text}]
        message = exchange.message(
            content, exchange.stop_reason(record), exchange.usage(record.output_tokens)
        )
        return JSONResponse(message, headers={ENGINE_CACHED_HEADER: str(record.cached_prompt_tokens or 0)})
