"""``POST /v1/messages`` of ``kvbench serve``: the Anthropic Messages shape over the same engine.

Request: ``model``, ``max_tokens`` (required), ``system`` (a string or text blocks), ``messages``
(``user``/``assistant``, string or text-block content), ``stream``, ``temperature``, ``top_p``,
``metadata`` (ignored). A text block may carry ``cache_control: {"type": "ephemeral"}``; its
breakpoint is the end of the message holding it (messages are rendered one ChatML segment each).

Usage, in the Anthropic fields, over the engine's own prefix cache (which caches every full block
as it always does; the fields are what an Anthropic bill would see):

* ``cache_read_input_tokens``: the engine's hit, when it reaches the minimum cacheable length
  (``min_cache_tokens``, 1,024 by default as for Claude Sonnet); a shorter hit is reported as input;
* ``cache_creation_input_tokens``: the tokens newly cached up to the last breakpoint, i.e. from the
  hit to the breakpoint rounded down to a full block, when the breakpoint reaches the minimum; else 0;
* ``input_tokens``: the rest of the prompt.

Streaming sends Anthropic's events: ``message_start`` (usage provisional: the prompt as input),
``content_block_start``, one ``content_block_delta`` (``text_delta``) per output token,
``content_block_stop``, ``message_delta`` (stop reason and the final usage, which the SDK merges) and
``message_stop``. Errors use the server's one error shape (HTTP status and ``error.message``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from kvbench.engine.engine import SamplingParams
from kvbench.request import Message, RequestRecord
from kvbench.server.body import read_body
from kvbench.server.messages_schema import MessagesRequest, rendered_messages
from kvbench.server.outcome import CLIENT_CLOSED_REQUEST, outcomes_unless_gone
from kvbench.server.schemas import ApiError
from kvbench.server.service import EngineService, Generation

MIN_CACHE_TOKENS = 1024  # Claude Sonnet 4.x's minimum cacheable prompt (../shared/REFERENCES.md section 6)


def anthropic_usage(record: RequestRecord, breakpoint_tokens: int, block_size: int,
                    min_cache_tokens: int) -> dict[str, int]:
    """The usage object (module docstring) for one finished request."""
    hit = record.cached_prompt_tokens or 0
    read = hit if hit >= min_cache_tokens else 0
    cached_end = breakpoint_tokens // block_size * block_size
    created = max(cached_end - hit, 0) if breakpoint_tokens >= min_cache_tokens else 0
    return {"input_tokens": record.prompt_tokens - read - created, "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read, "output_tokens": record.output_tokens}


def _render(service: EngineService, messages: list[Message], marked: list[int]) -> tuple[np.ndarray, int]:
    """The prompt's ids and the last breakpoint's position in tokens (0: no breakpoint)."""
    token_ids = service.render_chat([(message.role, message.content) for message in messages])
    if not marked:
        return token_ids, 0
    tokenizer = service.tokenizer
    return token_ids, len(tokenizer.render_messages(messages[:marked[-1] + 1])) - len(tokenizer.render_messages([]))


def _event(kind: str, body: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **body}, ensure_ascii=False)}\n\n"


class _Exchange:
    """One request's ids, breakpoint, engine generation and response header (:meth:`start`)."""

    def __init__(self, service: EngineService, body: MessagesRequest, token_ids: np.ndarray,
                 breakpoint_tokens: int, min_cache_tokens: int) -> None:
        sampling = SamplingParams(max_tokens=body.max_tokens, temperature=1.0 if body.temperature is None
                                  else body.temperature, top_p=1.0 if body.top_p is None else body.top_p)
        service.check(token_ids, sampling.max_tokens, prompt_param="messages")
        self.request = service.request(token_ids, sampling.max_tokens, None, f"msg_{uuid.uuid4().hex}")
        self.service, self.min_cache_tokens, self.breakpoint_tokens = service, min_cache_tokens, breakpoint_tokens
        self.generation: Generation = service.submit(self.request, sampling)

    @classmethod
    async def start(cls, service: EngineService, body: MessagesRequest, min_cache_tokens: int) -> _Exchange:
        """Check, render (off the event loop, as the OpenAI routes do) and submit ``body``. Raises
        ``ApiError`` (404 for another model, 400 for the rest)."""
        if body.model != service.model_name:
            raise ApiError(404, f"model: {body.model} (this server serves {service.model_name})", "model",
                           "model_not_found")
        messages, marked = rendered_messages(body)
        token_ids, breakpoint_tokens = await asyncio.to_thread(_render, service, messages, marked)
        return cls(service, body, token_ids, breakpoint_tokens, min_cache_tokens)

    def usage(self, record: RequestRecord) -> dict[str, int]:
        block_size = self.service.backend.describe().get("block_size") or 16
        return anthropic_usage(record, self.breakpoint_tokens, int(block_size), self.min_cache_tokens)

    def message(self, content: list[dict[str, Any]], stop_reason: str | None, usage: dict[str, int]) -> dict:
        return {"id": self.request.request_id, "type": "message", "role": "assistant", "content": content,
                "model": self.service.model_name, "stop_reason": stop_reason, "stop_sequence": None, "usage": usage}

    def stop_reason(self, record: RequestRecord) -> str:
        ids, eos = record.output_token_ids, self.service.engine.loaded.eos_token_ids
        return "end_turn" if ids and not self.generation.sampling.ignore_eos and ids[-1] in eos else "max_tokens"


async def _stream(exchange: _Exchange) -> AsyncIterator[str]:
    provisional = {"input_tokens": int(exchange.request.num_tokens), "output_tokens": 0}
    try:
        yield _event("message_start", {"message": exchange.message([], None, provisional)})
        yield _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        while True:
            kind, value = await exchange.generation.events.get()
            if kind == "token":
                yield _event("content_block_delta", {"index": 0, "delta": {
                    "type": "text_delta", "text": exchange.generation.pieces.popleft()}})  # UTF-8 whole
                continue
            if kind != "done":
                yield _event("error", {"error": {"type": "api_error", "message": str(value or "cancelled")}})
                return
            rest = exchange.generation.text.finish()
            if rest:
                yield _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": rest}})
            yield _event("content_block_stop", {"index": 0})
            yield _event("message_delta", {"delta": {"stop_reason": exchange.stop_reason(value),
                                                     "stop_sequence": None}, "usage": exchange.usage(value)})
            yield _event("message_stop", {})
            return
    finally:
        exchange.generation.cancel()


def add_messages_route(app: FastAPI, service: EngineService, min_cache_tokens: int = MIN_CACHE_TOKENS) -> None:
    """Register ``POST /v1/messages`` on ``app``."""

    @app.post("/v1/messages")
    async def messages(http: Request):
        body = await read_body(http, MessagesRequest, service.max_body_objects)
        exchange = await _Exchange.start(service, body, min_cache_tokens)
        if body.stream:
            return StreamingResponse(_stream(exchange), media_type="text/event-stream")
        records = await outcomes_unless_gone(http, [exchange.generation])  # the OpenAI routes' wait
        if records is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        record = records[0]
        exchange.generation.text.finish()
        content = [{"type": "text", "text": exchange.generation.text.text}]
        return exchange.message(content, exchange.stop_reason(record), exchange.usage(record))
