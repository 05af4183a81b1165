"""``POST /tokenize`` and ``POST /detokenize`` on ``kvbench serve``, in vLLM's request and response shapes.

``/tokenize`` takes ``{"model"?, "prompt": str}`` (rendered as ``/v1/completions`` renders it) or
``{"model"?, "messages": [{"role", "content"}, ...]}`` (rendered as ``/v1/chat/completions`` renders
it, generation prompt included), and answers ``{"tokens": [...], "count": n, "max_model_len": m}``.
``/detokenize`` takes ``{"model"?, "tokens": [...]}`` and answers ``{"prompt": text}``. So a client
(``kvbench run --tokenizer server``) counts exactly the ids the server prefills. (A minimal pair
added for issue 13; vLLM serves the same routes at the server root.)
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from kvbench.server.schemas import ApiError
from kvbench.server.service import EngineService


class _Message(BaseModel):
    role: str
    content: str


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[_Message] | None = None
    add_special_tokens: bool = True  # accepted for vLLM compatibility: kvbench adds no BOS either way
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]


def add_tokenize_routes(app: FastAPI, service: EngineService) -> None:
    """Register ``/tokenize`` and ``/detokenize`` for ``service``'s tokenizer on ``app``."""

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "give exactly one of prompt and messages", "prompt")
        if body.messages is not None:
            token_ids = service.render_chat([(m.role, m.content) for m in body.messages])
        else:
            token_ids = service.render_prompt(body.prompt)
        tokens = [int(t) for t in token_ids]
        return {"tokens": tokens, "count": len(tokens), "max_model_len": service.max_context_tokens}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        return {"prompt": service.tokenizer.decode(body.tokens)}
