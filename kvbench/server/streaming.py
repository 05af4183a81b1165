"""The SSE events of a streamed ``kvbench serve`` completion or chat completion, one choice or ``n``.

OpenAI's shape, as vLLM streams it: ``data: {chunk}`` events, one per output token, a chat stream's
role chunk sent with its first token (never before the prefill), a chunk with ``finish_reason``, a
usage chunk when ``stream_options.include_usage`` is set, then ``data: [DONE]``; an engine failure
after the stream started is one ``data: {"error": ...}`` event. The routes are
:mod:`kvbench.server.app`'s; :func:`finish_reason` and :func:`record_usage` serve its whole responses
too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from kvbench.request import RequestRecord
from kvbench.server.schemas import ApiError, ChatCompletionRequest, CompletionRequest, chunk_body, usage
from kvbench.server.service import EngineService, Generation


class ResponseHeader:
    """What every chunk of one response repeats."""

    def __init__(
        self, chat: bool, response_id: str, created: int, model: str, token_ids: bool = False
    ) -> None:
        self.chat, self.response_id, self.created, self.model = chat, response_id, created, model
        self.token_ids = token_ids  # vLLM's return_token_ids: each token chunk's choice has [its id]

    def chunk(self, text: str | None, token_id: int | None = None, **kwargs: Any) -> str:
        body = chunk_body(self.chat, self.response_id, self.created, self.model, text, **kwargs)
        if self.token_ids and token_id is not None:
            body["choices"][0]["token_ids"] = [token_id]
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


class _Chunks:
    """The chunks one streamed response sends for its choices' roles and tokens: the usage the client
    asked for (``include_usage``; running totals on every chunk with ``continuous_usage``) and the
    output tokens sent so far over every choice."""

    def __init__(
        self, header: ResponseHeader, body: CompletionRequest | ChatCompletionRequest, num_prompt: int
    ):
        self.header, self.num_prompt, self.num_sent = header, num_prompt, 0
        self.include_usage = body.include_usage
        self.continuous = body.include_usage and body.continuous_usage

    def running_usage(self) -> dict[str, Any] | None:
        """vLLM's ``continuous_usage_stats`` usage so far, when asked for."""
        return _running_usage(self.num_prompt, self.num_sent) if self.continuous else None

    def chunk(self, text: str | None, token_id: int | None = None, **kwargs: Any) -> str:
        """A chunk of choice ``index`` (kwargs) with the usage asked for."""
        return self.header.chunk(text, token_id, include_usage=self.include_usage, **kwargs)

    def role(self, index: int) -> str:
        """A chat choice's role chunk (sent with its first token, never before the prefill)."""
        return self.chunk("", first=True, index=index, usage_object=self.running_usage())

    def token(self, generation: Generation, token_id: int, index: int) -> str:
        """The chunk of the next output token of ``generation`` (choice ``index``)."""
        self.num_sent += 1
        return self.chunk(
            generation.pieces.popleft(), token_id, index=index, usage_object=self.running_usage()
        )


async def stream_events(
    service: EngineService,
    generation: Generation,
    header: ResponseHeader,
    body: CompletionRequest | ChatCompletionRequest,
) -> AsyncIterator[str]:
    """The SSE events of one streamed response; cancels the request if the client goes away. Token
    events reach the queue before the ``done`` event (both go through the loop's FIFO of callbacks)."""
    chunks = _Chunks(header, body, int(generation.request.token_ids.shape[0]))
    role_due = header.chat  # the role chunk goes out with the first token, as vLLM's (never before prefill)
    try:
        while True:
            kind, value = await generation.events.get()
            if role_due and kind in ("token", "done"):
                role_due = False
                yield chunks.role(0)
            if kind == "token":
                yield chunks.token(generation, value, 0)
                continue
            if kind != "done":
                yield _error_event(value)
                break
            rest = generation.text.finish()
            final_usage = record_usage(value)
            yield chunks.chunk(
                rest,
                finish_reason=finish_reason(service, generation, value),
                usage_object=final_usage if chunks.continuous else None,
            )
            if chunks.include_usage:
                yield header.chunk(None, usage_object=final_usage)
            break
        yield "data: [DONE]\n\n"
    finally:
        generation.cancel()  # a no-op once the request finished; stops the engine if the client left


