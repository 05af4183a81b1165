"""The FastAPI app of ``kvbench serve``: OpenAI-compatible endpoints over one :class:`EngineService`.

=============================  ====================================================================
``POST /v1/completions``       text or token-id prompt; ``stream`` (SSE) or not
``POST /v1/chat/completions``  messages rendered with the tokenizer's chat format (ChatML for cl100k)
                               (both: ``n`` choices on ``--engine paged``, streamed or not)
``GET /v1/models``             the one served model (with vLLM's ``root`` and ``max_model_len``)
``GET /health``                200 when serving (never needs the API key)
``POST /reset_prefix_cache``   drop every cached block (vLLM's endpoint) once every request submitted
                               before it has finished; later requests wait for it (both engines)
``GET|HEAD /metrics``          Prometheus text (:mod:`kvbench.server.metrics`)
``POST /tokenize``             vLLM's: prompt or messages -> ``tokens``, ``count``, ``max_model_len``
``POST /detokenize``           vLLM's: ``tokens`` -> ``prompt`` (:mod:`kvbench.server.tokenize`)
``POST /v1/messages``          Anthropic's Messages shape (:mod:`kvbench.server.messages`)
=============================  ====================================================================

Every request first passes :class:`kvbench.server.guards.Guards` (Host, API key, JSON content type, body
size). Streams (:mod:`kvbench.server.streaming`) follow OpenAI: ``data: {chunk}`` events, one per output
token (a chat stream starts with an empty assistant-role chunk, sent with the first token as vLLM does,
never before the prefill; a token that ends inside a multi-byte character carries empty text, its
character comes whole with the next), a chunk with ``finish_reason``, a usage chunk with empty
``choices`` when ``stream_options.include_usage`` is set (with vLLM's ``continuous_usage_stats``, every
chunk carries the usage so far), then ``data: [DONE]``. With vLLM's ``return_token_ids`` each token's
chunk carries ``"token_ids": [id]`` on its choice (``kvbench run --turns live`` reads them). An engine
failure after the stream started becomes a ``data: {"error": ...}`` event. Refused requests get a 4xx
error object before anything is queued: malformed JSON or fields (400, ``param`` naming the field),
unknown model (404), ``max_tokens < 1`` (400), prompt + ``max_tokens`` beyond the context (400). A
client that disconnects, streaming or not, stops its request (queued or running).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvbench.engine.engine import SamplingParams
from kvbench.request import Request as EngineRequest
from kvbench.server.body import read_body
from kvbench.server.breakpoint_cache import BreakpointCache
from kvbench.server.fleet import add_fleet_routes
from kvbench.server.guards import GuardConfig, Guards
from kvbench.server.messages import MIN_CACHE_TOKENS, add_messages_route
from kvbench.server.outcome import CLIENT_CLOSED_REQUEST, outcomes_unless_gone
from kvbench.server.schemas import (
    DEFAULT_MAX_TOKENS,
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    choices_body,
    response_body,
    usage,
)
from kvbench.server.service import EngineService
from kvbench.server.streaming import (
    ResponseHeader,
    finish_reason,
    record_usage,
    stream_events,
    stream_sample_events,
)
from kvbench.server.tokenize import add_tokenize_routes
from kvbench.server.validation import invalid_body_error


def create_app(
    service: EngineService,
    guards: GuardConfig | None = None,
    min_cache_tokens: int = MIN_CACHE_TOKENS,
    replica_id: str | None = None,
) -> FastAPI:
    """The app serving ``service``'s model behind ``guards`` (default: 32 MiB bodies, no key, any Host),
    for any ASGI server; ``/v1/messages`` (``min_cache_tokens``): :mod:`kvbench.server.messages`."""
    app = FastAPI(title="kvbench serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guards, config=guards or GuardConfig())
    _add_error_handlers(app)
    add_tokenize_routes(app, service)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": service.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "kvbench",
                    "root": service.model_name,
                    "parent": None,
                    "max_model_len": service.max_context_tokens,
                }
            ],
        }

    breakpoints = BreakpointCache(min_cache_tokens)  # /v1/messages: Anthropic's cache rules

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, Any]:
        enabled = await service.reset_prefix_cache()
        breakpoints.clear()
        return {"status": "ok", "cache_enabled": enabled}

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(service.metrics_text(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(http: Request):
        body = await read_body(http, CompletionRequest, service.max_body_objects)
        _check_model(service, body.model)
        prompt = body.single_prompt()
        return await _generate(http, service, body, lambda: service.render_prompt(prompt), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: Request):
        body = await read_body(http, ChatCompletionRequest, service.max_body_objects)
        _check_model(service, body.model)
        messages = [
            (message.role, message.text(f"messages[{index}].content"))
            for index, message in enumerate(body.messages)
        ]
        return await _generate(http, service, body, lambda: service.render_chat(messages), chat=True)

    add_messages_route(app, service, breakpoints)
    add_fleet_routes(app, service, breakpoints, replica_id)  # last: its header middleware is outermost
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal and failure as a JSON error in its route's shape (:mod:`kvbench.server.error_shapes`),
    an unexpected exception too (a 500, logged by uvicorn with its traceback)."""

    def answer(http: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(http.scope["path"]), status_code=error.status)

    @app.exception_handler(ApiError)
    async def api_error(http: Request, exc: ApiError) -> JSONResponse:
        return answer(http, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(http: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(http, invalid_body_error(exc.errors()))

    @app.exception_handler(RecursionError)
    async def too_deep(http: Request, exc: RecursionError) -> JSONResponse:
        return answer(http, ApiError(400, "the JSON body is nested too deeply"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(http: Request, exc: StarletteHTTPException) -> JSONResponse:
        return answer(http, ApiError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def failed(http: Request, exc: Exception) -> JSONResponse:
        return answer(http, ApiError(500, f"internal server error: {type(exc).__name__}: {exc}"))


def _check_model(service: EngineService, model: str) -> None:
    if model != service.model_name:
        raise ApiError(
            404,
            f"The model `{model}` does not exist (this server serves `{service.model_name}`).",
            "model",
            "model_not_found",
        )


def _sampling(body: CompletionRequest | ChatCompletionRequest, max_tokens: int) -> SamplingParams:
    """The request's sampling (its fields are range-checked by the schema). Raises ``ApiError`` (400)."""
    if max_tokens < 1:
        name = (
            "max_completion_tokens"
            if getattr(body, "max_completion_tokens", None) is not None
            else "max_tokens"
        )
        raise ApiError(400, f"{name} must be at least 1, got {max_tokens}", name)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        ignore_eos=body.ignore_eos,
    )


async def _generate(
    http: Request,
    service: EngineService,
    body: CompletionRequest | ChatCompletionRequest,
    render: Callable[[], np.ndarray],
    chat: bool,
):
    _check_n(service, body)
    requested = body.requested_max_tokens()
    if requested is not None:
        _sampling(body, requested)  # refuse a bad max_tokens before tokenizing
    token_ids = await asyncio.to_thread(render)  # off the event loop: a large prompt stalls nothing
    if requested is None:
        requested = service.default_max_tokens(len(token_ids)) if chat else DEFAULT_MAX_TOKENS
    sampling = _sampling(body, requested)
    service.check(token_ids, sampling.max_tokens, "messages" if chat else "prompt")
    request = service.request(
        token_ids,
        sampling.max_tokens,
        body.cache_salt,
        f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
    )
    header = ResponseHeader(
        chat, request.request_id, int(time.time()), service.model_name, body.return_token_ids
    )
    if body.n > 1:
        return await _respond_samples(http, service, body, request, sampling, header)
    generation = service.submit(request, sampling, body.stop_sequences)
    if body.stream:
        return StreamingResponse(
            stream_events(service, generation, header, body), media_type="text/event-stream"
        )
    results = await outcomes_unless_gone(http, [generation])
    if results is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    result = results[0]
    generation.text.finish()
    return response_body(
        chat,
        header.response_id,
        header.created,
        header.model,
        generation.text.text,
        finish_reason(service, generation, result),
        record_usage(result),
    )


def _check_n(service: EngineService, body: CompletionRequest | ChatCompletionRequest) -> None:
    """Refuse (400, ``param`` ``n``) ``n > 1`` on the copy engine (one sequence per request)."""
    if body.n > service.max_samples:
        raise ApiError(
            400,
            f"n must be 1 on --engine copy (one sequence per request; serve with --engine paged "
            f"for n > 1), got {body.n}",
            "n",
        )


async def _respond_samples(
    http: Request,
    service: EngineService,
    body: CompletionRequest | ChatCompletionRequest,
    request: EngineRequest,
    sampling: SamplingParams,
    header: ResponseHeader,
):
    """``n`` choices of one request: ``n`` parallel samples on the paged engine (one prefill, the
    prompt's blocks shared), streamed (:func:`~kvbench.server.streaming.stream_sample_events`) or
    whole. Usage as vLLM's OpenAI server counts it (``serving_completion`` / ``serving_chat``):
    ``prompt_tokens`` and ``cached_tokens`` once, ``completion_tokens`` summed over the choices."""
    generations = service.submit_samples(request, sampling, body.n, body.stop_sequences)
    if body.stream:
        return StreamingResponse(
            stream_sample_events(service, generations, header, body), media_type="text/event-stream"
        )
    results = await outcomes_unless_gone(http, generations)
    if results is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    outputs = []
    for generation, result in zip(generations, results):
        generation.text.finish()
        outputs.append((generation.text.text, finish_reason(service, generation, result)))
    first = results[0]
    usage_object = usage(
        first.prompt_tokens, sum(result.output_tokens for result in results), first.cached_prompt_tokens
    )
    return choices_body(header.chat, header.response_id, header.created, header.model, outputs, usage_object)
