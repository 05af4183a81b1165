"""The FastAPI app of ``kvbench serve``: OpenAI-compatible endpoints over one :class:`EngineService`.

=============================  ====================================================================
``POST /v1/completions``       text or token-id prompt; ``stream`` (SSE) or not
``POST /v1/chat/completions``  messages rendered with the tokenizer's chat format (ChatML for cl100k)
``GET /v1/models``             the one served model
``GET /health``                200 when serving
``POST /reset_prefix_cache``   drop every cached block (vLLM's endpoint), after the running request
``GET /metrics``               Prometheus text (:mod:`kvbench.server.metrics`)
``POST /tokenize``, ``/detokenize``  vLLM's tokenizer routes (:mod:`kvbench.server.tokenize_routes`)
=============================  ====================================================================

Streams follow OpenAI: ``data: {chunk}`` events, one per output token (a chat stream starts with an
empty assistant-role chunk), a chunk with ``finish_reason``, a usage chunk with empty ``choices``
when ``stream_options.include_usage`` is set, then ``data: [DONE]``. With vLLM's ``return_token_ids``
each token's chunk carries ``"token_ids": [id]`` on its choice (``kvbench run --turns live`` reads them). An engine failure after the
stream started becomes a ``data: {"error": ...}`` event. Refused requests get a 4xx error object
before anything is queued: malformed JSON or fields (400), unknown model (404), ``max_tokens < 1``
(400), prompt + ``max_tokens`` beyond the context (400).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvbench.engine.engine import SamplingParams
from kvbench.request import RequestRecord
from kvbench.server.schemas import (DEFAULT_MAX_TOKENS, ApiError, ChatCompletionRequest, CompletionRequest,
                                    chunk_body, response_body, usage)
from kvbench.server.service import EngineService, Generation
from kvbench.server.tokenize_routes import add_tokenize_routes

MAX_SALT_CHARS = 1024  # vLLM's limit on cache_salt


def create_app(service: EngineService) -> FastAPI:
    """The app serving ``service``'s model. Run it with any ASGI server (``kvbench serve`` uses uvicorn)."""
    app = FastAPI(title="kvbench serve", docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": service.model_name, "object": "model", "created": 0,
                                            "owned_by": "kvbench", "max_model_len": service.max_context_tokens}]}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, Any]:
        return {"status": "ok", "cache_enabled": await service.reset_prefix_cache()}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(service.metrics_text(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        _check_model(service, body.model)
        return await _generate(service, body, service.render_prompt(body.single_prompt()), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        _check_model(service, body.model)
        token_ids = service.render_chat([(message.role, message.text()) for message in body.messages])
        return await _generate(service, body, token_ids, chat=True)

    add_tokenize_routes(app, service)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        problem = exc.errors()[0] if exc.errors() else {}
        if problem.get("type") == "json_invalid":
            return JSONResponse(ApiError(400, f"malformed JSON body: {problem.get('msg')}").body(), status_code=400)
        where = ".".join(str(part) for part in problem.get("loc", ()) if part != "body") or None
        message = f"{where}: {problem.get('msg')}" if where else str(problem.get("msg", "invalid request body"))
        return JSONResponse(ApiError(400, message, where).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(ApiError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code)


def _check_model(service: EngineService, model: str) -> None:
    if model != service.model_name:
        raise ApiError(404, f"The model `{model}` does not exist (this server serves `{service.model_name}`).",
                       "model", "model_not_found")


def _sampling(body: CompletionRequest | ChatCompletionRequest) -> SamplingParams:
    """The request's sampling. Raises ``ApiError`` (400) for fields the server cannot honour."""
    if body.n != 1:
        raise ApiError(400, f"n must be 1 (one choice per request), got {body.n}", "n")
    if body.stop:
        raise ApiError(400, "stop sequences are not supported by kvbench serve", "stop")
    max_tokens = body.requested_max_tokens()
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    if body.cache_salt is not None and len(body.cache_salt) > MAX_SALT_CHARS:
        raise ApiError(400, f"cache_salt must be at most {MAX_SALT_CHARS} characters", "cache_salt")
    try:
        return SamplingParams(max_tokens=max_tokens, temperature=1.0 if body.temperature is None else body.temperature,
                              top_p=1.0 if body.top_p is None else body.top_p, seed=body.seed,
                              ignore_eos=body.ignore_eos)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None


async def _generate(service: EngineService, body: CompletionRequest | ChatCompletionRequest, token_ids,
                    chat: bool):
    sampling = _sampling(body)
    service.check(token_ids, sampling.max_tokens)
    request = service.request(token_ids, sampling.max_tokens, body.cache_salt or None,
                              f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}")
    generation = service.submit(request, sampling)
    header = _Header(chat, request.request_id, int(time.time()), service.model_name, body.return_token_ids)
    if body.stream:
        return StreamingResponse(_stream(service, generation, header, body.include_usage),
                                 media_type="text/event-stream")
    try:
        result = await _outcome(generation)
    except BaseException:
        generation.cancel()
        raise
    text = service.decode(result.output_token_ids)
    return response_body(chat, header.response_id, header.created, header.model, text,
                         _finish_reason(service, generation, result), _usage(result))


class _Header:
    """What every chunk of one response repeats."""

    def __init__(self, chat: bool, response_id: str, created: int, model: str, token_ids: bool = False) -> None:
        self.chat, self.response_id, self.created, self.model = chat, response_id, created, model
        self.token_ids = token_ids  # vLLM's return_token_ids: each token chunk's choice has [its id]

    def chunk(self, text: str | None, token_id: int | None = None, **kwargs: Any) -> str:
        body = chunk_body(self.chat, self.response_id, self.created, self.model, text, **kwargs)
        if self.token_ids and token_id is not None:
            body["choices"][0]["token_ids"] = [token_id]
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _outcome(generation: Generation) -> RequestRecord:
    """Wait for the request's result. Raises ``ApiError``: 400 if the engine refused it, 500 if it failed."""
    while True:
        kind, value = await generation.events.get()
        if kind == "done":
            return value
        if kind in ("refused", "error", "cancelled"):
            raise ApiError(400 if kind == "refused" else 500, str(value or "the request was cancelled"))


async def _stream(service: EngineService, generation: Generation, header: _Header,
                  include_usage: bool) -> AsyncIterator[str]:
    """The SSE events of one streamed response; cancels the request if the client goes away."""
    num_sent = 0
    try:
        if header.chat:
            yield header.chunk("", first=True, include_usage=include_usage)
        while True:
            kind, value = await generation.events.get()
            if kind == "token":
                num_sent += 1
                yield header.chunk(service.decode_token(value), value, include_usage=include_usage)
                continue
            if kind != "done":
                message = str(value or "the request was cancelled")
                yield f"data: {json.dumps(ApiError(500, message).body())}\n\n"
                break
            for token_id in value.output_token_ids[num_sent:]:
                yield header.chunk(service.decode_token(token_id), token_id, include_usage=include_usage)
            yield header.chunk("", finish_reason=_finish_reason(service, generation, value), include_usage=include_usage)
            if include_usage:
                yield header.chunk(None, usage_object=_usage(value))
            break
        yield "data: [DONE]\n\n"
    finally:
        generation.cancel()  # a no-op once the request finished; stops the engine if the client left


def _usage(result: RequestRecord) -> dict[str, Any]:
    return usage(result.prompt_tokens, result.output_tokens, result.cached_prompt_tokens)


def _finish_reason(service: EngineService, generation: Generation, result: RequestRecord) -> str:
    """``stop`` when the response ended with an EOS the request did not ignore, else ``length``."""
    ids = result.output_token_ids
    ended_by_eos = bool(ids) and not generation.sampling.ignore_eos and ids[-1] in service.engine.loaded.eos_token_ids
    return "stop" if ended_by_eos else "length"