async def stream_sample_events(
    service: EngineService,
    generations: list[Generation],
    header: ResponseHeader,
    body: CompletionRequest | ChatCompletionRequest,
) -> AsyncIterator[str]:
    """The SSE events of ``n`` streamed choices, interleaved as their tokens come, each chunk with its
    choice's ``index`` (OpenAI's and vLLM's shape): a chat stream opens every choice with a role chunk;
    each choice ends with its ``finish_reason`` chunk; then one usage chunk (prompt once, tokens of
    every choice) when asked for, and ``[DONE]``. Each choice's role chunk goes with its first token.
    An engine failure is one error event; a client that leaves cancels every sample."""
    merged: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()
    chunks = _Chunks(header, body, int(generations[0].request.token_ids.shape[0]))
    forwarders = [asyncio.ensure_future(_forward(i, g, merged)) for i, g in enumerate(generations)]
    results: dict[int, RequestRecord] = {}
    roles_due = set(range(len(generations))) if header.chat else set()  # each choice's, with its first token
    try:
        while len(results) < len(generations):
            index, kind, value = await merged.get()
            generation = generations[index]
            if index in roles_due and kind in ("token", "done"):
                roles_due.discard(index)
                yield chunks.role(index)
            if kind == "token":
                yield chunks.token(generation, value, index)
                continue
            if kind != "done":
                yield _error_event(value)
                break
            results[index] = value
            yield chunks.chunk(
                generation.text.finish(),
                finish_reason=finish_reason(service, generation, value),
                index=index,
                usage_object=chunks.running_usage(),
            )
        if len(results) == len(generations) and chunks.include_usage:
            first = results[0]
            yield header.chunk(
                None, usage_object=usage(first.prompt_tokens, chunks.num_sent, first.cached_prompt_tokens)
            )
        yield "data: [DONE]\n\n"
    finally:
        for generation, forwarder in zip(generations, forwarders):
            generation.cancel()  # a no-op once the sample finished; stops it if the client left
            forwarder.cancel()


async def _forward(index: int, generation: Generation, merged: asyncio.Queue[tuple[int, str, Any]]) -> None:
    """Put one sample's events on ``merged`` as ``(index, kind, value)``, up to its last (not a token)."""
    while True:
        kind, value = await generation.events.get()
        await merged.put((index, kind, value))
        if kind != "token":
            return


def _error_event(value: Any) -> str:
    """The one SSE event of an engine failure (or a cancelled request) after the stream started."""
    error = ApiError(500, str(value or "the request was cancelled"))
    return f"data: {json.dumps(error.body())}\n\n"


def _running_usage(num_prompt: int, num_sent: int) -> dict[str, Any]:
    """vLLM's ``continuous_usage_stats`` usage after ``num_sent`` output tokens."""
    return {"prompt_tokens": num_prompt, "completion_tokens": num_sent, "total_tokens": num_prompt + num_sent}


def record_usage(result: RequestRecord) -> dict[str, Any]:
    """The usage object of a finished request: prompt, output and cached tokens."""
    return usage(result.prompt_tokens, result.output_tokens, result.cached_prompt_tokens)


def finish_reason(service: EngineService, generation: Generation, result: RequestRecord) -> str:
    """``stop`` when the response ended at a stop string or an EOS the request did not ignore, else
    ``length``."""
    ids = result.output_token_ids
    ended_by_eos = (
        bool(ids) and not generation.sampling.ignore_eos and ids[-1] in service.engine.loaded.eos_token_ids
    )
    return "stop" if ended_by_eos or generation.text.stopped else "length"
