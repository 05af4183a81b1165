"""What ``kvbench serve`` answers so that it can run as one replica behind a real router.

The routers people run in front of N servers probe each worker for metadata and, for cache-aware
policies, for the prompt's token ids; a worker that answers 404 gets a degraded fleet (a model
listed as ``unknown``, a per-request fallback to ``/tokenize``). What the routers were seen to ask
(sglang-router 0.3.2 and vllm-router 0.1.17 on loopback):

==========================================  =========================================================
``GET /server_info``, ``/get_server_info``   sglang-router, at registration (``/server_info`` first,
                                             the ``get_`` name on 404): ``served_model_name`` (else
                                             ``model_path``) becomes the worker's model id. The shape
                                             is SGLang's: its server arguments, ``scheduler_info``
                                             fields, ``internal_states`` and ``version``.
``GET /model_info``, ``/get_model_info``     sglang-router, at registration: SGLang's shape
                                             (``model_path``, ``tokenizer_path``, ``is_generation``,
                                             ``model_type``, ``architectures``, ...).
``POST /v1/chat/completions/render``         vllm-router (``cache_aware``), before every request, on
``POST /v1/completions/render``              every worker: vLLM's ``GenerateRequest`` (a list of one
                                             for completions): ``token_ids``, ``sampling_params``,
                                             ``model``, ``cache_salt``, ... No request is run.
``GET|POST /flush_cache``                    SGLang's cache reset (sglang-router fans it out to every
                                             worker): the same barrier as ``/reset_prefix_cache``;
                                             answers SGLang's text, 200.
==========================================  =========================================================

Every response (the routes above, generation, errors, a guard's refusal) carries
:data:`REPLICA_HEADER` naming the replica (``--replica-id``, default ``host:port``), so a client
behind a router knows which replica served each request; both routers pass a worker's response
headers through.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from kvbench.constants import REPLICA_HEADER
from kvbench.server.body import read_body
from kvbench.server.schemas import ApiError, ChatCompletionRequest, CompletionRequest

SGLANG_FLUSHED = "Cache flushed.\nPlease check backend logs for more details.\n"  # SGLang's 200 body
SERVER_VERSION = "kvbench"  # ``version`` in /server_info: which server this is, not an SGLang release


class ReplicaHeader:
    """ASGI middleware: adds ``X-Kvbench-Replica: <replica_id>`` to every HTTP response start.
    Installed outermost, so refusals of the other middleware carry it too."""

    def __init__(self, app, replica_id: str) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.lower().encode("latin-1"), replica_id.encode("latin-1"))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


def check_replica_id(replica_id: str) -> str:
    """``replica_id`` stripped. Raises ``ValueError`` for an empty name or one an HTTP header cannot
    carry (outside printable ASCII)."""
    name = replica_id.strip()
    if not name or not all(" " <= char <= "~" for char in name):
        raise ValueError(
            f"--replica-id {replica_id!r}: must be non-empty printable ASCII (it is sent in a header)"
        )
    return name


def add_fleet_routes(app: FastAPI, service, breakpoints, replica_id: str | None) -> None:
    """Add the metadata, render and ``/flush_cache`` routes over ``service`` (an
    :class:`~kvbench.server.service.EngineService`); ``breakpoints`` is the ``/v1/messages`` cache a
    flush also clears. With ``replica_id``, every response names the replica (:class:`ReplicaHeader`)."""
    _add_sglang_routes(app, service, breakpoints, replica_id)
    _add_render_routes(app, service)
    if replica_id is not None:
        app.add_middleware(ReplicaHeader, replica_id=check_replica_id(replica_id))


def server_info(service, replica_id: str | None) -> dict[str, Any]:
    """SGLang's ``/server_info`` fields a router reads (server arguments, scheduler info, version),
    from this server's engine and cache; ``kvbench_replica_id`` names the replica."""
    config = service.engine.cache_config  # None with --cache off
    return {
        "model_path": service.model_name,
        "tokenizer_path": service.model_name,
        "served_model_name": service.model_name,
        "tp_size": 1,
        "dp_size": 1,
        "context_length": service.max_context_tokens,
        "page_size": getattr(config, "block_size", None),
        "disable_radix_cache": config is None,
        "max_total_num_tokens": config.capacity_blocks * config.block_size if config else None,
        "internal_states": [],
        "version": SERVER_VERSION,
        "kvbench_replica_id": replica_id,
    }


def model_info(service) -> dict[str, Any]:
    """SGLang's ``/model_info`` shape for the served model (type and architectures from its config)."""
    hf_config = service.engine.loaded.model.config
    return {
        "model_path": service.model_name,
        "tokenizer_path": service.model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": getattr(hf_config, "model_type", None),
        "architectures": getattr(hf_config, "architectures", None)
        or [type(service.engine.loaded.model).__name__],
    }


def _add_sglang_routes(app: FastAPI, service, breakpoints, replica_id: str | None) -> None:
    @app.get("/server_info")
    @app.get("/get_server_info")
    async def get_server_info() -> dict[str, Any]:
        return server_info(service, replica_id)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        return model_info(service)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        await service.reset_prefix_cache()
        breakpoints.clear()
        return PlainTextResponse(SGLANG_FLUSHED)


def _generate_request(service, body, token_ids) -> dict[str, Any]:
    """vLLM's ``GenerateRequest`` (``vllm/entrypoints/serve/disagg/protocol.py``) for ``body``."""
    return {
        "request_id": f"render-{uuid.uuid4().hex}",
        "token_ids": [int(t) for t in token_ids],
        "features": None,
        "sampling_params": {
            "max_tokens": body.requested_max_tokens(),
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "seed": body.seed,
            "ignore_eos": body.ignore_eos,
        },
        "model": service.model_name,
        "stream": body.stream,
        "stream_options": None,
        "cache_salt": body.cache_salt,
        "priority": 0,
        "kv_transfer_params": None,
    }


def _check_model(service, model: str) -> None:
    if model != service.model_name:
        raise ApiError(
            404,
            f"The model `{model}` does not exist (this server serves `{service.model_name}`).",
            "model",
            "model_not_found",
        )


def _add_render_routes(app: FastAPI, service) -> None:
    @app.post("/v1/chat/completions/render")
    async def render_chat(http: Request) -> dict[str, Any]:
        body = await read_body(http, ChatCompletionRequest, service.max_body_objects)
        _check_model(service, body.model)
        messages = [
            (message.role, message.text(f"messages[{index}].content"))
            for index, message in enumerate(body.messages)
        ]
        token_ids = await asyncio.to_thread(service.render_chat, messages)
        return _generate_request(service, body, token_ids)

    @app.post("/v1/completions/render")
    async def render_completion(http: Request) -> list[dict[str, Any]]:
        body = await read_body(http, CompletionRequest, service.max_body_objects)
        _check_model(service, body.model)
        prompt = body.single_prompt()
        token_ids = await asyncio.to_thread(service.render_prompt, prompt)
        return [_generate_request(service, body, token_ids)]
